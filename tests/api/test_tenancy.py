"""Tenant isolation: tenant A cannot read, list, recall or modify tenant B's data through any route.

A uses B's user ids, session ids, run ids, checkpoint ids, lease epochs and job
ids. Every /v1 route of the app is probed (a test fails if a new route is not),
and B's data is compared before and after.
"""

from __future__ import annotations

import re
import time
from typing import Any
from urllib.parse import quote

from tests.api.conftest import Api, new_tenant
from tests.api.test_routes import SUMMARY, TRANSCRIPT, wait_job

SECRET = "zanzibar-7731"


def v1_operations(api: Api) -> set[tuple[str, str]]:
    """Every (method, path template) of the /v1 API, from its OpenAPI document."""
    paths = api.client.get("/openapi.json").json()["paths"]
    return {(m.upper(), p) for p, ops in paths.items() if p.startswith("/v1/") for m in ops}


def template_of(operations: set[tuple[str, str]], method: str, path: str) -> str:
    """The path template a concrete path is routed to (the most specific match)."""
    matches = [
        template
        for m, template in operations
        if m == method and re.fullmatch(re.sub(r"\{[^}]+\}", "[^/]+", template), path)
    ]
    assert matches, (method, path)
    return max(matches, key=lambda t: len(re.sub(r"\{[^}]+\}", "", t)))


def snapshot(api: Api, b: dict[str, str], run_id: str, job_url: str) -> dict[str, Any]:
    """Everything B can see of its data."""
    c = api.client
    return {
        "facts": c.get("/v1/users/u-b/facts", headers=b).json(),
        "history": c.get("/v1/users/u-b/facts/secret/history", headers=b).json(),
        "sessions": c.get("/v1/users/u-b/sessions", headers=b).json(),
        "recall": c.post("/v1/users/u-b/sessions:recall", json={"query": SECRET}, headers=b).json(),
        "context": c.post("/v1/users/u-b/context", json={"query": SECRET}, headers=b).json(),
        "run": c.get(f"/v1/runs/{run_id}", headers=b).json(),
        "runs": c.get("/v1/runs", headers=b).json(),
        "checkpoints": c.get(f"/v1/runs/{run_id}/checkpoints", headers=b).json(),
        "newest": c.get(f"/v1/runs/{run_id}/checkpoints?newest_first=true", headers=b).json(),
        "effects": c.get(f"/v1/runs/{run_id}/effects", headers=b).json(),
        "events": c.get(f"/v1/runs/{run_id}/events", headers=b).json(),
        "resumable": c.get("/v1/runs:resumable", headers=b).json(),
        "job": c.get(job_url, headers=b).json(),
    }


def test_tenant_a_cannot_touch_tenant_b_through_any_route(api: Api) -> None:
    c = api.client
    b = api.key(new_tenant())
    a = api.key(new_tenant())

    # B's data, with ids A will use.
    c.put("/v1/users/u-b/facts/secret", json={"value": SECRET}, headers=b)
    c.post(
        "/v1/users/u-b/sessions",
        json={"session_id": "s-b", "summary": {**SUMMARY, "task_description": f"Plan {SECRET}"}},
        headers=b,
    )
    run = c.post("/v1/runs", json={"user_id": "u-b", "run_id": "run-b"}, headers=b).json()
    epoch = run["lease_epoch"]
    ckpt = c.post(
        "/v1/runs/run-b/checkpoints",
        json={"lease_epoch": epoch, "step": "s", "output": SECRET},
        headers=b,
    ).json()
    effect = {"lease_epoch": epoch, "idempotency_key": "pay-b"}
    c.post("/v1/runs/run-b/effects:begin", json={**effect, "name": "pay"}, headers=b)
    c.post("/v1/runs/run-b/effects:record", json={**effect, "output": SECRET}, headers=b)
    c.post(
        "/v1/runs/run-b/effects:begin",
        json={**effect, "name": "pay", "idempotency_key": "x"},
        headers=b,
    )
    job = c.post(
        "/v1/users/u-b/sessions", json={"session_id": "s-b2", "transcript": TRANSCRIPT}, headers=b
    ).json()
    assert wait_job(api, b, job["status_url"])["status"] == "succeeded"
    before = snapshot(api, b, "run-b", job["status_url"])
    assert before["facts"]["facts"]
    assert before["recall"]["results"]
    assert before["checkpoints"]["checkpoints"]
    assert SECRET in str(before["effects"])
    assert before["resumable"]["runs"]
    assert SECRET in before["context"]["text"]

    all_v1 = v1_operations(api)
    probed: set[tuple[str, str]] = set()

    def probe(method: str, path: str, body: Any = None) -> Any:
        r = c.request(method, path, json=body, headers=a)
        probed.add((method, template_of(all_v1, method, path.split("?")[0])))
        assert SECRET not in r.text, (method, path)
        return r

    # Reads and B-targeted changes: A sees nothing of B's and changes nothing of B's.
    assert probe("GET", "/v1/users/u-b/facts").json() == {"facts": []}
    assert probe("GET", "/v1/users/u-b/facts/secret").status_code == 404
    assert probe("GET", "/v1/users/u-b/facts/secret/history").json() == {"facts": []}
    assert probe("DELETE", "/v1/users/u-b/facts/secret").status_code == 404
    assert probe("GET", "/v1/users/u-b/sessions").json() == {"sessions": []}
    assert probe("GET", "/v1/users/u-b/sessions/s-b").status_code == 404
    assert probe("DELETE", "/v1/users/u-b/sessions/s-b").status_code == 404
    assert probe("POST", "/v1/users/u-b/sessions:recall", {"query": SECRET}).json() == {
        "results": []
    }
    assert probe("POST", "/v1/users/u-b/context", {"query": SECRET}).json()["text"] == ""
    assert probe("GET", job["status_url"]).status_code == 404
    assert probe("GET", "/v1/users/u-b/sessions:pending").json() == {"session_ids": []}
    assert probe("POST", "/v1/users/u-b/sessions/s-b2:resummarize").status_code == 404
    assert probe("GET", "/v1/runs").json() == {"runs": []}
    assert probe("GET", "/v1/runs/run-b").status_code == 404
    assert probe("GET", "/v1/runs/run-b:resume-plan").status_code == 404
    assert probe("GET", "/v1/runs/run-b/checkpoints").status_code == 404
    assert probe("GET", "/v1/runs/run-b/checkpoints?newest_first=true&limit=1").status_code == 404
    by_key = f"/v1/runs/run-b/checkpoints:by-key?idempotency_key={quote(ckpt['idempotency_key'])}"
    assert probe("GET", by_key).status_code == 404
    assert probe("GET", f"/v1/runs/run-b/checkpoints/{ckpt['checkpoint_id']}").status_code == 404
    checkpoint = {"lease_epoch": epoch, "step": "evil", "output": "x"}
    assert probe("POST", "/v1/runs/run-b/checkpoints", checkpoint).status_code == 404
    assert probe("POST", "/v1/runs/run-b:complete", {"lease_epoch": epoch}).status_code == 404
    assert (
        probe("POST", "/v1/runs/run-b:fail", {"lease_epoch": epoch, "error": "x"}).status_code
        == 404
    )
    assert probe("POST", "/v1/runs/run-b:cancel").status_code == 404
    assert probe("POST", "/v1/runs/run-b:set-budget", {"budget_tokens": 1}).status_code == 404
    decision = {"plan_hash": "0" * 64}
    assert probe("POST", "/v1/runs/run-b:approve", decision).status_code == 404
    assert probe("POST", "/v1/runs/run-b:reject", decision).status_code == 404
    fork = {"checkpoint_id": ckpt["checkpoint_id"], "new_run_id": "fork-a"}
    assert probe("POST", "/v1/runs/run-b:fork", fork).status_code == 404
    assert probe("POST", "/v1/runs/run-b:heartbeat", {"lease_epoch": epoch}).status_code == 404
    assert probe("GET", "/v1/runs:resumable").json() == {"runs": []}
    assert probe("DELETE", "/v1/runs/run-b").status_code == 404
    state_path = f"/v1/runs/run-b/checkpoints/{ckpt['checkpoint_id']}/state"
    assert probe("GET", state_path).status_code == 404
    edit = {"checkpoint_id": ckpt["checkpoint_id"], "values": {"evil": 1}}
    assert probe("POST", "/v1/runs/run-b:update-state", edit).status_code == 404
    assert probe("GET", "/v1/runs/run-b/effects").status_code == 404
    assert probe("GET", "/v1/runs/run-b/events").status_code == 404
    begin = {**effect, "name": "pay"}
    assert probe("POST", "/v1/runs/run-b/effects:begin", begin).status_code == 404
    record = {**effect, "output": "evil"}
    assert probe("POST", "/v1/runs/run-b/effects:record", record).status_code == 404
    resolve = {"idempotency_key": "x", "output": "evil"}
    assert probe("POST", "/v1/runs/run-b/effects:resolve", resolve).status_code == 404
    gate = {"lease_epoch": epoch, "plan": "evil", "key": "gate"}
    assert probe("POST", "/v1/runs/run-b/approvals", gate).status_code == 404
    assert probe("DELETE", "/v1/users/u-b/facts").status_code == 204
    assert probe("DELETE", "/v1/users/u-b").status_code == 204

    # Writes with B's ids land in A's own namespace.
    assert probe("PUT", "/v1/users/u-b/facts/secret", {"value": "overwritten"}).status_code == 200
    assert (
        probe("PUT", "/v1/users/u-b/facts", {"facts": {"secret": "overwritten"}}).status_code == 200
    )
    r = probe(
        "POST",
        "/v1/users/u-b/sessions",
        {"session_id": "s-b", "summary": {"task_description": "A's"}},
    )
    assert r.status_code == 201
    r = probe("POST", "/v1/runs", {"user_id": "u-b", "run_id": "run-b"})
    assert (r.status_code, r.json()["lease_epoch"]) == (201, 1)  # a new run of A's, not B's resumed
    assert c.get("/v1/users/u-b/facts/secret", headers=a).json()["value"] == "overwritten"

    assert all_v1 - probed == set(), "routes missing from the cross-tenant probe"

    time.sleep(0.05)  # let any index work settle before comparing
    assert snapshot(api, b, "run-b", job["status_url"]) == before


def test_the_key_decides_the_tenant_not_the_request(api: Api) -> None:
    tenant = new_tenant()
    user = f"u-{tenant}"
    api.client.put(f"/v1/users/{user}/facts/k", json={"value": 1}, headers=api.key(tenant))
    # The fact is stored under the key's tenant, and only there.
    assert api.service.memory.for_tenant(tenant).get_fact(user, "k").value == 1
    assert api.service.memory.get_facts(user) == []
