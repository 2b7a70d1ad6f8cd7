"""The tiers' retention primitives on every KV backend: idle runs by the tier's clock, sessions,
transcripts and facts by cutoff, read a page at a time, and each delete checked against what it
was decided on.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from tests.tiers.test_task_lifecycle import Clock
from tiers import keys
from tiers.backends.base import KVStore
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.errors import (
    FactNotFoundError,
    InvalidInputError,
    RunNotFoundError,
    SessionNotFoundError,
)
from tiers.models import Message, SessionSummary
from tiers.retention import (
    RetentionPolicy,
    effective_policy,
    read_overrides,
    set_overrides,
    sweep_expired,
)
from tiers.session import SessionTier, header_key
from tiers.task import TaskTier
from tiers.task import _retention as task_retention
from tiers.user import UserTier

T0 = datetime(2030, 1, 1, tzinfo=UTC)


@pytest.fixture
def clock() -> Clock:
    return Clock()  # starts at T0


@pytest.fixture
def tasks(kv: KVStore, clock: Clock) -> TaskTier:
    return TaskTier(kv, clock=clock)


@pytest.fixture(scope="module")
def embedder() -> MiniLMEmbedder:
    model = MiniLMEmbedder()
    model.load()
    return model


@pytest.fixture
def sessions(kv: KVStore, tmp_path: Path, embedder: MiniLMEmbedder) -> Iterator[SessionTier]:
    index = ChromaVectorIndex(tmp_path / "chroma", embedder=embedder)
    yield SessionTier(kv, index, embedder)
    index.close()


def test_idle_runs_by_the_tiers_clock_honour_live_leases(
    tasks: TaskTier, clock: Clock, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(task_retention, "_SWEEP_PAGE", 2)  # several pages, deletes between reads
    for n in range(5):
        tasks.start_run("u", f"left-{n}").step("a", lambda: 1)
    beating = tasks.start_run("u", "beating", lease_ttl=3600)
    leased = tasks.start_run("u", "leased", lease_ttl=3 * 86_400)
    tasks.start_run("u", "finished").complete()
    day = 86_400.0
    clock.advance(0.5 * day)
    beating.heartbeat()  # touched: idle counts from here
    clock.advance(0.75 * day)  # 1.25 days since the others were touched
    with pytest.raises(InvalidInputError):
        tasks.sweep_idle(timedelta(0))
    deleted = tasks.sweep_idle(timedelta(days=1))
    assert sorted(deleted) == [f"left-{n}" for n in range(5)]
    remaining = {run.run_id for run in tasks.list_runs()}
    # "beating" was touched 0.75 days ago; "leased" holds a live lease; a finished run is
    # not idle (the finished-run retention is its TTL).
    assert remaining == {"beating", "leased", "finished"}
    clock.advance(2 * day)  # every lease has expired, nothing was touched
    assert sorted(tasks.sweep_idle(timedelta(days=1))) == ["beating", "leased"]
    with pytest.raises(RunNotFoundError):
        leased.step("b", lambda: 2)  # a deleted run stays deleted
    assert [run.run_id for run in tasks.list_runs()] == ["finished"]
    assert tasks.sweep(now=clock.now + timedelta(days=8)) == ["finished"]
    assert kv_spaces_empty(tasks)


def kv_spaces_empty(tasks: TaskTier) -> bool:
    kv = tasks._kv
    for run in ("left-0", "beating", "leased", "finished"):
        if kv.scan(keys.run_space("default", run)):
            return False
    return not kv.scan(keys.runs_space("default"))


def said(text: str) -> list[Message]:
    return [Message(role="user", content=text)]


def test_sessions_and_transcripts_expire_page_by_page(sessions: SessionTier) -> None:
    for n in range(7):
        when = T0 - timedelta(days=10 * n)  # s0 today .. s6 60 days ago
        sessions.save_transcript("u", f"s{n}", said(f"note {n}"), created_at=when)
        if n % 2 == 0:  # s1, s3, s5 stay unsummarized
            sessions.save_session(
                SessionSummary(
                    user_id="u", session_id=f"s{n}", task_description=f"t{n}", created_at=when
                )
            )
    gone, dropped = sessions.expire(
        "u",
        sessions_before=T0 - timedelta(days=45),
        transcripts_before=T0 - timedelta(days=15),
        page=2,
    )
    # s5 (50d, unsummarized), s6 (60d) are past the session cutoff; of the rest, s2 and s4 keep
    # their summaries without transcripts, and s3, unsummarized, is past the transcript cutoff:
    # a transcript with no summary is its whole session.
    assert (gone, dropped) == (3, 2)
    assert sorted(s.session_id for s in sessions.list_sessions("u")) == ["s0", "s2", "s4"]
    assert sessions.unsummarized_sessions("u") == ["s1"]
    assert sessions.get_transcript("u", "s0")
    with pytest.raises(SessionNotFoundError):
        sessions.get_transcript("u", "s2")
    assert sessions.expire("u", sessions_before=None, transcripts_before=None) == (0, 0)
    assert sessions.flush(60)


def test_a_session_changed_after_the_decision_is_not_deleted(
    sessions: SessionTier, kv: KVStore
) -> None:
    old = T0 - timedelta(days=100)
    sessions.save_transcript("u", "s1", said("first"), created_at=old)
    summary = SessionSummary(user_id="u", session_id="s1", task_description="t", created_at=old)
    sessions.save_session(summary)
    space = keys.sessions_space("default", "u")
    transcripts = keys.transcripts_space("default", "u")
    (decided_summary,) = kv.get_many(space, ["s1"])
    (decided_header,) = kv.get_many(transcripts, [header_key("s1")])
    assert decided_summary is not None
    assert decided_header is not None
    # The session is saved again after the sweep read it: neither delete may go through.
    sessions.save_session(summary.model_copy(update={"task_description": "new"}))
    assert not sessions._delete_session("u", "s1", expected=(decided_summary, decided_header))
    assert sessions.get_session("u", "s1").task_description == "new"
    # A summary replaced from the same transcript (resummarized) after the sweep read it: the
    # transcript-only delete is refused too.
    sessions.save_transcript("u", "s2", said("second"), created_at=old)
    first = summary.model_copy(update={"session_id": "s2"})
    sessions.save_session(first)
    (decided,) = kv.get_many(space, ["s2"])
    (raw,) = kv.get_many(transcripts, [header_key("s2")])
    assert decided is not None
    assert raw is not None
    header = sessions.transcript_header("u", "s2")
    sessions.save_session(first.model_copy(update={"task_description": "again"}), transcript=header)
    assert not sessions._drop_transcript("u", header, raw, decided)
    assert sessions.get_transcript("u", "s2")
    assert sessions.get_session("u", "s2").task_description == "again"


def test_facts_expire_from_their_last_update_history_included(kv: KVStore) -> None:
    users = UserTier(kv)
    now = datetime.now(UTC)
    for n in range(5):  # several pages of keys
        users.set_fact("u", f"old-{n}", n, updated_at=now - timedelta(days=100))
        users.set_fact("u", f"old-{n}", n + 1, updated_at=now - timedelta(days=90))
    users.set_fact("u", "live", "v1", updated_at=now - timedelta(days=100))
    users.set_fact("u", "live", "v2", updated_at=now - timedelta(days=60))
    users.set_fact("u", "live", "v3", updated_at=now - timedelta(days=5))
    users.set_fact("u", "gone", "x", updated_at=now - timedelta(days=100))
    assert users.delete_fact("u", "gone")  # leaves history: the value and a tombstone (now)
    removed = users.expire_facts("u", before=now - timedelta(days=30), page=2)
    assert removed == 5 * 2 + 1  # old-*: current + one past version each; live: v1
    assert [f.key for f in users.get_facts("u")] == ["live"]
    assert [v.value for v in users.fact_history("u", "live")] == ["v2", "v3"]
    assert len(users.fact_history("u", "gone")) == 2  # its tombstone is recent
    with pytest.raises(FactNotFoundError):
        users.get_fact("u", "old-0")
    # Once the deletion itself is older than the cutoff, the history goes too.
    assert users.expire_facts("u", before=now + timedelta(days=1)) == 2 + 2
    assert users.fact_history("u", "gone") == []
    assert kv.scan(keys.fact_history_space("default", "u")) == []
    assert kv.scan(keys.facts_space("default", "u")) == []
    with pytest.raises(InvalidInputError):
        users.expire_facts("u", before="yesterday")  # type: ignore[arg-type]


def test_overrides_are_stored_per_tenant(kv: KVStore) -> None:
    default = RetentionPolicy(sessions=timedelta(days=90), facts=timedelta(days=365))
    assert read_overrides(kv, "acme") == {}
    set_overrides(kv, "acme", {"sessions": "7d", "facts": "off"})
    assert read_overrides(kv, "acme") == {"sessions": timedelta(days=7), "facts": None}
    assert read_overrides(kv, "other") == {}
    policy = effective_policy(default, read_overrides(kv, "acme"))
    assert (policy.sessions, policy.facts, policy.transcripts) == (timedelta(days=7), None, None)
    set_overrides(kv, "acme", {"facts": "default"})
    assert read_overrides(kv, "acme") == {"sessions": timedelta(days=7)}


def test_sweep_expired_of_an_empty_tenant_and_with_retention_off(
    kv: KVStore, sessions: SessionTier, tasks: TaskTier
) -> None:
    users = UserTier(kv)
    report = sweep_expired(
        kv=kv, tasks=tasks, sessions=sessions, users=users, policy=RetentionPolicy(), now=T0
    )
    assert report.deleted == report.users == 0
    users.set_fact("u", "k", "v", updated_at=T0 - timedelta(days=1000))
    off = sweep_expired(
        kv=kv, tasks=tasks, sessions=sessions, users=users, policy=RetentionPolicy(), now=T0
    )
    assert off.users == 0  # no session or fact TTL: users are not even read
    assert users.get_fact("u", "k").value == "v"
