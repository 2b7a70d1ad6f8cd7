"""A changed session index layout (what is embedded per session) is found stale and repaired.

Every session vector carries the fingerprint of the records it was made from and of
the layout scheme; vectors written under another scheme must count as stale in the
index check (never silently mixed with current ones) and be rebuilt by the repair.
Real parts: every KV backend, embedded Chroma, the real MiniLM model.
"""

from __future__ import annotations

from datetime import UTC, datetime

import pytest

import tiers.session._index as session_index
from tiers import keys
from tiers.backends.base import KVStore
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.index_check import check_index, queue_repair
from tiers.models import Message
from tiers.session import SessionSummary, SessionTier, session_windows

TRANSCRIPT = [
    Message(
        role="user" if n % 2 == 0 else "assistant",
        content=f"Turn {n} about the greenhouse heater, the seed order and the frost forecast. "
        * 6,
    )
    for n in range(12)
]
SUMMARY = SessionSummary(
    session_id="garden",
    user_id="dora",
    task_description="Prepare the greenhouse for winter",
    created_at=datetime(2025, 10, 1, tzinfo=UTC),
)


def test_vectors_of_another_layout_scheme_are_stale_and_repaired(
    kv: KVStore,
    index: ChromaVectorIndex,
    embedder: MiniLMEmbedder,
    no_network: None,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    tier = SessionTier(kv, index, embedder)
    with monkeypatch.context() as old_layout:
        old_layout.setattr(session_index, "_SCHEME", b"tiermem-session-vectors/an-older-one")
        tier.save_transcript("dora", "garden", TRANSCRIPT)
        tier.save_session(SUMMARY)
    expected = len(session_windows(SUMMARY, TRANSCRIPT))
    where = {"tenant": "default", "user_id": "dora"}
    assert len(index.ids(where=where)) == expected
    report = check_index(kv, index, "default")
    assert report.stale == expected
    assert not report.consistent
    queued = queue_repair(kv, index, report)
    assert queued.sessions == (("dora", "garden"),)
    assert tier.repair() == 1
    after = check_index(kv, index, "default")
    assert after.consistent, after.describe()
    assert len(index.ids(where=where)) == expected
    assert kv.scan(keys.session_outbox_space("default")) == []
    hits = tier.recall_relevant("dora", "frost forecast for the greenhouse", top_k=1)
    assert hits[0].summary.session_id == "garden"
