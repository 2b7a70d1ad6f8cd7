"""Constants of the scope manager and the checks of its arguments."""

from __future__ import annotations

import re
from typing import Final

from memory.errors import InvalidScopeInputError
from summarizer.errors import SummarizerError
from summarizer.tokens import get_encoding

SCOPE_SCHEMA_VERSION: Final = 1
DEFAULT_ENCODING: Final = "cl100k_base"
DEFAULT_WORKING_BUDGET_TOKENS: Final = 2000
DEFAULT_FIRST_PHASE: Final = "phase-1"
HANDOFF_KIND: Final = "handoff"

SYSTEM_HEADER: Final = "## System"
WORKING_HEADER: Final = "## Working memory (phase: {phase})"
TRACE_HEADER: Final = "## Trace"
SECTION_SEPARATOR: Final = "\n\n"

MAX_KEY_CHARS: Final = 256
MAX_PHASE_CHARS: Final = 128
KIND_PATTERN: Final = re.compile(r"[A-Za-z][A-Za-z0-9_.\-]{0,63}")


# --- argument checks -------------------------------------------------------------------------


def _check_str(value: object, field: str) -> str:
    if not isinstance(value, str):
        raise InvalidScopeInputError(
            f"{field} must be a string, got {type(value).__name__}", field=field
        )
    return value


def _check_name(value: object, field: str, max_chars: int) -> str:
    text = _check_str(value, field)
    if not text or len(text) > max_chars or not text.isprintable():
        raise InvalidScopeInputError(
            f"{field} {text[:80]!r} is invalid: use 1-{max_chars} printable characters "
            "(no newlines or control characters)",
            field=field,
        )
    return text


def _check_kind(value: object) -> str:
    kind = _check_str(value, "kind")
    if KIND_PATTERN.fullmatch(kind) is None:
        raise InvalidScopeInputError(
            f"trace kind {kind[:80]!r} is invalid: use a letter followed by up to 63 of "
            "A-Z a-z 0-9 _ . - (e.g. 'step', 'tool', 'note')",
            field="kind",
        )
    return kind


def _check_count(value: object, field: str, unit: str = "tokens") -> int:
    # bool is an int subclass; True as a budget is a bug, not one token.
    if not isinstance(value, int) or isinstance(value, bool) or value < 0:
        raise InvalidScopeInputError(
            f"{field} must be a non-negative integer number of {unit}, got {value!r}",
            field=field,
        )
    return value


def _check_encoding(value: object) -> str:
    name = _check_str(value, "encoding")
    try:
        get_encoding(name)
    except SummarizerError as exc:
        raise InvalidScopeInputError(str(exc), field="encoding") from exc
    return name
