"""memory.client.MemoryClient against a real `tiermem serve` on a free loopback port."""

from __future__ import annotations

import inspect
import json
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest

from memory import (
    ApprovalPendingError,
    BackendUnavailableError,
    BudgetExceededError,
    Charged,
    EffectOutcomeUnknownError,
    FactNotFoundError,
    InputMismatchError,
    InvalidInputError,
    LeaseHeldError,
    Memory,
    RunHandle,
    RunNotFoundError,
    RunStateError,
    RunStatus,
    SessionNotFoundError,
    SessionSummary,
    StaleWriterError,
)
from memory.apikeys import ApiKeyRegistry
from memory.client import AuthenticationError, MemoryClient, PermissionDeniedError, RemoteRun
from memory.operations import OPERATIONS, RUN_OPERATIONS
from tests.api.test_routes import SUMMARY, TRANSCRIPT
from tests.conftest import free_port
from tests.servers import wait_ready
from tiers.backends import open_kv_store
from tiers.errors import EffectNotFoundError
from tiers.ids import run_id_for
from tiers.task import EffectStatus, EventKind

TIERMEM = str(Path(sys.executable).parent / "tiermem")


@dataclass
class Served:
    base_url: str
    key: str
    read_only_key: str
    yara_key: str  # bound to user yara
    log: Path
    process: subprocess.Popen[bytes]


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Served]:
    work = tmp_path_factory.mktemp("served")
    env = {
        **os.environ,
        "TIERMEM_DATA_DIR": str(work / "data"),
        "TIERMEM_DURABLE": "false",
        "TIERMEM_ALLOW_VOLATILE": "true",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    env.pop("TIERMEM_KV_URL", None)

    def new_key(*extra: str) -> str:  # through the CLI, as an operator would
        done = subprocess.run(
            [TIERMEM, "keys", "create", "--tenant", "client-test", *extra],
            env=env,
            capture_output=True,
            text=True,
            check=True,
        )
        return done.stdout.strip()

    key = new_key("--read-only")
    # The second key straight from the registry (one CLI start-up less); SQLite is multi-process safe.
    kv = open_kv_store(str(work / "data" / "tiermem.sqlite3"))
    read_only_key, key = key, ApiKeyRegistry(kv).create("client-test")[0]
    yara_key = ApiKeyRegistry(kv).create("client-test", user_id="yara")[0]
    kv.close()
    port = free_port()
    log = work / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [TIERMEM, "serve", "--port", str(port)], env=env, stdout=out, stderr=out
        )
    base_url = f"http://127.0.0.1:{port}"
    wait_ready(f"{base_url}/readyz", process, log, what="tiermem serve")
    served = Served(base_url, key, read_only_key, yara_key, log, process)
    yield served
    if process.poll() is None:
        process.kill()
        process.wait()


@pytest.fixture
def client(served: Served) -> Iterator[MemoryClient]:
    with MemoryClient(served.base_url, served.key) as memory_client:
        yield memory_client


def test_user_facts(client: MemoryClient) -> None:
    first = client.set_fact("alice", "language", "fr")
    assert (first.user_id, first.key, first.value, first.source) == (
        "alice",
        "language",
        "fr",
        "api",
    )
    rated = client.set_fact(
        "alice", "diet", "vegan", source="session:s1", confidence=0.7, evidence="I'm vegan."
    )
    assert (rated.confidence, rated.evidence) == (0.7, "I'm vegan.")
    assert client.get_fact("alice", "diet") == rated
    client.set_facts("alice", {"language": "de", "tone": "short"}, source="crm")
    assert client.get_fact("alice", "language").value == "de"
    assert [f.key for f in client.get_facts("alice")] == ["diet", "language", "tone"]
    assert [f.value for f in client.fact_history("alice", "language")] == ["fr", "de"]
    assert client.delete_fact("alice", "tone") is True
    assert client.delete_fact("alice", "tone") is False
    with pytest.raises(FactNotFoundError):
        client.get_fact("alice", "tone")
    client.forget_user("alice")
    assert client.get_facts("alice") == []


def test_sessions_recall_and_context(client: MemoryClient) -> None:
    saved = client.save_session(SessionSummary(user_id="bob", session_id="s-db", **SUMMARY))
    assert client.get_session("bob", "s-db") == saved
    from_transcript = client.end_session("bob", "s-chat", TRANSCRIPT)
    assert from_transcript.session_id == "s-chat"
    assert "Postgres" in from_transcript.task_description
    assert client.pending_summaries("bob") == []
    again = client.resummarize("bob", "s-chat")  # the extractive summarizer is deterministic
    assert again.model_dump(exclude={"created_at"}) == from_transcript.model_dump(
        exclude={"created_at"}
    )
    assert again.created_at == from_transcript.created_at
    assert {s.session_id for s in client.list_sessions("bob")} == {"s-db", "s-chat"}
    assert len(client.list_sessions("bob", limit=1)) == 1

    hits = client.recall_relevant("bob", "stored procedures in PL/pgSQL", top_k=1)
    assert len(hits) == 1
    assert -1 <= hits[0].score <= 1

    context = client.continuation_context("bob", "database migration", 400)
    assert 0 < context.tokens <= 400
    assert {s.name for s in context.sections} >= {"sessions"}
    assert client.build_continuation_context("bob", "database migration", 400) == context.text

    assert client.delete_session("bob", "s-db") is True
    assert client.delete_session("bob", "s-db") is False
    with pytest.raises(SessionNotFoundError):
        client.get_session("bob", "s-db")


def test_runs_and_fencing(client: MemoryClient) -> None:
    run = client.start_run("carol", "refund-9")
    assert (run.run_id, run.epoch) == ("refund-9", 1)
    ckpt = run.append_checkpoint(
        "charge", {"id": "ch_1"}, input={"cents": 500}, idempotency_key="c1"
    )
    assert client.get_checkpoint("refund-9", ckpt.checkpoint_id) == ckpt
    with pytest.raises(InputMismatchError) as mismatch:
        run.append_checkpoint("charge", {"id": "ch_1"}, input={"cents": 900}, idempotency_key="c1")
    assert mismatch.value.idempotency_key == "c1"

    resumed = client.start_run("carol", "refund-9")
    assert resumed.epoch == 2
    with pytest.raises(StaleWriterError):
        run.append_checkpoint("late", None)
    resumed.append_checkpoint("notify", "sent")
    assert [c.step for c in client.run_history("refund-9")] == ["charge", "notify"]
    done = resumed.complete({"ok": True})
    assert (done.status, done.result) == (RunStatus.COMPLETED, {"ok": True})
    assert client.get_run("refund-9") == done

    fork = client.fork_run("refund-9", ckpt.checkpoint_id, "refund-9-b")
    assert (fork.parent_run_id, fork.head_seq) == ("refund-9", 1)
    with pytest.raises(RunStateError, match="waits for no approval"):
        client.approve_run("refund-9-b", "0" * 64, by="ops")

    other = client.start_run("carol")
    assert client.cancel_run(other.run_id).status is RunStatus.CANCELLED
    assert [r.run_id for r in client.list_runs(status=RunStatus.CANCELLED)] == [other.run_id]
    with pytest.raises(RunNotFoundError):
        client.get_run("no-such-run")


def test_run_lists_page_through_the_client(client: MemoryClient) -> None:
    for run_id in ("pg-3", "pg-1", "pg-2"):
        client.start_run("paula", run_id).complete(None)
    first = client.list_runs(user_id="paula", limit=2)
    assert [r.run_id for r in first] == ["pg-1", "pg-2"]
    rest = client.list_runs(user_id="paula", limit=2, after=first[-1].run_id)
    assert [r.run_id for r in rest] == ["pg-3"]
    assert [r.run_id for r in client.list_runs(user_id="paula")] == ["pg-3", "pg-1", "pg-2"]
    assert len(client.list_resumable_runs(limit=1)) <= 1
    assert all(r.run_id > "pg-1" for r in client.list_resumable_runs(after="pg-1"))
    with pytest.raises(InvalidInputError):
        client.list_runs(after="no spaces")


def test_a_live_lease_is_the_client_handles_alone(client: MemoryClient) -> None:
    run = client.start_run("carol", "leased-9", lease_ttl=60)
    with pytest.raises(LeaseHeldError) as held:
        client.start_run("carol", "leased-9", lease_ttl=60)  # the same client, another call
    assert run.worker_id is not None
    assert (held.value.run_id, held.value.owner) == ("leased-9", run.info.lease_owner)
    assert held.value.expires_at
    run.append_checkpoint("still-mine", 1)
    again = client.start_run("carol", "leased-9", worker_id=run.worker_id, lease_ttl=60)
    assert (again.epoch, again.worker_id) == (2, run.worker_id)
    assert client.start_run("carol", "leased-9", steal=True).epoch == 3


def test_effects_approvals_and_time_travel_through_the_client(client: MemoryClient) -> None:
    run = client.start_run("erin", "order-5")
    calls: list[str] = []

    def charge(key: str) -> object:
        calls.append(key)
        return {"id": "ch_5"}

    assert run.effect("charge", charge, idempotency_key="o5") == {"id": "ch_5"}
    assert run.effect("charge", charge, idempotency_key="o5") == {"id": "ch_5"}  # replayed
    assert calls == ["o5"]
    assert run.record_effect("o5", {"id": "ch_5"}) == {"id": "ch_5"}
    assert run.begin_effect("ship", idempotency_key="s5").invoke

    resumed = client.start_run("erin", "order-5")
    with pytest.raises(EffectOutcomeUnknownError) as unknown:
        resumed.begin_effect("ship", idempotency_key="s5")
    assert unknown.value.effect_keys == ["s5"]
    assert client.get_run("order-5").unknown_effects == ["s5"]
    assert "order-5" not in [r.run_id for r in client.list_resumable_runs()]
    with pytest.raises(InvalidInputError):
        client.resolve_effect("order-5", "s5")
    with pytest.raises(EffectNotFoundError):
        client.resolve_effect("order-5", "nope", rerun=True)
    settled = client.resolve_effect("order-5", "s5", output=None, by="ops")
    assert (settled.status, settled.output, settled.source) == (
        EffectStatus.RECORDED,
        None,
        "operator",
    )
    assert [(e.key, e.status) for e in client.run_effects("order-5")] == [
        ("o5", EffectStatus.RECORDED),
        ("s5", EffectStatus.RECORDED),
    ]
    # Paged over HTTP: a page after the last key of the previous one.
    assert [e.key for e in client.run_effects("order-5", limit=1)] == ["o5"]
    assert [e.key for e in client.run_effects("order-5", after_key="o5", limit=1)] == ["s5"]
    assert client.run_effects("order-5", after_key="s5") == []
    assert client.run_effects("order-5", limit=0) == []
    with pytest.raises(InvalidInputError):
        client.run_effects("order-5", limit=-1)

    with pytest.raises(ApprovalPendingError) as pending:
        resumed.await_approval({"refund": 5}, key="gate")
    client.approve_run("order-5", pending.value.plan_hash, by="ops")
    assert resumed.await_approval({"refund": 5}, key="gate").approved

    step = resumed.append_checkpoint("note", "n", state={"note": True})
    assert client.run_state_at("order-5", step.checkpoint_id) == {"note": True}
    history = client.run_history("order-5")
    assert client.run_state_at("order-5", history[0].checkpoint_id) == {}
    edited = client.update_run_state("order-5", history[0].checkpoint_id, {"x": 1}, by="ops")
    assert client.run_state_at("order-5", edited.checkpoint_id) == {"x": 1}
    with pytest.raises(StaleWriterError):
        resumed.begin_effect("more", idempotency_key="m5")  # the edit revoked the lease
    assert "order-5" in [r.run_id for r in client.list_resumable_runs()]
    events = client.run_events("order-5")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert events[-1].kind is EventKind.STATE_UPDATED
    assert [e.seq for e in client.run_events("order-5", after_seq=1, limit=2)] == [2, 3]


def test_run_primitives_through_the_client(client: MemoryClient) -> None:
    run = client.start_run("dora", external_id="thread:dora/1")
    assert (run.run_id, run.info.external_id) == (run_id_for("thread:dora/1"), "thread:dora/1")
    made = [run.append_checkpoint("s", n, idempotency_key=f"k{n}") for n in range(1, 6)]
    assert client.get_checkpoint(run.run_id, made[1].checkpoint_id) == made[1]
    assert client.checkpoint_for_key(run.run_id, "k3") == made[2]
    assert client.checkpoint_for_key(run.run_id, "k9") is None
    newest = client.run_history(run.run_id, newest_first=True, limit=2)
    assert [c.seq for c in newest] == [5, 4]
    older = client.run_history(run.run_id, newest_first=True, limit=2, before_seq=newest[-1].seq)
    assert [c.seq for c in older] == [3, 2]
    assert [c.seq for c in client.run_history(run.run_id, after_seq=3)] == [4, 5]
    assert client.run_history(run.run_id) == made

    assert client.delete_run(run.run_id) is True
    assert client.delete_run(run.run_id) is False
    with pytest.raises(RunNotFoundError):
        client.checkpoint_for_key(run.run_id, "k3")
    with pytest.raises(RunNotFoundError):
        run.append_checkpoint("late", 0)
    again = client.start_run("dora", external_id="thread:dora/1")  # a new run, epoch 1 again
    assert (again.run_id, again.epoch, again.info.head_seq) == (run.run_id, 1, 0)
    with pytest.raises(RunNotFoundError):  # the old lease cannot write into the new run
        run.append_checkpoint("late", 0)
    assert client.run_history(again.run_id) == []


def test_typed_errors(served: Served, client: MemoryClient) -> None:
    with pytest.raises(InvalidInputError) as bad_id:
        client.get_facts("not/an id")
    assert bad_id.value.field == "user_id"
    with pytest.raises(InvalidInputError) as blank:
        client.recall_relevant("dave", "   ")
    assert blank.value.field == "query"
    with pytest.raises(AuthenticationError) as unauthenticated:
        MemoryClient(served.base_url, "tmk_000000000000_" + "A" * 43).get_facts("dave")
    assert unauthenticated.value.status == 401
    reader = MemoryClient(served.base_url, served.read_only_key)
    assert reader.get_facts("dave") == []
    with pytest.raises(PermissionDeniedError):
        reader.set_fact("dave", "k", 1)
    with pytest.raises(BackendUnavailableError, match="cannot reach"):
        MemoryClient(f"http://127.0.0.1:{free_port()}", served.key, timeout=2).get_facts("dave")
    client.ping()


def test_a_spent_budget_is_raised_through_the_client(served: Served, client: MemoryClient) -> None:
    run = client.start_run("bea", "bea-run", budget_tokens=10, budget_cost=2.0)
    run.effect("llm", lambda key: Charged("a", tokens=10), idempotency_key="e1")
    with pytest.raises(BudgetExceededError, match=r"POST /v1/runs/bea-run:set-budget"):
        run.effect("llm", lambda key: "b", idempotency_key="e2")
    info = client.set_budget("bea-run", tokens=20, by="ops")
    assert (info.budget_tokens, info.budget_cost, info.spent_tokens) == (20, 2.0, 10)
    assert run.effect("llm", lambda key: "b", idempotency_key="e2") == "b"
    assert client.set_budget("bea-run", cost=None).budget_cost is None
    assert client.get_run("bea-run").budget_tokens == 20
    (change, _) = [e for e in client.run_events("bea-run") if e.kind is EventKind.BUDGET_SET]
    assert (change.data["budget_tokens"], change.data["by"]) == (20, "ops")
    with pytest.raises(InvalidInputError) as negative:
        client.set_budget("bea-run", tokens=-1)
    assert negative.value.field == "budget_tokens"
    with pytest.raises(InvalidInputError):
        client.set_budget("bea-run")
    with pytest.raises(RunNotFoundError):
        client.set_budget("no-such-run", tokens=1)
    reader = MemoryClient(served.base_url, served.read_only_key)
    with reader, pytest.raises(PermissionDeniedError):
        reader.set_budget("bea-run", tokens=100)
    yara = MemoryClient(served.base_url, served.yara_key)
    with yara, pytest.raises(RunNotFoundError):
        yara.set_budget("bea-run", tokens=100)
    assert client.get_run("bea-run").budget_tokens == 20


def test_a_user_bound_key_through_the_client(served: Served, client: MemoryClient) -> None:
    zeke = client.start_run("zeke", "zeke-run")
    zeke.append_checkpoint("s", 1)
    client.set_fact("zeke", "k", "v")
    with MemoryClient(served.base_url, served.yara_key) as yara:
        # Yara's own data: everything works, the summary job included.
        yara.set_fact("yara", "lang", "fr")
        assert [f.key for f in yara.get_facts("yara")] == ["lang"]
        assert yara.end_session("yara", "s-1", TRANSCRIPT).session_id == "s-1"
        assert "Postgres" in yara.build_continuation_context("yara", "database", 400)
        run = yara.start_run("yara", "yara-run")
        run.append_checkpoint("s", 1)
        assert [r.run_id for r in yara.list_runs()] == ["yara-run"]  # not zeke's
        assert {r.run_id for r in yara.list_resumable_runs()} <= {"yara-run"}
        # Another user: 403 where the call names the user, 404 for the user's run.
        for refused in (
            lambda: yara.get_facts("zeke"),
            lambda: yara.set_fact("zeke", "k", "hijacked"),
            lambda: yara.forget_user("zeke"),
            lambda: yara.start_run("zeke"),
            lambda: yara.list_runs(user_id="zeke"),
        ):
            with pytest.raises(PermissionDeniedError, match="bound to user 'yara'"):
                refused()
        with pytest.raises(RunNotFoundError):
            yara.get_run("zeke-run")
        with pytest.raises(RunNotFoundError):
            yara.run_history("zeke-run")
        with pytest.raises(RunNotFoundError):
            yara.cancel_run("zeke-run")
    assert client.get_fact("zeke", "k").value == "v"
    assert client.get_run("zeke-run").status is RunStatus.RUNNING


def test_client_methods_match_the_library() -> None:
    # The client offers exactly the operations declared remote, each with the library's
    # parameters (but those the service fills itself or that cannot cross the wire).
    def public(cls: type) -> set[str]:
        return {n for n, _ in inspect.getmembers(cls, inspect.isfunction) if not n.startswith("_")}

    for ops, library_cls, remote_cls in (
        (OPERATIONS, Memory, MemoryClient),
        (RUN_OPERATIONS, RunHandle, RemoteRun),
    ):
        remote_ops = [op for op in ops if op.remote]
        assert public(remote_cls) == {op.name for op in remote_ops}
        for op in remote_ops:
            library = [
                name
                for name in inspect.signature(getattr(library_cls, op.name)).parameters
                if name not in op.local_params
            ]
            remote = inspect.signature(getattr(remote_cls, op.name)).parameters
            assert list(remote) == library, op.name


def test_logs_are_json_with_request_ids_and_sigterm_shuts_down_cleanly(served: Served) -> None:
    httpx.get(
        f"{served.base_url}/v1/users/erin/facts",
        headers={"Authorization": f"Bearer {served.key}", "X-Request-ID": "trace-123"},
    )
    served.process.send_signal(signal.SIGTERM)
    # Uvicorn shuts down gracefully, then re-raises the signal so the parent sees it.
    assert served.process.wait(30) in (0, -signal.SIGTERM)
    lines = [json.loads(line) for line in served.log.read_text().splitlines() if line.strip()]
    access = [entry for entry in lines if entry.get("request_id") == "trace-123"]
    assert access, lines[-5:]
    assert access[0]["logger"] == "tiermem.access"
    assert (access[0]["route"], access[0]["status"], access[0]["tenant"]) == (
        "/v1/users/{user_id}/facts",
        200,
        "client-test",
    )
    messages = [entry["msg"] for entry in lines]
    assert "tiermem stopped" in messages
    assert messages.index("tiermem stopped") < messages.index("Application shutdown complete.")
    assert not any("Traceback" in entry.get("exc_info", "") for entry in lines)
