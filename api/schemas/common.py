"""Building blocks shared by the API schemas."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Annotated

from fastapi import Path
from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from tiers.ids import ID_PATTERN, ID_RULE

ID_REGEX = f"^{ID_PATTERN.pattern}$"
NON_BLANK = r"\S"
"""Pattern of a string with at least one non-whitespace character (JSON Schema patterns search)."""
NO_CONTROL_NON_BLANK = r"^[^\x00-\x1f\x7f]*[^\s\x00-\x1f\x7f][^\x00-\x1f\x7f]*$"
"""Pattern of a non-blank string without control characters (step names, idempotency keys)."""


def _as_utc(value: datetime) -> datetime:
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except OverflowError as exc:
        # A value pydantic's ValidationError can report, not an OverflowError escaping as a 500.
        raise ValueError("datetime is out of range once converted to UTC") from exc


UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]
"""A timestamp in a request; naive values are taken as UTC."""

Id = Annotated[str, Field(min_length=1, max_length=128, pattern=ID_REGEX, description=ID_RULE)]
"""An id in a request or response body (user, session, run, fact key)."""


def _path_id(description: str) -> object:
    return Path(
        min_length=1, max_length=128, pattern=ID_REGEX, description=f"{description} ({ID_RULE})."
    )


UserIdPath = Annotated[str, _path_id("The user")]
SessionIdPath = Annotated[str, _path_id("The session")]
FactKeyPath = Annotated[str, _path_id("The fact's key")]
RunIdPath = Annotated[str, _path_id("The run")]
CheckpointIdPath = Annotated[
    str, Path(min_length=1, max_length=64, description="A checkpoint id of the run.")
]


class RequestModel(BaseModel):
    """Base of request bodies: unknown fields are refused, so a typo is an error, not a no-op."""

    model_config = ConfigDict(extra="forbid")


class ResponseModel(BaseModel):
    """Base of response bodies."""

    model_config = ConfigDict(extra="forbid")
