"""Hybrid recall over summaries + transcripts, chunk vectors, background indexing and reindex.

Real parts only: every KV backend, a real embedded Chroma, the real MiniLM model.
"""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tiers import keys
from tiers.backends.base import Delete, KVStore, Put, VectorItem
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.errors import BackendUnavailableError, SessionNotFoundError
from tiers.models import Message
from tiers.session import ReindexProgress, SessionSummary, SessionTier, session_windows


@pytest.fixture
def tier(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> SessionTier:
    return SessionTier(kv, index, embedder)


def at(day: int) -> datetime:
    return datetime(2025, 1, 1, 9, 0, tzinfo=UTC) + timedelta(days=day)


def dialogue(*lines: str) -> list[Message]:
    """Alternating user / assistant turns."""
    return [
        Message(role="user" if n % 2 == 0 else "assistant", content=line)
        for n, line in enumerate(lines)
    ]


FILLER = (
    "We went through the measurements again and compared the quotes line by line. "
    "The cabinets, the worktop and the tiling all came in close to the estimate, and "
    "the delivery window for the appliances is still about three weeks. "
)

KITCHEN = dialogue(
    "I want to remodel the kitchen this spring and keep it under budget.",
    "Good plan. Let's start with the layout and the quotes you collected. " + FILLER * 4,
    "The island stays, but we move the sink under the window. " + FILLER * 3,
    "One more thing: the plumber, Ignatius Vorhees, said the permit takes six weeks.",
    "Then we should file the permit application first thing next week.",
)
KITCHEN_SUMMARY = SessionSummary(
    session_id="kitchen",
    user_id="alice",
    task_description="Plan the spring kitchen remodel within budget",
    decisions_made=["Keep the island", "Move the sink under the window"],
    next_recommended_steps=["File the permit application next week"],
    created_at=at(10),
)

RETREAT = dialogue(
    "Can you help me organise the team event for the third quarter?",
    "Sure. How many people are coming and what is the budget?",
    "Twelve people. We booked a wooden cabin by the lake in the mountains for two nights.",
    "Lovely. I will draft an agenda with hiking in the morning and workshops after lunch.",
)
RETREAT_SUMMARY = SessionSummary(
    session_id="retreat",
    user_id="alice",
    task_description="Organise the Q3 team event",
    decisions_made=["Twelve attendees"],
    next_recommended_steps=["Draft the agenda"],
    created_at=at(20),
)

TAXES = dialogue(
    "I need to prepare the quarterly VAT return before the deadline.",
    "Let's reconcile the supplier invoices against the bank statements first.",
    "Done. Two invoices use the reverse-charge rule.",
    "Then ask the accountant how to book those before filing.",
)
TAXES_SUMMARY = SessionSummary(
    session_id="taxes",
    user_id="alice",
    task_description="Prepare the quarterly VAT return",
    work_completed=["Reconciled supplier invoices against bank statements"],
    next_recommended_steps=["Ask the accountant about reverse-charge invoices"],
    created_at=at(30),
)

ALL = [(KITCHEN_SUMMARY, KITCHEN), (RETREAT_SUMMARY, RETREAT), (TAXES_SUMMARY, TAXES)]


def store_all(tier: SessionTier, user: str = "alice") -> None:
    for summary, transcript in ALL:
        tier.save_transcript(user, summary.session_id, transcript)
    tier.save_sessions(s.model_copy(update={"user_id": user}) for s, _ in ALL)


def session_vector_ids(index: ChromaVectorIndex, user: str, session: str) -> set[str]:
    return set(index.ids(where={"tenant": "default", "user_id": user, "session_id": session}))


def expected_ids(user: str, summary: SessionSummary, transcript: list[Message] | None) -> set[str]:
    n = len(session_windows(summary, transcript))
    base = keys.session_vector_id("default", user, summary.session_id)
    return {base} | {f"{base}#{i}" for i in range(1, n)}


def test_a_name_only_in_the_transcript_is_found_by_keyword(tier: SessionTier) -> None:
    store_all(tier)
    # A decoy that means "what did someone say to me" without sharing a word with the query.
    tier.save_transcript(
        "alice",
        "advice",
        dialogue(
            "Can you remind me what my financial advisor said about the pension?",
            "She said to raise the monthly contributions and review them every year.",
        ),
    )
    tier.save_session(
        SessionSummary(
            session_id="advice",
            user_id="alice",
            task_description="Notes on what the financial advisor said about the pension",
            created_at=at(5),
        )
    )
    assert "Vorhees" not in KITCHEN_SUMMARY.render()
    # The name sits far past the first few hundred words of the transcript.
    assert sum(len(m.content.split()) for m in KITCHEN[:3]) > 300
    hits = tier.recall_relevant("alice", "What did Ignatius Vorhees tell me?", top_k=4)
    assert [h.summary.session_id for h in hits[:2]] == ["kitchen", "advice"]
    assert hits[0].keyword == 1.0
    assert all(h.keyword == 0.0 for h in hits[1:])
    # By meaning alone the decoy would have won: the keyword match made the difference.
    assert hits[1].similarity is not None
    assert hits[0].similarity is not None
    assert hits[1].similarity > hits[0].similarity


def test_a_paraphrase_of_transcript_content_is_found_by_meaning(
    tier: SessionTier, embedder: MiniLMEmbedder
) -> None:
    store_all(tier)
    # No word in common with any session: only the transcript window's meaning can match.
    hits = tier.recall_relevant("alice", "accommodation for the staff getaway", top_k=3)
    assert all(h.keyword == 0.0 for h in hits)
    assert hits[0].summary.session_id == "retreat"
    assert hits[0].similarity is not None
    assert hits[0].similarity > max(h.similarity or -1.0 for h in hits[1:])
    # The match is a transcript window: the summary's own vector is much less similar.
    query, summary = embedder.embed(
        ["accommodation for the staff getaway", session_windows(RETREAT_SUMMARY, None)[0]]
    )
    assert sum(q * v for q, v in zip(query, summary, strict=True)) < hits[0].similarity - 0.05
    hits = tier.recall_relevant("alice", "sales tax paperwork", top_k=3)
    assert hits[0].summary.session_id == "taxes"


def test_recency_breaks_a_tie_between_equal_sessions(tier: SessionTier) -> None:
    twin = RETREAT_SUMMARY.model_copy(update={"session_id": "twin-old", "created_at": at(1)})
    newer = RETREAT_SUMMARY.model_copy(update={"session_id": "twin-new", "created_at": at(2)})
    # Saved newest first, and with ids that sort the other way: only recency can order them.
    for summary in (newer, twin):
        tier.save_transcript("alice", summary.session_id, RETREAT)
        tier.save_session(summary)
    hits = tier.recall_relevant("alice", "cabin by the lake", top_k=2)
    assert [h.summary.session_id for h in hits] == ["twin-new", "twin-old"]
    assert hits[0].similarity == pytest.approx(hits[1].similarity, abs=1e-5)
    assert hits[0].keyword == hits[1].keyword
    assert hits[0].score > hits[1].score


def test_transcript_is_stored_before_and_without_a_summary(
    tier: SessionTier, index: ChromaVectorIndex
) -> None:
    header = tier.save_transcript("alice", "kitchen", KITCHEN, created_at=at(10))
    assert header.messages == len(KITCHEN)
    assert tier.transcript_header("alice", "kitchen") == header
    assert header.created_at == KITCHEN_SUMMARY.created_at  # for summarizing it later
    # Summarizing never happened (or failed): the transcript is safe and findable for a retry.
    assert tier.get_transcript("alice", "kitchen") == KITCHEN
    assert tier.unsummarized_sessions("alice") == ["kitchen"]
    assert tier.recall_relevant("alice", "Ignatius Vorhees") == []
    assert session_vector_ids(index, "alice", "kitchen") == set()
    with pytest.raises(SessionNotFoundError):
        tier.get_session("alice", "kitchen")
    tier.save_session(KITCHEN_SUMMARY)
    assert tier.unsummarized_sessions("alice") == []
    assert session_vector_ids(index, "alice", "kitchen") == expected_ids(
        "alice", KITCHEN_SUMMARY, KITCHEN
    )
    (hit,) = tier.recall_relevant("alice", "Ignatius Vorhees", top_k=1)
    assert hit.summary == KITCHEN_SUMMARY
    with pytest.raises(SessionNotFoundError, match="transcript"):
        tier.get_transcript("alice", "retreat")


def test_window_vectors_follow_the_transcript_and_go_with_the_session(
    tier: SessionTier, kv: KVStore, index: ChromaVectorIndex
) -> None:
    store_all(tier)
    long_ids = expected_ids("alice", KITCHEN_SUMMARY, KITCHEN)
    assert len(long_ids) >= 5
    assert session_vector_ids(index, "alice", "kitchen") == long_ids
    counts = keys.session_vectors_space("default", "alice")
    assert kv.get_many(counts, ["kitchen"]) == [str(len(long_ids) - 1).encode()]
    # A shorter transcript replaces the longer one: the summary described the old one, so it
    # is stale (gone, the session pending) until the session is summarized again.
    tier.save_transcript("alice", "kitchen", KITCHEN[:2])
    assert tier.unsummarized_sessions("alice") == ["kitchen"]
    assert session_vector_ids(index, "alice", "kitchen") == set()
    recalled = tier.recall_relevant("alice", "kitchen renovation Ignatius Vorhees", top_k=5)
    assert "kitchen" not in {hit.summary.session_id for hit in recalled}
    tier.save_session(KITCHEN_SUMMARY)
    # The surplus windows went with it; the new transcript's are indexed.
    short_ids = expected_ids("alice", KITCHEN_SUMMARY, KITCHEN[:2])
    assert session_vector_ids(index, "alice", "kitchen") == short_ids
    assert kv.get_many(counts, ["kitchen"]) == [str(len(short_ids) - 1).encode()]
    assert tier.recall_relevant("alice", "Ignatius Vorhees", top_k=1)[0].keyword == 0.0
    # Deleting the session takes every vector and the transcript with it.
    assert tier.delete_session("alice", "kitchen") is True
    assert session_vector_ids(index, "alice", "kitchen") == set()
    assert kv.get_many(counts, ["kitchen"]) == [None]
    with pytest.raises(SessionNotFoundError):
        tier.get_transcript("alice", "kitchen")
    assert kv.scan(keys.transcripts_space("default", "alice"), prefix="kitchen") == []
    # And deleting the user leaves nothing of theirs anywhere.
    assert tier.delete_user_sessions("alice") == 2
    assert index.ids(where={"tenant": "default", "user_id": "alice"}) == []
    assert kv.scan(keys.transcripts_space("default", "alice")) == []
    assert kv.scan(counts) == []
    assert kv.scan(keys.session_outbox_space("default")) == []


def test_a_different_summary_replaces_the_session_and_takes_its_transcript(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> None:
    removed: list[tuple[str, str]] = []
    tier = SessionTier(
        kv, index, embedder, on_transcript_removed=lambda u, s: removed.append((u, s))
    )
    tier.save_transcript("alice", "kitchen", KITCHEN)
    tier.save_session(KITCHEN_SUMMARY)  # completes the pending session: the transcript stays
    tier.save_session(KITCHEN_SUMMARY)  # the very same summary again replaces nothing
    assert tier.get_transcript("alice", "kitchen") == KITCHEN
    assert tier.recall_relevant("alice", "Ignatius Vorhees", top_k=1)[0].keyword > 0
    assert removed == []

    newer = KITCHEN_SUMMARY.model_copy(update={"task_description": "Choose the bathroom tiles"})
    tier.save_sessions([newer])
    assert removed == [("alice", "kitchen")]
    # Nothing of the replaced transcript is left: not stored, not pending, not recalled.
    assert kv.scan(keys.transcripts_space("default", "alice")) == []
    with pytest.raises(SessionNotFoundError):
        tier.get_transcript("alice", "kitchen")
    assert tier.unsummarized_sessions("alice") == []
    (hit,) = tier.recall_relevant("alice", "Ignatius Vorhees", top_k=1)
    assert (hit.summary, hit.keyword) == (newer, 0.0)
    assert session_vector_ids(index, "alice", "kitchen") == expected_ids("alice", newer, None)

    # A transcript replaced or deleted is reported too; the same one saved again is not.
    header = tier.save_transcript("alice", "retreat", RETREAT, created_at=at(20))
    tier.save_transcript("alice", "retreat", RETREAT, created_at=header.created_at)
    assert removed == [("alice", "kitchen")]
    tier.save_transcript("alice", "retreat", RETREAT[:2], created_at=at(20))
    tier.delete_session("alice", "retreat")
    assert removed == [("alice", "kitchen"), ("alice", "retreat"), ("alice", "retreat")]


def test_users_and_tenants_stay_isolated_with_transcripts(
    tier: SessionTier, kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder
) -> None:
    store_all(tier, "alice")
    bob_kitchen = KITCHEN_SUMMARY.model_copy(update={"user_id": "bob"})
    tier.save_transcript("bob", "kitchen", KITCHEN)
    tier.save_session(bob_kitchen)
    secret = [Message(role="user", content="My locker code is Quetzalcoatl-4471.")]
    tier.save_transcript("bob", "locker", secret)
    tier.save_session(SessionSummary(session_id="locker", user_id="bob", task_description="x"))
    hits = tier.recall_relevant("alice", "Quetzalcoatl-4471 locker code", top_k=10)
    assert {h.summary.user_id for h in hits} == {"alice"}
    assert all(h.keyword == 0.0 for h in hits)
    assert tier.recall_relevant("bob", "Quetzalcoatl-4471", top_k=1)[0].summary.session_id == (
        "locker"
    )
    acme = SessionTier(kv, index, embedder, tenant="acme")
    assert acme.recall_relevant("bob", "Quetzalcoatl-4471") == []
    with pytest.raises(SessionNotFoundError):
        acme.get_transcript("bob", "locker")
    assert acme.unsummarized_sessions("bob") == []


def test_another_instance_sees_changes_made_through_a_different_one(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> None:
    first = SessionTier(kv, index, embedder)
    second = SessionTier(kv, index, embedder)  # as another process would
    first.save_session(TAXES_SUMMARY)
    assert [h.summary.session_id for h in first.recall_relevant("alice", "cabin lake")] == ["taxes"]
    assert first.list_sessions("alice", limit=1) == [TAXES_SUMMARY]  # cached now
    later = RETREAT_SUMMARY.model_copy(update={"created_at": at(40)})
    second.save_transcript("alice", "retreat", RETREAT)
    second.save_session(later)
    assert first.list_sessions("alice", limit=1) == [later]
    assert first.recall_relevant("alice", "cabin by the lake")[0].summary == later
    second.delete_session("alice", "retreat")
    assert [s.session_id for s in first.list_sessions("alice", limit=5)] == ["taxes"]
    assert [h.summary.session_id for h in first.recall_relevant("alice", "cabin")] == ["taxes"]


def test_an_outage_during_a_save_with_a_transcript_is_repaired(
    kv: KVStore, tmp_path: Path, embedder: MiniLMEmbedder, no_network: None
) -> None:
    path = tmp_path / "chroma-outage"
    down = ChromaVectorIndex(path, embedder=embedder)
    tier = SessionTier(kv, down, embedder)
    down.close()
    tier.save_transcript("alice", "kitchen", KITCHEN)
    tier.save_session(KITCHEN_SUMMARY)  # acknowledged: the KV store has it
    with pytest.raises(BackendUnavailableError):
        tier.recall_relevant("alice", "Vorhees")
    back = ChromaVectorIndex(path, embedder=embedder)
    try:
        recovered = SessionTier(kv, back, embedder)
        assert session_vector_ids(back, "alice", "kitchen") == expected_ids(
            "alice", KITCHEN_SUMMARY, KITCHEN
        )
        assert kv.scan(keys.session_outbox_space("default")) == []
        assert recovered.recall_relevant("alice", "Vorhees")[0].summary == KITCHEN_SUMMARY
    finally:
        back.close()


def test_background_indexing_batches_and_recall_reads_its_own_writes(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> None:
    tier = SessionTier(kv, index, embedder, background=True)
    try:
        summaries = [
            SessionSummary(
                session_id=f"s{n}",
                user_id=f"u{n % 3}",
                task_description=f"session number {n} about topic {n % 5}",
                created_at=at(n),
            )
            for n in range(30)
        ]

        def writer(offset: int) -> None:
            for summary in summaries[offset::3]:
                tier.save_session(summary)

        threads = [threading.Thread(target=writer, args=(n,)) for n in range(3)]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        # No flush: recall finishes the user's queued work itself.
        last = tier.save_session(
            SessionSummary(session_id="fresh", user_id="u0", task_description="Zanzibar ferry")
        )
        assert tier.recall_relevant("u0", "Zanzibar ferry", top_k=1)[0].summary == last
        assert tier.flush(timeout=120)
        assert kv.scan(keys.session_outbox_space("default")) == []
        for user in ("u0", "u1", "u2"):
            stored = {s.session_id for s in tier.list_sessions(user)}
            ids = set(index.ids(where={"tenant": "default", "user_id": user}))
            assert ids == {keys.session_vector_id("default", user, sid) for sid in stored}
    finally:
        tier.close()
    tier.close()  # idempotent


def test_reindex_rebuilds_a_damaged_index_with_progress(
    tier: SessionTier, kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder
) -> None:
    store_all(tier, "alice")
    store_all(tier, "bob")
    kitchen = expected_ids("alice", KITCHEN_SUMMARY, KITCHEN)
    # Damage: lost window vectors, a stray vector of a session that no longer exists.
    index.delete(sorted(kitchen)[1:3])
    (vector,) = embedder.embed(["stray"])
    index.upsert(
        [
            VectorItem(
                keys.session_vector_id("default", "alice", "gone") + "#3",
                vector,
                "",
                {"tenant": "default", "user_id": "alice", "session_id": "gone"},
            )
        ]
    )
    seen: list[ReindexProgress] = []
    assert tier.reindex(progress=seen.append, batch_size=2) == 6
    assert [p.done for p in seen] == [2, 3, 5, 6]
    assert {p.total for p in seen} == {6}
    for user in ("alice", "bob"):
        want: set[str] = set()
        for summary, transcript in ALL:
            want |= expected_ids(user, summary, transcript)
        assert set(index.ids(where={"tenant": "default", "user_id": user})) == want
    assert tier.reindex(["bob"]) == 3


def test_listing_the_newest_reads_records_not_the_cache(tier: SessionTier, kv: KVStore) -> None:
    tier.save_sessions([KITCHEN_SUMMARY, RETREAT_SUMMARY, TAXES_SUMMARY])
    assert tier.list_sessions("alice", limit=2) == [TAXES_SUMMARY, RETREAT_SUMMARY]
    # Changed around the tier (no revision change): the listing still reflects the records.
    space = keys.sessions_space("default", "alice")
    renamed = TAXES_SUMMARY.model_copy(update={"task_description": "Renamed"})
    kv.commit([Put(space, "taxes", renamed.model_dump_json().encode())])
    assert tier.list_sessions("alice", limit=1) == [renamed]
    kv.commit([Delete(space, "taxes")])
    assert tier.list_sessions("alice", limit=1) == [RETREAT_SUMMARY]
    assert tier.list_sessions("alice", limit=0) == []
