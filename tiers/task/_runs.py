"""Taking a run (its lease), attaching to a lease held, and an operator's cancel and budgets."""

from __future__ import annotations

import os
import secrets
import socket
import time
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
from tiers.ids import check_id
from tiers.models import RunInfo, RunStatus
from tiers.task._handle import RunHandle
from tiers.task._records import EventKind, check_decider, new_incarnation
from tiers.task._store import RunStore, check_budget, check_ttl
from tiers.task._txn import UNSET, HeadUpdate, Txn
from tiers.task._writer import COMPENSATABLE

__all__ = ["Runs", "check_takeable", "new_worker_id"]


def new_worker_id() -> str:
    """A lease holder no other caller has: ``<hostname>-<pid>-<random>``.

    A default that is the same for every caller of a process (or of a server)
    would let any of them take a live lease as "the same worker".
    """
    return f"{socket.gethostname()[:200]}-{os.getpid()}-{secrets.token_hex(6)}"


def check_takeable(info: RunInfo, for_compensation: bool) -> None:
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


class Runs:
    """Who writes a run: taking its lease, attaching to it; an operator's cancel and budgets."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    def take(
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
        """Take the lease of ``run_id`` (creating the run when it is absent) and return a handle holding it."""
        worker = new_worker_id() if worker_id is None else worker_id
        if not isinstance(worker, str) or not 1 <= len(worker) <= 256:
            raise InvalidInputError("worker_id must be 1-256 characters", field="worker_id")
        ttl = check_ttl(lease_ttl, "lease_ttl") if lease_ttl is not None else self.store.lease_ttl
        started = time.perf_counter()
        for attempt in range(cas.ATTEMPTS):
            data = self.store.read_head(run_id)
            now = self.store.clock()
            expires = None if ttl is None else now + timedelta(seconds=ttl)
            if data is None:
                if user_id is None:
                    raise RunNotFoundError.absent(run_id, self.store.tenant)
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
                current = self.store.decode_head(run_id, data)
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
                check_takeable(current, for_compensation)
                live = current.lease_live(now)
                if live and current.lease_owner != worker and not steal:
                    self.store.observer.take_refused(run_id)
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
            # Resolved before this take is written: a tenant with nothing in flight moves to
            # the newest layout, its format record committed with this take.
            self.store.layout(taking=True)
            stamping = self.store.stamp(txn)
            try:
                info, head = self.store.apply(txn, data)
            except ConflictError:
                if stamping:  # maybe another process stamped the tenant first: read it again
                    self.store.stamped(False)
                cas.backoff(attempt)
                continue
            if stamping:
                self.store.stamped(True)
            self.store.observer.run_taken(
                run_id,
                resumed=data is not None,
                takeover=data is not None and current.lease_owner not in (None, worker),
                compensation=for_compensation,
                seconds=time.perf_counter() - started,
            )
            return RunHandle(
                self.store,
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
        data = self.store.read_head(run_id)
        if data is None:
            raise RunNotFoundError.absent(run_id, self.store.tenant)
        info = self.store.decode_head(run_id, data)
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
        return RunHandle(self.store, info, data, lease_ttl=info.lease_ttl_s, resumed=True)

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

        return self.store.operate(run_id, build, "cancel")

    def set_budget(
        self,
        run_id: str,
        *,
        tokens: int | None = UNSET,
        cost: float | None = UNSET,
        by: str = "operator",
        by_key: str | None = None,
    ) -> RunInfo:
        """Change a run's token and/or cost budget: how a run that spent its budget goes on.

        A limit not given stays as it is; ``None`` removes it (unlimited). A
        ``BudgetSet`` event records the new limits with ``by`` (who changes
        them, as the caller names them) and ``by_key`` (the id of the
        credential a service authenticated the caller with; ``None`` from the
        library). Takes no lease: the run's worker sees the new budget at its
        next step.

        Returns:
            The run's head with the new budget.

        Raises:
            InvalidInputError: Neither ``tokens`` nor ``cost`` given; a negative,
                NaN or infinite budget, or a non-integer token budget; a bad
                ``by`` or ``by_key``.
            RunNotFoundError: No such run.
        """
        check_id(run_id, "run_id")
        by, by_key = check_decider(by, by_key)
        if tokens is UNSET and cost is UNSET:
            raise InvalidInputError(
                "give the new budget: tokens=, cost= or both (None: unlimited)",
                field="budget_tokens",
            )
        update = HeadUpdate()
        limits: dict[str, int | float | None] = {}
        if tokens is not UNSET:
            limit = check_budget(tokens, "budget_tokens", integer=True)
            update.budget_tokens = limits["budget_tokens"] = None if limit is None else int(limit)
        if cost is not UNSET:
            update.budget_cost = limits["budget_cost"] = check_budget(
                cost, "budget_cost", integer=False
            )

        def build(info: RunInfo, now: datetime) -> Txn | RunInfo:
            txn = Txn(run_id, info.lease_epoch, info, now, update=update)
            txn.add_event(EventKind.BUDGET_SET, **limits, by=by, by_key=by_key)
            return txn

        return self.store.operate(run_id, build, "set the budget of")
