"""Checks of caller-supplied values shared by every tier: JSON values and timestamps.

A value a tier stores as JSON must read back as what was written. Python's
``json`` and pydantic both accept things JSON cannot hold: ``NaN``, the
infinities (``1e400`` parses to ``inf``) and strings with lone surrogates
(``"\\ud800"``, which JSON text may escape but UTF-8 cannot encode). Pydantic
would store the first silently as ``null`` and fail on the second with a raw
serialization error. :func:`canonical_json` refuses all of them with an
:class:`~tiers.errors.InvalidInputError` naming the field, and every tier
checks JSON values through it (step outputs, effect results, approval plans,
user-fact values).

Timestamps: :func:`check_datetime` accepts only :class:`datetime.datetime`
values; a naive one is taken as UTC (as every record of :mod:`tiers.models`
does), never as the server's local time.
"""

from __future__ import annotations

import json
from datetime import UTC, datetime

from pydantic import JsonValue

from tiers.errors import InvalidInputError

__all__ = ["canonical_json", "check_datetime", "to_json"]


def canonical_json(value: object, *, field: str, step: str | None = None) -> str:
    """Canonical JSON text of ``value``: sorted keys, no whitespace, UTF-8 (not ``\\u`` escapes).

    Args:
        value: Any JSON-serialisable value (dicts, lists, tuples, str, numbers, bool, None).
        field: Name of the argument, for the error.
        step: Step name, for the error.

    Raises:
        InvalidInputError: ``value`` is not JSON-serialisable (objects, sets, NaN,
            infinities, mixed-type dict keys, lone surrogates); ``field`` names it.
    """
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        text.encode()
    except (TypeError, ValueError, RecursionError) as exc:
        where = f"step {step!r}: " if step is not None else ""
        raise InvalidInputError(
            f"{where}{field} must be JSON-serialisable (dict/list/str/number/bool/None, "
            f"no NaN or infinity, no lone surrogates in strings): {exc}",
            field=field,
        ) from exc
    return text


def to_json(value: object, *, field: str, step: str | None = None) -> JsonValue:
    """``value`` after a JSON round trip, so a first execution returns exactly what a replay will."""
    parsed: JsonValue = json.loads(canonical_json(value, field=field, step=step))
    return parsed


def check_datetime(value: object, field: str) -> datetime:
    """``value`` as a timezone-aware UTC datetime; a naive one is taken as UTC.

    Raises:
        InvalidInputError: ``value`` is not a :class:`datetime.datetime` (a
            number, a string or a bare ``date`` is refused, not guessed at).
    """
    if not isinstance(value, datetime):
        raise InvalidInputError(
            f"{field} must be a datetime (timezone-aware, or naive meaning UTC), got "
            f"{type(value).__name__}",
            field=field,
        )
    try:
        return value.replace(tzinfo=UTC) if value.tzinfo is None else value.astimezone(UTC)
    except (OverflowError, ValueError) as exc:
        raise InvalidInputError(
            f"{field} is out of range once converted to UTC", field=field
        ) from exc
