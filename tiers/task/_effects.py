"""Exactly-once external effects: the effect ledger, reconciliation, operator decisions, compensation."""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime
from typing import Any

from pydantic import JsonValue

from tiers import keys
from tiers.backends.base import Check, Put
from tiers.codec import encode
from tiers.errors import (
    CompensationError,
    ConflictError,
    EffectNotFoundError,
    EffectOutcomeUnknownError,
    InputMismatchError,
    InvalidInputError,
    RunCancelledError,
    RunStateError,
    TierError,
)
from tiers.ids import check_id
from tiers.models import RunInfo, RunStatus
from tiers.task._handle_core import HandleCore
from tiers.task._records import (
    MAX_NOTE,
    NOT_DONE,
    EffectRecord,
    EffectStart,
    EffectStatus,
    EventKind,
    check_decider,
    check_key,
    check_name,
    input_hash,
    output_digest,
    to_json,
)
from tiers.task._storage import TierCore
from tiers.task._txn import UNSET, Txn, check_fits, unpack_output, with_changes

__all__ = ["EffectsMixin", "HandleEffectsMixin", "Reconcile"]


Reconcile = Callable[[str], object]


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


class EffectsMixin(TierCore):
    """The operator side of effects (:class:`~tiers.task.TaskTier`)."""

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
        """An operator's decision on an effect whose outcome is unknown.

        Give exactly one of ``output`` (the effect happened; the resumed run
        gets this output without calling the effect) or ``rerun=True`` (it did
        not happen; the resumed run calls it again).

        Allowed whatever the run's status: an effect of a cancelled or failed
        run must be settled before the run can be compensated. The decision
        clears the effect from ``RunInfo.unknown_effects`` in the same commit.

        ``by`` (who decides, as the caller names them, 1-256 characters) and
        ``by_key`` (the id of the credential the caller was authenticated with:
        a service passes its API key id; ``None`` from the library) are kept in
        the event and in the ledger entry (``resolved_by``, ``resolved_by_key``).

        Raises:
            InvalidInputError: Neither or both given, a non-JSON output, or a bad
                ``by`` or ``by_key``.
            RunNotFoundError: No such run.
            EffectNotFoundError: The run has no effect with that key.
            RunStateError: The effect's outcome is not unknown (it is recorded or
                was never invoked).
        """
        check_id(run_id, "run_id")
        key = check_key(key)
        by, by_key = check_decider(by, by_key)
        if (output is UNSET) == (not rerun):
            raise InvalidInputError(
                "give exactly one of output=... (the effect happened) or rerun=True (it did not)",
                field="output",
            )
        value = None if output is UNSET else to_json(output, field="output")
        # The response digest is of the output as given; the ledger keeps it redacted.
        digest = output_digest(value)
        value = self.redactor.redact_json(value)
        space = keys.run_space(self._tenant, run_id)
        result: list[EffectRecord] = []

        def build(info: RunInfo, now: datetime) -> Txn | RunInfo:
            result.clear()
            rec, data = self._read_effect(run_id, key)
            if rec is None:
                raise EffectNotFoundError(f"run {run_id!r} has no effect with key {key!r}")
            if rec.status is not EffectStatus.INVOKED:
                raise RunStateError(
                    f"effect {key!r} of run {run_id!r} is {rec.status.value}, not of unknown "
                    "outcome: nothing to resolve"
                )
            txn = Txn(run_id, info.lease_epoch, info, now)
            if rerun:
                txn.add_event(
                    EventKind.EFFECT_NOT_DONE, key=key, source="operator", by=by, by_key=by_key
                )
                new = rec.model_copy(
                    update={
                        "status": EffectStatus.NOT_DONE,
                        "source": "operator",
                        "resolved_by": by,
                        "resolved_by_key": by_key,
                    }
                )
            else:
                seq = txn.add_event(
                    EventKind.EFFECT_RECORDED,
                    key=key,
                    response_hash=digest,
                    source="operator",
                    by=by,
                    by_key=by_key,
                )
                new = rec.model_copy(
                    update={
                        "status": EffectStatus.RECORDED,
                        "output": value,
                        "response_hash": digest,
                        "source": "operator",
                        "resolved_by": by,
                        "resolved_by_key": by_key,
                        "recorded_seq": seq,
                    }
                )
            txn.puts.append(Put(space, keys.effect_key(key), encode(new)))
            txn.checks.append(Check(space, keys.effect_key(key), data))
            _settled(txn, key)
            result.append(new)
            return txn

        self._operate(run_id, build, "resolve an effect of")
        return result[0]


class HandleEffectsMixin(HandleCore):
    """The worker side of effects (:class:`~tiers.task._handle.RunHandle`)."""

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
                checked (atomically) before ``fn`` is called. Once ``fn`` returned,
                only a takeover (``StaleWriterError``) keeps its result from being
                recorded; a run cancelled while ``fn`` ran gets the result recorded
                (no checkpoint), then ``RunCancelledError``.
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

        A running run, and a cancelled or failed one, can be compensated: the
        handle that saw the run end may call this with the lease it holds, and
        another worker takes the lease with ``TaskTier.acquire(run_id,
        for_compensation=True)``. On a finished run compensations are recorded
        in the effect ledger and the event log, not as checkpoints (a finished
        run takes no more steps); its status stays as it is.

        Nothing is undone while an effect's outcome is unknown (invoked, never
        recorded): it may have happened, and then needs undoing too. Such
        effects are flagged (``RunInfo.unknown_effects``) and this raises until
        they are reconciled (``TaskTier.resolve_effect``).

        Returns:
            The idempotency keys of the effects compensated by this call.

        Raises:
            EffectOutcomeUnknownError: Effects of unknown outcome (``effect_keys``);
                nothing was compensated.
            CompensationError: An effect has no registered compensation (nothing
                was run), or a compensation raised (the ones before it are kept);
                a human must take over.
            StaleWriterError: Another worker took the lease.
            RunStateError: The run completed, or is paused.
        """
        self._refuse_nesting("compensate")
        self._refresh(compensating=True)
        records = self._tier._effect_records(self.run_id)
        unknown = sorted(
            (r for r in records if r.status is EffectStatus.INVOKED and r.level == 0),
            key=lambda r: r.invoked_seq,
        )
        if unknown:
            self._flag_unknown(unknown)
            names = [r.key for r in unknown]
            raise EffectOutcomeUnknownError(
                f"run {self.run_id!r} cannot be compensated: effect(s) {names} were invoked "
                "but never recorded, so they may or may not have happened. Reconcile them "
                "first (TaskTier.resolve_effect(run_id, key, output=... | rerun=True)), then "
                "call compensate() again; nothing was compensated",
                run_id=self.run_id,
                effect_key=unknown[0].key,
                effect_name=unknown[0].name,
                effect_keys=names,
            )
        todo = [
            rec
            for rec in records
            if rec.status is EffectStatus.RECORDED and rec.level == 0 and not rec.compensated
        ]
        todo.sort(key=lambda r: r.recorded_seq or 0, reverse=True)
        missing = sorted({r.name for r in todo if r.name not in self._compensations})
        if missing:
            self._escalate(missing, "no compensation registered")
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
                    Put(
                        space, keys.effect_key(rec.key), encode(with_changes(rec, compensated=True))
                    )
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
                    self._escalate([rec.key], f"compensation raised {type(exc).__name__}: {exc}")
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

    def _escalate(self, effects: list[str], reason: str) -> None:
        """Record ``CompensationEscalated`` so an operator finds the run in its event log.

        Best effort: the caller raises :class:`CompensationError` either way,
        and a run taken over meanwhile is the new holder's to report.
        """

        def build() -> Txn:
            txn = self._txn()
            txn.add_event(
                EventKind.COMPENSATION_ESCALATED, effects=list(effects), reason=reason[:MAX_NOTE]
            )
            return txn

        with suppress(TierError):
            self._commit(build, None, lambda info: self._check_writable(info, compensating=True))

    def begin_effect(
        self,
        name: str,
        *,
        idempotency_key: str,
        input: object = None,
        safe_to_retry: bool = False,
    ) -> EffectStart:
        """First half of :meth:`effect` for a caller that performs the effect itself.

        For a worker that cannot hand this handle a function to call: a
        stateless HTTP worker (``POST /v1/runs/{id}/effects:begin``), a queue
        consumer, a callback-driven SDK. The protocol is the one :meth:`effect`
        follows:

        1. ``begin_effect`` commits ``EffectInvoked`` durably (and fsync'd) and
           returns ``invoke=True``; or, if the key is recorded already, returns
           ``invoke=False`` and the recorded output: do not perform it again.
        2. The caller performs the effect, passing ``key`` to the external system.
        3. :meth:`record_effect` stores the result before the run goes on.

        An effect begun but never recorded has an unknown outcome: beginning it
        again raises :class:`EffectOutcomeUnknownError` (unless
        ``safe_to_retry``) until it is reconciled with
        :meth:`TaskTier.resolve_effect`. Called at the top level an effect is a
        checkpointed step of its own; called inside a :meth:`step`'s function
        it is recorded in the ledger and the step's checkpoint follows.

        Args:
            name: Effect name (1-256 characters).
            idempotency_key: The effect's key: required, since a caller without
                a long-lived handle cannot rely on the derived one.
            input: The request, recorded as its SHA-256 (a replay with another
                request raises :class:`InputMismatchError`).
            safe_to_retry: The effect is idempotent: begin it again when its
                outcome is unknown.

        Returns:
            Whether to perform the effect, or its recorded output.

        Raises:
            EffectOutcomeUnknownError, InputMismatchError, InvalidInputError,
            StaleWriterError, RunCancelledError, ApprovalPendingError,
            BudgetExceededError, RunStateError, ConflictError: As for :meth:`effect`.
        """
        call = self._effect_call(name, idempotency_key, input, safe_to_retry, None)
        kind, output = self._effect_begin(call, False)
        if kind == "done":
            self._effect_done(call)
            return EffectStart(key=call.key, invoke=False, output=output)
        return EffectStart(key=call.key, invoke=True)

    def record_effect(self, idempotency_key: str, output: object) -> JsonValue:
        """Second half of :meth:`begin_effect`: store the result of an effect the caller performed.

        Committed before this returns, with the effect's checkpoint when it was
        begun at the top level. Recording the same output again (a retried
        request) returns it and writes nothing.

        If the run was cancelled (or otherwise finished) while the effect ran,
        the result is still recorded in the effect ledger (the call happened,
        and a compensation may need its output), then this raises
        :class:`RunCancelledError` (or :class:`RunStateError`) so the worker stops.

        Args:
            idempotency_key: The key :meth:`begin_effect` returned.
            output: The effect's JSON-serialisable output, or a :class:`Charged`.

        Returns:
            The output after a JSON round trip.

        Raises:
            EffectNotFoundError: No effect was begun with this key.
            ConflictError: The effect was recorded already with another output, or
                settled by an operator meanwhile; nothing was written.
            RunStateError: It was settled as not done (begin it again), or it is a
                compensation's effect (:meth:`compensate` records those).
            RunCancelledError: The run was cancelled meanwhile; the result *was* recorded.
            StaleWriterError: Another worker took the run over; nothing was written.
            InvalidInputError: Non-JSON output.
        """
        key = check_key(idempotency_key)
        if self._in_effect:
            raise InvalidInputError(
                "record_effect called inside an effect's function", field="idempotency_key"
            )
        with self._lock:
            self._check_lease(self._read_fresh())
        rec, _ = self._tier._read_effect(self.run_id, key)
        if rec is None:
            raise EffectNotFoundError(
                f"run {self.run_id!r} has no effect with key {key!r}: begin_effect it first"
            )
        if rec.level != 0:
            raise RunStateError(
                f"effect {key!r} of run {self.run_id!r} is a compensation: compensate() records it"
            )
        if rec.status is EffectStatus.RECORDED:
            value, _, _, _ = unpack_output(output, rec.name)
            if rec.response_hash != output_digest(value):
                raise ConflictError(
                    f"effect {key!r} of run {self.run_id!r} is recorded already with another "
                    f"output (source {rec.source!r}); the recorded one stands"
                )
            return rec.output
        if rec.status is EffectStatus.NOT_DONE:
            raise RunStateError(
                f"effect {key!r} of run {self.run_id!r} was settled as not done: begin it again"
            )
        call = _EffectCall(
            name=rec.name,
            key=key,
            step_key=rec.step_key,
            top_level=rec.step_key == key,
            digest=rec.request_hash,
            safe_to_retry=rec.safe_to_retry,
            step_name=rec.name,
        )
        recorded = self._effect_record(call, output, "fn")
        self._effect_done(call)
        return recorded

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
        compensating = call.kind == "compensation"
        info = self._refresh(allow_paused=True, compensating=compensating)
        entry: bytes | None = None
        if call.top_level:
            existing, entry = self._lookup(call.key, info)
            if existing is not None:
                self._verify_replay(existing, call.step_name, call.digest, call.key)
                return ("done", existing.output)
        self._check_writable(info, compensating=compensating)
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
                if call.top_level and not info.status.finished:
                    # Recorded (by reconcile or an operator) but its checkpoint is not
                    # committed yet: commit it now, without calling fn.
                    def build() -> Txn:
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
                        return txn

                    self._commit(build, call.name)
                return ("done", rec.output)
            if rec.status is EffectStatus.INVOKED and not call.safe_to_retry:
                if can_reconcile:
                    return ("reconcile", None)
                self._flag_unknown([rec])
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
        if not compensating:
            # An undo is never refused for lack of budget.
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
        """Commit ``EffectInvoked`` and make it durable.

        ``rec`` / ``rec_bytes`` are the ledger entry the decision to invoke was
        based on; the commit checks it is unchanged, so two users of one lease
        never both invoke the effect.
        """
        space = keys.run_space(self._tier.tenant, self.run_id)
        compensating = call.kind == "compensation"
        active = self._active

        def build() -> Txn:
            txn = self._txn()
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
            _settled(txn, call.key)  # a new attempt is in flight, no longer unknown
            return txn

        def recheck(info: RunInfo) -> None:
            # fn has not run yet: every check of a new call applies again.
            self._check_writable(info, compensating=compensating)
            if not compensating:
                self._check_budget(info)

        self._commit(build, call.name, recheck)
        if active is not None:
            active.started_written = True
        # The caller invokes the effect next: on a store that acknowledges before
        # fsync, make EffectInvoked durable first.
        self._tier.force_flush()

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

    def _flag_unknown(self, recs: list[EffectRecord]) -> None:
        """Mark effects of unknown outcome: an event each (once) and ``RunInfo.unknown_effects``."""
        wanted = [r.key for r in recs]
        if all(r.flagged_unknown for r in recs) and set(wanted) <= set(self._info.unknown_effects):
            return
        space = keys.run_space(self._tier.tenant, self.run_id)

        def build() -> Txn:
            txn = self._txn()
            flagged = list(txn.base.unknown_effects)
            for key in wanted:
                rec, rec_bytes = self._tier._read_effect(self.run_id, key)
                if rec is None or rec.status is not EffectStatus.INVOKED:
                    continue  # settled meanwhile
                if not rec.flagged_unknown:
                    txn.add_event(
                        EventKind.EFFECT_OUTCOME_UNKNOWN,
                        key=rec.key,
                        name=rec.name,
                        attempt=rec.attempt,
                    )
                    txn.puts.append(
                        Put(
                            space,
                            keys.effect_key(rec.key),
                            encode(with_changes(rec, flagged_unknown=True)),
                        )
                    )
                    txn.checks.append(Check(space, keys.effect_key(rec.key), rec_bytes))
                if rec.key not in flagged:
                    flagged.append(rec.key)
            txn.update.unknown_effects = flagged
            return txn

        # Flagging records a fact about the past: whatever the run's status, if the lease holds.
        self._commit(build, recs[0].name, lambda info: None)

    def _effect_record(self, call: _EffectCall, raw: object, source: str) -> JsonValue:
        """Commit an invoked effect's result (and, at the top level, its checkpoint).

        The result is recorded even if the run was cancelled or finished while
        the effect ran (the call happened; a compensation may need its
        output): then without a checkpoint, and this raises afterwards so the
        worker stops. Only a takeover (a new lease epoch) makes it write
        nothing: the new holder reconciles the effect.
        """
        output, tokens, cost, delta = unpack_output(raw, call.name)
        # The ledger keeps the response's digest and a redacted output: a credential an
        # effect returned is not stored, and a retried record_effect still matches by digest.
        # What this returns is what was stored, as a replay returns it.
        response_hash = output_digest(output)
        output = self._tier.redactor.redact_json(output)
        if delta and not call.top_level:
            raise InvalidInputError(
                f"effect {call.name!r} inside a step returned a state delta: return it from "
                "the step instead",
                field="state",
            )
        space = keys.run_space(self._tier.tenant, self.run_id)

        def build() -> Txn:
            rec, rec_bytes = self._tier._read_effect(self.run_id, call.key)
            if rec is None or rec.status is not EffectStatus.INVOKED:
                # Settled by the worker that took the run over? Then this one is fenced.
                self._check_lease(self._read_fresh())
                raise ConflictError(
                    f"effect {call.key!r} of run {self.run_id!r} was settled by someone else "
                    "while it ran; nothing was recorded by this call"
                )
            txn = self._txn()
            txn.add_event(
                EventKind.EFFECT_RECORDED,
                key=call.key,
                response_hash=response_hash,
                source=source,
            )
            new = with_changes(
                rec,
                status=EffectStatus.RECORDED,
                output=output,
                response_hash=response_hash,
                source=source,
                recorded_seq=txn.base.event_seq + len(txn.events),
            )
            data = encode(new)
            check_fits(
                self._tier._kv.max_value_bytes, data, f"output of effect {call.name!r}", "output"
            )
            txn.puts.append(Put(space, keys.effect_key(call.key), data))
            txn.checks.append(Check(space, keys.effect_key(call.key), rec_bytes))
            _settled(txn, call.key)
            self._add_debit(txn, tokens, cost, call.key)
            if call.on_record is not None:
                call.on_record(txn)
            if call.top_level and not txn.base.status.finished:
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
            return txn

        # Only the lease is rechecked on a retry: the effect happened, whatever
        # else changed (a cancel, a budget, a paused gate).
        info = self._commit(build, call.name, lambda fresh: None)
        if info.status.finished and call.kind != "compensation":
            why = (
                f"run {self.run_id!r} was {info.status.value} while effect {call.name!r} ran: "
                f"its result was recorded (key {call.key!r}, no checkpoint); stop at this step "
                "boundary (compensate() may undo it)"
            )
            if info.status is RunStatus.CANCELLED:
                raise RunCancelledError(why)
            raise RunStateError(why)
        return output


def _settled(txn: Txn, key: str) -> None:
    """Drop ``key`` from the run's unknown effects, in the commit that settles it."""
    current = txn.head().unknown_effects
    if key in current:
        txn.update.unknown_effects = [k for k in current if k != key]


def _call(fn: Callable[..., Any], key: str) -> Any:
    """Call an effect's function with its idempotency key if it takes one argument, else with none."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in positional and p.default is p.empty]
    return fn(key) if len(required) == 1 else fn()
