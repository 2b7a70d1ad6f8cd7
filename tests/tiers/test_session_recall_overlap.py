"""A cold recall reads its view while the query is embedded (issue 19 item 2, ``_ViewReads``).

No timing is asserted: the query's embedding waits (with a generous timeout)
until the view's vectors were read by the helper thread, which only happens if
the two overlap. Real parts: SQLite, embedded Chroma, the MiniLM model; the
model and the index are only wrapped to observe and order calls.
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
    waiting = WaitingEmbedder(embedder)
    tier = saved_tier(sqlite_kv, index, waiting)
    threads = spy_on_reads(monkeypatch, index, waiting)
    hits = tier.recall_relevant("u", QUERY, top_k=2)
    assert waiting.waited_for_reads == [True]
    assert threads == [HELPER]
    assert [hit.summary.session_id for hit in hits] == ["s1", "s2"]
    assert hits[0].similarity is not None
    assert hits[0].keyword == 1.0
    # Warm: nothing left to read, no helper; the same answer.
    again = tier.recall_relevant("u", QUERY, top_k=2)
    assert threads == [HELPER]
    assert again == hits
    assert not any(thread.name == HELPER for thread in threading.enumerate())


def test_an_error_of_the_view_reads_is_raised_by_the_recall(
    sqlite_kv: SqliteKVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    waiting = WaitingEmbedder(embedder)
    waiting.vectors_read.set()
    tier = saved_tier(sqlite_kv, index, waiting)

    def unavailable(ids: Sequence[str]) -> tuple[list[str], npt.NDArray[np.float32]]:
        raise BackendUnavailableError("chroma is down")

    monkeypatch.setattr(index, "get_embeddings", unavailable)
    with pytest.raises(BackendUnavailableError, match="chroma is down"):
        tier.recall_relevant("u", QUERY, top_k=2)
    assert not any(thread.name == HELPER for thread in threading.enumerate())
    monkeypatch.undo()
    # The failed reads left nothing half-built: the next recall reads and answers.
    hits = tier.recall_relevant("u", QUERY, top_k=2)
    assert [hit.summary.session_id for hit in hits] == ["s1", "s2"]


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
    assert not any(thread.name == HELPER for thread in threading.enumerate())
