"""Background summary jobs of the service: durable in the KV store, run by every replica.

A posted transcript and its job are stored in one commit (:mod:`tiers.session._jobs`),
so a 202 means both are durable; a refusal (429: the tenant has
``max_pending`` unfinished jobs, or this replica is shutting down) comes
before anything is stored, and only for that tenant. Any replica answers a
job's status from the store.

Each replica runs ``workers`` threads that claim jobs from the store under a
lease (renewed while the job runs by a heartbeat thread), tenants in turn
and users in turn within a tenant. A job whose process died is taken by any
replica once its lease expires; a failed attempt is retried with a backoff
until ``max_attempts``, then it fails for good with its error in its status.

Shutdown (:meth:`JobRegistry.close`) stops claiming, waits for the running
jobs for a bounded time, and gives back the ones still running (not counted
as an attempt): they stay in the store for the next claim, here or elsewhere.
The worker threads are daemon threads, so one stuck in a slow model call does
not hold the process; its late result is not recorded (its claim was given back).

A store closed under the registry (its memory closed before :meth:`JobRegistry.close`)
stops the workers and the heartbeat: unlike an outage, which they wait out, no
claim or renewal can succeed again.
"""

from __future__ import annotations

import logging
import os
import secrets
import socket
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from datetime import datetime, timedelta

from api.errors import JobAbandonedError, JobNotFoundError, OverloadedError, problem_for
from api.schemas.problems import Problem
from api.schemas.sessions import JobStatus
from memory.facade import Memory
from summarizer.errors import InvalidTranscriptError
from tiers.backends.base import KVStore
from tiers.errors import (
    CorruptRecordError,
    InvalidInputError,
    SessionNotFoundError,
    StoreClosedError,
)
from tiers.models import Message, SessionSummary, utcnow
from tiers.session import Claim, JobState, SummaryJob, job_tenants, retire_tenant, unfinished_jobs

__all__ = ["Job", "JobRegistry"]

logger = logging.getLogger("tiermem.api")

# An idle worker looks for jobs submitted through other replicas this often.
_POLL_SECONDS = 0.5
# While claims fail (the store is down), a worker's wait doubles up to this long: an outage
# logs a warning now and then, not one per poll and worker.
_MAX_CLAIM_WAIT_SECONDS = 10.0
# Retries back off 1 s, 2 s, 4 s, ... at most this long.
_MAX_BACKOFF_SECONDS = 60.0
# Finished jobs past retention purged after each job (the service's sweep does the rest).
_PURGE_BATCH = 8
# Errors that the same attempt again cannot fix.
_FINAL_ERRORS = (
    SessionNotFoundError,
    InvalidInputError,
    InvalidTranscriptError,
    CorruptRecordError,
    JobAbandonedError,
)


@dataclass(frozen=True, slots=True)
class Job:
    """A job's state as the API reports it.

    Attributes:
        result: The session's stored summary once the job succeeded (``None``
            if it was deleted since).
        error: Why the last attempt failed: final once ``status`` is failed.
    """

    job_id: str
    tenant: str
    user_id: str
    session_id: str
    status: JobStatus
    created_at: datetime
    finished_at: datetime | None = None
    attempts: int = 0
    max_attempts: int = 1
    result: SessionSummary | None = None
    error: Problem | None = None


@dataclass(slots=True)
class _Running:
    """A job this process runs; ``lock`` orders the heartbeat's renewals and the final write."""

    memory: Memory
    claim: Claim
    lock: threading.Lock = field(default_factory=threading.Lock)
    lost: bool = False  # the lease went (taken over, erased, or given back at shutdown)


class JobRegistry:
    """Submits, reports and runs the durable summary jobs of every tenant. Thread-safe.

    Args:
        kv: The KV store of every tenant (its shared job-tenant list is read here).
        views: The memory of a tenant.
        run: Summarizes one session of a tenant's memory (the job's work).
        workers: Threads running jobs in this process (0: none; other replicas run them).
        max_pending: Unfinished jobs per tenant at most; :meth:`submit` refuses more.
        retention_seconds: How long a finished job's status is kept.
        lease_seconds: How long a claim lasts unless renewed.
        max_attempts: Attempts at a job before it fails for good.
        on_outcome: Called with ``succeeded``, ``retried``, ``failed``, ``lost``
            or ``released`` after each attempt (for metrics).
    """

    def __init__(
        self,
        *,
        kv: KVStore,
        views: Callable[[str], Memory],
        run: Callable[[Memory, str, str], SessionSummary],
        workers: int,
        max_pending: int,
        retention_seconds: float,
        lease_seconds: float = 60.0,
        max_attempts: int = 3,
        on_outcome: Callable[[str], None] | None = None,
    ) -> None:
        self._kv = kv
        self._views = views
        self._run_job = run
        self._workers = workers
        self._max_pending = max_pending
        self._retention = timedelta(seconds=retention_seconds)
        self._lease = timedelta(seconds=lease_seconds)
        self._max_attempts = max_attempts
        self._on_outcome = on_outcome
        self._owner = f"{socket.gethostname()}:{os.getpid()}:{secrets.token_hex(3)}"
        self._lock = threading.Lock()
        self._changed = threading.Condition(self._lock)  # a job of this process finished
        self._kick = threading.Event()  # a job was submitted here: look now
        self._stopping = threading.Event()
        self._threads: list[threading.Thread] = []
        self._running: dict[str, _Running] = {}
        self._last_tenant: str | None = None
        self._last_user: dict[str, str] = {}
        self._closed = False

    # -- the API's side ------------------------------------------------------------------------

    def start(self) -> None:
        """Start the worker threads and the lease heartbeat (idempotent; none with 0 workers)."""
        with self._lock:
            if self._threads or self._closed or self._workers == 0:
                return
            for n in range(self._workers):
                thread = threading.Thread(
                    target=self._work, args=(n,), name=f"tiermem-job-{n}", daemon=True
                )
                self._threads.append(thread)
            self._threads.append(
                threading.Thread(target=self._heartbeat, name="tiermem-job-lease", daemon=True)
            )
        for thread in self._threads:
            thread.start()

    def submit(
        self,
        memory: Memory,
        *,
        user_id: str,
        session_id: str,
        messages: Sequence[Message] | None = None,
        created_at: datetime | None = None,
    ) -> Job:
        """Store the transcript (if given) and its job in one commit, or refuse before storing.

        Raises:
            OverloadedError: The tenant has ``max_pending`` unfinished jobs, or
                this replica is shutting down; nothing was stored.
        """
        if self._closed:
            raise OverloadedError(
                "the server is shutting down: retry on another instance", retry_after=5
            )
        queued = memory.jobs.pending(limit=self._max_pending)
        if queued >= self._max_pending:
            raise OverloadedError(
                f"this tenant has {queued} summaries queued, the limit is {self._max_pending}: "
                "retry later, or post a structured summary instead",
                retry_after=5,
            )
        job = memory.jobs.submit(
            user_id,
            session_id,
            messages,
            created_at=created_at,
            max_attempts=self._max_attempts,
        )
        self._kick.set()
        return self._view(memory, job, utcnow())

    def get(self, tenant: str, job_id: str, *, user_id: str | None = None) -> Job:
        """The current state of a job of ``tenant`` (and of ``user_id``, if given), from the store.

        Raises:
            JobNotFoundError: No such job for this tenant (or it finished long
                ago, or its user or session was deleted); a job of another user
                than ``user_id`` is not found either.
        """
        memory = self._views(tenant)
        job = memory.jobs.get(job_id)
        now = utcnow()
        if (
            job is None
            or (user_id is not None and job.user_id != user_id)
            or (job.finished_at is not None and job.finished_at < now - self._retention)
        ):
            raise JobNotFoundError(
                f"no job {job_id[:80]!r}: it never existed for this tenant, it finished more "
                f"than {self._retention.total_seconds():.0f} s ago, or its user or session was "
                "deleted (check the session itself)"
            )
        return self._view(memory, job, now)

    def _view(self, memory: Memory, job: SummaryJob, now: datetime) -> Job:
        status = JobStatus(job.status.value)
        if status is JobStatus.RUNNING and job.available_at < now:
            status = JobStatus.PENDING  # its worker is gone: the next claim retries it
        result = None
        if job.status is JobState.SUCCEEDED:
            try:
                result = memory.get_session(job.user_id, job.session_id)
            except SessionNotFoundError:
                result = None
        return Job(
            job_id=job.job_id,
            tenant=memory.tenant,
            user_id=job.user_id,
            session_id=job.session_id,
            status=status,
            created_at=job.created_at,
            finished_at=job.finished_at,
            attempts=job.attempts,
            max_attempts=job.max_attempts,
            result=result,
            error=Problem.model_validate(job.error) if job.error is not None else None,
        )

    def wait(self, tenant: str, job_id: str, timeout: float | None = None) -> Job:
        """Block until the job finished (or ``timeout`` passed) and return its state."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while True:
            job = self.get(tenant, job_id)
            left = None if deadline is None else deadline - time.monotonic()
            if job.status in (JobStatus.SUCCEEDED, JobStatus.FAILED) or (
                left is not None and left <= 0
            ):
                return job
            with self._changed:
                self._changed.wait(_POLL_SECONDS if left is None else min(left, _POLL_SECONDS))

    @property
    def pending(self) -> int:
        """Unfinished jobs in the store, every tenant's (whichever replica runs them)."""
        return unfinished_jobs(self._kv)

    def purge(self, memory: Memory) -> int:
        """Delete the tenant's jobs finished more than ``retention_seconds`` ago."""
        before = utcnow() - self._retention
        purged = 0
        while True:
            n = memory.jobs.purge(before)
            purged += n
            if n == 0:
                return purged

    def close(self, timeout: float | None = None) -> int:
        """Refuse new jobs, stop claiming, and wait up to ``timeout`` s for the running ones.

        A job still running then is given back to the store unfinished (the
        attempt not counted), for the next claim by any replica.

        Args:
            timeout: Seconds to wait; ``None`` waits for every running job.

        Returns:
            How many jobs this process was still running when it stopped waiting.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._changed:
            self._closed = True
            self._stopping.set()
            self._kick.set()
            while self._running:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    break
                self._changed.wait(left)
            left_running = list(self._running.values())
        # Idle workers leave at once (woken above): let them, so none claims after this returns.
        joined_by = time.monotonic() + 0.5
        for thread in self._threads:
            thread.join(max(0.0, joined_by - time.monotonic()))
        for running in left_running:
            with running.lock:
                if running.lost:
                    continue
                running.lost = True
                try:
                    released = running.memory.jobs.release(running.claim)
                except Exception as exc:  # the store is down: the lease expires instead
                    logger.warning("shutdown: cannot give a summary job back: %s", exc)
                    continue
            if released:
                self._outcome("released")
        if left_running:
            logger.warning(
                "shutdown: %d summary job(s) not finished within %s s; they stay queued in the "
                "store for the next replica (or the next start) to run",
                len(left_running),
                timeout,
            )
        return len(left_running)

    # -- the workers ---------------------------------------------------------------------------

    def _work(self, n: int) -> None:
        owner = f"{self._owner}/{n}"
        wait = _POLL_SECONDS
        while not self._stopping.is_set():
            try:
                taken = self._claim_next(owner)
            except StoreClosedError as exc:  # final, unlike an outage: no claim can succeed
                self._store_closed(exc)
                return
            except Exception as exc:  # the store is down: look again, later while it fails
                if not self._stopping.is_set():
                    logger.warning("summary jobs: cannot claim the next one: %s", exc)
                wait = min(wait * 2, _MAX_CLAIM_WAIT_SECONDS)
                taken = None
            else:
                wait = _POLL_SECONDS
            if taken is None:
                # A job submitted here ends the wait early.
                self._kick.wait(wait)
                self._kick.clear()
                continue
            try:
                self._run(*taken)
            except Exception:  # a bug must not end the worker: its lease expires, others retry
                logger.exception("summary job %s: the worker failed", taken[1].job.job_id)

    def _claim_next(self, owner: str) -> tuple[Memory, Claim] | None:
        """A claim of the next job: tenants in turn after the last one served, users in turn."""
        tenants = job_tenants(self._kv)
        with self._lock:
            last = self._last_tenant
        if last is not None:
            tenants = [t for t in tenants if t[0] > last] + [t for t in tenants if t[0] <= last]
        for tenant, token in tenants:
            if self._stopping.is_set():
                return None
            memory = self._views(tenant)
            with self._lock:
                after = self._last_user.get(tenant)
            claim = memory.jobs.claim(owner, lease=self._lease, after_user=after)
            if claim is None:
                retire_tenant(self._kv, tenant, token)  # only if nothing is queued there
                continue
            with self._lock:
                self._last_tenant = tenant
                self._last_user[tenant] = claim.job.user_id
            return memory, claim
        return None

    def _run(self, memory: Memory, claim: Claim) -> None:
        job = claim.job
        running = _Running(memory, claim)
        with self._lock:
            if self._stopping.is_set():  # claimed as the shutdown began: give it back at once
                running.lost = True
            else:
                self._running[job.job_id] = running
        if running.lost:
            try:
                if memory.jobs.release(claim):
                    self._outcome("released")
            except Exception as exc:  # the store closed meanwhile: the lease expires instead
                logger.debug("shutdown: cannot give a summary job back: %s", exc)
            return
        try:
            if claim.exhausted:
                self._failed(
                    running,
                    JobAbandonedError(
                        f"summarizing session {job.session_id!r} was started {job.attempts} "
                        "times and its worker stopped each time (a crash, or a shutdown past "
                        "its bound): resummarize the session"
                    ),
                    retry=False,
                )
                return
            try:
                self._run_job(memory, job.user_id, job.session_id)
            except Exception as exc:  # recorded in the job, never lost in the pool
                # The job's status may hide a backend's message (host, port, file): log it here.
                logger.warning(
                    "summary job %s (attempt %d of %d) failed: %s: %s",
                    job.job_id,
                    job.attempts,
                    job.max_attempts,
                    type(exc).__name__,
                    exc,
                )
                self._failed(running, exc, retry=not isinstance(exc, _FINAL_ERRORS))
                return
            with running.lock:
                if running.lost:
                    outcome = "lost"
                else:
                    try:
                        outcome = "succeeded" if memory.jobs.succeed(running.claim) else "lost"
                    except Exception as exc:  # the lease expires and the job is run again
                        logger.warning("summary job %s: cannot record success: %s", job.job_id, exc)
                        outcome = "lost"
                    running.lost = True
            self._outcome(outcome)
        finally:
            with self._changed:
                self._running.pop(job.job_id, None)
                self._changed.notify_all()
            self._purge_some(memory)

    def _failed(self, running: _Running, exc: BaseException, *, retry: bool) -> None:
        job = running.claim.job
        problem = problem_for(exc).model_dump(mode="json", exclude_none=True)
        backoff = timedelta(seconds=min(_MAX_BACKOFF_SECONDS, 2.0 ** max(0, job.attempts - 1)))
        with running.lock:
            if running.lost:
                outcome = "lost"
            else:
                try:
                    recorded = running.memory.jobs.fail(
                        running.claim, problem, retry=retry, backoff=backoff
                    )
                except Exception as store_exc:  # the lease expires and the job is run again
                    logger.warning(
                        "summary job %s: cannot record its failure: %s", job.job_id, store_exc
                    )
                    recorded = None
                running.lost = True
                if recorded is None:
                    outcome = "lost"
                elif recorded.status is JobState.PENDING:
                    outcome = "retried"
                else:
                    outcome = "failed"
        self._outcome(outcome)

    def _heartbeat(self) -> None:
        """Renew the leases of this process's running jobs every third of a lease."""
        period = self._lease.total_seconds() / 3
        while not self._stopping.wait(period):
            with self._lock:
                running = list(self._running.values())
            for item in running:
                with item.lock:
                    if item.lost:
                        continue
                    try:
                        renewed = item.memory.jobs.renew(item.claim, lease=self._lease)
                    except StoreClosedError as exc:  # final: no lease can be renewed again
                        self._store_closed(exc)
                        return
                    except Exception as exc:  # try again next period; the lease may expire
                        logger.warning("summary jobs: cannot renew a lease: %s", exc)
                        continue
                    if renewed is None:
                        item.lost = True
                        logger.warning(
                            "summary job %s: lease lost (erased, or taken over after it expired)",
                            item.claim.job.job_id,
                        )
                    else:
                        item.claim = renewed

    def _store_closed(self, exc: StoreClosedError) -> None:
        """Stop every worker thread and the heartbeat: they share the store that was closed."""
        with self._lock:
            first = not self._stopping.is_set()
            self._stopping.set()
        self._kick.set()  # idle workers wake up to leave
        # Once, by the first thread to see it; not at all if close() stopped the threads first.
        if first:
            logger.info("summary jobs stop, their store is closed: %s", exc)

    def _purge_some(self, memory: Memory) -> None:
        try:
            memory.jobs.purge(utcnow() - self._retention, limit=_PURGE_BATCH)
        except Exception as exc:  # the periodic sweep purges the rest
            logger.debug("summary jobs: purge failed: %s", exc)

    def _outcome(self, outcome: str) -> None:
        if self._on_outcome is not None:
            self._on_outcome(outcome)
