"""Human-approval gates: a run freezes a plan and pauses; an operator approves or rejects it.

:class:`ApprovalGate` is the worker's side (``RunHandle.await_approval``), :class:`Approvals`
the operator's (``TaskTier.approval`` / ``approve`` / ``reject``).
"""

from __future__ import annotations

import re
from datetime import datetime

from tiers import keys
from tiers.backends.base import Check, Put
from tiers.codec import decode, encode
from tiers.errors import (
    CorruptRecordError,
    InvalidInputError,
    PlanMismatchError,
    RunStateError,
)
from tiers.ids import check_id
from tiers.models import PendingApproval, RunInfo
from tiers.task._records import (
    MAX_NOTE,
    Approval,
    ApprovalRecord,
    EventKind,
    check_decider,
    check_key,
    input_hash,
    to_json,
)
from tiers.task._store import RunStore
from tiers.task._txn import Txn
from tiers.task._writer import RunWriter

_HEX_SHA256 = re.compile(r"[0-9a-f]{64}")

__all__ = ["ApprovalGate", "Approvals"]


class Approvals:
    """The operator side of approval gates: reading a gate, approving, rejecting."""

    def __init__(self, store: RunStore) -> None:
        self.store = store

    def approval(self, run_id: str, key: str) -> ApprovalRecord | None:
        """The gate ``key`` of a run: the frozen plan (as stored, redacted), and the decision if any.

        What an approver reads before deciding: ``RunInfo.pending_approval``
        names the gate and the plan's hash, this gives the plan itself.

        Returns:
            The gate's record, or ``None`` if the run never requested that gate.

        Raises:
            InvalidInputError: Bad ``run_id`` or ``key``.
            CorruptRecordError: The stored record is unreadable.
        """
        run_id = check_id(run_id, "run_id")
        key = check_key(key, "key")
        space = keys.run_space(self.store.tenant, run_id)
        (data,) = self.store.kv.get_many(space, [keys.approval_key(key)])
        if data is None:
            return None
        return decode(ApprovalRecord, data, where=f"{space}/{keys.approval_key(key)}")

    def approve(
        self,
        run_id: str,
        plan_hash: str,
        *,
        by: str,
        note: str | None = None,
        by_key: str | None = None,
    ) -> Approval:
        """Approve the plan a run waits on; the run becomes resumable and passes its gate.

        Approving an already approved plan again returns the same decision.

        Args:
            run_id: The paused run.
            plan_hash: The SHA-256 of the plan being approved (from
                :class:`ApprovalPendingError` or ``RunInfo.pending_approval``):
                the approval is bound to exactly that plan.
            by: Who approves, as the caller names them (kept in the event log and the gate).
            note: Optional comment, at most :data:`~tiers.task._records.MAX_NOTE` characters.
            by_key: Id of the credential the caller was authenticated with (a
                service passes its API key id), kept beside ``by``; ``None``
                from the library.

        Raises:
            InvalidInputError: Bad ``run_id``, ``plan_hash``, ``by``, ``by_key`` or ``note``.
            PlanMismatchError: The run waits on another plan.
            RunStateError: No approval is pending (and this plan was not approved), or the
                run is finished.
            RunNotFoundError: No such run.
        """
        return self._decide(run_id, plan_hash, by, by_key, note, granted=True)

    def reject(
        self,
        run_id: str,
        plan_hash: str,
        *,
        by: str,
        note: str | None = None,
        by_key: str | None = None,
    ) -> Approval:
        """Reject the plan a run waits on; the resumed run's gate returns ``approved=False``.

        Raises:
            InvalidInputError, PlanMismatchError, RunStateError, RunNotFoundError: As for
                :meth:`approve`.
        """
        return self._decide(run_id, plan_hash, by, by_key, note, granted=False)

    def _decide(
        self,
        run_id: str,
        plan_hash: str,
        by: str,
        by_key: str | None,
        note: str | None,
        *,
        granted: bool,
    ) -> Approval:
        check_id(run_id, "run_id")
        if not isinstance(plan_hash, str) or not _HEX_SHA256.fullmatch(plan_hash):
            raise InvalidInputError(
                "plan_hash must be a SHA-256 digest: 64 lowercase hex characters",
                field="plan_hash",
            )
        by, by_key = check_decider(by, by_key)
        if note is not None and (not isinstance(note, str) or len(note) > MAX_NOTE):
            raise InvalidInputError(
                f"note must be a string of at most {MAX_NOTE} characters", field="note"
            )
        wanted = "granted" if granted else "rejected"
        space = keys.run_space(self.store.tenant, run_id)
        decided: list[ApprovalRecord] = []

        def build(info: RunInfo, now: datetime) -> Txn | RunInfo:
            decided.clear()
            if info.status.finished:
                raise RunStateError(f"run {run_id!r} is {info.status.value}: nothing to approve")
            pending = info.pending_approval
            if pending is None:
                for appr_key, raw in self.store.kv.scan(space, prefix=keys.APPROVAL_PREFIX):
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
            (data,) = self.store.kv.get_many(space, [keys.approval_key(pending.key)])
            if data is None:
                raise CorruptRecordError(
                    f"run {run_id!r} waits on gate {pending.key!r}, which is not stored"
                )
            rec = decode(ApprovalRecord, data, where=f"{space}/{keys.approval_key(pending.key)}")
            new = rec.model_copy(
                update={
                    "status": wanted,
                    "decided_by": by,
                    "decided_by_key": by_key,
                    "decided_at": now,
                    "note": note,
                }
            )
            decided.append(new)
            txn = Txn(run_id, info.lease_epoch, info, now)
            kind = EventKind.APPROVAL_GRANTED if granted else EventKind.APPROVAL_REJECTED
            txn.add_event(kind, key=pending.key, plan_hash=plan_hash, by=by, by_key=by_key)
            txn.puts.append(Put(space, keys.approval_key(pending.key), encode(new)))
            txn.checks.append(Check(space, keys.approval_key(pending.key), data))
            txn.update.pending_approval = None
            return txn

        self.store.operate(run_id, build, "decide")
        rec = decided[0]
        self.store.observer.approval(run_id, rec.key, rec.status)
        return Approval(
            approved=rec.status == "granted",
            plan_hash=rec.plan_hash,
            by=rec.decided_by,
            by_key=rec.decided_by_key,
            at=rec.decided_at,
            note=rec.note,
        )


class ApprovalGate:
    """The worker side of approval gates: a :class:`~tiers.task.RunHandle` stopping at one."""

    def __init__(self, writer: RunWriter) -> None:
        self.writer = writer
        self.store = writer.store

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
        self.writer.refuse_nesting("approval")
        occurrence = self.writer.occurrences.get("\0approval", 0)
        gate = (
            f"{self.writer.run_id}/approval/{occurrence}" if key is None else check_key(key, "key")
        )
        plan_json = to_json(plan, field="plan")
        plan_hash = input_hash(plan_json, field="plan")
        info = self.writer.refresh(allow_paused=True)
        space = keys.run_space(self.store.tenant, self.writer.run_id)
        (data,) = self.store.kv.get_many(space, [keys.approval_key(gate)])
        if data is not None:
            rec = decode(ApprovalRecord, data, where=f"{space}/{keys.approval_key(gate)}")
            if rec.plan_hash != plan_hash:
                raise PlanMismatchError(
                    f"approval gate {gate!r} of run {self.writer.run_id!r} was requested for plan "
                    f"{rec.plan_hash[:12]}..., not {plan_hash[:12]}...: the plan changed between "
                    "runs; make it deterministic, or use a new gate key"
                )
            if rec.status == "requested":
                raise self.writer.pending(rec.plan_hash, gate)
            self.writer.occurrences["\0approval"] = occurrence + 1
            return Approval(
                approved=rec.status == "granted",
                plan_hash=rec.plan_hash,
                by=rec.decided_by,
                by_key=rec.decided_by_key,
                at=rec.decided_at,
                note=rec.note,
            )

        def build() -> Txn:
            txn = self.writer.txn()
            pending = txn.base.pending_approval
            if pending is not None:
                raise self.writer.pending(pending.plan_hash, pending.key)
            # The operator reviews the stored plan, redacted; its hash is of the plan as given.
            record = ApprovalRecord(
                key=gate,
                plan_hash=plan_hash,
                plan=self.store.redactor.redact_json(plan_json),
                requested_at=txn.now,
            )
            txn.add_event(EventKind.APPROVAL_REQUESTED, key=gate, plan_hash=plan_hash)
            txn.add_event(EventKind.RUN_PAUSED, reason="approval", key=gate)
            txn.puts.append(Put(space, keys.approval_key(gate), encode(record)))
            txn.checks.append(Check(space, keys.approval_key(gate), None))
            txn.update.pending_approval = PendingApproval(
                key=gate, plan_hash=plan_hash, requested_at=txn.now
            )
            return txn

        if info.pending_approval is not None:
            raise self.writer.pending(info.pending_approval.plan_hash, info.pending_approval.key)
        self.writer.commit(
            build, "approval", lambda fresh: self.writer.check_writable(fresh, allow_paused=True)
        )
        self.writer.store.observer.approval(self.writer.run_id, gate, "requested")
        raise self.writer.pending(plan_hash, gate)
