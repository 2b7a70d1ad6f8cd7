"""What the item store (:mod:`tiers.items`) accepts, and its filter language.

Every check raises :class:`~tiers.errors.InvalidInputError` naming the field,
before anything is stored. Bounds: a namespace holds at most ``MAX_DEPTH``
labels of ``MAX_LABEL`` characters, a key ``MAX_KEY`` characters; labels and
keys may be any other text (they are encoded, never interpreted).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import JsonValue

from tiers.errors import InvalidInputError
from tiers.values import canonical_json, to_json

__all__ = [
    "MAX_DEPTH",
    "MAX_KEY",
    "MAX_LABEL",
    "MAX_LIMIT",
    "MAX_MODEL",
    "check_filter",
    "check_key",
    "check_model",
    "check_namespace",
    "check_page",
    "check_pattern",
    "check_ttl",
    "check_value",
    "matches_filter",
    "matches_pattern",
]

Namespace = tuple[str, ...]

MAX_DEPTH = 32
MAX_LABEL = 256
MAX_KEY = 1024
MAX_MODEL = 128
MAX_LIMIT = 10_000
_OPERATORS = frozenset({"$eq", "$ne", "$gt", "$gte", "$lt", "$lte"})


def check_value(value: object) -> dict[str, JsonValue]:
    """``value`` as the JSON object it will read back as.

    Raises:
        InvalidInputError: ``value`` is not a mapping with string keys, or holds
            something JSON cannot (NaN, infinities, lone surrogates, objects);
            ``field`` is ``value``.
    """
    if not isinstance(value, Mapping):
        raise InvalidInputError(
            f"value must be a mapping (a JSON object), got {type(value).__name__}",
            field="value",
        )
    for name in value:
        if not isinstance(name, str):
            raise InvalidInputError(f"value keys must be strings, got {name!r}", field="value")
    parsed = to_json(dict(value), field="value")
    if not isinstance(parsed, dict):  # pragma: no cover - a dict stays a dict through JSON
        raise InvalidInputError("value must be a JSON object", field="value")
    return parsed


def check_namespace(namespace: object, field: str, *, allow_empty: bool = False) -> Namespace:
    if isinstance(namespace, str) or not isinstance(namespace, Sequence):
        raise InvalidInputError(
            f"{field} must be a tuple of strings, got {type(namespace).__name__}", field=field
        )
    labels = tuple(namespace)
    if not labels and not allow_empty:
        raise InvalidInputError(f"{field} must not be empty", field=field)
    if len(labels) > MAX_DEPTH:
        raise InvalidInputError(
            f"{field} has {len(labels)} labels, more than {MAX_DEPTH}", field=field
        )
    for label in labels:
        if not isinstance(label, str):
            raise InvalidInputError(
                f"{field} labels must be strings, got {type(label).__name__}", field=field
            )
        if len(label) > MAX_LABEL:
            raise InvalidInputError(
                f"{field} label {label[:40]!r}... is {len(label)} characters, over {MAX_LABEL}",
                field=field,
            )
        _check_text(label, field)
    return labels


def check_key(key: object) -> str:
    if not isinstance(key, str):
        raise InvalidInputError(f"key must be a string, got {type(key).__name__}", field="key")
    if len(key) > MAX_KEY:
        raise InvalidInputError(
            f"key is {len(key)} characters, over the limit of {MAX_KEY}", field="key"
        )
    _check_text(key, "key")
    return key


def _check_text(text: str, field: str) -> None:
    try:
        text.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise InvalidInputError(
            f"{field} {text[:40]!r} has a lone surrogate and cannot be stored", field=field
        ) from exc


def check_pattern(pattern: object, field: str) -> tuple[str | None, ...]:
    if isinstance(pattern, str) or not isinstance(pattern, Sequence):
        raise InvalidInputError(f"{field} must be a tuple of labels", field=field)
    for label in pattern:
        if label is not None and not isinstance(label, str):
            raise InvalidInputError(
                f"{field} labels must be strings (or None for any), got {label!r}", field=field
            )
    return tuple(pattern)


def check_model(model: object) -> str:
    if not isinstance(model, str) or not model or len(model) > MAX_MODEL:
        raise InvalidInputError(
            f"model must name the embedder (1-{MAX_MODEL} characters), got {model!r}",
            field="model",
        )
    return model


def check_ttl(ttl: object) -> None:
    if ttl is None:
        return
    if (
        not isinstance(ttl, int | float)
        or isinstance(ttl, bool)
        or not math.isfinite(ttl)
        or ttl <= 0
    ):
        raise InvalidInputError(
            f"ttl must be a positive number of minutes or None, got {ttl!r}", field="ttl"
        )
    if ttl > 1e8:  # about 190 years: further is "never", and overflows datetime arithmetic
        raise InvalidInputError(f"ttl {ttl!r} minutes is too large; use None", field="ttl")


def check_page(limit: object, offset: object) -> None:
    for name, number in (("limit", limit), ("offset", offset)):
        if not isinstance(number, int) or isinstance(number, bool) or number < 0:
            raise InvalidInputError(
                f"{name} must be a non-negative integer, got {number!r}", field=name
            )
    if limit > MAX_LIMIT:  # type: ignore[operator]
        raise InvalidInputError(f"limit must be at most {MAX_LIMIT}", field="limit")


def check_filter(filter: object) -> None:
    if filter is None:
        return
    if not isinstance(filter, Mapping):
        raise InvalidInputError(
            f"filter must be a mapping of field to value, got {type(filter).__name__}",
            field="filter",
        )
    for name, wanted in filter.items():
        if not isinstance(name, str):
            raise InvalidInputError(f"filter keys must be strings, got {name!r}", field="filter")
        _check_condition(wanted)
        canonical_json(wanted, field="filter")


def _check_condition(wanted: object) -> None:
    if isinstance(wanted, Mapping):
        operators = [k for k in wanted if isinstance(k, str) and k.startswith("$")]
        unknown = [k for k in operators if k not in _OPERATORS]
        if unknown:
            raise InvalidInputError(
                f"unsupported filter operator {unknown[0]!r}: use one of "
                f"{', '.join(sorted(_OPERATORS))}",
                field="filter",
            )
        if not operators:
            for inner in wanted.values():
                _check_condition(inner)


def matches_filter(value: Mapping[str, Any], filter: Mapping[str, Any] | None) -> bool:
    """Whether an item's value satisfies ``filter`` (LangGraph's store filter language).

    Each ``filter`` entry names a field (``a.b`` reaches into nested objects
    when there is no field named ``a.b``) and gives either a value the field
    must equal (objects and arrays compared element by element) or an object
    of operators: ``$eq``, ``$ne``, ``$gt``, ``$gte``, ``$lt``, ``$lte``.
    Ordering operators compare numbers with numbers and strings with strings;
    anything else does not match.
    """
    if not filter:
        return True
    return all(_compare(_field(value, name), wanted) for name, wanted in filter.items())


def _field(value: Mapping[str, Any], name: str) -> Any:
    if name in value:
        return value[name]
    current: Any = value
    for part in name.split("."):
        if not isinstance(current, Mapping) or part not in current:
            return None
        current = current[part]
    return current


def _compare(actual: Any, wanted: Any) -> bool:
    if isinstance(wanted, Mapping):
        if any(isinstance(k, str) and k.startswith("$") for k in wanted):
            return all(_operator(actual, op, operand) for op, operand in wanted.items())
        if not isinstance(actual, Mapping):
            return False
        return all(_compare(actual.get(k), v) for k, v in wanted.items())
    if isinstance(wanted, list | tuple):
        return (
            isinstance(actual, list | tuple)
            and len(actual) == len(wanted)
            and all(_compare(a, w) for a, w in zip(actual, wanted, strict=True))
        )
    return _equal(actual, wanted)


def _equal(actual: Any, wanted: Any) -> bool:
    # JSON true is not 1: a bool matches only a bool.
    if isinstance(actual, bool) or isinstance(wanted, bool):
        return isinstance(actual, bool) and isinstance(wanted, bool) and actual == wanted
    return bool(actual == wanted)


def _number(x: Any) -> bool:
    return isinstance(x, int | float) and not isinstance(x, bool)


def _operator(actual: Any, op: str, operand: Any) -> bool:
    if op == "$eq":
        return _compare(actual, operand)
    if op == "$ne":
        return not _compare(actual, operand)
    comparable = (_number(actual) and _number(operand)) or (
        isinstance(actual, str) and isinstance(operand, str)
    )
    if not comparable:
        return False
    if op == "$gt":
        return bool(actual > operand)
    if op == "$gte":
        return bool(actual >= operand)
    if op == "$lt":
        return bool(actual < operand)
    return bool(actual <= operand)  # $lte; operators are checked before matching


def matches_pattern(namespace: Namespace, pattern: Sequence[str | None], *, suffix: bool) -> bool:
    if len(namespace) < len(pattern):
        return False
    part = namespace[len(namespace) - len(pattern) :] if suffix else namespace[: len(pattern)]
    return all(p is None or p == label for p, label in zip(pattern, part, strict=True))
