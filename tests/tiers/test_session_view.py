"""The per-user view's incremental rebuild: unchanged sessions are taken over, deletes are exact."""

from __future__ import annotations

import threading
from collections.abc import Callable, Sequence
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

from tests.kv_spies import PassThroughKV
from tests.tiers.spy_embedders import CountingEmbedder
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.models import Message
from tiers.session import SessionSummary, SessionTier


def _save(tier: SessionTier, session_id: str, words: str, day: int) -> None:
    created = datetime(2025, 3, 1, tzinfo=UTC) + timedelta(days=day)
    tier.save_transcript("ann", session_id, [Message(role="user", content=words)])
    tier.save_session(
        SessionSummary(
            session_id=session_id,
            user_id="ann",
            task_description=f"Talk about {words}",
            created_at=created,
        )
    )


def test_a_save_reuses_unchanged_term_counts_and_a_delete_is_never_recalled(
    tmp_path: Path, no_network: None
) -> None:
    embedder = MiniLMEmbedder()
    embedder.load()
    index = ChromaVectorIndex(tmp_path / "chroma", embedder=embedder)
    kv = SqliteKVStore(tmp_path / "kv.sqlite3")
    try:
        tier = SessionTier(kv, index, embedder)
        _save(tier, "s1", "the zucchini harvest in the garden", 0)
        _save(tier, "s2", "booking a flight to Lisbon", 1)
        assert tier.recall_relevant("ann", "zucchini", top_k=1)[0].summary.session_id == "s1"
        store = tier._store
        before = store.views.basis("ann")
        assert before is not None

        _save(tier, "s3", "a quokka seen on the trip", 2)
        assert tier.recall_relevant("ann", "quokka", top_k=1)[0].summary.session_id == "s3"
        after = store.views.basis("ann")
        assert after is not None
        assert after is not before
        # Incremental: the unchanged sessions' counts are the very objects counted before.
        assert after._terms["s1"] is before._terms["s1"]
        assert after._terms["s2"] is before._terms["s2"]

        assert tier.delete_session("ann", "s1")
        # What the cache keeps of the user at once holds nothing of the deleted session.
        kept = store.views.basis("ann")
        assert kept is not None
        assert "s1" not in kept.session_ids
        assert "s1" not in kept._terms
        assert not any("zucchini" in text for text in kept.texts)
        hits = tier.recall_relevant("ann", "zucchini harvest garden", top_k=5)
        assert "s1" not in {hit.summary.session_id for hit in hits}
        rebuilt = store.views.basis("ann")
        assert rebuilt is not None
        assert "s1" not in rebuilt._terms
        assert rebuilt._terms["s2"] is before._terms["s2"]  # after a delete: incremental too
    finally:
        tier.close()
        index.close()
        kv.close()


def test_a_deleted_session_leaves_no_vectors_of_its_texts_in_the_embedding_cache(
    tmp_path: Path, no_network: None
) -> None:
    embedder = MiniLMEmbedder()
    embedder.load()
    counting = CountingEmbedder(embedder)
    index = ChromaVectorIndex(tmp_path / "chroma", embedder=embedder)
    kv = SqliteKVStore(tmp_path / "kv.sqlite3")
    try:
        tier = SessionTier(kv, index, counting)
        _save(tier, "s1", "the okapi seen at dawn by the river", 0)
        assert tier.flush(60)
        assert any("okapi" in text for text in counting.texts)
        seen = len(counting.texts)
        # The same transcript again: re-indexed from the cache, not the model.
        tier.save_transcript(
            "ann", "s1", [Message(role="user", content="the okapi seen at dawn by the river")]
        )
        assert tier.flush(60)
        assert not any("okapi seen at dawn" in text for text in counting.texts[seen:])
        before = len(counting.texts)
        assert tier.delete_session("ann", "s1")
        _save(tier, "s2", "the okapi seen at dawn by the river", 0)
        assert tier.flush(60)
        # The deleted session's vectors were not kept: the same texts reach the model again.
        again = counting.texts[before:]
        assert any("okapi seen at dawn" in text for text in again), again
    finally:
        tier.close()
        index.close()
        kv.close()


class _DeletesWhenTheWorkerReads(PassThroughKV):
    """A real store, passed through, that runs ``then`` once right after the index's worker thread
    read transcripts: a delete committed while an index pass is under way (between its reads and
    its model calls)."""

    def __init__(self, inner: SqliteKVStore) -> None:
        super().__init__(inner)
        self.then: Callable[[], None] | None = None

    def _after(self, space: str) -> None:
        then = self.then
        worker = threading.current_thread() is not threading.main_thread()
        if then is not None and worker and space.endswith(":transcripts"):
            self.then = None
            then()

    def get_many(self, space: str, keys: Sequence[str]) -> list[bytes | None]:
        found = super().get_many(space, keys)
        self._after(space)
        return found

    def scan(self, space: str, **options: Any) -> list[tuple[str, bytes]]:
        found = super().scan(space, **options)
        self._after(space)
        return found


def test_a_session_deleted_while_an_index_pass_reads_it_leaves_no_vectors_in_the_cache(
    tmp_path: Path, no_network: None
) -> None:
    # The pass reads the session, the delete forgets the cache, then the pass embeds what it read:
    # those vectors are of deleted texts and must not be kept.
    embedder = MiniLMEmbedder()
    embedder.load()
    spy = CountingEmbedder(embedder)
    index = ChromaVectorIndex(tmp_path / "chroma", embedder=embedder)
    kv = _DeletesWhenTheWorkerReads(SqliteKVStore(tmp_path / "kv.sqlite3"))
    try:
        tier = SessionTier(kv, index, spy, background=True)  # as Memory indexes
        kv.then = lambda: tier.delete_session("ann", "s1")
        _save(tier, "s1", "the wombat dug a burrow under the old fence", 0)
        assert tier.flush(60)
        assert kv.then is None, "the delete did not run"
        first = [text for text in spy.texts if "wombat" in text]
        assert first, "the pass embedded nothing of the session"
        seen = len(spy.texts)
        _save(tier, "s1", "the wombat dug a burrow under the old fence", 0)  # the same again
        assert tier.flush(60)
        # Nothing of the deleted session was kept: its texts reach the model again.
        assert [text for text in first if text not in spy.texts[seen:]] == []
    finally:
        tier.close()
        index.close()
        kv.close()
