"""Retention: deleting runs (one on demand, finished ones after their TTL), and compacting event logs."""

from __future__ import annotations

from datetime import datetime

from tiers import cas, keys
from tiers.backends.base import Check, Delete, DeleteSpace, Write
from tiers.errors import (
    ConflictError,
)
from tiers.ids import check_id
from tiers.models import RunInfo
from tiers.task_storage import TierCore
from tiers.task_txn import Txn

__all__ = ["RetentionMixin"]


_DELETE_CHUNK = 1000


class RetentionMixin(TierCore):
    """Retention of :class:`~tiers.task.TaskTier`."""

    def delete_run(self, run_id: str) -> bool:
        """Delete one run whole, whatever its status: head, checkpoints, events, effects, all.

        One atomic commit (the run's space and its head, checked against the
        head's bytes as read, retried if the run changed meanwhile): a reader
        sees the run whole or not at all. Deleting means gone: a handle still
        holding the run's lease (a worker running it, an HTTP caller with its
        epoch) writes nothing more. Every write of a handle is checked against
        the head it holds, so its next step, effect, heartbeat or status change
        raises :class:`~tiers.errors.RunNotFoundError` and cannot recreate the
        run; an effect whose function was running is not recorded. A later
        :meth:`start_run` with the same id starts a new, empty run.

        Returns:
            ``True`` if the run existed and was deleted, ``False`` if there was none.

        Raises:
            InvalidInputError: Bad ``run_id``.
            ConflictError: The run kept changing through every attempt; retry.
        """
        check_id(run_id, "run_id")
        for attempt in range(cas.ATTEMPTS):
            data = self._read_head(run_id)
            if data is None:
                return False
            try:
                self._kv.commit(
                    [DeleteSpace(keys.run_space(self._tenant, run_id)), Delete(self._runs, run_id)],
                    [Check(self._runs, run_id, data)],
                )
            except ConflictError:
                cas.backoff(attempt)
                continue
            return True
        raise ConflictError(f"run {run_id!r} is changing too fast to delete; retry")

    def sweep(self, *, now: datetime | None = None) -> list[str]:
        """Delete finished runs older than the retention period (default 7 days).

        Returns:
            The ids of the deleted runs.
        """
        at = self._now() if now is None else now
        cutoff = at - self.retention
        deleted: list[str] = []
        for key, data in self._kv.scan(self._runs):
            info = self._decode_head(key, data)
            ended = info.finished_at or info.updated_at
            if not info.status.finished or ended > cutoff:
                continue
            try:
                self._kv.commit(
                    [DeleteSpace(keys.run_space(self._tenant, key)), Delete(self._runs, key)],
                    [Check(self._runs, key, data)],
                )
            except ConflictError:
                continue
            deleted.append(key)
        return deleted

    def compact(self, run_id: str) -> int:
        """Drop the events already folded into the run's latest snapshot.

        The state stays loadable (snapshot + tail) and :meth:`rebuild` still
        works; the audit trail before the snapshot is gone. Checkpoints,
        snapshots and the effect ledger are kept.

        Returns:
            How many events were deleted.
        """
        info = self.get_run(run_id)
        through = info.snapshot_event_seq
        if through <= info.compacted_through:
            return 0
        space = keys.run_space(self._tenant, run_id)
        deleted = 0
        first = info.compacted_through + 1
        for start in range(first, through + 1, _DELETE_CHUNK):
            end = min(start + _DELETE_CHUNK - 1, through)
            writes: list[Write] = [Delete(space, keys.event_key(s)) for s in range(start, end + 1)]

            def build(
                current: RunInfo, now: datetime, end: int = end, writes: list[Write] = writes
            ) -> Txn | RunInfo:
                txn = Txn(run_id, current.lease_epoch, current, now)
                txn.puts += writes
                txn.update["compacted_through"] = max(current.compacted_through, end)
                return txn

            self._operate(run_id, build, "compact")
            deleted += end - start + 1
        return deleted
