"""The long-lived workers that read cold recalls' views (issue 19 item 2, ``_ViewWorkers``).

A cold recall hands its view's reads to a worker thread that outlives it: the
next cold recall reuses it (one SQLite reader connection for the worker's life,
instead of one per recall), a recall that finds every worker busy with other
users' reads does its own, and ``close`` (of the tier, or of the Memory holding
it) stops and joins the workers. Past the process's cap a tenant's cold recall
borrows an idle worker of another tenant's tier: 20 tenants' reads all done by
16 threads, a lent read not begun at its tier's close left to its caller, one
begun waited for by that close, a child of fork lending only its own workers.
No timing is asserted. Real parts: SQLite, embedded Chroma, the MiniLM model;
the index is only wrapped to observe and hold reads.
"""

from __future__ import annotations

import gc
import os
import queue
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memory import Memory
from tests.forking import in_forked_child
from tests.waiting import wait_until
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import StoreClosedError
from tiers.session import SessionSummary, SessionTier, _reads
from tiers.session._lending import Lenders
from tiers.session._reads import READ_WORKERS

WORKER = "tiermem-recall-view"
QUERY = "ferry to Zanzibar"
USERS = [f"u{n}" for n in range(READ_WORKERS + 2)]

pytestmark = pytest.mark.skipif(
    not Path("/proc/self/fd").is_dir(), reason="needs /proc to count descriptors"
)


def new_workers(before: Sequence[threading.Thread]) -> list[threading.Thread]:
    """The live view-reading workers not in ``before`` (other tests' tiers may have theirs)."""
    return [t for t in threading.enumerate() if t.name == WORKER and t not in before]


def descriptors_of(prefix: Path) -> int:
    """This process's open descriptors on files whose path starts with ``prefix``."""
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since the listing (e.g. the listing's own)
            continue
        count += target.startswith(str(prefix.resolve()))
    return count


def count_connects(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    """Record each SQLite connection opened from now on (the KV store's and Chroma's)."""
    opened: list[str] = []
    connect = sqlite3.connect

    def counting(*args: Any, **kwargs: Any) -> sqlite3.Connection:
        opened.append(threading.current_thread().name)
        return connect(*args, **kwargs)

    monkeypatch.setattr(sqlite3, "connect", counting)
    return opened


def spy_on_reads(monkeypatch: pytest.MonkeyPatch, index: ChromaVectorIndex) -> list[str]:
    """Record the name of the thread of each vector read."""
    threads: list[str] = []
    read = index.get_embeddings

    def get_embeddings(ids: Sequence[str]) -> tuple[list[str], npt.NDArray[np.float32]]:
        threads.append(threading.current_thread().name)
        return read(ids)

    monkeypatch.setattr(index, "get_embeddings", get_embeddings)
    return threads


def saved(tier: SessionTier) -> SessionTier:
    for user in USERS:
        tier.save_session(
            SessionSummary(
                session_id="trip", user_id=user, task_description=f"{user} takes the {QUERY}"
            )
        )
        tier.save_session(SessionSummary(session_id="tax", user_id=user, task_description="tax"))
    return tier


def recalled(tier: SessionTier, user: str) -> list[tuple[str, str]]:
    return [(h.summary.user_id, h.summary.session_id) for h in tier.recall_relevant(user, QUERY)]


def test_cold_recalls_reuse_one_worker_and_its_connection(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = threading.enumerate()
    # No view is cached: every recall is cold and hands its reads to a worker.
    tier = saved(SessionTier(sqlite_kv, index, embedder, cache_users=0))
    threads = spy_on_reads(monkeypatch, index)
    assert recalled(tier, "u0") == [("u0", "trip"), ("u0", "tax")]
    (worker,) = new_workers(before)
    descriptors = descriptors_of(sqlite_kv.path)
    connects = count_connects(monkeypatch)
    for n in range(40):
        user = USERS[n % len(USERS)]
        assert recalled(tier, user) == [(user, "trip"), (user, "tax")]
    assert threads == [WORKER] * 41
    assert new_workers(before) == [worker]
    # The worker kept its connections: none was opened (or leaked) per recall.
    assert connects == []
    assert descriptors_of(sqlite_kv.path) == descriptors
    tier.close()
    assert not worker.is_alive()
    tier.close()  # idempotent


def test_a_recall_does_not_wait_for_workers_busy_with_other_users(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = threading.enumerate()
    tier = saved(SessionTier(sqlite_kv, index, embedder, cache_users=0))
    held = threading.Semaphore(0)
    release = threading.Event()
    threads: list[str] = []
    read = index.get_embeddings

    def get_embeddings(ids: Sequence[str]) -> tuple[list[str], npt.NDArray[np.float32]]:
        threads.append(threading.current_thread().name)
        if threading.current_thread().name == WORKER:
            held.release()
            release.wait(120)  # every worker stays inside another user's reads
        return read(ids)

    monkeypatch.setattr(index, "get_embeddings", get_embeddings)
    answers: dict[str, list[tuple[str, str]]] = {}

    def ask(user: str) -> None:
        answers[user] = recalled(tier, user)

    busy_users = USERS[:READ_WORKERS]
    callers = [threading.Thread(target=ask, args=(user,)) for user in busy_users]
    try:
        for caller in callers:
            caller.start()
        for _ in callers:
            assert held.acquire(timeout=120)
        # Every worker is busy: this recall reads its own view, in its own thread, and answers.
        assert recalled(tier, USERS[-1]) == [(USERS[-1], "trip"), (USERS[-1], "tax")]
        assert threads.count(threading.current_thread().name) == 1
        assert len(new_workers(before)) == READ_WORKERS
    finally:
        release.set()
        for caller in callers:
            caller.join(120)
    assert {user: answers[user] for user in busy_users} == {
        user: [(user, "trip"), (user, "tax")] for user in busy_users
    }
    tier.close()
    assert new_workers(before) == []


def test_concurrent_cold_recalls_of_different_users_all_answer(
    sqlite_kv: SqliteKVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder
) -> None:
    before = threading.enumerate()
    tier = saved(SessionTier(sqlite_kv, index, embedder, cache_users=0))
    answers: dict[str, list[list[tuple[str, str]]]] = {user: [] for user in USERS}

    def ask(user: str) -> None:
        for _ in range(5):
            answers[user].append(recalled(tier, user))

    callers = [threading.Thread(target=ask, args=(user,)) for user in USERS]
    for caller in callers:
        caller.start()
    for caller in callers:
        caller.join(300)
    assert not any(caller.is_alive() for caller in callers)
    assert answers == {user: [[(user, "trip"), (user, "tax")]] * 5 for user in USERS}
    assert 1 <= len(new_workers(before)) <= READ_WORKERS
    tier.close()
    assert new_workers(before) == []


def test_after_close_a_recall_reads_itself_or_raises_as_the_closed_store_does(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = threading.enumerate()
    tier = saved(SessionTier(sqlite_kv, index, embedder, cache_users=0))
    assert recalled(tier, "u0") == [("u0", "trip"), ("u0", "tax")]
    tier.close()
    assert new_workers(before) == []
    # The tier's workers are gone, its stores are not: the caller reads, no worker starts again.
    threads = spy_on_reads(monkeypatch, index)
    assert recalled(tier, "u1") == [("u1", "trip"), ("u1", "tax")]
    assert threads == [threading.current_thread().name]
    sqlite_kv.close()
    with pytest.raises(StoreClosedError):
        tier.recall_relevant("u2", QUERY)
    assert new_workers(before) == []


def test_a_tier_dropped_without_close_stops_its_worker(
    sqlite_kv: SqliteKVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder
) -> None:
    before = threading.enumerate()
    tier = saved(SessionTier(sqlite_kv, index, embedder, cache_users=0))
    assert recalled(tier, "u0") == [("u0", "trip"), ("u0", "tax")]
    (worker,) = new_workers(before)
    del tier
    gc.collect()
    worker.join(60)
    assert not worker.is_alive()


def test_an_idle_worker_ends_and_the_next_cold_recall_starts_another(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = threading.enumerate()
    tier = saved(SessionTier(sqlite_kv, index, embedder, cache_users=0))
    monkeypatch.setattr(_reads, "IDLE_S", 0.05)
    assert recalled(tier, "u0") == [("u0", "trip"), ("u0", "tax")]
    (worker,) = new_workers(before)
    worker.join(60)  # a tenant nobody asks holds no thread
    assert not worker.is_alive()
    threads = spy_on_reads(monkeypatch, index)
    assert recalled(tier, "u1") == [("u1", "trip"), ("u1", "tax")]
    assert threads == [WORKER]
    tier.close()
    assert new_workers(before) == []


def test_open_recall_close_cycles_leave_no_worker_and_no_descriptor(tmp_path: Path) -> None:
    before = threading.enumerate()
    data = tmp_path / "data"
    for cycle in range(3):
        with Memory.open(data) as memory:
            if cycle == 0:
                saved(memory.sessions)
                memory.sessions.flush()
            assert recalled(memory.sessions, "u0") == [("u0", "trip"), ("u0", "tax")]
            assert len(new_workers(before)) == 1
        assert new_workers(before) == []
        assert descriptors_of(data / "tiermem.sqlite3") == 0


# -- Past the process cap: idle workers lent to other tenants' readers (tiers/session/_lending.py).


def tenant_tier(
    sqlite_kv: SqliteKVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, tenant: str
) -> SessionTier:
    """A tier of ``tenant`` on the shared stores, its user u0 holding one trip, never cached."""
    tier = SessionTier(sqlite_kv, index, embedder, tenant=tenant, cache_users=0)
    tier.save_session(
        SessionSummary(session_id=f"trip-{tenant}", user_id="u0", task_description=QUERY)
    )
    return tier


def spy_on_read_threads(
    monkeypatch: pytest.MonkeyPatch, index: ChromaVectorIndex
) -> list[threading.Thread]:
    """Record the thread of each vector read (the thread itself: workers share one name)."""
    threads: list[threading.Thread] = []
    read = index.get_embeddings

    def get_embeddings(ids: Sequence[str]) -> tuple[list[str], npt.NDArray[np.float32]]:
        threads.append(threading.current_thread())
        return read(ids)

    monkeypatch.setattr(index, "get_embeddings", get_embeddings)
    return threads


def test_every_tenant_past_the_cap_has_its_cold_reads_done_by_a_lent_worker(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    # The real cap, fresh, and no lender yet: other tests' idle workers are in the module's own.
    cap = threading.BoundedSemaphore(_reads.MAX_PROCESS_READ_WORKERS)
    monkeypatch.setattr(_reads, "_process_workers", cap)
    monkeypatch.setattr(_reads, "_lenders", Lenders())
    before = threading.enumerate()
    tenants = [f"t{n}" for n in range(_reads.MAX_PROCESS_READ_WORKERS + 4)]
    tiers = {tenant: tenant_tier(sqlite_kv, index, embedder, tenant) for tenant in tenants}
    threads = spy_on_read_threads(monkeypatch, index)
    read_by: dict[str, threading.Thread] = {}
    for _ in range(2):  # the first cold recall of each tenant, then another
        for tenant, tier in tiers.items():
            threads.clear()
            hits = tier.recall_relevant("u0", QUERY)
            # Each tenant gets its own session only, also from a worker lent by another.
            assert [(h.summary.user_id, h.summary.session_id) for h in hits] == [
                ("u0", f"trip-{tenant}")
            ]
            (read_by[tenant],) = threads
            assert read_by[tenant].name == WORKER
    workers = new_workers(before)
    # The first 16 tenants started a worker each and took every place in the cap; the
    # others' reads were done by those same threads, none started past the cap.
    assert len(workers) == _reads.MAX_PROCESS_READ_WORKERS
    assert not cap.acquire(blocking=False)
    assert set(read_by.values()) <= set(workers)
    for tier in tiers.values():
        tier.close()
    assert new_workers(before) == []


class GatedJobs:
    """A crew's job queue whose worker, while ``gate`` is clear, holds each job it takes."""

    def __init__(self) -> None:
        self._jobs: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.gate = threading.Event()
        self.gate.set()
        self.holding = threading.Event()

    def put(self, job: Any) -> None:
        self._jobs.put(job)

    def empty(self) -> bool:
        return self._jobs.empty()

    def get(self, timeout: float | None = None) -> Any:
        job = self._jobs.get(timeout=timeout)
        if job is not None and not self.gate.is_set():
            self.holding.set()
            self.gate.wait(120)  # the job is queued, not begun, until the test opens the gate
        return job


def lender_and_borrower(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> tuple[SessionTier, SessionTier, GatedJobs]:
    """Tenant a's tier with an idle worker holding the cap's only place; tenant b's without."""
    monkeypatch.setattr(_reads, "_process_workers", threading.BoundedSemaphore(1))
    monkeypatch.setattr(_reads, "_lenders", Lenders())  # other tests' idle workers lend nothing
    lender = tenant_tier(sqlite_kv, index, embedder, "a")
    jobs = GatedJobs()
    monkeypatch.setattr(lender._reader._workers._crew, "_jobs", jobs)
    assert recalled_trip(lender, "a")  # starts a's worker, which then idles
    return lender, tenant_tier(sqlite_kv, index, embedder, "b"), jobs


def recalled_trip(tier: SessionTier, tenant: str) -> bool:
    hits = tier.recall_relevant("u0", QUERY)
    return [(h.summary.user_id, h.summary.session_id) for h in hits] == [("u0", f"trip-{tenant}")]


def test_a_lent_read_not_begun_when_its_tier_closes_is_left_to_its_caller(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = threading.enumerate()
    lender, borrower, jobs = lender_and_borrower(sqlite_kv, index, embedder, monkeypatch)
    (worker,) = new_workers(before)
    threads = spy_on_read_threads(monkeypatch, index)
    jobs.gate.clear()
    answers: list[bool] = []
    caller = threading.Thread(target=lambda: answers.append(recalled_trip(borrower, "b")))
    caller.start()
    try:
        assert jobs.holding.wait(120)  # b's reads are queued on a's worker, not begun
        borrower.close()  # returns at once: none of its reads has begun
    finally:
        jobs.gate.set()
    caller.join(120)
    # The worker did not run them after the close: the recall read its view itself.
    assert answers == [True]
    assert threads == [caller]
    assert new_workers(before) == [worker]
    assert recalled_trip(lender, "a")  # the lender's worker serves on
    assert threads == [caller, worker]
    lender.close()
    assert new_workers(before) == []


def test_a_tier_closing_waits_for_its_lent_read_that_has_begun(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = threading.enumerate()
    lender, borrower, _ = lender_and_borrower(sqlite_kv, index, embedder, monkeypatch)
    (worker,) = new_workers(before)
    crew = borrower._reader._workers._crew
    order: list[str] = []
    reading = threading.Event()
    read = index.get_embeddings

    def get_embeddings(ids: Sequence[str]) -> tuple[list[str], npt.NDArray[np.float32]]:
        if threading.current_thread() is worker:
            reading.set()
            wait_until(lambda: crew._closed)  # the close has begun while this read runs
            got = read(ids)
            order.append("read")
            return got
        return read(ids)

    monkeypatch.setattr(index, "get_embeddings", get_embeddings)
    answers: list[bool] = []
    caller = threading.Thread(target=lambda: answers.append(recalled_trip(borrower, "b")))
    caller.start()
    assert reading.wait(120)
    borrower.close()
    order.append("closed")
    caller.join(120)
    assert order == ["read", "closed"]
    assert answers == [True]
    lender.close()
    assert new_workers(before) == []


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_after_lending_borrows_only_its_own_workers() -> None:
    class Job(_reads._ViewReads):
        """Reads that only record their thread."""

        def __init__(self) -> None:
            self._error = None
            self._done = threading.Event()
            self.ran_in: str | None = None

        def read(self) -> None:
            self.ran_in = threading.current_thread().name

    lender = _reads._Crew(1)
    assert lender.hand_over(done := Job())  # a worker of the parent's, then idle and lendable
    assert done._done.wait(60)

    def check() -> list[object]:
        cap = _reads._process_workers  # the child's own, every place free
        for _ in range(_reads.MAX_PROCESS_READ_WORKERS):
            assert cap.acquire(blocking=False)
        # Past the cap, the only free worker being the parent's (not here): none to borrow.
        alone = _reads._Crew(1).hand_over(Job())
        cap.release()
        own = _reads._Crew(1)
        assert own.hand_over(first := Job())  # the child's own worker takes the last place
        assert first._done.wait(10)
        job = Job()
        lent = _reads._Crew(1).hand_over(job)  # past the cap: the child's worker is lent
        served = job._done.wait(10)
        return [alone, lent, served, job.ran_in]

    reported = in_forked_child(check)
    for thread in lender.stop():
        thread.join(60)
    assert reported == [False, True, True, WORKER]
