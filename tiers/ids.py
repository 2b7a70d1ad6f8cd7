"""Identifier rules shared by every tier.

Ids become parts of storage keys (SQLite rows, Redis hash tags, Chroma
metadata), so they are restricted to a safe alphabet: this is what keeps one
user's keys from ever colliding with, or reaching into, another's. Ids that
come from elsewhere (an Agents SDK session id, a LangGraph thread id such as
``user:42/chat``) are mapped onto that alphabet by :func:`run_id_for`.
"""

from __future__ import annotations

import hashlib
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


MAX_EXTERNAL_ID = 1024
"""Longest external id a run stores (``RunInfo.external_id``); :func:`run_id_for` maps any length."""

_DIGEST_HEX = 32
_PREFIX_MAX = 80
DERIVED_ID_PATTERN = re.compile(
    rf"[A-Za-z0-9][A-Za-z0-9._@+\-]{{0,{_PREFIX_MAX - 1}}}\+[0-9a-f]{{{_DIGEST_HEX}}}"
)
"""Shape of the ids :func:`run_id_for` derives: ``<readable prefix>+<32 hex digits>``."""

_UNSAFE = re.compile(r"[^A-Za-z0-9._@+\-]+")


def run_id_for(external_id: str) -> str:
    """The run id of an id from elsewhere: deterministic, valid, and one per external id.

    Frameworks name their threads and sessions freely (``user:42/chat``, a
    UUID, an e-mail address). This maps any non-empty string onto the id
    alphabet (:data:`ID_PATTERN`) so it can name a run:

    - a string that is already a valid id maps to itself, unless it has the
      shape of a derived id (:data:`DERIVED_ID_PATTERN`);
    - any other string maps to ``<prefix>+<digest>``: ``prefix`` is the string
      with each run of characters outside the alphabet replaced by ``_``
      (at most 80 characters, starting with a letter or digit, ``x`` if none
      is left) and ``digest`` the first 32 hex digits (128 bits) of the
      SHA-256 of the whole string in UTF-8. ``user:42/chat`` becomes
      ``user_42_chat+`` and 32 hex digits.

    Identity ids never have the derived shape and derived ids are distinct
    per input (short of a SHA-256 collision), so two different external ids
    never share a run id. The mapping is part of the storage format: it never
    changes.

    Args:
        external_id: Any non-empty string.

    Returns:
        A valid id (at most 128 characters).

    Raises:
        InvalidInputError: ``external_id`` is not a string, or empty.
    """
    if not isinstance(external_id, str):
        raise InvalidInputError(
            f"external_id must be a string, got {type(external_id).__name__}",
            field="external_id",
        )
    if not external_id:
        raise InvalidInputError("external_id must not be empty", field="external_id")
    if ID_PATTERN.fullmatch(external_id) and not DERIVED_ID_PATTERN.fullmatch(external_id):
        return external_id
    # surrogatepass: every Python str hashes, even one with a lone surrogate.
    digest = hashlib.sha256(external_id.encode("utf-8", "surrogatepass")).hexdigest()
    prefix = _UNSAFE.sub("_", external_id).lstrip("._@+-")[:_PREFIX_MAX] or "x"
    return f"{prefix}+{digest[:_DIGEST_HEX]}"


def check_external_id(value: object, field: str = "external_id") -> str:
    """Return ``value`` if a run can store it as its external id (1-1024 characters), else raise."""
    if not isinstance(value, str):
        raise InvalidInputError(
            f"{field} must be a string, got {type(value).__name__}", field=field
        )
    if not 1 <= len(value) <= MAX_EXTERNAL_ID:
        raise InvalidInputError(
            f"{field} must be 1-{MAX_EXTERNAL_ID} characters, got {len(value)}", field=field
        )
    return value
