"""JSON encoding of records at the storage boundary (never pickle)."""

from __future__ import annotations

from typing import TypeVar

from pydantic import BaseModel, ValidationError

from tiers.errors import CorruptRecordError

RecordT = TypeVar("RecordT", bound=BaseModel)


def encode(record: BaseModel) -> bytes:
    """Serialise a record to the JSON bytes stored in a KV value."""
    return record.model_dump_json().encode()


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
