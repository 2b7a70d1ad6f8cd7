"""Which head each run last got through one tier, so a step can trust the head its handle holds.

A :class:`~tiers.task.RunHandle`'s step (or ``append_checkpoint``) skips reading
the run's head when the head it holds is recent (``head_fresh_ms``) *and* it is
still the last head any write through the same :class:`~tiers.task.TaskTier` gave
the run (the decision: :mod:`tiers.task._steps`). So a cancel, takeover, budget
change or delete made through that tier is seen by the next step at once; only
writers elsewhere (another process or tier) rely on the window and the commit's
check of the head's exact bytes.
"""

from __future__ import annotations

from tiers.errors import InvalidInputError
from tiers.models import Checkpoint

__all__ = ["DEFAULT_HEAD_FRESH_MS", "AlreadyCommittedError", "RecentHeads", "check_head_fresh_ms"]

# A step in a tight loop (store round trips of about a millisecond) starts well inside it; a
# step whose function waits on a model for seconds reads the head first, as with 0.
DEFAULT_HEAD_FRESH_MS = 50.0

# Slots of the table (a power of two). Runs whose ids share a slot push each other out;
# a run not found in its slot is read before its step, so a collision costs one read.
_SLOTS = 4096


class RecentHeads:
    """The head each run last got through one tier's store: a bounded table, no locks.

    Every write of a run's head through the store (a commit, a heartbeat, a
    delete) records it here. A lost entry (two runs sharing a slot) only makes
    a step read the head, as with ``head_fresh_ms=0``.

    A head is kept as its ``hash()``, never its bytes: a head holds the run's
    result and error, which must not outlive the run's deletion by another
    process in this one (invariant 8). A bytes object caches its hash, so the
    handle's test of the head it wrote costs nothing; two heads of one run
    with one hash would only trust a head the commit's check of the exact
    bytes still fences. A deleted run's slot is emptied, its id too.
    """

    def __init__(self) -> None:
        self._slots: list[tuple[str, int] | None] = [None] * _SLOTS

    def wrote(self, run_id: str, head: bytes | None) -> None:
        """Record that ``run_id``'s head is now ``head`` (``None``: the run was deleted)."""
        at = hash(run_id) & (_SLOTS - 1)
        if head is not None:
            self._slots[at] = (run_id, hash(head))
        elif (slot := self._slots[at]) is not None and slot[0] == run_id:
            self._slots[at] = None

    def holds(self, run_id: str, head: bytes) -> bool:
        """Whether ``head`` is the last head written for ``run_id`` through this store."""
        slot = self._slots[hash(run_id) & (_SLOTS - 1)]
        return slot is not None and slot[0] == run_id and slot[1] == hash(head)


def check_head_fresh_ms(value: object) -> float:
    """``value`` as a window in milliseconds (a finite number >= 0), else :class:`InvalidInputError`."""
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise InvalidInputError("head_fresh_ms must be a number >= 0", field="head_fresh_ms")
    window = float(value)
    if not 0 <= window < float("inf"):
        raise InvalidInputError("head_fresh_ms must be a number >= 0", field="head_fresh_ms")
    return window


class AlreadyCommittedError(Exception):
    """Raised out of a step's commit (never out of the tier): its key was committed meanwhile.

    The step decided on a head it trusted; the commit found the run changed and
    the step's idempotency key committed by another user of the lease, so the
    step replays that checkpoint instead.

    Args:
        checkpoint: The checkpoint that committed the key.
    """

    def __init__(self, checkpoint: Checkpoint) -> None:
        super().__init__(checkpoint.idempotency_key)
        self.checkpoint = checkpoint
