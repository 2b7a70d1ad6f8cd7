"""Strings the walk of a JSON value found nothing in, kept for the next step's value.

A chat state is checkpointed every step and repeats most of its history:
the messages of the last step are the same text again. When a rule is kept
for a value (a prose ``key`` or ``pin`` in one old message keeps ``labelled``
for every later step), the walk runs that rule over every string again, each
step, for the same answers. :class:`CleanStrings` remembers the strings it
found nothing in, by the rules they were tested with and a 128-bit BLAKE2b
digest of the text: never the text itself, so a user's words do not outlive
the call in the redactor (their erasure would not reach a cache of text).

Only those: a string in which something was found is redacted again each time
(few are), so not even a digest of a string with a secret the redactor knows
of is kept.

Bounded in entries by two generations: entries go into the young one; when it
is full, it becomes the old one and the older is dropped. A hit in the old
generation is copied into the young one, so a history that keeps coming back
stays. Each operation is a set test or add, atomic under the GIL: a race
between two threads at worst loses an entry or counts one twice, never gives a
wrong answer (an entry is a fact about its key alone).
"""

from __future__ import annotations

from hashlib import blake2b
from typing import Final

# Entries a generation holds at most (each ~150 bytes: two generations ~10 MB at most).
GENERATION_ENTRIES: Final = 1 << 15

# What a string was tested with: the indexes of the rules, and the string.
CleanKey = tuple[tuple[int, ...], str]
# What is kept of one: the indexes, and the string's digest.
Entry = tuple[tuple[int, ...], bytes]


def _entry(key: CleanKey) -> Entry:
    rules, text = key
    # str.encode, not text.encode: a str subclass's own encode could give two texts one digest.
    return rules, blake2b(str.encode(text, "utf-8", "surrogatepass"), digest_size=16).digest()


class CleanStrings:
    """Strings no rule of a set found anything in (see the module docstring)."""

    __slots__ = ("_old", "_young")

    def __init__(self) -> None:
        self._young: set[Entry] = set()
        self._old: set[Entry] = set()

    def __contains__(self, key: CleanKey) -> bool:
        return self.holds(_entry(key))

    def add(self, key: CleanKey) -> None:
        """Remember that ``key``'s rules find nothing in its string."""
        self.keep(_entry(key))

    @staticmethod
    def entry(key: CleanKey) -> Entry:
        """What is kept of ``key``: for a caller that tests it and may then keep it (one digest)."""
        return _entry(key)

    def holds(self, entry: Entry) -> bool:
        """Whether ``entry`` (of :meth:`entry`) is kept: ``key in self`` by its entry."""
        if entry in self._young:
            return True
        if entry in self._old:
            self.keep(entry)
            return True
        return False

    def keep(self, entry: Entry) -> None:
        """:meth:`add` by the entry (of :meth:`entry`)."""
        if len(self._young) >= GENERATION_ENTRIES:
            self._old = self._young
            self._young = set()
        self._young.add(entry)

    def __len__(self) -> int:
        return len(self._young) + len(self._old)
