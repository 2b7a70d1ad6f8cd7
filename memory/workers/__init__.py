"""Workflows registered in code, and the worker fleet that runs them (``tiermem worker``).

A *workflow* is a function ``(run, input) -> result`` whose steps are
``run.step(...)`` and ``run.effect(...)``: the task tier's checkpoint-resume
contract, so a run resumed by another process replays its committed steps and
never repeats a recorded effect. :class:`Workflows` is a registry of them::

    workflows = Workflows()

    @workflows.workflow("refund")
    def refund(run: WorkflowRun, order: JsonValue) -> JsonValue:
        checked = run.step("validate", lambda: validate(order))
        run.effect("pay", lambda key: pay(order, key), reconcile=find_payment)
        return {"refunded": checked}

    workflows.start(memory, "maria", "refund", {"order": "ORD-1"}, run_id="refund-42")

How a run names its workflow: :meth:`Workflows.start` starts the run and
commits its first checkpoint under the idempotency key :data:`REGISTRATION_KEY`,
whose output is ``{"workflow": name, "input": input}`` and which also sets the
run's state entry :data:`WORKFLOW_STATE_KEY` to the name. Then it releases the
lease, so the run is ``resumable`` and any worker takes it. Nothing else is
stored: a run is an ordinary task-tier run.

:class:`Worker` is the loop of ``tiermem worker``: it lists resumable runs
(:meth:`TaskTier.list_resumable`, oldest first, in pages shuffled so that
workers do not all race for the same run), skips runs of workflows it does not
know, takes one with ``acquire(..., lease_ttl=...)`` (:class:`LeaseHeldError`:
another worker was faster, try the next), renews the lease every ``ttl/3``
from a heartbeat thread while the workflow runs, and completes the run with the
workflow's result or fails it with the workflow's error. On :meth:`Worker.stop`
(SIGTERM) it drains: it claims nothing more, each running workflow finishes the
step it is in (its checkpoint is committed) and stops before the next one, and
its lease is released so another worker resumes the run at once. A worker that
dies without draining (SIGKILL) keeps its leases until their TTL runs out;
then other workers resume its runs.

Guarantees are the task tier's: effects recorded in the ledger happen once;
a step interrupted before its checkpoint runs again (at least once); a stale
worker is fenced out of every write. The fleet needs a store shared by
processes (Redis or PostgreSQL): the embedded SQLite store is one process per
data dir.
"""

from memory.workers._worker import Worker, WorkerApp, load_app, task_tier_from_settings
from memory.workers._workflows import (
    DEFAULT_LEASE_TTL,
    REGISTRATION_KEY,
    WORKFLOW_STATE_KEY,
    WorkflowFn,
    WorkflowRun,
    Workflows,
    registration,
)

__all__ = [
    "DEFAULT_LEASE_TTL",
    "REGISTRATION_KEY",
    "WORKFLOW_STATE_KEY",
    "Worker",
    "WorkerApp",
    "WorkflowFn",
    "WorkflowRun",
    "Workflows",
    "load_app",
    "registration",
    "task_tier_from_settings",
]
