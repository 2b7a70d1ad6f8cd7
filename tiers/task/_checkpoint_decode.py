"""A checkpoint built from its stored fields without pydantic's walk, when they are what we write.

History reads decode every checkpoint of a page; pydantic's validation of the
fields (and the copy that then sets the output and state delta) cost more than
parsing the JSON itself. The stored bytes are our own ``model_dump_json`` of a
validated :class:`~tiers.models.Checkpoint`, so :func:`trusted_checkpoint`
checks that each field has the exact type and form that dump writes (the same
constraints the model states) and builds the record directly. Anything else
(a record of an older release without a newer field, a hand-edited or corrupt
row) gets ``None``, and the caller takes pydantic's path, which decides
exactly as before (the same record, or the same
:class:`~tiers.errors.CorruptRecordError`).

:func:`trusted_stored_checkpoint` is the whole fast path from stored bytes
for reads of one run (history, the latest checkpoint): one orjson parse, and
the run's id compared with the one asked for instead of matched against the
id pattern again (the caller validated it).
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Final

import orjson

from tiers.ids import ID_PATTERN
from tiers.models import SCHEMA_VERSION, Checkpoint, CheckpointStatus

__all__ = ["may_hold_big_int", "trusted_checkpoint", "trusted_stored_checkpoint"]

# The fields in the order the model dumps them: a record's dict keeps it, so its dump is the same.
# Spelled out because trusted_checkpoint unpacks a record's values in this order (a test pins it).
_FIELDS: Final = (
    "schema_version",
    "checkpoint_id",
    "run_id",
    "seq",
    "parent_id",
    "step",
    "input_hash",
    "output",
    "idempotency_key",
    "status",
    "scope",
    "started_at",
    "created_at",
    "kind",
    "state_delta",
    "event_seq",
)
_STATUS: Final = {status.value: status for status in CheckpointStatus}
_SHA256_HEX: Final = r"[0-9a-f]{64}"
# The one form pydantic dumps a UTC datetime in; fromisoformat reads it as pydantic does.
# ASCII digits only: fromisoformat refuses other Unicode digits (with a ValueError).
_UTC_TIME: Final = r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?Z"
# The input hash and the two times in one match of "hash|started|created" (no part can hold a
# "|", so the whole matches exactly when each part does).
_HASH_AND_TIMES: Final = re.compile(f"{_SHA256_HEX}\\|{_UTC_TIME}\\|{_UTC_TIME}", re.ASCII)
_new = Checkpoint.__new__
_set = object.__setattr__
# ASCII digits -> "0", every other byte -> " ": a run of 19 "0"s is where an int over 64 bits may be.
_DIGITS_ONLY: Final = bytes(ord("0") if 48 <= b <= 57 else ord(" ") for b in range(256))
_LONG_DIGITS: Final = b"0" * 19


def may_hold_big_int(data: bytes) -> bool:
    """Whether JSON ``data`` may hold an int over 64 bits, which orjson would read as a float.

    Such an int has at least 19 digits in a row (an int that fits in 64 bits
    orjson reads exactly), so bytes without such a run parse the same with
    orjson as with :mod:`json`; bytes with one (a long number in a string, too)
    take :mod:`json`'s exact path.
    """
    return _LONG_DIGITS in data.translate(_DIGITS_ONLY)


def trusted_stored_checkpoint(data: bytes, run_id: str) -> tuple[Checkpoint, int | None] | None:
    """Checkpoint bytes of run ``run_id`` as we store them, built without pydantic; else ``None``.

    ``None`` for anything :func:`trusted_checkpoint` would not take, for bytes
    that may hold an int over 64 bits, for a bad ``commit_epoch``, and for a
    record of another run: the caller then takes the exact path
    (:func:`tiers.task._records.decode_stored_checkpoint`), which decides
    (the same record, or the :class:`~tiers.errors.CorruptRecordError`).

    Args:
        data: The stored bytes.
        run_id: The run they were read from, already validated as an id.

    Returns:
        The checkpoint and the epoch of its inline ``StepCommitted`` (``None``
        in a layout-1 record), or ``None``.
    """
    if may_hold_big_int(data):
        return None
    try:
        fields = orjson.loads(data)
    except orjson.JSONDecodeError:
        return None
    if type(fields) is not dict:
        return None
    commit_epoch = fields.pop("commit_epoch", None)
    if commit_epoch is not None and not (type(commit_epoch) is int and commit_epoch >= 0):
        return None
    ckpt = trusted_checkpoint(fields, run_id=run_id)
    return None if ckpt is None else (ckpt, commit_epoch)


def trusted_checkpoint(fields: dict[str, Any], *, run_id: str | None = None) -> Checkpoint | None:
    """The checkpoint ``fields`` (a stored record's parsed JSON) hold, or ``None``.

    ``None`` unless every field is present, in the model's order, with the type
    and form our own dump writes; the caller then validates with pydantic.
    ``fields`` becomes the record's storage (the caller passes a dict it owns).
    ``run_id`` (a validated id): also ``None`` unless the record is that run's,
    whose id then needs no pattern match.
    """
    if tuple(fields) != _FIELDS:
        return None
    (
        version,
        checkpoint_id,
        stored_run,
        seq,
        parent_id,
        step,
        input_hash,
        _output,  # any JSON value
        key,
        status,
        scope,
        started,
        created,
        kind,
        delta,
        event_seq,
    ) = fields.values()
    if not (
        type(version) is int
        and version == SCHEMA_VERSION
        and type(checkpoint_id) is str
        and type(stored_run) is str
        and (
            stored_run == run_id
            if run_id is not None
            else ID_PATTERN.fullmatch(stored_run) is not None
        )
        and type(seq) is int
        and seq >= 1
        and (parent_id is None or type(parent_id) is str)
        and type(step) is str
        and 1 <= len(step) <= 256
        and type(input_hash) is str
        and type(key) is str
        and 1 <= len(key) <= 512
        and type(status) is str
        and status in _STATUS
        and (scope is None or type(scope) is dict)
        and type(started) is str
        and type(created) is str
        and _HASH_AND_TIMES.fullmatch(f"{input_hash}|{started}|{created}") is not None
        and type(kind) is str
        and 1 <= len(kind) <= 32
        and (event_seq is None or (type(event_seq) is int and event_seq >= 1))
        and (delta is None or type(delta) is dict)
    ):
        return None
    fields["status"] = _STATUS[status]
    fields["started_at"] = datetime.fromisoformat(started)
    fields["created_at"] = datetime.fromisoformat(created)
    ckpt = _new(Checkpoint)
    _set(ckpt, "__dict__", fields)
    _set(ckpt, "__pydantic_fields_set__", set(fields))
    _set(ckpt, "__pydantic_extra__", None)
    _set(ckpt, "__pydantic_private__", None)
    return ckpt
