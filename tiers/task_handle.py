"""A worker's handle on one run: steps, exactly-once effects, approval gates, leases.

See :mod:`tiers.task` for the storage layout and the guarantees. This module
holds :class:`RunHandle` and the transaction builder :class:`Txn` shared with
:class:`~tiers.task.TaskTier`'s operator methods.
"""

from __future__ import annotations

import inspect
import threading
from collections.abc import Awaitable, Callable
from dataclasses import dataclass, field
from datetime import datetime, timedelta
from typing import TYPE_CHECKING, Any

from pydantic import JsonValue, ValidationError

from tiers import keys
from tiers.backends.base import Check, Put, Write
from tiers.codec import decode, encode
from tiers.errors import (
    ApprovalPendingError,
    BudgetExceededError,
    CompensationError,
    ConflictError,
    EffectOutcomeUnknownError,
    InputMismatchError,
    InvalidInputError,
    PlanMismatchError,
    RunCancelledError,
    RunNotFoundError,
    RunPausedError,
    RunStateError,
    StaleWriterError,
    ValueTooLargeError,
)
from tiers.models import MAX_TEXT, Checkpoint, PendingApproval, RunInfo, RunStatus
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
    Snapshot,
    check_key,
    check_name,
    checkpoint_id,
    input_hash,
    output_digest,
    to_json,
    to_json_dict,
)

if TYPE_CHECKING:
    from tiers.task import TaskTier

__all__ = ["RunHandle", "Txn"]

Reconcile = Callable[[str], object]


@dataclass
class Txn:
    """One atomic write to a run: events, extra puts/checks, and the head's new fields.

    Event seqs are assigned in order from the head's ``event_seq``; the head
    check that :meth:`TaskTier._apply` adds makes them gap-free.
    """

    run_id: str
    epoch: int
    base: RunInfo
    now: datetime
    events: list[Event] = field(default_factory=list)
    puts: list[Write] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)
    update: dict[str, Any] = field(default_factory=dict)

    def add_event(self, kind: EventKind, /, **data: JsonValue) -> int:
        """Append an event; returns its seq."""
        seq = self.base.event_seq + len(self.events) + 1
        # Built from values this module already validated: skip pydantic's
        # validation on the hot path (every commit appends events).
        self.events.append(
            Event.model_construct(
                run_id=self.run_id, seq=seq, kind=kind, epoch=self.epoch, at=self.now, data=data
            )
        )
        return seq

    def head(self) -> RunInfo:
        """The head after this transaction."""
        return self.base.model_copy(
            update={
                **self.update,
                "event_seq": self.base.event_seq + len(self.events),
                "updated_at": self.now,
            }
        )


@dataclass
class _ActiveStep:
    name: str
    key: str
    started_at: datetime
    started_written: bool = False
    effect_counts: dict[str, int] = field(default_factory=dict)


@dataclass
class _EffectCall:
    name: str
    key: str
    step_key: str
    top_level: bool
    digest: str
    safe_to_retry: bool
    level: int = 0
    # Top-level effects commit a checkpoint under this step name.
    step_name: str = ""
    kind: str = "effect"
    on_record: Callable[[Txn], None] | None = None


class RunHandle:
    """A worker's lease on one run: the only way to append to it.

    Obtained from :meth:`TaskTier.start_run` (or ``acquire`` / ``attach``).
    Every write is one atomic commit that also checks "the run's head is
    exactly the bytes this handle last read or wrote", so it fails as a whole if
    the run was taken over (:class:`StaleWriterError`), cancelled
    (:class:`RunCancelledError`), paused, finished, or changed by another user
    of the same lease (:class:`ConflictError`).

    One thread drives a handle's steps; :meth:`heartbeat` may be called from
    another thread (a keep-alive loop) at the same time.
    """

    def __init__(
        self,
        tier: TaskTier,
        info: RunInfo,
        head: bytes,
        *,
        lease_ttl: float | None = None,
        resumed: bool = False,
    ) -> None:
        self._tier = tier
        self._info = info
        self._head = head
        self._epoch = info.lease_epoch
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

    # -- properties ------------------------------------------------------------

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
    def info(self) -> RunInfo:
        """The run's head as this handle last read or wrote it."""
        return self._info

    @property
    def state(self) -> dict[str, JsonValue]:
        """The run's state values at its head (a copy): every ``state`` delta merged in order.

        Loaded on first use from the latest snapshot plus the checkpoints after
        it, so its cost does not grow with the run's length.
        """
        with self._lock:
            return dict(self._load_values())

    # -- steps -----------------------------------------------------------------

    def step(
        self,
        name: str,
        fn: Callable[[], object],
        *,
        input: object = None,
        idempotency_key: str | None = None,
        scope: dict[str, Any] | None = None,
    ) -> JsonValue:
        """Run a step once: replay its recorded output if committed, else call ``fn`` and commit.

        The default idempotency key is ``<run_id>/<step name>/<n>``, where ``n``
        counts this handle's earlier completed calls of the same step name: a
        script re-executed after a crash makes the same calls in the same order,
        so each call finds its own checkpoint. A call that raises does not count,
        so a retry of a failed step reuses its key.

        A step with no effect costs one durable commit (checkpoint, event,
        index and head together). Effects called inside ``fn`` (:meth:`effect`)
        are recorded on their own; a step re-executed after a crash replays
        their recorded outputs instead of repeating them.

        Args:
            name: Step name (1-256 characters; surrounding whitespace is dropped).
            fn: Called with no arguments when the step is not committed yet. It
                returns the JSON-serialisable output, or a :class:`Charged` with
                the output, tokens/cost spent and state keys to set.
            input: The step's input, recorded as its SHA-256 (:func:`input_hash`);
                a replay with a different input raises :class:`InputMismatchError`.
            idempotency_key: Explicit key instead of the default one.
            scope: Optional JSON-serialisable snapshot stored with the checkpoint
                (e.g. ``ScopeManager.snapshot()``).

        Returns:
            The step's output after a JSON round trip, identical for the first
            execution and every replay.

        Raises:
            InvalidInputError: Bad name, key, non-JSON input/output/scope, or a step
                called from inside another step or effect of this handle.
            InputMismatchError: The key is committed with another input or step name.
            ValueTooLargeError: The checkpoint would exceed the store's value limit.
            StaleWriterError: The run was taken over by another handle; nothing was written.
            RunCancelledError: The run was cancelled (checked before ``fn`` runs).
            ApprovalPendingError: The run waits at an approval gate.
            BudgetExceededError: The run's budget is spent (checked before ``fn`` runs).
            RunStateError: The run is finished; nothing was written.
            ConflictError: This lease was used concurrently; nothing was written.
            Exception: Whatever ``fn`` raises, unchanged; nothing was written.
        """
        step = check_name(name)
        self._refuse_nesting(step)
        occurrence = self._occurrences.get(step, 0)
        key = (
            f"{self.run_id}/{step}/{occurrence}"
            if idempotency_key is None
            else check_key(idempotency_key)
        )
        digest = input_hash(input, step=step)
        scope_value = None if scope is None else to_json_dict(scope, field="scope", step=step)
        # Replaying a committed step writes nothing, so it is allowed while paused.
        info = self._refresh(allow_paused=True)
        existing, entry = self._lookup(key, info)
        if existing is not None:
            self._verify_replay(existing, step, digest, key)
            self._occurrences[step] = occurrence + 1
            return existing.output
        self._check_writable(info)
        self._check_budget(info)
        active = _ActiveStep(step, key, self._tier._now())
        self._active = active
        try:
            raw = fn()
        finally:
            self._active = None
        output, tokens, cost, delta = _unpack(raw, step)
        with self._lock:
            # A plain step's checkpoint carries started_at; a StepStarted event is
            # written durably only with a step's first effect (one commit per step).
            txn = self._txn()
            self._add_debit(txn, tokens, cost, key)
            ckpt = self._add_checkpoint(
                txn, step, key, digest, output, scope_value, active.started_at, "step", delta, entry
            )
            self._apply(txn, step)
        self._occurrences[step] = occurrence + 1
        return ckpt.output

    def append_checkpoint(
        self,
        step: str,
        output: object,
        *,
        input: object = None,
        idempotency_key: str | None = None,
        scope: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
    ) -> Checkpoint:
        """Commit the checkpoint of a step the caller executed itself.

        With an ``idempotency_key`` already committed (same step name and input
        hash), the existing checkpoint is returned and nothing is written, even
        if ``output`` differs: the first commit wins. Without a key, every call
        appends (its key is ``<run_id>/<step>/@<seq>``).

        Args:
            step: Step name (1-256 characters).
            output: The step's JSON-serialisable output.
            input: The step's input, recorded as its SHA-256.
            idempotency_key: Key that makes retries of this call safe.
            scope: Optional JSON-serialisable snapshot stored with the checkpoint.
            state: Keys of the run's state this step sets (stored as the delta).

        Returns:
            The committed (or previously committed) checkpoint.

        Raises:
            InvalidInputError: Bad step, key, or non-JSON input/output/scope/state.
            InputMismatchError: The key is committed with another input or step name.
            ValueTooLargeError: The checkpoint would exceed the store's value limit.
            StaleWriterError: The run was taken over by another handle; nothing was written.
            RunStateError: The run is finished, cancelled or paused; nothing was written.
            ConflictError: This lease was used concurrently; nothing was written.
        """
        name = check_name(step)
        self._refuse_nesting(name)
        key = None if idempotency_key is None else check_key(idempotency_key)
        digest = input_hash(input, step=name)
        value = to_json(output, field="output", step=name)
        scope_value = None if scope is None else to_json_dict(scope, field="scope", step=name)
        delta = None if state is None else to_json_dict(state, field="state", step=name)
        info = self._refresh()
        entry: bytes | None = None
        if key is not None:
            existing, entry = self._lookup(key, info)
            if existing is not None:
                self._verify_replay(existing, name, digest, key)
                return existing
        with self._lock:
            txn = self._txn()
            if key is None:
                key = f"{self.run_id}/{name}/@{txn.base.head_seq + 1}"
            ckpt = self._add_checkpoint(
                txn, name, key, digest, value, scope_value, txn.now, "step", delta, entry
            )
            self._apply(txn, name)
        return ckpt

    # -- effects ---------------------------------------------------------------

    def effect(
        self,
        name: str,
        fn: Callable[[], object] | Callable[[str], object],
        *,
        idempotency_key: str | None = None,
        input: object = None,
        safe_to_retry: bool = False,
        reconcile: Reconcile | None = None,
        compensation: Callable[[JsonValue], object] | None = None,
    ) -> JsonValue:
        """Perform an external side effect exactly once per run.

        ``EffectInvoked`` is committed durably *before* ``fn`` is called and
        the result is committed before this returns, so:

        - a recorded effect is never called again: a replay returns its output;
        - an effect invoked but never recorded (the worker died during ``fn``)
          has an *unknown outcome*: it is re-run only if ``safe_to_retry``;
          otherwise ``reconcile(idempotency_key)`` is asked (return the
          effect's output if the external system shows it happened, or
          :data:`NOT_DONE` if it did not, and then ``fn`` is called again); with
          no ``reconcile`` the run refuses to continue
          (:class:`EffectOutcomeUnknownError`) until an operator decides with
          :meth:`TaskTier.resolve_effect`.

        Called at the top level of a script, an effect is a checkpointed step of
        its own (two durable commits: before and after ``fn``). Called inside a
        :meth:`step`'s function, it is recorded in the effect ledger and the
        step's checkpoint follows when the step's function returns.

        The default idempotency key is ``<run_id>/effect:<name>/<n>`` at the top
        level and ``<step key>/effect:<name>/<n>`` inside a step (``n`` counts
        earlier calls with that name): deterministic, so a re-executed script
        finds its effects. Pass it to the external system when it deduplicates.

        Args:
            name: Effect name (1-256 characters); compensations are registered by name.
            fn: The effect, called with its idempotency key if it takes one
                positional argument (pass it to an external system that
                deduplicates), else with none; returns JSON-serialisable output
                (or a :class:`Charged`).
            idempotency_key: Explicit key instead of the derived one.
            input: The request, recorded as its SHA-256; a replay with another
                request raises :class:`InputMismatchError`.
            safe_to_retry: The effect is idempotent: re-run it when its outcome is unknown.
            reconcile: Probe of the external system by idempotency key (see above).
            compensation: Undo of this effect, called with its output by
                :meth:`compensate` (same as :meth:`register_compensation`).

        Returns:
            The effect's output after a JSON round trip (the recorded one on replay).

        Raises:
            EffectOutcomeUnknownError: Invoked before but never recorded, and neither
                ``safe_to_retry`` nor ``reconcile`` can settle it.
            InputMismatchError: The key was used by another effect or request.
            InvalidInputError: Bad arguments, non-JSON output, or an effect inside an effect.
            StaleWriterError, RunCancelledError, ApprovalPendingError,
            BudgetExceededError, RunStateError, ConflictError: as for :meth:`step`;
                checked (atomically) before ``fn`` is called.
            Exception: Whatever ``fn`` raises; the effect stays invoked (its
                outcome unknown), since a failed call may have had an effect.
        """
        call = self._effect_call(name, idempotency_key, input, safe_to_retry, compensation)
        outcome = self._effect_begin(call, reconcile is not None)
        while True:
            if outcome[0] == "done":
                self._effect_done(call)
                return outcome[1]
            if outcome[0] == "reconcile":
                assert reconcile is not None
                outcome = self._effect_reconciled(call, reconcile(call.key))
                continue
            self._in_effect = True
            try:
                raw = _call(fn, call.key)
            finally:
                self._in_effect = False
            output = self._effect_record(call, raw, "fn")
            self._effect_done(call)
            return output

    async def aeffect(
        self,
        name: str,
        fn: Callable[[], Awaitable[object]] | Callable[[str], Awaitable[object]],
        *,
        idempotency_key: str | None = None,
        input: object = None,
        safe_to_retry: bool = False,
        reconcile: Callable[[str], object] | None = None,
        compensation: Callable[[JsonValue], object] | None = None,
    ) -> JsonValue:
        """The async twin of :meth:`effect`: awaits ``fn()`` (and ``reconcile``'s result if awaitable).

        The durable commits before and after ``fn`` are the same synchronous
        store calls as :meth:`effect` (one fsync each).
        """
        call = self._effect_call(name, idempotency_key, input, safe_to_retry, compensation)
        outcome = self._effect_begin(call, reconcile is not None)
        while True:
            if outcome[0] == "done":
                self._effect_done(call)
                return outcome[1]
            if outcome[0] == "reconcile":
                assert reconcile is not None
                probed = reconcile(call.key)
                if inspect.isawaitable(probed):
                    probed = await probed
                outcome = self._effect_reconciled(call, probed)
                continue
            self._in_effect = True
            try:
                raw = await _call(fn, call.key)
            finally:
                self._in_effect = False
            output = self._effect_record(call, raw, "fn")
            self._effect_done(call)
            return output

    def register_compensation(self, name: str, fn: Callable[[JsonValue], object]) -> None:
        """Register the undo of effects named ``name``; :meth:`compensate` calls ``fn(output)``.

        Compensations live in code (this handle), never in the store: a resumed
        worker registers them again, as its script does.
        """
        self._compensations[check_name(name, "effect")] = fn

    def compensate(self) -> list[str]:
        """Undo the run's recorded effects, newest first, each exactly once.

        Each compensation runs as a checkpointed effect of its own (key
        ``<effect key>/compensate``, safe to retry: compensations must be
        idempotent) and marks its effect compensated in the same commit, so a
        crash in the middle resumes where it stopped. Compensations are one
        level deep: effects of compensations are never compensated (no cascades).

        Returns:
            The idempotency keys of the effects compensated by this call.

        Raises:
            CompensationError: An effect has no registered compensation (nothing
                was run), or a compensation raised (the ones before it are kept);
                a human must take over.
            StaleWriterError, RunStateError: As for :meth:`step`.
        """
        self._refuse_nesting("compensate")
        self._refresh()
        todo = [
            rec
            for rec in self._tier._effect_records(self.run_id)
            if rec.status is EffectStatus.RECORDED and rec.level == 0 and not rec.compensated
        ]
        todo.sort(key=lambda r: r.recorded_seq or 0, reverse=True)
        missing = sorted({r.name for r in todo if r.name not in self._compensations})
        if missing:
            raise CompensationError(
                f"run {self.run_id!r}: no compensation registered for effect(s) {missing}: "
                "register them with RunHandle.register_compensation (or effect(..., "
                "compensation=...)) before compensate(), or undo them by hand"
            )
        done: list[str] = []
        for rec in todo:
            undo = self._compensations[rec.name]

            def mark(txn: Txn, rec: EffectRecord = rec) -> None:
                space = keys.run_space(self._tier.tenant, self.run_id)
                old = self._tier._read_effect_bytes(self.run_id, rec.key)
                txn.add_event(EventKind.COMPENSATED, key=rec.key, name=rec.name)
                txn.puts.append(
                    Put(space, keys.effect_key(rec.key), encode(_with(rec, compensated=True)))
                )
                txn.checks.append(Check(space, keys.effect_key(rec.key), old))

            call = _EffectCall(
                name=f"compensate:{rec.name}",
                key=f"{rec.key}/compensate",
                step_key=f"{rec.key}/compensate",
                top_level=True,
                digest=input_hash(rec.output, field="output"),
                safe_to_retry=True,
                level=1,
                step_name=f"compensate:{rec.name}",
                kind="compensation",
                on_record=mark,
            )
            outcome = self._effect_begin(call, False)
            if outcome[0] == "invoke":
                self._in_effect = True
                try:
                    raw = undo(rec.output)
                except Exception as exc:
                    raise CompensationError(
                        f"run {self.run_id!r}: compensation of effect {rec.key!r} "
                        f"({rec.name}) raised {type(exc).__name__}: {exc}; the compensations "
                        f"before it are recorded ({done}); fix the cause and call compensate() "
                        "again, or undo it by hand"
                    ) from exc
                finally:
                    self._in_effect = False
                self._effect_record(call, raw, "fn")
            done.append(rec.key)
        return done

    # -- approval gates ----------------------------------------------------------

    def await_approval(self, plan: object, *, key: str | None = None) -> Approval:
        """Stop at a human-approval gate for ``plan`` until a human decides.

        The first call freezes the plan (its canonical JSON and SHA-256) in a
        checkpointed ``ApprovalRequested`` event, pauses the run and raises
        :class:`ApprovalPendingError`: the worker should stop (release nothing;
        the run is paused). :meth:`TaskTier.approve` / :meth:`TaskTier.reject`
        decide; the resumed script calls this again with the same plan and gets
        the decision. No step or effect can be appended while the gate is
        pending, so a resume cannot skip it.

        Args:
            plan: The JSON-serialisable plan to approve.
            key: Explicit gate key (default ``<run_id>/approval/<n>``, ``n``
                counting this handle's earlier gates).

        Returns:
            The decision: ``approved`` true or false, by whom, when.

        Raises:
            ApprovalPendingError: No decision yet (the run is paused).
            PlanMismatchError: The gate was requested for another plan (the
                plan must be deterministic across resumes).
            StaleWriterError, RunCancelledError, RunStateError: As for :meth:`step`.
        """
        self._refuse_nesting("approval")
        occurrence = self._occurrences.get("\0approval", 0)
        gate = f"{self.run_id}/approval/{occurrence}" if key is None else check_key(key, "key")
        plan_json = to_json(plan, field="plan")
        plan_hash = input_hash(plan_json, field="plan")
        info = self._refresh(allow_paused=True)
        space = keys.run_space(self._tier.tenant, self.run_id)
        (data,) = self._tier._kv.get_many(space, [keys.approval_key(gate)])
        if data is not None:
            rec = decode(ApprovalRecord, data, where=f"{space}/{keys.approval_key(gate)}")
            if rec.plan_hash != plan_hash:
                raise PlanMismatchError(
                    f"approval gate {gate!r} of run {self.run_id!r} was requested for plan "
                    f"{rec.plan_hash[:12]}..., not {plan_hash[:12]}...: the plan changed between "
                    "runs; make it deterministic, or use a new gate key"
                )
            if rec.status == "requested":
                raise self._pending(rec.plan_hash, gate)
            self._occurrences["\0approval"] = occurrence + 1
            return Approval(
                approved=rec.status == "granted",
                plan_hash=rec.plan_hash,
                by=rec.decided_by,
                at=rec.decided_at,
                note=rec.note,
            )
        if info.pending_approval is not None:
            raise self._pending(info.pending_approval.plan_hash, info.pending_approval.key)
        with self._lock:
            txn = self._txn()
            record = ApprovalRecord(
                key=gate, plan_hash=plan_hash, plan=plan_json, requested_at=txn.now
            )
            txn.add_event(EventKind.APPROVAL_REQUESTED, key=gate, plan_hash=plan_hash)
            txn.add_event(EventKind.RUN_PAUSED, reason="approval", key=gate)
            txn.puts.append(Put(space, keys.approval_key(gate), encode(record)))
            txn.checks.append(Check(space, keys.approval_key(gate), None))
            txn.update.update(
                status=RunStatus.PAUSED,
                pending_approval=PendingApproval(
                    key=gate, plan_hash=plan_hash, requested_at=txn.now
                ),
            )
            self._apply(txn, "approval")
        raise self._pending(plan_hash, gate)

    # -- lease -------------------------------------------------------------------

    def heartbeat(self) -> datetime | None:
        """Renew this handle's lease; safe to call from a keep-alive thread.

        Returns:
            The new expiry, or ``None`` for a lease without a TTL (it only checks
            the lease is still held).

        Raises:
            StaleWriterError: Another worker took the lease; stop.
            RunCancelledError: The run was cancelled; stop.
            RunStateError: The run is finished.
        """
        with self._lock:
            for _ in range(16):
                info = self._read_fresh()
                self._check_lease(info)
                if info.status.finished:
                    self._check_writable(info)
                if self._lease_ttl is None:
                    return None
                now = self._tier._now()
                expires = now + timedelta(seconds=self._lease_ttl)
                new = info.model_copy(update={"lease_expires_at": expires, "updated_at": now})
                data = encode(new)
                try:
                    self._tier._kv.commit(
                        [Put(self._tier._runs, self.run_id, data)],
                        [Check(self._tier._runs, self.run_id, self._head)],
                    )
                except ConflictError:
                    continue
                self._info, self._head = new, data
                return expires
        raise ConflictError(f"run {self.run_id!r} changes too fast to renew its lease; retry")

    def release(self) -> RunInfo:
        """Give the lease up (graceful shutdown): the run becomes ``resumable`` for another worker.

        Raises:
            StaleWriterError: The lease was already taken over.
            RunStateError: The run is finished.
        """
        with self._lock:
            self._refresh(allow_paused=True)
            txn = self._txn()
            txn.add_event(EventKind.RUN_RELEASED, owner=txn.base.lease_owner)
            txn.update.update(lease_owner=None, lease_expires_at=None)
            if txn.base.status is RunStatus.RUNNING:
                txn.update["status"] = RunStatus.RESUMABLE
            return self._apply(txn, None)

    # -- finishing -------------------------------------------------------------

    def complete(self, result: object = None) -> RunInfo:
        """Mark the run completed, with an optional JSON-serialisable result.

        Raises:
            InvalidInputError: ``result`` is not JSON-serialisable.
            ValueTooLargeError: The head with ``result`` exceeds the value limit.
            StaleWriterError: The run was taken over by another handle.
            RunStateError: The run is already finished, cancelled or paused.
        """
        value = to_json(result, field="result")
        return self._finish(RunStatus.COMPLETED, EventKind.RUN_COMPLETED, {"result": value})

    def fail(self, error: str) -> RunInfo:
        """Mark the run failed. ``error`` is kept (truncated to 20,000 characters).

        Raises:
            InvalidInputError: ``error`` is not a string.
            StaleWriterError: The run was taken over by another handle.
            RunStateError: The run is already finished.
        """
        if not isinstance(error, str):
            raise InvalidInputError(
                f"error must be a string, got {type(error).__name__}", field="error"
            )
        return self._finish(RunStatus.FAILED, EventKind.RUN_FAILED, {"error": error[:MAX_TEXT]})

    # -- internals: head ---------------------------------------------------------

    def _read_fresh(self) -> RunInfo:
        data = self._tier._read_head(self.run_id)
        if data is None:
            raise RunNotFoundError(f"run {self.run_id!r} no longer exists")
        if data == self._head:
            return self._info
        # Someone else wrote (another worker, an operator, an attached handle).
        self._fresh = False
        info = self._tier._decode_head(self.run_id, data)
        self._info, self._head = info, data
        return info

    def _refresh(self, *, allow_paused: bool = False) -> RunInfo:
        """Re-read the head and refuse early if this handle may not write now.

        The commit re-checks these exact bytes, so a change between this read
        and the commit is still caught.
        """
        with self._lock:
            info = self._read_fresh()
            self._check_writable(info, allow_paused=allow_paused)
            return info

    def _check_lease(self, info: RunInfo) -> None:
        if info.lease_epoch != self._epoch:
            raise StaleWriterError(
                f"run {self.run_id!r} was taken over by another worker (lease epoch "
                f"{info.lease_epoch}, this handle holds {self._epoch}): stop using this "
                "handle; nothing was written"
            )

    def _check_writable(self, info: RunInfo, *, allow_paused: bool = False) -> None:
        self._check_lease(info)
        if info.status is RunStatus.CANCELLED:
            raise RunCancelledError(
                f"run {self.run_id!r} was cancelled: stop at this step boundary; nothing "
                "more can be added"
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

    # -- internals: writing --------------------------------------------------------

    def _txn(self) -> Txn:
        info = self._info
        txn = Txn(self.run_id, self._epoch, info, self._tier._now())
        if self._lease_ttl is not None:
            txn.update["lease_expires_at"] = txn.now + timedelta(seconds=self._lease_ttl)
        if info.status is RunStatus.RESUMABLE:
            txn.update["status"] = RunStatus.RUNNING
        return txn

    def _apply(self, txn: Txn, step: str | None) -> RunInfo:
        """Commit ``txn`` against the head bytes this handle holds."""
        try:
            new_info, new_head = self._tier._apply(txn, self._head)
        except ConflictError as exc:
            raise self._conflict(step) from exc
        self._info, self._head = new_info, new_head
        return new_info

    def _conflict(self, step: str | None) -> Exception:
        """Explain why a commit's check failed (to be raised by the caller)."""
        what = f"step {step!r}" if step is not None else "status change"
        try:
            self._refresh(allow_paused=True)
        except (StaleWriterError, RunStateError, RunNotFoundError) as exc:
            return exc
        return ConflictError(
            f"{what} of run {self.run_id!r}: the run changed under this handle without a "
            f"new lease (same epoch {self._epoch}): another thread or an attached handle "
            "wrote, or an operator acted; nothing was written. Use one handle per thread, "
            "then retry"
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
        _check_fits(tier._kv.max_value_bytes, data, f"checkpoint of step {step!r}", "output")
        space = keys.run_space(tier.tenant, self.run_id)
        ckpt_key = keys.checkpoint_key(seq)
        index_key = keys.idempotency_key(key)
        index = IdempotencyEntry(seq=seq, checkpoint_id=ckpt_id, input_hash=digest)
        txn.puts += [Put(space, ckpt_key, data), Put(space, index_key, encode(index))]
        txn.checks += [Check(space, ckpt_key, None), Check(space, index_key, entry)]
        txn.update.update(head_seq=seq, head_checkpoint_id=ckpt_id, last_checkpoint_at=txn.now)
        self._own_keys.add(key)
        if delta:
            values = self._load_values() if self._values is None else self._values
            self._values = {**values, **delta}
        new_event_seq = info.event_seq + len(txn.events)
        if new_event_seq - info.snapshot_event_seq >= tier.snapshot_every:
            values = self._load_values() if self._values is None else self._values
            snap = Snapshot(
                run_id=self.run_id,
                seq=seq,
                checkpoint_id=ckpt_id,
                event_seq=event_seq,
                values=values,
                status=RunStatus.RUNNING.value,
                spent_tokens=txn.update.get("spent_tokens", info.spent_tokens),
                spent_cost=txn.update.get("spent_cost", info.spent_cost),
            )
            snap_data = encode(snap)
            if len(snap_data) <= tier._kv.max_value_bytes:
                # A state too large for one value is folded from checkpoints instead.
                txn.puts.append(Put(space, keys.snapshot_key(seq), snap_data))
                txn.update["snapshot_event_seq"] = event_seq
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
        txn.update.update(spent_tokens=spent_tokens, spent_cost=spent_cost)

    def _finish(self, status: RunStatus, kind: EventKind, update: dict[str, Any]) -> RunInfo:
        self._refuse_nesting(status.value)
        with self._lock:
            self._refresh()
            txn = self._txn()
            txn.add_event(kind, **({"error": update["error"]} if "error" in update else {}))
            txn.update.update(
                status=status,
                finished_at=txn.now,
                lease_owner=None,
                lease_expires_at=None,
                **update,
            )
            head = encode(txn.head())
            _check_fits(
                self._tier._kv.max_value_bytes,
                head,
                f"run {self.run_id!r} with its result",
                "result",
            )
            return self._apply(txn, None)

    def _load_values(self) -> dict[str, JsonValue]:
        if self._values is None:
            self._values = self._tier._values_at(self.run_id, self._info.head_seq)
        return self._values

    # -- internals: effects --------------------------------------------------------

    def _effect_call(
        self,
        name: str,
        idempotency_key: str | None,
        input: object,
        safe_to_retry: bool,
        compensation: Callable[[JsonValue], object] | None,
    ) -> _EffectCall:
        effect_name = check_name(name, "effect")
        if self._in_effect:
            raise InvalidInputError(
                f"effect {effect_name!r} called inside another effect's function: effects "
                "cannot be nested",
                field="effect",
            )
        if compensation is not None:
            self._compensations[effect_name] = compensation
        digest = input_hash(input, step=effect_name)
        active = self._active
        if active is None:
            counter = f"effect:{effect_name}"
            n = self._occurrences.get(counter, 0)
            key = f"{self.run_id}/effect:{effect_name}/{n}"
        else:
            n = active.effect_counts.get(effect_name, 0)
            key = f"{active.key}/effect:{effect_name}/{n}"
        if idempotency_key is not None:
            key = check_key(idempotency_key)
        return _EffectCall(
            name=effect_name,
            key=key,
            step_key=key if active is None else active.key,
            top_level=active is None,
            digest=digest,
            safe_to_retry=safe_to_retry,
            step_name=effect_name,
        )

    def _effect_done(self, call: _EffectCall) -> None:
        active = self._active
        if call.top_level:
            counter = f"effect:{call.name}"
            self._occurrences[counter] = self._occurrences.get(counter, 0) + 1
        elif active is not None:
            active.effect_counts[call.name] = active.effect_counts.get(call.name, 0) + 1

    def _effect_begin(self, call: _EffectCall, can_reconcile: bool) -> tuple[str, JsonValue]:
        """Decide what an effect call does: ("done", output) | ("reconcile", None) | ("invoke", None).

        For "invoke", ``EffectInvoked`` is already committed when this returns.
        """
        info = self._refresh(allow_paused=True)
        entry: bytes | None = None
        if call.top_level:
            existing, entry = self._lookup(call.key, info)
            if existing is not None:
                self._verify_replay(existing, call.step_name, call.digest, call.key)
                return ("done", existing.output)
        self._check_writable(info)
        rec, rec_bytes = self._tier._read_effect(self.run_id, call.key)
        if rec is not None:
            if rec.name != call.name or rec.request_hash != call.digest:
                raise InputMismatchError(
                    f"effect key {call.key!r} of run {self.run_id!r} was used by effect "
                    f"{rec.name!r} with another request: make the request deterministic, or "
                    "give a changed effect a new name or key",
                    step=call.name,
                    idempotency_key=call.key,
                )
            if rec.status is EffectStatus.RECORDED:
                if call.top_level:
                    # Recorded (by reconcile or an operator) but its checkpoint is not
                    # committed yet: commit it now, without calling fn.
                    with self._lock:
                        txn = self._txn()
                        self._add_checkpoint(
                            txn,
                            call.step_name,
                            call.key,
                            call.digest,
                            rec.output,
                            None,
                            txn.now,
                            call.kind,
                            None,
                            entry,
                        )
                        self._apply(txn, call.name)
                return ("done", rec.output)
            if rec.status is EffectStatus.INVOKED and not call.safe_to_retry:
                if can_reconcile:
                    return ("reconcile", None)
                self._flag_unknown(rec, rec_bytes)
                raise EffectOutcomeUnknownError(
                    f"effect {call.name!r} (key {call.key!r}) of run {self.run_id!r} was "
                    f"invoked (attempt {rec.attempt}) but its result was never recorded: it may "
                    "or may not have happened. Pass reconcile= to probe the external system by "
                    "this idempotency key, mark it safe_to_retry if it is idempotent, or decide "
                    "with TaskTier.resolve_effect(run_id, key, output=... | rerun=True)",
                    run_id=self.run_id,
                    effect_key=call.key,
                    effect_name=call.name,
                )
        self._check_budget(info)
        self._effect_invoke(call, rec, rec_bytes, None)
        return ("invoke", None)

    def _effect_invoke(
        self,
        call: _EffectCall,
        rec: EffectRecord | None,
        rec_bytes: bytes | None,
        not_done_source: str | None,
    ) -> None:
        space = keys.run_space(self._tier.tenant, self.run_id)
        with self._lock:
            txn = self._txn()
            active = self._active
            if active is not None and not active.started_written:
                txn.add_event(EventKind.STEP_STARTED, step=active.name, key=active.key)
            if not_done_source is not None:
                txn.add_event(EventKind.EFFECT_NOT_DONE, key=call.key, source=not_done_source)
            attempt = 1 if rec is None else rec.attempt + 1
            seq = txn.add_event(
                EventKind.EFFECT_INVOKED,
                key=call.key,
                name=call.name,
                attempt=attempt,
                request_hash=call.digest,
                step_key=call.step_key,
            )
            new = EffectRecord(
                key=call.key,
                name=call.name,
                step_key=call.step_key,
                status=EffectStatus.INVOKED,
                attempt=attempt,
                request_hash=call.digest,
                safe_to_retry=call.safe_to_retry,
                level=call.level,
                invoked_seq=seq,
            )
            txn.puts.append(Put(space, keys.effect_key(call.key), encode(new)))
            txn.checks.append(Check(space, keys.effect_key(call.key), rec_bytes))
            self._apply(txn, call.name)
            if active is not None:
                active.started_written = True

    def _effect_reconciled(self, call: _EffectCall, probed: object) -> tuple[str, JsonValue]:
        rec, rec_bytes = self._tier._read_effect(self.run_id, call.key)
        if rec is None or rec.status is not EffectStatus.INVOKED:
            # Someone settled it meanwhile (an operator); start over.
            return self._effect_begin(call, True)
        if probed is NOT_DONE:
            self._refresh()
            self._effect_invoke(call, rec, rec_bytes, "reconcile")
            return ("invoke", None)
        return ("done", self._effect_record(call, probed, "reconcile"))

    def _flag_unknown(self, rec: EffectRecord, rec_bytes: bytes | None) -> None:
        if rec.flagged_unknown:
            return
        space = keys.run_space(self._tier.tenant, self.run_id)
        with self._lock:
            txn = self._txn()
            txn.add_event(
                EventKind.EFFECT_OUTCOME_UNKNOWN, key=rec.key, name=rec.name, attempt=rec.attempt
            )
            txn.puts.append(
                Put(space, keys.effect_key(rec.key), encode(_with(rec, flagged_unknown=True)))
            )
            txn.checks.append(Check(space, keys.effect_key(rec.key), rec_bytes))
            self._apply(txn, rec.name)

    def _effect_record(self, call: _EffectCall, raw: object, source: str) -> JsonValue:
        output, tokens, cost, delta = _unpack(raw, call.name)
        space = keys.run_space(self._tier.tenant, self.run_id)
        with self._lock:
            rec, rec_bytes = self._tier._read_effect(self.run_id, call.key)
            if rec is None or rec.status is not EffectStatus.INVOKED:
                raise ConflictError(
                    f"effect {call.key!r} of run {self.run_id!r} was settled by someone else "
                    "while it ran; nothing was recorded by this call"
                )
            txn = self._txn()
            txn.add_event(
                EventKind.EFFECT_RECORDED,
                key=call.key,
                response_hash=output_digest(output),
                source=source,
            )
            new = _with(
                rec,
                status=EffectStatus.RECORDED,
                output=output,
                response_hash=output_digest(output),
                source=source,
                recorded_seq=txn.base.event_seq + len(txn.events),
            )
            data = encode(new)
            _check_fits(
                self._tier._kv.max_value_bytes, data, f"output of effect {call.name!r}", "output"
            )
            txn.puts.append(Put(space, keys.effect_key(call.key), data))
            txn.checks.append(Check(space, keys.effect_key(call.key), rec_bytes))
            self._add_debit(txn, tokens, cost, call.key)
            if call.on_record is not None:
                call.on_record(txn)
            if call.top_level:
                _, entry = self._lookup(call.key, txn.base)
                self._add_checkpoint(
                    txn,
                    call.step_name,
                    call.key,
                    call.digest,
                    output,
                    None,
                    txn.now,
                    call.kind,
                    delta,
                    entry,
                )
            elif delta:
                raise InvalidInputError(
                    f"effect {call.name!r} inside a step returned a state delta: return it from "
                    "the step instead",
                    field="state",
                )
            self._apply(txn, call.name)
        return output


def _call(fn: Callable[..., Any], key: str) -> Any:
    """Call an effect's function with its idempotency key if it takes one argument, else with none."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in positional and p.default is p.empty]
    return fn(key) if len(required) == 1 else fn()


def _unpack(raw: object, step: str) -> tuple[JsonValue, int, float, dict[str, JsonValue] | None]:
    if isinstance(raw, Charged):
        output = to_json(raw.output, field="output", step=step)
        delta = None if raw.state is None else to_json_dict(raw.state, field="state", step=step)
        return output, raw.tokens, raw.cost, delta
    return to_json(raw, field="output", step=step), 0, 0.0, None


def _with(rec: EffectRecord, **update: Any) -> EffectRecord:
    return rec.model_copy(update=update)


def _check_fits(limit: int, data: bytes, what: str, field: str) -> None:
    if len(data) > limit:
        raise ValueTooLargeError(
            f"{what} is {len(data)} bytes, over the store's limit of {limit} bytes: keep "
            "large data elsewhere and record a reference, or raise max_value_bytes",
            field=field,
        )
