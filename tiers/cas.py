"""Optimistic writes (read, then commit with a check) retried a bounded number of times.

Every tier that read-modify-writes a record loops up to ``ATTEMPTS`` times and
calls :func:`backoff` after each lost compare-and-set: without the wait, a few
threads writing one record collide in lockstep and one of them can lose every
attempt (seen with four threads setting one user fact).
"""

from __future__ import annotations

import random
import time

ATTEMPTS = 16


def backoff(attempt: int) -> None:
    """Jittered exponential wait after lost attempt number ``attempt`` (0-based), at most 50 ms."""
    time.sleep(random.uniform(0, min(0.05, 0.0005 * 2**attempt)))
