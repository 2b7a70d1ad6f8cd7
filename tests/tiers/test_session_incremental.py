"""Incremental indexing: a session is searchable by its summary first, its windows follow.

Background indexing embeds a session's summary texts in a first pass (recall then
ranks it by the summary vector and by keywords over the whole transcript) and its
transcript windows in a second, lower-priority pass. Between the passes the index
check must not call the session stale, and a crash between them must lose nothing:
the KV store records the pending windows, and the next worker indexes them.

Real parts: every KV backend, embedded Chroma, the real MiniLM model; the model is
wrapped only to fail (as an outage would) on transcript windows while told to.
"""

from __future__ import annotations

import threading
from collections.abc import Sequence
from datetime import UTC, datetime

from tiers import keys
from tiers.backends.base import KVStore
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.errors import BackendUnavailableError
from tiers.index_check import check_index
from tiers.models import Message
from tiers.session import SessionSummary, SessionTier, session_windows

MARKER = "Marzipan"  # only in the transcript: a text holding it is a transcript window


class WindowOutage:
    """The real model, failing on transcript windows while ``down`` (an embedder outage)."""

    def __init__(self, inner: MiniLMEmbedder) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.down = True
        self.refused = threading.Event()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        if self.down and any(MARKER in text for text in texts):
            self.refused.set()
            raise BackendUnavailableError("the embedding model is unavailable")
        return self.inner.embed(texts)


TRANSCRIPT = [
    Message(
        role="user" if n % 2 == 0 else "assistant",
        content=f"Turn {n}: our cat {MARKER} needs the vet on Tuesday, the clinic on Elm Street. "
        * 5,
    )
    for n in range(10)
]
SUMMARY = SessionSummary(
    session_id="pets",
    user_id="carol",
    task_description="Pet care errands",
    created_at=datetime(2025, 3, 1, tzinfo=UTC),
)
WHERE = {"tenant": "default", "user_id": "carol"}


def windows_outbox(kv: KVStore) -> list[str]:
    return [key for key, _ in kv.scan(keys.session_windows_outbox_space("default"))]


def test_a_crash_between_the_passes_leaves_the_windows_to_the_next_worker(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> None:
    texts = session_windows(SUMMARY, TRANSCRIPT)
    assert sum(MARKER in text for text in texts) == len(texts) - 1 > 1
    outage = WindowOutage(embedder)
    first = SessionTier(kv, index, outage, background=True)
    try:
        first.save_transcript("carol", "pets", TRANSCRIPT)
        first.save_session(SUMMARY)
        # Searchable: the summary vector is in, first-pass work is done.
        assert first.flush(timeout=300, windows=False)
        assert kv.scan(keys.session_outbox_space("default")) == []
        assert windows_outbox(kv) == ["carol/pets"]
        assert index.ids(where=WHERE) == [keys.session_vector_id("default", "carol", "pets")]
        hits = first.recall_relevant("carol", "vet clinic visit for the cat", top_k=1)
        assert [hit.summary.session_id for hit in hits] == ["pets"]
        assert hits[0].similarity is not None
        # Not stale while its windows wait: the summary vector is checked, the rest is pending.
        report = check_index(kv, index, "default")
        assert report.consistent, report.describe()
        assert (report.vectors, report.windows_pending, report.pending) == (1, 1, 0)
        # The second pass fails (and is retried): the windows stay pending.
        assert outage.refused.wait(timeout=300)
        assert not first.flush(timeout=0.5)
    finally:
        first.close(timeout=1)  # the "crash": the worker stops with the windows still pending
    assert windows_outbox(kv) == ["carol/pets"]

    second = SessionTier(kv, index, embedder, background=True)
    try:
        assert second.flush(timeout=300)
        assert windows_outbox(kv) == []
        assert len(index.ids(where=WHERE)) == len(texts)
        report = check_index(kv, index, "default")
        assert report.consistent, report.describe()
        assert (report.vectors, report.windows_pending) == (len(texts), 0)
    finally:
        second.close()


def test_foreground_indexing_does_windows_left_by_a_background_worker(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> None:
    outage = WindowOutage(embedder)
    background = SessionTier(kv, index, outage, background=True)
    try:
        background.save_transcript("carol", "pets", TRANSCRIPT)
        background.save_session(SUMMARY)
        assert background.flush(timeout=300, windows=False)
    finally:
        background.close(timeout=1)
    assert windows_outbox(kv) == ["carol/pets"]
    foreground = SessionTier(kv, index, embedder)
    assert foreground.repair() == 0  # no first-pass work was left, only windows
    assert windows_outbox(kv) == []
    assert len(index.ids(where=WHERE)) == len(session_windows(SUMMARY, TRANSCRIPT))
    assert check_index(kv, index, "default").consistent


def test_a_resave_between_the_passes_drops_the_old_windows_at_once(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> None:
    outage = WindowOutage(embedder)
    outage.down = False
    tier = SessionTier(kv, index, outage, background=True)
    try:
        tier.save_transcript("carol", "pets", TRANSCRIPT)
        tier.save_session(SUMMARY)
        assert tier.flush(timeout=300)
        assert len(index.ids(where=WHERE)) == len(session_windows(SUMMARY, TRANSCRIPT))
        # The transcript is replaced: the old windows must not outlive the first pass of that
        # (the outage holds the new windows back, so the state between the passes is seen).
        outage.down = True
        replaced = [Message(role="user", content=f"Only the cage of {MARKER} needs cleaning.")]
        tier.save_transcript("carol", "pets", replaced)
        tier.save_session(SUMMARY)  # storing another transcript removed the summary
        assert tier.flush(timeout=300, windows=False)
        assert index.ids(where=WHERE) == [keys.session_vector_id("default", "carol", "pets")]
        outage.down = False
        assert tier.flush(timeout=300)
        assert windows_outbox(kv) == []
        assert len(index.ids(where=WHERE)) == len(session_windows(SUMMARY, replaced)) == 2
        assert check_index(kv, index, "default").consistent
    finally:
        tier.close()
