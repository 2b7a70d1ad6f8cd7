"""Durable summary jobs (tiers.session._jobs) on every KV backend: leases, retries, fairness, erasure."""

from __future__ import annotations

from collections.abc import Callable
from datetime import timedelta
from typing import Any, cast

import pytest

from tiers import keys
from tiers.backends.base import KVStore
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.errors import SessionNotFoundError
from tiers.models import utcnow
from tiers.session import (
    JobState,
    SessionTier,
    SummaryJobs,
    job_tenants,
    retire_tenant,
    unfinished_jobs,
)

LEASE = timedelta(seconds=30)
SAID = [{"role": "user", "content": "We moved the billing database to Postgres."}]
ERROR = {"type": "urn:tiermem:problem:summarizer-unavailable", "title": "x", "status": 503}


def jobs_of(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, tenant: str = "default"
) -> SummaryJobs:
    return SummaryJobs(kv, SessionTier(kv, index, embedder, tenant=tenant), tenant=tenant)


@pytest.fixture
def jobs(kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder) -> SummaryJobs:
    return jobs_of(kv, index, embedder)


def test_a_transcript_and_its_job_are_one_commit(jobs: SummaryJobs, kv: KVStore) -> None:
    job = jobs.submit("u1", "s1", SAID)
    assert jobs.get(job.job_id) == job
    assert (job.status, job.attempts) == (JobState.PENDING, 0)
    assert jobs.pending() == 1
    assert [t for t, _ in job_tenants(kv)] == ["default"]
    assert kv.get_many(keys.transcripts_space("default", "u1"), ["s1"])[0] is not None
    # Without a transcript, a job for the stored one is refused.
    with pytest.raises(SessionNotFoundError):
        jobs.submit("u1", "nothing-stored")
    assert jobs.pending() == 1
    again = jobs.submit("u1", "s1")  # resummarize the stored transcript
    assert jobs.pending() == 2
    assert again.job_id != job.job_id
    assert jobs.get("job-" + "0" * 24) is None
    assert jobs.get("nonsense") is None


def test_a_claim_holds_until_its_lease_expires_then_anyone_retries(jobs: SummaryJobs) -> None:
    job = jobs.submit("u1", "s1", SAID)
    now = utcnow()
    first = jobs.claim("w1", lease=LEASE, now=now)
    assert first is not None
    assert first.job.job_id == job.job_id
    assert (first.job.status, first.job.attempts, first.job.lease_owner) == (
        JobState.RUNNING,
        1,
        "w1",
    )
    assert jobs.claim("w2", lease=LEASE, now=now + timedelta(seconds=29)) is None
    renewed = jobs.renew(first, lease=LEASE, now=now + timedelta(seconds=20))
    assert renewed is not None
    assert jobs.claim("w2", lease=LEASE, now=now + timedelta(seconds=45)) is None  # renewed
    # w1's process dies: once the lease is over, another worker takes the job, a new attempt.
    later = now + timedelta(seconds=51)
    second = jobs.claim("w2", lease=LEASE, now=later)
    assert second is not None
    assert (second.job.attempts, second.job.lease_owner) == (2, "w2")
    # The dead worker's late writes are refused: nothing it does lands any more.
    assert jobs.succeed(renewed) is False
    assert jobs.renew(renewed, lease=LEASE) is None
    assert jobs.succeed(second, now=later) is True
    done = jobs.get(job.job_id)
    assert done is not None
    assert (done.status, done.finished_at) == (JobState.SUCCEEDED, later)
    assert jobs.pending() == 0


def test_failures_are_retried_with_a_backoff_then_fail_for_good(jobs: SummaryJobs) -> None:
    job = jobs.submit("u1", "s1", SAID, max_attempts=2)
    now = utcnow()
    claim = jobs.claim("w1", lease=LEASE, now=now)
    assert claim is not None
    retried = jobs.fail(claim, ERROR, retry=True, backoff=timedelta(seconds=5), now=now)
    assert retried is not None
    assert retried.status is JobState.PENDING
    assert retried.error == ERROR  # visible while it waits for the retry
    assert jobs.claim("w1", lease=LEASE, now=now + timedelta(seconds=4)) is None
    claim = jobs.claim("w1", lease=LEASE, now=now + timedelta(seconds=5))
    assert claim is not None
    assert claim.job.attempts == 2
    final = jobs.fail(claim, ERROR, retry=True, backoff=timedelta(seconds=5), now=now)
    assert final is not None
    assert final.status is JobState.FAILED
    stored = jobs.get(job.job_id)
    assert stored is not None
    assert (stored.status, stored.error) == (JobState.FAILED, ERROR)
    assert jobs.pending() == 0
    assert jobs.claim("w1", lease=LEASE, now=now + timedelta(hours=1)) is None


def test_a_worker_dying_on_the_last_attempt_is_given_up_on(jobs: SummaryJobs) -> None:
    jobs.submit("u1", "s1", SAID, max_attempts=1)
    now = utcnow()
    assert jobs.claim("w1", lease=LEASE, now=now) is not None  # and w1 dies
    claim = jobs.claim("w2", lease=LEASE, now=now + LEASE + timedelta(seconds=1))
    assert claim is not None
    assert claim.exhausted
    assert claim.job.attempts == 1
    recorded = jobs.fail(claim, ERROR, retry=True, backoff=timedelta(0))
    assert recorded is not None
    assert recorded.status is JobState.FAILED


def test_a_released_job_is_claimable_at_once_and_the_attempt_does_not_count(
    jobs: SummaryJobs,
) -> None:
    jobs.submit("u1", "s1", SAID, max_attempts=1)
    claim = jobs.claim("w1", lease=LEASE)
    assert claim is not None
    assert jobs.release(claim)
    again = jobs.claim("w2", lease=LEASE)
    assert again is not None
    assert (again.exhausted, again.job.attempts) == (False, 1)


def test_users_take_turns(jobs: SummaryJobs) -> None:
    for n in range(5):
        jobs.submit("alice", f"a{n}", SAID)
    jobs.submit("bob", "b0", SAID)
    jobs.submit("carol", "c0", SAID)
    order: list[str] = []
    last = None
    while (claim := jobs.claim("w", lease=LEASE, after_user=last)) is not None:
        order.append(claim.job.session_id)
        last = claim.job.user_id
        assert jobs.succeed(claim)
    assert order == ["a0", "b0", "c0", "a1", "a2", "a3", "a4"]


def test_erasing_a_user_or_session_deletes_their_jobs(
    jobs: SummaryJobs, kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder
) -> None:
    done = jobs.submit("u1", "s1", SAID)
    claim = jobs.claim("w", lease=LEASE)
    assert claim is not None
    assert jobs.succeed(claim)
    running = jobs.submit("u1", "s2", SAID)
    in_flight = jobs.claim("w", lease=LEASE)
    assert in_flight is not None
    assert in_flight.job.job_id == running.job_id
    queued = jobs.submit("u1", "s3", SAID)
    other = jobs.submit("u2", "s1", SAID)
    assert jobs.delete_session("u1", "s3") == 1
    assert jobs.get(queued.job_id) is None
    assert jobs.delete_user("u1") == 2
    assert jobs.get(done.job_id) is None
    assert jobs.get(running.job_id) is None
    # The worker still running finds its job gone and writes nothing back.
    assert jobs.succeed(in_flight) is False
    assert jobs.fail(in_flight, ERROR, retry=True, backoff=timedelta(0)) is None
    assert jobs.get(running.job_id) is None
    assert kv.scan(keys.user_jobs_space("default", "u1")) == []
    assert [k for k, _ in kv.scan(keys.job_queue_space("default"))] == [other.queue_key]
    assert kv.scan(keys.jobs_done_space("default")) == []
    assert jobs.get(other.job_id) == other


def test_finished_jobs_are_purged_and_idle_tenants_retired(
    jobs: SummaryJobs, kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder
) -> None:
    job = jobs.submit("u1", "s1", SAID)
    [(tenant, token)] = job_tenants(kv)
    assert not retire_tenant(kv, tenant, token)  # a job is queued
    claim = jobs.claim("w", lease=LEASE)
    assert claim is not None
    assert jobs.succeed(claim)
    assert unfinished_jobs(kv) == 0
    jobs.submit("u1", "s1")  # a job is queued again
    assert not retire_tenant(kv, tenant, token)
    claim = jobs.claim("w", lease=LEASE)
    assert claim is not None
    assert jobs.succeed(claim)
    [(_, fresh)] = job_tenants(kv)
    assert retire_tenant(kv, tenant, fresh)
    assert job_tenants(kv) == []
    assert jobs.purge(utcnow() - timedelta(hours=1)) == 0
    assert jobs.purge(utcnow() + timedelta(seconds=1)) == 2
    assert jobs.get(job.job_id) is None
    assert kv.scan(keys.jobs_space("default")) == []
    assert kv.scan(keys.user_jobs_space("default", "u1")) == []
    # Another tenant's jobs are its own.
    acme = jobs_of(kv, index, embedder, "acme")
    theirs = acme.submit("u1", "s1", SAID)
    assert jobs.get(theirs.job_id) is None
    assert acme.get(theirs.job_id) == theirs


class _HookAfterFirstLook:
    """The real store, with ``hook`` run right after the first scan of ``space`` returns."""

    def __init__(self, kv: KVStore, space: str, hook: Callable[[], object]) -> None:
        self._kv = kv
        self._space = space
        self._hook: Callable[[], object] | None = hook

    def scan(self, space: str, **kwargs: Any) -> list[tuple[str, bytes]]:
        rows = self._kv.scan(space, **kwargs)
        if space == self._space and self._hook is not None:
            hook, self._hook = self._hook, None
            hook()
        return rows

    def __getattr__(self, name: str) -> Any:
        return getattr(self._kv, name)


def test_a_listed_tenant_is_not_written_again_by_a_submission(
    jobs: SummaryJobs, kv: KVStore
) -> None:
    jobs.submit("u1", "s1", SAID)
    listed = job_tenants(kv)
    jobs.submit("u1", "s2", SAID)
    jobs.submit("u2", "s1", SAID)
    assert job_tenants(kv) == listed  # the same token: no commit to the shared list


def test_a_job_submitted_while_its_tenant_is_retired_stays_listed(
    jobs: SummaryJobs, kv: KVStore
) -> None:
    jobs.submit("u1", "s1", SAID)
    claim = jobs.claim("w", lease=LEASE)
    assert claim is not None
    assert jobs.succeed(claim)
    [(tenant, token)] = job_tenants(kv)
    # The worker's first look finds the queue empty; the job is committed before its delete
    # (the submission still finds the tenant listed, so it writes no listing of its own).
    racing = _HookAfterFirstLook(
        kv, keys.job_queue_space(tenant), lambda: jobs.submit("u1", "s2", SAID)
    )
    assert not retire_tenant(cast(KVStore, racing), tenant, token)
    assert [t for t, _ in job_tenants(kv)] == [tenant]
    assert unfinished_jobs(kv) == 1
