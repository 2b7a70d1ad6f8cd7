"""A time bound on what the process's caches keep: every entry goes within the max age.

A delete made by another process (another API worker, a ``tiermem worker``, a
CLI) cannot reach this process's caches: they drop a deleted user's data when
they next read that user, or as their least recently used, so without a bound
a copy could stay for as long as nothing reads it (invariant 8, deleting means
gone). Each cache that can hold user data or data derived from it (texts,
vectors, term counts, fact records, key names and ids) registers with
:data:`SWEEPER` and stamps an entry with the time it stored it (:class:`Stamps`:
one clock read and one dict store per store, nothing per hit). One daemon
thread per process sweeps them every quarter of the max age and drops what the
next sweep would find older than it, so no entry is kept longer, read or not
(an ``lru_cache`` memo, whose entries have no time, is cleared whole:
:class:`ClearedMemo`). The sweep never runs on a caller's path.

The max age is process-wide: the smallest an open ``Memory`` asked for
(:meth:`Sweeper.hold`, ``cache_max_age_seconds``). The thread runs while one
is held, ends when the last is released, and is started again in a child of
``fork`` (the parent's does not run there; a fork waits for a pass under way,
which holds caches' locks the child would find held for good). A max age of 0
keeps nothing across calls where a cache can do without
(:attr:`Sweeper.keeping` is false: it does not store), and sweeps the rest (the
memos) every :data:`MIN_PERIOD_SECONDS`.
"""

from __future__ import annotations

import itertools
import logging
import os
import threading
import time
import weakref
from collections.abc import Callable, Hashable
from typing import Final, Generic, Protocol, TypeVar

__all__ = ["DEFAULT_MAX_AGE_SECONDS", "SWEEPER", "ClearedMemo", "Stamps", "Sweeper"]

DEFAULT_MAX_AGE_SECONDS: Final = 300.0
# Sweeps never come closer than this (a max age of 0 sweeps everything this often).
MIN_PERIOD_SECONDS: Final = 0.05

logger = logging.getLogger(__name__)

K = TypeVar("K", bound=Hashable)


class Stamps(Generic[K]):
    """When each key of one cache was stored, oldest first. Guarded by the cache's lock."""

    __slots__ = ("_born",)

    def __init__(self) -> None:
        self._born: dict[K, float] = {}

    def stamp(self, key: K) -> None:
        """``key`` was stored now (again: it moves to the back)."""
        born = self._born
        born.pop(key, None)
        born[key] = time.monotonic()

    def discard(self, key: K) -> None:
        """``key`` left the cache."""
        self._born.pop(key, None)

    def clear(self) -> None:
        """Every key left the cache."""
        self._born.clear()

    def expired(self, cutoff: float) -> list[K]:
        """The keys stored at ``cutoff`` or before, forgotten here: the cache drops them."""
        out: list[K] = []
        for key, born in self._born.items():
            if born > cutoff:
                break
            out.append(key)
        for key in out:
            del self._born[key]
        return out

    def __len__(self) -> int:
        return len(self._born)


class Swept(Protocol):
    """A cache the sweeper reaches."""

    def sweep(self, cutoff: float) -> None:
        """Drop every entry stored at ``cutoff`` (``time.monotonic``) or before."""


class ClearedMemo:
    """An ``lru_cache`` memo (its ``cache_clear``) cleared whole once its oldest entry may be due."""

    def __init__(self, clear: Callable[[], None]) -> None:
        self._clear = clear
        self._since = time.monotonic()

    def sweep(self, cutoff: float) -> None:
        if self._since <= cutoff:
            self._since = time.monotonic()
            self._clear()


class Sweeper:
    """The caches of the process, and the one thread that drops their entries past the max age."""

    def __init__(self) -> None:
        self._caches: weakref.WeakSet[Swept] = weakref.WeakSet()
        self._holds: dict[int, float] = {}
        self._ids = itertools.count()
        # Read without the lock by a cache about to store: false while a max age of 0 is held.
        self.keeping = True
        self._fresh_state()

    def _fresh_state(self) -> None:
        self._cond = threading.Condition(threading.Lock())
        # Held for a whole pass, and by fork (see _before_fork); taken before the condition.
        self._sweeping = threading.Lock()
        self._thread: threading.Thread | None = None

    def track(self, cache: Swept) -> None:
        """Sweep ``cache`` from now on (kept weakly: a cache dropped elsewhere leaves)."""
        with self._cond:
            self._caches.add(cache)

    def hold(self, max_age: float) -> Callable[[], None]:
        """Keep sweeping with at most ``max_age`` seconds; returns the release (idempotent)."""
        if not max_age >= 0:
            raise ValueError(f"max_age must be >= 0 seconds, got {max_age!r}")
        hold_id = next(self._ids)
        with self._cond:
            self._holds[hold_id] = max_age
            self.keeping = min(self._holds.values()) > 0
            self._cond.notify_all()  # a smaller max age: sweep sooner
            if self._thread is None:
                self._start()
        return lambda: self._release(hold_id)

    @property
    def max_age(self) -> float | None:
        """The max age in force, or ``None`` (no hold: nothing is swept)."""
        with self._cond:
            return min(self._holds.values(), default=None)

    def sweep(self, max_age: float) -> None:
        """One pass: drop from every cache what the next pass would find older than ``max_age``."""
        cutoff = time.monotonic() - max(0.0, max_age - _period(max_age))
        with self._sweeping:
            with self._cond:
                caches = list(self._caches)
            for cache in caches:
                try:
                    cache.sweep(cutoff)
                except Exception:  # one broken cache must not end the sweep of the others
                    logger.exception("sweeping %r failed", cache)

    def _release(self, hold_id: int) -> None:
        with self._cond:
            if self._holds.pop(hold_id, None) is not None:
                self.keeping = min(self._holds.values(), default=1.0) > 0
                self._cond.notify_all()

    def _start(self) -> None:
        """Start the thread (the caller holds the lock)."""
        self._thread = threading.Thread(target=self._run, name="tiermem-cache-sweeper", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            with self._cond:
                max_age = min(self._holds.values(), default=None)
                if max_age is None:
                    self._thread = None
                    return
                deadline = time.monotonic() + _period(max_age)
                while (left := deadline - time.monotonic()) > 0 and self._holds:
                    # A longer wait raises (OverflowError): a max age of years would end the thread.
                    self._cond.wait(min(left, threading.TIMEOUT_MAX))
                    shorter = min(self._holds.values(), default=max_age)
                    if shorter < max_age:  # a new hold wants a shorter age: start over
                        max_age = shorter
                        deadline = min(deadline, time.monotonic() + _period(max_age))
                if not self._holds:
                    continue
                max_age = min(self._holds.values())  # a release may have made it longer
            self.sweep(max_age)

    def _before_fork(self) -> None:
        # A pass holds caches' locks: a child forked meanwhile would find them held for good.
        self._sweeping.acquire()
        self._cond.acquire()

    def _after_fork_in_parent(self) -> None:
        self._cond.release()
        self._sweeping.release()

    def _after_fork_in_child(self) -> None:
        # The parent's thread and lock state did not come along: a new lock, a new thread.
        self._fresh_state()
        if self._holds:
            with self._cond:
                self._start()


def _period(max_age: float) -> float:
    return max(max_age / 4, MIN_PERIOD_SECONDS)


SWEEPER = Sweeper()
"""The process's sweeper: caches :meth:`~Sweeper.track` themselves with it."""

os.register_at_fork(
    before=SWEEPER._before_fork,
    after_in_parent=SWEEPER._after_fork_in_parent,
    after_in_child=SWEEPER._after_fork_in_child,
)
