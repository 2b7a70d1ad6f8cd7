"""Keys bound to one user: such a key gets 403 or 404 for every other user's data on every route.

A key of a tenant bound to user ``alice`` probes ``bob``'s data (same tenant)
through every route of the app. :func:`decisions` says, for each route, how it
is refused: ``FORBIDDEN`` (403) for a route that names another user in its
path, body or query; ``NOT_FOUND`` (404) for an object of another user addressed
by its own id (a run and everything under it, a job), word for word what an
absent object gets; ``FILTERED`` for a tenant-wide listing that shows the key
its own user's objects only; ``PUBLIC`` for routes that need no key and hold
no user data. A route missing from the table fails the test, so a new route
needs a decision. Bob's data is compared before and after.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any
from urllib.parse import quote

import pytest
from fastapi import FastAPI
from fastapi.routing import iter_route_contexts
from typer.testing import CliRunner

from api.mcp_http import MCP_PATH, create_mcp_app
from api.ui.auth import COOKIE as CONSOLE_COOKIE
from api.ui.auth import csrf_token
from memory.apikeys import ApiKeyRecord, ApiKeyRegistry
from memory.binding import refusal
from memory.cli import app as cli
from memory.facade import Memory
from memory.settings import Settings
from tests.api.conftest import Api, new_tenant
from tests.api.test_routes import SUMMARY, TRANSCRIPT, wait_job
from tiers.errors import InvalidInputError

SECRET = "zanzibar-7731"

FORBIDDEN = "403: names another user"
NOT_FOUND = "404: another user's object, answered as an absent one"
FILTERED = "200: a tenant-wide listing, filtered to the key's user"
PUBLIC = "200: no key needed, no user data"
# Console pages (api/ui/) read the key from their cookie and answer HTML: probed with the bound
# key as that cookie (and a valid CSRF token), expecting Probe.status and no trace of bob's data.
CONSOLE = "console page: the status in the probe, nothing of bob's"
MCP_TOOLS = "per tool: tests/integrations/test_mcp_user_keys.py"


@dataclass(frozen=True)
class Probe:
    """How a key bound to alice is refused bob's data on one route."""

    decision: str
    path: str
    body: Any = None
    status: int | None = None  # the expected status of a CONSOLE probe


def every_route(app: FastAPI) -> set[tuple[str, str]]:
    """(method, path template) of every route of the app, included routers and mounts alike."""
    routes: set[tuple[str, str]] = set()
    for route in iter_route_contexts(app.routes):
        methods = set(route.methods or {"*"})
        if "GET" in methods:
            methods.discard("HEAD")  # Starlette answers HEAD with the GET route
        routes |= {(method, route.path) for method in methods}
    return routes


def decisions(ids: dict[str, str], epoch: int) -> dict[tuple[str, str], Probe]:
    """Every route -> how the bound key is refused bob's data there."""
    run, gate, ckpt, job = ids["run"], ids["gate"], ids["checkpoint"], ids["job"]
    lease = {"lease_epoch": epoch}
    user = "/v1/users/bob"
    return {
        ("GET", "/healthz"): Probe(PUBLIC, "/healthz"),
        ("GET", "/readyz"): Probe(PUBLIC, "/readyz"),
        ("GET", "/metrics"): Probe(PUBLIC, "/metrics"),  # counters by route template only
        ("GET", "/openapi.json"): Probe(PUBLIC, "/openapi.json"),
        ("GET", "/docs"): Probe(PUBLIC, "/docs"),
        ("GET", "/docs/oauth2-redirect"): Probe(PUBLIC, "/docs/oauth2-redirect"),
        ("GET", "/redoc"): Probe(PUBLIC, "/redoc"),
        ("*", MCP_PATH): Probe(MCP_TOOLS, MCP_PATH),
        # The console: bob's run and gate are absent (404), bob's page refused (403), the
        # listings filtered to alice's runs; a decision on bob's gate is refused (404).
        ("GET", "/ui"): Probe(CONSOLE, "/ui", status=303),
        ("GET", "/ui/login"): Probe(CONSOLE, "/ui/login", status=200),
        ("POST", "/ui/login"): Probe(CONSOLE, "/ui/login", {"api_key": "x"}, status=403),
        ("POST", "/ui/logout"): Probe(CONSOLE, "/ui/logout", {}, status=303),
        ("GET", "/ui/runs"): Probe(CONSOLE, "/ui/runs", status=200),
        ("GET", "/ui/runs/{run_id}"): Probe(CONSOLE, f"/ui/runs/{run}", status=404),
        ("GET", "/ui/approvals"): Probe(CONSOLE, "/ui/approvals", status=200),
        ("POST", "/ui/runs/{run_id}/approve"): Probe(
            CONSOLE, f"/ui/runs/{gate}/approve", {"plan_hash": ids["plan_hash"]}, status=404
        ),
        ("POST", "/ui/runs/{run_id}/reject"): Probe(
            CONSOLE, f"/ui/runs/{gate}/reject", {"plan_hash": ids["plan_hash"]}, status=404
        ),
        ("GET", "/ui/users"): Probe(CONSOLE, "/ui/users?user_id=bob", status=303),
        ("GET", "/ui/users/{user_id}"): Probe(CONSOLE, "/ui/users/bob", status=403),
        ("*", "/ui/static"): Probe(CONSOLE, "/ui/static/console.css", status=200),
        # A user id in the path: refused outright.
        ("GET", "/v1/users/{user_id}/facts"): Probe(FORBIDDEN, f"{user}/facts"),
        ("PUT", "/v1/users/{user_id}/facts"): Probe(
            FORBIDDEN, f"{user}/facts", {"facts": {"secret": "overwritten"}}
        ),
        ("DELETE", "/v1/users/{user_id}/facts"): Probe(FORBIDDEN, f"{user}/facts"),
        ("GET", "/v1/users/{user_id}/facts/{key}"): Probe(FORBIDDEN, f"{user}/facts/secret"),
        ("PUT", "/v1/users/{user_id}/facts/{key}"): Probe(
            FORBIDDEN, f"{user}/facts/secret", {"value": "overwritten"}
        ),
        ("DELETE", "/v1/users/{user_id}/facts/{key}"): Probe(FORBIDDEN, f"{user}/facts/secret"),
        ("GET", "/v1/users/{user_id}/facts/{key}/history"): Probe(
            FORBIDDEN, f"{user}/facts/secret/history"
        ),
        ("DELETE", "/v1/users/{user_id}"): Probe(FORBIDDEN, user),
        ("POST", "/v1/users/{user_id}/sessions"): Probe(
            FORBIDDEN,
            f"{user}/sessions",
            {"session_id": "s-b", "summary": {"task_description": "x"}},
        ),
        ("GET", "/v1/users/{user_id}/sessions"): Probe(FORBIDDEN, f"{user}/sessions"),
        ("GET", "/v1/users/{user_id}/sessions/{session_id}"): Probe(
            FORBIDDEN, f"{user}/sessions/s-b"
        ),
        ("DELETE", "/v1/users/{user_id}/sessions/{session_id}"): Probe(
            FORBIDDEN, f"{user}/sessions/s-b"
        ),
        ("POST", "/v1/users/{user_id}/sessions/{session_id}:resummarize"): Probe(
            FORBIDDEN, f"{user}/sessions/s-b2:resummarize"
        ),
        ("GET", "/v1/users/{user_id}/sessions:pending"): Probe(
            FORBIDDEN, f"{user}/sessions:pending"
        ),
        ("POST", "/v1/users/{user_id}/sessions:recall"): Probe(
            FORBIDDEN, f"{user}/sessions:recall", {"query": SECRET}
        ),
        ("POST", "/v1/users/{user_id}/context"): Probe(
            FORBIDDEN, f"{user}/context", {"query": SECRET}
        ),
        # A user id in the body or the query: refused outright.
        ("POST", "/v1/runs"): Probe(FORBIDDEN, "/v1/runs", {"user_id": "bob", "run_id": "new-b"}),
        ("GET", "/v1/runs"): Probe(FORBIDDEN, "/v1/runs?user_id=bob"),
        # Tenant-wide listing: the key's own user's runs only.
        ("GET", "/v1/runs:resumable"): Probe(FILTERED, "/v1/runs:resumable"),
        # An object by its own id: bob's is not found, as an absent one.
        ("GET", "/v1/jobs/{job_id}"): Probe(NOT_FOUND, f"/v1/jobs/{job}"),
        ("GET", "/v1/runs/{run_id}"): Probe(NOT_FOUND, f"/v1/runs/{run}"),
        ("GET", "/v1/runs/{run_id}:resume-plan"): Probe(NOT_FOUND, f"/v1/runs/{run}:resume-plan"),
        ("DELETE", "/v1/runs/{run_id}"): Probe(NOT_FOUND, f"/v1/runs/{run}"),
        ("POST", "/v1/runs/{run_id}/checkpoints"): Probe(
            NOT_FOUND, f"/v1/runs/{run}/checkpoints", {**lease, "step": "evil", "output": "x"}
        ),
        ("GET", "/v1/runs/{run_id}/checkpoints"): Probe(
            NOT_FOUND, f"/v1/runs/{run}/checkpoints?newest_first=true"
        ),
        ("GET", "/v1/runs/{run_id}/checkpoints:by-key"): Probe(
            NOT_FOUND, f"/v1/runs/{run}/checkpoints:by-key?idempotency_key={quote(ids['key'])}"
        ),
        ("GET", "/v1/runs/{run_id}/events"): Probe(NOT_FOUND, f"/v1/runs/{run}/events"),
        ("GET", "/v1/runs/{run_id}/checkpoints/{checkpoint_id}"): Probe(
            NOT_FOUND, f"/v1/runs/{run}/checkpoints/{ckpt}"
        ),
        ("GET", "/v1/runs/{run_id}/checkpoints/{checkpoint_id}/state"): Probe(
            NOT_FOUND, f"/v1/runs/{run}/checkpoints/{ckpt}/state"
        ),
        ("POST", "/v1/runs/{run_id}:update-state"): Probe(
            NOT_FOUND, f"/v1/runs/{run}:update-state", {"checkpoint_id": ckpt, "values": {"e": 1}}
        ),
        ("GET", "/v1/runs/{run_id}/effects"): Probe(NOT_FOUND, f"/v1/runs/{run}/effects"),
        ("POST", "/v1/runs/{run_id}/effects:begin"): Probe(
            NOT_FOUND,
            f"/v1/runs/{run}/effects:begin",
            {**lease, "name": "pay", "idempotency_key": "pay-b"},
        ),
        ("POST", "/v1/runs/{run_id}/effects:record"): Probe(
            NOT_FOUND,
            f"/v1/runs/{run}/effects:record",
            {**lease, "idempotency_key": "pay-b", "output": "evil"},
        ),
        ("POST", "/v1/runs/{run_id}/effects:resolve"): Probe(
            NOT_FOUND, f"/v1/runs/{run}/effects:resolve", {"idempotency_key": "x", "output": "evil"}
        ),
        ("POST", "/v1/runs/{run_id}/approvals"): Probe(
            NOT_FOUND, f"/v1/runs/{run}/approvals", {**lease, "plan": "evil", "key": "gate"}
        ),
        ("POST", "/v1/runs/{run_id}:complete"): Probe(NOT_FOUND, f"/v1/runs/{run}:complete", lease),
        ("POST", "/v1/runs/{run_id}:fail"): Probe(
            NOT_FOUND, f"/v1/runs/{run}:fail", {**lease, "error": "x"}
        ),
        ("POST", "/v1/runs/{run_id}:cancel"): Probe(NOT_FOUND, f"/v1/runs/{run}:cancel"),
        ("POST", "/v1/runs/{run_id}:set-budget"): Probe(
            NOT_FOUND, f"/v1/runs/{run}:set-budget", {"budget_tokens": 1}
        ),
        ("POST", "/v1/runs/{run_id}:approve"): Probe(
            NOT_FOUND, f"/v1/runs/{gate}:approve", {"plan_hash": ids["plan_hash"]}
        ),
        ("POST", "/v1/runs/{run_id}:reject"): Probe(
            NOT_FOUND, f"/v1/runs/{gate}:reject", {"plan_hash": ids["plan_hash"]}
        ),
        ("POST", "/v1/runs/{run_id}:fork"): Probe(
            NOT_FOUND, f"/v1/runs/{run}:fork", {"checkpoint_id": ckpt, "new_run_id": "fork-a"}
        ),
        ("POST", "/v1/runs/{run_id}:heartbeat"): Probe(
            NOT_FOUND, f"/v1/runs/{run}:heartbeat", lease
        ),
    }


def bound_key(api: Api, tenant: str, user_id: str, *, read_only: bool = False) -> dict[str, str]:
    """Headers carrying a new key of ``tenant`` bound to ``user_id``."""
    key, info = api.service.keys.create(tenant, read_only=read_only, user_id=user_id)
    assert info.user_id == user_id
    return {"Authorization": f"Bearer {key}"}


def seed_bob(api: Api, admin: dict[str, str]) -> tuple[dict[str, str], int]:
    """Bob's fact, sessions, a run with a checkpoint and effects, a run at an approval gate, a job."""
    c = api.client
    assert c.put("/v1/users/bob/facts/secret", json={"value": SECRET}, headers=admin).is_success
    summary = {**SUMMARY, "task_description": f"Plan {SECRET}"}
    c.post("/v1/users/bob/sessions", json={"session_id": "s-b", "summary": summary}, headers=admin)
    epoch = c.post("/v1/runs", json={"user_id": "bob", "run_id": "run-b"}, headers=admin).json()[
        "lease_epoch"
    ]
    ckpt = c.post(
        "/v1/runs/run-b/checkpoints",
        json={"lease_epoch": epoch, "step": "s", "output": SECRET},
        headers=admin,
    ).json()
    effect = {"lease_epoch": epoch, "idempotency_key": "pay-b"}
    c.post("/v1/runs/run-b/effects:begin", json={**effect, "name": "pay"}, headers=admin)
    c.post("/v1/runs/run-b/effects:record", json={**effect, "output": SECRET}, headers=admin)
    c.post(
        "/v1/runs/run-b/effects:begin",
        json={**effect, "name": "pay", "idempotency_key": "x"},
        headers=admin,
    )
    gate_epoch = c.post(
        "/v1/runs", json={"user_id": "bob", "run_id": "gate-b"}, headers=admin
    ).json()["lease_epoch"]
    pending = c.post(
        "/v1/runs/gate-b/approvals",
        json={"lease_epoch": gate_epoch, "plan": {"refund": SECRET}, "key": "g"},
        headers=admin,
    )
    assert pending.status_code == 202, pending.text
    job = c.post(
        "/v1/users/bob/sessions",
        json={"session_id": "s-b2", "transcript": TRANSCRIPT},
        headers=admin,
    ).json()
    assert wait_job(api, admin, job["status_url"])["status"] == "succeeded"
    ids = {
        "run": "run-b",
        "gate": "gate-b",
        "checkpoint": ckpt["checkpoint_id"],
        "key": ckpt["idempotency_key"],
        "job": job["job_id"],
        "plan_hash": pending.json()["plan_hash"],
    }
    return ids, epoch


def snapshot(api: Api, admin: dict[str, str], ids: dict[str, str]) -> dict[str, Any]:
    """Everything of bob's, as a tenant-wide key sees it."""
    c = api.client
    run = f"/v1/runs/{ids['run']}"
    return {
        "facts": c.get("/v1/users/bob/facts", headers=admin).json(),
        "history": c.get("/v1/users/bob/facts/secret/history", headers=admin).json(),
        "sessions": c.get("/v1/users/bob/sessions", headers=admin).json(),
        "pending": c.get("/v1/users/bob/sessions:pending", headers=admin).json(),
        "context": c.post("/v1/users/bob/context", json={"query": SECRET}, headers=admin).json(),
        "runs": c.get("/v1/runs?user_id=bob", headers=admin).json(),
        "checkpoints": c.get(f"{run}/checkpoints", headers=admin).json(),
        "effects": c.get(f"{run}/effects", headers=admin).json(),
        "events": c.get(f"{run}/events", headers=admin).json(),
        "gate": c.get(f"/v1/runs/{ids['gate']}", headers=admin).json(),
        "job": c.get(f"/v1/jobs/{ids['job']}", headers=admin).json(),
    }


def _stable(problem: dict[str, Any]) -> dict[str, Any]:
    """A problem without what differs per request."""
    return {k: v for k, v in problem.items() if k not in ("request_id", "instance")}


def test_a_user_bound_key_is_refused_every_other_user_on_every_route(
    api: Api, tmp_path: Path
) -> None:
    c = api.client
    tenant = new_tenant()
    admin = api.key(tenant)
    alice = bound_key(api, tenant, "alice")
    key_id = alice["Authorization"].split("_")[1]
    ids, epoch = seed_bob(api, admin)
    # Alice's own resumable run, so the filtered listing is not empty by accident.
    c.post("/v1/runs", json={"user_id": "alice", "run_id": "run-a"}, headers=alice)
    before = snapshot(api, admin, ids)
    assert SECRET in str(before["effects"])
    assert SECRET in before["context"]["text"]
    assert before["gate"]["pending_approval"]["plan_hash"] == ids["plan_hash"]

    table = decisions(ids, epoch)
    served = every_route(create_mcp_app(Settings(data_dir=tmp_path)))
    assert every_route(api.client.app) <= served  # type: ignore[arg-type]
    assert served - set(table) == set(), "routes without a decision for user-bound keys"
    assert set(table) - served == set(), "decisions for routes that no longer exist"

    refused = refusal("alice", f"API key {key_id}")
    for (method, template), probe in sorted(table.items()):
        if probe.decision == MCP_TOOLS:
            continue
        if probe.decision == CONSOLE:
            alice_key = alice["Authorization"].removeprefix("Bearer ")
            form = None if probe.body is None else {**probe.body, "csrf": csrf_token(alice_key)}
            r = c.request(
                "GET" if method == "*" else method,  # a mount: its files are read
                probe.path,
                data=form,
                headers={"Cookie": f"{CONSOLE_COOKIE}={alice_key}"},
                follow_redirects=False,
            )
            c.cookies.clear()
            assert r.status_code == probe.status, (method, template, r.status_code, r.text)
            assert SECRET not in r.text, (method, template)
            if r.status_code == 200:  # a listing: alice's runs only
                assert "run-b" not in r.text, (method, template)
                assert "gate-b" not in r.text, (method, template)
            if r.status_code == 404:  # word for word the page of an absent run
                absent = c.request(
                    method,
                    probe.path.replace(ids["gate"], "absent-1").replace(ids["run"], "absent-1"),
                    data=form,
                    headers={"Cookie": f"{CONSOLE_COOKIE}={alice_key}"},
                    follow_redirects=False,
                )
                assert absent.status_code == 404, (method, template)
                got = r.text.replace(ids["gate"], "absent-1").replace(ids["run"], "absent-1")
                assert got == absent.text, (method, template)
            continue
        r = c.request(method, probe.path, json=probe.body, headers=alice)
        where = (method, template)
        assert SECRET not in r.text, where
        if probe.decision == PUBLIC:
            assert r.status_code == 200, where
            continue
        if probe.decision == FILTERED:
            assert r.status_code == 200, where
            assert {run["user_id"] for run in r.json()["runs"]} == {"alice"}, where
            continue
        expected = 403 if probe.decision == FORBIDDEN else 404
        assert r.status_code == expected, (where, r.status_code, r.text)
        problem = r.json()
        if probe.decision == FORBIDDEN:
            assert problem["type"] == "urn:tiermem:problem:forbidden", where
            assert problem["detail"] == refused, where
            # The same answer for a user with no data: nothing tells whether bob exists.
            body = (
                None
                if probe.body is None
                else json.loads(json.dumps(probe.body).replace("bob", "nobody"))
            )
            other = c.request(method, probe.path.replace("bob", "nobody"), json=body, headers=alice)
            assert _stable(other.json()) == _stable(problem), where
            continue
        assert probe.decision == NOT_FOUND
        # Word for word what an absent object of the same kind gets.
        absent_path = probe.path
        for real in (ids["run"], ids["gate"], ids["job"]):
            absent_path = absent_path.replace(real, "absent-1")
        absent = c.request(method, absent_path, json=probe.body, headers=alice)
        assert absent.status_code == 404, where
        got = json.loads(
            r.text.replace(ids["run"], "absent-1")
            .replace(ids["gate"], "absent-1")
            .replace(ids["job"], "absent-1")
        )
        assert _stable(got) == _stable(absent.json()), where

    # Listing runs without naming a user: the key's own user's only.
    assert {run["run_id"] for run in c.get("/v1/runs", headers=alice).json()["runs"]} == {"run-a"}
    # A run id taken by another user's run cannot be resumed or reused by the bound key.
    taken = c.post(
        "/v1/runs", json={"user_id": "alice", "run_id": ids["run"], "resume": True}, headers=alice
    )
    assert taken.status_code == 409, taken.text
    assert SECRET not in taken.text

    time.sleep(0.05)  # let any index work settle before comparing
    assert snapshot(api, admin, ids) == before


def test_a_user_bound_key_uses_its_own_users_data(api: Api) -> None:
    c = api.client
    tenant = new_tenant()
    admin = api.key(tenant)
    alice = bound_key(api, tenant, "alice")
    c.post("/v1/runs", json={"user_id": "bob", "run_id": "run-b"}, headers=admin)

    assert c.put("/v1/users/alice/facts/lang", json={"value": "fr"}, headers=alice).is_success
    assert c.get("/v1/users/alice/facts/lang", headers=alice).json()["value"] == "fr"
    assert c.put("/v1/users/alice/facts", json={"facts": {"tz": "CET"}}, headers=alice).is_success
    assert len(c.get("/v1/users/alice/facts/lang/history", headers=alice).json()["facts"]) == 1
    saved = c.post(
        "/v1/users/alice/sessions",
        json={"session_id": "s-1", "summary": SUMMARY},
        headers=alice,
    )
    assert saved.status_code == 201, saved.text
    job = c.post(
        "/v1/users/alice/sessions",
        json={"session_id": "s-2", "transcript": TRANSCRIPT},
        headers=alice,
    ).json()
    assert wait_job(api, alice, job["status_url"])["status"] == "succeeded"  # its own job
    sessions = c.get("/v1/users/alice/sessions", headers=alice).json()["sessions"]
    assert {s["session_id"] for s in sessions} == {"s-1", "s-2"}
    recall = c.post("/v1/users/alice/sessions:recall", json={"query": "Postgres"}, headers=alice)
    assert recall.json()["results"]
    context = c.post("/v1/users/alice/context", json={"query": "billing"}, headers=alice).json()
    assert "Postgres" in context["text"]

    started = c.post("/v1/runs", json={"user_id": "alice", "run_id": "run-a"}, headers=alice)
    assert started.status_code == 201, started.text
    lease = {"lease_epoch": started.json()["lease_epoch"]}
    ckpt = c.post(
        "/v1/runs/run-a/checkpoints", json={**lease, "step": "s", "output": 1}, headers=alice
    )
    assert ckpt.status_code == 201, ckpt.text
    assert c.get("/v1/runs/run-a", headers=alice).json()["head_seq"] == 1
    assert len(c.get("/v1/runs/run-a/checkpoints", headers=alice).json()["checkpoints"]) == 1
    gate = c.post(
        "/v1/runs/run-a/approvals", json={**lease, "plan": {"x": 1}, "key": "g"}, headers=alice
    )
    assert gate.status_code == 202, gate.text
    approved = c.post(
        "/v1/runs/run-a:approve", json={"plan_hash": gate.json()["plan_hash"]}, headers=alice
    )
    assert approved.status_code == 200, approved.text
    # Listings: a tenant-wide key sees both users' runs, the bound key its own user's.
    assert {r["run_id"] for r in c.get("/v1/runs", headers=admin).json()["runs"]} == {
        "run-a",
        "run-b",
    }
    assert [r["run_id"] for r in c.get("/v1/runs", headers=alice).json()["runs"]] == ["run-a"]
    mine = c.get("/v1/runs?user_id=alice&status=resumable", headers=alice).json()["runs"]
    assert [r["run_id"] for r in mine] == ["run-a"]
    assert [r["run_id"] for r in c.get("/v1/runs:resumable", headers=alice).json()["runs"]] == [
        "run-a"
    ]
    assert c.delete("/v1/runs/run-a", headers=alice).status_code == 204
    assert c.delete("/v1/users/alice", headers=alice).status_code == 204
    assert c.get("/v1/users/alice/facts", headers=alice).json() == {"facts": []}


def test_read_only_and_user_bound_combine(api: Api) -> None:
    c = api.client
    tenant = new_tenant()
    c.put("/v1/users/alice/facts/lang", json={"value": "fr"}, headers=api.key(tenant))
    reader = bound_key(api, tenant, "alice", read_only=True)
    assert c.get("/v1/users/alice/facts/lang", headers=reader).json()["value"] == "fr"
    write = c.put("/v1/users/alice/facts/lang", json={"value": "de"}, headers=reader)
    assert write.status_code == 403
    assert "--read-only" in write.json()["detail"]
    other = c.get("/v1/users/bob/facts", headers=reader)
    assert other.status_code == 403
    assert "bound to user 'alice'" in other.json()["detail"]


def test_the_registry_stores_and_verifies_the_bound_user(memory: Memory) -> None:
    registry = ApiKeyRegistry(memory.kv)
    tenant = new_tenant()
    key, info = registry.create(tenant, user_id="alice", read_only=True)
    assert (info.user_id, info.read_only) == ("alice", True)
    assert registry.verify(key).user_id == "alice"
    assert registry.get(info.key_id).user_id == "alice"
    assert [k.user_id for k in registry.list_keys(tenant=tenant)] == ["alice"]
    assert registry.create(tenant)[1].user_id is None
    with pytest.raises(InvalidInputError) as bad:
        registry.create(tenant, user_id="not a user")
    assert bad.value.field == "user_id"
    # A record stored before keys could be bound stays a key of every user.
    old = ApiKeyRecord.model_validate(
        {
            "key_id": "0123456789ab",
            "tenant": tenant,
            "scopes": ["read"],
            "secret_sha256": "0" * 64,
            "created_at": "2024-01-01T00:00:00Z",
        }
    )
    assert old.info().user_id is None


def test_cli_creates_and_lists_user_bound_keys(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERMEM_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("TIERMEM_KV_URL", raising=False)
    runner = CliRunner()
    created = runner.invoke(
        cli, ["keys", "create", "--tenant", "acme", "--user", "alice", "--read-only"]
    )
    assert created.exit_code == 0, created.output
    assert "user alice" in created.stderr
    key_id = created.stdout.strip().split("_")[1]
    assert runner.invoke(cli, ["keys", "create", "--tenant", "acme"]).exit_code == 0
    lines = runner.invoke(cli, ["keys", "list", "--tenant", "acme"]).stdout.strip().splitlines()
    rows = {line.split("\t")[0]: line.split("\t") for line in lines}
    assert rows[key_id][2:4] == ["read", "active"]
    assert rows[key_id][-1] == "alice"
    assert sorted(row[-1] for row in rows.values()) == ["*", "alice"]
    bad = runner.invoke(cli, ["keys", "create", "--tenant", "acme", "--user", "bad user"])
    assert bad.exit_code == 1
    assert "user_id" in bad.stderr
