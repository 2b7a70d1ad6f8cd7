"""What a summary job is, as stored and as a worker holds it (see :mod:`tiers.session._jobs`).

The record (:class:`SummaryJob`), its states, the claim a worker holds under a
lease (:class:`Claim`), and how job ids and the queue's timestamps are made.
No I/O here: :class:`~tiers.session._jobs.SummaryJobs` reads and writes them.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass
from datetime import datetime
from enum import StrEnum
from typing import Annotated

from pydantic import Field, JsonValue

from tiers import keys
from tiers.ids import Id
from tiers.models import Record, UtcDatetime

__all__ = [
    "JOB_ID_LEN",
    "JOB_ID_PATTERN",
    "Claim",
    "JobState",
    "SummaryJob",
    "micros",
    "new_job_id",
]

JOB_ID_PATTERN = r"job-[0-9a-f]{24}"
JOB_ID_LEN = 28
"""Length of every job id (``job-`` and 24 hex digits)."""


class JobState(StrEnum):
    """Where a summary job is."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


def micros(when: datetime) -> int:
    """``when`` in microseconds since the epoch: how the queue and the done list order jobs."""
    return int(when.timestamp() * 1_000_000)


def new_job_id() -> str:
    """A fresh job id (96 random bits)."""
    return f"job-{secrets.token_hex(12)}"


class SummaryJob(Record):
    """One summary job, as stored.

    Attributes:
        job_id: ``job-`` and 24 hex digits.
        user_id: The user.
        session_id: The session whose stored transcript is summarized.
        status: Pending (queued, or waiting for a retry), running (claimed
            under a lease), succeeded or failed (for good).
        created_at: When it was submitted.
        attempts: Attempts started so far (claims).
        max_attempts: Attempts at most; then it fails for good.
        available_at: Not claimed before this: its creation, the end of its
            lease while it runs, or the end of the backoff before a retry.
        lease_owner: The worker holding the lease while it runs.
        started_at: When the last attempt started.
        finished_at: When it succeeded or failed for good.
        error: Why the last attempt failed (a problem object, as the service
            reports it); kept while the job is retried.
    """

    job_id: Annotated[str, Field(pattern=f"^{JOB_ID_PATTERN}$")]
    user_id: Id
    session_id: Id
    status: JobState
    created_at: UtcDatetime
    attempts: int = Field(default=0, ge=0)
    max_attempts: int = Field(ge=1)
    available_at: UtcDatetime
    lease_owner: str | None = None
    started_at: UtcDatetime | None = None
    finished_at: UtcDatetime | None = None
    error: dict[str, JsonValue] | None = None

    @property
    def finished(self) -> bool:
        """Whether it succeeded or failed for good."""
        return self.status in (JobState.SUCCEEDED, JobState.FAILED)

    @property
    def queue_key(self) -> str:
        """Its key in the tenant's queue (while unfinished)."""
        return keys.job_queue_key(self.user_id, micros(self.created_at), self.job_id)


@dataclass(frozen=True, slots=True)
class Claim:
    """A job a worker holds under a lease.

    Attributes:
        job: The record as this worker last wrote it.
        raw: Its stored bytes: every later write by this worker is checked against them,
            so a worker whose lease was taken over (or whose job was erased) writes nothing.
        exhausted: The job's lease expired on its last allowed attempt: the
            worker is to record it as failed for good, not run it.
    """

    job: SummaryJob
    raw: bytes
    exhausted: bool = False
