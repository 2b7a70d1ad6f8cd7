"""Retention for everything (issue 14, item 4): TTL sweeps of sessions, transcripts, facts and
idle runs, off by default, set per deployment and overridden per tenant.

Every test runs on the embedded default (SQLite + embedded Chroma) and on a real Redis. Time is
never waited for: data is written with past dates (``created_at``, ``updated_at``) and sweeps are
given the time to measure from (``now=``). What a sweep deletes must be gone from every read,
from recall (vectors and keyword search) and from the stores' files and keys.
"""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memory import (
    FactNotFoundError,
    InvalidInputError,
    Memory,
    RetentionPolicy,
    RunNotFoundError,
    SessionNotFoundError,
    SessionSummary,
    SweepReport,
)
from memory.settings import Settings
from tests.memory.test_erasure import (
    found_in_files,
    found_in_redis,
    keyword_of,
    redis_aof_dir,
    said,
)
from tiers import keys
from tiers.retention import parse_ttl

# Words written in exactly one place each, searched for in the stores afterwards.
OLD = "quokkaoldsessionlagos"  # a session past the session TTL (transcript, summary, facts)
MID = "marmosetmidtranscript"  # only in the raw transcript of a session past the transcript TTL
PENDING = "axolotlstalependingtromso"  # an unsummarized transcript past the session TTL
OLD_FACT = "pangolinoldfactquito"  # a fact last updated past the fact TTL, and its history
REPLACED = "okapireplacedvaduz"  # a version of a live fact replaced past the fact TTL
IDLE = "tapiridlerunmaseru"  # a run left unfinished and untouched past the idle TTL
GONE = (OLD, MID, PENDING, OLD_FACT, REPLACED, IDLE)
KEPT = "wombatkeptbamako"  # in everything that must stay: the search must find it

NOW = datetime.now(UTC)
SWEEP_AT = NOW + timedelta(days=2)  # the sweep's clock: two days after everything was written

POLICY = {
    "retention_sessions_days": 60,
    "retention_transcripts_days": 10,
    "retention_facts_days": 30,
    "retention_idle_runs_days": 1,
}


def open_memory(backend: str | None, data: Path, **settings: object) -> Memory:
    return Memory.from_settings(Settings(data_dir=data, kv_url=backend, **settings))  # type: ignore[arg-type]


@pytest.fixture
def memory(backend: str | None, tmp_path: Path) -> Iterator[Memory]:
    mem = open_memory(backend, tmp_path / "data", **POLICY)
    yield mem
    mem.close()


def ago(days: float) -> datetime:
    return NOW - timedelta(days=days)


def write_everything(memory: Memory, user: str = "alice") -> dict[str, object]:
    """One of each: what the policy expires and what it keeps. Returns the live run handles."""
    # Sessions: one past the session TTL (60d), one past only the transcript TTL (10d), one new.
    memory.end_session(user, "old", said(f"I prefer {OLD} tea.", "Noted."), created_at=ago(100))
    memory.save_transcript(
        user, "mid", said("Plan the garden.", f"Small talk about {MID}."), created_at=ago(20)
    )
    memory.save_session(
        SessionSummary(
            user_id=user,
            session_id="mid",
            task_description=f"Plan the garden {KEPT}.",
            created_at=ago(20),
        )
    )
    memory.set_fact(user, "garden", "tomatoes", source="session:mid")  # learned from it
    memory.end_session(user, "recent", said(f"Plan the {KEPT} trip.", "Booked."), created_at=ago(1))
    # Transcripts never summarized: one past the session TTL, one new.
    memory.save_transcript(user, "stale", said(f"Remember {PENDING}."), created_at=ago(100))
    memory.save_transcript(user, "young", said(f"Remember {KEPT}."), created_at=ago(1))
    # Facts (TTL 30d): one untouched for 100 days (with history), one new, one whose first
    # version was replaced 50 days ago and second one a day ago.
    users = memory.users
    users.set_fact(user, "old-fact", f"{OLD_FACT}-1", updated_at=ago(120))
    users.set_fact(user, "old-fact", f"{OLD_FACT}-2", updated_at=ago(100))
    memory.set_fact(user, "new-fact", KEPT)
    users.set_fact(user, "changing", REPLACED, updated_at=ago(100))
    users.set_fact(user, "changing", f"{KEPT}-2", updated_at=ago(50))
    users.set_fact(user, "changing", f"{KEPT}-3", updated_at=ago(1))
    # Runs (idle TTL 1d): one left running, one whose worker holds a 5-day lease, one finished.
    idle = memory.start_run(user, f"idle-{user}")
    idle.step("note", lambda: {"note": IDLE})
    leased = memory.start_run(user, f"leased-{user}", lease_ttl=5 * 86_400)
    leased.step("note", lambda: {"note": KEPT})
    done = memory.start_run(user, f"done-{user}")
    done.step("note", lambda: {"note": KEPT})
    done.complete()
    assert memory.flush(60)
    return {"idle": idle, "leased": leased}


def test_retention_is_off_by_default_and_off_keeps_everything(
    backend: str | None, tmp_path: Path
) -> None:
    with open_memory(backend, tmp_path / "data") as memory:
        assert memory.retention() == RetentionPolicy()
        assert not memory.retention().enabled
        write_everything(memory)
        report = memory.sweep(now=NOW + timedelta(days=3650))
        # Only finished runs have a retention of their own (7 days by default).
        assert report == SweepReport(tenant="default", finished_runs=1)
        assert {s.session_id for s in memory.list_sessions("alice")} == {"old", "mid", "recent"}
        assert memory.pending_summaries("alice") == ["stale", "young"]
        assert memory.sessions.get_transcript("alice", "mid")
        assert len(memory.fact_history("alice", "changing")) == 3
        assert memory.get_fact("alice", "old-fact").value == f"{OLD_FACT}-2"
        assert memory.get_run("idle-alice").status.value == "running"


def test_a_sweep_deletes_what_expired_everywhere_and_keeps_the_rest(
    memory: Memory, backend: str | None, tmp_path: Path
) -> None:
    runs = write_everything(memory)
    before = set(memory.index.ids(where={"tenant": "default", "user_id": "alice"}))
    assert "default/alice/mid#1" in before  # a transcript window, to leave with the transcript
    assert keyword_of(memory, "alice", "mid", MID) > 0  # transcript words count for recall
    memory.end_session("bob", "b1", said(f"I prefer {KEPT} coffee."), created_at=ago(1))

    # Half a day on, the idle run is still inside its TTL (1 day).
    assert memory.tasks.sweep_idle(timedelta(days=1), now=NOW + timedelta(hours=12)) == []
    assert memory.get_run("idle-alice").status.value == "running"

    report = memory.sweep(now=SWEEP_AT)
    assert report.tenant == "default"
    assert report.sessions == 2  # "old" and the unsummarized "stale"
    assert report.transcripts == 1  # "mid" keeps its summary
    assert report.idle_runs == 1
    assert report.finished_runs == 0
    # old-fact: 2 versions; changing: its first version. (Facts learned from the deleted
    # session went with it, not counted here.)
    assert report.facts == 3
    assert report.users == 2

    # Sessions: "old" and "stale" are gone from every read.
    with pytest.raises(SessionNotFoundError):
        memory.get_session("alice", "old")
    with pytest.raises(SessionNotFoundError):
        memory.sessions.get_transcript("alice", "old")
    assert {s.session_id for s in memory.list_sessions("alice")} == {"mid", "recent"}
    assert memory.pending_summaries("alice") == ["young"]
    # "mid" keeps its summary (and what it taught) but not its transcript.
    assert memory.get_session("alice", "mid").task_description == f"Plan the garden {KEPT}."
    with pytest.raises(SessionNotFoundError):
        memory.sessions.get_transcript("alice", "mid")
    assert memory.get_fact("alice", "garden").value == "tomatoes"
    assert memory.sessions.get_transcript("alice", "recent")
    # Recall: no vector and no keyword match of what went.
    assert memory.flush(60)
    assert keyword_of(memory, "alice", "mid", MID) == 0.0
    recalled = {hit.summary.session_id for hit in memory.recall_relevant("alice", OLD, top_k=10)}
    assert recalled == {"mid", "recent"}
    ids = set(memory.index.ids(where={"tenant": "default", "user_id": "alice"}))
    assert not [i for i in ids if i.startswith(("default/alice/old", "default/alice/stale"))]
    assert [i for i in ids if i.startswith("default/alice/mid")] == ["default/alice/mid"]
    assert [i for i in ids if i.startswith("default/alice/recent")]
    context = memory.build_continuation_context("alice", f"{OLD} {MID} {PENDING}")
    assert not [word for word in GONE if word in context]
    assert KEPT in context

    # Facts: the one untouched for 100 days went with its history; of the live one only the
    # version replaced 50 days ago went; facts learned from the deleted session went with it.
    with pytest.raises(FactNotFoundError):
        memory.get_fact("alice", "old-fact")
    assert memory.fact_history("alice", "old-fact") == []
    assert [v.value for v in memory.fact_history("alice", "changing")] == [
        f"{KEPT}-2",
        f"{KEPT}-3",
    ]
    assert memory.get_fact("alice", "new-fact").value == KEPT
    assert not [f for f in memory.get_facts("alice") if f.source == "session:old"]

    # Runs: the idle one is gone, and its worker cannot bring it back.
    with pytest.raises(RunNotFoundError):
        memory.get_run("idle-alice")
    with pytest.raises(RunNotFoundError):
        runs["idle"].step("again", lambda: 1)  # type: ignore[attr-defined]
    with pytest.raises(RunNotFoundError):
        memory.get_run("idle-alice")
    assert memory.get_run("leased-alice").status.value == "running"  # its lease is live
    assert memory.get_run("done-alice").status.value == "completed"
    # Bob (everything inside its TTL) is untouched.
    assert [s.session_id for s in memory.list_sessions("bob")] == ["b1"]

    # And from the stores' files and keys (the sweep scrubs them after deleting).
    if backend is None:
        hits = found_in_files(tmp_path / "data", [*GONE, KEPT])
        assert hits.pop(KEPT, None), "the search finds nothing at all: it is broken"
        assert hits == {}, f"expired data is still on disk: {hits}"
    else:
        hits = found_in_redis(backend, [*GONE, KEPT])
        assert hits.pop(KEPT, None)
        assert hits == {}, f"expired data is still in Redis: {hits}"
        files = found_in_files(redis_aof_dir(backend), [*GONE, KEPT])
        assert files.pop(KEPT, None), "the AOF search finds nothing at all: it is broken"
        assert files == {}, f"expired data is still in the AOF: {files}"

    # A second sweep finds nothing more.
    again = memory.sweep(now=SWEEP_AT)
    assert again.deleted == 0


def test_a_tenant_override_beats_the_default(memory: Memory) -> None:
    acme = memory.for_tenant("acme")  # keeps sessions forever whatever the default says
    strict = memory.for_tenant("strict")  # expires facts after a week; the default keeps them
    lax = memory.for_tenant("lax")  # follows the default
    assert acme.retention_default == memory.retention_default  # a view keeps the default
    for view in (acme, strict, lax):
        view.end_session("u1", "old", said("Plan the trip."), created_at=ago(100))
        view.users.set_fact("u1", "k", "v", updated_at=ago(20))

    policy = acme.set_retention(sessions="off")
    assert policy.sessions is None
    assert policy.tenant_set == ("sessions",)
    assert policy.facts == timedelta(days=30)  # the default's
    assert memory.retention().tenant_set == ()  # another tenant's override is not this one's
    strict_policy = strict.set_retention(facts=timedelta(days=7), idle_runs="12h")
    assert strict_policy.facts == timedelta(days=7)
    assert strict_policy.idle_runs == timedelta(hours=12)
    assert strict_policy.tenant_set == ("facts", "idle_runs")

    assert acme.sweep(now=SWEEP_AT).sessions == 0
    assert [s.session_id for s in acme.list_sessions("u1")] == ["old"]
    assert strict.sweep(now=SWEEP_AT).facts == 1
    assert strict.get_facts("u1") == []
    assert lax.sweep(now=SWEEP_AT).sessions == 1
    assert lax.list_sessions("u1") == []
    assert lax.get_fact("u1", "k").value == "v"  # 22 days old, default TTL 30

    # Back to the default, per kind; a stored override survives reopening the stores.
    back = strict.set_retention(idle_runs="default")
    assert back.idle_runs == timedelta(days=1)
    assert back.tenant_set == ("facts",)
    assert memory.kv.get_many(keys.tenant_config_space("strict"), [keys.RETENTION_KEY])[0]


def test_bad_retention_is_refused_naming_the_field(memory: Memory) -> None:
    for ttls, field in [
        ({"bogus": "1d"}, "bogus"),
        ({"sessions": "soon"}, "sessions"),
        ({"facts": "0d"}, "facts"),
        ({"transcripts": timedelta(0)}, "transcripts"),
        ({"idle_runs": "40000d"}, "idle_runs"),
        ({"sessions": 5}, "sessions"),
    ]:
        with pytest.raises(InvalidInputError) as bad:
            memory.set_retention(**ttls)  # type: ignore[arg-type]
        assert bad.value.field == field, ttls
    assert memory.retention().tenant_set == ()  # nothing was stored
    with pytest.raises(InvalidInputError) as bad_now:
        memory.sweep(now="tomorrow")  # type: ignore[arg-type]
    assert bad_now.value.field == "now"


def test_ttl_text() -> None:
    assert parse_ttl("90d", "x") == timedelta(days=90)
    assert parse_ttl(" 2W ", "x") == timedelta(weeks=2)
    assert parse_ttl("1.5h", "x") == timedelta(minutes=90)
    assert parse_ttl("off", "x") is None
    assert parse_ttl(None, "x") is None


def test_the_default_comes_from_settings(tmp_path: Path) -> None:
    with Memory.open(tmp_path, retention_sessions_days=90, retention_idle_runs_days=0.5) as mem:
        assert mem.retention() == RetentionPolicy(
            sessions=timedelta(days=90), idle_runs=timedelta(hours=12)
        )
