"""An in-process registry of background jobs (summarizing posted transcripts).

A job runs on a small thread pool. Its status is kept in memory for
``retention_seconds`` after it finished, then forgotten; the saved session
itself is in the store for good. Jobs belong to a tenant: another tenant
asking for the same id gets :class:`~api.errors.JobNotFoundError`.

This registry is per process and is not durable: a crash loses the queued
jobs (the client sees the job vanish and posts the transcript again, which is
safe because saving a session is idempotent by ``(user_id, session_id)``).

Shutdown waits for queued jobs for a bounded time only (:meth:`JobRegistry.close`).
The worker threads are daemon threads, so one stuck in a slow model call does not
hold the process past that bound either; what was not summarized by then keeps
its stored transcript and is listed as pending.
"""

from __future__ import annotations

import logging
import queue
import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from datetime import datetime

from api.errors import JobNotFoundError, OverloadedError
from api.schemas.sessions import JobStatus
from tiers.models import SessionSummary, utcnow

__all__ = ["Job", "JobRegistry"]

logger = logging.getLogger("tiermem.api")


@dataclass(frozen=True, slots=True)
class Job:
    """A snapshot of one job; the registry hands out copies, never the live state."""

    job_id: str
    tenant: str
    user_id: str
    session_id: str
    status: JobStatus
    created_at: datetime
    finished_at: datetime | None = None
    result: SessionSummary | None = None
    error: BaseException | None = None


@dataclass(slots=True)
class _Entry:
    job: Job
    done: threading.Event = field(default_factory=threading.Event)


class JobRegistry:
    """Runs jobs on ``workers`` threads and remembers their outcome. Thread-safe.

    Args:
        workers: Threads running jobs.
        max_pending: Jobs queued or running at most; :meth:`submit` refuses more.
        retention_seconds: How long a finished job's status is kept.
        on_failure: Called with the error of every failed job (for metrics).
    """

    def __init__(
        self,
        *,
        workers: int,
        max_pending: int,
        retention_seconds: float,
        on_failure: Callable[[BaseException], None] | None = None,
    ) -> None:
        # Jobs to run, and None to stop a worker; the workers start with the first job.
        self._queue: queue.SimpleQueue[tuple[_Entry, Callable[[], SessionSummary]] | None] = (
            queue.SimpleQueue()
        )
        self._workers = workers
        self._threads: list[threading.Thread] = []
        self._abandoned = False  # set when close() gave up waiting: queued jobs are dropped
        self._max_pending = max_pending
        self._retention = retention_seconds
        self._on_failure = on_failure
        self._lock = threading.Lock()
        self._entries: dict[str, _Entry] = {}
        # Finished jobs in the order they finished, so purging looks only at the oldest.
        self._finished: deque[tuple[float, str]] = deque()
        self._pending = 0
        self._closed = False

    def submit(
        self, *, tenant: str, user_id: str, session_id: str, work: Callable[[], SessionSummary]
    ) -> Job:
        """Queue ``work`` and return the pending job.

        Raises:
            OverloadedError: ``max_pending`` jobs are already queued or running,
                or the registry is shutting down.
        """
        with self._lock:
            self._purge()
            if self._closed:
                raise OverloadedError(
                    "the server is shutting down: retry on another instance", retry_after=5
                )
            if self._pending >= self._max_pending:
                raise OverloadedError(
                    f"{self._pending} summaries are queued, the limit is {self._max_pending}: "
                    "retry later, or post a structured summary instead",
                    retry_after=5,
                )
            job = Job(
                job_id=f"job-{secrets.token_hex(12)}",
                tenant=tenant,
                user_id=user_id,
                session_id=session_id,
                status=JobStatus.PENDING,
                created_at=utcnow(),
            )
            entry = _Entry(job)
            self._entries[job.job_id] = entry
            self._pending += 1
            if len(self._threads) < self._workers and len(self._threads) < self._pending:
                thread = threading.Thread(
                    target=self._work, name=f"tiermem-job-{len(self._threads)}", daemon=True
                )
                self._threads.append(thread)
                thread.start()
            self._queue.put((entry, work))
        return job

    def get(self, tenant: str, job_id: str, *, user_id: str | None = None) -> Job:
        """The current state of a job of ``tenant`` (and of ``user_id``, if given).

        Raises:
            JobNotFoundError: No such job for this tenant (or it finished long
                ago); a job of another user than ``user_id`` is not found either.
        """
        with self._lock:
            self._purge()
            entry = self._entries.get(job_id)
            if (
                entry is None
                or entry.job.tenant != tenant
                or (user_id is not None and entry.job.user_id != user_id)
            ):
                raise JobNotFoundError(
                    f"no job {job_id[:80]!r}: it never existed for this tenant, or it finished "
                    f"more than {self._retention:.0f} s ago (check the session itself)"
                )
            return entry.job

    def wait(self, tenant: str, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job finished (or ``timeout`` passed) and return its state."""
        with self._lock:
            entry = self._entries.get(job_id)
        if entry is not None and entry.job.tenant == tenant:
            entry.done.wait(timeout)
        return self.get(tenant, job_id)

    @property
    def pending(self) -> int:
        """Jobs queued or running."""
        with self._lock:
            return self._pending

    def forget(self, tenant: str, user_id: str, session_id: str | None = None) -> None:
        """Drop the summaries kept with the user's jobs (or one session's); statuses stay.

        For erasure: a forgotten user's or deleted session's summary must not
        be served from here either. A job still running cannot bring one back
        (its save fails once the transcript is gone).
        """
        with self._lock:
            for entry in self._entries.values():
                job = entry.job
                if (
                    job.result is not None
                    and (job.tenant, job.user_id) == (tenant, user_id)
                    and session_id in (None, job.session_id)
                ):
                    entry.job = replace(job, result=None)

    def close(self, timeout: float | None = None) -> int:
        """Refuse new jobs and wait up to ``timeout`` seconds for the queued ones (graceful shutdown).

        Jobs not started by then are dropped and one still running is left to
        its daemon thread: either way its transcript is stored and the session
        stays pending (``pending_summaries``, ``tiermem resummarize``).

        Args:
            timeout: Seconds to wait; ``None`` waits for every job.

        Returns:
            How many jobs were still queued or running when it stopped waiting.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            self._closed = True
            waiting = [e for e in self._entries.values() if not e.done.is_set()]
        for entry in waiting:
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not entry.done.wait(left):
                break
        with self._lock:
            self._abandoned = True
            unfinished = self._pending
            threads = list(self._threads)
        for _ in threads:
            self._queue.put(None)
        if unfinished:
            logger.warning(
                "shutdown: %d summary job(s) not finished within %s s; their transcripts are "
                "stored and pending (tiermem resummarize, or POST .../sessions/{id}:resummarize)",
                unfinished,
                timeout,
            )
        return unfinished

    def _work(self) -> None:
        while True:
            item = self._queue.get()
            if item is None:
                return
            entry, work = item
            if self._abandoned:
                continue  # shutting down: the transcript stays stored and pending
            self._run(entry, work)

    def _run(self, entry: _Entry, work: Callable[[], SessionSummary]) -> None:
        self._update(entry, status=JobStatus.RUNNING)
        try:
            result = work()
        except Exception as exc:  # reported through the job, never lost in the pool
            # The job's answer may hide a backend's message (host, port, file): log it here.
            logger.warning(
                "summary job %s failed: %s: %s", entry.job.job_id, type(exc).__name__, exc
            )
            self._update(entry, status=JobStatus.FAILED, error=exc, finished=True)
            if self._on_failure is not None:
                self._on_failure(exc)
        else:
            self._update(entry, status=JobStatus.SUCCEEDED, result=result, finished=True)

    def _update(
        self,
        entry: _Entry,
        *,
        status: JobStatus,
        result: SessionSummary | None = None,
        error: BaseException | None = None,
        finished: bool = False,
    ) -> None:
        with self._lock:
            old = entry.job
            entry.job = Job(
                job_id=old.job_id,
                tenant=old.tenant,
                user_id=old.user_id,
                session_id=old.session_id,
                status=status,
                created_at=old.created_at,
                finished_at=utcnow() if finished else None,
                result=result,
                error=error,
            )
            if finished:
                self._finished.append((time.monotonic(), old.job_id))
                self._pending -= 1
        if finished:
            entry.done.set()

    def _purge(self) -> None:
        """Forget jobs finished more than ``retention_seconds`` ago (lock held)."""
        horizon = time.monotonic() - self._retention
        while self._finished and self._finished[0][0] < horizon:
            _, job_id = self._finished.popleft()
            self._entries.pop(job_id, None)
