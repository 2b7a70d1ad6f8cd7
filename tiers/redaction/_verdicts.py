"""Strings the walk of a JSON value found nothing in, kept for the next step's value.

A chat state is checkpointed every step and repeats most of its history:
the messages of the last step are the same text again. When a rule is kept
for a value (a prose ``key`` or ``pin`` in one old message keeps ``labelled``
for every later step), the walk runs that rule over every string again, each
step, for the same answers. :class:`CleanStrings` remembers the strings it
found nothing in, by the rules they were tested with and the exact text.

Only those: a string in which something was found is redacted again each time
(few are), so this never holds a string with a secret the redactor knows of
beyond the call that saw it.

Bounded in characters by two generations: strings go into the young one; when
it is full, it becomes the old one and the older is dropped. A hit in the old
generation is copied into the young one, so a history that keeps coming back
stays. Each operation is a set test or add, atomic under the GIL: a race
between two threads at worst loses an entry or counts one twice, never gives a
wrong answer (an entry is a fact about its key alone).
"""

from __future__ import annotations

from typing import Final

# Characters a generation holds at most (the two: ~2 MB of ASCII text, 8 MB at worst).
GENERATION_CHARS: Final = 1 << 20
# Longer strings are not kept: one would fill a generation by itself.
MAX_KEPT_CHARS: Final = 1 << 16

# An entry: the indexes of the rules a string was tested with, and the string.
CleanKey = tuple[tuple[int, ...], str]


class CleanStrings:
    """Strings no rule of a set found anything in (see the module docstring)."""

    __slots__ = ("_chars", "_old", "_young")

    def __init__(self) -> None:
        self._young: set[CleanKey] = set()
        self._old: set[CleanKey] = set()
        self._chars = 0

    def __contains__(self, key: CleanKey) -> bool:
        if key in self._young:
            return True
        if key in self._old:
            self.add(key)
            return True
        return False

    def add(self, key: CleanKey) -> None:
        """Remember that ``key``'s rules find nothing in its string (unless it is too long)."""
        size = len(key[1])
        if size > MAX_KEPT_CHARS:
            return
        if self._chars + size > GENERATION_CHARS:
            self._old = self._young
            self._young = set()
            self._chars = 0
        self._young.add(key)
        self._chars += size

    def __len__(self) -> int:
        return len(self._young) + len(self._old)
