"""The vocabulary of redaction: modes, findings and the shape of a rule."""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass
from typing import Final, Literal, TypeVar, get_args

RedactMode = Literal["off", "secrets", "secrets+pii"]
J = TypeVar("J")  # a JSON value: redact_json gives back the same shape
MODES: Final[tuple[str, ...]] = get_args(RedactMode)

DEFAULT_PLACEHOLDER: Final = "[REDACTED:{kind}]"

_KIND: Final = re.compile(r"[a-z][a-z0-9_]{0,31}")


@dataclass(frozen=True, slots=True)
class Finding:
    """One thing a redactor found: what kind, which rule, where (``text[start:end]``)."""

    kind: str
    rule: str
    start: int
    end: int


# A rule's classifier gets a match and returns (kind, start, end) to replace, or None.
Classify = Callable[[re.Match[str]], tuple[str, int, int] | None]


@dataclass(frozen=True, slots=True)
class _Rule:
    name: str
    pattern: re.Pattern[str]
    classify: Classify
    # The rule runs only on text holding one of these (a C-speed substring test).
    triggers: tuple[str, ...] = ()
    # Or: where this finds its word in the lowercased text, ``pattern`` is matched.
    finder: re.Pattern[str] | None = None
    finder_i: re.Pattern[str] | None = None  # the same, for text whose lowercase is longer
    # The finder runs only on text whose lowercase holds one of these words.
    words: tuple[str, ...] = ()
    # The rule runs only on text with a run of this many digits, separators between them
    # allowed (a card's one, a phone's any run): 7 (phones), 13 (cards); 0 for none. A string is tested for a 7-digit run
    # (implied by either); a JSON value's whole text for the rule's own length.
    digits: int = 0
    # A looser form of ``pattern`` that matches a JSON value's text wherever ``pattern``
    # matches one of its strings: a value whose text it misses needs no walk for this rule.
    json_gate: re.Pattern[str] | None = None


def _group(kind: str, group: int | str = 0, check: Callable[[str], bool] | None = None) -> Classify:
    """A classifier that replaces ``group`` as ``kind`` when ``check`` accepts its text."""

    def classify(m: re.Match[str]) -> tuple[str, int, int] | None:
        start, end = m.span(group)
        if start < 0 or start == end:
            return None
        if check is not None and not check(m.string[start:end]):
            return None
        return kind, start, end

    return classify
