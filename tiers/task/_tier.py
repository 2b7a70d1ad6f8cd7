"""The task tier: the Stateful Execution Contract for long agent runs.

A *run* is one execution of an agent task, possibly spread over several
worker processes: a worker that crashes or is redeployed resumes the run, the
steps already committed are replayed from their checkpoints, and every
external effect happens exactly once.

Storage (every format is in :mod:`tiers.keys`):

- ``runs_space(tenant)`` / ``run_id`` -> :class:`~tiers.models.RunInfo`, the run's
  *head*: owner, status, lease (owner, epoch, expiry), ``head_seq``,
  ``event_seq``, budgets, pending approval. Every change to a run is one
  atomic commit checked against the head's exact bytes, so the head
  serialises all writers of the run.
- ``run_space(tenant, run_id)`` holds, each written in the same commit as the
  head change it belongs to:

  - ``ev:<seq>`` -> :class:`~tiers.task._records.Event`: the append-only event
    log, gap-free seqs, never changed (``compact`` may drop events already
    folded into a snapshot);
  - ``ckpt:<seq>`` -> :class:`~tiers.models.Checkpoint`: one per committed
    step, with the step's output and only the *change* to the run's state;
  - ``idem:<key>`` -> which checkpoint committed an idempotency key;
  - ``eff:<key>`` -> :class:`~tiers.task._records.EffectRecord`: the effect ledger;
  - ``snap:<seq>`` -> :class:`~tiers.task._records.Snapshot`: the run's state
    every ``snapshot_every`` events and at each branch root, so loading the
    state reads one snapshot and at most K checkpoints, however long the run;
  - ``appr:<key>`` -> :class:`~tiers.task._records.ApprovalRecord`: approval gates.

**Costs.** A step with no effect is one durable commit; a top-level effect
is two (``EffectInvoked`` before the call, ``EffectRecorded`` + checkpoint
after it).

**Leases and fencing.** Taking a run (:meth:`TaskTier.start_run`,
:meth:`TaskTier.acquire`) increments ``lease_epoch``; every write of a handle
checks the head bytes it holds, so a handle whose run was taken over writes
nothing and gets :class:`~tiers.errors.StaleWriterError`. A lease with a TTL
(``lease_ttl``) is *live* until it expires; heartbeats and every commit renew
it. Another worker cannot take a live lease (:class:`~tiers.errors.LeaseHeldError`)
unless it steals it. A worker is its ``worker_id``: a caller that names none
gets a new one per call (:func:`new_worker_id`), so two threads of a process,
or two requests to a server, are two workers; a caller retakes its own live
lease by passing its worker id again (``RunHandle.worker_id``). An expired
lease is anybody's (resume after a crash). Leases without a TTL never block a
takeover (the embedded default, where a restarted process resumes its own run
at once).

**Operators do not cost a worker its work.** An operator's change to the
head that takes no lease (``set_budget``, ``compact``, ``resolve_effect``,
``approve``/``reject``, ``cancel``) makes a worker's commit fail its head
check; the handle then rebuilds the commit on the fresh head and retries
(bounded, with :mod:`tiers.cas` backoff) as long as the run still takes that
write, so a step's output or an effect's result computed meanwhile is kept.
Only a new lease epoch fences a handle out.

**Exactly-once effects.** See :meth:`RunHandle.effect` (and
:meth:`RunHandle.begin_effect` / :meth:`RunHandle.record_effect`, the same
protocol for a caller that performs the effect itself, e.g. over HTTP). An
effect's result is recorded before the run advances, even if the run was
cancelled while the effect ran (then without a checkpoint, and the worker
gets :class:`~tiers.errors.RunCancelledError` right after). One invoked but
unrecorded has an unknown outcome: the first worker that finds it and cannot
settle it (no ``reconcile``, not ``safe_to_retry``) flags it in
``RunInfo.unknown_effects``, and the run is *blocked*, left out of
:meth:`TaskTier.list_resumable`, until it is reconciled or an operator
decides (:meth:`TaskTier.resolve_effect`). A takeover while the old holder is
still inside an effect's function (a zombie past its lease) is only safe if
the external system checks the idempotency key: pass it along.

**Compensation.** :meth:`RunHandle.compensate` undoes recorded effects,
newest first, each once; it refuses while any effect's outcome is unknown. A
running, cancelled or failed run can be compensated: by the handle that saw
it end, or by a worker taking it with ``acquire(run_id, for_compensation=True)``.

**Branches.** :meth:`TaskTier.update_state` appends a human-edited checkpoint
whose parent is an earlier checkpoint; the checkpoints after it leave the
run's lineage (``RunInfo.superseded``) and their steps run again on resume.
Recorded effects stay recorded (they happened), so they are not repeated.

**Threads.** :class:`TaskTier` is stateless beyond its store and may be
shared by threads. A :class:`RunHandle` is driven by one thread at a time.

**Modules.** :class:`TaskTier` is assembled from :mod:`tiers.task._storage`
(configuration, reads, the write path), :mod:`tiers.task._queries`,
:mod:`tiers.task._time_travel`, :mod:`tiers.task._retention`, :mod:`tiers.task._approvals`
and :mod:`tiers.task._effects`; this module adds taking runs (leases) and the
run lifecycle. Records and pure helpers are in :mod:`tiers.task._records`.
"""

from __future__ import annotations

import os
import secrets
import socket
from datetime import datetime, timedelta

from tiers import cas
from tiers.errors import (
    ConflictError,
    InvalidInputError,
    LeaseHeldError,
    RunCancelledError,
    RunNotFoundError,
    RunStateError,
    StaleWriterError,
)
from tiers.ids import check_external_id, check_id, run_id_for
from tiers.models import RunInfo, RunStatus
from tiers.task._approvals import ApprovalsMixin
from tiers.task._effects import EffectsMixin
from tiers.task._handle import RunHandle
from tiers.task._handle_core import COMPENSATABLE
from tiers.task._queries import QueriesMixin, RebuiltRun
from tiers.task._records import (
    NOT_DONE,
    Approval,
    Charged,
    EffectRecord,
    EffectStart,
    EffectStatus,
    Event,
    EventKind,
    IdempotencyEntry,
    NotDone,
    canonical_json,
    input_hash,
    new_incarnation,
    new_run_id,
)
from tiers.task._retention import RetentionMixin
from tiers.task._storage import (
    DEFAULT_RETENTION,
    DEFAULT_SNAPSHOT_EVERY,
    TierCore,
    _budget,
    _positive,
)
from tiers.task._time_travel import TimeTravelMixin
from tiers.task._txn import UNSET, HeadUpdate, Txn

__all__ = [
    "DEFAULT_RETENTION",
    "DEFAULT_SNAPSHOT_EVERY",
    "NOT_DONE",
    "UNSET",
    "Approval",
    "Charged",
    "EffectRecord",
    "EffectStart",
    "EffectStatus",
    "Event",
    "EventKind",
    "IdempotencyEntry",
    "NotDone",
    "RebuiltRun",
    "RunHandle",
    "TaskTier",
    "canonical_json",
    "input_hash",
    "new_run_id",
    "new_worker_id",
]


def new_worker_id() -> str:
    """A lease holder no other caller has: ``<hostname>-<pid>-<random>``.

    A default that is the same for every caller of a process (or of a server)
    would let any of them take a live lease as "the same worker".
    """
    return f"{socket.gethostname()[:200]}-{os.getpid()}-{secrets.token_hex(6)}"


def _check_takeable(info: RunInfo, for_compensation: bool) -> None:
    """Refuse to take a run's lease for what its status forbids."""
    run_id, status = info.run_id, info.status.value
    if for_compensation:
        if info.status not in COMPENSATABLE:
            raise RunStateError(
                f"run {run_id!r} is {status}: only a cancelled or failed run is acquired for "
                "compensation (a running one: acquire it as usual and call compensate(), or "
                "cancel it first; a completed one keeps its effects)"
            )
    elif info.status.finished:
        hint = (
            ", or acquire it with for_compensation=True to undo its effects"
            if info.status in COMPENSATABLE
            else ""
        )
        raise RunStateError(
            f"run {run_id!r} is {status} and cannot be resumed: start a new run{hint}"
        )


class TaskTier(
    EffectsMixin, ApprovalsMixin, TimeTravelMixin, RetentionMixin, QueriesMixin, TierCore
):
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
    """

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
        tokens = _budget(budget_tokens, "budget_tokens", integer=True)
        cost = _budget(budget_cost, "budget_cost", integer=False)
        return self._take(
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
        return self._take(
            run_id,
            None,
            resume=True,
            worker_id=worker_id,
            lease_ttl=lease_ttl,
            steal=steal,
            for_compensation=for_compensation,
        )

    def _take(
        self,
        run_id: str,
        user_id: str | None,
        *,
        resume: bool,
        worker_id: str | None,
        lease_ttl: float | None,
        steal: bool,
        budget_tokens: int | None = None,
        budget_cost: float | None = None,
        for_compensation: bool = False,
        external_id: str | None = None,
    ) -> RunHandle:
        worker = new_worker_id() if worker_id is None else worker_id
        if not isinstance(worker, str) or not 1 <= len(worker) <= 256:
            raise InvalidInputError("worker_id must be 1-256 characters", field="worker_id")
        ttl = _positive(lease_ttl, "lease_ttl") if lease_ttl is not None else self._lease_ttl
        for attempt in range(cas.ATTEMPTS):
            data = self._read_head(run_id)
            now = self._now()
            expires = None if ttl is None else now + timedelta(seconds=ttl)
            if data is None:
                if user_id is None:
                    raise RunNotFoundError(f"no run {run_id!r} in tenant {self._tenant!r}")
                base = RunInfo(
                    run_id=run_id,
                    user_id=user_id,
                    lease_epoch=1,
                    lease_owner=worker,
                    lease_expires_at=expires,
                    lease_ttl_s=ttl,
                    budget_tokens=budget_tokens,
                    budget_cost=budget_cost,
                    created_at=now,
                    updated_at=now,
                    external_id=external_id,
                    incarnation=new_incarnation(),
                )
                txn = Txn(run_id, 1, base, now)
                txn.add_event(EventKind.RUN_STARTED, user_id=user_id, owner=worker)
            else:
                current = self._decode_head(run_id, data)
                if user_id is not None and current.user_id != user_id:
                    raise ConflictError(
                        f"run id {run_id!r} is taken by another user: choose another run_id"
                    )
                if external_id is not None and current.external_id != external_id:
                    raise ConflictError(
                        f"run id {run_id!r} is taken by a run of another external id "
                        f"({current.external_id!r}): choose another run_id"
                    )
                if not resume:
                    raise ConflictError(
                        f"run {run_id!r} already exists: pass resume=True to resume it, or "
                        "choose another run_id"
                    )
                _check_takeable(current, for_compensation)
                live = current.lease_live(now)
                if live and current.lease_owner != worker and not steal:
                    owner = current.lease_owner or "?"
                    until = (
                        current.lease_expires_at.isoformat() if current.lease_expires_at else "?"
                    )
                    raise LeaseHeldError(
                        f"run {run_id!r} is leased by worker {owner!r} until {until} (it "
                        "heartbeats while alive): wait for the lease to expire, or pass "
                        "steal=True to take it over and fence that worker out (to retake "
                        "a lease of your own, pass the worker_id you took it with)",
                        owner=owner,
                        expires_at=until,
                        run_id=run_id,
                    )
                epoch = current.lease_epoch + 1
                txn = Txn(run_id, epoch, current, now)
                txn.add_event(
                    EventKind.COMPENSATION_STARTED if for_compensation else EventKind.RUN_RESUMED,
                    owner=worker,
                    previous_owner=current.lease_owner,
                    stolen=bool(live and current.lease_owner != worker),
                )
                txn.update.lease_epoch = epoch
                txn.update.lease_owner = worker
                txn.update.lease_expires_at = expires
                txn.update.lease_ttl_s = ttl
            try:
                info, head = self._apply(txn, data)
            except ConflictError:
                cas.backoff(attempt)
                continue
            return RunHandle(
                self,
                info,
                head,
                lease_ttl=ttl,
                resumed=data is not None,
                compensation_only=for_compensation,
            )
        raise ConflictError(f"run {run_id!r} is being taken by many workers at once; retry")

    def attach(
        self,
        run_id: str,
        epoch: int,
        *,
        finished_ok: bool = False,
        incarnation: str | None = None,
    ) -> RunHandle:
        """A handle on a run for a worker that already holds its lease.

        Unlike :meth:`start_run` this does not take the lease: it is how a
        stateless caller (an HTTP request) keeps writing with the epoch it got
        when it started or resumed the run.

        Args:
            run_id: The run.
            epoch: The lease epoch the caller holds.
            finished_ok: Attach to a finished run too: for
                :meth:`RunHandle.record_effect`, which records the result of an
                effect that ran while the run was cancelled (and then raises
                :class:`RunCancelledError`). Every other write still refuses.
            incarnation: The ``RunInfo.incarnation`` the caller's lease was taken
                on, if it kept it: a run deleted and started again under the same
                id (epochs restart at 1) is then told apart from the one it leased.

        Raises:
            RunNotFoundError: No such run, or not the incarnation the caller leased.
            StaleWriterError: ``epoch`` is not the run's current lease epoch.
            RunStateError: The run is finished (and ``finished_ok`` is false).
        """
        check_id(run_id, "run_id")
        data = self._read_head(run_id)
        if data is None:
            raise RunNotFoundError(f"no run {run_id!r}")
        info = self._decode_head(run_id, data)
        if incarnation is not None and info.incarnation != incarnation:
            raise RunNotFoundError(
                f"run {run_id!r} was deleted and a new run has its id since: stop writing"
            )
        if info.lease_epoch != epoch:
            raise StaleWriterError(
                f"run {run_id!r} is leased with epoch {info.lease_epoch}, not {epoch}: "
                "another worker resumed it; stop writing"
            )
        if info.status.finished and not finished_ok:
            if info.status is RunStatus.CANCELLED:
                raise RunCancelledError(f"run {run_id!r} was cancelled: stop writing")
            raise RunStateError(f"run {run_id!r} is {info.status.value}")
        return RunHandle(self, info, data, lease_ttl=info.lease_ttl_s, resumed=True)

    def cancel(self, run_id: str) -> RunInfo:
        """Cancel a run: its worker raises :class:`RunCancelledError` at its next step boundary.

        Cancelling a cancelled run does nothing.

        Returns:
            The cancelled run's head.

        Raises:
            RunNotFoundError: No such run.
            RunStateError: The run already completed or failed.
        """
        check_id(run_id, "run_id")

        def build(info: RunInfo, now: datetime) -> Txn | RunInfo:
            if info.status is RunStatus.CANCELLED:
                return info
            if info.status.finished:
                raise RunStateError(
                    f"run {run_id!r} is {info.status.value}; it cannot be cancelled"
                )
            txn = Txn(run_id, info.lease_epoch, info, now)
            txn.add_event(EventKind.RUN_CANCELLED)
            txn.update.finished_at = now
            txn.update.lease_owner = None
            txn.update.lease_expires_at = None
            return txn

        return self._operate(run_id, build, "cancel")

    def set_budget(
        self, run_id: str, *, tokens: int | None = UNSET, cost: float | None = UNSET
    ) -> RunInfo:
        """Change a run's token and/or cost budget (``None``: unlimited).

        Raises:
            InvalidInputError: A negative, NaN or infinite budget, or a non-integer token budget.
            RunNotFoundError: No such run.
        """
        check_id(run_id, "run_id")
        update = HeadUpdate()
        if tokens is not UNSET:
            limit = _budget(tokens, "budget_tokens", integer=True)
            update.budget_tokens = None if limit is None else int(limit)
        if cost is not UNSET:
            update.budget_cost = _budget(cost, "budget_cost", integer=False)

        def build(info: RunInfo, now: datetime) -> Txn | RunInfo:
            return Txn(run_id, info.lease_epoch, info, now, update=update)

        return self._operate(run_id, build, "set the budget of")
