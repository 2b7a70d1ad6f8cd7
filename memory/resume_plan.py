"""Dry-run replay: what resuming a run would do, read from the store without writing anything.

:func:`plan_resume` answers the runbook's "trigger replay with dry_run=true first":
the last committed checkpoint, the checkpoints a resumed worker replays from the
ledger instead of re-executing, the effects of unknown outcome and how each would be
reconciled, whether an approval gate blocks, the lease (live, whose, until when)
and the budget left. It only reads (``get_run``, the lineage, the effect ledger,
the approval gate), so it changes no byte of the store. Outputs, values and plans
are left out: the plan names steps, keys and ids, never content.
"""

from __future__ import annotations

from datetime import datetime

from pydantic import BaseModel, ConfigDict

from tiers.models import RunStatus, UtcDatetime, utcnow
from tiers.task import EffectStatus, TaskTier

__all__ = ["PlannedEffect", "PlannedReplay", "ResumePlan", "plan_resume"]


class PlannedReplay(BaseModel):
    """A committed checkpoint a resumed worker replays (its recorded output, not a new call)."""

    model_config = ConfigDict(frozen=True)

    seq: int
    checkpoint_id: str
    step: str
    kind: str
    idempotency_key: str


class PlannedEffect(BaseModel):
    """An effect invoked but never recorded, and what resuming would do about it.

    Attributes:
        key: The effect's idempotency key.
        name: The effect's name.
        attempt: How many times it was invoked.
        safe_to_retry: Whether it was declared idempotent.
        reconcile: ``operator`` (flagged unknown: the run is blocked until
            ``resolve_effect``), ``retry`` (idempotent: called again), or ``probe``
            (the worker's ``reconcile`` callback asks the external system by key;
            without one the effect is flagged unknown and the run blocks).
    """

    model_config = ConfigDict(frozen=True)

    key: str
    name: str
    attempt: int
    safe_to_retry: bool
    reconcile: str


class ResumePlan(BaseModel):
    """What resuming a run would do now (:meth:`~memory.Memory.plan_resume`).

    Attributes:
        run_id: The run.
        status: Its status.
        resumable: Whether a worker could take it and continue now (not finished,
            not paused at a gate, no effect waiting for an operator, no live lease of
            another worker).
        last_checkpoint_id: The last committed checkpoint of its lineage (``None``: none yet).
        last_seq: Its sequence number (0: none).
        replays: The lineage's checkpoints, oldest first: replayed from the ledger.
        recorded_effects: Idempotency keys of recorded effects (never called again).
        unknown_effects: Effects of unknown outcome, each with how it would be reconciled.
        approval_key: The approval gate the run is paused at, if any.
        approval_status: That gate's status (``requested``: it blocks; ``granted``/``rejected``).
        lease_live: Whether a worker holds a live lease now.
        lease_owner: The worker that holds (or last held) the lease.
        lease_expires_at: When the lease expires (``None``: no TTL).
        lease_epoch: The lease epoch a resume would increment.
        budget_tokens_left: Tokens left (``None``: no budget).
        budget_cost_left: Cost left (``None``: no budget).
    """

    model_config = ConfigDict(frozen=True)

    run_id: str
    status: RunStatus
    resumable: bool
    last_checkpoint_id: str | None
    last_seq: int
    replays: list[PlannedReplay]
    recorded_effects: list[str]
    unknown_effects: list[PlannedEffect]
    approval_key: str | None
    approval_status: str | None
    lease_live: bool
    lease_owner: str | None
    lease_expires_at: UtcDatetime | None
    lease_epoch: int
    budget_tokens_left: int | None
    budget_cost_left: float | None


def plan_resume(tasks: TaskTier, run_id: str, *, now: datetime | None = None) -> ResumePlan:
    """What resuming ``run_id`` would do now, without writing anything (see the module docstring).

    Raises:
        RunNotFoundError: No such run.
    """
    info = tasks.get_run(run_id)
    at = utcnow() if now is None else now
    # history() holds every branch; a resume replays the run's lineage only.
    lineage = [c for c in tasks.history(run_id) if info.in_lineage(c.seq)]
    records = tasks.effects(run_id)
    unknown = [
        PlannedEffect(
            key=rec.key,
            name=rec.name,
            attempt=rec.attempt,
            safe_to_retry=rec.safe_to_retry,
            reconcile=(
                "operator"
                if rec.key in info.unknown_effects
                else "retry"
                if rec.safe_to_retry
                else "probe"
            ),
        )
        for rec in records
        if rec.status is EffectStatus.INVOKED
    ]
    gate = info.pending_approval
    approval = None if gate is None else tasks.approval(run_id, gate.key)
    live = info.lease_live(at)
    blocked = info.status.finished or info.status is RunStatus.PAUSED or info.blocked
    return ResumePlan(
        run_id=run_id,
        status=info.status,
        resumable=not blocked and not live,
        last_checkpoint_id=lineage[-1].checkpoint_id if lineage else None,
        last_seq=lineage[-1].seq if lineage else 0,
        replays=[
            PlannedReplay(
                seq=c.seq,
                checkpoint_id=c.checkpoint_id,
                step=c.step,
                kind=c.kind,
                idempotency_key=c.idempotency_key,
            )
            for c in lineage
        ],
        recorded_effects=[r.key for r in records if r.status is EffectStatus.RECORDED],
        unknown_effects=unknown,
        approval_key=None if gate is None else gate.key,
        approval_status=None if approval is None else approval.status,
        lease_live=live,
        lease_owner=info.lease_owner,
        lease_expires_at=info.lease_expires_at,
        lease_epoch=info.lease_epoch,
        budget_tokens_left=(
            None if info.budget_tokens is None else max(0, info.budget_tokens - info.spent_tokens)
        ),
        budget_cost_left=(
            None if info.budget_cost is None else max(0.0, info.budget_cost - info.spent_cost)
        ),
    )
