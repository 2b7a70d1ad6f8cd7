"""Automaton passes finding which gate words and triggers a JSON text holds.

``Redactor.redact_json`` narrows its rules on a value's JSON text. Testing
each gate word and each rule's triggers as a substring costs a scan of the
whole text per word or trigger (~50 of them in the default mode, 1.4-6 us
each on a 5 KB checkpoint): CPython's ``re`` has no multi-pattern automaton,
and its alternations and tries were measured slower still. An Aho-Corasick
automaton (``ahocorasick_rs``, in Rust) finds every one of them in a pass.

Words are matched case-insensitively (in the lowercased text) and triggers
case-sensitively (in the text itself), by two automata. A small set of
patterns searched for leftmost-longest matches lets the automaton skip ahead
with its SIMD prefilter (~1.7-1.9 us per set over a 5 KB checkpoint), where
one automaton of every word and lowercased trigger reporting overlapping
matches walked its DFA over every byte (~9.5 us). Such a search reports no
match that starts inside another one, so each reported match is completed
from a table made once: every pattern that occurs inside it (always there
with it), and every pattern that starts inside it and runs past its end
(tested where it would start). That finds every occurrence: one starting
between two reported matches would have been reported itself (it is further
left than the next), and one starting where a reported match starts is a
prefix of it (the longest is reported). ASCII text is scanned as bytes, whose
offsets are the string's; other text as a string (slower: the binding
translates byte offsets to characters), so the places found are always the
string's.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from typing import AnyStr

from ahocorasick_rs import AhoCorasick, BytesAhoCorasick, MatchKind

# Per pattern: (offset, other pattern, whether it needs a test) for every other pattern
# that may occur at that offset of one of its occurrences.
_Completion = tuple[tuple[int, int, bool], ...]


def _completions(patterns: Sequence[str]) -> tuple[_Completion, ...]:
    """What a leftmost-longest match of each of ``patterns`` hides (see the module docstring)."""
    table: list[_Completion] = []
    for n, pattern in enumerate(patterns):
        hidden: list[tuple[int, int, bool]] = []
        for k in range(len(pattern)):
            rest = pattern[k:]
            for m, other in enumerate(patterns):
                if (k, m) == (0, n):
                    continue
                if rest.startswith(other):
                    hidden.append((k, m, False))  # inside: occurs wherever the match does
                elif k and other.startswith(rest):
                    hidden.append((k, m, True))  # runs past the match's end: test it
        table.append(tuple(hidden))
    return tuple(table)


class _Finder:
    """Every occurrence of a set of patterns, overlapping ones included."""

    def __init__(self, patterns: Iterable[str]) -> None:
        # Longest first: leftmost-first then reports the longest pattern starting where a
        # match starts, as leftmost-longest would, but scans faster (1.9 vs 3.0 us for the
        # triggers over a 5 KB checkpoint: the automaton's prefilter differs).
        self.patterns = tuple(sorted(set(patterns), key=lambda p: (-len(p), p)))
        self._encoded = tuple(p.encode() for p in self.patterns)
        self._hidden = _completions(self.patterns)
        kind = MatchKind.LeftmostFirst
        self._bytes = BytesAhoCorasick(self._encoded, matchkind=kind) if self.patterns else None
        self._str = AhoCorasick(self.patterns, matchkind=kind) if self.patterns else None

    def find(self, text: str, data: bytes | None) -> dict[str, list[int]]:
        """Per pattern found in ``text``, every place it starts (in order).

        ``data`` is ``text``'s UTF-8 when ``text`` is ASCII (bytes scan faster
        and their offsets are the string's), else None.
        """
        if data is not None:
            return self.find_bytes(data)
        if self._str is None:
            return {}
        matches = self._str.find_matches_as_indexes(text)
        return _places(text, matches, self.patterns, self.patterns, self._hidden)

    def find_bytes(self, data: bytes) -> dict[str, list[int]]:
        """:meth:`find` of an ASCII text given as its bytes alone."""
        if self._bytes is None:
            return {}
        matches = self._bytes.find_matches_as_indexes(data)
        return _places(data, matches, self._encoded, self.patterns, self._hidden)


def _places(
    hay: AnyStr,
    matches: list[tuple[int, int, int]],
    patterns: Sequence[AnyStr],
    names: Sequence[str],
    hidden: Sequence[_Completion],
) -> dict[str, list[int]]:
    """Per pattern (by name), where it starts in ``hay``: ``matches`` and what they hide."""
    found: dict[str, list[int]] = {}
    for n, start, _ in matches:
        at = found.get(names[n])
        if at is None:
            found[names[n]] = [start]
        else:
            at.append(start)
        # Places inside one match come before the next match: each list stays in order.
        for k, m, test in hidden[n]:
            if not test or hay.startswith(patterns[m], start + k):
                found.setdefault(names[m], []).append(start + k)
    return found


class GateScan:
    """The gate words and triggers of a rule set, as Aho-Corasick automata.

    Args:
        words: Lowercase ASCII words, found in a text whatever their case.
        triggers: ASCII substrings, found in a text only as they are.
    """

    def __init__(self, words: Iterable[str], triggers: Iterable[str]) -> None:
        self._words = _Finder(words)
        self._triggers = _Finder(triggers)

    def scan(
        self, text: str, lowered: str, data: bytes | None = None
    ) -> tuple[dict[str, list[int]], set[str]]:
        """Where ``lowered`` holds each word, and the triggers ``text`` holds.

        Args:
            text: The text the triggers are looked for in.
            lowered: ``text.lower()``, where the words are looked for.
            data: ``text``'s UTF-8, if the caller has it (saves encoding it).

        Returns:
            Per word found, every place it starts in ``lowered`` (in order,
            overlapping occurrences too); and the triggers found.
        """
        if text.isascii():
            data = text.encode() if data is None else data
            # Lowercasing ASCII keeps it ASCII.
            low: bytes | None = lowered.encode()
        else:
            data = None
            low = lowered.encode() if lowered.isascii() else None
        return self._words.find(lowered, low), set(self._triggers.find(text, data))

    def scan_ascii(self, data: bytes, folded: bytes) -> tuple[dict[str, list[int]], set[str]]:
        """:meth:`scan` of an ASCII text given as bytes, its words looked for in ``folded``.

        Args:
            data: The text's bytes (ASCII), where the triggers are looked for.
            folded: ``data`` of the same length with every letter lowercased,
                its other bytes free to differ but never letters (a word, made
                of letters, is found where the lowercase has it). The
                redactor's map also turns digits, spaces and dashes into
                zeros for its card gate.
        """
        return self._words.find_bytes(folded), set(self._triggers.find_bytes(data))
