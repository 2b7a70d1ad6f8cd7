"""Opening a background-mode session tier loads the vector index ahead of the first recall.

Embedded Chroma reads a collection's HNSW files (and applies the part of its log
not yet persisted there) on the first read after it is opened: 0.3-0.4 s at
100,000 vectors. A tier opened with ``background=True`` (what ``Memory.open``
does) starts that read in a view-reading worker at construction
(``SessionReader.warm``), so the first recall finds the index loaded, or its
reads queue behind the loading on that same worker. No timing is asserted: what
is observed is which thread read the index, and when. Real parts: SQLite,
embedded Chroma, the MiniLM model; the index and embedder are only wrapped to
observe and hold calls.
"""

from __future__ import annotations

import gc
import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from tests.waiting import wait_until
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import BackendUnavailableError
from tiers.session import SessionSummary, SessionTier

WORKER = "tiermem-recall-view"
QUERY = "ferry to Zanzibar"


def new_workers(before: Sequence[threading.Thread]) -> list[threading.Thread]:
    """The live view-reading workers not in ``before`` (other tests' tiers may have theirs)."""
    return [t for t in threading.enumerate() if t.name == WORKER and t not in before]


def save(tier: SessionTier) -> None:
    tier.save_session(
        SessionSummary(session_id="trip", user_id="u0", task_description=f"takes the {QUERY}")
    )
    tier.save_session(SessionSummary(session_id="tax", user_id="u0", task_description="tax"))


def spy_on_reads(
    monkeypatch: pytest.MonkeyPatch, index: ChromaVectorIndex
) -> list[threading.Thread]:
    """Record the thread of each vector read."""
    threads: list[threading.Thread] = []
    read = index.get_embeddings

    def get_embeddings(ids: Sequence[str]) -> tuple[list[str], npt.NDArray[np.float32]]:
        threads.append(threading.current_thread())
        return read(ids)

    monkeypatch.setattr(index, "get_embeddings", get_embeddings)
    return threads


def recalled(tier: SessionTier) -> list[str]:
    return [hit.summary.session_id for hit in tier.recall_relevant("u0", QUERY)]


def test_a_background_tier_loads_the_index_in_a_worker_that_then_serves_recalls(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    save(SessionTier(sqlite_kv, index, embedder))  # stored and indexed before the "open"
    before = threading.enumerate()
    threads = spy_on_reads(monkeypatch, index)
    tier = SessionTier(sqlite_kv, index, embedder, background=True)
    # Nobody recalled: the index is read by a worker of the tier's own.
    wait_until(lambda: len(threads) == 1)
    (worker,) = new_workers(before)
    assert threads == [worker]
    # The first cold recall hands its reads to that worker: no second thread.
    assert recalled(tier) == ["trip", "tax"]
    assert threads == [worker, worker]
    assert new_workers(before) == [worker]
    tier.close()
    assert not worker.is_alive()


def test_a_foreground_tier_starts_no_thread_and_reads_no_index_at_construction(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = threading.enumerate()
    threads = spy_on_reads(monkeypatch, index)
    tier = SessionTier(sqlite_kv, index, embedder)
    assert threads == []
    assert new_workers(before) == []
    tier.close()


def test_a_recall_during_the_loading_queues_behind_it_on_the_same_worker(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    save(SessionTier(sqlite_kv, index, embedder))
    before = threading.enumerate()
    loading, release = threading.Event(), threading.Event()
    threads: list[threading.Thread] = []
    read = index.get_embeddings

    def get_embeddings(ids: Sequence[str]) -> tuple[list[str], npt.NDArray[np.float32]]:
        threads.append(threading.current_thread())
        if len(threads) == 1:  # the loading: held until the recall has handed over its reads
            loading.set()
            release.wait(120)
        return read(ids)

    monkeypatch.setattr(index, "get_embeddings", get_embeddings)
    embedding = threading.Event()
    embed = embedder.embed

    def embed_query(texts: Sequence[str]) -> list[list[float]]:
        embedding.set()  # a recall embeds its query after handing its reads over
        return embed(texts)

    tier = SessionTier(sqlite_kv, index, embedder, background=True)
    assert loading.wait(120)
    monkeypatch.setattr(embedder, "embed", embed_query)
    answers: list[list[str]] = []
    caller = threading.Thread(target=lambda: answers.append(recalled(tier)))
    caller.start()
    try:
        assert embedding.wait(120)
    finally:
        release.set()
    caller.join(120)
    assert answers == [["trip", "tax"]]
    (worker,) = new_workers(before)
    assert threads == [worker, worker]
    tier.close()
    assert new_workers(before) == []


def test_a_failed_loading_leaves_the_tier_working(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    save(SessionTier(sqlite_kv, index, embedder))
    before = threading.enumerate()
    failures: list[threading.Thread] = []
    read = index.get_embeddings

    def get_embeddings(ids: Sequence[str]) -> tuple[list[str], npt.NDArray[np.float32]]:
        if not failures:
            failures.append(threading.current_thread())
            raise BackendUnavailableError("Chroma is down for this read")
        return read(ids)

    monkeypatch.setattr(index, "get_embeddings", get_embeddings)
    tier = SessionTier(sqlite_kv, index, embedder, background=True)
    wait_until(lambda: bool(failures))
    # The worker survived its failed loading and serves the recall.
    assert recalled(tier) == ["trip", "tax"]
    assert new_workers(before) == failures
    tier.close()
    assert new_workers(before) == []


def test_a_tier_dropped_without_close_stops_the_worker_that_loaded_its_index(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = threading.enumerate()
    threads = spy_on_reads(monkeypatch, index)
    tier = SessionTier(sqlite_kv, index, embedder, background=True)
    wait_until(lambda: len(threads) == 1)
    (worker,) = new_workers(before)
    tier._store.indexer.close()  # the index worker is not what this is about
    del tier
    gc.collect()
    worker.join(60)
    assert not worker.is_alive()
