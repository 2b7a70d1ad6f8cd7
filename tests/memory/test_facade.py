"""The Memory facade end to end on the embedded default and on Redis."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys
from collections.abc import Callable, Iterator, Mapping, Sequence
from datetime import UTC, date, datetime, timedelta
from pathlib import Path
from typing import Any

import anyio
import pytest

from memory import (
    AsyncMemory,
    FactNotFoundError,
    InvalidInputError,
    InvalidTranscriptError,
    LiteLLMSummarizer,
    Memory,
    RunHandle,
    RunNotFoundError,
    ScopeManager,
    SessionNotFoundError,
    SessionSummary,
    SummaryGenerationError,
)
from memory.operations import OPERATIONS
from memory.settings import Settings
from summarizer import ExtractiveSummarizer, Summarization
from summarizer.tokens import count_tokens
from tests.summarizer.stub_server import StubLLMServer, StubReply
from tests.summarizer.test_llm import long_transcript, scripted_model
from tiers import keys
from tiers.errors import ConflictError
from tiers.models import Message

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


@pytest.fixture(params=["embedded", "redis", "redis_cluster"])
def memory(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Memory]:
    kv_url = None
    if request.param == "redis":
        kv_url = request.getfixturevalue("redis_url")
    elif request.param == "redis_cluster":
        # Durable on a cluster only when each commit waits for a replica (see the README);
        # a generous wait, as a replica's fsync on a loaded CI disk may outlast the default 1 s.
        kv_url = request.getfixturevalue("redis_cluster_url") + "?wait=1&wait_timeout_ms=60000"
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
    # Both expose exactly the declared operations, with the same parameters; AsyncMemory's
    # are coroutines but for those that build an instance (opening one, a tenant's view).
    def public(cls: type) -> set[str]:
        return {n for n, _ in inspect.getmembers(cls, inspect.isroutine) if not n.startswith("_")}

    declared = {op.name for op in OPERATIONS}
    assert len(declared) == len(OPERATIONS)  # each declared once
    assert public(Memory) == declared
    assert public(AsyncMemory) == declared
    for op in OPERATIONS:
        method = getattr(AsyncMemory, op.name)
        assert inspect.iscoroutinefunction(method) == op.awaitable, op.name
        sync_params = list(inspect.signature(getattr(Memory, op.name)).parameters)
        async_params = list(inspect.signature(method).parameters)
        assert sync_params == async_params, op.name


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
def test_demo_runs_shows_exactly_once_and_runs_again_on_the_same_folder(
    tmp_path: Path,
) -> None:
    demo_dir = tmp_path / "demo"
    for round_number in (1, 2):  # the second run reuses the folder of the first
        result = subprocess.run(
            [sys.executable, "-m", "memory.cli", "demo", "--data-dir", str(demo_dir)],
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )
        assert result.returncode == 0, (round_number, result.stdout[-3000:], result.stderr[-3000:])
        out = result.stdout
        assert "killed with SIGKILL" in out
        assert "failed on its own" not in out
        assert "All side effects ran exactly once" in out
        assert "continuation context" in out
        logs = sorted(demo_dir.glob("effects-*.log"))
        assert len(logs) == round_number  # a run of its own each time
        for log in logs:
            effects = [line.split()[0] for line in log.read_text().splitlines()]
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
    with pytest.raises(ApprovalPendingError, match=r"Memory\.approve_run/reject_run"):
        run.await_approval(plan)  # the error names the call a Memory user makes
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
    with Memory.open(tmp_path, durable=False, flush_interval=60, allow_volatile=True) as memory:
        run = memory.start_run("u1", "r1")
        run.step("plan", lambda: {"ok": True})
        assert memory.kv.unflushed > 0  # type: ignore[attr-defined]
        memory.force_flush()
        assert memory.kv.unflushed == 0  # type: ignore[attr-defined]
        # An effect never runs ahead of its durable EffectInvoked record.
        seen: list[int] = []
        run.effect("charge", lambda: seen.append(memory.kv.unflushed))  # type: ignore[attr-defined]
        assert seen == [0]


# -- bad arguments: a typed error naming the field, and nothing stored changes ------------------


def stored(memory: Memory) -> dict[str, list[tuple[str, bytes]]]:
    """Every KV record of the tenant's users u1/u2 (and the tenant's indexes), after indexing."""
    assert memory.flush(30)
    tenant = memory.tenant
    spaces = [
        keys.users_space(tenant),
        keys.runs_space(tenant),
        keys.session_outbox_space(tenant),
        keys.session_revisions_space(tenant),
    ]
    for user in ("u1", "u2"):
        spaces += [
            keys.facts_space(tenant, user),
            keys.fact_history_space(tenant, user),
            keys.sessions_space(tenant, user),
            keys.transcripts_space(tenant, user),
            keys.session_vectors_space(tenant, user),
        ]
    return {space: memory.kv.scan(space) for space in spaces}


Call = Callable[[Memory], object]


def _context_with_budget(max_tokens: object) -> Call:
    return lambda m: m.build_continuation_context("u1", "x", max_tokens=max_tokens)  # type: ignore[arg-type]


def _context_with_top_k(query: str, top_k: object) -> Call:
    return lambda m: m.continuation_context("u1", query, top_k=top_k)  # type: ignore[arg-type]


SURROGATE = "\ud800"
BAD_CALLS: list[tuple[str, Call, type[Exception], str]] = [
    # sessions
    ("save_session(list)", lambda m: m.save_session([1, 2]), InvalidInputError, "summary"),  # type: ignore[arg-type]
    ("save_session(None)", lambda m: m.save_session(None), InvalidInputError, "summary"),  # type: ignore[arg-type]
    ("save_session(str)", lambda m: m.save_session("x"), InvalidInputError, "summary"),  # type: ignore[arg-type]
    (
        "save_session(schema_version=99) mapping",
        lambda m: m.save_session({"user_id": "u1", "session_id": "s1", "schema_version": 99}),
        InvalidInputError,
        "schema_version",
    ),
    (
        "save_session(schema_version=99) model",
        lambda m: m.save_session(SessionSummary(user_id="u1", session_id="s1", schema_version=99)),
        InvalidInputError,
        "schema_version",
    ),
    (
        "save_session(surrogate text)",
        lambda m: m.save_session(
            {"user_id": "u1", "session_id": "s1", "task_description": SURROGATE}
        ),
        InvalidInputError,
        "task_description",
    ),
    (
        "save_session(created_at str)",
        lambda m: m.save_session({"user_id": "u1", "session_id": "s1", "created_at": "soon"}),
        InvalidInputError,
        "created_at",
    ),
    (
        "end_session(created_at='yesterday')",
        lambda m: m.end_session("u1", "s1", TRANSCRIPT, created_at="yesterday"),  # type: ignore[arg-type]
        InvalidInputError,
        "created_at",
    ),
    (
        "end_session(created_at=5)",
        lambda m: m.end_session("u1", "s1", TRANSCRIPT, created_at=5),  # type: ignore[arg-type]
        InvalidInputError,
        "created_at",
    ),
    (
        "end_session(created_at=date)",
        lambda m: m.end_session("u1", "s1", TRANSCRIPT, created_at=date(2025, 1, 1)),  # type: ignore[arg-type]
        InvalidInputError,
        "created_at",
    ),
    (
        "end_session(transcript str)",
        lambda m: m.end_session("u1", "s1", "hello"),  # type: ignore[arg-type]
        InvalidTranscriptError,
        "transcript",
    ),
    (
        "end_session(surrogate content)",
        lambda m: m.end_session("u1", "s1", [{"role": "user", "content": SURROGATE}]),
        InvalidTranscriptError,
        "transcript[0].content",
    ),
    (
        "end_session(bad user)",
        lambda m: m.end_session("no spaces", "s1", TRANSCRIPT),
        InvalidInputError,
        "user_id",
    ),
    (
        "save_transcript(created_at=5)",
        lambda m: m.save_transcript("u1", "s1", TRANSCRIPT, created_at=5),  # type: ignore[arg-type]
        InvalidInputError,
        "created_at",
    ),
    ("resummarize(bad id)", lambda m: m.resummarize("u1", ""), InvalidInputError, "session_id"),
    ("pending_summaries(5)", lambda m: m.pending_summaries(5), InvalidInputError, "user_id"),  # type: ignore[arg-type]
    ("get_session(bad id)", lambda m: m.get_session("u1", "a/b"), InvalidInputError, "session_id"),
    (
        "list_sessions(limit=-1)",
        lambda m: m.list_sessions("u1", limit=-1),
        InvalidInputError,
        "limit",
    ),
    (
        "delete_session(bad user)",
        lambda m: m.delete_session("a b", "s1"),
        InvalidInputError,
        "user_id",
    ),
    ("recall(query None)", lambda m: m.recall_relevant("u1", None), InvalidInputError, "query"),  # type: ignore[arg-type]
    (
        "recall(top_k=0)",
        lambda m: m.recall_relevant("u1", "x", top_k=0),
        InvalidInputError,
        "top_k",
    ),
    # continuation context
    (
        "context(query None)",
        lambda m: m.build_continuation_context("u1", None),  # type: ignore[arg-type]
        InvalidInputError,
        "query",
    ),
    *[
        (
            f"context(max_tokens={bad!r})",
            _context_with_budget(bad),
            InvalidInputError,
            "max_tokens",
        )
        for bad in ("100", 100.5, True, 0, -1)
    ],
    *[
        (
            f"continuation_context(query={query!r}, top_k={bad!r})",
            _context_with_top_k(query, bad),
            InvalidInputError,
            "top_k",
        )
        for query in ("", "postgres")
        for bad in (0, -1, True, "3", 101)
    ],
    # facts
    ("set_fact(NaN)", lambda m: m.set_fact("u1", "k", float("nan")), InvalidInputError, "value"),
    ("set_fact(1e400)", lambda m: m.set_fact("u1", "k", 1e400), InvalidInputError, "value"),
    (
        "set_fact(nested inf)",
        lambda m: m.set_fact("u1", "k", {"a": [float("-inf")]}),
        InvalidInputError,
        "value",
    ),
    ("set_fact(surrogate)", lambda m: m.set_fact("u1", "k", SURROGATE), InvalidInputError, "value"),
    ("set_fact(bad key)", lambda m: m.set_fact("u1", "a key", 1), InvalidInputError, "key"),
    (
        "set_fact(confidence=2)",
        lambda m: m.set_fact("u1", "k", 1, confidence=2),
        InvalidInputError,
        "confidence",
    ),
    (
        "set_facts(list of pairs)",
        lambda m: m.set_facts("u1", [("a", "b")]),  # type: ignore[arg-type]
        InvalidInputError,
        "facts",
    ),
    (
        "set_facts(one NaN)",
        lambda m: m.set_facts("u1", {"k": "new", "bad": float("nan")}),
        InvalidInputError,
        "facts.bad",
    ),
    ("get_fact(bad key)", lambda m: m.get_fact("u1", ""), InvalidInputError, "key"),
    ("fact_history(bad user)", lambda m: m.fact_history("", "k"), InvalidInputError, "user_id"),
    ("delete_fact(bad key)", lambda m: m.delete_fact("u1", "a:b"), InvalidInputError, "key"),
    ("forget_user(None)", lambda m: m.forget_user(None), InvalidInputError, "user_id"),  # type: ignore[arg-type]
    ("for_tenant(bad)", lambda m: m.for_tenant("a tenant"), InvalidInputError, "tenant"),
]


def test_bad_arguments_are_typed_errors_naming_the_field_and_change_nothing(
    memory: Memory,
) -> None:
    memory.set_fact("u1", "k", "kept")
    memory.set_fact("u1", "k", "kept, v2")
    memory.end_session("u1", "s1", TRANSCRIPT, created_at=datetime.now(UTC) - timedelta(days=1))
    memory.save_transcript("u2", "pending", TRANSCRIPT)
    before = stored(memory)
    assert before[keys.sessions_space(memory.tenant, "u1")]  # something to lose
    problems: list[str] = []
    for label, call, error, field in BAD_CALLS:
        try:
            call(memory)
        except error as exc:
            if getattr(exc, "field", None) != field:
                problems.append(f"{label}: field {getattr(exc, 'field', None)!r}, not {field!r}")
        except Exception as exc:
            problems.append(f"{label}: raised {type(exc).__module__}.{type(exc).__name__}: {exc}")
        else:
            problems.append(f"{label}: accepted")
        if stored(memory) != before:
            problems.append(f"{label}: changed what is stored")
            before = stored(memory)
    assert problems == []


@pytest.mark.parametrize(
    ("overrides", "field"),
    [
        ({"bogus": 1}, "bogus"),
        ({"max_value_bytes": -1}, "max_value_bytes"),
        ({"tenant": 3}, "tenant"),
    ],
)
def test_bad_settings_are_typed_errors_naming_the_setting(
    tmp_path: Path, overrides: dict[str, object], field: str
) -> None:
    with pytest.raises(InvalidInputError) as info:
        Memory.open(tmp_path, **overrides)
    assert info.value.field == field
    assert list(tmp_path.iterdir()) == []  # nothing was created


def test_a_naive_created_at_is_utc(memory: Memory) -> None:
    naive = datetime(2025, 6, 1, 9, 30)  # naive on purpose
    saved = memory.end_session("u1", "s1", TRANSCRIPT, created_at=naive)
    assert saved.created_at == naive.replace(tzinfo=UTC)
    assert memory.sessions.transcript_header("u1", "s1").created_at == naive.replace(tzinfo=UTC)
    backfilled = memory.save_session({"user_id": "u1", "session_id": "s2", "created_at": naive})
    assert backfilled.created_at == naive.replace(tzinfo=UTC)


# -- a replaced transcript makes its summary stale -------------------------------------------

MYSQL = [
    {"role": "user", "content": "Let us move the reporting service from Postgres back to MySQL."},
    {"role": "assistant", "content": "We decided to keep MySQL 8 for the reporting replicas."},
]


def test_re_ending_a_session_whose_summary_fails_leaves_it_pending(memory: Memory) -> None:
    memory.end_session("u1", "s1", TRANSCRIPT)
    assert memory.recall_relevant("u1", "Postgres logical replication", top_k=1)
    memory.summarizer = llm("not json")
    with pytest.raises(SummaryGenerationError):
        memory.end_session("u1", "s1", MYSQL)
    # The Postgres summary no longer describes the stored transcript: it is not served.
    assert memory.pending_summaries("u1") == ["s1"]
    with pytest.raises(SessionNotFoundError):
        memory.get_session("u1", "s1")
    assert memory.list_sessions("u1") == []
    assert memory.recall_relevant("u1", "Postgres logical replication", top_k=3) == []
    assert "replication" not in memory.build_continuation_context("u1", "Postgres")
    assert memory.flush(30)
    assert memory.index.ids(where={"tenant": "default", "user_id": "u1"}) == []
    # Summarized again, the session is back, describing the transcript it has now.
    memory.summarizer = ExtractiveSummarizer()
    summary = memory.resummarize("u1", "s1")
    assert "MySQL" in summary.render()
    assert memory.pending_summaries("u1") == []
    (hit,) = memory.recall_relevant("u1", "reporting replicas MySQL", top_k=1)
    assert hit.summary == summary


def test_saving_the_same_transcript_again_keeps_its_summary(memory: Memory) -> None:
    when = datetime(2026, 2, 1, tzinfo=UTC)
    summary = memory.end_session("u1", "s1", TRANSCRIPT, created_at=when)
    memory.save_transcript("u1", "s1", TRANSCRIPT, created_at=when)
    assert memory.get_session("u1", "s1") == summary
    assert memory.pending_summaries("u1") == []


class _ReplacingSummarizer:
    """Summarizes like the extractive one, but a concurrent end_session replaces the transcript."""

    name = "replacing"

    def __init__(self, memory: Memory) -> None:
        self.memory = memory
        self.inner = ExtractiveSummarizer()

    def summarize(
        self,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        user_id: str,
        session_id: str,
        created_at: datetime | None = None,
    ) -> Summarization:
        result = self.inner.summarize(
            transcript, user_id=user_id, session_id=session_id, created_at=created_at
        )
        self.memory.save_transcript(user_id, session_id, MYSQL)
        return result


def test_a_summary_of_a_transcript_replaced_meanwhile_is_not_saved(memory: Memory) -> None:
    memory.summarizer = _ReplacingSummarizer(memory)
    with pytest.raises(ConflictError, match="summarize it again"):
        memory.end_session("u1", "s1", TRANSCRIPT)
    assert memory.pending_summaries("u1") == ["s1"]
    memory.summarizer = ExtractiveSummarizer()
    assert "MySQL" in memory.resummarize("u1", "s1").render()


# -- facts learned from a session are never dated in the future -----------------------------


def test_an_explicit_fact_wins_over_one_learned_from_a_future_dated_session(
    memory: Memory,
) -> None:
    memory.end_session(
        "u1",
        "s1",
        [{"role": "user", "content": "I prefer email rather than phone calls."}],
        created_at=datetime.now(UTC) + timedelta(hours=2),
    )
    learned = memory.get_fact("u1", "preference.email")
    assert learned.source == "session:s1"
    assert learned.updated_at <= datetime.now(UTC)
    fact = memory.set_fact("u1", "preference.email", "phone calls are fine now")
    assert fact.value == "phone calls are fine now"
    assert memory.get_fact("u1", "preference.email").value == "phone calls are fine now"
    with pytest.raises(FactNotFoundError):
        memory.get_fact("u1", "no-such-fact")


# -- summarizer settings reach the summarizer --------------------------------------------------


def test_summarizer_settings_from_the_environment_reach_the_summarizer(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with StubLLMServer(fallback=scripted_model) as stub:
        for name, value in {
            "DATA_DIR": str(tmp_path),
            "SUMMARIZER_MODEL": "openai/my-local-4k",  # a model litellm does not know
            "SUMMARIZER_API_BASE": stub.api_base,
            "SUMMARIZER_API_KEY": "test",
            "SUMMARIZER_MAX_INPUT_TOKENS": "300",
            "SUMMARIZER_TIMEOUT": "7.5",
            "SUMMARIZER_MAX_RETRIES": "0",
            "SUMMARIZER_MAX_TRANSIENT_RETRIES": "0",
        }.items():
            monkeypatch.setenv(f"TIERMEM_{name}", value)
        with Memory.from_settings() as memory:
            summarizer = memory.summarizer
            assert isinstance(summarizer, LiteLLMSummarizer)
            assert (
                summarizer.max_input_tokens,
                summarizer.timeout,
                summarizer.max_retries,
                summarizer.max_transient_retries,
            ) == (300, 7.5, 0, 0)
            # The budget is used: the long transcript is map-reduced in chunks of 300 tokens.
            memory.end_session("u1", "long", long_transcript())
            maps = [
                r for r in stub.requests if not r["messages"][0]["content"].startswith("You merge")
            ]
            assert len(maps) >= 5
            # No retries: one invalid reply is the end of it.
            stub.fallback = None
            stub.enqueue(StubReply.chat("not json"))
            calls = len(stub.requests)
            with pytest.raises(SummaryGenerationError):
                memory.end_session("u1", "short", TRANSCRIPT)
            assert len(stub.requests) == calls + 1
            assert memory.pending_summaries("u1") == ["short"]


def test_run_retention_and_snapshots_come_from_settings(tmp_path: Path) -> None:
    with Memory.open(tmp_path, run_retention_days=2, snapshot_every=3) as memory:
        run = memory.start_run("u1", "r1")
        for n in range(4):
            run.step("s", lambda n=n: n)
        assert run.info.snapshot_event_seq > 0  # snapshotted after 3 events, not 64
        run.complete()
        view = memory.for_tenant("acme")
        view.start_run("u1", "r1").complete()

        ended = memory.get_run("r1").finished_at
        assert ended is not None
        assert memory.sweep_runs(now=ended + timedelta(days=1)) == []
        assert memory.sweep_runs(now=ended + timedelta(days=3)) == ["r1"]
        with pytest.raises(RunNotFoundError):
            memory.get_run("r1")
        # A tenant view keeps the retention it came from, and only sweeps its own runs.
        assert view.sweep_runs(now=ended + timedelta(days=1)) == []
        assert view.sweep_runs(now=ended + timedelta(days=3)) == ["r1"]
        with pytest.raises(InvalidInputError) as bad:
            memory.sweep_runs(now="tomorrow")  # type: ignore[arg-type]
        assert bad.value.field == "now"


def _scoped_script(run: RunHandle, scopes: ScopeManager, calls: list[str], *, stop: str) -> None:
    """Three steps that change the scopes; returns early after ``stop`` (a crash)."""

    def plan() -> str:
        calls.append("plan")
        scopes.working.put("plan", ["refund", "notify"])
        scopes.record("step", "planned the refund")
        return "planned"

    def act() -> str:
        calls.append("act")
        scopes.record("tool", "issued the credit")
        return "acted"

    def hand_off() -> str:
        calls.append("hand_off")
        scopes.phase_handoff("refund done", next_phase="follow-up")
        return "handed off"

    for name, fn in (("plan", plan), ("act", act), ("hand_off", hand_off)):
        run.step(name, fn, scope=scopes.snapshot)
        if name == stop:
            return


def test_a_resumed_run_gets_its_scopes_back_exactly(tmp_path: Path) -> None:
    with Memory.open(tmp_path) as memory:
        run = memory.start_run("u1", "r1")
        assert run.latest_scope() is None
        scopes = ScopeManager("You are a refund agent.")
        calls: list[str] = []
        _scoped_script(run, scopes, calls, stop="act")
        at_crash = scopes.snapshot()
        # The checkpoint holds the scopes as the step left them, not as it found them.
        assert memory.tasks.latest_checkpoint("r1").scope == at_crash  # type: ignore[union-attr]

    with Memory.open(tmp_path) as memory:
        run = memory.start_run("u1", "r1")  # a new worker resumes
        saved = run.latest_scope()
        assert saved is not None
        scopes = ScopeManager.restore(saved)
        assert scopes.snapshot() == at_crash
        calls = []
        _scoped_script(run, scopes, calls, stop="hand_off")
        assert calls == ["hand_off"]  # the committed steps replayed without running again
        assert [e.text for e in scopes.trace.entries()][:2] == [
            "planned the refund",
            "issued the credit",
        ]
        assert scopes.phase == "follow-up"
        assert scopes.working.keys() == ()  # the handoff cleared the working memory
        assert run.latest_scope() == scopes.snapshot()
        with pytest.raises(InvalidInputError) as bad:
            run.step("x", lambda: 1, scope=lambda: ["not", "a", "mapping"])  # type: ignore[arg-type, return-value]
        assert bad.value.field == "scope"
