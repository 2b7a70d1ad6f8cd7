"""Flushing and closing what a :class:`~memory.Memory` and its tenant views hold."""

from __future__ import annotations

import time
from collections.abc import Sequence
from typing import Protocol

from tiers.backends.base import KVStore, VectorIndex
from tiers.backends.dirlock import DataDirLock
from tiers.session import SessionTier

__all__ = ["close_stores", "flush_sessions"]


class HoldsSessions(Protocol):
    """A memory or tenant view: what flushing and closing need of it."""

    @property
    def sessions(self) -> SessionTier:
        """The view's session tier."""
        ...


def flush_sessions(views: Sequence[HoldsSessions], timeout: float | None) -> bool:
    """Wait until the index holds every session saved so far in each view, within ``timeout``."""
    deadline = None if timeout is None else time.monotonic() + timeout
    for view in views:
        left = None if deadline is None else max(0.0, deadline - time.monotonic())
        if not view.sessions.flush(left):
            return False
    return True


def close_stores(
    views: Sequence[HoldsSessions], index: VectorIndex, kv: KVStore, lock: DataDirLock | None
) -> None:
    """Finish each view's queued index work, close the stores, release the data dir."""
    try:
        for view in views:
            view.sessions.close()
        index.close()
        kv.close()
    finally:
        if lock is not None:
            lock.release()
