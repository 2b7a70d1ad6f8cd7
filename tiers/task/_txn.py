"""The transaction builder of the task tier and small helpers shared by its modules.

Nothing here does I/O: a :class:`Txn` is committed by ``TierCore._apply``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import datetime
from typing import Any

from pydantic import JsonValue

from tiers.backends.base import Check, Write
from tiers.errors import (
    ValueTooLargeError,
)
from tiers.models import RunInfo
from tiers.task._records import (
    Charged,
    EffectRecord,
    Event,
    EventKind,
    to_json,
    to_json_dict,
)

__all__ = ["UNSET", "Txn"]


@dataclass
class Txn:
    """One atomic write to a run: events, extra puts/checks, and the head's new fields.

    Event seqs are assigned in order from the head's ``event_seq``; the head
    check that :meth:`TaskTier._apply` adds makes them gap-free.
    """

    run_id: str
    epoch: int
    base: RunInfo
    now: datetime
    events: list[Event] = field(default_factory=list)
    puts: list[Write] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    update: dict[str, Any] = field(default_factory=dict)

    def add_event(self, kind: EventKind, /, **data: JsonValue) -> int:
        """Append an event; returns its seq."""
        seq = self.base.event_seq + len(self.events) + 1
        # Built from values this module already validated: skip pydantic's
        # validation on the hot path (every commit appends events).
        self.events.append(
            Event.model_construct(
                run_id=self.run_id, seq=seq, kind=kind, epoch=self.epoch, at=self.now, data=data
            )
        )
        return seq

    def head(self) -> RunInfo:
        """The head after this transaction."""
        return self.base.model_copy(
            update={
                **self.update,
                "event_seq": self.base.event_seq + len(self.events),
                "updated_at": self.now,
            }
        )


class _Unset:
    """The type of :data:`UNSET`."""

    def __repr__(self) -> str:
        return "UNSET"


# Sentinel of an argument that was not given (None has a meaning of its own).
_UNSET: Any = _Unset()
UNSET: Any = _UNSET
"""Default of an optional argument whose ``None`` means something (e.g. ``resolve_effect``'s ``output``)."""


def _unpack(raw: object, step: str) -> tuple[JsonValue, int, float, dict[str, JsonValue] | None]:
    if isinstance(raw, Charged):
        output = to_json(raw.output, field="output", step=step)
        delta = None if raw.state is None else to_json_dict(raw.state, field="state", step=step)
        return output, raw.tokens, raw.cost, delta
    return to_json(raw, field="output", step=step), 0, 0.0, None


def _with(rec: EffectRecord, **update: Any) -> EffectRecord:
    return rec.model_copy(update=update)


def _check_fits(limit: int, data: bytes, what: str, field: str) -> None:
    if len(data) > limit:
        raise ValueTooLargeError(
            f"{what} is {len(data)} bytes, over the store's limit of {limit} bytes: keep "
            "large data elsewhere and record a reference, or raise max_value_bytes",
            field=field,
        )
