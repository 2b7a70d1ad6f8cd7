"""Exactly-once external effects, the worker's side: effect, aeffect, begin/record_effect.

:class:`Effects` decides what an effect call does (replay a recorded output, ask a
reconcile callback, refuse an unknown outcome, or invoke it) and drives the
protocol; the ledger writes themselves are :class:`~tiers.task._ledger.EffectLedger`'s.
"""

from __future__ import annotations

import inspect
from collections.abc import Awaitable, Callable
from typing import Any

from pydantic import JsonValue

from tiers.errors import (
    ConflictError,
    EffectNotFoundError,
    EffectOutcomeUnknownError,
    InputMismatchError,
    InvalidInputError,
    RunStateError,
)
from tiers.task._ledger import EffectCall, EffectLedger
from tiers.task._records import (
    NOT_DONE,
    EffectStart,
    EffectStatus,
    check_key,
    check_name,
    input_hash,
    output_digest,
)
from tiers.task._txn import Txn, unpack_output
from tiers.task._writer import RunWriter

__all__ = ["Effects", "Reconcile", "call_effect"]


Reconcile = Callable[[str], object]


class Effects:
    """The effects of one :class:`~tiers.task.RunHandle`, and the compensations it registered."""

    def __init__(self, writer: RunWriter, ledger: EffectLedger) -> None:
        self.writer = writer
        self.store = writer.store
        self.ledger = ledger
        # Undo functions by effect name: code, never stored (a resumed worker registers them again).
        self.compensations: dict[str, Callable[[JsonValue], object]] = {}

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
        call = self.new_call(name, idempotency_key, input, safe_to_retry, compensation)
        outcome = self.begin(call, reconcile is not None)
        while True:
            if outcome[0] == "done":
                self.count_done(call)
                return outcome[1]
            if outcome[0] == "reconcile":
                assert reconcile is not None
                outcome = self.reconciled(call, reconcile(call.key))
                continue
            self.writer.in_effect = True
            try:
                raw = call_effect(fn, call.key)
            finally:
                self.writer.in_effect = False
            output = self.ledger.record(call, raw, "fn")
            self.count_done(call)
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
        call = self.new_call(name, idempotency_key, input, safe_to_retry, compensation)
        outcome = self.begin(call, reconcile is not None)
        while True:
            if outcome[0] == "done":
                self.count_done(call)
                return outcome[1]
            if outcome[0] == "reconcile":
                assert reconcile is not None
                probed = reconcile(call.key)
                if inspect.isawaitable(probed):
                    probed = await probed
                outcome = self.reconciled(call, probed)
                continue
            self.writer.in_effect = True
            try:
                raw = await call_effect(fn, call.key)
            finally:
                self.writer.in_effect = False
            output = self.ledger.record(call, raw, "fn")
            self.count_done(call)
            return output

    def register_compensation(self, name: str, fn: Callable[[JsonValue], object]) -> None:
        """Register the undo of effects named ``name``; :meth:`compensate` calls ``fn(output)``.

        Compensations live in code (this handle), never in the store: a resumed
        worker registers them again, as its script does.
        """
        self.compensations[check_name(name, "effect")] = fn

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
        call = self.new_call(name, idempotency_key, input, safe_to_retry, None)
        kind, output = self.begin(call, False)
        if kind == "done":
            self.count_done(call)
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
        if self.writer.in_effect:
            raise InvalidInputError(
                "record_effect called inside an effect's function", field="idempotency_key"
            )
        with self.writer.lock:
            self.writer.check_lease(self.writer.read_fresh())
        rec, _ = self.store.read_effect(self.writer.run_id, key)
        if rec is None:
            raise EffectNotFoundError(
                f"run {self.writer.run_id!r} has no effect with key {key!r}: begin_effect it first"
            )
        if rec.level != 0:
            raise RunStateError(
                f"effect {key!r} of run {self.writer.run_id!r} is a compensation: compensate() records it"
            )
        if rec.status is EffectStatus.RECORDED:
            value, _, _, _ = unpack_output(output, rec.name)
            if rec.response_hash != output_digest(value):
                raise ConflictError(
                    f"effect {key!r} of run {self.writer.run_id!r} is recorded already with another "
                    f"output (source {rec.source!r}); the recorded one stands"
                )
            return rec.output
        if rec.status is EffectStatus.NOT_DONE:
            raise RunStateError(
                f"effect {key!r} of run {self.writer.run_id!r} was settled as not done: begin it again"
            )
        call = EffectCall(
            name=rec.name,
            key=key,
            step_key=rec.step_key,
            top_level=rec.step_key == key,
            digest=rec.request_hash,
            safe_to_retry=rec.safe_to_retry,
            step_name=rec.name,
        )
        recorded = self.ledger.record(call, output, "fn")
        self.count_done(call)
        return recorded

    def new_call(
        self,
        name: str,
        idempotency_key: str | None,
        input: object,
        safe_to_retry: bool,
        compensation: Callable[[JsonValue], object] | None,
    ) -> EffectCall:
        """The call an effect makes: its checked name, its (derived or given) key, its request digest."""
        effect_name = check_name(name, "effect")
        if self.writer.in_effect:
            raise InvalidInputError(
                f"effect {effect_name!r} called inside another effect's function: effects "
                "cannot be nested",
                field="effect",
            )
        if compensation is not None:
            self.compensations[effect_name] = compensation
        digest = input_hash(input, step=effect_name)
        active = self.writer.active
        if active is None:
            counter = f"effect:{effect_name}"
            n = self.writer.occurrences.get(counter, 0)
            key = f"{self.writer.run_id}/effect:{effect_name}/{n}"
        else:
            n = active.effect_counts.get(effect_name, 0)
            key = f"{active.key}/effect:{effect_name}/{n}"
        if idempotency_key is not None:
            key = check_key(idempotency_key)
        return EffectCall(
            name=effect_name,
            key=key,
            step_key=key if active is None else active.key,
            top_level=active is None,
            digest=digest,
            safe_to_retry=safe_to_retry,
            step_name=effect_name,
        )

    def count_done(self, call: EffectCall) -> None:
        """Count a finished call, so the next call of that name derives the next key."""
        active = self.writer.active
        if call.top_level:
            counter = f"effect:{call.name}"
            self.writer.occurrences[counter] = self.writer.occurrences.get(counter, 0) + 1
        elif active is not None:
            active.effect_counts[call.name] = active.effect_counts.get(call.name, 0) + 1

    def begin(self, call: EffectCall, can_reconcile: bool) -> tuple[str, JsonValue]:
        """Decide what an effect call does: ("done", output) | ("reconcile", None) | ("invoke", None).

        For "invoke", ``EffectInvoked`` is already committed when this returns.
        """
        compensating = call.kind == "compensation"
        info = self.writer.refresh(allow_paused=True, compensating=compensating)
        entry: bytes | None = None
        if call.top_level:
            existing, entry = self.writer.lookup(call.key, info)
            if existing is not None:
                self.writer.verify_replay(existing, call.step_name, call.digest, call.key)
                return ("done", existing.output)
        self.writer.check_writable(info, compensating=compensating)
        rec, rec_bytes = self.store.read_effect(self.writer.run_id, call.key)
        if rec is not None:
            if rec.name != call.name or rec.request_hash != call.digest:
                self.store.observer.validation_failed("effect")
                raise InputMismatchError(
                    f"effect key {call.key!r} of run {self.writer.run_id!r} was used by effect "
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
                        txn = self.writer.txn()
                        self.writer.add_checkpoint(
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

                    self.writer.commit(build, call.name)
                return ("done", rec.output)
            if rec.status is EffectStatus.INVOKED and not call.safe_to_retry:
                if can_reconcile:
                    return ("reconcile", None)
                self.ledger.flag_unknown([rec])
                raise EffectOutcomeUnknownError(
                    f"effect {call.name!r} (key {call.key!r}) of run {self.writer.run_id!r} was "
                    f"invoked (attempt {rec.attempt}) but its result was never recorded: it may "
                    "or may not have happened. Pass reconcile= to probe the external system by "
                    "this idempotency key, mark it safe_to_retry if it is idempotent, or decide "
                    "with TaskTier.resolve_effect(run_id, key, output=... | rerun=True)",
                    run_id=self.writer.run_id,
                    effect_key=call.key,
                    effect_name=call.name,
                )
        if not compensating:
            # An undo is never refused for lack of budget.
            self.writer.check_budget(info)
        self.ledger.invoke(call, rec, rec_bytes, None)
        return ("invoke", None)

    def reconciled(self, call: EffectCall, probed: object) -> tuple[str, JsonValue]:
        """Act on what ``reconcile`` found: another invoke (``NOT_DONE``), or record its output."""
        rec, rec_bytes = self.store.read_effect(self.writer.run_id, call.key)
        if rec is None or rec.status is not EffectStatus.INVOKED:
            # Someone settled it meanwhile (an operator); start over.
            return self.begin(call, True)
        if probed is NOT_DONE:
            self.writer.refresh()
            self.ledger.invoke(call, rec, rec_bytes, "reconcile")
            return ("invoke", None)
        return ("done", self.ledger.record(call, probed, "reconcile"))


def call_effect(fn: Callable[..., Any], key: str) -> Any:
    """Call an effect's function with its idempotency key if it takes one argument, else with none."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return fn()
    positional = (inspect.Parameter.POSITIONAL_ONLY, inspect.Parameter.POSITIONAL_OR_KEYWORD)
    required = [p for p in params if p.kind in positional and p.default is p.empty]
    return fn(key) if len(required) == 1 else fn()
