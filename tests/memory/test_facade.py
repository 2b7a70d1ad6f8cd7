"""The Memory facade end to end on the embedded default and on Redis."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

import anyio
import pytest

from memory import (
    AsyncMemory,
    InvalidInputError,
    InvalidTranscriptError,
    LiteLLMSummarizer,
    Memory,
    RunNotFoundError,
    SessionNotFoundError,
    SessionSummary,
    SummaryGenerationError,
)
from memory.settings import Settings
from summarizer.tokens import count_tokens

TRANSCRIPT = [
    {
        "role": "user",
        "content": "I need help migrating our billing service from MySQL to Postgres.",
    },
    {"role": "assistant", "content": "We decided to use logical replication for the cutover."},
    {"role": "assistant", "content": "I've written the schema conversion script and tested it."},
    {"role": "user", "content": "I prefer short answers with code samples."},
    {"role": "user", "content": "What about the stored procedures?"},
    {"role": "assistant", "content": "Next step: port the three stored procedures to PL/pgSQL."},
]


@pytest.fixture(params=["embedded", "redis"])
def memory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Memory]:
    kv_url = request.getfixturevalue("redis_url") if request.param == "redis" else None
    mem = Memory.from_settings(Settings(data_dir=tmp_path / "data", kv_url=kv_url))
    yield mem
    mem.close()


def summary(session_id: str, task: str, days_ago: int, **lists: list[str]) -> SessionSummary:
    return SessionSummary(
        session_id=session_id,
        user_id="u1",
        task_description=task,
        created_at=datetime.now(UTC) - timedelta(days=days_ago),
        **lists,
    )


def test_end_session_saves_summary_and_learns_facts(memory: Memory) -> None:
    saved = memory.end_session("u1", "s1", TRANSCRIPT)
    assert saved.session_id == "s1"
    assert memory.get_session("u1", "s1") == saved
    assert any("replication" in d for d in saved.decisions_made)
    learned = [f for f in memory.get_facts("u1") if f.source == "session:s1"]
    assert learned, "the user's stated preference should become a fact"
    hits = memory.recall_relevant("u1", "Postgres migration", top_k=3)
    assert hits[0].summary.session_id == "s1"


def test_continuation_context_fits_budget_and_keeps_latest(memory: Memory) -> None:
    memory.set_fact("u1", "language", "en")
    memory.save_session(
        summary(
            "old-db",
            "Tune Postgres indexes for the billing tables.",
            30,
            work_completed=["Added a BRIN index on invoices.created_at."],
        )
    )
    memory.save_session(
        summary(
            "mid-ui",
            "Redesign the settings page colours.",
            10,
            decisions_made=["Use the brand palette."],
        )
    )
    memory.save_session(summary("latest", "Write release notes for v2.3.", 1))
    context = memory.continuation_context("u1", "postgres index performance", max_tokens=2000)
    assert "language: en" in context.text
    assert "old-db" in context.text
    assert "latest" in context.text
    assert context.tokens == count_tokens(context.text) <= 2000

    small = memory.continuation_context("u1", "postgres index performance", max_tokens=120)
    assert small.tokens <= 120
    assert "latest" in small.text  # the most recent session always comes first
    assert small.omitted_session_ids  # others were dropped whole, not cut
    for sid in small.omitted_session_ids:
        assert f"Session {sid} " not in small.text
    assert memory.build_continuation_context("u1", "postgres", 120) == small.text


def test_empty_user_has_empty_context(memory: Memory) -> None:
    assert memory.build_continuation_context("nobody", "anything") == ""


def test_save_session_from_mapping_and_bad_input(memory: Memory) -> None:
    saved = memory.save_session({"user_id": "u1", "session_id": "m1", "task_description": "x"})
    assert saved.task_description == "x"
    with pytest.raises(InvalidInputError) as info:
        memory.save_session({"user_id": "u1", "session_id": "m2", "decisions_made": "not a list"})
    assert info.value.field == "decisions_made"
    with pytest.raises(InvalidInputError) as info:
        memory.save_session({"user_id": "", "session_id": "m3"})
    assert info.value.field == "user_id"
    assert [s.session_id for s in memory.list_sessions("u1")] == ["m1"]


def test_malformed_transcript_is_refused_and_nothing_stored(memory: Memory) -> None:
    with pytest.raises(InvalidTranscriptError):
        memory.end_session("u1", "bad", [{"role": "wizard", "content": "hi"}])
    with pytest.raises(InvalidInputError):
        memory.end_session("", "s", TRANSCRIPT)
    assert memory.list_sessions("u1") == []
    assert memory.pending_summaries("u1") == []  # not even the transcript was stored


def llm_reply(**facts: str) -> str:
    return json.dumps(
        {
            "task_description": "Migrate billing from MySQL to Postgres.",
            "decisions_made": ["Use logical replication for the cutover."],
            "work_completed": ["Wrote the schema conversion script."],
            "open_questions": ["What about the stored procedures?"],
            "next_recommended_steps": ["Port the stored procedures to PL/pgSQL."],
            "facts": [
                {"key": key, "value": value, "confidence": 0.8, "evidence": f"I use {value}."}
                for key, value in facts.items()
            ],
        }
    )


def llm(reply: str) -> LiteLLMSummarizer:
    """A litellm summarizer answered by litellm's own ``mock_response``, no retries."""
    return LiteLLMSummarizer(
        "gpt-4o-mini", max_retries=0, completion_kwargs={"mock_response": reply}
    )


def test_a_failed_summary_keeps_the_transcript_for_resummarize(memory: Memory) -> None:
    when = datetime(2026, 3, 1, 12, tzinfo=UTC)
    memory.summarizer = llm("Sorry, I cannot produce JSON today.")
    with pytest.raises(SummaryGenerationError) as info:
        memory.end_session("u1", "s1", TRANSCRIPT, created_at=when)
    assert info.value.raw_output == "Sorry, I cannot produce JSON today."
    assert memory.pending_summaries("u1") == ["s1"]
    with pytest.raises(SessionNotFoundError):
        memory.get_session("u1", "s1")
    stored = memory.sessions.get_transcript("u1", "s1")
    assert [(m.role, m.content) for m in stored] == [(m["role"], m["content"]) for m in TRANSCRIPT]

    memory.summarizer = llm(llm_reply(editor="vim"))
    saved = memory.resummarize("u1", "s1")
    assert saved.created_at == when  # the session's own date, kept with the transcript
    assert saved.decisions_made == ["Use logical replication for the cutover."]
    assert saved.usage is not None
    assert (saved.usage.model, saved.usage.calls, saved.usage.prompt_tokens) == (
        "gpt-4o-mini",
        1,
        10,
    )
    assert saved.usage.cost_usd is not None
    assert saved.usage.cost_usd > 0
    assert memory.get_session("u1", "s1").usage == saved.usage
    assert memory.pending_summaries("u1") == []
    fact = memory.get_fact("u1", "editor")
    assert (fact.value, fact.source, fact.evidence) == ("vim", "session:s1", "I use vim.")
    assert fact.updated_at == when
    # Its words count for recall now that it has a summary.
    assert (
        memory.recall_relevant("u1", "PL/pgSQL procedures", top_k=1)[0].summary.session_id == "s1"
    )


def test_facts_from_sessions_resolve_by_recency_and_keep_history(memory: Memory) -> None:
    now = datetime.now(UTC)
    memory.summarizer = llm(llm_reply(editor="emacs"))
    memory.end_session("u1", "new", TRANSCRIPT, created_at=now - timedelta(days=1))
    # A backfilled older session saying otherwise does not overwrite the newer fact...
    memory.summarizer = llm(llm_reply(editor="nano"))
    memory.end_session("u1", "old", TRANSCRIPT, created_at=now - timedelta(days=30))
    assert memory.get_fact("u1", "editor").value == "emacs"
    # ...a later one does, and every value stays in the history, with its session.
    memory.summarizer = llm(llm_reply(editor="vim"))
    memory.end_session("u1", "latest", TRANSCRIPT, created_at=now)
    history = memory.fact_history("u1", "editor")
    assert [(f.value, f.source) for f in history] == [
        ("nano", "session:old"),
        ("emacs", "session:new"),
        ("vim", "session:latest"),
    ]


def test_unknown_run_is_a_typed_error(memory: Memory) -> None:
    with pytest.raises(RunNotFoundError):
        memory.get_run("no-such-run")


def test_forget_user_removes_everything(memory: Memory) -> None:
    memory.end_session("u1", "s1", TRANSCRIPT)
    memory.set_fact("u1", "k", "v")
    memory.save_transcript("u1", "s2", TRANSCRIPT)
    memory.forget_user("u1")
    assert memory.get_facts("u1") == []
    assert memory.list_sessions("u1") == []
    assert memory.pending_summaries("u1") == []
    with pytest.raises(SessionNotFoundError):
        memory.resummarize("u1", "s1")
    assert memory.recall_relevant("u1", "Postgres", top_k=3) == []


def test_async_memory_mirrors_memory() -> None:
    def public(cls: type) -> set[str]:
        return {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}

    assert public(AsyncMemory) == public(Memory)
    for name in public(Memory) - {"open", "from_settings", "for_tenant"}:
        assert inspect.iscoroutinefunction(getattr(AsyncMemory, name)), name
        sync_params = list(inspect.signature(getattr(Memory, name)).parameters)
        async_params = list(inspect.signature(getattr(AsyncMemory, name)).parameters)
        assert sync_params == async_params, name


def test_async_memory_works(tmp_path: Path) -> None:
    async def scenario() -> str:
        async with AsyncMemory.open(tmp_path / "data") as memory:
            await memory.set_fact("u2", "tone", "formal")
            await memory.end_session("u2", "s1", TRANSCRIPT)
            return await memory.build_continuation_context("u2", "billing migration")

    text = anyio.run(scenario)
    assert "tone: formal" in text
    assert "Session s1" in text


@pytest.mark.slow
def test_demo_runs_and_shows_exactly_once(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-m", "memory.cli", "demo", "--data-dir", str(tmp_path / "demo")],
        capture_output=True,
        text=True,
        timeout=240,
        check=False,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    out = result.stdout
    assert "killed with SIGKILL" in out
    assert "All side effects ran exactly once" in out
    assert "continuation context" in out
    effects = [
        line.split()[0] for line in (tmp_path / "demo" / "effects.log").read_text().splitlines()
    ]
    assert sorted(effects) == sorted(
        [
            "authenticate",
            "validate_order",
            "compute_amount",
            "issue_credit",
            "send_confirmation",
            "update_crm",
        ]
    )


def test_tenant_views_share_stores_but_not_data(memory: Memory) -> None:
    other = memory.for_tenant("acme")
    assert memory.for_tenant("acme") is other
    memory.set_fact("u1", "k", "default-tenant")
    other.set_fact("u1", "k", "acme-tenant")
    other.end_session("u1", "s1", TRANSCRIPT)
    assert memory.get_fact("u1", "k").value == "default-tenant"
    assert other.get_fact("u1", "k").value == "acme-tenant"
    assert memory.list_sessions("u1") == []
    assert memory.recall_relevant("u1", "Postgres", top_k=3) == []
    assert [h.summary.session_id for h in other.recall_relevant("u1", "Postgres", top_k=3)] == [
        "s1"
    ]
    other.close()  # a view does not close the shared stores
    memory.ping()


def test_run_operations_through_the_facade(memory: Memory) -> None:
    from tiers.errors import ApprovalPendingError, PlanMismatchError
    from tiers.task import input_hash

    plan = {"refund": 42.0, "to": "card"}
    run = memory.start_run("u1", "r-approve")
    run.step("prepare", lambda: {"ok": True})
    with pytest.raises(ApprovalPendingError):
        run.await_approval(plan)
    assert memory.get_run("r-approve").status.value == "paused"
    with pytest.raises(PlanMismatchError):
        memory.approve_run("r-approve", input_hash({"refund": 999}), by="ops")
    decision = memory.approve_run("r-approve", input_hash(plan), by="ops")
    assert decision.approved
    resumed = memory.start_run("u1", "r-approve")
    resumed.step("prepare", lambda: {"ok": True})
    assert resumed.await_approval(plan).by == "ops"
    first = memory.run_history("r-approve")[0]
    fork = memory.fork_run("r-approve", first.checkpoint_id, "r-fork")
    assert fork.run_id == "r-fork"
    assert [c.step for c in memory.run_history("r-fork")] == ["prepare"]
    assert memory.cancel_run("r-fork").status.value == "cancelled"


def test_bounded_durability_is_opt_in_and_flushes_on_demand(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match="durable=false"):
        Settings(data_dir=tmp_path, flush_interval=0.05)
    with Memory.open(tmp_path, durable=False, flush_interval=60) as memory:
        run = memory.start_run("u1", "r1")
        run.step("plan", lambda: {"ok": True})
        assert memory.kv.unflushed > 0  # type: ignore[attr-defined]
        memory.force_flush()
        assert memory.kv.unflushed == 0  # type: ignore[attr-defined]
        # An effect never runs ahead of its durable EffectInvoked record.
        seen: list[int] = []
        run.effect("charge", lambda: seen.append(memory.kv.unflushed))  # type: ignore[attr-defined]
        assert seen == [0]
