"""The in-process registry of background summarization jobs."""

from __future__ import annotations

import threading
import time

import pytest

from api.errors import JobNotFoundError, OverloadedError
from api.jobs import JobRegistry
from api.schemas.sessions import JobStatus
from tiers.models import SessionSummary

SUMMARY = SessionSummary(user_id="u1", session_id="s1", task_description="x")


def wait_done(jobs: JobRegistry, tenant: str, job_id: str) -> JobStatus:
    return jobs.wait(tenant, job_id, timeout=10).status


def test_jobs_report_success_and_failure_to_their_tenant_only() -> None:
    jobs = JobRegistry(workers=2, max_pending=10, retention_seconds=60)
    ok = jobs.submit(tenant="a", user_id="u1", session_id="s1", work=lambda: SUMMARY)

    def boom() -> SessionSummary:
        raise ValueError("model said no")

    bad = jobs.submit(tenant="a", user_id="u1", session_id="s2", work=boom)
    assert wait_done(jobs, "a", ok.job_id) is JobStatus.SUCCEEDED
    assert jobs.get("a", ok.job_id).result == SUMMARY
    assert wait_done(jobs, "a", bad.job_id) is JobStatus.FAILED
    assert isinstance(jobs.get("a", bad.job_id).error, ValueError)
    assert jobs.get("a", bad.job_id).finished_at is not None
    with pytest.raises(JobNotFoundError):
        jobs.get("b", ok.job_id)
    assert jobs.pending == 0
    jobs.close()


def test_queue_limit_and_shutdown() -> None:
    release = threading.Event()
    jobs = JobRegistry(workers=1, max_pending=1, retention_seconds=60)
    first = jobs.submit(
        tenant="a", user_id="u1", session_id="s1", work=lambda: release.wait(10) and SUMMARY
    )
    with pytest.raises(OverloadedError) as full:
        jobs.submit(tenant="a", user_id="u1", session_id="s2", work=lambda: SUMMARY)
    assert full.value.retry_after > 0
    closer = threading.Thread(target=jobs.close)
    closer.start()
    time.sleep(0.05)
    assert closer.is_alive()  # close() waits for the accepted job
    release.set()
    closer.join(10)
    assert jobs.get("a", first.job_id).status is JobStatus.SUCCEEDED
    with pytest.raises(OverloadedError, match="shutting down"):
        jobs.submit(tenant="a", user_id="u1", session_id="s3", work=lambda: SUMMARY)


def test_finished_jobs_are_forgotten_after_the_retention_time() -> None:
    jobs = JobRegistry(workers=1, max_pending=10, retention_seconds=0.05)
    job = jobs.submit(tenant="a", user_id="u1", session_id="s1", work=lambda: SUMMARY)
    assert wait_done(jobs, "a", job.job_id) is JobStatus.SUCCEEDED
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            jobs.get("a", job.job_id)
        except JobNotFoundError:
            break
        time.sleep(0.02)
    else:
        pytest.fail("the finished job was never forgotten")
    jobs.close()
