"""Background indexing: a session is recallable once indexed; one backlog does not delay others.

The bound, in sessions rather than seconds (the suite asserts no wall-clock times):
while another user's bulk backlog is being indexed, a recall waits for at most the
batch the background worker has in flight plus, if its own session was taken into
the next batch, that batch: at most ``1 + WORKER_BATCH`` sessions of the other user
are indexed before the recall embeds its query, however long the backlog. The
second pass (transcript windows, after the sessions are searchable) keeps the
bound: it runs in batches of at most ``WINDOW_BATCH`` sessions, only when no
first-pass work is queued. Another tenant's backlog delays it by none (each
tenant has its own indexer).

Real parts: every KV backend, embedded Chroma, the real MiniLM model; the model is
wrapped only to record which texts each call embedded and to hold the worker at a
gate, which makes the interleaving deterministic.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime, timedelta

from tiers import keys
from tiers.backends.base import KVStore
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.models import Message
from tiers.session import SessionSummary, SessionTier
from tiers.session._index import WINDOW_BATCH, WORKER_BATCH

GATED_WORKER = "tiermem-session-index-default"


class GatedEmbedder:
    """The real model; the default tenant's index worker waits at a gate before its calls.

    With ``only``, before its calls with a text holding ``only``.
    """

    def __init__(self, inner: MiniLMEmbedder, *, only: str = "") -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.only = only  # gate only calls with a text holding this
        self.gate = threading.Event()
        self.worker_waiting = threading.Event()
        self.calls: list[tuple[str, list[str]]] = []  # (thread name, texts), in call order
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        thread = threading.current_thread().name
        gated = any(self.only in text for text in texts)
        if thread == GATED_WORKER and gated and not self.gate.is_set():
            self.worker_waiting.set()
            assert self.gate.wait(timeout=300), "the test never opened the gate"
        with self._lock:
            self.calls.append((thread, list(texts)))
        return self.inner.embed(texts)

    def texts_before(self, marker: str) -> list[str]:
        """Every text embedded before the first call holding ``marker``."""
        with self._lock:
            out: list[str] = []
            for _, texts in self.calls:
                if marker in texts:
                    return out
                out.extend(texts)
        raise AssertionError(f"{marker!r} was never embedded")


def at(n: int) -> datetime:
    return datetime(2025, 3, 1, tzinfo=UTC) + timedelta(hours=n)


def summary(user: str, n: int, text: str) -> SessionSummary:
    return SessionSummary(
        session_id=f"s{n:03d}", user_id=user, task_description=text, created_at=at(n)
    )


def test_a_session_is_recallable_once_its_indexing_finishes(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> None:
    tier = SessionTier(kv, index, embedder, background=True)
    try:
        transcript = [
            Message(role="user", content="Our cat Marzipan needs a vet appointment on Tuesday."),
            Message(role="assistant", content="Booked the clinic on Elm Street at nine."),
        ]
        tier.save_transcript("carol", "s002", transcript)
        tier.save_session(summary("carol", 2, "Pet care errands"))
        assert tier.flush(timeout=300)
        # Indexing finished: nothing queued, every vector in place, recall finds it by meaning.
        assert kv.scan(keys.session_outbox_space("default")) == []
        assert keys.session_chunk_vector_id("default", "carol", "s002", 1) in index.ids(
            where={"tenant": "default", "user_id": "carol"}
        )
        hits = tier.recall_relevant("carol", "animal doctor booking for Marzipan", top_k=1)
        assert hits[0].summary.session_id == "s002"
        assert hits[0].similarity is not None
    finally:
        tier.close()


def test_one_users_backlog_delays_another_users_recall_by_at_most_one_batch(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> None:
    gated = GatedEmbedder(embedder)
    tier = SessionTier(kv, index, gated, background=True)
    backlog = 4 * WORKER_BATCH + 1
    try:
        tier.save_session(summary("alice", 0, "alice topic 0"))
        # The worker took alice's first session and is held in the model call.
        assert gated.worker_waiting.wait(timeout=300)
        for n in range(1, backlog):
            tier.save_session(summary("alice", n, f"alice topic {n}"))
        tier.save_session(summary("bob", 0, "Zanzibar ferry timetable"))
        found: list[str] = []
        recall = threading.Thread(
            target=lambda: found.extend(
                hit.summary.session_id
                for hit in tier.recall_relevant("bob", "ferry to Zanzibar", top_k=1)
            )
        )
        recall.start()
        gated.gate.set()
        recall.join(timeout=300)
        assert not recall.is_alive()
        assert found == ["s000"]
        # Count alice's sessions embedded before bob's recall could embed its query.
        before = gated.texts_before("ferry to Zanzibar")
        alice_indexed = sum(text.startswith("alice topic") for text in before)
        assert "Zanzibar ferry timetable" in before  # bob's own session was indexed first
        assert alice_indexed <= 1 + WORKER_BATCH < backlog
        assert tier.flush(timeout=300)
        assert len(tier.list_sessions("alice")) == backlog
    finally:
        gated.gate.set()
        tier.close()


def test_another_tenants_backlog_does_not_delay_recall(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> None:
    gated = GatedEmbedder(embedder)
    busy = SessionTier(kv, index, gated, background=True)
    other = SessionTier(kv, index, gated, tenant="acme", background=True)
    try:
        busy.save_session(summary("alice", 0, "alice topic 0"))
        assert gated.worker_waiting.wait(timeout=300)
        for n in range(1, 2 * WORKER_BATCH):
            busy.save_session(summary("alice", n, f"alice topic {n}"))
        other.save_session(summary("bob", 0, "Zanzibar ferry timetable"))
        # The default tenant's worker is still held mid-batch: none of its backlog is done.
        hits = other.recall_relevant("bob", "ferry to Zanzibar", top_k=1)
        assert [hit.summary.session_id for hit in hits] == ["s000"]
        assert hits[0].similarity is not None
        assert not gated.gate.is_set()
        assert not any(text.startswith("alice topic") for _, texts in gated.calls for text in texts)
    finally:
        gated.gate.set()
        busy.close()
        other.close()


def test_a_backlog_of_transcript_windows_delays_a_recall_by_at_most_one_batch(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> None:
    gated = GatedEmbedder(embedder, only="alicewindow")
    tier = SessionTier(kv, index, gated, background=True)
    backlog = 3 * WINDOW_BATCH
    try:
        for n in range(backlog):
            transcript = [Message(role="user", content=f"alicewindow {n}: the quarterly numbers")]
            tier.save_transcript("alice", f"s{n:03d}", transcript)
            tier.save_session(summary("alice", n, f"alice topic {n}"))
        # Every session is searchable; the worker is held in its first batch of windows.
        assert tier.flush(timeout=300, windows=False)
        assert gated.worker_waiting.wait(timeout=300)
        tier.save_session(summary("bob", 0, "Zanzibar ferry timetable"))
        found: list[str] = []
        recall = threading.Thread(
            target=lambda: found.extend(
                hit.summary.session_id
                for hit in tier.recall_relevant("bob", "ferry to Zanzibar", top_k=1)
            )
        )
        recall.start()
        gated.gate.set()
        recall.join(timeout=300)
        assert not recall.is_alive()
        assert found == ["s000"]
        before = gated.texts_before("ferry to Zanzibar")
        windows_indexed = sum(text.startswith("user: alicewindow") for text in before)
        assert "Zanzibar ferry timetable" in before
        # The batch in flight, and (if the recall came late) one more: never the backlog.
        assert windows_indexed <= 2 * WINDOW_BATCH < backlog
        assert tier.flush(timeout=300)
        assert kv.scan(keys.session_windows_outbox_space("default")) == []
    finally:
        gated.gate.set()
        tier.close()
