"""Workflows registered in code: the registry, the run a workflow drives, how a run names its workflow."""

from __future__ import annotations

import logging
import threading
from collections.abc import Callable
from typing import TYPE_CHECKING, TypeVar

from pydantic import JsonValue

from tiers.errors import ConflictError, InvalidInputError, RunNotFoundError, TierError
from tiers.ids import check_id
from tiers.models import RunInfo
from tiers.task import Approval, Charged, RunHandle, TaskTier, input_hash

if TYPE_CHECKING:
    from memory.facade import Memory

logger = logging.getLogger("tiermem.workers")

REGISTRATION_KEY = "tiermem.workflow"
"""Idempotency key of a workflow run's first checkpoint: ``{"workflow": name, "input": input}``."""

WORKFLOW_STATE_KEY = "tiermem.workflow"
"""The run state entry holding the name of the run's workflow."""

REGISTRATION_STEP = "tiermem.workflow"

DEFAULT_LEASE_TTL = 30.0
"""Seconds a worker's lease lives without a heartbeat (heartbeats come every third of it)."""

WorkflowFn = Callable[["WorkflowRun", JsonValue], object]
"""A workflow: called with the run and the input it was started with; returns the run's result."""

_F = TypeVar("_F", bound=WorkflowFn)


class DrainedError(Exception):
    """Raised at a step boundary of a draining worker: stop here, the run is released."""


class WorkflowRun:
    """What a workflow drives: the run's :class:`RunHandle`, stopped at step boundaries on drain.

    :meth:`step`, :meth:`effect` and :meth:`await_approval` are the handle's
    (same arguments, same errors); when the worker drains, the next top-level
    call raises instead of starting, so the step in progress is the last one
    committed by this worker. :attr:`handle` is the handle itself for anything
    else (its calls are not drain points).
    """

    def __init__(self, handle: RunHandle, draining: threading.Event) -> None:
        self.handle = handle
        self._draining = draining
        # Calls nested in a step's function belong to that step: never a drain point.
        self._depth = 0

    @property
    def run_id(self) -> str:
        """The run's id."""
        return self.handle.run_id

    @property
    def user_id(self) -> str:
        """The run's owner."""
        return self.handle.user_id

    @property
    def resumed(self) -> bool:
        """Whether this worker resumed an existing run (always, for a worker's run)."""
        return self.handle.resumed

    @property
    def state(self) -> dict[str, JsonValue]:
        """The run's state (see :attr:`RunHandle.state`)."""
        return self.handle.state

    def step(
        self,
        name: str,
        fn: Callable[[], object],
        *,
        input: object = None,
        idempotency_key: str | None = None,
    ) -> JsonValue:
        """:meth:`RunHandle.step`, or stop here if the worker drains."""
        self._drain_point()
        self._depth += 1
        try:
            return self.handle.step(name, fn, input=input, idempotency_key=idempotency_key)
        finally:
            self._depth -= 1

    def effect(
        self,
        name: str,
        fn: Callable[[], object] | Callable[[str], object],
        *,
        idempotency_key: str | None = None,
        input: object = None,
        safe_to_retry: bool = False,
        reconcile: Callable[[str], object] | None = None,
        compensation: Callable[[JsonValue], object] | None = None,
    ) -> JsonValue:
        """:meth:`RunHandle.effect`, or stop here (before it is invoked) if the worker drains."""
        self._drain_point()
        self._depth += 1
        try:
            return self.handle.effect(
                name,
                fn,
                idempotency_key=idempotency_key,
                input=input,
                safe_to_retry=safe_to_retry,
                reconcile=reconcile,
                compensation=compensation,
            )
        finally:
            self._depth -= 1

    def await_approval(self, plan: object, *, key: str | None = None) -> Approval:
        """:meth:`RunHandle.await_approval`, or stop here if the worker drains."""
        self._drain_point()
        return self.handle.await_approval(plan, key=key)

    def _drain_point(self) -> None:
        if self._depth == 0 and self._draining.is_set():
            raise DrainedError(f"worker drains: run {self.run_id!r} stops before its next step")


class Workflows:
    """A registry of workflows by name, and how to start a run of one."""

    def __init__(self) -> None:
        self._workflows: dict[str, WorkflowFn] = {}

    def workflow(self, name: str) -> Callable[[_F], _F]:
        """Register the decorated function as the workflow ``name``.

        Raises:
            InvalidInputError: ``name`` is empty or already registered.
        """
        if not isinstance(name, str) or not name.strip():
            raise InvalidInputError("a workflow name must be a non-empty string", field="name")

        def register(fn: _F) -> _F:
            if name in self._workflows:
                raise InvalidInputError(
                    f"workflow {name!r} is registered already: choose another name", field="name"
                )
            self._workflows[name] = fn
            return fn

        return register

    def get(self, name: str) -> WorkflowFn | None:
        """The workflow registered as ``name``, if any."""
        return self._workflows.get(name)

    @property
    def names(self) -> list[str]:
        """The registered workflows' names, sorted."""
        return sorted(self._workflows)

    def start(
        self,
        memory: Memory | TaskTier,
        user_id: str,
        name: str,
        input: object = None,
        *,
        run_id: str | None = None,
        budget_tokens: int | None = None,
        budget_cost: float | None = None,
    ) -> RunInfo:
        """Start a run of workflow ``name`` with ``input`` and leave it to the workers.

        The run is created (or, when ``run_id`` names a run that was never
        registered, e.g. its starter died, resumed), its first checkpoint
        records the workflow and input (:data:`REGISTRATION_KEY`), and the
        lease is released: the run is ``resumable`` and the next worker that
        polls takes it. Starting again with the same ``run_id``, name and input
        returns the run as it is (safe to retry).

        The input is stored like a step's output: with redaction on, what the
        redactor finds in it (secrets) is replaced before it is stored, and the
        worker gets the redacted input; pass references to secrets, not secrets.

        Args:
            memory: A :class:`~memory.facade.Memory` (its tenant's task tier) or a task tier.
            user_id: Owner of the run.
            name: A registered workflow.
            input: The workflow's JSON-serialisable input.
            run_id: The run's id (default: a new one).
            budget_tokens: Token budget of the run (``None``: unlimited).
            budget_cost: Cost budget of the run (``None``: unlimited).

        Returns:
            The run's head.

        Raises:
            InvalidInputError: Unknown workflow, bad ids or non-JSON input.
            ConflictError: ``run_id`` is a run of another workflow or input, or of another user.
            LeaseHeldError: ``run_id`` is an unregistered run another worker holds.
            RunStateError: ``run_id`` is an unregistered run that is finished.
        """
        if name not in self._workflows:
            known = ", ".join(self.names) or "none"
            raise InvalidInputError(
                f"unknown workflow {name!r}: register it with @workflows.workflow (known: {known})",
                field="name",
            )
        tasks = task_tier(memory)
        record = {"workflow": name, "input": input}
        if run_id is not None:
            check_id(run_id, "run_id")
            try:
                info: RunInfo | None = tasks.get_run(run_id)
            except RunNotFoundError:
                info = None
            if info is not None and info.user_id != user_id:
                raise ConflictError(f"run id {run_id!r} is taken by another user")
            registered = (
                None if info is None else tasks.checkpoint_for_key(run_id, REGISTRATION_KEY)
            )
            if info is not None and registered is not None:
                # Compared by the hash of what was given (the stored input may be redacted).
                if registered.input_hash != input_hash(record, step=REGISTRATION_STEP):
                    raise ConflictError(
                        f"run {run_id!r} runs another workflow or input: choose another run_id"
                    )
                return info
        handle = tasks.start_run(
            user_id,
            run_id,
            lease_ttl=DEFAULT_LEASE_TTL,
            budget_tokens=budget_tokens,
            budget_cost=budget_cost,
        )
        try:
            handle.step(
                REGISTRATION_STEP,
                lambda: Charged(record, state={WORKFLOW_STATE_KEY: name}),
                input=record,
                idempotency_key=REGISTRATION_KEY,
            )
        except BaseException:
            release_quietly(handle)  # not registered: no worker takes it, and its id stays usable
            raise
        # Given back at once: the first worker that polls takes it, not one after the TTL.
        return handle.release()


def registration(tasks: TaskTier, run_id: str) -> tuple[str, JsonValue] | None:
    """The workflow name and input a run was started with, or ``None`` if it is no workflow run."""
    checkpoint = tasks.checkpoint_for_key(run_id, REGISTRATION_KEY)
    if checkpoint is None or not isinstance(checkpoint.output, dict):
        return None
    name = checkpoint.output.get("workflow")
    if not isinstance(name, str):
        return None
    return name, checkpoint.output.get("input")


def task_tier(memory: Memory | TaskTier) -> TaskTier:
    if isinstance(memory, TaskTier):
        return memory
    return memory.tasks


def release_quietly(handle: RunHandle) -> None:
    """Release the lease if this worker still holds it, so another worker resumes at once."""
    try:
        handle.release()
    except TierError as exc:  # fenced out, finished or deleted: nothing held any more
        logger.debug("run %s: nothing to release: %s", handle.run_id, exc)
