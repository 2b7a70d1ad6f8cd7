"""Optimistic writes (read, then commit with a check) retried a bounded number of times.

Every tier that read-modify-writes a record loops up to ``ATTEMPTS`` times and
calls :func:`backoff` after each lost compare-and-set: without the wait, a few
threads writing one record collide in lockstep and one of them can lose every
attempt (seen with four threads setting one user fact). Writers of one record
in one process need not race at all: :class:`Stripes` lets them take turns, so
the compare-and-set retries are left for writers in other processes.
"""

from __future__ import annotations

import random
import threading
import time
import zlib

ATTEMPTS = 16


def backoff(attempt: int) -> None:
    """Jittered exponential wait after lost attempt number ``attempt`` (0-based), at most 50 ms."""
    time.sleep(random.uniform(0, min(0.05, 0.0005 * 2**attempt)))


class Stripes:
    """In-process locks striped by name (a user, a record), a fixed number of them.

    Holding a name's lock around a read-modify-write makes the threads of one
    process that write the same record take turns instead of burning their
    compare-and-set attempts on each other; a loaded machine could otherwise
    starve one of them through every attempt. Two names may share a stripe,
    which only serialises them.
    """

    def __init__(self, count: int = 64) -> None:
        self._locks = [threading.Lock() for _ in range(count)]

    def lock(self, name: str) -> threading.Lock:
        """The lock of ``name``'s stripe."""
        return self._locks[zlib.crc32(name.encode()) % len(self._locks)]
