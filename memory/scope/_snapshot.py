"""The JSON schema of a scope snapshot (what task checkpoints store)."""

from __future__ import annotations

from datetime import UTC, datetime

from pydantic import BaseModel, ConfigDict, Field, JsonValue

from memory.errors import InvalidScopeInputError


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True, frozen=True)


class _SectionSnapshot(_Strict):
    name: str
    text: str


class _WorkingSnapshot(_Strict):
    key: str
    value: JsonValue


class _TraceSnapshot(_Strict):
    seq: int
    kind: str
    text: str
    phase: str
    timestamp: str


class _ScopeSnapshot(_Strict):
    schema_version: int
    encoding: str
    system: list[_SectionSnapshot]
    phase: str
    phase_index: int = Field(ge=1)
    working_budget_tokens: int = Field(ge=0)
    working: list[_WorkingSnapshot]
    trace: list[_TraceSnapshot]


def _parse_timestamp(value: str) -> datetime:
    try:
        parsed = datetime.fromisoformat(value)
    except ValueError as exc:
        raise InvalidScopeInputError(
            f"timestamp {value[:64]!r} is not ISO 8601", field="timestamp"
        ) from exc
    if parsed.tzinfo is None:
        raise InvalidScopeInputError(
            f"timestamp {value[:64]!r} has no timezone; snapshots hold UTC times",
            field="timestamp",
        )
    return parsed.astimezone(UTC)
