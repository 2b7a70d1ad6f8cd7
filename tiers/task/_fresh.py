"""Which head each run last got through one tier, so a step can trust the head its handle holds.

A :class:`~tiers.task.RunHandle`'s step skips reading the run's head when the
head it holds is recent (``head_fresh_ms``) *and* it is still the last head any
write through the same :class:`~tiers.task.TaskTier` gave the run. So a cancel,
takeover, budget change or delete made through that tier is seen by the next
step at once; only writers elsewhere (another process or tier) rely on the
window and the commit's check of the head's exact bytes.
"""

from __future__ import annotations

__all__ = ["RecentHeads"]

# Slots of the table (a power of two). Runs whose ids share a slot push each other out;
# a run not found in its slot is read before its step, so a collision costs one read.
_SLOTS = 4096


class RecentHeads:
    """The head each run last got through one tier's store: a bounded table, no locks.

    Every write of a run's head through the store (a commit, a heartbeat, a
    delete) records it here. A lost entry (two runs sharing a slot) only makes
    a step read the head, as with ``head_fresh_ms=0``.
    """

    def __init__(self) -> None:
        self._slots: list[tuple[str, bytes | None] | None] = [None] * _SLOTS

    def wrote(self, run_id: str, head: bytes | None) -> None:
        """Record that ``run_id``'s head is now ``head`` (``None``: the run was deleted)."""
        self._slots[hash(run_id) & (_SLOTS - 1)] = (run_id, head)

    def holds(self, run_id: str, head: bytes) -> bool:
        """Whether ``head`` is the last head written for ``run_id`` through this store."""
        slot = self._slots[hash(run_id) & (_SLOTS - 1)]
        return slot is not None and slot[0] == run_id and slot[1] == head
