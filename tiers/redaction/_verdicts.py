"""What the walk of a JSON value decided for each string, kept for the next step's value.

A chat state is checkpointed every step and repeats most of its history:
the messages of the last step are the same text again. When a rule is kept
for a value (a prose ``key`` or ``pin`` in one old message keeps ``labelled``
for every later step), the walk runs that rule over every string again, each
step, for the same answers. :class:`Verdicts` remembers them: the redacted
text of a string (the string itself when nothing was found), by the rules it
was redacted with and the exact text.

Bounded in characters (what the entries hold at most, not counting what the
caller holds anyway) by two generations: entries go into the young one; when
it is full, it becomes the old one and the older is dropped. A hit in the old
generation is copied into the young one, so a history that keeps coming back
stays. Each operation is a dict ``get`` or assignment, atomic under the GIL: a
race between two threads at worst loses an entry or counts one twice, never
gives a wrong answer (an entry is a pure function of its key).
"""

from __future__ import annotations

from typing import Final

# Characters a generation holds at most (a few MB of text for the two).
GENERATION_CHARS: Final = 1 << 20
# Longer strings are not kept: one would fill a generation by itself.
MAX_KEPT_CHARS: Final = 1 << 16

# A verdict's key: the indexes of the rules a string was redacted with, and the string.
VerdictKey = tuple[tuple[int, ...], str]


class Verdicts:
    """Redacted strings by (rules, text), for strings seen in earlier values (see the module docstring)."""

    __slots__ = ("_chars", "_old", "_young")

    def __init__(self) -> None:
        self._young: dict[VerdictKey, str] = {}
        self._old: dict[VerdictKey, str] = {}
        self._chars = 0

    def get(self, key: VerdictKey) -> str | None:
        """The redacted text kept for ``key``, or None."""
        found = self._young.get(key)
        if found is None:
            found = self._old.get(key)
            if found is not None:
                self.put(key, found)
        return found

    def put(self, key: VerdictKey, redacted: str) -> None:
        """Keep ``redacted`` as the text ``key``'s string redacts to (unless it is too long)."""
        text = key[1]
        if len(text) > MAX_KEPT_CHARS:
            return
        # A string that did not change is held by the caller anyway; one redacted is new text.
        size = len(text) if redacted is text else len(text) + len(redacted)
        if self._chars + size > GENERATION_CHARS:
            self._old = self._young
            self._young = {}
            self._chars = 0
        self._young[key] = redacted
        self._chars += size

    def __len__(self) -> int:
        return len(self._young) + len(self._old)
