"""The transcript-windows pass gives way to queries (issue 19 item 2).

The second index pass (:mod:`tiers.session._index`) embeds up to
``TRANSCRIPT_WINDOWS`` more texts per session (~0.5 CPU s for a LongMemEval-sized
one). Nobody waits for it, yet it runs in the process that answers recall and
continuation queries, on the same cores (and under the same GIL for
tokenising and the index's writes). So it gives way to them:

- **Queries first.** Every recall (and so every continuation context) runs
  inside :meth:`QueryGate.query` of the process-wide :data:`QUERIES`. The pass
  makes no model call while a query of any tenant is in flight (the cores are
  the process's), nor within :data:`QUERY_QUIET` of one ending (a client's next
  query tends to follow at once). Held back for :data:`HOLD_MAX`, it waives the
  quiet time and takes the next moment with no query in flight, so a steady
  stream of one-at-a-time queries does not starve it; only queries that
  overlap without a gap hold it longer, and then the cores are busy with
  queries anyway.
- **Small steps.** It embeds at most :data:`WINDOW_CHUNK` windows per model call
  and asks the gate before each (first-pass work, which makes new sessions
  searchable, goes first too): a query arriving meanwhile shares the cores
  with at most one such call, about 60 ms of one core for a window of 120
  words (int8 MiniLM, 256 word pieces at most; ``bench/README.md``).
- **One core.** Those calls go to the embedder's background lane, one
  onnxruntime thread where the embedder has one
  (:meth:`~tiers.backends.embedders.MiniLMEmbedder.for_background`), so a
  query's own embedding (two threads) finds the other core free.

The pass embeds before it takes the indexer's sync lock, into the indexer's
embed cache; its locked part then finds every vector cached and only writes,
exactly as before. So correctness did not move, and the gate is never waited
at with the lock held: a recall settling its own user's queued work never
waits for a held-back window pass.
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from typing import Protocol, runtime_checkable

from tiers.backends.base import Embedder

__all__ = [
    "HOLD_MAX",
    "QUERIES",
    "QUERY_QUIET",
    "WINDOW_CHUNK",
    "QueryGate",
    "WindowPacer",
    "background_lane",
]

# Windows per model call of the second pass at most: what a query arriving mid-pass shares
# the cores with. One call costs ~2.5 ms plus ~55 ms per 120-word window on one thread, so
# small calls lose little, and texts within a call are padded to its longest.
WINDOW_CHUNK = 2
# After a query ends, the pass waits this long for the next one before its next call.
QUERY_QUIET = 0.02
# Held back this long, the pass no longer waits out QUERY_QUIET (only queries in flight).
HOLD_MAX = 2.0


@runtime_checkable
class _HasBackgroundLane(Protocol):
    """An embedder that can run work nobody waits for on fewer threads."""

    def for_background(self) -> Embedder:
        """The embedder to use for background work."""
        ...


def background_lane(embedder: Embedder) -> Embedder:
    """Where background embedding goes: the embedder's one-thread lane if it has one, else itself."""
    if isinstance(embedder, _HasBackgroundLane):
        return embedder.for_background()
    return embedder


class QueryGate:
    """Counts the queries in flight in a process, for background work to give way to. Thread-safe."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._in_flight = 0
        self._last_end = -math.inf

    @contextmanager
    def query(self) -> Iterator[None]:
        """Mark a query in flight for the duration of the ``with`` block."""
        with self._lock:
            self._in_flight += 1
        try:
            yield
        finally:
            with self._lock:
                self._in_flight -= 1
                self._last_end = time.monotonic()

    @property
    def in_flight(self) -> int:
        """Queries in flight now."""
        with self._lock:
            return self._in_flight

    def hold(self, held_for: float) -> float:
        """Seconds background work should still wait for queries; 0: go now.

        Args:
            held_for: How long the caller has been held back already.

        Returns:
            With a query in flight, :data:`QUERY_QUIET` (look again then: a
            query's end wakes nobody); else what is left of the quiet time
            after the last query (none once held back :data:`HOLD_MAX`).
        """
        with self._lock:
            if self._in_flight:
                return QUERY_QUIET
            if held_for >= HOLD_MAX:
                return 0.0
            return max(0.0, self._last_end + QUERY_QUIET - time.monotonic())


QUERIES = QueryGate()
"""The process's queries: one gate for every tenant, as the cores are the process's."""


class WindowPacer:
    """Decides when one indexer's second pass makes its next model call.

    Not thread-safe: used under its indexer's condition.

    Args:
        gate: The queries it gives way to.

    Attributes:
        holds: How many times queries held the pass back (each hold counted once).
    """

    def __init__(self, gate: QueryGate = QUERIES) -> None:
        self._gate = gate
        self._held_since: float | None = None
        self.holds = 0

    def run(
        self,
        texts: list[str],
        embed: Callable[[list[str]], object],
        cond: threading.Condition,
        *,
        give_way: Callable[[], bool],
    ) -> bool:
        """Embed ``texts`` :data:`WINDOW_CHUNK` at a time, each call when the queries let it.

        Args:
            texts: The texts.
            embed: Embeds some of them.
            cond: The caller's condition: waited on between calls, notified
                when there is other work.
            give_way: Called with ``cond`` held before each call: True stops.

        Returns:
            Whether every text was embedded (False: it gave way).
        """
        for start in range(0, len(texts), WINDOW_CHUNK):
            with cond:
                while True:
                    if give_way():
                        return False
                    wait = self.wait()
                    if wait <= 0:
                        break
                    cond.wait(wait)
            embed(texts[start : start + WINDOW_CHUNK])
        return True

    def wait(self) -> float:
        """Seconds to wait before the next call; 0: make it now (a hold ends)."""
        now = time.monotonic()
        held_for = 0.0 if self._held_since is None else now - self._held_since
        wait = self._gate.hold(held_for)
        if wait <= 0:
            self._held_since = None
        elif self._held_since is None:
            self._held_since = now
            self.holds += 1
        return wait
