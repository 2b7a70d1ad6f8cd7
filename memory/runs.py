"""The run operations of :class:`~memory.Memory`: task runs, their checkpoints, effects and approvals.

:class:`RunOperations` is composed into ``Memory`` around its task tier; every
``Memory`` run method delegates to the method of the same name here, which
holds its contract.
"""

from __future__ import annotations

from datetime import datetime
from typing import Any

from pydantic import JsonValue

from memory.resume_plan import ResumePlan, plan_resume
from tiers.models import Checkpoint, RunInfo, RunStatus
from tiers.task import UNSET, Approval, ApprovalRecord, EffectRecord, Event, RunHandle, TaskTier
from tiers.values import check_datetime


class RunOperations:
    """A tenant's task runs, as :class:`~memory.Memory` offers them.

    Args:
        tasks: The tenant's task tier.
    """

    def __init__(self, tasks: TaskTier) -> None:
        self._tasks = tasks

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
        """Start a run, or resume it (taking its lease) if it exists.

        With ``lease_ttl`` the lease expires unless the handle heartbeats, and
        another worker gets ``LeaseHeldError`` while it is live (unless ``steal``).
        A caller that names no ``worker_id`` is a worker of its own for this call
        (another thread or call of the same process included); to retake its own
        live lease it passes ``worker_id=handle.worker_id``.
        ``external_id`` is the run's id in another system (a framework's session
        or thread id, any string): it is kept in ``RunInfo.external_id``, and
        without ``run_id`` the run's id is ``run_id_for(external_id)``.
        """
        return self._tasks.start_run(
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
        return self._tasks.cancel(run_id)

    def set_budget(
        self,
        run_id: str,
        *,
        tokens: int | None = UNSET,
        cost: float | None = UNSET,
        by: str = "operator",
        by_key: str | None = None,
    ) -> RunInfo:
        """Change a run's token and/or cost budget: how a run that spent its budget goes on.

        A limit not given stays as it is; ``None`` removes it (unlimited). The
        run's worker sees the new budget at its next step (a step refused with
        ``BudgetExceededError`` may be retried). A ``BudgetSet`` event records
        the new limits with ``by`` and ``by_key`` (as for :meth:`approve_run`).

        Returns:
            The run's head with the new budget.

        Raises:
            InvalidInputError: Neither ``tokens`` nor ``cost`` given; a negative,
                NaN or infinite budget, or a non-integer token budget; a bad ``by``
                or ``by_key``.
            RunNotFoundError: No such run.
        """
        return self._tasks.set_budget(run_id, tokens=tokens, cost=cost, by=by, by_key=by_key)

    def approve_run(
        self,
        run_id: str,
        plan_hash: str,
        *,
        by: str,
        note: str | None = None,
        by_key: str | None = None,
    ) -> Approval:
        """Approve the plan a run is waiting on (``PlanMismatchError`` for another plan).

        ``by`` is who decides, as the caller names them; ``by_key`` the id of
        the API key a service authenticated the decision with, kept beside it.
        """
        return self._tasks.approve(run_id, plan_hash, by=by, note=note, by_key=by_key)

    def reject_run(
        self,
        run_id: str,
        plan_hash: str,
        *,
        by: str,
        note: str | None = None,
        by_key: str | None = None,
    ) -> Approval:
        """Reject the plan a run is waiting on (``by`` and ``by_key`` as for :meth:`approve_run`)."""
        return self._tasks.reject(run_id, plan_hash, by=by, note=note, by_key=by_key)

    def fork_run(self, run_id: str, checkpoint_id: str, new_run_id: str | None = None) -> RunInfo:
        """Start a new run from a checkpoint of another (time travel); the parent link is kept."""
        return self._tasks.fork(run_id, checkpoint_id, new_run_id)

    def list_resumable_runs(
        self, *, limit: int | None = None, after: str | None = None
    ) -> list[RunInfo]:
        """Unfinished runs whose lease has expired: work for a worker pool after a deploy.

        Runs blocked on an effect of unknown outcome (``RunInfo.unknown_effects``)
        are left out until :meth:`resolve_effect` settles it. Oldest last
        checkpoint first; paged (``limit`` or ``after``, the last run id of the
        previous page), in run-id order, each page reading only its own runs'
        heads and those it skips (a page shorter than ``limit`` is the last).

        Raises:
            InvalidInputError: Bad ``after`` (not a run id) or negative ``limit``.
        """
        return self._tasks.list_resumable(limit=limit, after=after)

    def sweep_runs(self, *, now: datetime | None = None) -> list[str]:
        """Delete this tenant's runs that finished (completed, failed, cancelled) over ``run_retention`` ago.

        Deletes each run whole (head, events, checkpoints, effect ledger) in one
        commit; a run that changes meanwhile is left for the next sweep.
        ``tiermem sweep`` and the HTTP service (every
        ``run_sweep_interval_seconds``) call this.

        Args:
            now: The time to measure ages from (default: now).

        Returns:
            The ids of the deleted runs.
        """
        if now is not None:
            now = check_datetime(now, "now")
        return self._tasks.sweep(now=now)

    def run_state_at(self, run_id: str, checkpoint_id: str) -> dict[str, JsonValue]:
        """A run's state values as of one of its checkpoints (time travel; see ``TaskTier.state_at``)."""
        return self._tasks.state_at(run_id, checkpoint_id)

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
        return self._tasks.update_state(run_id, checkpoint_id, values, by=by, by_key=by_key)

    def attach_run(
        self,
        run_id: str,
        lease_epoch: int,
        *,
        incarnation: str | None = None,
        finished_ok: bool = False,
    ) -> RunHandle:
        """A handle on the lease a caller holds already, by its epoch, without taking it again.

        How a stateless caller (an HTTP request) keeps writing with the epoch it
        got from :meth:`start_run`: once another worker resumed the run, the
        handle's writes raise ``StaleWriterError`` and write nothing.

        Args:
            run_id: The run.
            lease_epoch: The lease epoch the caller holds.
            incarnation: The run's incarnation the caller started (a run deleted
                and started again under the same id is another one).
            finished_ok: Attach to a finished run too (to record an effect that
                ran while the run was cancelled).

        Raises:
            RunNotFoundError: No such run (or another incarnation of it).
            StaleWriterError: ``lease_epoch`` is not the current one.
        """
        return self._tasks.attach(
            run_id, lease_epoch, finished_ok=finished_ok, incarnation=incarnation
        )

    def get_effect(self, run_id: str, key: str) -> EffectRecord:
        """One entry of a run's effect ledger, by its idempotency key.

        Raises:
            RunNotFoundError: No such run.
            EffectNotFoundError: The run has no effect with that key.
        """
        return self._tasks.get_effect(run_id, key)

    def run_approval(self, run_id: str, key: str) -> ApprovalRecord | None:
        """A run's approval gate ``key``: its frozen plan (as stored, redacted), hash and decision.

        Returns:
            The gate, or ``None`` if the run never requested it.

        Raises:
            RunNotFoundError: No such run.
        """
        return self._tasks.approval(run_id, key)

    def run_effects(
        self, run_id: str, *, after_key: str | None = None, limit: int | None = None
    ) -> list[EffectRecord]:
        """A run's effect ledger: every external effect, its status and recorded output.

        In idempotency-key order; page with ``limit`` and ``after_key`` (the last
        key of the previous page).

        Raises:
            RunNotFoundError: No such run.
            InvalidInputError: Negative ``limit``.
        """
        return self._tasks.effects(run_id, after_key=after_key, limit=limit)

    def count_run_effects(self, run_id: str, *, after_key: str | None = None) -> int:
        """How many effects a run's ledger holds (only those whose key sorts after ``after_key``).

        The total beside a page of :meth:`run_effects`, counted without decoding the records.

        Raises:
            RunNotFoundError: No such run.
        """
        return self._tasks.count_effects(run_id, after_key=after_key)

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
        """Decide an effect of unknown outcome: it happened (``output=``) or not (``rerun=True``).

        See ``TaskTier.resolve_effect``; this unblocks the run.
        """
        return self._tasks.resolve_effect(
            run_id, key, output=output, rerun=rerun, by=by, by_key=by_key
        )

    def get_run(self, run_id: str) -> RunInfo:
        """Status and head of a run (``RunNotFoundError`` if none)."""
        return self._tasks.get_run(run_id)

    def plan_resume(self, run_id: str) -> ResumePlan:
        """Dry-run replay: what resuming the run would do now, without writing anything.

        The last committed checkpoint, the checkpoints a resumed worker replays
        from the ledger, the effects of unknown outcome and how each would be
        reconciled, the approval gate that blocks it, the lease (live, whose,
        until when) and the budget left. Names and keys only, never outputs.

        Raises:
            RunNotFoundError: No such run.
        """
        return plan_resume(self._tasks, run_id)

    def delete_run(self, run_id: str) -> bool:
        """Delete a run whole, whatever its status: head, checkpoints, events, effect ledger.

        One atomic commit. A worker still holding the run's lease writes
        nothing more: its next write raises ``RunNotFoundError`` and cannot
        bring the run back; ``start_run`` with the same id later starts a new run.

        Returns:
            ``True`` if the run was deleted, ``False`` if there was none.

        Raises:
            InvalidInputError: Bad ``run_id``.
        """
        return self._tasks.delete_run(run_id)

    def get_checkpoint(self, run_id: str, checkpoint_id: str) -> Checkpoint:
        """One checkpoint of a run by its id (any branch), in one point read.

        Raises:
            RunNotFoundError: No such run.
            CheckpointNotFoundError: The run has no checkpoint with that id.
        """
        return self._tasks.get_checkpoint(run_id, checkpoint_id)

    def checkpoint_for_key(self, run_id: str, idempotency_key: str) -> Checkpoint | None:
        """The checkpoint that committed an idempotency key on the run's current branch.

        What a step replayed with that key returns; point reads only.

        Returns:
            The checkpoint, or ``None`` if no step on the current branch committed the key.

        Raises:
            RunNotFoundError: No such run.
            InvalidInputError: Bad ``idempotency_key``.
        """
        return self._tasks.checkpoint_for_key(run_id, idempotency_key)

    def run_history(
        self,
        run_id: str,
        *,
        newest_first: bool = False,
        limit: int | None = None,
        after_seq: int | None = None,
        before_seq: int | None = None,
    ) -> list[Checkpoint]:
        """A run's checkpoints: all of them in sequence order by default, or one page.

        A page costs its own size, however long the run. The cursor of the next
        page is the last checkpoint's seq: ``before_seq=page[-1].seq`` newest
        first, ``after_seq=page[-1].seq`` oldest first.

        Args:
            run_id: The run.
            newest_first: Descending seq order: the latest ``limit`` checkpoints first.
            limit: At most this many (``None``: every one in range).
            after_seq: Only checkpoints with a larger seq.
            before_seq: Only checkpoints with a smaller seq.

        Raises:
            RunNotFoundError: No such run.
            InvalidInputError: Negative ``limit``, ``after_seq`` or ``before_seq``.
        """
        return self._tasks.history(
            run_id,
            newest_first=newest_first,
            limit=limit,
            after_seq=after_seq,
            before_seq=before_seq,
        )

    def run_events(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """A run's append-only event log, the audit trail of the run, in sequence order.

        Args:
            run_id: The run.
            after_seq: Only events after this seq (for paging).
            limit: At most this many.

        Raises:
            RunNotFoundError: No such run.
            InvalidInputError: Negative ``after_seq`` or ``limit``.
        """
        return self._tasks.events(run_id, after_seq=after_seq, limit=limit)

    def list_runs(
        self,
        *,
        user_id: str | None = None,
        status: RunStatus | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[RunInfo]:
        """Runs of this tenant, optionally filtered; all of them oldest first, or one page.

        Paged (``limit`` or ``after``, the last run id of the previous page):
        in run-id order, each page reading only its own runs' heads and those
        it skips (a page shorter than ``limit`` is the last).

        Raises:
            InvalidInputError: Bad ``user_id`` or ``after`` (not a run id),
                negative ``limit``, or an unknown ``status``.
        """
        return self._tasks.list_runs(user_id=user_id, status=status, limit=limit, after=after)
