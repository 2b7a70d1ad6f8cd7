"""The worker of ``tiermem worker``: claims resumable runs of registered workflows and drives them."""

from __future__ import annotations

import importlib
import logging
import os
import random
import secrets
import socket
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from pydantic import JsonValue

from memory.settings import Settings
from memory.workers._workflows import (
    DEFAULT_LEASE_TTL,
    DrainedError,
    WorkflowFn,
    WorkflowRun,
    Workflows,
    registration,
    release_quietly,
)
from tiers.backends.base import KVStore
from tiers.errors import (
    BackendUnavailableError,
    BudgetExceededError,
    ConflictError,
    InvalidInputError,
    RunNotFoundError,
    RunStateError,
    StaleWriterError,
    StoreClosedError,
    TierError,
)
from tiers.redaction import Redactor
from tiers.task import RunHandle, TaskTier

if TYPE_CHECKING:
    from memory.facade import Memory
    from memory.metrics import TiermemMetrics

logger = logging.getLogger("tiermem.workers")


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


def task_tier_from_settings(
    kv: KVStore, settings: Settings, tenant: str, *, metrics: TiermemMetrics | None = None
) -> TaskTier:
    """The task tier of ``tenant`` on ``kv``, configured as :meth:`Memory.from_settings` does.

    ``metrics``, if given, hears the tier's reports (resumes, takeovers, fencing) as a
    :class:`~memory.Memory` built with it would.
    """
    return TaskTier(
        kv,
        tenant=tenant,
        observer=metrics,
        retention=timedelta(days=settings.run_retention_days),
        snapshot_every=settings.snapshot_every,
        head_fresh_ms=settings.head_fresh_ms,
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
        metrics: Where to count the runs claimed, finished (by outcome) and active,
            each poll's latency and the time idle (the ``tiermem_worker_*`` families of
            :class:`~memory.metrics.TiermemMetrics`); default: not counted.
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
        metrics: TiermemMetrics | None = None,
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
        self.metrics = metrics
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
        started = time.monotonic()
        try:
            claimed = self._claim(worker_id or f"{self.name}/0")
        finally:
            if self.metrics is not None:
                self.metrics.worker_claim.observe(time.monotonic() - started)
        if claimed is None:
            return None
        handle, workflow, input = claimed
        if self.metrics is not None:
            self.metrics.worker_runs_claimed.inc()
            self.metrics.worker_runs_active.inc()
        stop_heartbeat = threading.Event()
        beat = threading.Thread(
            target=self._heartbeat, args=(handle, stop_heartbeat), name=f"beat-{handle.run_id}"
        )
        beat.start()
        outcome = "released"  # if _execute itself raises, the run is not over
        try:
            outcome = self._execute(handle, workflow, input)
        finally:
            stop_heartbeat.set()
            beat.join()
            if self.metrics is not None:
                self.metrics.worker_runs_active.dec()
                self.metrics.worker_runs_finished.labels(outcome=outcome).inc()
        return handle.run_id

    def _loop(self, worker_id: str) -> None:
        while not self._draining.is_set():
            try:
                took = self.run_once(worker_id)
            except StoreClosedError as exc:  # final, unlike an outage: polling cannot succeed
                logger.warning("worker %s stops, its store is closed: %s", worker_id, exc)
                self._draining.set()  # the other threads share the store: they stop too
                return
            except TierError as exc:  # the store is down or overloaded: wait and poll again
                logger.warning("worker %s: %s", worker_id, exc)
                took = None
            except Exception:  # a bug must not silently take a thread out of the fleet
                logger.exception("worker %s: unexpected error", worker_id)
                took = None
            if took is None:
                idle_since = time.monotonic()
                self._draining.wait(self.poll_interval)
                if self.metrics is not None:
                    self.metrics.worker_idle.inc(time.monotonic() - idle_since)

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

    def _execute(self, handle: RunHandle, workflow: WorkflowFn, input: JsonValue) -> str:
        """Drive the run; how it ended here: completed, failed, drained or released."""
        run_id = handle.run_id
        try:
            result = workflow(WorkflowRun(handle, self._draining), input)
        except DrainedError:
            release_quietly(handle)
            logger.info("run %s released on drain", run_id)
            return "drained"
        except BudgetExceededError as exc:
            # Released, it would be taken again at once and stop again: it ends here.
            return _fail(handle, exc)
        except (BackendUnavailableError, ConflictError, RunStateError, RunNotFoundError) as exc:
            # Lost the lease (fenced out), cancelled, paused at an approval gate, blocked on
            # an effect of unknown outcome, or the store failed: the run is not over.
            logger.info("run %s stopped: %s", run_id, exc)
            release_quietly(handle)
            return "released"
        except Exception as exc:  # the workflow's own error ends the run
            logger.warning("run %s failed: %s: %s", run_id, type(exc).__name__, exc)
            return _fail(handle, exc)
        try:
            handle.complete(result)
        except InvalidInputError as exc:  # a result that is no JSON is the workflow's bug
            return _fail(handle, exc)
        except TierError as exc:
            logger.info("run %s was not completed here: %s", run_id, exc)
            release_quietly(handle)
            return "released"
        return "completed"

    def _heartbeat(self, handle: RunHandle, stop: threading.Event) -> None:
        pause = self.lease_ttl / 3
        while not stop.wait(pause):
            pause = self.lease_ttl / 3
            try:
                handle.heartbeat()
            except (StaleWriterError, RunStateError, RunNotFoundError, StoreClosedError) as exc:
                # Taken over, cancelled, finished or deleted: the workflow's next write is
                # refused by fencing; nothing left to renew. (Or the store is closed: for good.) (A plain ConflictError, the head
                # changing too fast, is retried at the next beat below.)
                logger.info("run %s: heartbeat stops: %s", handle.run_id, exc)
                return
            except TierError as exc:  # the store hiccuped: try again soon, the lease runs out
                logger.warning("run %s: heartbeat failed: %s", handle.run_id, exc)
                pause = self.lease_ttl / 10


def _fail(handle: RunHandle, exc: Exception) -> str:
    """Fail the run with ``exc``; if that write is refused, the run is not ours to end.

    Returns:
        ``"failed"``, or ``"released"`` when the run was not failed here.
    """
    try:
        handle.fail(f"{type(exc).__name__}: {exc}")
    except TierError as refused:
        logger.info("run %s was not failed here: %s", handle.run_id, refused)
        release_quietly(handle)
        return "released"
    return "failed"
