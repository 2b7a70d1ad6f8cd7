"""A step's checkpoint and index entry built as bytes, without pydantic's validation and dump.

The write-side twin of :mod:`tiers.task._checkpoint_decode`. A step commits a
:class:`~tiers.models.Checkpoint` and an :class:`~tiers.task._records.IdempotencyEntry`;
validating each with pydantic and dumping it cost more than the rest of building
the commit. :func:`fast_checkpoint` checks each field against the same
constraints the model states, writes the record with orjson (a dict in the
model's field order, its datetimes in the form pydantic writes) and builds the
returned record directly. When a field is anything else (invalid, or of a type
only pydantic writes: a datetime subclass, an int over 64 bits, a set in the
scope), it returns ``None`` and the caller takes pydantic's path, which then
accepts or refuses exactly as before. ``tests/tiers/test_task_encode.py`` checks
on generated steps that both give the same bytes.

A step's writer asks for ``exact_ints``: a record orjson wrote whole holds no int
outside 64 bits (orjson refuses one, and so did the :func:`tiers.codec.to_json_text`
that wrote the output's text), so it is stored as record version
:data:`~tiers.task._format.EXACT_INTS_VERSION`, which readers parse without
looking for such an int. pydantic's path writes version 1 as before.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from typing import Any, Final, NamedTuple

import orjson
from pydantic import JsonValue, ValidationError

from tiers.codec import encode
from tiers.errors import InvalidInputError
from tiers.ids import ID_PATTERN
from tiers.models import SCHEMA_VERSION, Checkpoint, CheckpointStatus, RunInfo, RunStatus
from tiers.task._format import EXACT_INTS_VERSION
from tiers.task._records import encode_checkpoint

__all__ = [
    "CheckpointFields",
    "build_checkpoint",
    "encode_head",
    "fast_checkpoint",
    "index_entry_bytes",
]

_SHA256_HEX: Final = re.compile(r"[0-9a-f]{64}")
# A subclass of str, int, dict or list, a datetime or a dataclass in the scope reaches
# _refuse (pydantic may write it otherwise); enums and UUIDs orjson writes as pydantic does.
_OPTIONS: Final = (
    orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)
_new = Checkpoint.__new__
# Read once: an enum member's .value goes through a Python-level descriptor (~0.4 us).
_COMMITTED: Final = CheckpointStatus.COMMITTED
_COMMITTED_TEXT: Final = _COMMITTED.value


class CheckpointFields(NamedTuple):
    """What a step's checkpoint is built from (:func:`build_checkpoint`, :func:`fast_checkpoint`).

    The fields of :class:`~tiers.models.Checkpoint` a step sets, plus
    ``commit_epoch``: the lease epoch a layout-2 checkpoint records (its
    ``StepCommitted`` event), or ``None`` for a layout-1 store, and
    ``output_text``: ``output``'s JSON text as orjson writes it
    (:func:`tiers.codec.to_json_text`), embedded instead of writing the output
    again, or ``None``.
    """

    checkpoint_id: str
    run_id: str
    seq: int
    parent_id: str | None
    step: str
    input_hash: str
    output: JsonValue
    idempotency_key: str
    scope: dict[str, Any] | None
    started_at: datetime
    created_at: datetime
    kind: str
    state_delta: dict[str, JsonValue] | None
    event_seq: int
    commit_epoch: int | None
    output_text: bytes | None = None


_set = object.__setattr__


def _refuse(value: object) -> object:
    raise TypeError(type(value).__name__)


def _text(value: object, longest: int) -> bool:
    return type(value) is str and 1 <= len(value) <= longest


def _utc(value: object) -> tuple[datetime, orjson.Fragment] | None:
    """``value`` as the model holds it (UTC) and as pydantic writes it (JSON text), or ``None``."""
    if type(value) is not datetime:
        return None
    if value.tzinfo is UTC:
        utc = value  # the clock's own times: astimezone(UTC) would return the same object
    else:
        try:
            # What the model's UtcDatetime validator does: a naive time is taken as UTC.
            utc = value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
        except (OverflowError, ValueError):
            return None  # pydantic's path raises what it raised before
    if utc.year < 1000:
        return None  # orjson pads the year as pydantic does; not worth proving for these
    # orjson writes a UTC time as pydantic does (isoformat's text with "Z" for "+00:00":
    # microseconds only when not 0), in a quarter of isoformat's time.
    return utc, orjson.Fragment(orjson.dumps(utc, option=orjson.OPT_UTC_Z))


def fast_checkpoint(
    fields: CheckpointFields, *, exact_ints: bool = False
) -> tuple[Checkpoint, bytes] | None:
    """The checkpoint these fields make and its stored bytes, or ``None`` for pydantic to judge.

    The bytes are ``encode_checkpoint(Checkpoint(...), output, state_delta,
    commit_epoch)``'s, byte for byte; with ``exact_ints`` but the
    ``schema_version``, :data:`~tiers.task._format.EXACT_INTS_VERSION` (in the
    returned record too: what any reader decodes from the bytes). ``exact_ints``
    is only for an ``output_text`` that :func:`tiers.codec.to_json_text` wrote (or none).
    """
    (
        checkpoint_id,
        run_id,
        seq,
        parent_id,
        step,
        input_hash,
        output,
        idempotency_key,
        scope,
        started_at,
        created_at,
        kind,
        state_delta,
        event_seq,
        commit_epoch,
        output_text,
    ) = fields
    started = _utc(started_at)
    created = _utc(created_at)
    if (
        started is None
        or created is None
        or type(checkpoint_id) is not str
        or type(run_id) is not str
        or ID_PATTERN.fullmatch(run_id) is None
        or type(seq) is not int
        or seq < 1
        or not (parent_id is None or type(parent_id) is str)
        or not _text(step, 256)
        or type(input_hash) is not str
        or _SHA256_HEX.fullmatch(input_hash) is None
        or not _text(idempotency_key, 512)
        or not (scope is None or (type(scope) is dict and all(type(k) is str for k in scope)))
        or not _text(kind, 32)
        or type(event_seq) is not int
        or event_seq < 1
    ):
        return None
    record: dict[str, Any] = {
        "schema_version": EXACT_INTS_VERSION if exact_ints else SCHEMA_VERSION,
        "checkpoint_id": checkpoint_id,
        "run_id": run_id,
        "seq": seq,
        "parent_id": parent_id,
        "step": step,
        "input_hash": input_hash,
        # The text orjson wrote for this very value (to_json_text): the same bytes again.
        "output": output if output_text is None else orjson.Fragment(output_text),
        "idempotency_key": idempotency_key,
        "status": _COMMITTED_TEXT,
        "scope": scope,
        "started_at": started[1],
        "created_at": created[1],
        "kind": kind,
        "state_delta": state_delta,
        "event_seq": event_seq,
    }
    if commit_epoch is not None:
        record["commit_epoch"] = commit_epoch
    try:
        data = orjson.dumps(record, default=_refuse, option=_OPTIONS)
    except TypeError:  # an int over 64 bits, a lone surrogate, a type only pydantic writes
        return None
    if commit_epoch is not None:
        del record["commit_epoch"]
    record["output"] = output
    record["status"] = _COMMITTED
    record["started_at"] = started[0]
    record["created_at"] = created[0]
    if scope is not None:
        record["scope"] = dict(scope)  # the model holds a copy, as validation made one
    ckpt = _new(Checkpoint)
    _set(ckpt, "__dict__", record)
    _set(ckpt, "__pydantic_fields_set__", set(record))
    _set(ckpt, "__pydantic_extra__", None)
    _set(ckpt, "__pydantic_private__", None)
    return ckpt, data


def build_checkpoint(
    fields: CheckpointFields, *, exact_ints: bool = False
) -> tuple[Checkpoint, bytes]:
    """A step's checkpoint and its stored bytes: :func:`fast_checkpoint`'s, else pydantic's.

    ``exact_ints`` goes to :func:`fast_checkpoint`: its records are marked as
    holding no int outside 64 bits; pydantic's (which may hold one) never are.

    Raises:
        InvalidInputError: A field the model refuses (named by ``field``).
    """
    built = fast_checkpoint(fields, exact_ints=exact_ints)
    if built is not None:
        return built
    try:
        base = Checkpoint(
            checkpoint_id=fields.checkpoint_id,
            run_id=fields.run_id,
            seq=fields.seq,
            parent_id=fields.parent_id,
            step=fields.step,
            input_hash=fields.input_hash,
            idempotency_key=fields.idempotency_key,
            scope=fields.scope,
            started_at=fields.started_at,
            created_at=fields.created_at,
            kind=fields.kind,
            event_seq=fields.event_seq,
        )
    except ValidationError as exc:
        first = exc.errors()[0]
        where = ".".join(str(p) for p in first["loc"]) or "output"
        raise InvalidInputError(
            f"step {fields.step!r}: invalid checkpoint: {where}: {first['msg']}", field=where
        ) from exc
    ckpt = base.model_copy(update={"output": fields.output, "state_delta": fields.state_delta})
    return ckpt, encode_checkpoint(base, fields.output, fields.state_delta, fields.commit_epoch)


def index_entry_bytes(seq: int, checkpoint_id: str, input_hash: str) -> bytes:
    """``encode(IdempotencyEntry(seq=..., checkpoint_id=..., input_hash=...))`` for a built checkpoint's fields."""
    return orjson.dumps(
        {
            "schema_version": SCHEMA_VERSION,
            "seq": seq,
            "checkpoint_id": checkpoint_id,
            "input_hash": input_hash,
        }
    )


# The head's fields in the model's order (what pydantic writes them in).
_HEAD_FIELDS: Final = tuple(RunInfo.model_fields)
_HEAD_TIMES: Final = (
    "created_at",
    "updated_at",
    "last_checkpoint_at",
    "lease_expires_at",
    "finished_at",
)
_FLOAT_OR_NONE: Final = (float, type(None))


def encode_head(info: RunInfo) -> bytes:
    """``encode(info)``'s bytes, written by orjson when the head holds only what it writes alike.

    Every commit writes the run's head; pydantic's serializer took ~3 us of a
    step for it. orjson writes the same text for the fields of a head as a step
    leaves it: no result and no pending approval (a ``JsonValue`` and a nested
    model pydantic writes in its own way), nothing superseded and no unknown
    effects, its floats ``float`` (a head built without validation,
    :meth:`tiers.task._txn.Txn.head`, may hold an ``int`` there, which pydantic
    writes as ``5.0`` and orjson as ``5``) and its times UTC (``...Z``). Any
    other head, or one orjson refuses (an int over 64 bits, a lone surrogate),
    is pydantic's. ``tests/tiers/test_codec_encode.py`` compares both on
    generated heads.
    """
    fields = info.__dict__
    if (
        type(info) is not RunInfo
        or fields["result"] is not None
        or fields["pending_approval"] is not None
        or fields["superseded"]
        or fields["unknown_effects"]
        or type(fields["status"]) is not RunStatus
        or type(fields["spent_cost"]) is not float
        or type(fields["lease_ttl_s"]) not in _FLOAT_OR_NONE
        or type(fields["budget_cost"]) not in _FLOAT_OR_NONE
        or tuple(fields) != _HEAD_FIELDS
    ):
        return encode(info)
    for name in _HEAD_TIMES:
        at = fields[name]
        if at is not None and (type(at) is not datetime or at.tzinfo is not UTC or at.year < 1000):
            return encode(info)
    try:
        return orjson.dumps(fields, option=orjson.OPT_UTC_Z)
    except TypeError:
        return encode(info)
