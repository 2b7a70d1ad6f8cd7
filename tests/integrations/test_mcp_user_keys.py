"""MCP tools for a caller bound to one user: every tool refuses the other users' data.

The same decisions as the REST routes (``tests/api/test_user_keys.py``): a tool
given another ``user_id`` is refused, naming the caller's own user only; a run
of another user is not found, word for word as an absent run; the listings
show the caller's own user's runs. :data:`DECISIONS` holds every tool to a
decision. Over HTTP, the user a key is bound to reaches the tools.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import anyio
from mcp import Client, ClientSession

from memory import Memory
from memory.apikeys import ApiKeyRegistry
from memory.binding import refusal
from memory.integrations.mcp import TOOL_NAMES, McpCaller, build_server
from tests.integrations.test_mcp import (  # noqa: F401 (fixtures)
    TRANSCRIPT,
    HttpServer,
    Keys,
    _no_outside_settings,
    call,
    fails,
    http_server,
    seed,
    tenants,
    with_key,
)
from tiers.backends import open_kv_store

REFUSED = "refused: names another user"
NOT_FOUND = "not found: another user's run, as an absent one"
FILTERED = "the caller's own user's runs only"


def decisions(plan_hash: str) -> dict[str, tuple[str, dict[str, Any]]]:
    """Every tool -> how a caller bound to bob is refused alice's data, and the arguments."""
    return {
        "build_continuation_context": (REFUSED, {"user_id": "alice", "query": "report"}),
        "recall_relevant": (REFUSED, {"user_id": "alice", "query": "report"}),
        "save_session": (REFUSED, {"user_id": "alice", "session_id": "s-x"}),
        "end_session": (
            REFUSED,
            {"user_id": "alice", "session_id": "s-x", "transcript": TRANSCRIPT},
        ),
        "get_fact": (REFUSED, {"user_id": "alice", "key": "team"}),
        "get_facts": (REFUSED, {"user_id": "alice"}),
        "set_fact": (REFUSED, {"user_id": "alice", "key": "team", "value": "hijacked"}),
        "delete_fact": (REFUSED, {"user_id": "alice", "key": "team"}),
        "fact_history": (REFUSED, {"user_id": "alice", "key": "team"}),
        "list_runs": (FILTERED, {}),
        "pending_approvals": (FILTERED, {}),
        "get_run": (NOT_FOUND, {"run_id": "deploy-1"}),
        "approve_run": (NOT_FOUND, {"run_id": "deploy-1", "plan_hash": plan_hash}),
        "reject_run": (NOT_FOUND, {"run_id": "deploy-1", "plan_hash": plan_hash}),
        "set_budget": (NOT_FOUND, {"run_id": "deploy-1", "tokens": 5}),
    }


def test_every_tool_refuses_a_bound_caller_other_users_data(tmp_path: Path) -> None:
    data = tmp_path / "data"
    hashes = seed(data, "acme")  # alice: a fact, a session, two gated runs; bob: run done-1
    principal = "api-key:0123456789ab"
    table = decisions(hashes["deploy-1"])
    assert set(table) == set(TOOL_NAMES), "tools without a decision for user-bound callers"

    with Memory.open(data, durable=False, allow_volatile=True) as root:
        acme = root.for_tenant("acme")
        as_bob = McpCaller(acme, principal=principal, user_id="bob")
        server = build_server(resolve=lambda request: as_bob)

        async def main() -> None:
            async with Client(server) as client:
                for tool, (decision, args) in table.items():
                    if decision == REFUSED:
                        text = await fails(client, tool, **args)
                        assert text.endswith(f": {refusal('bob', principal)}"), tool
                        # The same for a user without data: nothing tells whether alice exists.
                        nobody = await fails(client, tool, **{**args, "user_id": "nobody"})
                        assert nobody == text, tool
                    elif decision == NOT_FOUND:
                        text = await fails(client, tool, **args)
                        absent = await fails(client, tool, **{**args, "run_id": "absent-1"})
                        assert text.replace("deploy-1", "absent-1") == absent, tool
                        assert "RunNotFoundError" in text, tool
                    else:
                        assert decision == FILTERED
                        text = await fails(client, tool, user_id="alice")
                        assert text.endswith(f": {refusal('bob', principal)}"), tool
                # The listings: bob's runs only, with or without naming bob.
                for args in ({}, {"user_id": "bob"}):
                    runs = await call(client, "list_runs", **args)
                    assert [r["run_id"] for r in runs["runs"]] == ["done-1"]
                    assert (await call(client, "pending_approvals", **args))["approvals"] == []
                # Bob's own data is his to use.
                assert (await call(client, "get_run", run_id="done-1"))["status"] == "completed"
                await call(client, "set_fact", user_id="bob", key="lang", value="fr")
                assert (await call(client, "get_facts", user_id="bob"))["facts"][0]["value"] == "fr"

        anyio.run(main)
        # Nothing of alice's changed.
        assert acme.get_fact("alice", "team").value == "platform-acme"
        assert [s.session_id for s in acme.list_sessions("alice")] == ["s-old"]
        pending = acme.get_run("deploy-1").pending_approval
        assert pending is not None
        assert pending.plan_hash == hashes["deploy-1"]

        # A caller bound to alice sees and decides her gates.
        as_alice = McpCaller(acme, principal=principal, user_id="alice")

        async def alice() -> None:
            async with Client(build_server(resolve=lambda request: as_alice)) as client:
                gates = (await call(client, "pending_approvals"))["approvals"]
                assert sorted(g["run_id"] for g in gates) == ["deploy-1", "deploy-2"]
                await call(client, "approve_run", run_id="deploy-1", plan_hash=hashes["deploy-1"])

        anyio.run(alice)
        assert acme.get_run("deploy-1").status == "resumable"


def test_http_holds_a_user_bound_key_to_its_user(
    http_server: HttpServer,  # noqa: F811
    tenants: tuple[Path, dict[str, dict[str, str]], Keys],  # noqa: F811
) -> None:
    data, hashes, _ = tenants
    # Made beside the running server, as `tiermem keys create --user bob` would.
    kv = open_kv_store(str(data / "tiermem.sqlite3"))
    try:
        key, info = ApiKeyRegistry(kv).create("acme", user_id="bob")
    finally:
        kv.close()

    async def as_bob(session: ClientSession) -> None:
        refused = await fails(session, "get_facts", user_id="alice")
        assert refused.endswith(f": {refusal('bob', f'api-key:{info.key_id}')}")
        assert "RunNotFoundError" in await fails(
            session, "approve_run", run_id="deploy-1", plan_hash=hashes["acme"]["deploy-1"]
        )
        runs = (await call(session, "list_runs"))["runs"]
        assert [r["run_id"] for r in runs] == ["done-1"]
        assert (await call(session, "set_fact", user_id="bob", key="k", value=1))["value"] == 1

    anyio.run(with_key, http_server.url, key, as_bob)
    http_server.stop()
    with Memory.open(data, durable=False, allow_volatile=True) as root:
        acme = root.for_tenant("acme")
        assert acme.get_fact("bob", "k").value == 1
        assert acme.get_run("deploy-1").pending_approval is not None
