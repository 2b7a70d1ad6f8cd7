"""The transcript-windows pass gives way to queries (issue 19 item 2, :mod:`tiers.session._windows`).

The bound, in model calls rather than seconds (the suite asserts no wall-clock
times): while a recall is in flight, the second index pass starts no model call;
a recall that arrives while one is running shares the cores with that one call
only, of at most ``WINDOW_CHUNK`` windows; first-pass work (making new sessions
searchable) goes before the rest of a session's windows. The per-user and
per-tenant bounds of the first pass are in ``test_session_fairness.py``.

Real parts: every KV backend, embedded Chroma, the real MiniLM model; the model
is wrapped only to record which texts each call embedded and to hold a query or
the index worker at a gate, which makes the interleaving deterministic.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta

import numpy as np

from tests.waiting import wait_until
from tiers import keys
from tiers.backends.base import KVStore
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.models import Message
from tiers.session import SessionSummary, SessionTier
from tiers.session._windows import HOLD_MAX, WINDOW_CHUNK, QueryGate, background_lane

WORKER = "tiermem-session-index-default"
MARK = "alicewindow"  # in every transcript window of alice's session, in no other text
QUERY = "ferry to Zanzibar"


class HeldEmbedder:
    """The real model; records every call, and can hold a query or the index worker at a gate."""

    def __init__(self, inner: MiniLMEmbedder, *, hold_worker: bool = False) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.query_gate = threading.Event()  # a call embedding QUERY (not the worker's) waits
        self.query_waiting = threading.Event()
        self.worker_gate = threading.Event()  # the worker's first call with MARK waits
        self.worker_waiting = threading.Event()
        if not hold_worker:
            self.worker_gate.set()
        self.calls: list[tuple[str, list[str]]] = []  # (thread name, texts), in call order
        self._lock = threading.Lock()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        thread = threading.current_thread().name
        if thread != WORKER and QUERY in texts and not self.query_gate.is_set():
            self.query_waiting.set()
            assert self.query_gate.wait(timeout=300), "the test never let the query go"
        marked = any(MARK in text for text in texts)
        if thread == WORKER and marked and not self.worker_gate.is_set():
            self.worker_waiting.set()
            assert self.worker_gate.wait(timeout=300), "the test never let the worker go"
        with self._lock:
            self.calls.append((thread, list(texts)))
        return self.inner.embed(texts)

    def marked(self) -> list[list[str]]:
        """The marked texts of each call that embedded any, in call order."""
        with self._lock:
            return [
                [text for text in texts if MARK in text]
                for _, texts in self.calls
                if any(MARK in text for text in texts)
            ]

    def position(self, text: str) -> int:
        """Index of the first call that embedded ``text``."""
        with self._lock:
            return next(n for n, (_, texts) in enumerate(self.calls) if text in texts)


def wait_for_worker(condition: Callable[[], bool]) -> None:
    """Wait (generously) for something the worker does by itself."""
    wait_until(condition, 300, what="the index worker to get there", every_s=0.01)


def at(n: int) -> datetime:
    return datetime(2025, 3, 1, tzinfo=UTC) + timedelta(hours=n)


def summary(user: str, n: int, text: str) -> SessionSummary:
    return SessionSummary(
        session_id=f"s{n:03d}", user_id=user, task_description=text, created_at=at(n)
    )


def long_transcript() -> list[Message]:
    """About 800 words, the marker every 10: eight windows, each holding the marker."""
    words = f"{MARK} the quarterly numbers for the northern region look better than"
    return [Message(role="user", content=" ".join([words] * 8)) for _ in range(10)]


def save_alice(tier: SessionTier, n: int = 0) -> None:
    tier.save_transcript("alice", f"s{n:03d}", long_transcript())
    tier.save_session(summary("alice", n, f"alice topic {n}"))


def recall_in_thread(tier: SessionTier, found: list[str]) -> threading.Thread:
    thread = threading.Thread(
        target=lambda: found.extend(
            hit.summary.session_id for hit in tier.recall_relevant("bob", QUERY, top_k=1)
        )
    )
    thread.start()
    return thread


def test_a_query_in_flight_holds_back_the_windows_pass(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> None:
    held = HeldEmbedder(embedder)
    tier = SessionTier(kv, index, held, background=True)
    found: list[str] = []
    recall: threading.Thread | None = None
    try:
        tier.save_session(summary("bob", 0, "Zanzibar ferry timetable"))
        assert tier.flush(timeout=300)
        recall = recall_in_thread(tier, found)
        assert held.query_waiting.wait(timeout=300)  # bob's recall is in flight, held
        save_alice(tier)
        # The first pass is not held back: alice's session becomes searchable meanwhile.
        assert tier.flush(timeout=300, windows=False)
        indexer = tier._store.indexer
        wait_for_worker(lambda: indexer.windows_held >= 1)
        assert held.marked() == []  # not one window while the query is in flight
        assert not tier.flush(timeout=0)  # and the windows are still to do
        held.query_gate.set()
        recall.join(timeout=300)
        assert found == ["s000"]
        assert tier.flush(timeout=300)
        assert sum(len(texts) for texts in held.marked()) == 8
        assert held.position(QUERY) < held.position(held.marked()[0][0])
        assert kv.scan(keys.session_windows_outbox_space("default")) == []
    finally:
        held.query_gate.set()
        if recall is not None:
            recall.join(timeout=300)
        tier.close()


def test_a_query_arriving_mid_session_shares_the_cores_with_one_model_call_at_most(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> None:
    held = HeldEmbedder(embedder, hold_worker=True)
    tier = SessionTier(kv, index, held, background=True)
    found: list[str] = []
    recall: threading.Thread | None = None
    try:
        tier.save_session(summary("bob", 0, "Zanzibar ferry timetable"))
        save_alice(tier)
        assert tier.flush(timeout=300, windows=False)
        assert held.worker_waiting.wait(timeout=300)  # held in its first call of windows
        indexer = tier._store.indexer
        holds = indexer.windows_held
        recall = recall_in_thread(tier, found)
        assert held.query_waiting.wait(timeout=300)  # the query is in flight
        held.worker_gate.set()  # the call in flight finishes; the next one waits for the query
        wait_for_worker(lambda: indexer.windows_held > holds)
        assert [len(texts) for texts in held.marked()] == [WINDOW_CHUNK]
        held.query_gate.set()
        recall.join(timeout=300)
        assert found == ["s000"]
        assert tier.flush(timeout=300)
        marked = held.marked()
        assert all(len(texts) <= WINDOW_CHUNK for texts in marked)
        assert sum(len(texts) for texts in marked) == 8
        ids = index.ids(where={"tenant": "default", "user_id": "alice"})
        assert keys.session_chunk_vector_id("default", "alice", "s000", 8) in ids
    finally:
        held.worker_gate.set()
        held.query_gate.set()
        if recall is not None:
            recall.join(timeout=300)
        tier.close()


def test_new_sessions_become_searchable_before_the_rest_of_a_sessions_windows(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> None:
    held = HeldEmbedder(embedder, hold_worker=True)
    tier = SessionTier(kv, index, held, background=True)
    try:
        save_alice(tier)
        assert tier.flush(timeout=300, windows=False)
        assert held.worker_waiting.wait(timeout=300)  # held in its first call of windows
        tier.save_session(summary("bob", 0, "Zanzibar ferry timetable"))
        held.worker_gate.set()
        assert tier.flush(timeout=300)
        marked = held.marked()
        # One call of alice's windows, then bob's session, then the rest of alice's windows.
        assert held.position(marked[0][0]) < held.position("Zanzibar ferry timetable")
        assert held.position("Zanzibar ferry timetable") < held.position(marked[1][0])
        assert sum(len(texts) for texts in marked) == 8  # nothing embedded twice
        held.query_gate.set()  # this test holds no query
        hits = tier.recall_relevant("bob", QUERY, top_k=1)
        assert [hit.summary.session_id for hit in hits] == ["s000"]
    finally:
        held.worker_gate.set()
        tier.close()


def test_the_gate_holds_background_work_only_while_queries_need_the_cores() -> None:
    gate = QueryGate()
    assert gate.hold(held_for=0.0) == 0.0  # no query yet: go
    with gate.query():
        assert gate.in_flight == 1
        assert gate.hold(held_for=0.0) > 0.0
        assert gate.hold(held_for=10 * HOLD_MAX) > 0.0  # never while one is in flight
    assert gate.in_flight == 0
    # Held back long enough, the quiet time after a query is waived.
    assert gate.hold(held_for=HOLD_MAX) == 0.0


def test_background_work_embeds_on_one_thread_with_the_same_vectors(
    embedder: MiniLMEmbedder,
) -> None:
    lane = background_lane(embedder)
    assert isinstance(lane, MiniLMEmbedder)
    assert lane is not embedder
    assert lane.intra_op_threads == 1
    assert embedder.for_background() is lane  # made once
    assert lane.for_background() is lane
    texts = ["the quarterly numbers look better", "a ferry timetable for Zanzibar"]
    np.testing.assert_allclose(lane.embed(texts), embedder.embed(texts), atol=1e-5)
    plain = HeldEmbedder(embedder)  # an embedder without a background lane runs it itself
    assert background_lane(plain) is plain
