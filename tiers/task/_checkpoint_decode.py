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
"""

from __future__ import annotations

import re
from datetime import datetime
from typing import Any, Final

from tiers.ids import ID_PATTERN
from tiers.models import SCHEMA_VERSION, Checkpoint, CheckpointStatus

__all__ = ["trusted_checkpoint"]

# The fields in the order the model dumps them: a record's dict keeps it, so its dump is the same.
_FIELDS: Final = tuple(Checkpoint.model_fields)
_STATUS: Final = {status.value: status for status in CheckpointStatus}
_SHA256_HEX: Final = re.compile(r"[0-9a-f]{64}")
# The one form pydantic dumps a UTC datetime in; fromisoformat reads it as pydantic does.
_UTC_TIME: Final = re.compile(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(?:\.\d{1,6})?Z")
_new = Checkpoint.__new__
_set = object.__setattr__


def _text(value: object, longest: int) -> bool:
    return type(value) is str and 1 <= len(value) <= longest


def _seq(value: object) -> bool:
    return type(value) is int and value >= 1


def _utc(value: object) -> datetime | None:
    if type(value) is not str or _UTC_TIME.fullmatch(value) is None:
        return None
    return datetime.fromisoformat(value)


def trusted_checkpoint(fields: dict[str, Any]) -> Checkpoint | None:
    """The checkpoint ``fields`` (a stored record's parsed JSON) hold, or ``None``.

    ``None`` unless every field is present, in the model's order, with the type
    and form our own dump writes; the caller then validates with pydantic.
    ``fields`` becomes the record's storage (the caller passes a dict it owns).
    """
    status = fields.get("status")
    started_at = _utc(fields.get("started_at"))
    created_at = _utc(fields.get("created_at"))
    scope = fields.get("scope")
    parent_id = fields.get("parent_id")
    event_seq = fields.get("event_seq")
    run_id = fields.get("run_id")
    input_hash = fields.get("input_hash")
    delta = fields.get("state_delta")
    version = fields.get("schema_version")
    if not (
        tuple(fields) == _FIELDS
        and type(version) is int
        and version == SCHEMA_VERSION
        and type(fields.get("checkpoint_id")) is str
        and type(run_id) is str
        and ID_PATTERN.fullmatch(run_id) is not None
        and _seq(fields.get("seq"))
        and (parent_id is None or type(parent_id) is str)
        and _text(fields.get("step"), 256)
        and type(input_hash) is str
        and _SHA256_HEX.fullmatch(input_hash) is not None
        and _text(fields.get("idempotency_key"), 512)
        and type(status) is str
        and status in _STATUS
        and (scope is None or type(scope) is dict)
        and started_at is not None
        and created_at is not None
        and _text(fields.get("kind"), 32)
        and (event_seq is None or _seq(event_seq))
        and (delta is None or type(delta) is dict)
    ):
        return None
    fields["status"] = _STATUS[status]
    fields["started_at"] = started_at
    fields["created_at"] = created_at
    ckpt = _new(Checkpoint)
    _set(ckpt, "__dict__", fields)
    _set(ckpt, "__pydantic_fields_set__", set(fields))
    _set(ckpt, "__pydantic_extra__", None)
    _set(ckpt, "__pydantic_private__", None)
    return ckpt
