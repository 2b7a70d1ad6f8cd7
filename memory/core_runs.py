"""The task-tier methods of :class:`~memory.core.Memory`: each delegates to :class:`~memory.runs.RunOperations`.

Kept apart from ``core.py`` so the facade's runs, the largest group, read as one unit.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import JsonValue

from memory.resume_plan import ResumePlan
from memory.runs import RunOperations
from tiers.models import Checkpoint, RunInfo, RunStatus
from tiers.task import UNSET, Approval, ApprovalRecord, EffectRecord, Event, RunHandle


class RunMethods:
    """Memory's runs: start, resume, approve, fork, inspect and delete them (this tenant's)."""

    _runs: RunOperations

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
        external_id: str | None = None,
    ) -> RunHandle:
        """Start a run, or resume it (taking its lease) if it exists."""
        return self._runs.start_run(
            user_id,
            run_id,
            resume=resume,
            worker_id=worker_id,
            lease_ttl=lease_ttl,
            steal=steal,
            budget_tokens=budget_tokens,
            budget_cost=budget_cost,
            external_id=external_id,
        )

    def cancel_run(self, run_id: str) -> RunInfo:
        """Cancel a run; its worker stops at its next step boundary."""
        return self._runs.cancel_run(run_id)

    def set_budget(
        self,
        run_id: str,
        *,
        tokens: int | None = UNSET,
        cost: float | None = UNSET,
        by: str = "operator",
        by_key: str | None = None,
    ) -> RunInfo:
        """Change a run's token and/or cost budget (a limit not given stays; ``None``: unlimited)."""
        return self._runs.set_budget(run_id, tokens=tokens, cost=cost, by=by, by_key=by_key)

    def approve_run(
        self,
        run_id: str,
        plan_hash: str,
        *,
        by: str,
        note: str | None = None,
        by_key: str | None = None,
    ) -> Approval:
        """Approve the plan a run is waiting on (``PlanMismatchError`` for another plan)."""
        return self._runs.approve_run(run_id, plan_hash, by=by, note=note, by_key=by_key)

    def reject_run(
        self,
        run_id: str,
        plan_hash: str,
        *,
        by: str,
        note: str | None = None,
        by_key: str | None = None,
    ) -> Approval:
        """Reject the plan a run is waiting on."""
        return self._runs.reject_run(run_id, plan_hash, by=by, note=note, by_key=by_key)

    def fork_run(self, run_id: str, checkpoint_id: str, new_run_id: str | None = None) -> RunInfo:
        """Start a new run from a checkpoint of another (time travel); the parent link is kept."""
        return self._runs.fork_run(run_id, checkpoint_id, new_run_id)

    def list_resumable_runs(
        self, *, limit: int | None = None, after: str | None = None
    ) -> list[RunInfo]:
        """Unfinished runs whose lease has expired (all, or one page in run-id order after ``after``)."""
        return self._runs.list_resumable_runs(limit=limit, after=after)

    def sweep_runs(self, *, now: datetime | None = None) -> list[str]:
        """Delete this tenant's runs that finished (completed, failed, cancelled) over ``run_retention`` ago."""
        return self._runs.sweep_runs(now=now)

    def run_state_at(self, run_id: str, checkpoint_id: str) -> dict[str, JsonValue]:
        """A run's state values as of one of its checkpoints (time travel; see ``TaskTier.state_at``)."""
        return self._runs.run_state_at(run_id, checkpoint_id)

    def update_run_state(
        self,
        run_id: str,
        checkpoint_id: str,
        values: dict[str, Any],
        *,
        by: str = "operator",
        by_key: str | None = None,
    ) -> Checkpoint:
        """Edit a run's state as of a checkpoint: a new branch from there (see ``TaskTier.update_state``)."""
        return self._runs.update_run_state(run_id, checkpoint_id, values, by=by, by_key=by_key)

    def attach_run(
        self,
        run_id: str,
        lease_epoch: int,
        *,
        incarnation: str | None = None,
        finished_ok: bool = False,
    ) -> RunHandle:
        """A handle on the lease a caller holds already, by its epoch, without taking it again."""
        return self._runs.attach_run(
            run_id, lease_epoch, incarnation=incarnation, finished_ok=finished_ok
        )

    def get_effect(self, run_id: str, key: str) -> EffectRecord:
        """One entry of a run's effect ledger, by its idempotency key."""
        return self._runs.get_effect(run_id, key)

    def run_approval(self, run_id: str, key: str) -> ApprovalRecord | None:
        """A run's approval gate ``key`` (frozen plan, hash, decision), or ``None``."""
        return self._runs.run_approval(run_id, key)

    def run_effects(
        self, run_id: str, *, after_key: str | None = None, limit: int | None = None
    ) -> list[EffectRecord]:
        """A run's effect ledger in key order, whole or a page after ``after_key``."""
        return self._runs.run_effects(run_id, after_key=after_key, limit=limit)

    def count_run_effects(self, run_id: str, *, after_key: str | None = None) -> int:
        """How many effects a run's ledger holds (after ``after_key``): a pager's total."""
        return self._runs.count_run_effects(run_id, after_key=after_key)

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
        """Decide an effect of unknown outcome: it happened (``output=``) or not (``rerun=True``)."""
        return self._runs.resolve_effect(
            run_id, key, output=output, rerun=rerun, by=by, by_key=by_key
        )

    def get_run(self, run_id: str) -> RunInfo:
        """Status and head of a run (``RunNotFoundError`` if none)."""
        return self._runs.get_run(run_id)

    def plan_resume(self, run_id: str) -> ResumePlan:
        """What resuming the run would do now, writing nothing (dry-run replay)."""
        return self._runs.plan_resume(run_id)

    def delete_run(self, run_id: str) -> bool:
        """Delete a run whole, whatever its status: head, checkpoints, events, effect ledger."""
        return self._runs.delete_run(run_id)

    def get_checkpoint(self, run_id: str, checkpoint_id: str) -> Checkpoint:
        """One checkpoint of a run by its id (any branch), in one point read."""
        return self._runs.get_checkpoint(run_id, checkpoint_id)

    def checkpoint_for_key(self, run_id: str, idempotency_key: str) -> Checkpoint | None:
        """The checkpoint that committed an idempotency key on the run's current branch."""
        return self._runs.checkpoint_for_key(run_id, idempotency_key)

    def run_history(
        self,
        run_id: str,
        *,
        newest_first: bool = False,
        limit: int | None = None,
        after_seq: int | None = None,
        before_seq: int | None = None,
    ) -> list[Checkpoint]:
        """A run's checkpoints: all of them in sequence order by default, or one page."""
        return self._runs.run_history(
            run_id,
            newest_first=newest_first,
            limit=limit,
            after_seq=after_seq,
            before_seq=before_seq,
        )

    def run_events(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """A run's append-only event log, the audit trail of the run, in sequence order."""
        return self._runs.run_events(run_id, after_seq=after_seq, limit=limit)

    def list_runs(
        self,
        *,
        user_id: str | None = None,
        status: RunStatus | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[RunInfo]:
        """Runs of this tenant, optionally filtered; all oldest first, or one page in run-id order."""
        return self._runs.list_runs(user_id=user_id, status=status, limit=limit, after=after)
