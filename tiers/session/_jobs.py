"""Durable summary jobs: a transcript's summary queued in the KV store, run by any worker.

A job is a record in the KV store, written in the same commit as the
transcript it summarizes, so a job acknowledged is a job that survives any
process. Every replica reads and runs the same jobs:

- **status** is read by id from the tenant's space (:meth:`SummaryJobs.get`),
  by whichever replica is asked;
- **claiming** is a compare-and-set on the record that sets a lease (an owner
  and an expiry, renewed while the job runs) and counts the attempt. A claim
  whose lease expired (its worker died) is taken again by any worker, until
  ``max_attempts`` attempts were made; a failed attempt is retried after a
  backoff, or recorded as failed for good with its error;
- **fairness**: unfinished jobs sit in a per-tenant queue keyed
  ``<user>/<created>/<job>``, so a claim takes users in turn
  (:meth:`SummaryJobs.claim` starts after the last user served) and one
  user's bulk cannot hold back another user's single transcript. Tenants with
  unfinished jobs are listed in one shared space for workers to take in turn
  too (:mod:`tiers.session._job_tenants`).

The records themselves (:class:`SummaryJob`, :class:`Claim`) are in
:mod:`tiers.session._job_records`.

Layout (every key format is in :mod:`tiers.keys`)::

    <tenant>:jobs                job_id -> SummaryJob
    <tenant>:user:<user>:jobs    job_id -> b""           (the user's jobs: erasure)
    <tenant>:job-queue           <user>/<created µs>/<job_id> -> claimable at (µs)
    <tenant>:jobs-done           <finished µs>/<job_id> -> b""   (purged after retention)
    _system:job-tenants          tenant -> token          (tenants with queued jobs)

Leases compare wall-clock times written by different processes: replicas
are expected to keep their clocks in sync to well within a lease.
"""

from __future__ import annotations

import contextlib
from collections.abc import Sequence
from datetime import datetime, timedelta

from pydantic import JsonValue

from tiers import cas, keys
from tiers.backends.base import Check, Delete, KVStore, Put, Write
from tiers.codec import decode, encode
from tiers.errors import ConflictError, CorruptRecordError, InvalidInputError, SessionNotFoundError
from tiers.ids import check_id
from tiers.models import Message, utcnow
from tiers.session._job_records import (
    JOB_ID_LEN,
    Claim,
    JobState,
    SummaryJob,
    micros,
    new_job_id,
)
from tiers.session._job_tenants import ensure_listed
from tiers.session._tier import SessionTier
from tiers.session._transcripts import header_key

__all__ = ["SummaryJobs"]

# Unfinished jobs of one user looked at per claim: more of them are being run or retried
# than this only when that user already has this many workers busy.
_PER_USER_SCAN = 16
# Jobs deleted or purged per commit.
_BATCH = 128


class SummaryJobs:
    """The summary jobs of one tenant. Thread-safe; holds no state beyond the store.

    Args:
        kv: The KV store (the same as the session tier's).
        sessions: The tenant's session tier: a transcript and its job are
            committed together through it.
        tenant: The tenant.
    """

    def __init__(self, kv: KVStore, sessions: SessionTier, *, tenant: str) -> None:
        self._kv = kv
        self._sessions = sessions
        self._tenant = check_id(tenant, "tenant")
        self._jobs = keys.jobs_space(self._tenant)
        self._queue = keys.job_queue_space(self._tenant)
        self._done = keys.jobs_done_space(self._tenant)

    @property
    def tenant(self) -> str:
        """The tenant."""
        return self._tenant

    # -- submitting ----------------------------------------------------------------------------

    def pending(self, limit: int | None = None) -> int:
        """Unfinished jobs of the tenant (queued, running or waiting for a retry), at most ``limit``."""
        return len(self._kv.scan(self._queue, limit=limit))

    def submit(
        self,
        user_id: str,
        session_id: str,
        messages: Sequence[Message] | None = None,
        *,
        created_at: datetime | None = None,
        max_attempts: int = 3,
    ) -> SummaryJob:
        """Queue a summary of the session's transcript; with ``messages``, store them first.

        With ``messages``, the transcript and the job are one atomic commit
        (through :meth:`SessionTier.save_transcript`, which replaces any
        earlier transcript and its summary). Without, the job is committed
        only while a transcript is stored.

        Args:
            user_id: The user.
            session_id: The session.
            messages: The transcript to store, or ``None`` to summarize the stored one.
            created_at: When the session ended (with ``messages``).
            max_attempts: Attempts at most before the job fails for good.

        Returns:
            The pending job.

        Raises:
            InvalidInputError: A bad id, transcript or ``max_attempts``; nothing was written.
            SessionNotFoundError: Without ``messages``: no transcript is stored.
            ConflictError: Other writers kept changing the session; retry.
            BackendUnavailableError: The KV store failed.
        """
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        if isinstance(max_attempts, bool) or not isinstance(max_attempts, int) or max_attempts < 1:
            raise InvalidInputError("max_attempts must be an integer >= 1", field="max_attempts")
        now = utcnow()
        job = SummaryJob(
            job_id=new_job_id(),
            user_id=user_id,
            session_id=session_id,
            status=JobState.PENDING,
            created_at=now,
            max_attempts=max_attempts,
            available_at=now,
        )
        writes: list[Write] = [
            Put(self._jobs, job.job_id, encode(job)),
            Put(keys.user_jobs_space(self._tenant, user_id), job.job_id, b""),
            Put(self._queue, job.queue_key, str(micros(now)).encode()),
        ]
        # Listed apart (another placement), before and after the commit: see _job_tenants.
        ensure_listed(self._kv, self._tenant)
        if messages is not None:
            self._sessions.save_transcript(
                user_id, session_id, messages, created_at=created_at, also=writes
            )
            ensure_listed(self._kv, self._tenant)
            return job
        transcripts = keys.transcripts_space(self._tenant, user_id)
        for attempt in range(cas.ATTEMPTS):
            (raw,) = self._kv.get_many(transcripts, [header_key(session_id)])
            if raw is None:
                raise SessionNotFoundError(
                    f"user {user_id!r} has no transcript stored for session {session_id!r}"
                )
            try:
                self._kv.commit(writes, [Check(transcripts, header_key(session_id), raw)])
            except ConflictError:
                cas.backoff(attempt)
                continue
            ensure_listed(self._kv, self._tenant)
            return job
        raise ConflictError(f"session {session_id!r} of user {user_id!r} kept changing: retry")

    # -- reading -------------------------------------------------------------------------------

    def get(self, job_id: str) -> SummaryJob | None:
        """The job with this id, or ``None`` (never submitted, purged or erased)."""
        if not isinstance(job_id, str) or len(job_id) != JOB_ID_LEN:
            return None  # not an id this module makes: no store round trip
        (raw,) = self._kv.get_many(self._jobs, [job_id])
        return None if raw is None else self._decode(job_id, raw)

    def _decode(self, job_id: str, raw: bytes) -> SummaryJob:
        return decode(SummaryJob, raw, where=f"{self._jobs}/{job_id}")

    # -- running (workers) ---------------------------------------------------------------------

    def claim(
        self,
        owner: str,
        *,
        lease: timedelta,
        after_user: str | None = None,
        now: datetime | None = None,
    ) -> Claim | None:
        """Take the next claimable job under a lease, users in turn.

        Users are tried in key order starting after ``after_user`` (wrapping
        around), each user's oldest claimable job first: give the user of the
        last claim as ``after_user`` and every user with queued work gets a
        job before any user gets a second one.

        Args:
            owner: Who claims (unique per worker).
            lease: How long the claim holds unless renewed (:meth:`renew`).
            after_user: Start after this user.
            now: The current time (default: now).

        Returns:
            The claim, or ``None`` when no job is claimable now.

        Raises:
            BackendUnavailableError: The KV store failed.
        """
        now = now or utcnow()
        visited: set[str] = set()
        cursor = after_user
        wrapped = after_user is None
        while True:
            start = None if cursor is None else keys.job_queue_past_user(cursor)
            rows = self._kv.scan(self._queue, start_after=start, limit=1)
            if not rows:
                if wrapped:
                    return None
                wrapped, cursor = True, None
                continue
            user = rows[0][0].split("/", 1)[0]
            if user in visited:
                return None
            visited.add(user)
            claim = self._claim_from(user, owner, lease, now)
            if claim is not None:
                return claim
            cursor = user

    def _claim_from(self, user: str, owner: str, lease: timedelta, now: datetime) -> Claim | None:
        now_us = micros(now)
        rows = self._kv.scan(self._queue, prefix=f"{user}/", limit=_PER_USER_SCAN)
        for key, value in rows:
            try:
                if int(value) > now_us:
                    continue  # running under a live lease, or waiting for a retry
            except ValueError:
                pass  # unreadable: the record decides
            claim = self._take(key, value, owner, lease, now)
            if claim is not None:
                return claim
        return None

    def _take(
        self, queue_key: str, queued: bytes, owner: str, lease: timedelta, now: datetime
    ) -> Claim | None:
        job_id = queue_key.rsplit("/", 1)[-1]
        (raw,) = self._kv.get_many(self._jobs, [job_id])
        job = None
        if raw is not None:
            try:
                job = self._decode(job_id, raw)
            except CorruptRecordError:
                job = None
        if job is None or job.finished or job.queue_key != queue_key:
            # An entry left without its job (never written by this module in one commit,
            # but a damaged record must not block the user's queue): drop it.
            with contextlib.suppress(ConflictError):  # changed meanwhile: looked at again later
                self._kv.commit(
                    [Delete(self._queue, queue_key)], [Check(self._queue, queue_key, queued)]
                )
            return None
        if job.available_at > now:
            return None
        exhausted = job.attempts >= job.max_attempts
        until = now + lease
        taken = job.model_copy(
            update={
                "status": JobState.RUNNING,
                "attempts": job.attempts if exhausted else job.attempts + 1,
                "lease_owner": owner,
                "available_at": until,
                "started_at": now,
            }
        )
        data = encode(taken)
        try:
            self._kv.commit(
                [
                    Put(self._jobs, job_id, data),
                    Put(self._queue, queue_key, str(micros(until)).encode()),
                ],
                [Check(self._jobs, job_id, raw), Check(self._queue, queue_key, queued)],
            )
        except ConflictError:
            return None  # another worker took it first
        return Claim(taken, data, exhausted)

    def renew(self, claim: Claim, *, lease: timedelta, now: datetime | None = None) -> Claim | None:
        """Extend a claim's lease.

        Returns:
            The renewed claim, or ``None`` when the lease was lost (it expired
            and another worker took the job, or the job was erased).
        """
        until = (now or utcnow()) + lease
        job = claim.job.model_copy(update={"available_at": until})
        return self._write(
            claim, job, [Put(self._queue, job.queue_key, str(micros(until)).encode())]
        )

    def succeed(self, claim: Claim, *, now: datetime | None = None) -> bool:
        """Record the claimed job as succeeded. Returns ``False`` if the lease was lost."""
        now = now or utcnow()
        job = claim.job.model_copy(
            update={
                "status": JobState.SUCCEEDED,
                "lease_owner": None,
                "available_at": now,
                "finished_at": now,
                "error": None,
            }
        )
        return self._write(claim, job, self._finish_writes(job)) is not None

    def fail(
        self,
        claim: Claim,
        error: dict[str, JsonValue],
        *,
        retry: bool,
        backoff: timedelta,
        now: datetime | None = None,
    ) -> SummaryJob | None:
        """Record a failed attempt: retried after ``backoff`` if ``retry`` and attempts are left,
        else failed for good. ``error`` is kept either way.

        Returns:
            The job as recorded, or ``None`` if the lease was lost.
        """
        now = now or utcnow()
        job = claim.job
        if retry and job.attempts < job.max_attempts and not claim.exhausted:
            again = now + backoff
            job = job.model_copy(
                update={
                    "status": JobState.PENDING,
                    "lease_owner": None,
                    "available_at": again,
                    "error": error,
                }
            )
            extra: list[Write] = [Put(self._queue, job.queue_key, str(micros(again)).encode())]
        else:
            job = job.model_copy(
                update={
                    "status": JobState.FAILED,
                    "lease_owner": None,
                    "available_at": now,
                    "finished_at": now,
                    "error": error,
                }
            )
            extra = self._finish_writes(job)
        return job if self._write(claim, job, extra) is not None else None

    def release(self, claim: Claim, *, now: datetime | None = None) -> bool:
        """Give a claimed job back unfinished (a shutdown): claimable at once, the attempt not counted.

        Returns ``False`` if the lease was lost.
        """
        now = now or utcnow()
        job = claim.job.model_copy(
            update={
                "status": JobState.PENDING,
                "attempts": max(0, claim.job.attempts - (0 if claim.exhausted else 1)),
                "lease_owner": None,
                "available_at": now,
            }
        )
        extra: list[Write] = [Put(self._queue, job.queue_key, str(micros(now)).encode())]
        return self._write(claim, job, extra) is not None

    def _finish_writes(self, job: SummaryJob) -> list[Write]:
        assert job.finished_at is not None
        return [
            Delete(self._queue, job.queue_key),
            Put(self._done, keys.job_done_key(micros(job.finished_at), job.job_id), b""),
        ]

    def _write(self, claim: Claim, job: SummaryJob, extra: list[Write]) -> Claim | None:
        """Commit ``job`` (and ``extra``) if the record is still what this worker last wrote."""
        data = encode(job)
        try:
            self._kv.commit(
                [Put(self._jobs, job.job_id, data), *extra],
                [Check(self._jobs, job.job_id, claim.raw)],
            )
        except ConflictError:
            return None
        return Claim(job, data, claim.exhausted)

    # -- erasure and retention -----------------------------------------------------------------

    def delete_user(self, user_id: str) -> int:
        """Delete every job of the user (queued, running or finished) with what it recorded.

        A worker still running one of them finds its record gone and writes
        nothing (every write of a claim is checked against the record).

        Returns:
            How many jobs were deleted.
        """
        check_id(user_id, "user_id")
        return self._delete(user_id, None)

    def delete_session(self, user_id: str, session_id: str) -> int:
        """Delete the jobs of one session of the user (see :meth:`delete_user`)."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        return self._delete(user_id, session_id)

    def _delete(self, user_id: str, session_id: str | None) -> int:
        index = keys.user_jobs_space(self._tenant, user_id)
        job_ids = [key for key, _ in self._kv.scan(index)]
        deleted = 0
        for start in range(0, len(job_ids), _BATCH):
            batch = job_ids[start : start + _BATCH]
            writes: list[Write] = []
            for job_id, raw in zip(batch, self._kv.get_many(self._jobs, batch), strict=True):
                job = None
                if raw is not None:
                    try:
                        job = self._decode(job_id, raw)
                    except CorruptRecordError:
                        job = None
                if session_id is not None and (job is None or job.session_id != session_id):
                    continue
                writes.extend(self._delete_writes(user_id, job_id, job))
                deleted += 1
            if writes:
                self._kv.commit(writes)
        if session_id is None:
            # Queue entries of the user without an index entry (none are written so): gone too.
            strays = self._kv.scan(self._queue, prefix=f"{user_id}/")
            if strays:
                self._kv.commit([Delete(self._queue, key) for key, _ in strays])
        return deleted

    def _delete_writes(self, user_id: str, job_id: str, job: SummaryJob | None) -> list[Write]:
        writes: list[Write] = [
            Delete(self._jobs, job_id),
            Delete(keys.user_jobs_space(self._tenant, user_id), job_id),
        ]
        if job is not None:
            writes.append(Delete(self._queue, job.queue_key))
            if job.finished_at is not None:
                writes.append(
                    Delete(self._done, keys.job_done_key(micros(job.finished_at), job_id))
                )
        return writes

    def purge(self, finished_before: datetime, *, limit: int = _BATCH) -> int:
        """Delete up to ``limit`` jobs that finished before ``finished_before``, oldest first.

        Returns:
            How many were deleted (fewer than ``limit``: none older is left).
        """
        horizon = keys.job_done_key(micros(finished_before), "")
        rows = self._kv.scan(self._done, limit=limit)
        old = [key for key, _ in rows if key < horizon]
        if not old:
            return 0
        job_ids = [key.split("/", 1)[1] for key in old]
        writes: list[Write] = [Delete(self._done, key) for key in old]
        for job_id, raw in zip(job_ids, self._kv.get_many(self._jobs, job_ids), strict=True):
            if raw is None:
                continue
            try:
                job = self._decode(job_id, raw)
            except CorruptRecordError:
                writes.append(Delete(self._jobs, job_id))
                continue
            if job.finished:
                writes.extend(self._delete_writes(job.user_id, job_id, job))
        self._kv.commit(writes)
        return len(old)
