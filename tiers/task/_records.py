"""Records and pure helpers of the task tier: events, the effect ledger, snapshots.

Nothing here does I/O; :mod:`tiers.task` and :mod:`tiers.task._handle` store these
records through a :class:`~tiers.backends.base.KVStore` (key formats in :mod:`tiers.keys`).

**Event log.** Every change to a run appends one or more :class:`Event` records
with a gap-free, strictly increasing ``seq``, written in the same atomic commit
as the change itself (the checkpoint, the effect ledger entry, the run's head).
A committed event is never changed; corrections append.

**Effect ledger.** One :class:`EffectRecord` per idempotency key: ``invoked``
(written and fsync'd *before* the effect's function is called), ``recorded``
(its output written before the run advances), or ``not_done`` (reconciled or
decided as never having happened, so it may be invoked again). The ledger is an
index over the event log, kept in the same commits.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
import secrets
import time
from dataclasses import dataclass
from enum import StrEnum
from typing import Annotated, Any, Final

import orjson
from pydantic import Field, JsonValue, ValidationError

from tiers import keys
from tiers.codec import decode, encode

# tiers.values.to_json with orjson on the hot path (the same values accepted and returned).
from tiers.codec import to_json as to_json
from tiers.errors import InvalidInputError
from tiers.ids import Id
from tiers.models import Checkpoint, Record, UtcDatetime, utcnow
from tiers.task._checkpoint_decode import may_hold_big_int, trusted_checkpoint

# Moved to a neutral module shared by every tier; re-exported here for existing importers.
from tiers.values import canonical_json as canonical_json

__all__ = [
    "MAX_NOTE",
    "NOT_DONE",
    "Approval",
    "ApprovalRecord",
    "Charged",
    "EffectRecord",
    "EffectStart",
    "EffectStatus",
    "Event",
    "EventKind",
    "IdempotencyEntry",
    "NotDone",
    "Snapshot",
    "canonical_json",
    "decode_checkpoint",
    "decode_stored_checkpoint",
    "encode_checkpoint",
    "input_hash",
    "new_incarnation",
    "new_run_id",
    "step_committed",
]

STEP_MAX = 256
KEY_MAX = 512
MAX_NOTE = 2000
"""Longest note an approval decision keeps (characters)."""
DECIDER_MAX = 256
"""Longest ``by`` (and ``by_key``) an operator action keeps (characters)."""
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
CHECKPOINT_ID = re.compile(r"ckpt-(\d{12})-[0-9a-f]{12}")


class EventKind(StrEnum):
    """What an event records."""

    RUN_STARTED = "RunStarted"
    RUN_RESUMED = "RunResumed"
    RUN_FORKED = "RunForked"
    STEP_STARTED = "StepStarted"
    STEP_COMMITTED = "StepCommitted"
    EFFECT_INVOKED = "EffectInvoked"
    EFFECT_RECORDED = "EffectRecorded"
    EFFECT_OUTCOME_UNKNOWN = "EffectOutcomeUnknown"
    EFFECT_NOT_DONE = "EffectNotDone"
    BUDGET_DEBITED = "BudgetDebited"
    BUDGET_SET = "BudgetSet"
    APPROVAL_REQUESTED = "ApprovalRequested"
    APPROVAL_GRANTED = "ApprovalGranted"
    APPROVAL_REJECTED = "ApprovalRejected"
    RUN_PAUSED = "RunPaused"
    RUN_RELEASED = "RunReleased"
    RUN_COMPLETED = "RunCompleted"
    RUN_FAILED = "RunFailed"
    RUN_CANCELLED = "RunCancelled"
    STATE_UPDATED = "StateUpdated"
    COMPENSATED = "Compensated"
    # A worker took the lease of a cancelled or failed run to compensate it (status unchanged).
    COMPENSATION_STARTED = "CompensationStarted"
    # compensate() stopped and a human must take over: an undo raised, or has none registered.
    COMPENSATION_ESCALATED = "CompensationEscalated"


class Event(Record):
    """One entry of a run's append-only event log."""

    run_id: Id
    seq: int = Field(ge=1)
    kind: EventKind
    epoch: int = Field(ge=0)
    at: UtcDatetime = Field(default_factory=utcnow)
    data: dict[str, JsonValue] = Field(default_factory=dict)


class IdempotencyEntry(Record):
    """Index entry of a run: the checkpoint that committed an idempotency key."""

    seq: int = Field(ge=1)
    checkpoint_id: str
    input_hash: str


class EffectStatus(StrEnum):
    """Where an effect stands in the ledger."""

    INVOKED = "invoked"
    RECORDED = "recorded"
    NOT_DONE = "not_done"


class EffectRecord(Record):
    """The ledger entry of one external effect (by idempotency key)."""

    key: Annotated[str, Field(min_length=1, max_length=KEY_MAX)]
    name: Annotated[str, Field(min_length=1, max_length=STEP_MAX)]
    # Idempotency key of the step the effect ran in (its own key for a top-level effect).
    step_key: Annotated[str, Field(min_length=1, max_length=KEY_MAX)]
    status: EffectStatus
    attempt: int = Field(ge=1)
    request_hash: str
    safe_to_retry: bool = False
    # 0 for an effect of the run, 1 for a compensation's effect (never compensated itself).
    level: int = Field(default=0, ge=0)
    output: JsonValue = None
    response_hash: str | None = None
    # Who decided the output: "fn" (the call returned), "reconcile", "operator".
    source: str | None = None
    # An operator's resolve_effect: the name it gave and the id of the credential
    # it was authenticated with (a service's API key id; None from the library).
    resolved_by: Annotated[str, Field(max_length=DECIDER_MAX)] | None = None
    resolved_by_key: Annotated[str, Field(max_length=DECIDER_MAX)] | None = None
    invoked_seq: int = Field(ge=1)
    recorded_seq: int | None = None
    # Set once the "outcome unknown" event was appended, so it is appended once.
    flagged_unknown: bool = False
    compensated: bool = False


@dataclass(frozen=True)
class EffectStart:
    """What :meth:`RunHandle.begin_effect` decided for an effect.

    Attributes:
        key: The effect's idempotency key (pass it to the external system).
        invoke: ``True``: ``EffectInvoked`` is durable; perform the effect now,
            then :meth:`RunHandle.record_effect` its result. ``False``: the
            effect is recorded already; do not perform it, use ``output``.
        output: The recorded output (``None`` when ``invoke``).
    """

    key: str
    invoke: bool
    output: JsonValue = None


class ApprovalRecord(Record):
    """One approval gate: the frozen plan and the decision, if any."""

    key: Annotated[str, Field(min_length=1, max_length=KEY_MAX)]
    plan_hash: str
    plan: JsonValue = None
    status: str = "requested"  # requested | granted | rejected
    requested_at: UtcDatetime
    decided_by: Annotated[str, Field(max_length=DECIDER_MAX)] | None = None
    # Id of the credential the decider was authenticated with (a service's API key id).
    decided_by_key: Annotated[str, Field(max_length=DECIDER_MAX)] | None = None
    decided_at: UtcDatetime | None = None
    note: Annotated[str, Field(max_length=MAX_NOTE)] | None = None


class Approval(Record):
    """The decision a gate returns to the run (see ``RunHandle.await_approval``)."""

    approved: bool
    plan_hash: str
    # Who decided, as they named themselves, and the credential they were
    # authenticated with (an API key id over HTTP; None from the library).
    by: str | None = None
    by_key: str | None = None
    at: UtcDatetime | None = None
    note: str | None = None


class Snapshot(Record):
    """The run's state as of one checkpoint, so a resume folds at most K checkpoints."""

    run_id: Id
    seq: int = Field(ge=0)
    checkpoint_id: str | None
    event_seq: int = Field(ge=0)
    values: dict[str, JsonValue] = Field(default_factory=dict)
    # The run's status and spend as of event_seq, so the event log's tail folds onto it.
    status: str = "running"
    pending_plan_hash: str | None = None
    spent_tokens: int = Field(default=0, ge=0)
    spent_cost: float = Field(default=0.0, ge=0)
    unknown_effects: list[str] = Field(default_factory=list)


class Charged:
    """What a step's or effect's function returns to debit the run's budget atomically.

    ``return Charged(output, tokens=812, cost=0.004)`` commits ``output`` and
    the debit (a ``BudgetDebited`` event and the head's totals) in the same
    write, so a replay never debits twice. ``state`` sets keys of the run's
    state (a shallow merge stored as a delta).

    Args:
        output: The JSON-serialisable output.
        tokens: Tokens spent (>= 0).
        cost: Money spent (>= 0).
        state: Keys of the run's state to set.
    """

    __slots__ = ("cost", "output", "state", "tokens")

    def __init__(
        self,
        output: object = None,
        *,
        tokens: int = 0,
        cost: float = 0.0,
        state: dict[str, Any] | None = None,
    ) -> None:
        if isinstance(tokens, bool) or not isinstance(tokens, int) or tokens < 0:
            raise InvalidInputError("tokens must be an integer >= 0", field="tokens")
        if (
            isinstance(cost, bool)
            or not isinstance(cost, int | float)
            or not 0 <= cost < math.inf  # NaN and infinity are refused too
        ):
            raise InvalidInputError("cost must be a finite number >= 0", field="cost")
        if state is not None and not isinstance(state, dict):
            raise InvalidInputError("state must be a dict of keys to set", field="state")
        self.output = output
        self.tokens = tokens
        self.cost = float(cost)
        self.state = state


class NotDone:
    """The type of :data:`NOT_DONE`."""

    _instance: NotDone | None = None

    def __new__(cls) -> NotDone:
        if cls._instance is None:
            cls._instance = super().__new__(cls)
        return cls._instance

    def __repr__(self) -> str:
        return "NOT_DONE"


NOT_DONE: Final = NotDone()
"""What a reconcile callback returns when the external system shows the effect never happened."""


# -- pure helpers -------------------------------------------------------------------


def new_run_id() -> str:
    """A fresh run id that sorts by creation time: ``run-<epoch millis>-<12 hex>``."""
    return f"run-{time.time_ns() // 1_000_000:013d}-{secrets.token_hex(6)}"


def new_incarnation() -> str:
    """A fresh ``RunInfo.incarnation``: 16 random hex digits, drawn when a run is created."""
    return secrets.token_hex(8)


def input_hash(value: object, *, step: str | None = None, field: str = "input") -> str:
    """SHA-256 hex digest of the canonical JSON (:func:`canonical_json`) of a step's input."""
    if value is None:
        # Most steps have no input: skip the encoder on the hot path.
        return _NULL_HASH
    return hashlib.sha256(canonical_json(value, field=field, step=step).encode()).hexdigest()


_NULL_HASH: Final = hashlib.sha256(b"null").hexdigest()


def output_digest(value: JsonValue) -> str:
    """SHA-256 hex digest of the canonical JSON of an effect's output (its response digest)."""
    return hashlib.sha256(canonical_json(value, field="output").encode()).hexdigest()


def to_json_dict(value: object, *, field: str, step: str | None = None) -> dict[str, JsonValue]:
    """Like :func:`to_json` for a value that must be a dict."""
    if not isinstance(value, dict):
        where = f"step {step!r}: " if step is not None else ""
        raise InvalidInputError(
            f"{where}{field} must be a dict, got {type(value).__name__}", field=field
        )
    parsed = to_json(value, field=field, step=step)
    assert isinstance(parsed, dict)  # a dict stays a dict through JSON
    return parsed


def check_name(name: object, field: str = "step") -> str:
    """A step / effect name: 1-256 characters, no control characters, stripped."""
    if not isinstance(name, str):
        raise InvalidInputError(
            f"{field} name must be a string, got {type(name).__name__}", field=field
        )
    value = name.strip()
    if not value:
        raise InvalidInputError(f"{field} name must not be empty", field=field)
    if len(value) > STEP_MAX or _CONTROL.search(value):
        raise InvalidInputError(
            f"{field} name {value[:80]!r} is invalid: use 1-{STEP_MAX} characters without "
            "control characters",
            field=field,
        )
    return value


def check_key(key: object, field: str = "idempotency_key") -> str:
    """An idempotency key: 1-512 characters, no control characters, stripped."""
    if not isinstance(key, str):
        raise InvalidInputError(f"{field} must be a string, got {type(key).__name__}", field=field)
    value = key.strip()
    if not value or len(value) > KEY_MAX or _CONTROL.search(value):
        raise InvalidInputError(
            f"{field} {value[:80]!r} is invalid: use 1-{KEY_MAX} characters without "
            "control characters",
            field=field,
        )
    return value


def check_decider(by: object, by_key: object) -> tuple[str, str | None]:
    """Who decides an operator action, as the audit trail keeps it.

    Args:
        by: The name the caller gives (claimed, not verified): 1-256 characters.
        by_key: The id of the credential the caller was authenticated with
            (a service's API key id), or ``None`` when there is none (the library).

    Returns:
        ``by`` stripped and ``by_key``.
    """
    if not isinstance(by, str) or not 1 <= len(by.strip()) <= DECIDER_MAX:
        raise InvalidInputError(
            f"by must name who decides (1-{DECIDER_MAX} characters)", field="by"
        )
    if by_key is not None and (
        not isinstance(by_key, str)
        or not 1 <= len(by_key) <= DECIDER_MAX
        or _CONTROL.search(by_key)
    ):
        raise InvalidInputError(
            f"by_key must be the id of the caller's credential (1-{DECIDER_MAX} characters "
            "without control characters) or None",
            field="by_key",
        )
    return by.strip(), by_key


def checkpoint_id(run_id: str, seq: int, key: str) -> str:
    """``ckpt-<seq, 12 digits>-<12 hex of SHA-256(run_id, seq, key)>``: sorts by seq, no clock."""
    digest = hashlib.sha256(f"{run_id}\0{seq}\0{key}".encode()).hexdigest()[:12]
    return f"ckpt-{seq:0{keys.SEQ_WIDTH}d}-{digest}"


def seq_of_checkpoint_id(value: object) -> int | None:
    """The seq a checkpoint id names, or ``None`` if it is not a checkpoint id."""
    match = CHECKPOINT_ID.fullmatch(value) if isinstance(value, str) else None
    return int(match.group(1)) if match else None


# Where encode() of a checkpoint without output and state delta holds them: the first
# '"output":null' (only the scalar and string fields come before it, and a string
# never holds an unescaped quote) and the last '"state_delta":null' (only event_seq,
# a number or null, follows it; the scope before it may hold the same text).
_OUTPUT_AT: Final = b',"output":null,'
_DELTA_AT: Final = b',"state_delta":null,"event_seq":'


def encode_checkpoint(
    base: Checkpoint,
    output: JsonValue,
    delta: dict[str, JsonValue] | None,
    commit_epoch: int | None = None,
) -> bytes:
    """``encode(base with output and state delta)``: the same bytes, the JSON values by orjson.

    orjson writes a JSON value as pydantic does (compact, UTF-8, keys in
    order, the same float and escape forms) at a fraction of the CPU. A value
    it cannot write (an int over 64 bits) is left to pydantic.

    Args:
        base: The checkpoint, validated, with ``output`` and ``state_delta`` ``None``.
        output: Its output (a JSON value).
        delta: Its state delta (a dict of JSON values), or ``None``.
        commit_epoch: Layout 2 (:mod:`tiers.task._format`): the lease epoch of
            the commit, stored as the record's last member, whose
            ``StepCommitted`` event the record then holds instead of an event
            row. ``None``: layout 1, today's bytes.
    """
    try:
        output_json = orjson.dumps(output)
        delta_json = None if delta is None else orjson.dumps(delta)
    except TypeError:
        data = encode(base.model_copy(update={"output": output, "state_delta": delta}))
        return _with_commit_epoch(data, commit_epoch)
    data = encode(base)
    at = data.index(_OUTPUT_AT)
    data = b'%s,"output":%s,%s' % (data[:at], output_json, data[at + len(_OUTPUT_AT) :])
    if delta_json is not None:
        at = data.rindex(_DELTA_AT)
        data = b'%s,"state_delta":%s%s' % (
            data[:at],
            delta_json,
            data[at + len(_DELTA_AT) - len(b',"event_seq":') :],
        )
    return _with_commit_epoch(data, commit_epoch)


def _with_commit_epoch(data: bytes, commit_epoch: int | None) -> bytes:
    """``data`` (an encoded checkpoint, a JSON object) with ``commit_epoch`` as its last member."""
    if commit_epoch is None:
        return data
    return b'%s,"commit_epoch":%d}' % (data[:-1], commit_epoch)


def decode_checkpoint(data: bytes, *, where: str) -> Checkpoint:
    """``decode(Checkpoint, data)``: the same record, its output parsed by orjson, not walked.

    pydantic validates every field but the output and the state delta, which
    JSON text parsed by orjson can only hold as JSON values. Bytes that are
    not a valid checkpoint go to :func:`~tiers.codec.decode`, which raises
    the same :class:`~tiers.errors.CorruptRecordError` as before.
    """
    return decode_stored_checkpoint(data, where=where)[0]


def decode_stored_checkpoint(data: bytes, *, where: str) -> tuple[Checkpoint, int | None]:
    """A stored checkpoint of any layout version, and the epoch of its inline ``StepCommitted``.

    The one upcaster of checkpoints: a layout-1 record (no ``commit_epoch``,
    its event is a row of its own) and a layout-2 record both decode to the
    same :class:`~tiers.models.Checkpoint`; the second value is ``None`` for
    the first, the commit's lease epoch for the second (see
    :func:`step_committed`). A record of version
    :data:`~tiers.task._format.EXACT_INTS_VERSION` decodes as pydantic decodes it,
    its bytes still scanned for an int over 64 bits here (this is the exact path).
    """
    try:
        # orjson reads an int over 64 bits (19 digits or more) as a float: json keeps it.
        if may_hold_big_int(data):
            raise orjson.JSONDecodeError("an int over 64 bits may be in it", "", 0)
        fields = orjson.loads(data)
    except orjson.JSONDecodeError:  # not JSON, or an int over 64 bits
        try:
            fields = json.loads(data)
        except ValueError:
            return decode(Checkpoint, data, where=where), None
    if not isinstance(fields, dict):
        return decode(Checkpoint, data, where=where), None
    commit_epoch = fields.pop("commit_epoch", None)
    if commit_epoch is None or (type(commit_epoch) is int and commit_epoch >= 0):
        trusted = trusted_checkpoint(fields)
        if trusted is not None:
            return trusted, commit_epoch
    output = fields.pop("output", None)
    delta = fields.pop("state_delta", None)
    if (delta is not None and not isinstance(delta, dict)) or not (
        commit_epoch is None or (type(commit_epoch) is int and commit_epoch >= 0)
    ):
        return decode(Checkpoint, data, where=where), None
    try:
        base = Checkpoint.model_validate(fields)
    except ValidationError:
        return decode(Checkpoint, data, where=where), None
    return base.model_copy(update={"output": output, "state_delta": delta}), commit_epoch


def step_committed(ckpt: Checkpoint, commit_epoch: int) -> Event:
    """The ``StepCommitted`` event a layout-2 checkpoint holds, as layout 1 stored it as a row."""
    assert ckpt.event_seq is not None  # written with every checkpoint that holds its event
    return Event.model_construct(
        run_id=ckpt.run_id,
        seq=ckpt.event_seq,
        kind=EventKind.STEP_COMMITTED,
        epoch=commit_epoch,
        at=ckpt.created_at,
        data={
            "step": ckpt.step,
            "seq": ckpt.seq,
            "checkpoint_id": ckpt.checkpoint_id,
            "key": ckpt.idempotency_key,
            "kind": ckpt.kind,
        },
    )
