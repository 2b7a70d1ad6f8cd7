"""Lex ranges a Redis scan reads: their bounds, and each one's last listing, the next scan's guess.

A scan of large values (a run's history) is two round trips: the scan script
lists the range's keys, then one ``MULTI`` reads their values and checks the
listing still holds. A range read again unchanged (a finished run's history,
read by a console or a harness many times) can be one: a ``MULTI`` that lists
the range and reads the values of the keys it listed last time. When the
listing is the one guessed, keys and values are ``EXEC``'s snapshot. When it is
not, the values read were wasted, so a range is guessed only while it stays
as it was: a listing that differs from the range's previous one (a run still
growing) is remembered but not guessed until a later listing is the same again.

A listing holds key names (run and session ids among them): the listings of a
space a store's own commit deletes from are forgotten at once, so a run or
session it deleted leaves no id in its memory (deleting means gone). One
another client deleted stays until its range is read again (a range found
empty is forgotten), forgotten as the oldest, or by the process's cache sweeper
past the max age (:mod:`tiers.cache_ages`).
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from typing import Any, Final

from tiers.backends.base import Put, Write
from tiers.cache_ages import SWEEPER, Stamps

# Ranges remembered per store (the oldest forgotten first): ten runs' histories and their
# pages many times over, at about 50 bytes a listed key.
LISTINGS_KEPT: Final = 256
# The most keys of a listing remembered: a page of history is 100; a longer listing (a
# whole large space) saves one round trip of many, and 256 of them would hold the names
# of millions of keys.
LISTED_KEYS_KEPT: Final = 1000

# A range as a scan asks for it: (hash name, low, high, reverse, limit).
Range = tuple[str, str, str, bool, int | None]


class Listings:
    """Each range's last listing, and whether the next scan of it may guess it.

    Thread-safe: a store's scans run in many threads.
    """

    def __init__(self, kept: int = LISTINGS_KEPT) -> None:
        self._kept = kept
        self._lock = threading.Lock()
        # Range -> (its last listing, whether a scan may guess it).
        self._by_range: dict[Range, tuple[list[Any], bool]] = {}
        self._stamps: Stamps[Range] = Stamps()
        SWEEPER.track(self)

    def guess(self, span: Range) -> list[Any] | None:
        """The listing to guess for ``span``, or ``None`` (never listed, or it changed lately)."""
        found = self._by_range.get(span)
        if found is None or not found[1]:
            return None
        return found[0]

    def note(self, span: Range, listing: list[Any]) -> None:
        """Remember ``span``'s ``listing`` (non-empty), read and checked outside the script.

        Guessed next time unless it differs from the one remembered before it.
        One of more than :data:`LISTED_KEYS_KEPT` keys is not remembered.
        """
        with self._lock:
            before = self._by_range.pop(span, None)
            if len(listing) > LISTED_KEYS_KEPT or not SWEEPER.keeping:
                self._stamps.discard(span)
                return
            self._by_range[span] = (listing, before is None or before[0] == listing)
            self._stamps.stamp(span)
            if len(self._by_range) > self._kept:
                oldest = next(iter(self._by_range))
                del self._by_range[oldest]
                self._stamps.discard(oldest)

    def forget(self, span: Range) -> None:
        """Forget ``span``'s listing (the range was found empty: its keys were deleted)."""
        with self._lock:
            self._by_range.pop(span, None)
            self._stamps.discard(span)

    def forget_deleted(
        self, writes: Sequence[Write], names: Callable[[str], tuple[str, str]]
    ) -> None:
        """Forget every listing of a space ``writes`` delete keys of (or delete).

        Called after each commit, applied or maybe: a deleted key's name must not
        stay in memory (deleting means gone). ``names`` gives a space's Redis
        keys (its values hash first), as listings are remembered by hash.
        """
        for write in writes:
            if type(write) is not Put:
                break
        else:
            return  # the common commit, puts only: one test a write
        deleted = {names(write.space)[0] for write in writes if type(write) is not Put}
        with self._lock:
            for span in [span for span in self._by_range if span[0] in deleted]:
                del self._by_range[span]
                self._stamps.discard(span)

    def clear(self) -> None:
        """Forget every listing (the store is closed)."""
        with self._lock:
            self._by_range.clear()
            self._stamps.clear()

    def sweep(self, cutoff: float) -> None:
        """Forget the listings noted at ``cutoff`` (``time.monotonic``) or before."""
        with self._lock:
            for span in self._stamps.expired(cutoff):
                self._by_range.pop(span, None)


def tighter_low(low: str, start_after: str) -> str:
    """The lower lex bound of ``low`` and keys after ``start_after``, whichever is tighter."""
    candidate = f"({start_after}"
    if low == "-":
        return candidate
    # "[x" includes x, "(x" excludes it; compare the bare values.
    return candidate if start_after >= low[1:] else low


def tighter_high(high: str, start_after: str) -> str:
    """The upper lex bound of ``high`` and keys before ``start_after``, whichever is tighter."""
    candidate = f"({start_after}"
    if high == "+":
        return candidate
    return candidate if start_after < high[1:] else high
