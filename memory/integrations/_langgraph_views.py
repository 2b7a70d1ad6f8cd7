"""What a :class:`~memory.integrations.langgraph.TiermemSaver` told readers about each
thread namespace's head: how a put from a stale view (a fork) is told from a deliberate branch.
No I/O.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable
from typing import Any

from tiers.errors import ThreadConflictError

# Thread namespaces this saver keeps writer views for (least recently used go first).
_MAX_TRACKED = 10_000


class _Lru(OrderedDict[Any, Any]):
    """A dict that forgets its least recently remembered keys past :data:`_MAX_TRACKED`."""

    def remember(self, key: Any, value: Any) -> None:
        self[key] = value
        self.move_to_end(key)
        if len(self) > _MAX_TRACKED:
            self.popitem(last=False)


class WriterViews:
    """The checkpoints readers were told were newest, and those they addressed by id.

    Args:
        lock: The saver's lock, which guards these views with the saver's list cache.
    """

    def __init__(self, lock: threading.Lock) -> None:
        self._lock = lock
        # (thread, ns, checkpoint id | None) this saver told a reader was the newest, or wrote.
        self._believed = _Lru()
        # (thread, ns, checkpoint id) a reader addressed by id: a child of it is a deliberate branch.
        self._addressed = _Lru()

    def read_latest(self, thread_id: str, ns: str, checkpoint_id: str | None) -> None:
        """A reader was told ``checkpoint_id`` (``None``: nothing) is the namespace's newest."""
        with self._lock:
            self._believed.remember((thread_id, ns, checkpoint_id), None)

    def read_by_id(self, thread_id: str, ns: str, checkpoint_id: str) -> None:
        """A reader addressed ``checkpoint_id`` by id (time travel)."""
        with self._lock:
            self._addressed.remember((thread_id, ns, checkpoint_id), None)

    def wrote(self, thread_id: str, ns: str, checkpoint_id: str, parent: str | None) -> None:
        """This saver wrote ``checkpoint_id`` as a child of ``parent`` (the caller holds the lock)."""
        self._believed.remember((thread_id, ns, checkpoint_id), None)
        self._addressed.pop((thread_id, ns, parent), None)

    def check_branch(
        self, thread_id: str, ns: str, parent: str | None, head_id: str | None
    ) -> None:
        """Refuse a write that would fork the thread because its writer's view is stale."""
        if parent == head_id:
            return
        with self._lock:
            if parent is not None and (thread_id, ns, parent) in self._addressed:
                return  # time travel: the reader addressed this checkpoint to branch from it
            stale = (thread_id, ns, parent) in self._believed
        if stale:
            raise ThreadConflictError(
                f"thread {thread_id!r} (namespace {ns!r}) moved on: this invocation built on "
                f"checkpoint {parent!r} but another writer has since appended {head_id!r}. "
                "Nothing was written. Re-invoke to continue from the newest checkpoint, or pass "
                "that checkpoint_id in the config to branch from it on purpose",
                thread_id=thread_id,
                checkpoint_ns=ns,
                parent_id=parent,
                head_id=head_id,
            )

    def forget(self, match: Callable[[tuple[str, ...]], bool]) -> None:
        """Drop the views whose (thread, ns, checkpoint id) ``match`` (the caller holds the lock)."""
        for cache in (self._believed, self._addressed):
            for key in [k for k in cache if match(k)]:
                del cache[key]
