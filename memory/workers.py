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

from __future__ import annotations

import importlib
import logging
import os
import random
import secrets
import socket
import threading
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING, TypeVar

from pydantic import JsonValue

from memory.settings import Settings
from tiers.backends.base import KVStore
from tiers.errors import (
    BackendUnavailableError,
    BudgetExceededError,
    ConflictError,
    InvalidInputError,
    RunNotFoundError,
    RunStateError,
    TierError,
)
from tiers.ids import check_id
from tiers.models import RunInfo
from tiers.redaction import Redactor
from tiers.task import Approval, Charged, RunHandle, TaskTier, input_hash

if TYPE_CHECKING:
    from memory.facade import Memory

__all__ = [
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

logger = logging.getLogger("tiermem.workers")

REGISTRATION_KEY = "tiermem.workflow"
"""Idempotency key of a workflow run's first checkpoint: ``{"workflow": name, "input": input}``."""

WORKFLOW_STATE_KEY = "tiermem.workflow"
"""The run state entry holding the name of the run's workflow."""

_REGISTRATION_STEP = "tiermem.workflow"

DEFAULT_LEASE_TTL = 30.0
"""Seconds a worker's lease lives without a heartbeat (heartbeats come every third of it)."""

WorkflowFn = Callable[["WorkflowRun", JsonValue], object]
"""A workflow: called with the run and the input it was started with; returns the run's result."""

_F = TypeVar("_F", bound=WorkflowFn)


class _DrainedError(Exception):
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
            raise _DrainedError(f"worker drains: run {self.run_id!r} stops before its next step")


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
        tasks = _task_tier(memory)
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
                if registered.input_hash != input_hash(record, step=_REGISTRATION_STEP):
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
                _REGISTRATION_STEP,
                lambda: Charged(record, state={WORKFLOW_STATE_KEY: name}),
                input=record,
                idempotency_key=REGISTRATION_KEY,
            )
        except BaseException:
            _let_go(handle)  # not registered: no worker takes it, and its id stays usable
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


def _task_tier(memory: Memory | TaskTier) -> TaskTier:
    if isinstance(memory, TaskTier):
        return memory
    return memory.tasks


@dataclass(frozen=True)
class WorkerApp:
    """What ``tiermem worker --app module:attr`` may name instead of a bare :class:`Workflows`.

    Attributes:
        workflows: The registry the worker runs.
        open_memory: Opens the :class:`~memory.facade.Memory` the worker's runs live in,
            from the settings (``TIERMEM_*``), for workflows that also use the session
            or user tiers. ``None``: the worker opens the KV store only
            (:func:`task_tier_from_settings`).
    """

    workflows: Workflows
    open_memory: Callable[[Settings], Memory] | None = None


def load_app(path: str) -> WorkerApp:
    """The :class:`WorkerApp` that ``module:attr`` names (a bare :class:`Workflows` is wrapped).

    Raises:
        ImportError: The module cannot be imported.
        AttributeError: The module has no such attribute.
        TypeError: ``path`` is not ``module:attr``, or the attribute is neither a
            :class:`Workflows` nor a :class:`WorkerApp`.
    """
    module_name, _, attr = path.partition(":")
    if not module_name or not attr:
        raise TypeError(f"--app {path!r}: use module:attr, e.g. myapp.workflows:workflows")
    target: object = importlib.import_module(module_name)
    for part in attr.split("."):
        target = getattr(target, part)
    if isinstance(target, Workflows):
        return WorkerApp(target)
    if isinstance(target, WorkerApp):
        return target
    raise TypeError(
        f"--app {path!r} is a {type(target).__name__}, not a memory.workers.Workflows or WorkerApp"
    )


def task_tier_from_settings(kv: KVStore, settings: Settings, tenant: str) -> TaskTier:
    """The task tier of ``tenant`` on ``kv``, configured as :meth:`Memory.from_settings` does."""
    return TaskTier(
        kv,
        tenant=tenant,
        retention=timedelta(days=settings.run_retention_days),
        snapshot_every=settings.snapshot_every,
        redactor=Redactor(
            settings.redact,
            patterns=settings.redact_patterns,
            placeholder=settings.redact_placeholder,
        ),
    )


class Worker:
    """Takes resumable runs of registered workflows and drives them to the end.

    Args:
        tasks: The task tier (one tenant) whose runs to serve.
        workflows: The workflows this worker knows; runs of others are left alone.
        concurrency: Runs driven at once (one thread each).
        lease_ttl: Seconds a lease lives without a heartbeat; a worker that dies
            without draining holds its runs this long.
        poll_interval: Seconds between listings when there is nothing to take.
        page_size: Resumable runs tried per page, oldest page first, shuffled within.
        name: Prefix of the worker ids (default ``<host>-<pid>-<random>``); thread
            ``i`` takes leases as ``<name>/<i>``.
    """

    def __init__(
        self,
        tasks: TaskTier,
        workflows: Workflows,
        *,
        concurrency: int = 1,
        lease_ttl: float = DEFAULT_LEASE_TTL,
        poll_interval: float = 1.0,
        page_size: int = 50,
        name: str | None = None,
    ) -> None:
        if isinstance(concurrency, bool) or not isinstance(concurrency, int) or concurrency < 1:
            raise InvalidInputError("concurrency must be an integer >= 1", field="concurrency")
        if not lease_ttl > 0:
            raise InvalidInputError("lease_ttl must be > 0 seconds", field="lease_ttl")
        if not poll_interval > 0:
            raise InvalidInputError("poll_interval must be > 0 seconds", field="poll_interval")
        if page_size < 1:
            raise InvalidInputError("page_size must be >= 1", field="page_size")
        self.tasks = tasks
        self.workflows = workflows
        self.concurrency = concurrency
        self.lease_ttl = float(lease_ttl)
        self.poll_interval = float(poll_interval)
        self.page_size = page_size
        self.name = name or f"{socket.gethostname()[:100]}-{os.getpid()}-{secrets.token_hex(4)}"
        self._draining = threading.Event()
        self._random = random.Random()

    def stop(self) -> None:
        """Drain: claim nothing more; each run stops after its current step and is released.

        Safe to call from a signal handler or another thread; :meth:`run` returns once drained.
        """
        self._draining.set()

    @property
    def draining(self) -> bool:
        """Whether :meth:`stop` was called."""
        return self._draining.is_set()

    def run(self) -> None:
        """Serve runs with ``concurrency`` threads until :meth:`stop`; returns when all are drained."""
        threads = [
            threading.Thread(target=self._loop, args=(f"{self.name}/{i}",), name=f"worker-{i}")
            for i in range(self.concurrency)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()

    def run_once(self, worker_id: str | None = None) -> str | None:
        """Take one resumable run and drive it until it ends, drains or is lost.

        Returns:
            The run's id, or ``None`` if there was nothing this worker could take.
        """
        claimed = self._claim(worker_id or f"{self.name}/0")
        if claimed is None:
            return None
        handle, workflow, input = claimed
        stop_heartbeat = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(handle, stop_heartbeat), name=f"beat-{handle.run_id}"
        )
        beat.start()
        try:
            self._execute(handle, workflow, input)
        finally:
            stop_heartbeat.set()
            beat.join()
        return handle.run_id

    def _loop(self, worker_id: str) -> None:
        while not self._draining.is_set():
            try:
                took = self.run_once(worker_id)
            except TierError as exc:  # the store is down or overloaded: wait and poll again
                logger.warning("worker %s: %s", worker_id, exc)
                took = None
            except Exception:  # a bug must not silently take a thread out of the fleet
                logger.exception("worker %s: unexpected error", worker_id)
                took = None
            if took is None:
                self._draining.wait(self.poll_interval)

    def _claim(self, worker_id: str) -> tuple[RunHandle, WorkflowFn, JsonValue] | None:
        """Lease the oldest resumable run of a known workflow that no other worker takes first."""
        runs = self.tasks.list_resumable()
        for start in range(0, len(runs), self.page_size):
            page = runs[start : start + self.page_size]
            # Oldest page first (no run waits forever), shuffled within the page so that
            # workers polling at once try different runs instead of colliding on one.
            self._random.shuffle(page)
            for info in page:
                if self._draining.is_set():
                    return None
                try:
                    found = registration(self.tasks, info.run_id)
                except RunNotFoundError:
                    continue  # deleted since the listing
                workflow = None if found is None else self.workflows.get(found[0])
                if found is None or workflow is None:
                    continue  # not a workflow run, or another fleet's workflow
                try:
                    handle = self.tasks.acquire(
                        info.run_id, worker_id=worker_id, lease_ttl=self.lease_ttl
                    )
                except (ConflictError, RunStateError, RunNotFoundError):
                    # LeaseHeldError (a ConflictError): another worker has it; or it ended,
                    # was deleted or changed meanwhile: next one.
                    continue
                logger.info("worker %s took run %s (%s)", worker_id, info.run_id, found[0])
                return handle, workflow, found[1]
        return None

    def _execute(self, handle: RunHandle, workflow: WorkflowFn, input: JsonValue) -> None:
        run_id = handle.run_id
        try:
            result = workflow(WorkflowRun(handle, self._draining), input)
        except _DrainedError:
            _let_go(handle)
            logger.info("run %s released on drain", run_id)
            return
        except BudgetExceededError as exc:
            # Released, it would be taken again at once and stop again: it ends here.
            _fail(handle, exc)
            return
        except (BackendUnavailableError, ConflictError, RunStateError, RunNotFoundError) as exc:
            # Lost the lease (fenced out), cancelled, paused at an approval gate, blocked on
            # an effect of unknown outcome, or the store failed: the run is not over.
            logger.info("run %s stopped: %s", run_id, exc)
            _let_go(handle)
            return
        except Exception as exc:  # the workflow's own error ends the run
            logger.warning("run %s failed: %s: %s", run_id, type(exc).__name__, exc)
            _fail(handle, exc)
            return
        try:
            handle.complete(result)
        except InvalidInputError as exc:  # a result that is no JSON is the workflow's bug
            _fail(handle, exc)
        except TierError as exc:
            logger.info("run %s was not completed here: %s", run_id, exc)
            _let_go(handle)

    def _heartbeat(self, handle: RunHandle, stop: threading.Event) -> None:
        while not stop.wait(self.lease_ttl / 3):
            try:
                handle.heartbeat()
            except (RunStateError, RunNotFoundError, ConflictError) as exc:
                # StaleWriterError (taken over), cancelled or finished: the workflow's next
                # write is refused by fencing; nothing left to renew.
                logger.info("run %s: heartbeat stops: %s", handle.run_id, exc)
                return
            except TierError as exc:  # the store hiccuped: try again at the next beat
                logger.warning("run %s: heartbeat failed: %s", handle.run_id, exc)


def _fail(handle: RunHandle, exc: Exception) -> None:
    """Fail the run with ``exc``; if that write is refused, the run is not ours to end."""
    try:
        handle.fail(f"{type(exc).__name__}: {exc}")
    except TierError as refused:
        logger.info("run %s was not failed here: %s", handle.run_id, refused)
        _let_go(handle)


def _let_go(handle: RunHandle) -> None:
    """Release the lease if this worker still holds it, so another worker resumes at once."""
    try:
        handle.release()
    except TierError as exc:  # fenced out, finished or deleted: nothing held any more
        logger.debug("run %s: nothing to release: %s", handle.run_id, exc)
