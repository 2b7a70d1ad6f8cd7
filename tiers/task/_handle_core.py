"""The state and write path of a :class:`~tiers.task._handle.RunHandle`, shared by its feature mixins."""

from __future__ import annotations

import threading
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import JsonValue, ValidationError

from tiers import cas, keys
from tiers.backends.base import Check, Put
from tiers.codec import encode
from tiers.errors import (
    ApprovalPendingError,
    BudgetExceededError,
    ConflictError,
    InputMismatchError,
    InvalidInputError,
    RunCancelledError,
    RunNotFoundError,
    RunPausedError,
    RunStateError,
    StaleWriterError,
)
from tiers.models import Checkpoint, RunInfo, RunStatus
from tiers.task._records import (
    EventKind,
    IdempotencyEntry,
    Snapshot,
    checkpoint_id,
)
from tiers.task._storage import TierCore
from tiers.task._txn import Txn, check_fits

__all__ = ["COMPENSATABLE", "HandleCore"]

# Finished statuses whose recorded effects may still be compensated (a completed run keeps them).
COMPENSATABLE = (RunStatus.CANCELLED, RunStatus.FAILED)


@dataclass
class _ActiveStep:
    name: str
    key: str
    started_at: datetime
    started_written: bool = False
    effect_counts: dict[str, int] = field(default_factory=dict)


class HandleCore:
    """A worker's lease on one run: state, checks and the commit path (see ``RunHandle``)."""

    def __init__(
        self,
        tier: TierCore,
        info: RunInfo,
        head: bytes,
        *,
        lease_ttl: float | None = None,
        resumed: bool = False,
        compensation_only: bool = False,
    ) -> None:
        self._tier = tier
        self._info = info
        self._head = head
        self._epoch = info.lease_epoch
        # Who took the lease this handle holds (the run's lease owner then).
        self._worker_id = info.lease_owner
        self._lease_ttl = lease_ttl
        self._occurrences: dict[str, int] = {}
        self._active: _ActiveStep | None = None
        self._in_effect = False
        # The run's state values, loaded lazily (snapshot + at most K checkpoints).
        self._values: dict[str, JsonValue] | None = None if resumed else {}
        self._compensations: dict[str, Callable[[JsonValue], object]] = {}
        self._lock = threading.RLock()
        # True while only this handle has written to the run since it created it:
        # then a key it did not commit itself cannot be committed, and the
        # replay lookup (one read per step) is skipped.
        self._fresh = not resumed
        self._own_keys: set[str] = set()
        self._resumed = resumed
        # A handle taken with TaskTier.acquire(..., for_compensation=True): compensate() only.
        self._compensation_only = compensation_only

    @property
    def run_id(self) -> str:
        """The run this handle writes to."""
        return self._info.run_id

    @property
    def user_id(self) -> str:
        """Owner of the run."""
        return self._info.user_id

    @property
    def epoch(self) -> int:
        """The lease epoch this handle holds (its fencing token)."""
        return self._epoch

    @property
    def worker_id(self) -> str | None:
        """The worker id this handle's lease was taken as (``None`` for a released run attached).

        Pass it as ``worker_id`` to ``start_run``/``acquire`` to retake this
        lease while it is live; any other caller needs ``steal=True``.
        """
        return self._worker_id

    @property
    def info(self) -> RunInfo:
        """The run's head as this handle last read or wrote it."""
        return self._info

    @property
    def resumed(self) -> bool:
        """Whether the run existed before this handle was made (``False``: this handle created it)."""
        return self._resumed

    @property
    def state(self) -> dict[str, JsonValue]:
        """The run's state values at its head (a copy): every ``state`` delta merged in order.

        Loaded on first use from the latest snapshot plus the checkpoints after
        it, so its cost does not grow with the run's length.
        """
        with self._lock:
            return dict(self._load_values())

    def latest_scope(self) -> dict[str, JsonValue] | None:
        """The newest scope snapshot on the run's current branch (see ``TaskTier.latest_scope``).

        A resumed worker restores its scopes from it before replaying:
        ``ScopeManager.restore(run.latest_scope())``. Replayed steps do not
        call their functions, so the scopes stay as the last committed step
        left them.
        """
        return self._tier.latest_scope(self.run_id)

    def force_flush(self) -> None:
        """Block until everything this run (and the store) acknowledged is durable.

        See :meth:`TaskTier.force_flush`; :meth:`effect` calls it before
        invoking an effect.

        Raises:
            BackendUnavailableError: The store is closed or the flush failed.
        """
        self._tier.force_flush()

    def _read_fresh(self) -> RunInfo:
        data = self._tier._read_head(self.run_id)
        if data is None:
            raise RunNotFoundError(f"run {self.run_id!r} no longer exists")
        if data == self._head:
            return self._info
        # Someone else wrote (another worker, an operator, an attached handle).
        self._fresh = False
        info = self._tier._decode_head(self.run_id, data)
        if info.incarnation != self._info.incarnation:
            # Deleted, then started again under the same id: epochs restart at 1, so
            # only the incarnation tells the new run from the one this handle leased.
            raise RunNotFoundError(
                f"run {self.run_id!r} was deleted and a new run has its id since: stop using "
                "this handle; nothing was written"
            )
        if (info.head_seq, info.head_checkpoint_id) != (
            self._info.head_seq,
            self._info.head_checkpoint_id,
        ):
            self._values = None  # someone appended a checkpoint: reload the state on use
        self._info, self._head = info, data
        return info

    def _refresh(self, *, allow_paused: bool = False, compensating: bool = False) -> RunInfo:
        """Re-read the head and refuse early if this handle may not write now.

        The commit re-checks these exact bytes, so a change between this read
        and the commit is still caught.
        """
        with self._lock:
            info = self._read_fresh()
            self._check_writable(info, allow_paused=allow_paused, compensating=compensating)
            return info

    def _check_lease(self, info: RunInfo) -> None:
        if info.lease_epoch != self._epoch:
            raise StaleWriterError(
                f"run {self.run_id!r} was taken over by another worker (lease epoch "
                f"{info.lease_epoch}, this handle holds {self._epoch}): stop using this "
                "handle; nothing was written"
            )

    def _check_writable(
        self, info: RunInfo, *, allow_paused: bool = False, compensating: bool = False
    ) -> None:
        """Refuse unless this handle may write now; ``compensating`` also admits a cancelled or failed run."""
        self._check_lease(info)
        if self._compensation_only and not compensating:
            raise RunStateError(
                f"this handle on run {self.run_id!r} was acquired for compensation: it only "
                "runs compensate() (and heartbeat/release); the run itself cannot go on"
            )
        if compensating and info.status in COMPENSATABLE:
            return
        if info.status is RunStatus.CANCELLED:
            raise RunCancelledError(
                f"run {self.run_id!r} was cancelled: stop at this step boundary; nothing "
                "more can be added (compensate() may still undo its effects)"
            )
        if info.status.finished:
            raise RunStateError(
                f"run {self.run_id!r} is {info.status.value}: no more checkpoints can be added"
            )
        if info.status is RunStatus.PAUSED and not allow_paused:
            pending = info.pending_approval
            if pending is not None:
                raise self._pending(pending.plan_hash, pending.key)
            raise RunPausedError(f"run {self.run_id!r} is paused: resume it first")

    def _check_budget(self, info: RunInfo) -> None:
        over = []
        if info.budget_tokens is not None and info.spent_tokens >= info.budget_tokens:
            over.append(f"{info.spent_tokens} of {info.budget_tokens} tokens")
        if info.budget_cost is not None and info.spent_cost >= info.budget_cost:
            over.append(f"{info.spent_cost:g} of {info.budget_cost:g} cost")
        if over:
            raise BudgetExceededError(
                f"run {self.run_id!r} has spent its budget ({', '.join(over)}): no new step "
                "may start; raise the budget with TaskTier.set_budget, or finish the run"
            )

    def _pending(self, plan_hash: str, gate: str) -> ApprovalPendingError:
        return ApprovalPendingError(
            f"run {self.run_id!r} is paused awaiting approval of plan {plan_hash[:12]}... "
            f"(gate {gate!r}): stop this worker; approve or reject it with "
            "TaskTier.approve/reject, then resume the run",
            run_id=self.run_id,
            plan_hash=plan_hash,
            approval_key=gate,
        )

    def _refuse_nesting(self, what: str) -> None:
        if self._in_effect:
            raise InvalidInputError(
                f"{what!r} called inside an effect's function: effects and steps cannot be "
                "nested in an effect",
                field="step",
            )
        if self._active is not None:
            raise InvalidInputError(
                f"step {what!r} called while step {self._active.name!r} is running on this "
                "handle: steps cannot be nested, and a handle is used by one thread at a time",
                field="step",
            )

    def _lookup(self, key: str, info: RunInfo) -> tuple[Checkpoint | None, bytes | None]:
        if self._fresh and key not in self._own_keys:
            return None, None
        return self._tier._lookup(self.run_id, key, info)

    def _verify_replay(self, ckpt: Checkpoint, step: str, digest: str, key: str) -> None:
        if ckpt.step != step:
            raise InputMismatchError(
                f"idempotency key {key!r} of run {self.run_id!r} was committed by step "
                f"{ckpt.step!r} (seq {ckpt.seq}), not by step {step!r}: use another key",
                step=step,
                idempotency_key=key,
            )
        if ckpt.input_hash != digest:
            raise InputMismatchError(
                f"step {step!r} of run {self.run_id!r} is replayed with a different input than "
                f"the one recorded at seq {ckpt.seq} (idempotency key {key!r}): make the "
                "step's input deterministic, or give a changed step a new name or key",
                step=step,
                idempotency_key=key,
            )

    def _txn(self) -> Txn:
        """A transaction on the head this handle holds; every commit renews the lease."""
        info = self._info
        txn = Txn(self.run_id, self._epoch, info, self._tier._now())
        if self._lease_ttl is not None and info.lease_owner is not None:
            txn.update.lease_expires_at = txn.now + timedelta(seconds=self._lease_ttl)
        return txn

    def _commit(
        self,
        build: Callable[[], Txn],
        step: str | None,
        recheck: Callable[[RunInfo], None] | None = None,
    ) -> RunInfo:
        """Commit the transaction ``build()`` makes from this handle's head.

        The commit checks the head's exact bytes. When they changed under a
        new lease epoch (a takeover), this handle is fenced: it raises
        :class:`StaleWriterError` and writes nothing. When they changed under
        the *same* epoch (an operator's ``set_budget``, ``compact``,
        ``resolve_effect``, ``approve``, ``cancel``, or an attached handle), the
        work done since (a step's output, an effect's result) is not thrown
        away: if ``recheck(fresh head)`` still allows the write (default: the
        run is writable), the transaction is rebuilt on the fresh head and
        committed again, a bounded number of times with backoff. ``build``
        must read from the store whatever else it checks, so a rebuild sees it
        fresh.

        Raises:
            StaleWriterError: The run was taken over; nothing was written.
            ConflictError: Another user of this lease wrote the same key (an index
                or ledger entry), or the run kept changing; nothing was written.
            RunStateError: (from ``recheck``) The run no longer takes this write.
        """
        check = self._check_writable if recheck is None else recheck
        with self._lock:
            for attempt in range(cas.ATTEMPTS):
                values = self._values
                txn = build()
                try:
                    new_info, new_head = self._tier._apply(txn, self._head)
                except ConflictError as exc:
                    self._values = values  # the delta built into txn was not committed
                    held = self._head
                    fresh = self._read_fresh()
                    if self._head == held:
                        raise self._conflict(step) from exc
                    self._check_lease(fresh)
                    check(fresh)
                    cas.backoff(attempt)
                    continue
                self._info, self._head = new_info, new_head
                return new_info
        what = f"step {step!r}" if step is not None else "status change"
        raise ConflictError(
            f"{what} of run {self.run_id!r}: the run changed {cas.ATTEMPTS} times while this "
            "handle committed; nothing was written: retry"
        )

    def _conflict(self, step: str | None) -> ConflictError:
        """Why a commit failed although the head held: another check of it failed."""
        what = f"step {step!r}" if step is not None else "status change"
        return ConflictError(
            f"{what} of run {self.run_id!r}: another user of this lease (same epoch "
            f"{self._epoch}: another thread or an attached handle) wrote the same key "
            "first; nothing was written. Use one handle per thread, then retry"
        )

    def _add_checkpoint(
        self,
        txn: Txn,
        step: str,
        key: str,
        digest: str,
        output: JsonValue,
        scope: dict[str, Any] | None,
        started_at: datetime,
        kind: str,
        delta: dict[str, JsonValue] | None,
        entry: bytes | None,
    ) -> Checkpoint:
        tier = self._tier
        # Redacted before it is stored, and what the step returns is what was stored, so
        # the first execution and every replay see the same output (digest: the original's).
        redact = tier.redactor.redact_json
        output = redact(output)
        if scope is not None:
            scope = redact(scope)
        if delta is not None:
            delta = redact(delta)
        info = txn.base
        seq = info.head_seq + 1
        ckpt_id = checkpoint_id(self.run_id, seq, key)
        event_seq = txn.add_event(
            EventKind.STEP_COMMITTED, step=step, seq=seq, checkpoint_id=ckpt_id, key=key, kind=kind
        )
        try:
            ckpt = Checkpoint(
                checkpoint_id=ckpt_id,
                run_id=self.run_id,
                seq=seq,
                parent_id=info.head_checkpoint_id,
                step=step,
                input_hash=digest,
                output=output,
                idempotency_key=key,
                scope=scope,
                started_at=started_at,
                created_at=txn.now,
                kind=kind,
                state_delta=delta,
                event_seq=event_seq,
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(p) for p in first["loc"]) or "output"
            raise InvalidInputError(
                f"step {step!r}: invalid checkpoint: {where}: {first['msg']}", field=where
            ) from exc
        data = encode(ckpt)
        check_fits(tier._kv.max_value_bytes, data, f"checkpoint of step {step!r}", "output")
        space = keys.run_space(tier.tenant, self.run_id)
        ckpt_key = keys.checkpoint_key(seq)
        index_key = keys.idempotency_key(key)
        index = IdempotencyEntry(seq=seq, checkpoint_id=ckpt_id, input_hash=digest)
        txn.puts += [Put(space, ckpt_key, data), Put(space, index_key, encode(index))]
        txn.checks += [Check(space, ckpt_key, None), Check(space, index_key, entry)]
        txn.update.head_seq = seq
        txn.update.head_checkpoint_id = ckpt_id
        txn.update.last_checkpoint_at = txn.now
        self._own_keys.add(key)
        if delta:
            values = self._load_values() if self._values is None else self._values
            self._values = {**values, **delta}
        new_event_seq = info.event_seq + len(txn.events)
        if new_event_seq - info.snapshot_event_seq >= tier.snapshot_every:
            values = self._load_values() if self._values is None else self._values
            current = txn.head()
            snap = Snapshot(
                run_id=self.run_id,
                seq=seq,
                checkpoint_id=ckpt_id,
                event_seq=event_seq,
                values=values,
                status=current.status.value,
                spent_tokens=current.spent_tokens,
                spent_cost=current.spent_cost,
                unknown_effects=current.unknown_effects,
            )
            snap_data = encode(snap)
            if len(snap_data) <= tier._kv.max_value_bytes:
                # A state too large for one value is folded from checkpoints instead.
                txn.puts.append(Put(space, keys.snapshot_key(seq), snap_data))
                txn.update.snapshot_event_seq = event_seq
        return ckpt

    def _add_debit(self, txn: Txn, tokens: int, cost: float, key: str) -> None:
        if not tokens and not cost:
            return
        spent_tokens = txn.base.spent_tokens + tokens
        spent_cost = txn.base.spent_cost + cost
        txn.add_event(
            EventKind.BUDGET_DEBITED,
            key=key,
            tokens=tokens,
            cost=cost,
            spent_tokens=spent_tokens,
            spent_cost=spent_cost,
        )
        txn.update.spent_tokens = spent_tokens
        txn.update.spent_cost = spent_cost

    def _finish(
        self, kind: EventKind, *, result: JsonValue = None, error: str | None = None
    ) -> RunInfo:
        """Complete (``RunCompleted`` with ``result``) or fail (``RunFailed`` with ``error``) the run."""
        self._refuse_nesting("failed" if kind is EventKind.RUN_FAILED else "completed")

        def build() -> Txn:
            txn = self._txn()
            if kind is EventKind.RUN_FAILED:
                txn.add_event(kind, error=error)
                txn.update.error = error
            else:
                txn.add_event(kind)
                txn.update.result = result
            txn.update.finished_at = txn.now
            txn.update.lease_owner = None
            txn.update.lease_expires_at = None
            head = encode(txn.head())
            check_fits(
                self._tier._kv.max_value_bytes,
                head,
                f"run {self.run_id!r} with its result",
                "result",
            )
            return txn

        with self._lock:
            self._refresh()
            return self._commit(build, None)

    def _load_values(self) -> dict[str, JsonValue]:
        if self._values is None:
            self._values = self._tier._values_at(self.run_id, self._info.head_seq)
        return self._values
