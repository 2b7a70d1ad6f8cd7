"""Retention: deleting runs (one on demand, finished or idle ones after their TTL), and compacting event logs."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import datetime, timedelta

from tiers import cas, keys
from tiers.backends.base import Check, Delete, DeleteSpace, Write
from tiers.errors import ConflictError, CorruptRecordError, InvalidInputError
from tiers.ids import check_id
from tiers.models import RunInfo
from tiers.task._store import RunStore
from tiers.task._txn import Txn

__all__ = ["Retention"]


_DELETE_CHUNK = 1000
_SWEEP_PAGE = 256  # run heads read per page by a sweep

logger = logging.getLogger(__name__)


class Retention:
    """Deleting a tier's runs (on demand or after their TTL) and compacting their event logs."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

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
            data = self.store.read_head(run_id)
            if data is None:
                return False
            try:
                self.store.kv.commit(
                    [
                        DeleteSpace(keys.run_space(self.store.tenant, run_id)),
                        Delete(self.store.runs, run_id),
                    ],
                    [Check(self.store.runs, run_id, data)],
                )
            except ConflictError:
                cas.backoff(attempt)
                continue
            self.store.recent_heads.wrote(run_id, None)
            return True
        raise ConflictError(f"run {run_id!r} is changing too fast to delete; retry")

    def sweep(self, *, now: datetime | None = None) -> list[str]:
        """Delete finished runs older than the retention period (default 7 days).

        Runs are read a page at a time; each is deleted whole in one commit
        checked against its head as read (a run changed meanwhile is left for
        the next sweep).

        Returns:
            The ids of the deleted runs.
        """
        at = self.store.clock() if now is None else now
        cutoff = at - self.store.retention

        def expired(info: RunInfo) -> bool:
            ended = info.finished_at or info.updated_at
            return info.status.finished and ended <= cutoff

        return self._sweep_where(expired)

    def sweep_idle(self, idle: timedelta, *, now: datetime | None = None) -> list[str]:
        """Delete runs never finished and idle for longer than ``idle``, with everything in them.

        A run is idle when nothing touched it (no step, event, heartbeat or
        operator change: its ``updated_at``) for longer than ``idle`` and no
        worker holds a live lease on it (a lease with a TTL, not yet expired):
        a worker that still holds its lease is never swept from under it. A
        run paused at an approval gate or blocked on an effect is idle too
        once nobody touched it for that long. Deleted like :meth:`delete_run`;
        a run touched meanwhile is left alone.

        Args:
            idle: How long an unfinished run may stay untouched.
            now: The time to measure from (default: the tier's clock).

        Returns:
            The ids of the deleted runs.

        Raises:
            InvalidInputError: ``idle`` is not a positive timedelta.
        """
        if not isinstance(idle, timedelta) or idle <= timedelta(0):
            raise InvalidInputError("idle must be a timedelta > 0", field="idle")
        at = self.store.clock() if now is None else now
        cutoff = at - idle

        def expired(info: RunInfo) -> bool:
            return (
                not info.status.finished and info.updated_at <= cutoff and not info.lease_live(at)
            )

        return self._sweep_where(expired)

    def _sweep_where(self, expired: Callable[[RunInfo], bool]) -> list[str]:
        """Delete every run whose head satisfies ``expired``, reading heads a page at a time."""
        deleted: list[str] = []
        after: str | None = None
        while True:
            page = self.store.kv.scan(self.store.runs, start_after=after, limit=_SWEEP_PAGE)
            for key, data in page:
                try:
                    info = self.store.decode_head(key, data)
                except CorruptRecordError as exc:
                    logger.error("sweep skips an unreadable run head: %s", exc)
                    continue
                if not expired(info):
                    continue
                try:
                    self.store.kv.commit(
                        [
                            DeleteSpace(keys.run_space(self.store.tenant, key)),
                            Delete(self.store.runs, key),
                        ],
                        [Check(self.store.runs, key, data)],
                    )
                except ConflictError:
                    continue
                deleted.append(key)
            if len(page) < _SWEEP_PAGE:
                self.store.observer.swept(len(deleted))
                return deleted
            after = page[-1][0]

    def compact(self, run_id: str) -> int:
        """Drop the events already folded into the run's latest snapshot.

        The state stays loadable (snapshot + tail) and :meth:`rebuild` still
        works; the audit trail before the snapshot is gone. Checkpoints,
        snapshots and the effect ledger are kept.

        Returns:
            How many events were deleted.
        """
        info = self.store.get_run(run_id)
        through = info.snapshot_event_seq
        if through <= info.compacted_through:
            return 0
        space = keys.run_space(self.store.tenant, run_id)
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
                txn.update.compacted_through = max(current.compacted_through, end)
                return txn

            self.store.operate(run_id, build, "compact")
            deleted += end - start + 1
        return deleted
