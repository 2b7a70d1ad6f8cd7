"""The session tier on every KV backend, the real MiniLM model and a real embedded Chroma."""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest

from tiers import keys
from tiers.backends.base import Delete, KVStore, Put, VectorItem
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.backends.redis_kv import RedisKVStore
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import (
    BackendUnavailableError,
    CorruptRecordError,
    InvalidInputError,
    SessionNotFoundError,
    ValueTooLargeError,
)
from tiers.session import RecalledSession, SessionSummary, SessionTier, session_windows


@pytest.fixture
def tier(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, no_network: None
) -> SessionTier:
    return SessionTier(kv, index, embedder)


def at(days_ago: int) -> datetime:
    return datetime(2025, 3, 1, 12, 0, tzinfo=UTC) - timedelta(days=days_ago)


SESSIONS = {
    "db-migration": SessionSummary(
        session_id="db-migration",
        user_id="alice",
        task_description="Move the billing service from MySQL to PostgreSQL 16",
        decisions_made=[
            "Use logical replication for the cut-over",
            "Keep MySQL read-only for a week",
        ],
        work_completed=["Wrote the schema conversion scripts", "Migrated the invoices table"],
        open_questions=["How do we handle the enum columns?"],
        next_recommended_steps=["Run the data consistency checker on the payments table"],
        created_at=at(40),
    ),
    "dark-mode": SessionSummary(
        session_id="dark-mode",
        user_id="alice",
        task_description="Add a dark theme to the React dashboard",
        decisions_made=["Use CSS variables for colours", "Respect prefers-color-scheme"],
        work_completed=["Themed the navigation bar and charts"],
        next_recommended_steps=["Fix contrast of disabled buttons for accessibility"],
        created_at=at(30),
    ),
    "autoscaling": SessionSummary(
        session_id="autoscaling",
        user_id="alice",
        task_description="Tune Kubernetes autoscaling for the queue workers",
        decisions_made=["Scale pods on queue depth with KEDA instead of CPU"],
        work_completed=["Updated the Helm chart with min 2 and max 20 replicas"],
        open_questions=["Should the node pool use spot instances?"],
        created_at=at(20),
    ),
    "tax-filing": SessionSummary(
        session_id="tax-filing",
        user_id="alice",
        task_description="Prepare the quarterly VAT return",
        decisions_made=["File before the 7th to avoid the late fee"],
        work_completed=["Reconciled supplier invoices against bank statements"],
        next_recommended_steps=["Ask the accountant about the reverse-charge invoices"],
        created_at=at(10),
    ),
    "japan-trip": SessionSummary(
        session_id="japan-trip",
        user_id="alice",
        task_description="Plan a two-week holiday in Japan in April",
        decisions_made=["Buy a 14-day JR rail pass", "Stay three nights in Kyoto"],
        work_completed=["Booked the hotel in Tokyo near Shinjuku station"],
        next_recommended_steps=["Reserve the ryokan in Hakone"],
        created_at=at(5),
    ),
}

QUERIES = {
    "what did we decide about the Postgres database cut-over?": "db-migration",
    "colour scheme and theming of the web UI": "dark-mode",
    "how many replicas should the worker pods scale to": "autoscaling",
    "sales tax paperwork for the accountant": "tax-filing",
    "travel itinerary and hotels for the vacation": "japan-trip",
}


def user_vector_ids(index: ChromaVectorIndex, user_id: str, tenant: str = "default") -> set[str]:
    return set(index.ids(where={"tenant": tenant, "user_id": user_id}))


def vector_id(user_id: str, session_id: str, tenant: str = "default") -> str:
    return keys.session_vector_id(tenant, user_id, session_id)


def test_save_get_and_recall_the_relevant_session_first(tier: SessionTier) -> None:
    tier.save_sessions(SESSIONS.values())
    assert tier.get_session("alice", "autoscaling") == SESSIONS["autoscaling"]
    for query, expected in QUERIES.items():
        hits = tier.recall_relevant("alice", query, top_k=3)
        assert hits[0].summary.session_id == expected, query
        assert all(isinstance(h, RecalledSession) for h in hits)
        assert hits[0].score > hits[-1].score
        assert -1.0 <= hits[-1].score <= hits[0].score <= 1.0
    everything = tier.recall_relevant("alice", "anything at all", top_k=100)
    assert sorted(h.summary.session_id for h in everything) == sorted(SESSIONS)


def test_users_and_tenants_never_see_each_other(
    tier: SessionTier, kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder
) -> None:
    tier.save_sessions(SESSIONS.values())
    bob = SessionSummary(
        session_id="db-migration",  # same session id as alice's, different user
        user_id="bob",
        task_description="PostgreSQL database cut-over rehearsal for the payments team",
    )
    tier.save_session(bob)
    query = "PostgreSQL database cut-over"
    bob_hits = tier.recall_relevant("bob", query, top_k=10)
    assert [(h.summary.user_id, h.summary.session_id) for h in bob_hits] == [
        ("bob", "db-migration")
    ]
    alice_hits = tier.recall_relevant("alice", query, top_k=10)
    assert {h.summary.user_id for h in alice_hits} == {"alice"}
    assert len(alice_hits) == len(SESSIONS)
    assert tier.get_session("alice", "db-migration") == SESSIONS["db-migration"]
    # Another tenant over the very same stores sees nothing of the default tenant.
    acme = SessionTier(kv, index, embedder, tenant="acme")
    assert acme.recall_relevant("alice", query) == []
    assert acme.list_sessions("alice") == []
    with pytest.raises(SessionNotFoundError):
        acme.get_session("bob", "db-migration")
    assert tier.recall_relevant("carol", query) == []


def test_re_saving_replaces_and_never_duplicates(
    tier: SessionTier, index: ChromaVectorIndex, embedder: MiniLMEmbedder
) -> None:
    first = SESSIONS["dark-mode"]
    tier.save_session(first)
    tier.save_session(first)
    revised = first.model_copy(update={"work_completed": ["Themed every page, charts included"]})
    assert tier.save_session(revised) == revised
    assert tier.get_session("alice", "dark-mode") == revised
    assert user_vector_ids(index, "alice") == {vector_id("alice", "dark-mode")}
    assert [s.session_id for s in tier.list_sessions("alice")] == ["dark-mode"]
    (hit,) = tier.recall_relevant("alice", "theme", top_k=5)
    assert hit.summary == revised
    # The indexed vector is the new version's, not the old one's; the index holds no text.
    (vector,) = embedder.embed([session_windows(revised, None)[0]])
    (raw,) = index.query(vector, where={"user_id": "alice"}, top_k=1)
    assert raw.distance < 1e-4
    assert raw.document == ""


def test_batch_save_with_duplicates_keeps_the_last(
    tier: SessionTier, index: ChromaVectorIndex
) -> None:
    summaries = [
        SessionSummary(session_id=f"s{n}", user_id=f"u{n % 3}", task_description=f"task number {n}")
        for n in range(40)
    ]
    summaries.append(summaries[4].model_copy(update={"task_description": "the final word"}))
    assert tier.save_sessions(summaries) == summaries
    for user in ("u0", "u1", "u2"):
        stored = {s.session_id for s in tier.list_sessions(user)}
        assert user_vector_ids(index, user) == {vector_id(user, sid) for sid in stored}
    assert tier.get_session("u1", "s4").task_description == "the final word"
    assert index.count() == 40


def test_created_at_backfill_orders_listing_and_is_indexed(
    tier: SessionTier, index: ChromaVectorIndex, embedder: MiniLMEmbedder
) -> None:
    # Saved newest-first, listed by created_at, not by insertion order.
    for summary in reversed(list(SESSIONS.values())):
        tier.save_session(summary)
    listed = tier.list_sessions("alice")
    assert [s.session_id for s in listed] == list(reversed(list(SESSIONS)))
    assert [s.created_at for s in listed] == sorted((s.created_at for s in listed), reverse=True)
    assert [s.session_id for s in tier.list_sessions("alice", limit=2)] == [
        "japan-trip",
        "tax-filing",
    ]
    assert tier.list_sessions("alice", limit=0) == []
    old = SESSIONS["db-migration"]
    assert tier.get_session("alice", "db-migration").created_at == old.created_at
    (vector,) = embedder.embed([old.render()])
    (hit,) = index.query(vector, where={"user_id": "alice", "session_id": "db-migration"}, top_k=1)
    assert hit.metadata["created_at"] == pytest.approx(old.created_at.timestamp())
    assert hit.metadata["created_at_iso"] == old.created_at.isoformat()
    assert hit.metadata["tenant"] == "default"


def test_delete_removes_from_both_stores(tier: SessionTier, index: ChromaVectorIndex) -> None:
    tier.save_sessions(SESSIONS.values())
    assert tier.delete_session("alice", "tax-filing") is True
    assert tier.delete_session("alice", "tax-filing") is False
    with pytest.raises(SessionNotFoundError, match="tax-filing"):
        tier.get_session("alice", "tax-filing")
    assert vector_id("alice", "tax-filing") not in user_vector_ids(index, "alice")
    assert "tax-filing" not in {
        h.summary.session_id for h in tier.recall_relevant("alice", "VAT", 10)
    }
    assert len(user_vector_ids(index, "alice")) == len(SESSIONS) - 1


def test_delete_user_sessions_leaves_no_orphans(
    tier: SessionTier, index: ChromaVectorIndex, embedder: MiniLMEmbedder
) -> None:
    tier.save_sessions(SESSIONS.values())
    tier.save_session(SessionSummary(session_id="keep", user_id="bob", task_description="bob's"))
    # A stray vector of alice's with no KV record (e.g. written by an old version).
    (vector,) = embedder.embed(["stray"])
    index.upsert(
        [
            VectorItem(
                vector_id("alice", "stray"),
                vector,
                "stray",
                {"tenant": "default", "user_id": "alice", "session_id": "stray"},
            )
        ]
    )
    assert tier.delete_user_sessions("alice") == len(SESSIONS)
    assert tier.list_sessions("alice") == []
    assert user_vector_ids(index, "alice") == set()
    assert tier.recall_relevant("alice", "database") == []
    assert user_vector_ids(index, "bob") == {vector_id("bob", "keep")}
    assert tier.delete_user_sessions("alice") == 0


def test_recall_skips_hits_whose_kv_record_is_gone(tier: SessionTier, kv: KVStore) -> None:
    tier.save_sessions(SESSIONS.values())
    # The index lags behind a KV delete (as between a crash and its repair): KV wins.
    kv.commit([Delete(keys.sessions_space("default", "alice"), "japan-trip")])
    hits = tier.recall_relevant("alice", "holiday in Japan", top_k=2)
    assert "japan-trip" not in {h.summary.session_id for h in hits}
    assert len(hits) == 2


def test_a_corrupt_record_is_reported_with_its_key(tier: SessionTier, kv: KVStore) -> None:
    tier.save_sessions(SESSIONS.values())
    space = keys.sessions_space("default", "alice")
    kv.commit([Put(space, "japan-trip", b'{"session_id": 42')])
    with pytest.raises(CorruptRecordError, match=f"{space}/japan-trip"):
        tier.get_session("alice", "japan-trip")
    with pytest.raises(CorruptRecordError, match="japan-trip"):
        tier.recall_relevant("alice", "holiday in Japan", top_k=1)
    with pytest.raises(CorruptRecordError, match="japan-trip"):
        tier.list_sessions("alice")


def test_bad_input_is_refused_and_nothing_is_written(
    tier: SessionTier, kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder
) -> None:
    for bad_query in ("", "   "):
        with pytest.raises(InvalidInputError) as info:
            tier.recall_relevant("alice", bad_query)
        assert info.value.field == "query"
    for bad_k in (0, 101, True, 2.5):
        with pytest.raises(InvalidInputError) as info:
            tier.recall_relevant("alice", "q", top_k=bad_k)  # type: ignore[arg-type]
        assert info.value.field == "top_k"
    with pytest.raises(InvalidInputError) as info:
        tier.recall_relevant("al:ice", "q")
    assert info.value.field == "user_id"
    with pytest.raises(InvalidInputError):
        tier.get_session("alice", "../etc")
    with pytest.raises(InvalidInputError, match="limit"):
        tier.list_sessions("alice", limit=-1)
    with pytest.raises(InvalidInputError, match="summaries\\[1\\]"):
        tier.save_sessions([SESSIONS["dark-mode"], {"session_id": "x"}])  # type: ignore[list-item]
    huge = SessionSummary(session_id="huge", user_id="alice", decisions_made=["x" * 19_000] * 5)
    with pytest.raises(ValueTooLargeError, match="huge"):
        tier.save_sessions([SESSIONS["tax-filing"], huge])
    with pytest.raises(SessionNotFoundError):
        tier.get_session("alice", "dark-mode")
    assert tier.list_sessions("alice") == []
    with pytest.raises(InvalidInputError):
        SessionTier(kv, index, embedder, tenant="bad tenant")


def test_an_index_outage_is_repaired_later(
    kv: KVStore, tmp_path: Path, embedder: MiniLMEmbedder, no_network: None
) -> None:
    path = tmp_path / "chroma-outage"
    down = ChromaVectorIndex(path, embedder=embedder)
    tier = SessionTier(kv, down, embedder)
    tier.save_session(SESSIONS["dark-mode"])
    down.close()  # from here on every index call fails as in an outage
    saved = tier.save_session(SESSIONS["japan-trip"])  # acknowledged: the KV has it
    assert tier.get_session("alice", "japan-trip") == saved
    assert tier.delete_session("alice", "dark-mode") is True
    with pytest.raises(BackendUnavailableError):
        tier.recall_relevant("alice", "Japan")
    outbox = kv.scan(keys.session_outbox_space("default"))
    assert sorted(k for k, _ in outbox) == ["alice/dark-mode", "alice/japan-trip"]
    back = ChromaVectorIndex(path, embedder=embedder)
    try:
        assert user_vector_ids(back, "alice") == {vector_id("alice", "dark-mode")}  # stale
        recovered = SessionTier(kv, back, embedder)  # construction repairs
        assert user_vector_ids(back, "alice") == {vector_id("alice", "japan-trip")}
        assert kv.scan(keys.session_outbox_space("default")) == []
        assert recovered.repair() == 0
        (hit,) = recovered.recall_relevant("alice", "Japan", top_k=5)
        assert hit.summary == saved
    finally:
        back.close()


def test_concurrent_re_saves_leave_the_newest_version_indexed(
    tier: SessionTier, kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder
) -> None:
    versions = [
        SESSIONS["autoscaling"].model_copy(update={"task_description": f"autoscaling revision {n}"})
        for n in range(12)
    ]
    barrier = threading.Barrier(4)

    def writer(offset: int) -> None:
        barrier.wait()
        for version in versions[offset::4]:
            tier.save_session(version)

    threads = [threading.Thread(target=writer, args=(n,)) for n in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    stored = tier.get_session("alice", "autoscaling")
    (vector,) = embedder.embed([session_windows(stored, None)[0]])
    (hit,) = index.query(vector, where={"user_id": "alice"}, top_k=5)
    assert hit.distance < 1e-4  # the index holds what the KV holds
    assert hit.document == ""  # and no text: the KV store is the one place to erase it
    assert kv.scan(keys.session_outbox_space("default")) == []


# -- crash safety: a real process killed at random points -------------------------------------

_WORKER = """
import itertools, sys
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.backends.redis_kv import RedisKVStore
from tiers.session import session_windows
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.session import SessionSummary, SessionTier

kv_spec, chroma_dir, first = sys.argv[1], sys.argv[2], int(sys.argv[3])
kv = RedisKVStore(kv_spec) if kv_spec.startswith("redis://") else SqliteKVStore(kv_spec)
embedder = MiniLMEmbedder()
tier = SessionTier(kv, ChromaVectorIndex(chroma_dir, embedder=embedder), embedder)
for i in itertools.count(first):
    user = f"u{i % 3}"
    if i % 2 == 0:
        # Transcripts of 1 to 4 windows: re-saves grow and shrink a session's vectors.
        words = " ".join(f"w{(i * k) % 97}" for k in range(40 + (i % 5) * 70))
        tier.save_transcript(user, f"s{i % 23}", [{"role": "user", "content": words}])
    tier.save_session(SessionSummary(
        session_id=f"s{i % 23}", user_id=user,
        task_description=f"iteration {i}: tune the ingestion pipeline for user {user}",
        decisions_made=[f"decision {i}"],
    ))
    if i % 4 == 0:
        tier.delete_session(f"u{(i + 1) % 3}", f"s{(i * 7) % 23}")
    if i % 9 == 0:
        tier.save_sessions([
            SessionSummary(session_id=f"b{(i + n) % 11}", user_id=f"u{n % 3}",
                           task_description=f"batch {i} item {n}")
            for n in range(6)
        ])
    if i % 31 == 0:
        tier.delete_user_sessions(f"u{i % 3}")
    print(i, flush=True)
"""


def _kill_mid_flight(kv_spec: str, chroma_dir: Path, first: int, rng: random.Random) -> int:
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, kv_spec, str(chroma_dir), str(first)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert worker.stdout is not None
    try:
        line = worker.stdout.readline()  # the first completed iteration: the loop is running
        assert line.strip(), worker.stderr.read() if worker.stderr else "worker died"
        time.sleep(rng.uniform(0.0, 0.5))
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(30)
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        worker.stdout.close()
        if worker.stderr is not None:
            worker.stderr.close()
    assert worker.returncode == -signal.SIGKILL
    return first + 1000


def _assert_converged(kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder) -> int:
    """Check the index holds exactly what the KV store says; return the window vectors seen."""
    tier = SessionTier(kv, index, embedder)
    window_vectors = 0
    for user in ("u0", "u1", "u2"):
        stored = {
            key: SessionSummary.model_validate_json(data)
            for key, data in kv.scan(keys.sessions_space("default", user))
        }
        # Exactly the vectors of the stored sessions: the summary's and one per window.
        texts: dict[str, str] = {}
        for sid, summary in stored.items():
            try:
                transcript = tier.get_transcript(user, sid)
            except SessionNotFoundError:
                transcript = None
            for n, text in enumerate(session_windows(summary, transcript)):
                vid = vector_id(user, sid)
                texts[vid if n == 0 else f"{vid}#{n}"] = text
        assert user_vector_ids(index, user) == set(texts), user
        window_vectors += sum("#" in vid for vid in texts)
        # The recorded window counts are exact once converged (absent: no windows).
        windows = {
            sid: sum(vid.startswith(vector_id(user, sid) + "#") for vid in texts) for sid in stored
        }
        assert dict(kv.scan(keys.session_vectors_space("default", user))) == {
            sid: str(n).encode() for sid, n in windows.items() if n
        }
        if not texts:
            continue
        # Content too: each vector is the one of its session's current KV version.
        found, matrix = index.get_embeddings(list(texts))
        expected = embedder.embed([texts[vid] for vid in found])
        for row, vector in zip(matrix, expected, strict=True):
            assert float(row @ np.asarray(vector, dtype=np.float32)) > 0.9999
        for sid in stored:
            hits = index.query(
                embedder.embed([texts[vector_id(user, sid)]])[0],
                where={"user_id": user, "session_id": sid},
                top_k=10,
            )
            documents = {hit.id: hit.document for hit in hits}
            assert vector_id(user, sid) in documents
            assert set(documents.values()) <= {""}  # no vector carries text
    return window_vectors


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_a_process_killed_at_random_points_always_converges(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path, embedder: MiniLMEmbedder
) -> None:
    if backend == "sqlite":
        kv_spec = str(tmp_path / "kv.sqlite3")
        kv: KVStore = SqliteKVStore(kv_spec)
    else:
        kv_spec = request.getfixturevalue("redis_url")
        kv = RedisKVStore(kv_spec)
    chroma_dir = tmp_path / "chroma"
    rng = random.Random(20250301)
    rounds_with_pending_work = 0
    window_vectors = 0
    first = 0
    try:
        for _ in range(4):
            first = _kill_mid_flight(kv_spec, chroma_dir, first, rng)
            outbox = kv.scan(keys.session_outbox_space("default"))
            rounds_with_pending_work += bool(outbox)
            # Only now may this process open the Chroma directory (one process at a time).
            index = ChromaVectorIndex(chroma_dir, embedder=embedder)
            try:
                tier = SessionTier(kv, index, embedder)  # construction replays the outbox
                assert kv.scan(keys.session_outbox_space("default")) == []
                window_vectors += _assert_converged(kv, index, embedder)
                assert tier.repair() == 0
            finally:
                index.close()
    finally:
        kv.close()
    # The kills must have landed between a KV commit and its index write at least once,
    # or this test proved nothing.
    assert rounds_with_pending_work >= 1
    assert window_vectors > 0  # transcripts were indexed as windows, not only summaries
    print(json.dumps({"backend": backend, "rounds_with_pending_work": rounds_with_pending_work}))
