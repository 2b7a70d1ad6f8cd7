"""An in-process registry of background jobs (summarizing posted transcripts).

A job runs on a small thread pool. Its status is kept in memory for
``retention_seconds`` after it finished, then forgotten; the saved session
itself is in the store for good. Jobs belong to a tenant: another tenant
asking for the same id gets :class:`~api.errors.JobNotFoundError`.

This registry is per process and is not durable: a crash loses the queued
jobs (the client sees the job vanish and posts the transcript again, which is
safe because saving a session is idempotent by ``(user_id, session_id)``).
"""

from __future__ import annotations

import secrets
import threading
import time
from collections import deque
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field, replace
from datetime import datetime

from api.errors import JobNotFoundError, OverloadedError
from api.schemas.sessions import JobStatus
from tiers.models import SessionSummary, utcnow

__all__ = ["Job", "JobRegistry"]


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
        self._executor = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="tiermem-job")
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
        self._executor.submit(self._run, entry, work)
        return job

    def get(self, tenant: str, job_id: str) -> Job:
        """The current state of a job of ``tenant``.

        Raises:
            JobNotFoundError: No such job for this tenant (or it finished long ago).
        """
        with self._lock:
            self._purge()
            entry = self._entries.get(job_id)
            if entry is None or entry.job.tenant != tenant:
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

    def close(self) -> None:
        """Refuse new jobs and wait for every queued one to finish (graceful shutdown)."""
        with self._lock:
            self._closed = True
        self._executor.shutdown(wait=True)

    def _run(self, entry: _Entry, work: Callable[[], SessionSummary]) -> None:
        self._update(entry, status=JobStatus.RUNNING)
        try:
            result = work()
        except Exception as exc:  # reported through the job, never lost in the pool
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
