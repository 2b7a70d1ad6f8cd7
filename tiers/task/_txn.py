"""The transaction builder of the task tier and small helpers shared by its modules.

Nothing here does I/O: a :class:`Txn` is committed by :meth:`tiers.task._store.RunStore.apply`.
What a transaction may change in the run's head is declared once, in :class:`HeadUpdate`;
the status is not among those fields: it moves with the events the transaction
appends, as :mod:`tiers.task._lifecycle` declares.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import TYPE_CHECKING, Any, NamedTuple, TypeVar

from pydantic import JsonValue

from tiers.backends.base import Check, Write
from tiers.codec import to_json_text
from tiers.errors import ValueTooLargeError
from tiers.models import PendingApproval, RunInfo, RunStatus
from tiers.task import _lifecycle as lifecycle
from tiers.task._records import (
    Charged,
    EffectRecord,
    Event,
    EventKind,
    to_json_dict,
)

__all__ = [
    "UNSET",
    "HeadUpdate",
    "StepOutput",
    "Txn",
    "check_fits",
    "doc_from",
    "unpack_output",
    "unpack_step_output",
    "with_changes",
]

F = TypeVar("F", bound=Callable[..., Any])


class HeadUpdate:
    """The fields of a run's head (:class:`~tiers.models.RunInfo`) a transaction may change.

    Only the fields assigned are applied (:meth:`changes`); an unassigned field
    has no value. Assigning a field that is not declared here (a misspelling, or
    ``status``, which only events move) raises ``ValueError`` where it is
    assigned (and fails type checking), instead of being dropped from the head.
    Not a pydantic model: a transaction is built per commit, and a model's
    validation, copied defaults and field walk were a measurable part of a step's CPU.
    """

    head_seq: int
    head_checkpoint_id: str | None
    last_checkpoint_at: datetime | None
    snapshot_event_seq: int
    compacted_through: int
    superseded: list[tuple[int, int]]
    lease_epoch: int
    lease_owner: str | None
    lease_expires_at: datetime | None
    lease_ttl_s: float | None
    pending_approval: PendingApproval | None
    budget_tokens: int | None
    budget_cost: float | None
    spent_tokens: int
    spent_cost: float
    unknown_effects: list[str]
    finished_at: datetime | None
    result: JsonValue
    error: str | None

    if not TYPE_CHECKING:
        # Defined for the runtime only: mypy keeps refusing an undeclared name or a
        # value of the wrong type, from the annotations above.
        def __setattr__(self, name: str, value: object) -> None:
            if name not in _HEAD_FIELDS:
                raise ValueError(f'"HeadUpdate" object has no field "{name}"')
            object.__setattr__(self, name, value)

    def set_head_checkpoint(self, seq: int, checkpoint_id: str, at: datetime) -> None:
        """Assign ``head_seq``, ``head_checkpoint_id`` and ``last_checkpoint_at``: a step's new head."""
        # Every step assigns these three: stored directly, as the declared names they are,
        # without the runtime __setattr__'s check (a Python call each, ~0.2 us).
        assigned = self.__dict__
        assigned["head_seq"] = seq
        assigned["head_checkpoint_id"] = checkpoint_id
        assigned["last_checkpoint_at"] = at

    def changes(self) -> Mapping[str, Any]:
        """The fields assigned, by name (values as assigned), as a read-only view.

        The instance's own mapping, not a copy (every commit reads it once): the
        class has no defaults, so it holds exactly the fields assigned.
        """
        return self.__dict__


_HEAD_FIELDS = frozenset(HeadUpdate.__annotations__)
# The head's fields every transaction sets besides the HeadUpdate's (Txn.head).
_MOVED = ("status", "event_seq", "updated_at")
_new_run_info = RunInfo.__new__
_set = object.__setattr__


@dataclass(slots=True)
class Txn:
    """One atomic write to a run: events, extra puts/checks, and the head's new fields.

    Event seqs are assigned in order from the head's ``event_seq``; the head
    check that :meth:`~tiers.task._store.RunStore.apply` adds makes them
    gap-free. Each event moves :attr:`status` as the lifecycle table says.
    """

    run_id: str
    epoch: int
    base: RunInfo
    now: datetime
    events: list[Event] = field(default_factory=list)
    puts: list[Write] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    update: HeadUpdate = field(default_factory=HeadUpdate)
    # How many events a record of the transaction holds (layout 2's StepCommitted in its
    # checkpoint): they take a seq and move the status, but are no Event and get no row.
    held: int = 0
    status: RunStatus = field(init=False)

    def __post_init__(self) -> None:
        self.status = self.base.status

    def add_event(self, kind: EventKind, /, **data: JsonValue) -> int:
        """Append an event and move the run's status with it; returns the event's seq.

        Raises:
            RunStateError: The lifecycle table does not allow this event in the run's status.
        """
        self.status = lifecycle.advance(self.status, kind, data, run_id=self.run_id)
        seq = self.base.event_seq + self.appended + 1
        # Built from values this module already validated: skip pydantic's
        # validation on the hot path (every commit appends events).
        self.events.append(
            Event.model_construct(
                run_id=self.run_id, seq=seq, kind=kind, epoch=self.epoch, at=self.now, data=data
            )
        )
        return seq

    def hold_event(self, kind: EventKind, /, **data: JsonValue) -> int:
        """Like :meth:`add_event` for an event a record of this transaction holds (no row).

        Raises:
            RunStateError: The lifecycle table does not allow this event in the run's status.
        """
        self.status = lifecycle.advance(self.status, kind, data, run_id=self.run_id)
        self.held += 1
        return self.base.event_seq + len(self.events) + self.held

    @property
    def appended(self) -> int:
        """How many events this transaction appends (rows and held ones)."""
        return len(self.events) + self.held

    def head(self) -> RunInfo:
        """The head after this transaction."""
        base = self.base
        assigned = self.update.changes()
        # What base.model_copy(update=...) builds (no validation: the fields were checked
        # where they were assigned), without its generic copying: once per commit. The
        # three fields set last are never in `assigned` (HeadUpdate does not declare them).
        head = _new_run_info(RunInfo)
        _set(
            head,
            "__dict__",
            {
                **base.__dict__,
                **assigned,
                "status": self.status,
                "event_seq": base.event_seq + len(self.events) + self.held,
                "updated_at": self.now,
            },
        )
        _set(head, "__pydantic_fields_set__", base.__pydantic_fields_set__.union(assigned, _MOVED))
        _set(head, "__pydantic_extra__", None)
        _set(head, "__pydantic_private__", None)
        return head


class Unset:
    """The type of :data:`UNSET`."""

    def __repr__(self) -> str:
        return "UNSET"


UNSET: Any = Unset()
"""Default of an optional argument whose ``None`` means something (e.g. ``resolve_effect``'s ``output``)."""


def unpack_output(
    raw: object, step: str
) -> tuple[JsonValue, int, float, dict[str, JsonValue] | None]:
    """What a step's or effect's function returned: output, tokens, cost and state delta."""
    unpacked = unpack_step_output(raw, step)
    return unpacked.output, unpacked.tokens, unpacked.cost, unpacked.delta


class StepOutput(NamedTuple):
    """What a step's function returned (:func:`unpack_step_output`).

    Attributes:
        output: The output after a JSON round trip.
        text: Its JSON text when orjson's path produced it (:func:`tiers.codec.to_json_text`),
            for the checkpoint to embed instead of writing the output again; else ``None``.
        tokens: Tokens the step spent.
        cost: Cost the step spent.
        delta: The state keys it sets, or ``None``.
    """

    output: JsonValue
    text: bytes | None
    tokens: int
    cost: float
    delta: dict[str, JsonValue] | None


def unpack_step_output(raw: object, step: str) -> StepOutput:
    """:func:`unpack_output`'s fields, and the output's JSON text (see :class:`StepOutput`)."""
    if isinstance(raw, Charged):
        output, text = to_json_text(raw.output, field="output", step=step)
        delta = None if raw.state is None else to_json_dict(raw.state, field="state", step=step)
        return StepOutput(output, text, raw.tokens, raw.cost, delta)
    output, text = to_json_text(raw, field="output", step=step)
    return StepOutput(output, text, 0, 0.0, None)


def with_changes(rec: EffectRecord, **update: Any) -> EffectRecord:
    """A copy of a ledger entry with ``update`` applied."""
    return rec.model_copy(update=update)


def check_fits(limit: int, data: bytes, what: str, field: str) -> None:
    """Refuse a value over the store's limit, naming ``what`` and the input ``field``."""
    if len(data) > limit:
        raise ValueTooLargeError(
            f"{what} is {len(data)} bytes, over the store's limit of {limit} bytes: keep "
            "large data elsewhere and record a reference, or raise max_value_bytes",
            field=field,
        )


def doc_from(source: Callable[..., Any]) -> Callable[[F], F]:
    """Give a delegating method the docstring of ``source``, the method it forwards to.

    ``TaskTier`` and ``RunHandle`` are thin faces over the objects that do the
    work; a docstring is written once, beside its code, and read on the face.
    """

    def decorate(fn: F) -> F:
        fn.__doc__ = source.__doc__
        return fn

    return decorate
