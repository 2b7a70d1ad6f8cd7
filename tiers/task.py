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

  - ``ev:<seq>`` -> :class:`~tiers.task_events.Event`: the append-only event
    log, gap-free seqs, never changed (``compact`` may drop events already
    folded into a snapshot);
  - ``ckpt:<seq>`` -> :class:`~tiers.models.Checkpoint`: one per committed
    step, with the step's output and only the *change* to the run's state;
  - ``idem:<key>`` -> which checkpoint committed an idempotency key;
  - ``eff:<key>`` -> :class:`~tiers.task_events.EffectRecord`: the effect ledger;
  - ``snap:<seq>`` -> :class:`~tiers.task_events.Snapshot`: the run's state
    every ``snapshot_every`` events and at each branch root, so loading the
    state reads one snapshot and at most K checkpoints, however long the run;
  - ``appr:<key>`` -> :class:`~tiers.task_events.ApprovalRecord`: approval gates.

**Costs.** A step with no effect is one durable commit; a top-level effect
is two (``EffectInvoked`` before the call, ``EffectRecorded`` + checkpoint
after it).

**Leases and fencing.** Taking a run (:meth:`TaskTier.start_run`,
:meth:`TaskTier.acquire`) increments ``lease_epoch``; every write of a handle
checks the head bytes it holds, so a handle whose run was taken over writes
nothing and gets :class:`~tiers.errors.StaleWriterError`. A lease with a TTL
(``lease_ttl``) is *live* until it expires; heartbeats and every commit renew
it. Another worker cannot take a live lease (:class:`~tiers.errors.LeaseHeldError`)
unless it steals it. Leases without a TTL never block a takeover (the
embedded default, where a restarted process resumes its own run at once).

**Exactly-once effects.** See :meth:`RunHandle.effect`. An effect's result
is recorded before the run advances; one invoked but unrecorded blocks the
run until it is reconciled. A takeover while the old holder is still inside
an effect's function (a zombie past its lease) is only safe if the external
system checks the idempotency key: pass it along.

**Branches.** :meth:`TaskTier.update_state` appends a human-edited checkpoint
whose parent is an earlier checkpoint; the checkpoints after it leave the
run's lineage (``RunInfo.superseded``) and their steps run again on resume.
Recorded effects stay recorded (they happened), so they are not repeated.

**Threads.** :class:`TaskTier` is stateless beyond its store and may be
shared by threads. A :class:`RunHandle` is driven by one thread at a time.
"""

from __future__ import annotations

import os
import random
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any

from pydantic import JsonValue

from tiers import keys, task_events
from tiers.backends.base import Check, Delete, DeleteSpace, KVStore, Put, Write
from tiers.codec import decode, encode
from tiers.errors import (
    CheckpointNotFoundError,
    ConflictError,
    CorruptRecordError,
    InvalidInputError,
    LeaseHeldError,
    PlanMismatchError,
    RunNotFoundError,
    RunStateError,
    StaleWriterError,
    ValueTooLargeError,
)
from tiers.ids import check_id
from tiers.models import Checkpoint, RunInfo, RunStatus, utcnow
from tiers.task_events import (
    NOT_DONE,
    Approval,
    ApprovalRecord,
    Charged,
    EffectRecord,
    EffectStatus,
    Event,
    EventKind,
    IdempotencyEntry,
    NotDone,
    Snapshot,
    canonical_json,
    input_hash,
    new_run_id,
    output_digest,
    seq_of_checkpoint_id,
    to_json,
    to_json_dict,
)
from tiers.task_handle import RunHandle, Txn

__all__ = [
    "NOT_DONE",
    "Approval",
    "Charged",
    "EffectRecord",
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
]

_CAS_ATTEMPTS = 16


def _backoff(attempt: int) -> None:
    # Jittered exponential wait after a lost compare-and-set, so racing workers
    # (and a lease holder committing steps) stop colliding in lockstep.
    time.sleep(random.uniform(0, min(0.05, 0.0005 * 2**attempt)))


_DELETE_CHUNK = 1000
DEFAULT_SNAPSHOT_EVERY = 64
DEFAULT_RETENTION = timedelta(days=7)
_UNSET: Any = object()


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


def _default_worker_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}"


def _positive(value: float | None, field: str) -> float | None:
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or not value > 0:
        raise InvalidInputError(f"{field} must be a number > 0 (seconds)", field=field)
    return float(value)


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
    ) -> None:
        if isinstance(snapshot_every, bool) or not isinstance(snapshot_every, int):
            raise InvalidInputError(
                "snapshot_every must be an integer >= 1", field="snapshot_every"
            )
        if snapshot_every < 1:
            raise InvalidInputError(
                "snapshot_every must be an integer >= 1", field="snapshot_every"
            )
        self._kv = kv
        self._tenant = check_id(tenant, "tenant")
        self._runs = keys.runs_space(self._tenant)
        self._lease_ttl = _positive(lease_ttl, "lease_ttl")
        self.snapshot_every = snapshot_every
        self.retention = retention
        self._clock = clock

    @property
    def tenant(self) -> str:
        """The tenant whose runs this tier reads and writes."""
        return self._tenant

    def _now(self) -> datetime:
        return self._clock()

    # -- taking runs -------------------------------------------------------------

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
    ) -> RunHandle:
        """Create a run, or resume an existing one, and take its lease.

        Taking the lease increments the run's ``lease_epoch``: any handle with an
        older epoch (another worker of the same run) is fenced out from then on.
        A run paused at an approval gate stays paused.

        Args:
            user_id: Owner of the run.
            run_id: The run's id; ``None`` creates a new run with :func:`new_run_id`.
            resume: Whether an existing run may be resumed.
            worker_id: Who takes the lease (default ``<hostname>-<pid>``). The
                same worker may retake its own live lease.
            lease_ttl: Seconds the lease lives without a heartbeat or commit
                (default: the tier's; ``None`` there means no expiry).
            steal: Take the lease even if another worker's is live.
            budget_tokens: Token budget of a new run (``None``: unlimited).
            budget_cost: Cost budget of a new run (``None``: unlimited).

        Returns:
            A handle holding the new lease epoch.

        Raises:
            InvalidInputError: Bad ``user_id``, ``run_id``, ``lease_ttl`` or budget.
            LeaseHeldError: Another worker holds a live lease (and ``steal`` is false).
            ConflictError: The run exists and ``resume`` is false, or it belongs to
                another user, or too many workers took it at once.
            RunStateError: The run is finished (completed, failed or cancelled).
        """
        check_id(user_id, "user_id")
        run_id = new_run_id() if run_id is None else check_id(run_id, "run_id")
        for name, value in (("budget_tokens", budget_tokens), ("budget_cost", budget_cost)):
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value < 0
            ):
                raise InvalidInputError(f"{name} must be a number >= 0", field=name)
        if budget_tokens is not None and not isinstance(budget_tokens, int):
            raise InvalidInputError("budget_tokens must be an integer", field="budget_tokens")
        return self._take(
            run_id,
            user_id,
            resume=resume,
            worker_id=worker_id,
            lease_ttl=lease_ttl,
            steal=steal,
            budget_tokens=budget_tokens,
            budget_cost=None if budget_cost is None else float(budget_cost),
        )

    def acquire(
        self,
        run_id: str,
        *,
        worker_id: str | None = None,
        lease_ttl: float | None = None,
        steal: bool = False,
    ) -> RunHandle:
        """Take the lease of an existing run (for a worker pool; see :meth:`list_resumable`).

        Raises:
            RunNotFoundError: No such run.
            LeaseHeldError: Another worker holds a live lease (and ``steal`` is false).
            RunStateError: The run is finished.
        """
        check_id(run_id, "run_id")
        return self._take(
            run_id, None, resume=True, worker_id=worker_id, lease_ttl=lease_ttl, steal=steal
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
    ) -> RunHandle:
        worker = _default_worker_id() if worker_id is None else worker_id
        if not isinstance(worker, str) or not 1 <= len(worker) <= 256:
            raise InvalidInputError("worker_id must be 1-256 characters", field="worker_id")
        ttl = _positive(lease_ttl, "lease_ttl") if lease_ttl is not None else self._lease_ttl
        for attempt in range(_CAS_ATTEMPTS):
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
                )
                txn = Txn(run_id, 1, base, now)
                txn.add_event(EventKind.RUN_STARTED, user_id=user_id, owner=worker)
            else:
                current = self._decode_head(run_id, data)
                if user_id is not None and current.user_id != user_id:
                    raise ConflictError(
                        f"run id {run_id!r} is taken by another user: choose another run_id"
                    )
                if not resume:
                    raise ConflictError(
                        f"run {run_id!r} already exists: pass resume=True to resume it, or "
                        "choose another run_id"
                    )
                if current.status.finished:
                    raise RunStateError(
                        f"run {run_id!r} is {current.status.value} and cannot be resumed: "
                        "start a new run"
                    )
                live = current.lease_live(now)
                if live and current.lease_owner != worker and not steal:
                    owner = current.lease_owner or "?"
                    until = (
                        current.lease_expires_at.isoformat() if current.lease_expires_at else "?"
                    )
                    raise LeaseHeldError(
                        f"run {run_id!r} is leased by worker {owner!r} until {until} (it "
                        "heartbeats while alive): wait for the lease to expire, or pass "
                        "steal=True to take it over and fence that worker out",
                        owner=owner,
                        expires_at=until,
                    )
                epoch = current.lease_epoch + 1
                txn = Txn(run_id, epoch, current, now)
                txn.add_event(
                    EventKind.RUN_RESUMED,
                    owner=worker,
                    previous_owner=current.lease_owner,
                    stolen=bool(live and current.lease_owner != worker),
                )
                txn.update.update(
                    lease_epoch=epoch,
                    lease_owner=worker,
                    lease_expires_at=expires,
                    lease_ttl_s=ttl,
                )
                if current.status is not RunStatus.PAUSED:
                    txn.update["status"] = RunStatus.RUNNING
            try:
                info, head = self._apply(txn, data)
            except ConflictError:
                _backoff(attempt)
                continue
            return RunHandle(self, info, head, lease_ttl=ttl, resumed=data is not None)
        raise ConflictError(f"run {run_id!r} is being taken by many workers at once; retry")

    def attach(self, run_id: str, epoch: int) -> RunHandle:
        """A handle on a run for a worker that already holds its lease.

        Unlike :meth:`start_run` this does not take the lease: it is how a
        stateless caller (an HTTP request) keeps writing with the epoch it got
        when it started or resumed the run.

        Raises:
            RunNotFoundError: No such run.
            StaleWriterError: ``epoch`` is not the run's current lease epoch.
            RunStateError: The run is finished.
        """
        check_id(run_id, "run_id")
        data = self._read_head(run_id)
        if data is None:
            raise RunNotFoundError(f"no run {run_id!r}")
        info = self._decode_head(run_id, data)
        if info.lease_epoch != epoch:
            raise StaleWriterError(
                f"run {run_id!r} is leased with epoch {info.lease_epoch}, not {epoch}: "
                "another worker resumed it; stop writing"
            )
        if info.status.finished:
            raise RunStateError(f"run {run_id!r} is {info.status.value}")
        return RunHandle(self, info, data, lease_ttl=info.lease_ttl_s, resumed=True)

    # -- operator actions --------------------------------------------------------

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
            txn.update.update(
                status=RunStatus.CANCELLED, finished_at=now, lease_owner=None, lease_expires_at=None
            )
            return txn

        return self._operate(run_id, build, "cancel")

    def approve(self, run_id: str, plan_hash: str, *, by: str, note: str | None = None) -> Approval:
        """Approve the plan a run waits on; the run becomes resumable and passes its gate.

        Approving an already approved plan again returns the same decision.

        Args:
            run_id: The paused run.
            plan_hash: The SHA-256 of the plan being approved (from
                :class:`ApprovalPendingError` or ``RunInfo.pending_approval``):
                the approval is bound to exactly that plan.
            by: Who approves (kept in the event log).
            note: Optional comment.

        Raises:
            PlanMismatchError: The run waits on another plan.
            RunStateError: No approval is pending (and this plan was not approved), or the
                run is finished.
            RunNotFoundError: No such run.
        """
        return self._decide(run_id, plan_hash, by, note, granted=True)

    def reject(self, run_id: str, plan_hash: str, *, by: str, note: str | None = None) -> Approval:
        """Reject the plan a run waits on; the resumed run's gate returns ``approved=False``.

        Raises:
            PlanMismatchError, RunStateError, RunNotFoundError: As for :meth:`approve`.
        """
        return self._decide(run_id, plan_hash, by, note, granted=False)

    def _decide(
        self, run_id: str, plan_hash: str, by: str, note: str | None, *, granted: bool
    ) -> Approval:
        check_id(run_id, "run_id")
        if not isinstance(plan_hash, str) or len(plan_hash) != 64:
            raise InvalidInputError("plan_hash must be a hex SHA-256 digest", field="plan_hash")
        if not isinstance(by, str) or not 1 <= len(by.strip()) <= 256:
            raise InvalidInputError("by must name who decides (1-256 characters)", field="by")
        if note is not None and (not isinstance(note, str) or len(note) > 2000):
            raise InvalidInputError(
                "note must be a string of at most 2000 characters", field="note"
            )
        wanted = "granted" if granted else "rejected"
        space = keys.run_space(self._tenant, run_id)
        decided: list[ApprovalRecord] = []

        def build(info: RunInfo, now: datetime) -> Txn | RunInfo:
            decided.clear()
            if info.status.finished:
                raise RunStateError(f"run {run_id!r} is {info.status.value}: nothing to approve")
            pending = info.pending_approval
            if pending is None:
                for appr_key, raw in self._kv.scan(space, prefix=keys.APPROVAL_PREFIX):
                    rec = decode(ApprovalRecord, raw, where=f"{space}/{appr_key}")
                    if rec.plan_hash == plan_hash and rec.status == wanted:
                        decided.append(rec)
                        return info
                raise RunStateError(
                    f"run {run_id!r} waits for no approval of plan {plan_hash[:12]}...: "
                    "nothing to decide"
                )
            if pending.plan_hash != plan_hash:
                raise PlanMismatchError(
                    f"run {run_id!r} waits for approval of plan {pending.plan_hash[:12]}..., "
                    f"not {plan_hash[:12]}...: review the plan the run froze and decide on "
                    "that one"
                )
            (data,) = self._kv.get_many(space, [keys.approval_key(pending.key)])
            if data is None:
                raise CorruptRecordError(
                    f"run {run_id!r} waits on gate {pending.key!r}, which is not stored"
                )
            rec = decode(ApprovalRecord, data, where=f"{space}/{keys.approval_key(pending.key)}")
            new = rec.model_copy(
                update={"status": wanted, "decided_by": by.strip(), "decided_at": now, "note": note}
            )
            decided.append(new)
            txn = Txn(run_id, info.lease_epoch, info, now)
            kind = EventKind.APPROVAL_GRANTED if granted else EventKind.APPROVAL_REJECTED
            txn.add_event(kind, key=pending.key, plan_hash=plan_hash, by=by.strip())
            txn.puts.append(Put(space, keys.approval_key(pending.key), encode(new)))
            txn.checks.append(Check(space, keys.approval_key(pending.key), data))
            txn.update.update(pending_approval=None, status=RunStatus.RESUMABLE)
            return txn

        self._operate(run_id, build, "decide")
        rec = decided[0]
        return Approval(
            approved=rec.status == "granted",
            plan_hash=rec.plan_hash,
            by=rec.decided_by,
            at=rec.decided_at,
            note=rec.note,
        )

    def resolve_effect(
        self,
        run_id: str,
        key: str,
        *,
        output: object = _UNSET,
        rerun: bool = False,
        by: str = "operator",
    ) -> EffectRecord:
        """An operator's decision on an effect whose outcome is unknown.

        Give exactly one of ``output`` (the effect happened; the resumed run
        gets this output without calling the effect) or ``rerun=True`` (it did
        not happen; the resumed run calls it again).

        Raises:
            InvalidInputError: Neither or both given, or a non-JSON output.
            NotFoundError: No such run or effect.
            RunStateError: The effect's outcome is not unknown (it is recorded or
                was never invoked), or the run is finished.
        """
        check_id(run_id, "run_id")
        if (output is _UNSET) == (not rerun):
            raise InvalidInputError(
                "give exactly one of output=... (the effect happened) or rerun=True (it did not)",
                field="output",
            )
        value = None if output is _UNSET else to_json(output, field="output")
        space = keys.run_space(self._tenant, run_id)
        result: list[EffectRecord] = []

        def build(info: RunInfo, now: datetime) -> Txn | RunInfo:
            result.clear()
            if info.status.finished:
                raise RunStateError(f"run {run_id!r} is {info.status.value}")
            rec, data = self._read_effect(run_id, key)
            if rec is None:
                raise CheckpointNotFoundError(f"run {run_id!r} has no effect with key {key!r}")
            if rec.status is not EffectStatus.INVOKED:
                raise RunStateError(
                    f"effect {key!r} of run {run_id!r} is {rec.status.value}, not of unknown "
                    "outcome: nothing to resolve"
                )
            txn = Txn(run_id, info.lease_epoch, info, now)
            if rerun:
                txn.add_event(EventKind.EFFECT_NOT_DONE, key=key, source="operator", by=by)
                new = rec.model_copy(update={"status": EffectStatus.NOT_DONE, "source": "operator"})
            else:
                seq = txn.add_event(
                    EventKind.EFFECT_RECORDED,
                    key=key,
                    response_hash=output_digest(value),
                    source="operator",
                    by=by,
                )
                new = rec.model_copy(
                    update={
                        "status": EffectStatus.RECORDED,
                        "output": value,
                        "response_hash": output_digest(value),
                        "source": "operator",
                        "recorded_seq": seq,
                    }
                )
            txn.puts.append(Put(space, keys.effect_key(key), encode(new)))
            txn.checks.append(Check(space, keys.effect_key(key), data))
            result.append(new)
            return txn

        self._operate(run_id, build, "resolve an effect of")
        return result[0]

    def set_budget(
        self, run_id: str, *, tokens: int | None = _UNSET, cost: float | None = _UNSET
    ) -> RunInfo:
        """Change a run's token and/or cost budget (``None``: unlimited).

        Raises:
            InvalidInputError: A negative budget.
            RunNotFoundError: No such run.
        """
        update: dict[str, Any] = {}
        for name, value in (("budget_tokens", tokens), ("budget_cost", cost)):
            if value is _UNSET:
                continue
            if value is not None and (
                isinstance(value, bool) or not isinstance(value, int | float) or value < 0
            ):
                raise InvalidInputError(f"{name} must be a number >= 0 or None", field=name)
            update[name] = value

        def build(info: RunInfo, now: datetime) -> Txn | RunInfo:
            txn = Txn(run_id, info.lease_epoch, info, now)
            txn.update.update(update)
            return txn

        return self._operate(run_id, build, "set the budget of")

    def _operate(
        self, run_id: str, build: Callable[[RunInfo, datetime], Txn | RunInfo], what: str
    ) -> RunInfo:
        """Compare-and-set an operator's change onto the head (``build`` may return the head unchanged)."""
        for attempt in range(_CAS_ATTEMPTS):
            data = self._read_head(run_id)
            if data is None:
                raise RunNotFoundError(f"no run {run_id!r} in tenant {self._tenant!r}")
            info = self._decode_head(run_id, data)
            txn = build(info, self._now())
            if isinstance(txn, RunInfo):
                return txn
            try:
                new, _ = self._apply(txn, data)
            except ConflictError:
                _backoff(attempt)
                continue
            return new
        raise ConflictError(f"run {run_id!r} is changing too fast to {what}; retry")

    # -- time travel ---------------------------------------------------------------

    def state_at(self, run_id: str, checkpoint_id: str) -> dict[str, JsonValue]:
        """The run's state values as of a checkpoint (every delta up to it, along its branch).

        Raises:
            RunNotFoundError: No such run.
            CheckpointNotFoundError: No such checkpoint.
        """
        ckpt = self.get_checkpoint(run_id, checkpoint_id)
        return self._values_at(run_id, ckpt.seq)

    def fork(self, run_id: str, checkpoint_id: str, new_run_id: str | None = None) -> RunInfo:
        """Start a new run from a checkpoint: its history up to there, a link to its parent.

        The new run (status ``resumable``, owned by the same user) holds copies
        of the checkpoints on the path to ``checkpoint_id`` (renumbered 1..n,
        default idempotency keys renamed to the new run), so a script started on
        it replays them and continues from there. Effects recorded after the
        fork point are not copied: on the fork they run again.

        Returns:
            The new run's head.

        Raises:
            RunNotFoundError, CheckpointNotFoundError: No such run or checkpoint.
            ConflictError: ``new_run_id`` is taken.
            InvalidInputError: Bad ``new_run_id``.
        """
        source = self.get_run(run_id)
        target = self.get_checkpoint(run_id, checkpoint_id)
        new_id = (
            task_events.new_run_id() if new_run_id is None else check_id(new_run_id, "new_run_id")
        )
        space = keys.run_space(self._tenant, run_id)
        by_id = {
            c.checkpoint_id: c
            for c in (
                self._decode_checkpoint(run_id, k, d)
                for k, d in self._kv.scan(
                    space,
                    prefix=keys.CHECKPOINT_PREFIX,
                    start_after=None,
                    limit=target.seq,
                )
            )
        }
        path: list[Checkpoint] = []
        cursor: Checkpoint | None = target
        while cursor is not None:
            path.append(cursor)
            cursor = by_id.get(cursor.parent_id) if cursor.parent_id else None
        path.reverse()
        values = self._values_at(run_id, target.seq)
        now = self._now()
        new_space = keys.run_space(self._tenant, new_id)
        prefix = f"{run_id}/"
        base = RunInfo(
            run_id=new_id,
            user_id=source.user_id,
            status=RunStatus.RESUMABLE,
            parent_run_id=run_id,
            parent_checkpoint_id=target.checkpoint_id,
            budget_tokens=source.budget_tokens,
            budget_cost=source.budget_cost,
            created_at=now,
            updated_at=now,
        )
        txn = Txn(new_id, 0, base, now)
        event_seq = txn.add_event(
            EventKind.RUN_FORKED,
            parent_run_id=run_id,
            parent_checkpoint_id=target.checkpoint_id,
            copied=len(path),
        )
        parent: str | None = None
        for seq, old in enumerate(path, start=1):
            key = old.idempotency_key
            if key.startswith(prefix):
                key = f"{new_id}/{key[len(prefix) :]}"
            ckpt = old.model_copy(
                update={
                    "checkpoint_id": task_events.checkpoint_id(new_id, seq, key),
                    "run_id": new_id,
                    "seq": seq,
                    "parent_id": parent,
                    "idempotency_key": key,
                    "event_seq": event_seq,
                }
            )
            parent = ckpt.checkpoint_id
            entry = IdempotencyEntry(
                seq=seq, checkpoint_id=ckpt.checkpoint_id, input_hash=ckpt.input_hash
            )
            txn.puts += [
                Put(new_space, keys.checkpoint_key(seq), encode(ckpt)),
                Put(new_space, keys.idempotency_key(key), encode(entry)),
            ]
        if path:
            snap = Snapshot(
                run_id=new_id,
                seq=len(path),
                checkpoint_id=parent,
                event_seq=event_seq,
                values=values,
                status=RunStatus.RESUMABLE.value,
            )
            txn.puts.append(Put(new_space, keys.snapshot_key(len(path)), self._fit(encode(snap))))
        txn.update.update(
            head_seq=len(path),
            head_checkpoint_id=parent,
            last_checkpoint_at=now if path else None,
            snapshot_event_seq=event_seq if path else 0,
        )
        try:
            info, _ = self._apply(txn, None)
        except ConflictError as exc:
            raise ConflictError(f"run id {new_id!r} is taken: fork to another new_run_id") from exc
        return info

    def update_state(
        self, run_id: str, checkpoint_id: str, values: dict[str, Any], *, by: str = "operator"
    ) -> Checkpoint:
        """Append a human-edited checkpoint: the state at ``checkpoint_id`` with ``values`` set.

        The new checkpoint's parent is ``checkpoint_id``, so when that is not
        the head the checkpoints after it leave the run's lineage (a new
        branch): on resume their steps run again from the edited state (their
        effects, already recorded, are not repeated). The lease is revoked (the
        running worker, if any, is fenced out) and the run becomes resumable.

        Returns:
            The appended checkpoint (kind ``update``).

        Raises:
            InvalidInputError: ``values`` is not a JSON dict, or the checkpoint is on
                a superseded branch (fork from it instead).
            RunStateError: The run is finished (fork it instead).
            RunNotFoundError, CheckpointNotFoundError: No such run or checkpoint.
            ValueTooLargeError: The resulting state snapshot exceeds the value limit.
        """
        delta = to_json_dict(values, field="values")
        target = self.get_checkpoint(run_id, checkpoint_id)
        base_values = self._values_at(run_id, target.seq)
        space = keys.run_space(self._tenant, run_id)
        made: list[Checkpoint] = []

        def build(info: RunInfo, now: datetime) -> Txn | RunInfo:
            made.clear()
            if info.status.finished:
                raise RunStateError(
                    f"run {run_id!r} is {info.status.value}: fork it to edit its state"
                )
            if not info.in_lineage(target.seq):
                raise InvalidInputError(
                    f"checkpoint {checkpoint_id!r} is on a superseded branch of run "
                    f"{run_id!r}: fork from it instead",
                    field="checkpoint_id",
                )
            changed: list[JsonValue] = [*sorted(delta)]
            seq = info.head_seq + 1
            key = f"{run_id}/update_state/@{seq}"
            ckpt_id = task_events.checkpoint_id(run_id, seq, key)
            txn = Txn(run_id, info.lease_epoch + 1, info, now)
            ev = txn.add_event(
                EventKind.STATE_UPDATED,
                seq=seq,
                checkpoint_id=ckpt_id,
                parent_id=target.checkpoint_id,
                keys=changed,
                by=by,
            )
            ckpt = Checkpoint(
                checkpoint_id=ckpt_id,
                run_id=run_id,
                seq=seq,
                parent_id=target.checkpoint_id,
                step="update_state",
                input_hash=input_hash(delta, field="values"),
                output=None,
                idempotency_key=key,
                started_at=now,
                created_at=now,
                kind="update",
                state_delta=delta,
                event_seq=ev,
            )
            status = RunStatus.PAUSED if info.status is RunStatus.PAUSED else RunStatus.RESUMABLE
            snap = Snapshot(
                run_id=run_id,
                seq=seq,
                checkpoint_id=ckpt_id,
                event_seq=ev,
                values={**base_values, **delta},
                status=status.value,
                pending_plan_hash=(
                    info.pending_approval.plan_hash if info.pending_approval else None
                ),
                spent_tokens=info.spent_tokens,
                spent_cost=info.spent_cost,
            )
            superseded = list(info.superseded)
            if target.seq < info.head_seq:
                superseded.append((target.seq + 1, info.head_seq))
            entry = IdempotencyEntry(seq=seq, checkpoint_id=ckpt_id, input_hash=ckpt.input_hash)
            txn.puts += [
                Put(space, keys.checkpoint_key(seq), encode(ckpt)),
                Put(space, keys.idempotency_key(key), encode(entry)),
                Put(space, keys.snapshot_key(seq), self._fit(encode(snap))),
            ]
            txn.checks += [
                Check(space, keys.checkpoint_key(seq), None),
                Check(space, keys.idempotency_key(key), None),
            ]
            txn.update.update(
                lease_epoch=info.lease_epoch + 1,
                lease_owner=None,
                lease_expires_at=None,
                status=status,
                head_seq=seq,
                head_checkpoint_id=ckpt_id,
                last_checkpoint_at=now,
                snapshot_event_seq=ev,
                superseded=superseded,
            )
            made.append(ckpt)
            return txn

        self._operate(run_id, build, "update the state of")
        return made[0]

    # -- queries -------------------------------------------------------------------

    def get_run(self, run_id: str) -> RunInfo:
        """The head of a run.

        Raises:
            RunNotFoundError: No such run in this tenant.
            CorruptRecordError: The stored head is not a valid record.
        """
        check_id(run_id, "run_id")
        data = self._read_head(run_id)
        if data is None:
            raise RunNotFoundError(f"no run {run_id!r} in tenant {self._tenant!r}")
        return self._decode_head(run_id, data)

    def latest_checkpoint(self, run_id: str) -> Checkpoint | None:
        """The run's head checkpoint, or ``None`` if it has none yet.

        Raises:
            RunNotFoundError: No such run.
        """
        info = self.get_run(run_id)
        if info.head_seq == 0:
            return None
        ckpt = self._read_checkpoint(run_id, info.head_seq)
        if ckpt is None:
            raise CorruptRecordError(
                f"run {run_id!r} has head_seq {info.head_seq} but no checkpoint at "
                f"{keys.run_space(self._tenant, run_id)}/{keys.checkpoint_key(info.head_seq)}"
            )
        return ckpt

    def history(
        self, run_id: str, *, limit: int | None = None, after_seq: int | None = None
    ) -> list[Checkpoint]:
        """Checkpoints of a run in sequence order (every branch; see ``RunInfo.superseded``).

        Args:
            run_id: The run.
            limit: At most this many (``None``: all).
            after_seq: Only checkpoints with a larger seq (for paging).

        Raises:
            RunNotFoundError: No such run.
            InvalidInputError: Negative ``limit`` or ``after_seq``.
        """
        _check_paging(limit, after_seq)
        self.get_run(run_id)
        space = keys.run_space(self._tenant, run_id)
        start = keys.checkpoint_key(after_seq) if after_seq else None
        items = self._kv.scan(space, prefix=keys.CHECKPOINT_PREFIX, start_after=start, limit=limit)
        return [self._decode_checkpoint(run_id, key, data) for key, data in items]

    def events(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """The run's event log in seq order (from ``compacted_through + 1`` after a compaction).

        Raises:
            RunNotFoundError: No such run.
            InvalidInputError: Negative ``limit`` or ``after_seq``.
        """
        _check_paging(limit, after_seq)
        self.get_run(run_id)
        space = keys.run_space(self._tenant, run_id)
        start = keys.event_key(after_seq) if after_seq else None
        items = self._kv.scan(space, prefix=keys.EVENT_PREFIX, start_after=start, limit=limit)
        return [decode(Event, data, where=f"{space}/{key}") for key, data in items]

    def effects(self, run_id: str) -> list[EffectRecord]:
        """The run's effect ledger, by idempotency key.

        Raises:
            RunNotFoundError: No such run.
        """
        self.get_run(run_id)
        return self._effect_records(run_id)

    def unknown_effects(self, run_id: str) -> list[EffectRecord]:
        """Effects invoked but never recorded: what blocks the run until reconciled."""
        return [r for r in self.effects(run_id) if r.status is EffectStatus.INVOKED]

    def get_checkpoint(self, run_id: str, checkpoint_id: str) -> Checkpoint:
        """One checkpoint of a run by its id.

        Raises:
            RunNotFoundError: No such run.
            CheckpointNotFoundError: The run has no checkpoint with that id.
        """
        self.get_run(run_id)
        seq = seq_of_checkpoint_id(checkpoint_id)
        ckpt = self._read_checkpoint(run_id, seq) if seq else None
        if ckpt is None or ckpt.checkpoint_id != checkpoint_id:
            raise CheckpointNotFoundError(f"run {run_id!r} has no checkpoint {checkpoint_id!r}")
        return ckpt

    def list_runs(
        self, user_id: str | None = None, status: RunStatus | str | None = None
    ) -> list[RunInfo]:
        """Runs of this tenant, oldest first, optionally only one user's or one status.

        Raises:
            InvalidInputError: Bad ``user_id`` or unknown ``status``.
        """
        if user_id is not None:
            check_id(user_id, "user_id")
        wanted: RunStatus | None = None
        if status is not None:
            try:
                wanted = RunStatus(status)
            except ValueError as exc:
                choices = ", ".join(s.value for s in RunStatus)
                raise InvalidInputError(
                    f"unknown run status {status!r}: use one of {choices}", field="status"
                ) from exc
        runs = [
            decode(RunInfo, data, where=f"{self._runs}/{key}")
            for key, data in self._kv.scan(self._runs)
        ]
        runs = [
            r
            for r in runs
            if (user_id is None or r.user_id == user_id) and (wanted is None or r.status is wanted)
        ]
        runs.sort(key=lambda r: (r.created_at, r.run_id))
        return runs

    def list_resumable(self, *, now: datetime | None = None) -> list[RunInfo]:
        """Runs a worker pool should pick up: not finished, not paused, no live lease.

        That is runs released by their worker, runs whose lease expired (the
        worker died or stopped heartbeating), and runs whose lease has no TTL.
        Oldest last checkpoint first. Take one with :meth:`acquire`.
        """
        at = self._now() if now is None else now
        runs = [
            r
            for r in self.list_runs()
            if not r.status.finished and r.status is not RunStatus.PAUSED and not r.lease_live(at)
        ]
        runs.sort(key=lambda r: (r.last_checkpoint_at or r.created_at, r.run_id))
        return runs

    def rebuild(self, run_id: str) -> RebuiltRun:
        """Fold the run's state from its latest snapshot and the event log's tail.

        The head (``RunInfo``) is this fold kept up to date in every commit;
        this recomputes it from the log, for audits and consistency checks.

        Raises:
            RunNotFoundError: No such run.
        """
        info = self.get_run(run_id)
        space = keys.run_space(self._tenant, run_id)
        snaps = self._kv.scan(space, prefix=keys.SNAPSHOT_PREFIX)
        latest: Snapshot | None = None
        for key, raw in snaps:
            snap = decode(Snapshot, raw, where=f"{space}/{key}")
            if latest is None or snap.event_seq > latest.event_seq:
                latest = snap
        status = RunStatus.RUNNING
        head_seq, head_id, spent_tokens, spent_cost = 0, None, 0, 0.0
        values: dict[str, JsonValue] = {}
        after = 0
        if latest is not None:
            status = RunStatus(latest.status)
            head_seq, head_id = latest.seq, latest.checkpoint_id
            spent_tokens, spent_cost = latest.spent_tokens, latest.spent_cost
            values = dict(latest.values)
            after = latest.event_seq
        pending: str | None = None if latest is None else latest.pending_plan_hash
        if after < info.compacted_through:
            raise CorruptRecordError(
                f"run {run_id!r}: events up to {info.compacted_through} were compacted but the "
                f"latest snapshot is at event {after}"
            )
        tail = self.events(run_id, after_seq=after)
        handle_kinds = {
            EventKind.STEP_STARTED,
            EventKind.STEP_COMMITTED,
            EventKind.EFFECT_INVOKED,
            EventKind.EFFECT_RECORDED,
            EventKind.EFFECT_NOT_DONE,
            EventKind.EFFECT_OUTCOME_UNKNOWN,
            EventKind.BUDGET_DEBITED,
            EventKind.COMPENSATED,
        }
        for event in tail:
            kind, data = event.kind, event.data
            by_worker = kind in handle_kinds and data.get("source") != "operator"
            if by_worker and status is RunStatus.RESUMABLE:
                status = RunStatus.RUNNING
            if kind is EventKind.STEP_COMMITTED:
                seq = int(str(data["seq"]))
                ckpt = self._read_checkpoint(run_id, seq)
                if ckpt is None:
                    raise CorruptRecordError(
                        f"run {run_id!r}: event {event.seq} names no checkpoint"
                    )
                head_seq, head_id = seq, ckpt.checkpoint_id
                if ckpt.state_delta:
                    values.update(ckpt.state_delta)
            elif kind is EventKind.STATE_UPDATED:
                seq = int(str(data["seq"]))
                head_seq, head_id = seq, str(data["checkpoint_id"])
                values = self._values_at(run_id, seq)
                if status is not RunStatus.PAUSED:
                    status = RunStatus.RESUMABLE
            elif kind is EventKind.BUDGET_DEBITED:
                spent_tokens = int(str(data["spent_tokens"]))
                spent_cost = float(str(data["spent_cost"]))
            elif kind in (EventKind.RUN_STARTED, EventKind.RUN_RESUMED):
                if status is not RunStatus.PAUSED:
                    status = RunStatus.RUNNING
            elif kind is EventKind.RUN_FORKED:
                status = RunStatus.RESUMABLE
            elif kind is EventKind.APPROVAL_REQUESTED:
                pending = str(data["plan_hash"])
            elif kind is EventKind.RUN_PAUSED:
                status = RunStatus.PAUSED
            elif kind in (EventKind.APPROVAL_GRANTED, EventKind.APPROVAL_REJECTED):
                pending, status = None, RunStatus.RESUMABLE
            elif kind is EventKind.RUN_RELEASED:
                if status is RunStatus.RUNNING:
                    status = RunStatus.RESUMABLE
            elif kind is EventKind.RUN_COMPLETED:
                status = RunStatus.COMPLETED
            elif kind is EventKind.RUN_FAILED:
                status = RunStatus.FAILED
            elif kind is EventKind.RUN_CANCELLED:
                status = RunStatus.CANCELLED
        return RebuiltRun(
            status=status,
            head_seq=head_seq,
            head_checkpoint_id=head_id,
            event_seq=tail[-1].seq if tail else after,
            spent_tokens=spent_tokens,
            spent_cost=spent_cost,
            pending_plan_hash=pending,
            values=values,
            events_read=len(tail),
        )

    # -- retention -----------------------------------------------------------------

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

    # -- storage helpers (shared with RunHandle) -------------------------------------

    def _apply(self, txn: Txn, head: bytes | None) -> tuple[RunInfo, bytes]:
        """Commit ``txn`` if the head still holds exactly ``head`` (``None``: absent)."""
        space = keys.run_space(self._tenant, txn.run_id)
        new_info = txn.head()
        new_head = encode(new_info)
        writes: list[Write] = list(txn.puts)
        writes += [Put(space, keys.event_key(e.seq), encode(e)) for e in txn.events]
        writes.append(Put(self._runs, txn.run_id, new_head))
        self._kv.commit(writes, [*txn.checks, Check(self._runs, txn.run_id, head)])
        return new_info, new_head

    def _fit(self, data: bytes) -> bytes:
        if len(data) > self._kv.max_value_bytes:
            raise ValueTooLargeError(
                f"the run's state snapshot is {len(data)} bytes, over the store's limit of "
                f"{self._kv.max_value_bytes}: keep large values elsewhere and store references",
                field="values",
            )
        return data

    def _read_head(self, run_id: str) -> bytes | None:
        (data,) = self._kv.get_many(self._runs, [run_id])
        return data

    def _decode_head(self, run_id: str, data: bytes) -> RunInfo:
        info = decode(RunInfo, data, where=f"{self._runs}/{run_id}")
        if info.run_id != run_id:
            raise CorruptRecordError(
                f"stored RunInfo at {self._runs}/{run_id} names another run {info.run_id!r}"
            )
        return info

    def _read_checkpoint(self, run_id: str, seq: int) -> Checkpoint | None:
        key = keys.checkpoint_key(seq)
        (data,) = self._kv.get_many(keys.run_space(self._tenant, run_id), [key])
        return None if data is None else self._decode_checkpoint(run_id, key, data)

    def _decode_checkpoint(self, run_id: str, key: str, data: bytes) -> Checkpoint:
        where = f"{keys.run_space(self._tenant, run_id)}/{key}"
        ckpt = decode(Checkpoint, data, where=where)
        if ckpt.run_id != run_id or keys.checkpoint_key(ckpt.seq) != key:
            raise CorruptRecordError(
                f"stored Checkpoint at {where} is for run {ckpt.run_id!r} seq {ckpt.seq}"
            )
        return ckpt

    def _lookup(
        self, run_id: str, key: str, info: RunInfo
    ) -> tuple[Checkpoint | None, bytes | None]:
        """The checkpoint on the run's current branch that committed ``key``, and the index bytes.

        An entry pointing to a superseded checkpoint gives ``(None, bytes)``: the
        step runs again and its new checkpoint replaces the entry.
        """
        space = keys.run_space(self._tenant, run_id)
        index_key = keys.idempotency_key(key)
        (data,) = self._kv.get_many(space, [index_key])
        if data is None:
            return None, None
        entry = decode(IdempotencyEntry, data, where=f"{space}/{index_key}")
        if not info.in_lineage(entry.seq):
            return None, data
        ckpt = self._read_checkpoint(run_id, entry.seq)
        if ckpt is None or ckpt.checkpoint_id != entry.checkpoint_id:
            raise CorruptRecordError(
                f"idempotency entry {space}/{index_key} points to checkpoint "
                f"{entry.checkpoint_id!r} (seq {entry.seq}), which is not stored"
            )
        return ckpt, data

    def _read_effect(self, run_id: str, key: str) -> tuple[EffectRecord | None, bytes | None]:
        data = self._read_effect_bytes(run_id, key)
        if data is None:
            return None, None
        where = f"{keys.run_space(self._tenant, run_id)}/{keys.effect_key(key)}"
        return decode(EffectRecord, data, where=where), data

    def _read_effect_bytes(self, run_id: str, key: str) -> bytes | None:
        space = keys.run_space(self._tenant, run_id)
        (data,) = self._kv.get_many(space, [keys.effect_key(key)])
        return data

    def _effect_records(self, run_id: str) -> list[EffectRecord]:
        space = keys.run_space(self._tenant, run_id)
        return [
            decode(EffectRecord, data, where=f"{space}/{key}")
            for key, data in self._kv.scan(space, prefix=keys.EFFECT_PREFIX)
        ]

    def _values_at(self, run_id: str, seq: int) -> dict[str, JsonValue]:
        """State values as of checkpoint ``seq``: latest snapshot at or before it + the deltas after.

        Every branch root has a snapshot, so the checkpoints between the
        snapshot and ``seq`` are one linear stretch of the same branch.
        """
        if seq <= 0:
            return {}
        space = keys.run_space(self._tenant, run_id)
        found = self._kv.scan(
            space,
            prefix=keys.SNAPSHOT_PREFIX,
            start_after=keys.snapshot_key(seq + 1),
            reverse=True,
            limit=1,
        )
        values: dict[str, JsonValue] = {}
        base = 0
        if found:
            key, data = found[0]
            snap = decode(Snapshot, data, where=f"{space}/{key}")
            values, base = dict(snap.values), snap.seq
        if base < seq:
            for key, data in self._kv.scan(
                space,
                prefix=keys.CHECKPOINT_PREFIX,
                start_after=keys.checkpoint_key(base),
                limit=seq - base,
            ):
                ckpt = self._decode_checkpoint(run_id, key, data)
                if ckpt.state_delta:
                    values.update(ckpt.state_delta)
        return values


def _check_paging(limit: int | None, after_seq: int | None) -> None:
    for name, value in (("limit", limit), ("after_seq", after_seq)):
        if value is not None and (
            isinstance(value, bool) or not isinstance(value, int) or value < 0
        ):
            raise InvalidInputError(f"{name} must be an integer >= 0", field=name)
