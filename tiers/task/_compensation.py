"""Compensation: undoing a run's recorded effects, newest first, each exactly once."""

from __future__ import annotations

from contextlib import suppress

from tiers import keys
from tiers.backends.base import Check, Put
from tiers.codec import encode
from tiers.errors import CompensationError, EffectOutcomeUnknownError, TierError
from tiers.task._effects import Effects
from tiers.task._ledger import EffectCall
from tiers.task._records import MAX_NOTE, EffectRecord, EffectStatus, EventKind, input_hash
from tiers.task._txn import Txn, with_changes

__all__ = ["Compensation"]


class Compensation:
    """The compensations of one :class:`~tiers.task.RunHandle`, run as effects of their own."""

    def __init__(self, effects: Effects) -> None:
        self.writer = effects.writer
        self.store = effects.store
        self.effects = effects
        self.ledger = effects.ledger

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
        self.writer.refuse_nesting("compensate")
        self.writer.refresh(compensating=True)
        records = self.store.effect_records(self.writer.run_id)
        unknown = sorted(
            (r for r in records if r.status is EffectStatus.INVOKED and r.level == 0),
            key=lambda r: r.invoked_seq,
        )
        if unknown:
            self.ledger.flag_unknown(unknown)
            names = [r.key for r in unknown]
            raise EffectOutcomeUnknownError(
                f"run {self.writer.run_id!r} cannot be compensated: effect(s) {names} were invoked "
                "but never recorded, so they may or may not have happened. Reconcile them "
                "first (TaskTier.resolve_effect(run_id, key, output=... | rerun=True)), then "
                "call compensate() again; nothing was compensated",
                run_id=self.writer.run_id,
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
        missing = sorted({r.name for r in todo if r.name not in self.effects.compensations})
        if missing:
            self.escalate(missing, "no compensation registered")
            raise CompensationError(
                f"run {self.writer.run_id!r}: no compensation registered for effect(s) {missing}: "
                "register them with RunHandle.register_compensation (or effect(..., "
                "compensation=...)) before compensate(), or undo them by hand"
            )
        done: list[str] = []
        for rec in todo:
            self.store.observer.compensation_depth(len(todo) - len(done))
            undo = self.effects.compensations[rec.name]

            def mark(txn: Txn, rec: EffectRecord = rec) -> None:
                space = keys.run_space(self.store.tenant, self.writer.run_id)
                old = self.store.read_effect_bytes(self.writer.run_id, rec.key)
                txn.add_event(EventKind.COMPENSATED, key=rec.key, name=rec.name)
                txn.puts.append(
                    Put(
                        space, keys.effect_key(rec.key), encode(with_changes(rec, compensated=True))
                    )
                )
                txn.checks.append(Check(space, keys.effect_key(rec.key), old))

            call = EffectCall(
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
            outcome = self.effects.begin(call, False)
            if outcome[0] == "invoke":
                self.writer.in_effect = True
                try:
                    raw = undo(rec.output)
                except Exception as exc:
                    self.escalate([rec.key], f"compensation raised {type(exc).__name__}: {exc}")
                    raise CompensationError(
                        f"run {self.writer.run_id!r}: compensation of effect {rec.key!r} "
                        f"({rec.name}) raised {type(exc).__name__}: {exc}; the compensations "
                        f"before it are recorded ({done}); fix the cause and call compensate() "
                        "again, or undo it by hand"
                    ) from exc
                finally:
                    self.writer.in_effect = False
                self.ledger.record(call, raw, "fn")
            done.append(rec.key)
        self.store.observer.compensation_depth(0)
        return done

    def escalate(self, effects: list[str], reason: str) -> None:
        """Record ``CompensationEscalated`` so an operator finds the run in its event log.

        Best effort: the caller raises :class:`CompensationError` either way,
        and a run taken over meanwhile is the new holder's to report.
        """

        def build() -> Txn:
            txn = self.writer.txn()
            txn.add_event(
                EventKind.COMPENSATION_ESCALATED, effects=list(effects), reason=reason[:MAX_NOTE]
            )
            return txn

        with suppress(TierError):
            self.writer.commit(
                build, None, lambda info: self.writer.check_writable(info, compensating=True)
            )
