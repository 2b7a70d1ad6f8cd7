"""Identifier rules shared by every tier.

Ids become parts of storage keys (SQLite rows, Redis hash tags, Chroma
metadata), so they are restricted to a safe alphabet: this is what keeps one
user's keys from ever colliding with, or reaching into, another's.
"""

from __future__ import annotations

import re
from typing import Annotated

from pydantic import AfterValidator

from tiers.errors import InvalidInputError

ID_PATTERN = re.compile(r"[A-Za-z0-9][A-Za-z0-9._@+\-]{0,127}")
ID_RULE = "1-128 characters from A-Z a-z 0-9 . _ @ + -, starting with a letter or digit"


def check_id(value: object, field: str) -> str:
    """Return ``value`` if it is a valid id, else raise :class:`InvalidInputError` naming ``field``."""
    if not isinstance(value, str):
        raise InvalidInputError(
            f"{field} must be a string, got {type(value).__name__}", field=field
        )
    if not value:
        raise InvalidInputError(f"{field} must not be empty", field=field)
    if ID_PATTERN.fullmatch(value) is None:
        raise InvalidInputError(f"{field} {value[:140]!r} is invalid: use {ID_RULE}", field=field)
    return value


def _pydantic_id(value: str) -> str:
    if ID_PATTERN.fullmatch(value) is None:
        # ValueError is what pydantic turns into a ValidationError naming the field.
        raise ValueError(f"invalid id {value[:140]!r}: use {ID_RULE}")
    return value


Id = Annotated[str, AfterValidator(_pydantic_id)]
"""A string id field of a pydantic model, validated by :data:`ID_PATTERN`."""
