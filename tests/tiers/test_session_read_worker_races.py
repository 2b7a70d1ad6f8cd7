"""Races of the cold-recall read workers (``_Crew``/``_ViewWorkers`` in tiers/session/_reads.py).

The crew's own bookkeeping is driven with jobs that only record where they ran
(a job is a :class:`_reads._ViewReads` whose reads are replaced, no store is
involved): a job handed to a worker ending on its idle timeout, the finalizer
stopping a crew while a job is in flight, a ``BaseException`` out of a read.
Then real tiers (SQLite, embedded Chroma, MiniLM) of two tenants on one store:
concurrent cold recalls answer each tenant with its own sessions only, and a
``close`` racing them leaves every recall answering; a recall whose worker
cannot be started (a thread limit) reads its view itself; many tenant views of
one Memory hold a bounded number of workers and release them and their SQLite
descriptors at close. No timing is asserted.
"""

from __future__ import annotations

import gc
import os
import threading
from pathlib import Path

import pytest

from memory import Memory
from tests.forking import in_forked_child
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.session import SessionSummary, SessionTier, _reads

WAIT_S = 60
WORKER = "tiermem-recall-view"


class Abort(BaseException):
    """A ``BaseException`` that is not an ``Exception``, raised out of a read."""


class Job(_reads._ViewReads):
    """A job whose read records its thread, optionally waits for ``hold``, or raises ``fail``."""

    def __init__(
        self, hold: threading.Event | None = None, fail: BaseException | None = None
    ) -> None:
        self._error = None
        self._done = threading.Event()
        self._hold = hold
        self._fail = fail
        self.started = threading.Event()
        self.ran_in: str | None = None

    def read(self) -> None:
        self.ran_in = threading.current_thread().name
        self.started.set()
        if self._hold is not None:
            self._hold.wait(WAIT_S)
        if self._fail is not None:
            raise self._fail

    def finished(self) -> bool:
        return self._done.wait(WAIT_S)


def _stop_and_join(crew: _reads._Crew) -> None:
    for thread in crew.stop():
        thread.join(WAIT_S)
        assert not thread.is_alive()


class WidenedLock:
    """The crew's lock, taken by a worker only after a short pause.

    Between a worker's idle timeout and its taking the lock to leave, a caller
    can hand over a job: the pause makes that window wide enough to be hit.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._pause = threading.Event()

    def __enter__(self) -> None:
        if threading.current_thread().name == WORKER:
            self._pause.wait(0.001)
        self._lock.acquire()

    def __exit__(self, *exc: object) -> None:
        self._lock.release()


@pytest.mark.parametrize("size", [1, 2])
def test_a_job_handed_to_a_worker_ending_on_idle_is_always_served(
    monkeypatch: pytest.MonkeyPatch, size: int
) -> None:
    # Workers time out about as often as jobs arrive: hand-overs meet expiring workers.
    monkeypatch.setattr(_reads, "IDLE_S", 0.0005)
    crew = _reads._Crew(size)
    monkeypatch.setattr(crew, "_lock", WidenedLock())
    handed: list[int] = []
    stranded: list[Job] = []

    def caller(pause: float) -> None:
        gap = threading.Event()
        for n in range(200):
            job = Job()
            if crew.hand_over(job):
                handed.append(1)
                if not job.finished() or job.ran_in != WORKER:
                    stranded.append(job)
                    return
            if n % 2 == 0:
                gap.wait(pause)  # now and then long enough for a worker to expire

    callers = [threading.Thread(target=caller, args=(p,)) for p in (0.0005, 0.001, 0.002)]
    for thread in callers:
        thread.start()
    for thread in callers:
        thread.join(WAIT_S * 5)
        assert not thread.is_alive()
    assert stranded == []
    assert handed
    _stop_and_join(crew)


def test_the_finalizer_stops_a_crew_whose_job_is_in_flight() -> None:
    workers = _reads._ViewWorkers(2)
    crew = workers._crew
    hold = threading.Event()
    job = Job(hold)
    assert crew.hand_over(job)
    assert job.started.wait(WAIT_S)
    (thread,) = list(crew._threads)
    del workers  # the reader dropped while its worker reads
    gc.collect()
    assert not crew.hand_over(Job())  # stopped: later recalls read themselves
    hold.set()
    assert job.finished()
    thread.join(WAIT_S)
    assert not thread.is_alive()


@pytest.mark.filterwarnings("ignore::pytest.PytestUnhandledThreadExceptionWarning")
def test_a_base_exception_in_a_read_ends_its_worker_and_the_next_job_gets_another() -> None:
    crew = _reads._Crew(1)
    failing = Job(fail=Abort("out of a read"))
    assert crew.hand_over(failing)
    (dying,) = list(crew._threads)
    assert failing.finished()  # the caller is let go; it does the reads that are left
    failing.wait()  # no Exception was kept: the caller reads the view itself
    dying.join(WAIT_S)  # ended by the Abort (reported by threading's excepthook, ignored here)
    assert not dying.is_alive()
    assert crew._threads == []
    assert crew._free == 0
    job = Job()
    assert crew.hand_over(job)
    assert job.finished()
    assert job.ran_in == WORKER
    _stop_and_join(crew)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_a_child_forked_while_a_worker_is_counted_free_serves_its_recall() -> None:
    crew = _reads._Crew(1)
    assert crew.start_warm(lambda: None)  # then idle for IDLE_S, counted free

    def check() -> list[object]:
        job = Job()
        handed = crew.hand_over(job)
        served = job._done.wait(10)  # the parent's worker is not in the child
        return [handed, served, job.ran_in]

    reported = in_forked_child(check)
    _stop_and_join(crew)
    assert reported == [True, True, WORKER]


def _summaries(tier: SessionTier, tenant: str) -> None:
    for user in ("u0", "u1", "u2"):
        tier.save_session(
            SessionSummary(
                session_id=f"{tenant}-trip",
                user_id=user,
                task_description=f"{tenant} {user} takes the ferry to Zanzibar",
            )
        )


def test_tenants_recalling_at_once_get_only_their_own_sessions_while_one_closes(
    sqlite_kv: SqliteKVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder
) -> None:
    before = threading.enumerate()
    tiers = {
        tenant: SessionTier(sqlite_kv, index, embedder, tenant=tenant, cache_users=0)
        for tenant in ("t1", "t2")
    }
    for tenant, tier in tiers.items():
        _summaries(tier, tenant)
    wrong: list[tuple[str, str, list[str]]] = []
    errors: list[BaseException] = []
    asked = threading.Semaphore(0)

    def ask(tenant: str, user: str) -> None:
        try:
            for _ in range(4):
                hits = tiers[tenant].recall_relevant(user, "ferry to Zanzibar")
                got = [f"{h.summary.user_id}/{h.summary.session_id}" for h in hits]
                if got != [f"{user}/{tenant}-trip"]:
                    wrong.append((tenant, user, got))
                asked.release()
        except BaseException as exc:
            errors.append(exc)

    callers = [
        threading.Thread(target=ask, args=(tenant, user))
        for tenant in tiers
        for user in ("u0", "u1", "u2")
    ]
    for thread in callers:
        thread.start()
    assert asked.acquire(timeout=WAIT_S * 5)
    tiers["t1"].close()  # while the others recall: theirs read without workers from now on
    for thread in callers:
        thread.join(WAIT_S * 5)
        assert not thread.is_alive()
    assert errors == []
    assert wrong == []
    tiers["t2"].close()
    assert [t for t in threading.enumerate() if t.name == WORKER and t not in before] == []


def test_a_recall_that_cannot_start_a_worker_reads_its_view_itself(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tier = SessionTier(sqlite_kv, index, embedder, tenant="t1", cache_users=0)
    _summaries(tier, "t1")
    start = threading.Thread.start

    def refused(thread: threading.Thread) -> None:
        if thread.name == WORKER:
            # What a process or container at its thread limit gets from start().
            raise RuntimeError("can't start new thread")
        start(thread)

    monkeypatch.setattr(threading.Thread, "start", refused)
    hits = tier.recall_relevant("u0", "ferry to Zanzibar")
    assert [(h.summary.user_id, h.summary.session_id) for h in hits] == [("u0", "t1-trip")]
    monkeypatch.undo()
    # Once threads can be had again, a cold recall gets a worker as usual.
    hits = tier.recall_relevant("u1", "ferry to Zanzibar")
    assert [(h.summary.user_id, h.summary.session_id) for h in hits] == [("u1", "t1-trip")]
    assert tier._reader._workers._crew._threads
    tier.close()
    assert not tier._reader._workers._crew._threads


def test_many_tenant_views_hold_bounded_workers_and_release_all_at_close(tmp_path: Path) -> None:
    before = threading.enumerate()
    data = tmp_path / "data"
    tenants = [f"t{n}" for n in range(12)]
    with Memory.open(data) as memory:
        for tenant in tenants:
            memory.for_tenant(tenant).save_session(
                SessionSummary(session_id="trip", user_id="u0", task_description="ferry trip")
            )
        memory.sessions.flush()
        for tenant in tenants:
            view = memory.for_tenant(tenant)
            view.sessions.flush()
            hits = view.sessions.recall_relevant("u0", "ferry", top_k=5)
            assert [h.summary.session_id for h in hits] == ["trip"]
        workers = [t for t in threading.enumerate() if t.name == WORKER and t not in before]
        # A worker per tenant that recalled (each recall was alone): bounded by tenants x size.
        assert 1 <= len(workers) <= len(tenants) * _reads.READ_WORKERS
    assert [t for t in threading.enumerate() if t.name == WORKER and t not in before] == []
    prefix = str((data / "tiermem.sqlite3").resolve())
    left = [fd for fd in os.listdir("/proc/self/fd") if _target(fd).startswith(prefix)]
    assert left == []


def _target(fd: str) -> str:
    try:
        return os.readlink(f"/proc/self/fd/{fd}")
    except OSError:  # closed since the listing (the listing's own descriptor)
        return ""


def test_the_process_cap_bounds_workers_across_tenants_and_recalls_still_answer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A cap of 3 for this test (the real one, 16, takes as many tenants to reach): each worker
    # gives back the place it took in the cap it took it from, so earlier tests' idle
    # workers do not count here.
    cap = threading.BoundedSemaphore(3)
    monkeypatch.setattr(_reads, "_process_workers", cap)
    before = threading.enumerate()
    tenants = [f"t{n}" for n in range(8)]
    with Memory.open(tmp_path / "data") as memory:
        for tenant in tenants:
            memory.for_tenant(tenant).save_session(
                SessionSummary(session_id=f"trip-{tenant}", user_id="u0", task_description="ferry")
            )
        memory.sessions.flush()
        for tenant in tenants:
            view = memory.for_tenant(tenant)
            view.sessions.flush()
            hits = view.sessions.recall_relevant("u0", "ferry", top_k=5)
            # Past the cap the recall borrows an idle worker, or reads itself: the same answer.
            assert [h.summary.session_id for h in hits] == [f"trip-{tenant}"]
        workers = [t for t in threading.enumerate() if t.name == WORKER and t not in before]
        assert 1 <= len(workers) <= 3
        # Every place is taken: no tenant past the third started a worker.
        assert not cap.acquire(blocking=False)
    assert [t for t in threading.enumerate() if t.name == WORKER and t not in before] == []
    for _ in range(3):  # each worker gave its place back when it ended
        assert cap.acquire(blocking=False)
