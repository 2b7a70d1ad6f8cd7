"""A cold recall reads its view while the query is embedded (issue 19 item 2, ``_ViewReads``).

No timing is asserted: the query's embedding waits (with a generous timeout)
until the view's vectors were read by the view-reading worker, which only happens if
the two overlap. The worker is long-lived: started by the first cold recall,
reused by the later ones, stopped by ``close`` (more in
``test_session_read_workers.py``). Real parts: SQLite, embedded Chroma, the
MiniLM model; the model and the index are only wrapped to observe and order calls.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt
import pytest

from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import BackendUnavailableError, EmbedderError
from tiers.session import SessionSummary, SessionTier

HELPER = "tiermem-recall-view"
QUERY = "ferry to Zanzibar"


def helpers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == HELPER]


class WaitingEmbedder:
    """The real model; embedding QUERY waits until ``vectors_read`` is set (or the timeout)."""

    def __init__(self, inner: MiniLMEmbedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.vectors_read = threading.Event()
        self.waited_for_reads: list[bool] = []

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if QUERY in texts:
            self.waited_for_reads.append(self.vectors_read.wait(timeout=120))
        return self.inner.embed(texts)


def spy_on_reads(
    monkeypatch: pytest.MonkeyPatch, index: ChromaVectorIndex, embedder: WaitingEmbedder
) -> list[str]:
    """Record the thread of each vector read; tell ``embedder`` when the helper has read."""
    threads: list[str] = []
    read = index.get_embeddings

    def get_embeddings(ids: Sequence[str]) -> tuple[list[str], npt.NDArray[np.float32]]:
        found = read(ids)
        threads.append(threading.current_thread().name)
        if threading.current_thread().name == HELPER:
            embedder.vectors_read.set()
        return found

    monkeypatch.setattr(index, "get_embeddings", get_embeddings)
    return threads


def saved_tier(
    sqlite_kv: SqliteKVStore, index: ChromaVectorIndex, embedder: WaitingEmbedder
) -> SessionTier:
    tier = SessionTier(sqlite_kv, index, embedder)
    tier.save_session(
        SessionSummary(session_id="s1", user_id="u", task_description=f"the {QUERY} leaves at noon")
    )
    tier.save_session(SessionSummary(session_id="s2", user_id="u", task_description="tax forms"))
    return tier


def test_a_cold_recall_reads_its_view_while_the_query_is_embedded(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = helpers()
    waiting = WaitingEmbedder(embedder)
    tier = saved_tier(sqlite_kv, index, waiting)
    threads = spy_on_reads(monkeypatch, index, waiting)
    hits = tier.recall_relevant("u", QUERY, top_k=2)
    assert waiting.waited_for_reads == [True]
    assert threads == [HELPER]
    assert [hit.summary.session_id for hit in hits] == ["s1", "s2"]
    assert hits[0].similarity is not None
    assert hits[0].keyword == 1.0
    # One long-lived worker read it, and waits for the next cold recall.
    (worker,) = [thread for thread in helpers() if thread not in before]
    # Warm: nothing left to read, no work for the worker; the same answer.
    again = tier.recall_relevant("u", QUERY, top_k=2)
    assert threads == [HELPER]
    assert again == hits
    assert [thread for thread in helpers() if thread not in before] == [worker]
    tier.close()
    assert not worker.is_alive()


def test_an_error_of_the_view_reads_is_raised_by_the_recall(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = helpers()
    waiting = WaitingEmbedder(embedder)
    waiting.vectors_read.set()
    tier = saved_tier(sqlite_kv, index, waiting)

    def unavailable(ids: Sequence[str]) -> tuple[list[str], npt.NDArray[np.float32]]:
        raise BackendUnavailableError("chroma is down")

    monkeypatch.setattr(index, "get_embeddings", unavailable)
    with pytest.raises(BackendUnavailableError, match="chroma is down"):
        tier.recall_relevant("u", QUERY, top_k=2)
    # The error ended the reads, not the worker.
    (worker,) = [thread for thread in helpers() if thread not in before]
    monkeypatch.undo()
    # The failed reads left nothing half-built: the next recall reads (in the same worker) and answers.
    threads = spy_on_reads(monkeypatch, index, waiting)
    hits = tier.recall_relevant("u", QUERY, top_k=2)
    assert [hit.summary.session_id for hit in hits] == ["s1", "s2"]
    assert threads == [HELPER]
    assert [thread for thread in helpers() if thread not in before] == [worker]
    tier.close()
    assert not worker.is_alive()


class FailingEmbedder(WaitingEmbedder):
    """The real model, but embedding QUERY fails once the view's reads have failed."""

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if QUERY in texts:
            self.waited_for_reads.append(self.vectors_read.wait(timeout=120))
            raise EmbedderError("the model is gone")
        return self.inner.embed(texts)


def test_when_both_fail_the_recall_raises_the_query_embedding_error(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    before = helpers()
    failing = FailingEmbedder(embedder)
    tier = saved_tier(sqlite_kv, index, failing)

    def unavailable(ids: Sequence[str]) -> tuple[list[str], npt.NDArray[np.float32]]:
        failing.vectors_read.set()  # the reads have failed before the embedding does
        raise BackendUnavailableError("chroma is down")

    monkeypatch.setattr(index, "get_embeddings", unavailable)
    # Before the reads ran beside the embedding, the embedding's error was the one raised.
    with pytest.raises(EmbedderError, match="the model is gone"):
        tier.recall_relevant("u", QUERY, top_k=2)
    assert failing.waited_for_reads == [True]
    # Both errors were the recall's; the worker lives on for the next one until close.
    (worker,) = [thread for thread in helpers() if thread not in before]
    tier.close()
    assert not worker.is_alive()
