"""``tiermem mcp``: the real MCP client against the real server, over stdio and streamable HTTP.

Every server runs on an embedded data dir (SQLite, embedded Chroma, the bundled
embedder). Embedded Chroma allows one process per data dir, so the data is set
up with the library before a server starts, and checked after it stopped.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import anyio
import httpx
import pytest
from mcp import Client, ClientSession, StdioServerParameters, stdio_client
from mcp.client.streamable_http import streamable_http_client
from mcp.shared._httpx_utils import create_mcp_http_client
from mcp.shared.exceptions import MCPError
from mcp_types import CallToolResult, Implementation, TextContent
from mcp_types.version import LATEST_HANDSHAKE_VERSION

from memory import ApprovalPendingError, BudgetExceededError, Charged, Memory, SessionSummary
from memory.apikeys import ApiKeyRegistry
from memory.integrations.mcp import TOOL_NAMES, McpCaller, build_server
from tests.conftest import free_port
from tests.servers import wait_ready
from tiers.backends import open_kv_store
from tiers.task import EventKind

TIERMEM = str(Path(sys.executable).parent / "tiermem")
CLIENT = Implementation(name="tiermem-tests", version="1.0")

EXPECTED_TOOLS = {
    "build_continuation_context",
    "recall_relevant",
    "save_session",
    "end_session",
    "get_fact",
    "get_facts",
    "set_fact",
    "delete_fact",
    "fact_history",
    "get_run",
    "list_runs",
    "pending_approvals",
    "approve_run",
    "reject_run",
    "set_budget",
}

TRANSCRIPT = [
    {"role": "user", "content": "Can you plan the Kubernetes upgrade for the staging cluster?"},
    {"role": "assistant", "content": "We decided to upgrade the control plane first."},
    {"role": "assistant", "content": "Next step: drain the old node pool on Monday."},
]


def plans(tenant: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Run id -> (gate key, plan) of the runs :func:`seed` pauses; plans differ per tenant."""
    return {
        "deploy-1": ("deploy", {"action": "deploy", "service": "billing", "tenant": tenant}),
        "deploy-2": ("refund", {"action": "refund", "amount": 89.99, "tenant": tenant}),
    }


def seed(data_dir: Path, tenant: str) -> dict[str, str]:
    """A fact, a session, two runs paused at approval gates and a completed run, in ``tenant``.

    Returns:
        Run id -> the plan hash its gate waits on.
    """
    with Memory.open(data_dir, durable=False, allow_volatile=True) as root:
        memory = root.for_tenant(tenant)
        memory.set_fact("alice", "team", f"platform-{tenant}")
        memory.save_session(
            SessionSummary(
                user_id="alice",
                session_id="s-old",
                task_description=f"Quarterly report for {tenant}",
            )
        )
        hashes = {}
        for run_id, (gate, plan) in plans(tenant).items():
            handle = memory.start_run("alice", run_id)
            with pytest.raises(ApprovalPendingError) as pending:
                handle.await_approval(plan, key=gate)
            hashes[run_id] = pending.value.plan_hash
        memory.start_run("bob", "done-1").complete({"ok": True})
    return hashes


def server_env(data_dir: Path, **extra: str) -> dict[str, str]:
    """The environment of a server process: only this test's TIERMEM_* settings."""
    env = {k: v for k, v in os.environ.items() if not k.startswith("TIERMEM_")}
    env.update(
        TIERMEM_DATA_DIR=str(data_dir),
        TIERMEM_DURABLE="false",
        TIERMEM_ALLOW_VOLATILE="true",
        LITELLM_LOCAL_MODEL_COST_MAP="True",
        **extra,
    )
    return env


@pytest.fixture(autouse=True)
def _no_outside_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    # The library calls of this test read TIERMEM_* too: none may point elsewhere.
    for name in list(os.environ):
        if name.startswith("TIERMEM_"):
            monkeypatch.delenv(name)


def text_of(result: CallToolResult) -> str:
    assert len(result.content) == 1
    block = result.content[0]
    assert isinstance(block, TextContent)
    return block.text


async def call(session: ClientSession | Client, tool: str, **args: Any) -> dict[str, Any]:
    """Call a tool that must succeed; its text is the JSON of its structured result."""
    result = await session.call_tool(tool, args)
    assert not result.is_error, text_of(result)
    assert result.structured_content is not None
    assert json.loads(text_of(result)) == result.structured_content
    return result.structured_content


async def fails(session: ClientSession | Client, tool: str, **args: Any) -> str:
    """Call a tool that must fail with a tool error; returns its text."""
    result = await session.call_tool(tool, args)
    assert result.is_error, f"{tool} should have failed: {text_of(result)}"
    return text_of(result)


async def exercise_every_tool(
    session: ClientSession, *, tenant: str, hashes: dict[str, str], by: str
) -> None:
    """List the tools and call each one with real arguments, checking what comes back."""
    listed = await session.list_tools()
    assert {tool.name for tool in listed.tools} == EXPECTED_TOOLS == set(TOOL_NAMES)
    for tool in listed.tools:
        assert tool.description, tool.name
        properties = tool.input_schema.get("properties", {})
        assert "ctx" not in properties, tool.name
        assert all(p.get("description") for p in properties.values()), tool.name
        assert tool.annotations is not None
        assert tool.annotations.read_only_hint is (tool.name in _READ_TOOLS), tool.name

    # -- user facts
    seeded = await call(session, "get_fact", user_id="alice", key="team")
    assert seeded["value"] == f"platform-{tenant}"
    first = await call(
        session, "set_fact", user_id="alice", key="language", value="fr", evidence="Je parle fr."
    )
    assert (first["value"], first["source"], first["evidence"]) == ("fr", "mcp", "Je parle fr.")
    richer = {"primary": "fr", "also": ["en"]}
    await call(session, "set_fact", user_id="alice", key="language", value=richer, confidence=0.8)
    got = await call(session, "get_fact", user_id="alice", key="language")
    assert (got["value"], got["confidence"]) == (richer, 0.8)
    facts = await call(session, "get_facts", user_id="alice")
    assert [(f["key"], f["value"]) for f in facts["facts"]] == [
        ("language", richer),
        ("team", f"platform-{tenant}"),
    ]
    history = await call(session, "fact_history", user_id="alice", key="language")
    assert [v["value"] for v in history["history"]] == ["fr", richer]
    await call(session, "set_fact", user_id="alice", key="scratch", value=1)
    assert (await call(session, "delete_fact", user_id="alice", key="scratch"))["deleted"] is True
    assert (await call(session, "delete_fact", user_id="alice", key="scratch"))["deleted"] is False
    assert "FactNotFoundError" in await fails(session, "get_fact", user_id="alice", key="scratch")
    scratch = await call(session, "fact_history", user_id="alice", key="scratch")
    assert [(v["value"], v["source"]) for v in scratch["history"]] == [
        (1, "mcp"),
        (None, "deleted"),
    ]

    # -- sessions
    saved = await call(
        session,
        "save_session",
        user_id="alice",
        session_id="s-db",
        task_description="Billing database migration to Postgres",
        decisions_made=["Move billing to Postgres 16"],
        next_recommended_steps=["Dry-run the migration on a copy"],
        created_at="2026-01-05T10:00:00Z",
    )
    assert (saved["session_id"], saved["decisions_made"]) == (
        "s-db",
        ["Move billing to Postgres 16"],
    )
    assert saved["created_at"].startswith("2026-01-05T10:00:00")
    ended = await call(
        session, "end_session", user_id="alice", session_id="s-k8s", transcript=TRANSCRIPT
    )
    assert ended["session_id"] == "s-k8s"
    assert "Kubernetes" in ended["task_description"]
    recalled = await call(
        session, "recall_relevant", user_id="alice", query="kubernetes upgrade plan", top_k=2
    )
    assert len(recalled["sessions"]) == 2
    assert recalled["sessions"][0]["summary"]["session_id"] == "s-k8s"
    assert 0 <= recalled["sessions"][1]["score"] <= recalled["sessions"][0]["score"] <= 1
    context = await session.call_tool(
        "build_continuation_context",
        {"user_id": "alice", "query": "kubernetes", "max_tokens": 500},
    )
    assert not context.is_error, text_of(context)
    assert "Kubernetes upgrade" in text_of(context)
    assert f"platform-{tenant}" in text_of(context)

    # -- runs and approvals
    run = await call(session, "get_run", run_id="deploy-1")
    assert (run["user_id"], run["status"]) == ("alice", "paused")
    assert run["pending_approval"]["key"] == "deploy"
    assert run["pending_approval"]["plan_hash"] == hashes["deploy-1"]
    completed = await call(session, "list_runs", status="completed")
    assert [(r["run_id"], r["result"]) for r in completed["runs"]] == [("done-1", {"ok": True})]
    alices = await call(session, "list_runs", user_id="alice")
    assert sorted(r["run_id"] for r in alices["runs"]) == ["deploy-1", "deploy-2"]
    pending = await call(session, "pending_approvals")
    assert [(g["run_id"], g["approval_key"], g["plan_hash"]) for g in pending["approvals"]] == [
        ("deploy-1", "deploy", hashes["deploy-1"]),
        ("deploy-2", "refund", hashes["deploy-2"]),
    ]
    # A gate's time is written as get_run (and every other tool) writes times.
    assert pending["approvals"][0]["requested_at"] == run["pending_approval"]["requested_at"]
    # The approver sees what it approves: the frozen plan, not only its hash.
    assert [g["plan"] for g in pending["approvals"]] == [
        plans(tenant)["deploy-1"][1],
        plans(tenant)["deploy-2"][1],
    ]
    assert (await call(session, "pending_approvals", user_id="bob"))["approvals"] == []
    mismatch = await fails(session, "approve_run", run_id="deploy-1", plan_hash="0" * 64)
    assert "PlanMismatchError" in mismatch
    approved = await call(
        session, "approve_run", run_id="deploy-1", plan_hash=hashes["deploy-1"], note="go"
    )
    assert (approved["run_id"], approved["approved"], approved["by"], approved["note"]) == (
        "deploy-1",
        True,
        by,
        "go",
    )
    rejected = await call(
        session, "reject_run", run_id="deploy-2", plan_hash=hashes["deploy-2"], note="too risky"
    )
    assert (rejected["approved"], rejected["by"], rejected["plan_hash"]) == (
        False,
        by,
        hashes["deploy-2"],
    )
    assert (await call(session, "pending_approvals"))["approvals"] == []
    assert (await call(session, "get_run", run_id="deploy-1"))["status"] == "resumable"

    # -- bad input: an isError result naming the field; the server keeps serving, nothing lost
    bad_user = await fails(session, "get_fact", user_id="alice smith!", key="language")
    assert "InvalidInputError" in bad_user
    assert "'user_id'" in bad_user
    empty = await fails(session, "end_session", user_id="alice", session_id="s-k8s", transcript=[])
    assert "InvalidTranscriptError (field 'transcript')" in empty
    assert "plan_hash" in await fails(session, "reject_run", run_id="deploy-1", plan_hash="x")
    assert (await call(session, "get_fact", user_id="alice", key="language"))["value"] == richer
    again = await call(session, "recall_relevant", user_id="alice", query="kubernetes", top_k=1)
    assert again["sessions"][0]["summary"]["session_id"] == "s-k8s"


_READ_TOOLS = {
    "build_continuation_context",
    "recall_relevant",
    "get_fact",
    "get_facts",
    "fact_history",
    "get_run",
    "list_runs",
    "pending_approvals",
}


def check_decisions_stored(memory: Memory, *, tenant: str, by: str) -> None:
    """After the server stopped: what the MCP calls did is in the stores, as the library sees it."""
    granted = [e for e in memory.run_events("deploy-1") if e.kind is EventKind.APPROVAL_GRANTED]
    assert [e.data["by"] for e in granted] == [by]
    (gate, plan), (refund_gate, refund_plan) = plans(tenant).values()
    decision = memory.start_run("alice", "deploy-1").await_approval(plan, key=gate)
    assert (decision.approved, decision.by, decision.note) == (True, by, "go")
    refused = memory.start_run("alice", "deploy-2").await_approval(refund_plan, key=refund_gate)
    assert (refused.approved, refused.by, refused.note) == (False, by, "too risky")
    assert memory.get_fact("alice", "language").value == {"primary": "fr", "also": ["en"]}
    assert {s.session_id for s in memory.list_sessions("alice")} == {"s-old", "s-db", "s-k8s"}


# -- stdio ---------------------------------------------------------------------------------------


@pytest.mark.slow
def test_stdio_serves_every_tool_in_the_settings_tenant(tmp_path: Path) -> None:
    data = tmp_path / "data"
    hashes = seed(data, "acme")
    seed(data, "default")  # same ids in the tenant the server does not serve
    params = StdioServerParameters(
        command=TIERMEM, args=["mcp"], env=server_env(data, TIERMEM_TENANT="acme")
    )

    async def main() -> None:
        with (tmp_path / "stderr.log").open("w") as errlog:
            async with (
                stdio_client(params, errlog=errlog) as (read, write),
                ClientSession(read, write, client_info=CLIENT) as session,
            ):
                await session.initialize()
                await exercise_every_tool(
                    session, tenant="acme", hashes=hashes, by="mcp:tiermem-tests"
                )

    anyio.run(main)
    with Memory.open(data) as root:
        check_decisions_stored(root.for_tenant("acme"), tenant="acme", by="mcp:tiermem-tests")
        untouched = root  # the default tenant
        assert untouched.get_run("deploy-1").pending_approval is not None
        assert [f.key for f in untouched.get_facts("alice")] == ["team"]


# -- streamable HTTP -----------------------------------------------------------------------------


@dataclass
class HttpServer:
    url: str
    process: subprocess.Popen[bytes]
    log: Path

    def stop(self) -> None:
        if self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(30)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()


@dataclass
class Keys:
    a: str
    a_id: str
    a_read_only: str
    b: str


@pytest.fixture
def tenants(tmp_path: Path) -> tuple[Path, dict[str, dict[str, str]], Keys]:
    """Two tenants with the same user and run ids, and API keys for them."""
    data = tmp_path / "data"
    hashes = {tenant: seed(data, tenant) for tenant in ("acme", "beta")}
    kv = open_kv_store(str(data / "tiermem.sqlite3"))
    try:
        registry = ApiKeyRegistry(kv)
        a, a_info = registry.create("acme", name="mcp test")
        keys = Keys(
            a=a,
            a_id=a_info.key_id,
            a_read_only=registry.create("acme", read_only=True)[0],
            b=registry.create("beta")[0],
        )
    finally:
        kv.close()
    return data, hashes, keys


@pytest.fixture
def http_server(
    tmp_path: Path, tenants: tuple[Path, dict[str, dict[str, str]], Keys]
) -> Iterator[HttpServer]:
    data = tenants[0]
    port = free_port()
    log = tmp_path / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [TIERMEM, "mcp", "--transport", "http", "--host", "127.0.0.1", "--port", str(port)],
            env=server_env(data),
            stdout=out,
            stderr=out,
        )
    server = HttpServer(f"http://127.0.0.1:{port}/mcp", process, log)
    wait_ready(f"http://127.0.0.1:{port}/readyz", process, log, what="tiermem mcp --transport http")
    try:
        yield server
    finally:
        server.stop()


def test_http_refusals_name_their_fix_in_the_mcp_client(http_server: HttpServer) -> None:
    # The MCP SDK's client shows a refusal's text only when it is a JSON-RPC error; any
    # other body becomes "Server returned an error response", whatever the problem was.
    async def refusal(headers: dict[str, str]) -> str:
        async with (
            create_mcp_http_client(headers=headers) as http,
            streamable_http_client(http_server.url, http_client=http) as (read, write),
            ClientSession(read, write, client_info=CLIENT) as session,
        ):
            with pytest.raises(MCPError) as refused:
                await session.initialize()
        return refused.value.error.message

    no_key = anyio.run(refusal, {})
    assert no_key.startswith("401 Unauthorized: no API key: send 'Authorization: Bearer <key>'")
    assert "tiermem keys create" in no_key
    bad_key = anyio.run(refusal, {"Authorization": "Bearer tmk_000000000000_" + "x" * 43})
    assert bad_key == "401 Unauthorized: unknown API key: ask the operator for a valid key"


async def with_key(url: str, key: str, work: Any) -> None:
    """Run ``work(session)`` in an MCP session opened with ``key``."""
    async with (
        create_mcp_http_client(headers={"Authorization": f"Bearer {key}"}) as http,
        streamable_http_client(url, http_client=http) as (read, write),
        ClientSession(read, write, client_info=CLIENT) as session,
    ):
        await session.initialize()
        await work(session)


def test_http_serves_every_tool_and_keeps_tenants_apart(
    http_server: HttpServer, tenants: tuple[Path, dict[str, dict[str, str]], Keys]
) -> None:
    data, hashes, keys = tenants
    by_a = f"mcp:tiermem-tests (api-key:{keys.a_id})"

    async def as_a(session: ClientSession) -> None:
        await exercise_every_tool(session, tenant="acme", hashes=hashes["acme"], by=by_a)

    async def as_b(session: ClientSession) -> None:
        # Same user and run ids as tenant A, none of A's data or changes.
        team = await call(session, "get_fact", user_id="alice", key="team")
        assert team["value"] == "platform-beta"
        assert [f["key"] for f in (await call(session, "get_facts", user_id="alice"))["facts"]] == [
            "team"
        ]
        assert "FactNotFoundError" in await fails(
            session, "get_fact", user_id="alice", key="language"
        )
        assert (await call(session, "fact_history", user_id="alice", key="language"))[
            "history"
        ] == []
        assert (await call(session, "delete_fact", user_id="alice", key="language"))[
            "deleted"
        ] is False
        recalled = await call(session, "recall_relevant", user_id="alice", query="kubernetes")
        assert [s["summary"]["session_id"] for s in recalled["sessions"]] == ["s-old"]
        context = await session.call_tool(
            "build_continuation_context", {"user_id": "alice", "query": "kubernetes"}
        )
        assert "Kubernetes" not in text_of(context)
        assert "platform-beta" in text_of(context)
        run = await call(session, "get_run", run_id="deploy-1")
        assert run["status"] == "paused"
        assert run["pending_approval"]["plan_hash"] == hashes["beta"]["deploy-1"]
        pending = await call(session, "pending_approvals")
        assert [g["plan_hash"] for g in pending["approvals"]] == [
            hashes["beta"]["deploy-1"],
            hashes["beta"]["deploy-2"],
        ]
        # A's plan hash decides nothing in B.
        assert "PlanMismatchError" in await fails(
            session, "approve_run", run_id="deploy-1", plan_hash=hashes["acme"]["deploy-1"]
        )
        assert (await call(session, "list_runs", status="resumable"))["runs"] == []

    async def a_after_b(session: ClientSession) -> None:
        got = await call(session, "get_fact", user_id="alice", key="language")
        assert got["value"] == {"primary": "fr", "also": ["en"]}

    async def main() -> None:
        await with_key(http_server.url, keys.a, as_a)
        await with_key(http_server.url, keys.b, as_b)
        await with_key(http_server.url, keys.a, a_after_b)

    anyio.run(main)
    http_server.stop()
    with Memory.open(data) as root:
        check_decisions_stored(root.for_tenant("acme"), tenant="acme", by=by_a)
        beta = root.for_tenant("beta")
        pending = beta.get_run("deploy-1").pending_approval
        assert pending is not None
        assert pending.plan_hash == hashes["beta"]["deploy-1"]
        assert [f.key for f in beta.get_facts("alice")] == ["team"]
        assert {s.session_id for s in beta.list_sessions("alice")} == {"s-old"}


def _initialize(key: str | None) -> dict[str, Any]:
    headers = {"Accept": "application/json, text/event-stream"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    return {
        "headers": headers,
        "json": {
            "jsonrpc": "2.0",
            "id": 1,
            "method": "initialize",
            "params": {
                "protocolVersion": LATEST_HANDSHAKE_VERSION,
                "capabilities": {},
                "clientInfo": {"name": "raw", "version": "1"},
            },
        },
    }


def test_http_refuses_missing_bad_and_foreign_keys_and_read_only_writes(
    http_server: HttpServer, tenants: tuple[Path, dict[str, dict[str, str]], Keys]
) -> None:
    _, _, keys = tenants
    with httpx.Client(timeout=30) as http:
        for key in (None, "tmk_000000000000_" + "x" * 43, "not-a-key"):
            refused = http.post(http_server.url, **_initialize(key))
            assert refused.status_code == 401, refused.text
            assert refused.headers["content-type"] == "application/json"
            body = refused.json()
            assert body["type"] == "urn:tiermem:problem:unauthorized"
            assert body["error"]["message"] == f"401 Unauthorized: {body['detail']}"
        # An MCP session belongs to the key that opened it: any other key gets 404.
        opened = http.post(http_server.url, **_initialize(keys.a))
        assert opened.status_code == 200, opened.text
        session_id = opened.headers["mcp-session-id"]
        initialized = {"jsonrpc": "2.0", "method": "notifications/initialized"}
        for key, status in ((keys.b, 404), (keys.a_read_only, 404), (keys.a, 202)):
            sent = http.post(
                http_server.url,
                json=initialized,
                headers={
                    "Authorization": f"Bearer {key}",
                    "Accept": "application/json, text/event-stream",
                    "mcp-session-id": session_id,
                    "mcp-protocol-version": LATEST_HANDSHAKE_VERSION,
                },
            )
            assert sent.status_code == status, sent.text

    async def read_only(session: ClientSession) -> None:
        assert (await call(session, "get_fact", user_id="alice", key="team"))["value"] == (
            "platform-acme"
        )
        for tool, args in (
            ("set_fact", {"user_id": "alice", "key": "team", "value": "hijacked"}),
            ("delete_fact", {"user_id": "alice", "key": "team"}),
            ("end_session", {"user_id": "alice", "session_id": "s-x", "transcript": TRANSCRIPT}),
            ("approve_run", {"run_id": "deploy-1", "plan_hash": "a" * 64}),
            ("set_budget", {"run_id": "deploy-1", "tokens": 5}),
        ):
            assert "may only read" in await fails(session, tool, **args), tool
        assert (await call(session, "get_fact", user_id="alice", key="team"))["value"] == (
            "platform-acme"
        )
        assert (await call(session, "get_run", run_id="deploy-1"))["status"] == "paused"

    anyio.run(with_key, http_server.url, keys.a_read_only, read_only)


# -- in process ----------------------------------------------------------------------------------


def test_tool_errors_name_the_field_and_the_caller_decides(tmp_path: Path) -> None:
    with Memory.open(tmp_path / "data", durable=False, allow_volatile=True) as memory:
        acme = memory.for_tenant("acme")
        hashes = {}
        for view in (memory, acme):  # the same run id in two tenants
            gate, plan = plans(view.tenant)["deploy-1"]
            with pytest.raises(ApprovalPendingError) as pending:
                view.start_run("alice", "deploy-1").await_approval(plan, key=gate)
            hashes[view.tenant] = pending.value.plan_hash
        caller = McpCaller(acme, principal="api-key:0123456789ab", can_write=False)

        def resolve(request: object) -> McpCaller:
            assert request is None  # in process: no transport request
            return caller

        async def main() -> None:
            nonlocal caller
            async with Client(build_server(resolve=resolve)) as client:
                refused = await fails(
                    client, "approve_run", run_id="deploy-1", plan_hash=hashes["acme"]
                )
                assert "may only read" in refused
                assert "api-key:0123456789ab" in refused
                bad = await fails(client, "build_continuation_context", user_id="bob", max_tokens=0)
                assert "'max_tokens'" in bad
                caller = McpCaller(acme, principal="api-key:0123456789ab")
                decided = await call(
                    client, "approve_run", run_id="deploy-1", plan_hash=hashes["acme"]
                )
                assert decided["by"] == "mcp:mcp (api-key:0123456789ab)"

        anyio.run(main)
        assert acme.get_run("deploy-1").status == "resumable"
        assert memory.get_run("deploy-1").pending_approval is not None  # default tenant untouched


def test_set_budget_raises_a_spent_budget_and_refuses_bad_ones(tmp_path: Path) -> None:
    with Memory.open(tmp_path / "data", durable=False, allow_volatile=True) as memory:
        run = memory.start_run("alice", "r1", budget_tokens=5, budget_cost=1.0)
        run.step("llm", lambda: Charged("a", tokens=5))
        with pytest.raises(BudgetExceededError):
            run.step("more", lambda: 1)

        async def main() -> None:
            async with Client(build_server(memory)) as client:
                neither = await fails(client, "set_budget", run_id="r1")
                assert "field 'tokens'" in neither, neither
                assert "'unlimited' removes a limit" in neither, neither
                assert "None" not in neither, neither  # null leaves a limit as it is
                for bad, field in (
                    ({"tokens": -1}, "budget_tokens"),
                    ({"tokens": True}, "tokens"),
                    ({"tokens": "5"}, "tokens"),
                    ({"tokens": 2.5}, "tokens"),
                    ({"cost": "lots"}, "cost"),
                ):
                    assert field in await fails(client, "set_budget", run_id="r1", **bad), bad
                assert "RunNotFoundError" in await fails(
                    client, "set_budget", run_id="nope", tokens=5
                )
                raised = await call(client, "set_budget", run_id="r1", tokens=50)
                assert (raised["budget_tokens"], raised["budget_cost"]) == (50, 1.0)
                lifted = await call(client, "set_budget", run_id="r1", cost="unlimited")
                assert (lifted["budget_tokens"], lifted["budget_cost"]) == (50, None)

        anyio.run(main)
        assert run.step("more", lambda: 1) == 1
        changes = [e.data for e in memory.run_events("r1") if e.kind is EventKind.BUDGET_SET]
        assert changes == [
            {"budget_tokens": 50, "by": "mcp:mcp", "by_key": None},
            {"budget_cost": None, "by": "mcp:mcp", "by_key": None},
        ]


def test_build_server_needs_exactly_one_source_of_callers(tmp_path: Path) -> None:
    from tiers.errors import InvalidInputError

    with pytest.raises(InvalidInputError) as neither:
        build_server()
    assert neither.value.field == "memory"
    with Memory.open(tmp_path / "data", durable=False, allow_volatile=True) as memory:
        with pytest.raises(InvalidInputError) as both:
            build_server(memory, resolve=lambda request: McpCaller(memory))
        assert both.value.field == "resolve"
        with pytest.raises(InvalidInputError) as level:
            build_server(memory, log_level="loud")
        assert level.value.field == "log_level"
