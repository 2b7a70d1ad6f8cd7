"""Every write to the effect ledger: an effect invoked, recorded, flagged unknown, or resolved.

The ledger (``eff:<key>`` -> :class:`~tiers.task._records.EffectRecord`) changes in the
same commit as the events and the head change it belongs to. A worker's handle writes
it through :class:`EffectLedger` (with its :class:`~tiers.task._writer.RunWriter`);
an operator decides an effect of unknown outcome with
:meth:`EffectDecisions.resolve_effect` (``TaskTier.resolve_effect``).
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime

from pydantic import JsonValue

from tiers import keys
from tiers.backends.base import Check, Put
from tiers.codec import encode
from tiers.errors import (
    ConflictError,
    EffectNotFoundError,
    InvalidInputError,
    RunCancelledError,
    RunStateError,
)
from tiers.ids import check_id
from tiers.models import RunInfo, RunStatus
from tiers.task._records import (
    EffectRecord,
    EffectStatus,
    EventKind,
    check_decider,
    check_key,
    output_digest,
    to_json,
)
from tiers.task._store import RunStore
from tiers.task._txn import UNSET, Txn, check_fits, unpack_output, with_changes
from tiers.task._writer import RunWriter

__all__ = ["EffectCall", "EffectDecisions", "EffectLedger", "settled"]


@dataclass
class EffectCall:
    """One call of an effect (or of a compensation): its key, the step it runs in, its request."""

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
    # When this process made the call: an observer hears how long the effect took.
    started: float = field(default_factory=time.perf_counter)

    def elapsed(self) -> float:
        """Seconds since this call was made."""
        return time.perf_counter() - self.started


class EffectLedger:
    """A worker's writes to the effect ledger, through the handle's :class:`RunWriter`."""

    def __init__(self, writer: RunWriter) -> None:
        self.writer = writer
        self.store = writer.store

    def invoke(
        self,
        call: EffectCall,
        rec: EffectRecord | None,
        rec_bytes: bytes | None,
        not_done_source: str | None,
    ) -> None:
        """Commit ``EffectInvoked`` and make it durable.

        ``rec`` / ``rec_bytes`` are the ledger entry the decision to invoke was
        based on; the commit checks it is unchanged, so two users of one lease
        never both invoke the effect.
        """
        space = keys.run_space(self.store.tenant, self.writer.run_id)
        compensating = call.kind == "compensation"
        active = self.writer.active

        def build() -> Txn:
            txn = self.writer.txn()
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
            settled(txn, call.key)  # a new attempt is in flight, no longer unknown
            return txn

        def recheck(info: RunInfo) -> None:
            # fn has not run yet: every check of a new call applies again.
            self.writer.check_writable(info, compensating=compensating)
            if not compensating:
                self.writer.check_budget(info)

        self.writer.commit(build, call.name, recheck)
        if active is not None:
            active.started_written = True
        # The caller invokes the effect next: on a store that acknowledges before
        # fsync, make EffectInvoked durable first.
        self.store.force_flush()

    def flag_unknown(self, recs: list[EffectRecord]) -> None:
        """Mark effects of unknown outcome: an event each (once) and ``RunInfo.unknown_effects``."""
        wanted = [r.key for r in recs]
        if all(r.flagged_unknown for r in recs) and set(wanted) <= set(
            self.writer.info.unknown_effects
        ):
            return
        self.store.observer.unknown_effect(self.writer.run_id, len(wanted))
        space = keys.run_space(self.store.tenant, self.writer.run_id)

        def build() -> Txn:
            txn = self.writer.txn()
            flagged = list(txn.base.unknown_effects)
            for key in wanted:
                rec, rec_bytes = self.store.read_effect(self.writer.run_id, key)
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
        self.writer.commit(build, recs[0].name, lambda info: None)

    def record(self, call: EffectCall, raw: object, source: str) -> JsonValue:
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
        output = self.store.redactor.redact_json(output)
        if delta and not call.top_level:
            raise InvalidInputError(
                f"effect {call.name!r} inside a step returned a state delta: return it from "
                "the step instead",
                field="state",
            )
        space = keys.run_space(self.store.tenant, self.writer.run_id)

        def build() -> Txn:
            rec, rec_bytes = self.store.read_effect(self.writer.run_id, call.key)
            if rec is None or rec.status is not EffectStatus.INVOKED:
                # Settled by the worker that took the run over? Then this one is fenced.
                self.writer.check_lease(self.writer.read_fresh())
                raise ConflictError(
                    f"effect {call.key!r} of run {self.writer.run_id!r} was settled by someone else "
                    "while it ran; nothing was recorded by this call"
                )
            txn = self.writer.txn()
            recorded_seq = txn.add_event(
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
                recorded_seq=recorded_seq,
            )
            data = encode(new)
            check_fits(
                self.store.kv.max_value_bytes, data, f"output of effect {call.name!r}", "output"
            )
            txn.puts.append(Put(space, keys.effect_key(call.key), data))
            txn.checks.append(Check(space, keys.effect_key(call.key), rec_bytes))
            settled(txn, call.key)
            self.writer.add_debit(txn, tokens, cost, call.key)
            if call.on_record is not None:
                call.on_record(txn)
            if call.top_level and not txn.base.status.finished:
                _, entry = self.writer.lookup(call.key, txn.base)
                self.writer.add_checkpoint(
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
        info = self.writer.commit(build, call.name, lambda fresh: None)
        self.store.observer.effect_recorded(
            self.writer.run_id, call.key, call.name, call.kind, source, call.elapsed()
        )
        if info.status.finished and call.kind != "compensation":
            why = (
                f"run {self.writer.run_id!r} was {info.status.value} while effect {call.name!r} ran: "
                f"its result was recorded (key {call.key!r}, no checkpoint); stop at this step "
                "boundary (compensate() may undo it)"
            )
            if info.status is RunStatus.CANCELLED:
                raise RunCancelledError(why)
            raise RunStateError(why)
        return output


class EffectDecisions:
    """The operator side of effects: deciding one whose outcome is unknown."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

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
        value = self.store.redactor.redact_json(value)
        space = keys.run_space(self.store.tenant, run_id)
        result: list[EffectRecord] = []

        def build(info: RunInfo, now: datetime) -> Txn | RunInfo:
            result.clear()
            rec, data = self.store.read_effect(run_id, key)
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
            settled(txn, key)
            result.append(new)
            return txn

        self.store.operate(run_id, build, "resolve an effect of")
        return result[0]


def settled(txn: Txn, key: str) -> None:
    """Drop ``key`` from the run's unknown effects, in the commit that settles it."""
    current = txn.head().unknown_effects
    if key in current:
        txn.update.unknown_effects = [k for k in current if k != key]
