"""The public face of the task tier: :class:`TaskTier`, composed of small objects around one store.

:class:`TaskTier` holds one :class:`~tiers.task._store.RunStore` (configuration,
reads, the one write path) and the feature objects that use it: taking runs
(:mod:`~tiers.task._runs`), queries, time travel, retention, approval gates and
operators' effect decisions. Its methods forward to them; each docstring is written
once, beside the code that does the work. See :mod:`tiers.task` for the guarantees.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime, timedelta
from typing import Any

from pydantic import JsonValue

from tiers.backends.base import KVStore
from tiers.ids import check_external_id, check_id, run_id_for
from tiers.models import Checkpoint, RunInfo, RunStatus, utcnow
from tiers.redaction import Redactor
from tiers.task._approvals import Approvals
from tiers.task._fresh import DEFAULT_HEAD_FRESH_MS, check_head_fresh_ms
from tiers.task._handle import RunHandle
from tiers.task._ledger import EffectDecisions
from tiers.task._observer import NULL_OBSERVER, TaskObserver
from tiers.task._queries import Queries, RebuiltRun
from tiers.task._records import Approval, ApprovalRecord, EffectRecord, Event, new_run_id
from tiers.task._retention import Retention
from tiers.task._runs import Runs
from tiers.task._store import (
    DEFAULT_RETENTION,
    DEFAULT_SNAPSHOT_EVERY,
    RunStore,
    check_budget,
)
from tiers.task._time_travel import TimeTravel
from tiers.task._txn import UNSET, doc_from

__all__ = ["TaskTier"]


class TaskTier:
    """Runs, their checkpoints, events and effects, on a :class:`~tiers.backends.base.KVStore`.

    Args:
        kv: The authoritative store.
        tenant: Namespace of every key this tier writes.
        lease_ttl: Default lease TTL in seconds for :meth:`start_run` (``None``:
            leases never expire, and any worker may take a run over at once).
        snapshot_every: Write a state snapshot once this many events have
            been appended since the last one (bounds the cost of loading state).
        retention: How long finished runs are kept before :meth:`sweep` deletes them.
        clock: Current UTC time (injectable for tests of lease expiry and retention).
        redactor: Redacts what is stored (step outputs, state, scopes, run results and
            errors, effect outputs, approval plans) before it is written; ``None``:
            nothing is redacted. Idempotency keys, input hashes and effect response
            hashes are of the values as given, so a resumed step matches its
            checkpoint whatever the redactor changed.
        observer: Hears about commits, resumes, replays, fencing, unknown-outcome effects,
            compensations and sweeps (metrics, traces); default: nobody.
        head_fresh_ms: How long (milliseconds) a handle's :meth:`RunHandle.step` and
            :meth:`RunHandle.append_checkpoint` trust the run's head its last read or
            commit returned, instead of reading it again before the step's function
            runs or the checkpoint is committed (one round trip per step in a tight loop). A cancel, takeover, pause or spent budget by another writer
            inside that window is still refused at the commit, after the function
            ran once (see :meth:`RunHandle.step`). ``0``: read before every step.
    """

    def __init__(
        self,
        kv: KVStore,
        *,
        tenant: str = "default",
        lease_ttl: float | None = None,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        retention: timedelta = DEFAULT_RETENTION,
        clock: Callable[[], datetime] = utcnow,
        redactor: Redactor | None = None,
        observer: TaskObserver | None = None,
        head_fresh_ms: float = DEFAULT_HEAD_FRESH_MS,
    ) -> None:
        store = RunStore(
            kv,
            tenant=tenant,
            lease_ttl=lease_ttl,
            snapshot_every=snapshot_every,
            retention=retention,
            clock=clock,
            redactor=redactor,
        )
        store.observer = observer if observer is not None else NULL_OBSERVER
        store.head_fresh_ms = check_head_fresh_ms(head_fresh_ms)
        self._store = store
        # The raw store and the clock (_now) stay reachable for tests that inspect stored keys.
        self._kv = kv
        self._runs = Runs(store)
        self._queries = Queries(store)
        self._time_travel = TimeTravel(store)
        self._retention = Retention(store)
        self._approvals = Approvals(store)
        self._decisions = EffectDecisions(store)

    @property
    def tenant(self) -> str:
        """The tenant whose runs this tier reads and writes."""
        return self._store.tenant

    @property
    def snapshot_every(self) -> int:
        """Events between two state snapshots of a run."""
        return self._store.snapshot_every

    @property
    def retention(self) -> timedelta:
        """How long finished runs are kept before :meth:`sweep` deletes them."""
        return self._store.retention

    @property
    def head_fresh_ms(self) -> float:
        """How long a step trusts the head its handle last read or wrote (``0``: never)."""
        return self._store.head_fresh_ms

    @property
    def redactor(self) -> Redactor:
        """What redacts the values runs store (a no-op when none was given)."""
        return self._store.redactor

    def _now(self) -> datetime:
        """The current UTC time, by the tier's clock."""
        return self._store.clock()

    def start_run(
        self,
        user_id: str,
        run_id: str | None = None,
        *,
        resume: bool = True,
        worker_id: str | None = None,
        lease_ttl: float | None = None,
        steal: bool = False,
        budget_tokens: int | None = None,
        budget_cost: float | None = None,
        external_id: str | None = None,
    ) -> RunHandle:
        """Create a run, or resume an existing one, and take its lease.

        Taking the lease increments the run's ``lease_epoch``: any handle with an
        older epoch (another worker of the same run) is fenced out from then on.
        A run paused at an approval gate stays paused.

        Args:
            user_id: Owner of the run.
            run_id: The run's id; ``None`` creates a new run with :func:`new_run_id`.
            resume: Whether an existing run may be resumed.
            worker_id: Who takes the lease (1-256 characters). The same worker
                may retake its own live lease. Default: a new holder for this
                call (:func:`new_worker_id`), so another call, thread or
                process never counts as the same worker; pass the returned
                handle's :attr:`~tiers.task._handle.RunHandle.worker_id` back to
                retake this lease while it is live.
            lease_ttl: Seconds the lease lives without a heartbeat or commit, at
                most a year (default: the tier's; ``None`` there means no expiry).
            steal: Take the lease even if another worker's is live (fencing it out).
            budget_tokens: Token budget of a new run, an integer >= 0 (``None``: unlimited).
            budget_cost: Cost budget of a new run, a finite number >= 0 (``None``: unlimited).
            external_id: The id the run has in another system (a framework's session
                or thread id, any 1-1024 characters), kept in ``RunInfo.external_id``.
                Without ``run_id`` the run id is :func:`~tiers.ids.run_id_for` of it.

        Returns:
            A handle holding the new lease epoch.

        Raises:
            InvalidInputError: Bad ``user_id``, ``run_id``, ``external_id``, ``lease_ttl``
                or budget.
            LeaseHeldError: Another worker holds a live lease (and ``steal`` is false).
            ConflictError: The run exists and ``resume`` is false, or it belongs to
                another user, or another external id, or too many workers took it at once.
            RunStateError: The run is finished (completed, failed or cancelled).
        """
        check_id(user_id, "user_id")
        if external_id is not None:
            check_external_id(external_id)
        if run_id is not None:
            check_id(run_id, "run_id")
        elif external_id is not None:
            run_id = run_id_for(external_id)
        else:
            run_id = new_run_id()
        tokens = check_budget(budget_tokens, "budget_tokens", integer=True)
        cost = check_budget(budget_cost, "budget_cost", integer=False)
        return self._runs.take(
            run_id,
            user_id,
            resume=resume,
            worker_id=worker_id,
            lease_ttl=lease_ttl,
            steal=steal,
            budget_tokens=None if tokens is None else int(tokens),
            budget_cost=None if cost is None else float(cost),
            external_id=external_id,
        )

    def acquire(
        self,
        run_id: str,
        *,
        worker_id: str | None = None,
        lease_ttl: float | None = None,
        steal: bool = False,
        for_compensation: bool = False,
    ) -> RunHandle:
        """Take the lease of an existing run (for a worker pool; see :meth:`list_resumable`).

        With ``for_compensation=True`` the run must be cancelled or failed: the
        handle takes its lease (fencing out any earlier holder, as a resume
        does) but only undoes what the run did: :meth:`RunHandle.compensate`
        (with ``register_compensation``, ``heartbeat`` and ``release``); every
        other write raises :class:`RunStateError`. The run's status does not
        change. A compensation that crashed half-way is resumed the same way.

        ``worker_id``, ``lease_ttl`` and ``steal`` are as for :meth:`start_run`:
        without ``worker_id`` this call is a worker of its own.

        Raises:
            RunNotFoundError: No such run.
            LeaseHeldError: Another worker holds a live lease (and ``steal`` is false).
            RunStateError: The run is finished (without ``for_compensation``), or
                with it, the run is not cancelled or failed.
        """
        check_id(run_id, "run_id")
        return self._runs.take(
            run_id,
            None,
            resume=True,
            worker_id=worker_id,
            lease_ttl=lease_ttl,
            steal=steal,
            for_compensation=for_compensation,
        )

    @doc_from(Runs.attach)
    def attach(
        self,
        run_id: str,
        epoch: int,
        *,
        finished_ok: bool = False,
        incarnation: str | None = None,
    ) -> RunHandle:
        return self._runs.attach(run_id, epoch, finished_ok=finished_ok, incarnation=incarnation)

    @doc_from(Runs.cancel)
    def cancel(self, run_id: str) -> RunInfo:
        return self._runs.cancel(run_id)

    @doc_from(Runs.set_budget)
    def set_budget(
        self,
        run_id: str,
        *,
        tokens: int | None = UNSET,
        cost: float | None = UNSET,
        by: str = "operator",
        by_key: str | None = None,
    ) -> RunInfo:
        return self._runs.set_budget(run_id, tokens=tokens, cost=cost, by=by, by_key=by_key)

    @doc_from(RunStore.force_flush)
    def force_flush(self) -> None:
        self._store.force_flush()

    @doc_from(RunStore.get_run)
    def get_run(self, run_id: str) -> RunInfo:
        return self._store.get_run(run_id)

    @doc_from(RunStore.get_checkpoint)
    def get_checkpoint(self, run_id: str, checkpoint_id: str) -> Checkpoint:
        return self._store.get_checkpoint(run_id, checkpoint_id)

    @doc_from(RunStore.latest_scope)
    def latest_scope(self, run_id: str) -> dict[str, JsonValue] | None:
        return self._store.latest_scope(run_id)

    @doc_from(Queries.latest_checkpoint)
    def latest_checkpoint(self, run_id: str) -> Checkpoint | None:
        return self._queries.latest_checkpoint(run_id)

    @doc_from(Queries.history)
    def history(
        self,
        run_id: str,
        *,
        limit: int | None = None,
        after_seq: int | None = None,
        before_seq: int | None = None,
        newest_first: bool = False,
    ) -> list[Checkpoint]:
        return self._queries.history(
            run_id,
            limit=limit,
            after_seq=after_seq,
            before_seq=before_seq,
            newest_first=newest_first,
        )

    @doc_from(Queries.checkpoint_for_key)
    def checkpoint_for_key(self, run_id: str, idempotency_key: str) -> Checkpoint | None:
        return self._queries.checkpoint_for_key(run_id, idempotency_key)

    @doc_from(Queries.events)
    def events(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[Event]:
        return self._queries.events(run_id, after_seq=after_seq, limit=limit)

    @doc_from(Queries.effects)
    def effects(
        self, run_id: str, *, after_key: str | None = None, limit: int | None = None
    ) -> list[EffectRecord]:
        return self._queries.effects(run_id, after_key=after_key, limit=limit)

    @doc_from(Queries.count_effects)
    def count_effects(self, run_id: str, *, after_key: str | None = None) -> int:
        return self._queries.count_effects(run_id, after_key=after_key)

    @doc_from(Queries.get_effect)
    def get_effect(self, run_id: str, key: str) -> EffectRecord:
        return self._queries.get_effect(run_id, key)

    @doc_from(Queries.unknown_effects)
    def unknown_effects(self, run_id: str) -> list[EffectRecord]:
        return self._queries.unknown_effects(run_id)

    @doc_from(Queries.list_runs)
    def list_runs(
        self,
        user_id: str | None = None,
        status: RunStatus | str | None = None,
        *,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[RunInfo]:
        return self._queries.list_runs(user_id, status, limit=limit, after=after)

    @doc_from(Queries.list_resumable)
    def list_resumable(
        self, *, now: datetime | None = None, limit: int | None = None, after: str | None = None
    ) -> list[RunInfo]:
        return self._queries.list_resumable(now=now, limit=limit, after=after)

    @doc_from(Queries.rebuild)
    def rebuild(self, run_id: str) -> RebuiltRun:
        return self._queries.rebuild(run_id)

    @doc_from(TimeTravel.state_at)
    def state_at(self, run_id: str, checkpoint_id: str) -> dict[str, JsonValue]:
        return self._time_travel.state_at(run_id, checkpoint_id)

    @doc_from(TimeTravel.fork)
    def fork(self, run_id: str, checkpoint_id: str, new_run_id: str | None = None) -> RunInfo:
        return self._time_travel.fork(run_id, checkpoint_id, new_run_id)

    @doc_from(TimeTravel.update_state)
    def update_state(
        self,
        run_id: str,
        checkpoint_id: str,
        values: dict[str, Any],
        *,
        by: str = "operator",
        by_key: str | None = None,
    ) -> Checkpoint:
        return self._time_travel.update_state(run_id, checkpoint_id, values, by=by, by_key=by_key)

    @doc_from(Retention.delete_run)
    def delete_run(self, run_id: str) -> bool:
        return self._retention.delete_run(run_id)

    @doc_from(Retention.sweep)
    def sweep(self, *, now: datetime | None = None) -> list[str]:
        return self._retention.sweep(now=now)

    @doc_from(Retention.sweep_idle)
    def sweep_idle(self, idle: timedelta, *, now: datetime | None = None) -> list[str]:
        return self._retention.sweep_idle(idle, now=now)

    @doc_from(Retention.compact)
    def compact(self, run_id: str) -> int:
        return self._retention.compact(run_id)

    @doc_from(Approvals.approval)
    def approval(self, run_id: str, key: str) -> ApprovalRecord | None:
        return self._approvals.approval(run_id, key)

    @doc_from(Approvals.approve)
    def approve(
        self,
        run_id: str,
        plan_hash: str,
        *,
        by: str,
        note: str | None = None,
        by_key: str | None = None,
    ) -> Approval:
        return self._approvals.approve(run_id, plan_hash, by=by, note=note, by_key=by_key)

    @doc_from(Approvals.reject)
    def reject(
        self,
        run_id: str,
        plan_hash: str,
        *,
        by: str,
        note: str | None = None,
        by_key: str | None = None,
    ) -> Approval:
        return self._approvals.reject(run_id, plan_hash, by=by, note=note, by_key=by_key)

    @doc_from(EffectDecisions.resolve_effect)
    def resolve_effect(
        self,
        run_id: str,
        key: str,
        *,
        output: object = UNSET,
        rerun: bool = False,
        by: str = "operator",
        by_key: str | None = None,
    ) -> EffectRecord:
        return self._decisions.resolve_effect(
            run_id, key, output=output, rerun=rerun, by=by, by_key=by_key
        )
