"""A session ended again while the second pass is indexing the first transcript's windows.

The brief of a flaky erasure test (tests/memory/test_erasure.py) suspected this interleaving:
the windows of the replaced transcript written after the re-end. They are written (the pass
read its plan before the re-end), but the re-end queued first-pass work, which runs after the
pass (index updates are serialised) and deletes every window the count records. Nothing of the
first transcript is left in the index. (The flake itself was Chroma's file made from freed
heap memory: tests/tiers/test_chroma_files.py.)

Real parts: every KV backend, embedded Chroma, the real MiniLM model, wrapped only to hold the
second pass inside its embedding call until the test has ended the session again.
"""

from __future__ import annotations

from datetime import UTC, datetime

from tests.tiers.spy_embedders import HoldingEmbedder
from tiers import keys
from tiers.backends.base import KVStore
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.index_check import check_index
from tiers.models import Message
from tiers.session import FINGERPRINT_KEY, SessionSummary, SessionTier, session_windows

FIRST = "Quetzal"  # only in the first transcript


def said(topic: str) -> list[Message]:
    return [
        Message(role="user" if n % 2 == 0 else "assistant", content=f"Turn {n}: {topic}. " * 6)
        for n in range(10)
    ]


SUMMARY = SessionSummary(
    session_id="trip",
    user_id="dana",
    task_description="Travel plans",
    created_at=datetime(2025, 4, 1, tzinfo=UTC),
)
WHERE = {"tenant": "default", "user_id": "dana"}


def test_windows_of_a_replaced_transcript_written_mid_pass_are_deleted_by_the_re_end(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> None:
    first = said(f"we watch the {FIRST} birds in the cloud forest near Monteverde")
    second = said("we take the night train to Vienna and visit the opera")
    # A call embedding the first transcript's windows waits.
    held = HoldingEmbedder(
        embedder, lambda texts: sum(FIRST in text for text in texts) > 1, timeout=60
    )
    tier = SessionTier(kv, index, held, background=True)
    try:
        tier.save_transcript("dana", "trip", first)
        tier.save_session(SUMMARY)
        # The second pass has read the first transcript and is embedding its windows.
        assert held.held.wait(300)
        tier.save_transcript("dana", "trip", second)  # ended again: the summary goes with it
        tier.save_session(SUMMARY)
        held.release.set()
        assert tier.flush(timeout=300)
        expected = session_windows(SUMMARY, second)
        assert len(index.ids(where=WHERE)) == len(expected)
        revs = {metadata[FINGERPRINT_KEY] for metadata in index.metadata(where=WHERE).values()}
        assert len(revs) == 1  # every vector made from the second transcript
        report = check_index(kv, index, "default")
        assert report.consistent, report.describe()
        assert (report.vectors, report.windows_pending, report.stale) == (len(expected), 0, 0)
        assert kv.scan(keys.session_windows_outbox_space("default")) == []
    finally:
        held.release.set()
        tier.close()
