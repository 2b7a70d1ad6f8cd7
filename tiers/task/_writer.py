"""How a worker's write to a run is committed: the lease a handle holds, its checks, the commit.

:class:`RunWriter` is the state of one :class:`~tiers.task.RunHandle` (the head it
last read or wrote, its lease epoch, the step running) and the one path its
writes take: :meth:`RunWriter.txn` starts a transaction on the held head,
:meth:`RunWriter.add_checkpoint` / :meth:`RunWriter.add_debit` add a step's
checkpoint and its budget debit, and :meth:`RunWriter.commit` commits it with
:meth:`~tiers.task._store.RunStore.apply`, rebuilding it on a fresh head when an
operator changed the run meanwhile. The handle's steps, effects
(:mod:`tiers.task._effects`), compensations and approval gates all write through it.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import Any

from pydantic import JsonValue

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
from tiers.redaction import redact_dumped_json
from tiers.task._checkpoint_encode import CheckpointFields, build_checkpoint, index_entry_bytes
from tiers.task._records import (
    EventKind,
    Snapshot,
    checkpoint_id,
)
from tiers.task._store import RunStore
from tiers.task._txn import Txn, check_fits

__all__ = ["COMPENSATABLE", "OPEN_STATUSES", "ActiveStep", "RunWriter"]

# Finished statuses whose recorded effects may still be compensated (a completed run keeps them).
COMPENSATABLE = (RunStatus.CANCELLED, RunStatus.FAILED)
# Statuses every write is allowed in (check_writable refuses nothing else of them).
OPEN_STATUSES = frozenset((RunStatus.RUNNING, RunStatus.RESUMABLE))


@dataclass
class ActiveStep:
    """The step a handle is running: its key, and whether its ``StepStarted`` is written."""

    name: str
    key: str
    started_at: datetime
    started_written: bool = False
    effect_counts: dict[str, int] = field(default_factory=dict)


class RunWriter:
    """A worker's lease on one run: the head it holds, the checks of a write, the commit path.

    Args:
        store: The tier's storage core.
        info: The run's head as the lease was taken (or attached).
        head: Its exact bytes, which the next commit checks.
        lease_ttl: Seconds every commit renews the lease by (``None``: no expiry).
        resumed: Whether the run existed before (``False``: this handle created it).
        compensation_only: The lease was taken for :meth:`RunHandle.compensate` only.
    """

    def __init__(
        self,
        store: RunStore,
        info: RunInfo,
        head: bytes,
        *,
        lease_ttl: float | None = None,
        resumed: bool = False,
        compensation_only: bool = False,
    ) -> None:
        self.store = store
        self.info = info
        self.head = head
        # The run this handle writes to (read several times a step; the head it holds
        # always names this run).
        self.run_id = info.run_id
        self.epoch = info.lease_epoch
        # Who took the lease this handle holds (the run's lease owner then).
        self.worker_id = info.lease_owner
        self.lease_ttl = lease_ttl
        # Completed calls per step name (and per top-level effect or gate): the default keys' n.
        self.occurrences: dict[str, int] = {}
        self.active: ActiveStep | None = None
        self.in_effect = False
        # The run's state values, loaded lazily (snapshot + at most K checkpoints).
        self.values: dict[str, JsonValue] | None = None if resumed else {}
        self.lock = threading.RLock()
        # Every key of the run's idempotency index as of the head this handle holds, while
        # that is known: then a key not in it is not committed, and the replay lookup (one
        # read per step) is skipped. Known while only this handle wrote since it created the
        # run, or since a resumed handle read the index once (a run of at most
        # INDEX_LOAD_LIMIT checkpoints); unknown (None) for good once anyone else writes.
        self.known_keys: set[str] | None = None if resumed else set()
        self.index_read = not resumed
        self.resumed = resumed
        # A handle taken with TaskTier.acquire(..., for_compensation=True): compensate() only.
        self.compensation_only = compensation_only
        # How long (milliseconds) a step trusts the head this handle last read or wrote
        # instead of reading it again (RunHandle.step), and when (time.monotonic()) that head
        # came back from the store: the lease was just taken or attached from it.
        self.head_fresh_ms = store.head_fresh_ms
        self.head_known_at = time.monotonic()
        # The KV space of the run's checkpoints and index entries (every step writes there).
        self.space = keys.run_space(store.tenant, info.run_id)

    def read_fresh(self) -> RunInfo:
        """Re-read the head; a change by anyone else makes this handle's view (and state) stale."""
        data = self.store.read_head(self.run_id)
        if data is None:
            raise RunNotFoundError(f"run {self.run_id!r} no longer exists")
        self.head_known_at = time.monotonic()
        if data == self.head:
            return self.info
        # Someone else wrote (another worker, an operator, an attached handle).
        self.known_keys = None
        self.index_read = True
        info = self.store.decode_head(self.run_id, data)
        if info.incarnation != self.info.incarnation:
            # Deleted, then started again under the same id: epochs restart at 1, so
            # only the incarnation tells the new run from the one this handle leased.
            raise RunNotFoundError(
                f"run {self.run_id!r} was deleted and a new run has its id since: stop using "
                "this handle; nothing was written"
            )
        if (info.head_seq, info.head_checkpoint_id) != (
            self.info.head_seq,
            self.info.head_checkpoint_id,
        ):
            self.values = None  # someone appended a checkpoint: reload the state on use
        self.info, self.head = info, data
        return info

    def refresh(self, *, allow_paused: bool = False, compensating: bool = False) -> RunInfo:
        """Re-read the head and refuse early if this handle may not write now.

        The commit re-checks these exact bytes, so a change between this read
        and the commit is still caught.
        """
        with self.lock:
            info = self.read_fresh()
            self.check_writable(info, allow_paused=allow_paused, compensating=compensating)
            return info

    def head_is_fresh(self) -> bool:
        """Whether a step may trust the held head without reading it (see ``RunHandle.step``).

        It came back from the store less than ``head_fresh_ms`` ago, and no write
        through this tier's store gave the run another head since.
        """
        age_ms = (time.monotonic() - self.head_known_at) * 1000
        return age_ms < self.head_fresh_ms and (
            self.store.recent_heads.holds(self.run_id, self.head)
        )

    def held(self, data: bytes, info: RunInfo) -> None:
        """Hold ``data`` (decoded: ``info``) as the run's head: this handle just wrote it."""
        self.info, self.head = info, data
        self.head_known_at = time.monotonic()

    def check_lease(self, info: RunInfo) -> None:
        """Refuse (``StaleWriterError``) unless this handle still holds the run's lease epoch."""
        if info.lease_epoch != self.epoch:
            self.store.observer.fenced(self.run_id)
            raise StaleWriterError(
                f"run {self.run_id!r} was taken over by another worker (lease epoch "
                f"{info.lease_epoch}, this handle holds {self.epoch}): stop using this "
                "handle; nothing was written"
            )

    def check_writable(
        self, info: RunInfo, *, allow_paused: bool = False, compensating: bool = False
    ) -> None:
        """Refuse unless this handle may write now; ``compensating`` also admits a cancelled or failed run."""
        self.check_lease(info)
        if self.compensation_only and not compensating:
            raise RunStateError(
                f"this handle on run {self.run_id!r} was acquired for compensation: it only "
                "runs compensate() (and heartbeat/release); the run itself cannot go on"
            )
        if info.status in OPEN_STATUSES:
            return  # the common case, decided by one lookup (once or twice a step)
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
                raise self.pending(pending.plan_hash, pending.key)
            raise RunPausedError(f"run {self.run_id!r} is paused: resume it first")

    def check_budget(self, info: RunInfo) -> None:
        """Refuse a new step or effect (``BudgetExceededError``) once the run's budget is spent."""
        over = []
        if info.budget_tokens is not None and info.spent_tokens >= info.budget_tokens:
            over.append(f"{info.spent_tokens} of {info.budget_tokens} tokens")
        if info.budget_cost is not None and info.spent_cost >= info.budget_cost:
            over.append(f"{info.spent_cost:g} of {info.budget_cost:g} cost")
        if over:
            raise BudgetExceededError(
                f"run {self.run_id!r} has spent its budget ({', '.join(over)}): no new step "
                "may start; raise the budget with Memory.set_budget (TaskTier.set_budget), or "
                "finish the run"
            )

    def pending(self, plan_hash: str, gate: str) -> ApprovalPendingError:
        """The error a write gets while the run waits at approval gate ``gate``."""
        return ApprovalPendingError(
            f"run {self.run_id!r} is paused awaiting approval of plan {plan_hash[:12]}... "
            f"(gate {gate!r}): stop this worker; approve or reject it with "
            "Memory.approve_run/reject_run (TaskTier.approve/reject), then resume the run",
            run_id=self.run_id,
            plan_hash=plan_hash,
            approval_key=gate,
        )

    def refuse_nesting(self, what: str) -> None:
        """Refuse ``what`` inside an effect's function or while a step of this handle runs."""
        if self.in_effect:
            raise InvalidInputError(
                f"{what!r} called inside an effect's function: effects and steps cannot be "
                "nested in an effect",
                field="step",
            )
        if self.active is not None:
            raise InvalidInputError(
                f"step {what!r} called while step {self.active.name!r} is running on this "
                "handle: steps cannot be nested, and a handle is used by one thread at a time",
                field="step",
            )

    def lookup(self, key: str, info: RunInfo) -> tuple[Checkpoint | None, bytes | None]:
        """The checkpoint on the current branch that committed ``key`` (no read for a key known absent).

        ``info`` is the head this handle holds, just read: a resumed handle's
        first lookup reads the run's whole index once (after that head, so it
        holds every key committed up to it), and its later steps skip the read.
        """
        if not self.index_read:
            self.index_read = True
            self.known_keys = self.store.index_keys(self.run_id, info)
        if self.known_keys is not None and key not in self.known_keys:
            return None, None
        return self.store.lookup(self.run_id, key, info)

    def verify_replay(self, ckpt: Checkpoint, step: str, digest: str, key: str) -> None:
        """Refuse a replay of ``key`` by another step name or with another input."""
        if ckpt.step != step:
            self.store.observer.validation_failed(ckpt.kind)
            raise InputMismatchError(
                f"idempotency key {key!r} of run {self.run_id!r} was committed by step "
                f"{ckpt.step!r} (seq {ckpt.seq}), not by step {step!r}: use another key",
                step=step,
                idempotency_key=key,
            )
        if ckpt.input_hash != digest:
            self.store.observer.validation_failed(ckpt.kind)
            raise InputMismatchError(
                f"step {step!r} of run {self.run_id!r} is replayed with a different input than "
                f"the one recorded at seq {ckpt.seq} (idempotency key {key!r}): make the "
                "step's input deterministic, or give a changed step a new name or key",
                step=step,
                idempotency_key=key,
            )
        self.store.observer.replayed(self.run_id, ckpt.kind, key)

    def txn(self) -> Txn:
        """A transaction on the head this handle holds; every commit renews the lease."""
        info = self.info
        txn = Txn(self.run_id, self.epoch, info, self.store.clock())
        if self.lease_ttl is not None and info.lease_owner is not None:
            txn.update.lease_expires_at = txn.now + timedelta(seconds=self.lease_ttl)
        return txn

    def commit(
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
        check = self.check_writable if recheck is None else recheck
        with self.lock:
            for attempt in range(cas.ATTEMPTS):
                values = self.values
                txn = build()
                try:
                    new_info, new_head = self.store.apply(txn, self.head)
                except ConflictError as exc:
                    self.values = values  # the delta built into txn was not committed
                    held = self.head
                    fresh = self.read_fresh()
                    if self.head == held:
                        raise self.conflict(step) from exc
                    self.check_lease(fresh)
                    check(fresh)
                    cas.backoff(attempt)
                    continue
                self.held(new_head, new_info)
                return new_info
        what = f"step {step!r}" if step is not None else "status change"
        raise ConflictError(
            f"{what} of run {self.run_id!r}: the run changed {cas.ATTEMPTS} times while this "
            "handle committed; nothing was written: retry"
        )

    def conflict(self, step: str | None) -> ConflictError:
        """Why a commit failed although the head held: another check of it failed."""
        what = f"step {step!r}" if step is not None else "status change"
        return ConflictError(
            f"{what} of run {self.run_id!r}: another user of this lease (same epoch "
            f"{self.epoch}: another thread or an attached handle) wrote the same key "
            "first; nothing was written. Use one handle per thread, then retry"
        )

    def add_checkpoint(
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
        output_text: bytes | None = None,
    ) -> Checkpoint:
        """Add a step's checkpoint, its ``StepCommitted`` event and index entry (and a snapshot when due) to ``txn``.

        ``output_text`` is ``output``'s JSON text if the caller has it
        (:func:`tiers.codec.to_json_text`): the checkpoint embeds it unless
        redaction changed the output.
        """
        store = self.store
        # Redacted before it is stored, and what the step returns is what was stored, so
        # the first execution and every replay see the same output (digest: the original's).
        redact = store.redactor.redact_json
        redacted = redact_dumped_json(store.redactor, output, output_text)
        if redacted is not output:
            output, output_text = redacted, None  # the text is the unredacted value's
        if scope is not None:
            scope = redact(scope)
        if delta is not None:
            delta = redact(delta)
        info = txn.base
        run_id = info.run_id
        seq = info.head_seq + 1
        ckpt_id = checkpoint_id(run_id, seq, key)
        # Layout 2 keeps the StepCommitted event in the checkpoint: one row fewer per step.
        commit_epoch = txn.epoch if store.layout() >= 2 else None
        add = txn.add_event if commit_epoch is None else txn.hold_event
        event_seq = add(
            EventKind.STEP_COMMITTED, step=step, seq=seq, checkpoint_id=ckpt_id, key=key, kind=kind
        )
        # The output and state delta are JSON values already (to_json, the ledger, a
        # snapshot): validated once there, not walked again here; the rest is checked.
        # The fields in CheckpointFields' order, positionally: its generated __new__ matched
        # 16 keywords in ~1.2 us more (every step builds one).
        ckpt, data = build_checkpoint(
            CheckpointFields(
                ckpt_id,  # checkpoint_id
                run_id,
                seq,
                info.head_checkpoint_id,  # parent_id
                step,
                digest,  # input_hash
                output,
                key,  # idempotency_key
                scope,
                started_at,
                txn.now,  # created_at
                kind,
                delta,  # state_delta
                event_seq,
                commit_epoch,
                output_text,
            ),
            exact_ints=True,  # output_text is to_json_text's (orjson's) or None
        )
        check_fits(store.kv.max_value_bytes, data, f"checkpoint of step {step!r}", "output")
        space = self.space
        ckpt_key = keys.checkpoint_key(seq)
        index_key = keys.idempotency_key(key)
        index = index_entry_bytes(seq, ckpt_id, digest)
        txn.puts += [Put(space, ckpt_key, data), Put(space, index_key, index)]
        txn.checks += [Check(space, ckpt_key, None), Check(space, index_key, entry)]
        txn.update.set_head_checkpoint(seq, ckpt_id, txn.now)
        if self.known_keys is not None:
            self.known_keys.add(key)
        if delta:
            values = self.load_values() if self.values is None else self.values
            self.values = {**values, **delta}
        new_event_seq = info.event_seq + txn.appended
        if new_event_seq - info.snapshot_event_seq >= store.snapshot_every:
            values = self.load_values() if self.values is None else self.values
            current = txn.head()
            snap = Snapshot(
                run_id=run_id,
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
            if len(snap_data) <= store.kv.max_value_bytes:
                # A state too large for one value is folded from checkpoints instead.
                txn.puts.append(Put(space, keys.snapshot_key(seq), snap_data))
                txn.update.snapshot_event_seq = event_seq
        return ckpt

    def add_debit(self, txn: Txn, tokens: int, cost: float, key: str) -> None:
        """Add a ``BudgetDebited`` event and the head's new totals to ``txn`` (nothing for a free step)."""
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

    def finish(
        self, kind: EventKind, *, result: JsonValue = None, error: str | None = None
    ) -> RunInfo:
        """Complete (``RunCompleted`` with ``result``) or fail (``RunFailed`` with ``error``) the run."""
        self.refuse_nesting("failed" if kind is EventKind.RUN_FAILED else "completed")

        def build() -> Txn:
            txn = self.txn()
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
                self.store.kv.max_value_bytes,
                head,
                f"run {self.run_id!r} with its result",
                "result",
            )
            return txn

        with self.lock:
            self.refresh()
            return self.commit(build, None)

    def load_values(self) -> dict[str, JsonValue]:
        """The run's state values at the held head, loaded on first use."""
        if self.values is None:
            self.values = self.store.values_at(self.run_id, self.info.head_seq)
        return self.values
