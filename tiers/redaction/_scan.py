"""One automaton pass finding which gate words and triggers a JSON text holds.

``Redactor.redact_json`` narrows its rules on a value's JSON text. Testing
each gate word and each rule's triggers as a substring costs a scan of the
whole text per word or trigger (~50 of them in the default mode, 1.4-6 us
each on a 5 KB checkpoint): CPython's ``re`` has no multi-pattern automaton,
and its alternations and tries were measured slower still. An Aho-Corasick
automaton (``ahocorasick_rs``, in Rust) finds every one of them, overlapping
occurrences included, in one pass.

Words are matched case-insensitively (in the lowercased text) and triggers
case-sensitively (in the text), both in one pass over the lowercased text: a
trigger's lowercase occurs wherever the trigger does (lowercasing maps each
character by itself; only a capital sigma looks at its neighbours, and no
trigger holds one), so the triggers whose lowercase occurs are the
candidates, each then confirmed in the text itself (they are rare: most text
holds none). ASCII text is scanned as bytes, whose offsets are the string's;
other text as a string (slower: the binding translates byte offsets to
characters), so the places found are always the lowercased string's.
"""

from __future__ import annotations

from collections.abc import Iterable

from ahocorasick_rs import AhoCorasick, BytesAhoCorasick, Implementation


class GateScan:
    """The gate words and triggers of a rule set, as an Aho-Corasick automaton.

    Args:
        words: Lowercase ASCII words, found in a text whatever their case.
        triggers: ASCII substrings, found in a text only as they are.
    """

    def __init__(self, words: Iterable[str], triggers: Iterable[str]) -> None:
        word_set = set(words)
        trigger_set = set(triggers)
        patterns = sorted(word_set | {t.lower() for t in trigger_set})
        # Per pattern: the word it is (or None), and the triggers it is the lowercase of.
        self._words = tuple(p if p in word_set else None for p in patterns)
        self._triggers = tuple(
            tuple(sorted(t for t in trigger_set if t.lower() == p)) for p in patterns
        )
        # DFAs: built once per redactor, the fastest to scan with overlapping matches. On
        # ASCII text the bytes' offsets are the string's; other text is scanned as a string
        # (slower: the offsets are translated to characters), so that they are too.
        self._ascii = BytesAhoCorasick(
            [p.encode() for p in patterns], implementation=Implementation.DFA
        )
        self._unicode = AhoCorasick(patterns, implementation=Implementation.DFA)

    def scan(self, text: str, lowered: str) -> tuple[dict[str, list[int]], set[str]]:
        """Where ``lowered`` holds each word, and the triggers ``text`` holds.

        Args:
            text: The text the triggers are looked for in.
            lowered: ``text.lower()``, where the words are looked for.

        Returns:
            Per word found, every place it starts in ``lowered`` (in order,
            overlapping occurrences too); and the triggers found.
        """
        if lowered.isascii():
            matches = self._ascii.find_matches_as_indexes(lowered.encode(), overlapping=True)
        else:
            matches = self._unicode.find_matches_as_indexes(lowered, overlapping=True)
        words: dict[str, list[int]] = {}
        candidates: set[int] = set()
        for n, start, _ in matches:
            word = self._words[n]
            if word is not None:
                # Matches come in the order they end: a word's (one length) in order of start.
                words.setdefault(word, []).append(start)
            candidates.add(n)
        triggers = {t for n in candidates for t in self._triggers[n] if t in text}
        return words, triggers
