"""The long-lived workers that read cold recalls' views (issue 19 item 2, ``_ViewWorkers``).

A cold recall hands its view's reads to a worker thread that outlives it: the
next cold recall reuses it (one SQLite reader connection for the worker's life,
instead of one per recall), a recall that finds every worker busy with other
users' reads does its own, and ``close`` (of the tier, or of the Memory holding
it) stops and joins the workers. No timing is asserted. Real parts: SQLite,
embedded Chroma, the MiniLM model; the index is only wrapped to observe and hold reads.
"""

from __future__ import annotations

import gc
import os
import sqlite3
import threading
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt
import pytest

from memory import Memory
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import StoreClosedError
from tiers.session import SessionSummary, SessionTier, _reads
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
