"""Where a word sits in a value's JSON text: in a string value, or in a key.

``Redactor.redact_json`` gates its rules on the value's JSON text (orjson's
compact output), but the rules only ever look at string VALUES and a key only
matters when it names a credential. A rule word such as ``key`` in a key name
(``idempotency_key``) must neither keep a rule nor start the by-key walk. In
compact JSON a string is a key exactly when its closing quote is followed by
``:`` (a value string is followed by ``,``, ``]``, ``}`` or the end), and a
word made of letters only occurs inside strings (outside them are numbers,
``true``, ``false``, ``null`` and punctuation), so the closing quote after an
occurrence tells which kind of string holds it.
"""

from __future__ import annotations

from bisect import bisect_left
from collections.abc import Sequence
from functools import cache
from itertools import repeat
from operator import sub

# Outside its strings a JSON text has no letters but these words' (and an exponent's "e"):
# a gate word that is none of their substrings occurs in the text only inside strings.
_LITERALS = "true false null"


def placeable(word: str) -> bool:
    """Whether an occurrence of ``word`` in a JSON text is surely inside a string."""
    return word.isascii() and word.isalpha() and word not in _LITERALS and word != "e"


def _closing_quote(text: str, pos: int) -> int:
    """The first unescaped ``"`` at or after ``pos`` (a string's closing quote, from inside it)."""
    quote = text.find('"', pos)
    while quote > 0:
        backslashes = 0
        while text[quote - 1 - backslashes] == "\\":
            backslashes += 1
        if not backslashes % 2:
            return quote
        quote = text.find('"', quote + 1)
    return quote


def _opening_quote(text: str, pos: int) -> int:
    """The last unescaped ``"`` before ``pos`` (a string's opening quote, from inside it)."""
    quote = text.rfind('"', 0, pos)
    while quote > 0:
        backslashes = 0
        while text[quote - 1 - backslashes] == "\\":
            backslashes += 1
        if not backslashes % 2:
            return quote
        quote = text.rfind('"', 0, quote)
    return quote


@cache
def _overlaps_itself(word: str) -> bool:
    """Whether two occurrences of ``word`` may overlap (``cvcvc``: ``cvc`` twice)."""
    return any(word.startswith(word[k:]) for k in range(1, len(word)))


def _disjoint(at: Sequence[int], word: str) -> int:
    """How many occurrences of ``word`` at ``at`` (sorted) do not overlap an earlier one counted.

    What ``str.count`` answers: occurrences counted left to right, each one
    starting where the last one counted ends or later.
    """
    if not _overlaps_itself(word):
        return len(at)
    size = len(word)
    count = 0
    free = 0
    for pos in at:
        if pos >= free:
            count += 1
            free = pos + size
    return count


def word_places(
    lowered: str, text: str, word: str, at: Sequence[int]
) -> tuple[list[tuple[int, int]], set[str] | None]:
    """The string values of a JSON text that hold ``word``, and its keys that do.

    ``lowered`` is ``text`` lowercased (or, of ASCII text, any map of it that
    lowercases its letters and keeps its quotes, backslashes and colons: only
    those are read in it), ``word`` is :func:`placeable` and
    ``at`` holds every place ``word`` starts in ``lowered``, in order
    (overlapping occurrences too). Each value is the span of its text between
    its quotes, ``lowered[start:end]``. The keys are read from ``text`` (their
    case tells what they name), so they are None unless lowercasing kept every
    position (no character of ``text`` became two, as "İ" does). A key of
    other scripts' letters is read as it is: no such key names a credential
    (``_key_class`` reads ASCII letters only, the Kelvin sign is no "k").

    A key starts after the last quote before ``word``: an escaped one when the
    key holds a quote, but a key naming a credential holds none (nor any other
    character JSON escapes), so then it is the key as it is. A key repeats in
    a list of records (``idempotency_key``): once every occurrence of ``word``
    is in a key already found, the search stops.
    """
    values: list[tuple[int, int]] = []
    # Lowercasing never drops a character: the same length means each became one, in place.
    keys: set[str] | None = set() if len(lowered) == len(text) else None
    left = _disjoint(at, word)
    n = 0
    while n < len(at) and left:
        pos = at[n]
        quote = lowered.find('"', pos + len(word))
        if quote > 0 and lowered[quote - 1] == "\\":  # maybe escaped (rare): count backslashes
            quote = _closing_quote(lowered, quote)
        if quote < 0:  # not JSON text as orjson writes it: a value of it all, the safe side
            return [(0, len(lowered))], keys
        if lowered.startswith(":", quote + 1):
            start = lowered.rfind('"', 0, pos) + 1
            if keys is None:
                left -= 1
            else:
                key = text[start:quote]
                if key not in keys:
                    keys.add(key)
                    # Every occurrence of this key (exactly: the case matters) is accounted for.
                    # Each holds the word where this one does, so it is found from one of ``at``
                    # (a few places, where a count of the key in the text would scan it all).
                    label = f'"{key}":'
                    back = pos - start + 1
                    places = map(sub, at[bisect_left(at, back) :], repeat(back))
                    found = sum(map(text.startswith, repeat(label), places))
                    left -= found * lowered[start:quote].count(word)
        else:
            values.append((_opening_quote(lowered, pos) + 1, quote))
            left -= lowered.count(word, pos, quote)
        # The next occurrence after this string.
        n = bisect_left(at, quote + 1, n + 1)
    return values, keys
