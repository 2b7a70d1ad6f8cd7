"""Read-only views of runs: checkpoints, events, the effect ledger, listings, and the log's fold."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from functools import partial

from pydantic import JsonValue

from tiers import keys
from tiers.codec import decode
from tiers.errors import (
    CorruptRecordError,
    EffectNotFoundError,
    InvalidInputError,
)
from tiers.ids import check_id
from tiers.models import Checkpoint, RunInfo, RunStatus
from tiers.task import _lifecycle as lifecycle
from tiers.task._checkpoint_decode import decode_run_checkpoints
from tiers.task._lifecycle import INITIAL
from tiers.task._records import (
    EffectRecord,
    EffectStatus,
    Event,
    EventKind,
    Snapshot,
    check_key,
)
from tiers.task._store import RunStore

__all__ = ["Queries", "RebuiltRun"]

# Run heads read per scan of a paged run list (decoded only up to the page's last run).
_RUN_CHUNK = 256
# Ledger records read per scan when counting them (read, never decoded).
_EFFECT_CHUNK = 1024
# The first seq a checkpoint key cannot hold in order (keys pad seqs to SEQ_WIDTH digits).
_NO_SEQ_FROM = 10**keys.SEQ_WIDTH


@dataclass(frozen=True)
class RebuiltRun:
    """A run's state folded from its latest snapshot and the event log's tail (:meth:`TaskTier.rebuild`)."""

    status: RunStatus
    head_seq: int
    head_checkpoint_id: str | None
    event_seq: int
    spent_tokens: int
    spent_cost: float
    pending_plan_hash: str | None
    values: dict[str, JsonValue]
    events_read: int
    unknown_effects: list[str] = field(default_factory=list)


class Queries:
    """Read-only views of a tier's runs (what :class:`~tiers.task.TaskTier` answers)."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    def latest_checkpoint(self, run_id: str) -> Checkpoint | None:
        """The run's head checkpoint, or ``None`` if it has none yet.

        One read: the head checkpoint is the run's last (every commit that
        writes a checkpoint makes it the head, and a run's checkpoints are
        deleted with its head, atomically); the head is read only when the run
        has no checkpoint, to tell an empty run from a missing one.

        Raises:
            RunNotFoundError: No such run.
        """
        check_id(run_id, "run_id")
        space = keys.run_space(self.store.tenant, run_id)
        found = self.store.kv.scan(space, prefix=keys.CHECKPOINT_PREFIX, reverse=True, limit=1)
        if found:
            return self._decode(run_id, found)[0]
        info = self.store.get_run(run_id)
        if info.head_seq == 0:
            return None
        raise CorruptRecordError(
            f"run {run_id!r} has head_seq {info.head_seq} but no checkpoint at "
            f"{space}/{keys.checkpoint_key(info.head_seq)}"
        )

    def history(
        self,
        run_id: str,
        *,
        limit: int | None = None,
        after_seq: int | None = None,
        before_seq: int | None = None,
        newest_first: bool = False,
    ) -> list[Checkpoint]:
        """A page of a run's checkpoints (every branch; see ``RunInfo.superseded``).

        Checkpoint seqs are gap-free (1..``head_seq``), so a page is one range
        scan of the store, newest first or oldest first: its cost is the page's
        size, not the run's. Page with the last checkpoint's seq as the cursor:
        ``after_seq=page[-1].seq`` oldest first, ``before_seq=page[-1].seq``
        newest first.

        Args:
            run_id: The run.
            limit: At most this many (``None``: all in range).
            after_seq: Only checkpoints with a larger seq.
            before_seq: Only checkpoints with a smaller seq.
            newest_first: Descending seq order (the latest ``limit`` checkpoints).

        Raises:
            RunNotFoundError: No such run.
            InvalidInputError: Negative ``limit``, ``after_seq`` or ``before_seq``.
        """
        _check_paging(limit, after_seq, before_seq)
        check_id(run_id, "run_id")
        low = after_seq or 0
        if before_seq is not None and before_seq >= _NO_SEQ_FROM:
            before_seq = None  # past every seq a key can hold: no bound
        if newest_first and low and before_seq is None:
            # Only the head bounds this page (the latest ``limit`` after ``low``).
            before_seq = self.store.get_run(run_id).head_seq + 1
        # The run's checkpoints are seqs 1..head_seq, gap-free, the last one the head: the
        # bounds make the page without the head, in one range read of at most ``count`` rows.
        count = None if before_seq is None else before_seq - low - 1
        if limit is not None:
            count = limit if count is None else min(count, limit)
        items: list[tuple[str, bytes]] = []
        if count is None or count > 0:
            space = keys.run_space(self.store.tenant, run_id)
            if newest_first:
                start = None if before_seq is None else keys.checkpoint_key(before_seq)
            else:
                start = keys.checkpoint_key(low) if low else None
            items = self.store.kv.scan(
                space,
                prefix=keys.CHECKPOINT_PREFIX,
                start_after=start,
                limit=count,
                reverse=newest_first,
            )
            if newest_first and low:
                # before_seq may lie past the head: the rows then run on below after_seq.
                floor = keys.checkpoint_key(low)
                items = [item for item in items if item[0] > floor]
        if not items:
            self.store.get_run(run_id)  # an empty page, but never one of a missing run
            return []
        return self._decode(run_id, items)

    def _decode(self, run_id: str, items: list[tuple[str, bytes]]) -> list[Checkpoint]:
        """The run's stored checkpoints ``items`` (key, bytes) as records, in their order.

        Our own records take :func:`decode_run_checkpoints` (one orjson parse,
        no pydantic); anything else (an older release's record, a corrupt or
        misplaced one, one that may hold an int over 64 bits) the exact
        decode, which returns the same record or raises as before.
        """
        return decode_run_checkpoints(run_id, items, partial(self.store.decode_checkpoint, run_id))

    def checkpoint_for_key(self, run_id: str, idempotency_key: str) -> Checkpoint | None:
        """The checkpoint on the run's current branch that committed an idempotency key.

        What a replay of the step with that key would return: point reads of
        the head, the key's index entry and its checkpoint. A key committed only
        on a branch a state edit superseded gives ``None`` (the step runs again).

        Returns:
            The checkpoint, or ``None`` if no step on the current branch committed the key.

        Raises:
            RunNotFoundError: No such run.
            InvalidInputError: Bad ``idempotency_key`` (1-512 characters, no control characters).
        """
        key = check_key(idempotency_key)
        info = self.store.get_run(run_id)
        ckpt, _ = self.store.lookup(run_id, key, info)
        return ckpt

    def events(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """The run's event log in seq order (from ``compacted_through + 1`` after a compaction).

        Raises:
            RunNotFoundError: No such run.
            InvalidInputError: Negative ``limit`` or ``after_seq``.
        """
        _check_paging(limit, after_seq)
        info = self.store.get_run(run_id)
        if limit == 0:
            return []
        space = keys.run_space(self.store.tenant, run_id)
        start = keys.event_key(after_seq) if after_seq else None
        items = self.store.kv.scan(space, prefix=keys.EVENT_PREFIX, start_after=start, limit=limit)
        rows = [decode(Event, data, where=f"{space}/{key}") for key, data in items]
        # The seqs without a row up to the last one this page can hold are StepCommitted
        # events that layout-2 checkpoints hold (tiers.task._format): none in a layout-1 run.
        full = limit is not None and len(rows) == limit
        through = rows[-1].seq if full else max(info.event_seq, rows[-1].seq if rows else 0)
        first = max(after_seq or 0, info.compacted_through) + 1
        stored = {event.seq for event in rows}
        missing = [seq for seq in range(first, through + 1) if seq not in stored]
        if not missing:
            return rows
        if limit is not None:
            missing = missing[:limit]
        events = sorted(
            [*rows, *self.store.inline_events(run_id, info, missing)], key=lambda e: e.seq
        )
        return events if limit is None else events[:limit]

    def effects(
        self, run_id: str, *, after_key: str | None = None, limit: int | None = None
    ) -> list[EffectRecord]:
        """The run's effect ledger in idempotency-key order, whole or one page.

        Args:
            run_id: The run.
            after_key: Only effects whose key sorts after this one (the next page
                starts after the last key of the previous one).
            limit: At most this many (``None``: every one).

        Raises:
            RunNotFoundError: No such run.
            InvalidInputError: Negative ``limit``.
        """
        if limit is not None and limit < 0:
            raise InvalidInputError(f"limit must be >= 0, got {limit}", field="limit")
        self.store.get_run(run_id)
        if limit == 0:
            return []
        return self.store.effect_records(run_id, after_key=after_key, limit=limit)

    def count_effects(self, run_id: str, *, after_key: str | None = None) -> int:
        """How many effects the run's ledger holds (only those whose key sorts after ``after_key``).

        Counts the stored records without decoding them: what a pager of
        :meth:`effects` shows beside a page (its total, and where the page starts).

        Raises:
            RunNotFoundError: No such run.
        """
        self.store.get_run(run_id)
        space = keys.run_space(self.store.tenant, run_id)
        start = None if after_key is None else keys.effect_key(after_key)
        count = 0
        while True:
            chunk = self.store.kv.scan(
                space, prefix=keys.EFFECT_PREFIX, start_after=start, limit=_EFFECT_CHUNK
            )
            count += len(chunk)
            if len(chunk) < _EFFECT_CHUNK:
                return count
            start = chunk[-1][0]

    def get_effect(self, run_id: str, key: str) -> EffectRecord:
        """One entry of the run's effect ledger, by idempotency key.

        Raises:
            RunNotFoundError: No such run.
            EffectNotFoundError: The run has no effect with that key.
        """
        self.store.get_run(run_id)
        rec, _ = self.store.read_effect(run_id, check_key(key))
        if rec is None:
            raise EffectNotFoundError(f"run {run_id!r} has no effect with key {key!r}")
        return rec

    def unknown_effects(self, run_id: str) -> list[EffectRecord]:
        """Effects invoked but never recorded: what blocks the run until reconciled."""
        return [r for r in self.effects(run_id) if r.status is EffectStatus.INVOKED]

    def list_runs(
        self,
        user_id: str | None = None,
        status: RunStatus | str | None = None,
        *,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[RunInfo]:
        """Runs of this tenant, optionally only one user's or one status; whole or one page.

        Whole (neither ``limit`` nor ``after``): every run, oldest first, which
        reads every run of the tenant. Paged: in run-id order (the store's key
        order; generated run ids sort by their creation time), from the run
        after ``after``; a page reads the heads up to its last run, not the
        tenant's. A page shorter than ``limit`` is the last one; the next page
        starts ``after=page[-1].run_id`` (that run may have been deleted since).

        Args:
            user_id: Only this user's runs.
            status: Only runs in this status.
            limit: At most this many (``None``: every one after ``after``).
            after: Only runs whose id sorts after this one (a run id).

        Raises:
            InvalidInputError: Bad ``user_id``, ``after`` or ``limit``, or an unknown ``status``.
        """
        if user_id is not None:
            check_id(user_id, "user_id")
        wanted = _run_status(status)

        def matches(run: RunInfo) -> bool:
            return (user_id is None or run.user_id == user_id) and (
                wanted is None or run.status is wanted
            )

        if limit is None and after is None:
            runs = [
                decode(RunInfo, data, where=f"{self.store.runs}/{key}")
                for key, data in self.store.kv.scan(self.store.runs)
            ]
            runs = [r for r in runs if matches(r)]
            runs.sort(key=lambda r: (r.created_at, r.run_id))
            return runs
        return self._page(matches, limit, after)

    def list_resumable(
        self, *, now: datetime | None = None, limit: int | None = None, after: str | None = None
    ) -> list[RunInfo]:
        """Runs a worker pool should pick up: not finished, not paused, not blocked, no live lease.

        That is runs released by their worker, runs whose lease expired (the
        worker died or stopped heartbeating), and runs whose lease has no TTL.
        Oldest last checkpoint first, or, paged (``limit`` or ``after``), in
        run-id order a page at a time, as :meth:`list_runs` pages. Take one
        with :meth:`acquire`.

        A run *blocked* on an effect of unknown outcome (``RunInfo.unknown_effects``
        is not empty: a worker found it invoked but never recorded and could not
        settle it) is left out: resuming it would only hit the same effect again.
        It keeps its status (``running`` or ``resumable``); :meth:`list_runs`
        shows it, and it comes back here once :meth:`resolve_effect` settles
        every such effect. A run whose worker died inside an effect is listed
        until a worker finds that out: one with a ``reconcile`` callback may
        settle it on its own.

        Raises:
            InvalidInputError: Bad ``after`` or ``limit``.
        """
        at = self.store.clock() if now is None else now

        def resumable(run: RunInfo) -> bool:
            return (
                not run.status.finished
                and run.status is not RunStatus.PAUSED
                and not run.blocked
                and not run.lease_live(at)
            )

        if limit is not None or after is not None:
            return self._page(resumable, limit, after)
        runs = [r for r in self.list_runs() if resumable(r)]
        runs.sort(key=lambda r: (r.last_checkpoint_at or r.created_at, r.run_id))
        return runs

    def _page(
        self, matches: Callable[[RunInfo], bool], limit: int | None, after: str | None
    ) -> list[RunInfo]:
        """The runs ``matches`` keeps, in run-id order after ``after``, at most ``limit``.

        The heads are read a chunk at a time and decoded one at a time, so a
        page decodes the heads up to its last run, not the chunk's.
        """
        _check_paging(limit, None)
        if after is not None:
            check_id(after, "after")
        page: list[RunInfo] = []
        while limit is None or len(page) < limit:
            chunk = self.store.kv.scan(self.store.runs, start_after=after, limit=_RUN_CHUNK)
            for key, data in chunk:
                run = decode(RunInfo, data, where=f"{self.store.runs}/{key}")
                if matches(run):
                    page.append(run)
                    if len(page) == limit:
                        return page
            if len(chunk) < _RUN_CHUNK:
                break
            after = chunk[-1][0]
        return page

    def rebuild(self, run_id: str) -> RebuiltRun:
        """Fold the run's state from its latest snapshot and the event log's tail.

        The head (``RunInfo``) is this fold kept up to date in every commit;
        this recomputes it from the log, for audits and consistency checks.
        The status is the lifecycle table's fold of the events
        (:mod:`tiers.task._lifecycle`), as every commit moves it.

        Raises:
            RunNotFoundError: No such run.
        """
        info = self.store.get_run(run_id)
        space = keys.run_space(self.store.tenant, run_id)
        snaps = [
            decode(Snapshot, raw, where=f"{space}/{key}")
            for key, raw in self.store.kv.scan(space, prefix=keys.SNAPSHOT_PREFIX)
        ]
        latest = max(snaps, key=lambda snap: snap.event_seq, default=None)
        base = Snapshot(run_id=run_id, seq=0, checkpoint_id=None, event_seq=0, status=INITIAL)
        start = base if latest is None else latest
        if start.event_seq < info.compacted_through:
            raise CorruptRecordError(
                f"run {run_id!r}: events up to {info.compacted_through} were compacted but the "
                f"latest snapshot is at event {start.event_seq}"
            )
        tail = self.events(run_id, after_seq=start.event_seq)
        head_seq, head_id = start.seq, start.checkpoint_id
        spent_tokens, spent_cost = start.spent_tokens, start.spent_cost
        pending, values = start.pending_plan_hash, dict(start.values)
        unknown = list(start.unknown_effects)
        for event in tail:
            data = event.data
            match event.kind:
                case EventKind.STEP_COMMITTED:
                    head_seq = int(str(data["seq"]))
                    ckpt = self.store.read_checkpoint(run_id, head_seq)
                    if ckpt is None:
                        raise CorruptRecordError(
                            f"run {run_id!r}: event {event.seq} names no checkpoint"
                        )
                    head_id = ckpt.checkpoint_id
                    values.update(ckpt.state_delta or {})
                case EventKind.STATE_UPDATED:
                    head_seq, head_id = int(str(data["seq"])), str(data["checkpoint_id"])
                    values = self.store.values_at(run_id, head_seq)
                case EventKind.BUDGET_DEBITED:
                    spent_tokens = int(str(data["spent_tokens"]))
                    spent_cost = float(str(data["spent_cost"]))
                case EventKind.APPROVAL_REQUESTED:
                    pending = str(data["plan_hash"])
                case EventKind.APPROVAL_GRANTED | EventKind.APPROVAL_REJECTED:
                    pending = None
                case EventKind.EFFECT_OUTCOME_UNKNOWN if data["key"] not in unknown:
                    unknown.append(str(data["key"]))
                case (
                    EventKind.EFFECT_INVOKED | EventKind.EFFECT_RECORDED | EventKind.EFFECT_NOT_DONE
                ):
                    unknown = [k for k in unknown if k != data["key"]]
        events = ((event.kind, event.data) for event in tail)
        return RebuiltRun(
            status=lifecycle.fold(RunStatus(start.status), events, run_id=run_id),
            head_seq=head_seq,
            head_checkpoint_id=head_id,
            event_seq=tail[-1].seq if tail else start.event_seq,
            spent_tokens=spent_tokens,
            spent_cost=spent_cost,
            pending_plan_hash=pending,
            values=values,
            events_read=len(tail),
            unknown_effects=unknown,
        )


def _run_status(status: RunStatus | str | None) -> RunStatus | None:
    if status is None:
        return None
    try:
        return RunStatus(status)
    except ValueError as exc:
        choices = ", ".join(s.value for s in RunStatus)
        raise InvalidInputError(
            f"unknown run status {status!r}: use one of {choices}", field="status"
        ) from exc


def _check_paging(limit: int | None, after_seq: int | None, before_seq: int | None = None) -> None:
    for name, value in (("limit", limit), ("after_seq", after_seq), ("before_seq", before_seq)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise InvalidInputError(f"{name} must be an integer >= 0", field=name)
