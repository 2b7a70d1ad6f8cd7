"""Stored per-session term counts: written by the index pass, read by a cold view, never outliving their session."""

from __future__ import annotations

import threading
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import orjson
import pytest

from tests.live_objects import holders
from tests.waiting import wait_until
from tiers import keys
from tiers.backends.base import Delete, Put
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.models import Message
from tiers.session import SessionSummary, SessionTier
from tiers.session import _index as index_module
from tiers.session import _plans as plans_module
from tiers.session._keyword import term_counts, tokenize
from tiers.session._plans import Plan
from tiers.session._terms import TERMS_SCHEMA_VERSION, count_terms, read_terms, summary_fields
from tiers.session._transcripts import page_key

USER = "ann"
TERMS = keys.session_terms_space("default", USER)
TRANSCRIPTS = keys.transcripts_space("default", USER)
START = datetime(2025, 3, 1, tzinfo=UTC)


@pytest.fixture
def kv(tmp_path: Path) -> Iterator[SqliteKVStore]:
    store = SqliteKVStore(tmp_path / "kv.sqlite3")
    yield store
    store.close()


@pytest.fixture
def tier(
    kv: SqliteKVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> Iterator[SessionTier]:
    session_tier = SessionTier(kv, index, embedder)
    yield session_tier
    session_tier.close()


def end(tier: SessionTier, session_id: str, said: str, topic: str, day: int) -> None:
    """A session as the facade ends one: its transcript, then its summary."""
    header = tier.save_transcript(
        USER,
        session_id,
        [Message(role="user", content=said), Message(role="assistant", content="Noted.")],
        created_at=START + timedelta(days=day),
    )
    tier.save_session(
        SessionSummary(
            session_id=session_id,
            user_id=USER,
            task_description=f"Talk about {topic}",
            created_at=START + timedelta(days=day),
        ),
        transcript=header,
    )


def fresh(tier: SessionTier, kv: SqliteKVStore, index: ChromaVectorIndex) -> SessionTier:
    """Another tier over the same stores: nothing cached, like a process after a restart."""
    return SessionTier(kv, index, tier._store.embedder)


def keyword_scores(tier: SessionTier, query: str) -> dict[str, float]:
    return {hit.summary.session_id: hit.keyword for hit in tier.recall_relevant(USER, query, 10)}


def test_the_index_pass_stores_each_sessions_term_counts(
    tier: SessionTier, kv: SqliteKVStore
) -> None:
    end(tier, "s1", "We harvested the zucchini and the zucchini flowers.", "the garden", 0)
    end(tier, "s2", "Booking a ferry to Lisbon.", "travel", 1)
    stored = dict(kv.scan(TERMS))
    assert set(stored) == {"s1", "s2"}
    record = orjson.loads(stored["s1"])
    assert record["schema_version"] == TERMS_SCHEMA_VERSION
    summary = kv.get_many(keys.sessions_space("default", USER), ["s1"])[0]
    assert summary is not None
    fields = summary_fields(summary)
    assert fields is not None
    expected = count_terms(fields[0], tier.get_transcript(USER, "s1"))
    assert record["terms"] == expected
    assert record["terms"]["zucchini"] == 2
    assert record["n"] == sum(expected.values())


def test_a_cold_view_reads_the_stored_counts_not_the_transcripts(
    tier: SessionTier, kv: SqliteKVStore, index: ChromaVectorIndex
) -> None:
    end(tier, "s1", "We harvested the zucchini.", "the garden", 0)
    end(tier, "s2", "Booking a ferry to Lisbon.", "travel", 1)
    warm = keyword_scores(tier, "zucchini")
    assert warm["s1"] == 1.0
    # Take the transcript's only page away around the tier (no revision change): a view that
    # read transcripts would now count s1 without it and lose the word only it holds.
    kv.commit([Delete(TRANSCRIPTS, page_key("s1", 0))])
    cold = fresh(tier, kv, index)
    try:
        assert keyword_scores(cold, "zucchini") == warm
    finally:
        cold.close()


@pytest.mark.parametrize(
    "record",
    [
        None,  # stored by a release before the records existed
        b"not json",
        orjson.dumps({"schema_version": TERMS_SCHEMA_VERSION + 1, "terms": {}}),
        orjson.dumps(
            {"schema_version": TERMS_SCHEMA_VERSION, "fingerprint": "0" * 32, "n": 1, "terms": {}}
        ),
    ],
    ids=["missing", "damaged", "newer", "stale"],
)
def test_a_session_without_a_current_record_is_counted_from_its_transcript(
    tier: SessionTier, kv: SqliteKVStore, index: ChromaVectorIndex, record: bytes | None
) -> None:
    end(tier, "s1", "We harvested the zucchini and some kale.", "the garden", 0)
    end(tier, "s2", "Booking a ferry to Lisbon, kale salad on board.", "travel", 1)
    expected = keyword_scores(tier, "zucchini kale ferry")
    kv.commit([Delete(TERMS, "s1") if record is None else Put(TERMS, "s1", record)])
    assert read_terms(kv.get_many(TERMS, ["s1"])[0], "x", where="test") is None
    cold = fresh(tier, kv, index)
    try:
        assert keyword_scores(cold, "zucchini kale ferry") == expected
    finally:
        cold.close()


def test_stored_and_counted_terms_rank_alike(
    tier: SessionTier, kv: SqliteKVStore, index: ChromaVectorIndex
) -> None:
    for n, (said, topic) in enumerate(
        [
            ("The zucchini plants need water every morning.", "the garden"),
            ("Our ferry to Lisbon leaves at nine; zucchini soup on board.", "travel"),
            ("Lisbon hotels are pricey in June.", "travel budget"),
        ]
    ):
        end(tier, f"s{n}", said, topic, n)
    with_records = fresh(tier, kv, index)
    try:
        stored = keyword_scores(with_records, "zucchini Lisbon water hotel")
    finally:
        with_records.close()
    kv.commit([Delete(TERMS, sid) for sid, _ in kv.scan(TERMS)])
    without = fresh(tier, kv, index)
    try:
        assert keyword_scores(without, "zucchini Lisbon water hotel") == stored
    finally:
        without.close()


def test_every_change_and_deletion_of_a_session_takes_its_term_counts(
    tier: SessionTier, kv: SqliteKVStore
) -> None:
    def record_of(session_id: str) -> dict[str, int] | None:
        raw = kv.get_many(TERMS, [session_id])[0]
        return None if raw is None else dict(orjson.loads(raw)["terms"])

    for n in range(4):
        end(tier, f"s{n}", f"Secret word quokka{n} said here.", "animals", n)
    assert all(record_of(f"s{n}") for n in range(4))

    assert tier.delete_session(USER, "s0")
    assert record_of("s0") is None

    # Ended again with another transcript: nothing of the first one's words is kept.
    end(tier, "s1", "Only about the weather now.", "animals", 1)
    counts = record_of("s1")
    assert counts is not None
    assert "quokka1" not in counts
    assert "weather" in counts

    # Retention: a transcript dropped from a session that keeps its summary, then whole sessions.
    assert tier.expire(
        USER, sessions_before=None, transcripts_before=START + timedelta(days=2, hours=1)
    ) == (0, 2)
    counts = record_of("s2")
    assert counts is not None
    assert "quokka2" not in counts
    assert tier.expire(USER, sessions_before=START + timedelta(days=3), transcripts_before=None)[0]
    assert record_of("s2") is None

    # A summary saved over the session, without its transcript (which goes with the old one).
    tier.save_session(SessionSummary(session_id="s3", user_id=USER, task_description="Taxes."))
    counts = record_of("s3")
    assert counts is not None
    assert "quokka3" not in counts
    assert "tax" in counts

    tier.delete_user_sessions(USER)
    assert kv.scan(TERMS) == []


def test_an_index_pass_in_flight_gives_a_deleted_session_no_record_back(
    tier: SessionTier,
    kv: SqliteKVStore,
    index: ChromaVectorIndex,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    end(tier, "s1", "Secret word quokka said here.", "animals", 0)
    sessions = keys.sessions_space("default", USER)
    # Another process: its indexer handles the delete while this one's pass is in flight.
    other = fresh(tier, kv, index)
    real_read_plans = plans_module.read_plans
    deleting: list[threading.Thread] = []

    def read_then_delete(*args: Any, **kwargs: Any) -> list[Plan]:
        plans = real_read_plans(*args, **kwargs)
        if not deleting and any(plan.summary is not None for plan in plans):
            # The delete's own index work waits for this pass (one sync at a time per
            # process): run it in a thread, and let the other process index it meanwhile.
            deleting.append(threading.Thread(target=tier.delete_session, args=(USER, "s1")))
            deleting[0].start()
            wait_until(
                lambda: kv.get_many(sessions, ["s1"])[0] is None,
                what="the delete to commit",
                every_s=0.01,
            )
            other._store.indexer.sync([(USER, "s1")])
        return plans

    try:
        monkeypatch.setattr(index_module, "read_plans", read_then_delete)
        # A re-save: the pass indexing it is the one the delete overtakes.
        tier.save_session(
            SessionSummary(session_id="s1", user_id=USER, task_description="Quokkas.")
        )
        deleting[0].join(30)
        assert not deleting[0].is_alive()
    finally:
        other.close()
    assert kv.scan(TERMS) == []
    assert kv.scan(sessions) == []


def test_the_stemmer_keeps_no_number_or_code_it_saw() -> None:
    # Deleting means gone from memory too: a code in a deleted transcript must not stay memoised.
    token = uuid.uuid4().hex[:12]
    letters = "".join(chr(ord("a") + int(c, 16)) for c in token)
    assert term_counts(f"my code zz{token}9 and the {letters}s") == {
        f"zz{token}9": 1,
        "code": 1,
        letters: 1,
    }
    assert tokenize(f"code zz{token}9, {letters}'s") == ["code", f"zz{token}9", letters]
    assert holders(f"zz{token}9") == []
    assert holders(f"{letters}s"), "a word of letters is memoised: the search works"
