"""JSON encoding of records at the storage boundary (never pickle), and the fast JSON round trip.

:func:`to_json` is :func:`tiers.values.to_json` (a caller's value after a JSON
round trip, refused with :class:`~tiers.errors.InvalidInputError` if JSON cannot
hold it) on a step's hot path: orjson encodes and decodes it in C, and a value
orjson would take but :mod:`json` refuses or changes falls back to the exact
:mod:`json` path, so what is accepted and what comes back are the same.
"""

from __future__ import annotations

from typing import TypeVar

import orjson
from pydantic import BaseModel, JsonValue, ValidationError

from tiers import values
from tiers.errors import CorruptRecordError

__all__ = ["decode", "encode", "to_json", "to_json_text"]

RecordT = TypeVar("RecordT", bound=BaseModel)

# Subclasses (of str, int, dict, list: StrEnum, IntEnum, OrderedDict...), datetimes and
# dataclasses reach _refuse instead of being encoded, so json's own handling of them
# (refusal, or its conversion) stays the one that counts.
_OPTIONS = (
    orjson.OPT_SORT_KEYS
    | orjson.OPT_PASSTHROUGH_SUBCLASS
    | orjson.OPT_PASSTHROUGH_DATETIME
    | orjson.OPT_PASSTHROUGH_DATACLASS
)


def _refuse(value: object) -> object:
    raise TypeError(type(value).__name__)


def encode(record: BaseModel) -> bytes:
    """Serialise a record to the JSON bytes stored in a KV value."""
    # What model_dump_json() writes, as bytes: without its str round trip (once per commit).
    return record.__pydantic_serializer__.to_json(record)


def decode(model: type[RecordT], data: bytes, *, where: str) -> RecordT:
    """Parse stored JSON bytes into ``model``.

    Raises:
        CorruptRecordError: The bytes are not a valid ``model``; ``where`` names the key.
    """
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        raise CorruptRecordError(
            f"stored {model.__name__} at {where} is corrupt: {exc.error_count()} error(s), "
            f"first: {exc.errors()[0]['msg']}"
        ) from exc


def to_json(value: object, *, field: str, step: str | None = None) -> JsonValue:
    """``value`` after a JSON round trip (keys sorted), exactly as :func:`tiers.values.to_json`.

    Raises:
        InvalidInputError: ``value`` is not JSON-serialisable; ``field`` names it.
    """
    return to_json_text(value, field=field, step=step)[0]


def to_json_text(
    value: object, *, field: str, step: str | None = None
) -> tuple[JsonValue, bytes | None]:
    """:func:`to_json`'s value, and its JSON text when orjson's path produced it (else ``None``).

    The text is orjson's dump of the returned value, byte for byte (its dicts
    hold their keys in the sorted order the text has): a record holding the
    value may embed it (``orjson.Fragment``) instead of writing the value again.

    Raises:
        InvalidInputError: ``value`` is not JSON-serialisable; ``field`` names it.
    """
    try:
        text = orjson.dumps(value, default=_refuse, option=_OPTIONS)
        parsed: JsonValue = orjson.loads(text)
    except (TypeError, orjson.JSONDecodeError):
        # Not plain JSON to orjson (a subclass, a huge int, a non-str key, a lone surrogate,
        # deep nesting...): json decides, and refuses what JSON cannot hold.
        return values.to_json(value, field=field, step=step), None
    # orjson writes an enum member or a UUID as its value and NaN or infinity as null,
    # where json refuses them, and a tuple as a list, as json does: only a value that
    # came back equal took no such turn (a tuple then takes json's path, same result).
    if parsed == value:
        return parsed, text
    return values.to_json(value, field=field, step=step), None
