"""A lost or stale vector index is found (index vs KV store) and repaired for every tenant.

Issue 13, defect 6: recall quietly fell back to keyword order when the index
lost its vectors, and nothing said so. Here the index is lost for real (the
Chroma collection dropped under a running store, or its folder gone while the
store was closed) or rolled back to an old copy (stale vectors of replaced
summaries and items, orphans of deleted ones, missing new ones), on SQLite and
on Redis. ``check_index`` must report it per tenant, ``repair_index`` must
re-index from the KV store, and recall must rank by vectors again: each query
shares no word with the session it should find, which is the oldest of the
user's, so keyword and recency order put it last.
"""

from __future__ import annotations

import shutil
import threading
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import chromadb
import numpy as np
import pytest
from chromadb.config import Settings as ChromaSettings

from memory import Memory, SessionSummary
from memory.settings import Settings
from tiers import keys
from tiers.backends.chroma_index import DEFAULT_COLLECTION

BASE = datetime(2025, 3, 1, tzinfo=UTC)
# Per tenant: the user's sessions, oldest first, and a query for the oldest one that
# shares no word with any of them.
TOPICS = {
    "acme": (
        [
            "Planning a holiday trip to a beach in Portugal",
            "Fixing a database migration bug in Postgres",
            "Learning guitar chords and music theory",
        ],
        "seaside vacation",
    ),
    "globex": (
        [
            "Cooking a pasta carbonara recipe for the family",
            "Repairing the car engine and replacing spark plugs",
            "Filing the yearly income tax return",
        ],
        "Italian dinner",
    ),
}


@pytest.fixture(params=["sqlite", "redis"])
def kv_url(request: pytest.FixtureRequest) -> str | None:
    """Where the KV store lives: ``None`` for SQLite in the data dir, else a real Redis."""
    return None if request.param == "sqlite" else str(request.getfixturevalue("redis_url"))


def open_memory(data: Path, kv_url: str | None, **overrides: Any) -> Memory:
    return Memory.from_settings(Settings(data_dir=data, kv_url=kv_url, **overrides))


def seed(memory: Memory) -> None:
    for tenant, (topics, _) in TOPICS.items():
        view = memory.for_tenant(tenant)
        for n, topic in enumerate(topics):
            view.save_session(
                SessionSummary(
                    session_id=f"s{n}",
                    user_id="u1",
                    task_description=topic,
                    created_at=BASE + timedelta(days=n),
                )
            )
    assert memory.flush(60)


def drop_collection(data: Path) -> None:
    """What a manual delete does: the collection goes while the store has it open."""
    client = chromadb.PersistentClient(
        path=str(data / "chroma"), settings=ChromaSettings(anonymized_telemetry=False)
    )
    client.delete_collection(DEFAULT_COLLECTION)


@pytest.mark.parametrize("loss", ["dropped-while-open", "folder-gone-while-closed"])
def test_a_lost_index_is_reported_and_repaired_for_every_tenant(
    tmp_path: Path, kv_url: str | None, loss: str
) -> None:
    data = tmp_path / "data"
    memory = open_memory(data, kv_url)
    try:
        seed(memory)
        for tenant in TOPICS:
            assert memory.for_tenant(tenant).check_index().consistent
        if loss == "dropped-while-open":
            drop_collection(data)
        else:
            memory.close()
            shutil.rmtree(data / "chroma")
            memory = open_memory(data, kv_url)

        assert {"acme", "globex"} <= set(memory.tenants())
        for tenant, (_, query) in TOPICS.items():
            view = memory.for_tenant(tenant)
            report = view.check_index()
            assert not report.consistent
            assert (report.vectors, report.missing, report.stale, report.orphans) == (3, 3, 0, 0)
            # What users saw: no vectors, so recency order, and the session asked for comes last.
            hits = view.recall_relevant("u1", query, top_k=3)
            assert [h.summary.session_id for h in hits] == ["s2", "s1", "s0"]
            assert all(h.similarity is None for h in hits)

        repaired = {t: memory.for_tenant(t).repair_index() for t in memory.tenants()}
        for tenant, (_, query) in TOPICS.items():
            assert repaired[tenant].sessions == 3
            assert repaired[tenant].after.consistent, repaired[tenant].after.describe()
            view = memory.for_tenant(tenant)
            assert view.check_index().consistent
            hits = view.recall_relevant("u1", query, top_k=3)
            assert hits[0].summary.session_id == "s0"
            assert hits[0].similarity is not None
            assert hits[0].similarity > 0.3
    finally:
        memory.close()


def test_stale_orphaned_and_missing_vectors_of_an_old_index_copy_are_repaired(
    tmp_path: Path, kv_url: str | None
) -> None:
    """The index restored from an older copy: replaced, deleted and new sessions and items."""
    data = tmp_path / "data"
    dim = 384
    old_vector = [1.0] + [0.0] * (dim - 1)
    new_vector = [0.0, 1.0] + [0.0] * (dim - 2)
    with open_memory(data, kv_url) as memory:
        view = memory.for_tenant("acme")
        for n, topic in enumerate(TOPICS["acme"][0][:2]):
            view.save_session(
                SessionSummary(
                    session_id=f"s{n}",
                    user_id="u1",
                    task_description=topic,
                    created_at=BASE + timedelta(days=n),
                )
            )
        view.items.put(("notes", "u1"), "kept", {"text": "a"}, vectors=[old_vector], model="m")
        view.items.put(("notes", "u1"), "gone", {"text": "b"}, vectors=[old_vector], model="m")
        assert memory.flush(60)
        assert view.check_index().consistent
    shutil.copytree(data / "chroma", tmp_path / "backup")

    with open_memory(data, kv_url) as memory:
        view = memory.for_tenant("acme")
        # s0 replaced (about databases now), s1 deleted, s2 new; one item changed, one deleted.
        view.save_session(
            SessionSummary(
                session_id="s0",
                user_id="u1",
                task_description="Fixing a database migration bug in Postgres",
                created_at=BASE,
            )
        )
        view.delete_session("u1", "s1")
        view.save_session(
            SessionSummary(
                session_id="s2",
                user_id="u1",
                task_description="Learning guitar chords and music theory",
                created_at=BASE + timedelta(days=2),
            )
        )
        view.items.put(("notes", "u1"), "kept", {"text": "a2"}, vectors=[new_vector], model="m")
        view.items.delete(("notes", "u1"), "gone")
        assert memory.flush(60)
    shutil.rmtree(data / "chroma")
    shutil.copytree(tmp_path / "backup", data / "chroma")

    with open_memory(data, kv_url) as memory:
        view = memory.for_tenant("acme")
        report = view.check_index()
        # Missing: s2. Stale: s0 (old summary), the kept item (old vector). Orphans: s1, "gone".
        assert (report.vectors, report.missing, report.stale, report.orphans) == (3, 1, 2, 2)
        # The harm: s0 still answers for what it no longer is about.
        (stale_hit,) = view.recall_relevant("u1", "seaside vacation", top_k=1)
        assert stale_hit.summary.session_id == "s0"
        assert stale_hit.similarity is not None
        assert stale_hit.similarity > 0.3

        repair = view.repair_index(limit=10)
        assert repair.after.consistent, repair.after.describe()
        assert (repair.sessions, repair.items) == (3, 2)
        hits = view.recall_relevant("u1", "seaside vacation", top_k=2)
        assert all(h.similarity is not None and h.similarity < 0.2 for h in hits)
        tenant_ids = set(memory.index.ids(where={"tenant": "acme"}))
        assert keys.session_vector_id("acme", "u1", "s1") not in tenant_ids
        assert keys.session_vector_id("acme", "u1", "s2") in tenant_ids
        item_ids = sorted(i for i in tenant_ids if "|item|" in i)
        assert len(item_ids) == 1
        _, matrix = memory.index.get_embeddings(item_ids)
        np.testing.assert_allclose(matrix[0], new_vector, atol=1e-6)


def test_a_repair_is_bounded_by_its_limit(tmp_path: Path) -> None:
    with open_memory(tmp_path / "data", None) as memory:
        seed(memory)
        drop_collection(tmp_path / "data")
        view = memory.for_tenant("acme")
        first = view.repair_index(limit=2)
        assert first.sessions == 2
        assert first.after.missing == 1
        second = view.repair_index(limit=2)
        assert second.sessions == 1
        assert second.after.consistent


def test_a_check_racing_writers_reports_no_damage(tmp_path: Path) -> None:
    """Saves and deletes while the check reads: what finished meanwhile is not damage."""
    with open_memory(tmp_path / "data", None, background_indexing=False) as memory:
        view = memory.for_tenant("busy")
        stop = threading.Event()
        errors: list[BaseException] = []

        def write() -> None:
            n = 0
            try:
                while not stop.is_set():
                    view.save_session(
                        SessionSummary(
                            session_id=f"s{n % 7}", user_id=f"u{n % 3}", task_description=f"t {n}"
                        )
                    )
                    if n % 5 == 0:
                        view.delete_session(f"u{n % 3}", f"s{(n + 3) % 7}")
                    n += 1
            except BaseException as exc:  # reported below
                errors.append(exc)

        writer = threading.Thread(target=write)
        writer.start()
        try:
            reports = [view.check_index() for _ in range(15)]
        finally:
            stop.set()
            writer.join()
        assert not errors
        assert all(report.consistent for report in reports), [r.describe() for r in reports]
