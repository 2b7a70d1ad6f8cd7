"""Run primitives over HTTP: deleting a run, checkpoint lookups, history pages, external ids,
and the one answer every run route gives for a run that does not exist."""

from __future__ import annotations

from typing import Any
from urllib.parse import quote

from memory.operations import OPERATIONS, RUN_OPERATIONS
from tests.api.conftest import Api, new_tenant
from tiers.ids import run_id_for

PROBLEM = "urn:tiermem:problem:"


def start(api: Api, headers: dict[str, str], **body: object) -> dict[str, object]:
    r = api.client.post("/v1/runs", json={"user_id": "u1", **body}, headers=headers)
    assert r.status_code in (200, 201), r.json()
    data: dict[str, object] = r.json()
    return data


def test_delete_run_over_http_and_the_old_lease_stays_dead(api: Api) -> None:
    c, headers = api.client, api.key(new_tenant())
    lease = start(api, headers, run_id="gone")
    run = lease["run"]
    assert isinstance(run, dict)
    old = {"lease_epoch": lease["lease_epoch"], "incarnation": run["incarnation"]}
    r = c.post("/v1/runs/gone/checkpoints", json={**old, "step": "s", "output": 1}, headers=headers)
    assert r.status_code == 201

    stranger = api.key(new_tenant())
    assert c.delete("/v1/runs/gone", headers=stranger).status_code == 404  # another tenant's
    r = c.delete("/v1/runs/gone", headers=headers)
    assert (r.status_code, r.content) == (204, b"")
    r = c.delete("/v1/runs/gone", headers=headers)
    assert (r.status_code, r.json()["type"]) == (404, PROBLEM + "run-not-found")
    assert c.get("/v1/runs/gone", headers=headers).status_code == 404
    r = c.post("/v1/runs/gone/checkpoints", json={**old, "step": "s", "output": 2}, headers=headers)
    assert (r.status_code, r.json()["type"]) == (404, PROBLEM + "run-not-found")

    # A new run under the same id restarts at epoch 1; the old lease (with its incarnation)
    # is still refused and writes nothing into it.
    again = start(api, headers, run_id="gone")
    assert again["lease_epoch"] == old["lease_epoch"] == 1
    for path, body in (
        ("/checkpoints", {"step": "late", "output": 3}),
        (":complete", {}),
        (":heartbeat", {}),
        ("/effects:begin", {"name": "pay", "idempotency_key": "p1"}),
    ):
        r = c.post(f"/v1/runs/gone{path}", json={**old, **body}, headers=headers)
        assert (r.status_code, r.json()["type"]) == (404, PROBLEM + "run-not-found"), path
    new = c.get("/v1/runs/gone", headers=headers).json()
    assert (new["head_seq"], new["status"]) == (0, "running")
    assert new["incarnation"] != old["incarnation"]
    assert len(c.get("/v1/runs/gone/events", headers=headers).json()["events"]) == 1


def test_delete_run_needs_a_write_key(api: Api) -> None:
    tenant = new_tenant()
    start(api, api.key(tenant), run_id="keep")
    r = api.client.delete("/v1/runs/keep", headers=api.key(tenant, read_only=True))
    assert r.status_code == 403
    assert api.client.get("/v1/runs/keep", headers=api.key(tenant)).status_code == 200


def test_checkpoint_lookups_and_history_pages_over_http(api: Api) -> None:
    c, headers = api.client, api.key(new_tenant())
    lease = start(api, headers, run_id="pages")
    epoch = lease["lease_epoch"]
    made = []
    for n in range(1, 8):
        r = c.post(
            "/v1/runs/pages/checkpoints",
            json={"lease_epoch": epoch, "step": "s", "output": n, "idempotency_key": f"k/{n}"},
            headers=headers,
        )
        made.append(r.json())

    def seqs(query: str) -> list[int]:
        r = c.get(f"/v1/runs/pages/checkpoints{query}", headers=headers)
        assert r.status_code == 200, r.json()
        return [ckpt["seq"] for ckpt in r.json()["checkpoints"]]

    assert seqs("") == [1, 2, 3, 4, 5, 6, 7]
    assert seqs("?newest_first=true&limit=3") == [7, 6, 5]
    assert seqs("?newest_first=true&limit=3&before_seq=5") == [4, 3, 2]
    assert seqs("?limit=2&after_seq=5") == [6, 7]
    assert seqs("?after_seq=2&before_seq=5") == [3, 4]
    for bad in ("?before_seq=-1", "?limit=-1", "?newest_first=maybe"):
        r = c.get(f"/v1/runs/pages/checkpoints{bad}", headers=headers)
        assert r.status_code == 422, bad

    by_id = c.get(f"/v1/runs/pages/checkpoints/{made[2]['checkpoint_id']}", headers=headers)
    assert by_id.json() == made[2]
    by_key = c.get(
        f"/v1/runs/pages/checkpoints:by-key?idempotency_key={quote('k/4')}", headers=headers
    )
    assert (by_key.status_code, by_key.json()) == (200, made[3])
    r = c.get("/v1/runs/pages/checkpoints:by-key?idempotency_key=nope", headers=headers)
    assert (r.status_code, r.json()["type"]) == (404, PROBLEM + "checkpoint-not-found")
    r = c.get("/v1/runs/none/checkpoints:by-key?idempotency_key=k", headers=headers)
    assert (r.status_code, r.json()["type"]) == (404, PROBLEM + "run-not-found")
    for bad in ("", "?idempotency_key=", "?idempotency_key=%00"):
        r = c.get(f"/v1/runs/pages/checkpoints:by-key{bad}", headers=headers)
        assert r.status_code == 422, bad


def test_runs_named_by_external_ids_over_http(api: Api) -> None:
    headers = api.key(new_tenant())
    lease = start(api, headers, external_id="user:42/chat")
    run = lease["run"]
    assert isinstance(run, dict)
    assert (run["run_id"], run["external_id"]) == (run_id_for("user:42/chat"), "user:42/chat")
    resumed = start(api, headers, external_id="user:42/chat")
    assert resumed["lease_epoch"] == 2
    r = api.client.post(
        "/v1/runs",
        json={"user_id": "u1", "run_id": run["run_id"], "external_id": "user:43/chat"},
        headers=headers,
    )
    assert (r.status_code, r.json()["type"]) == (409, PROBLEM + "conflict")
    r = api.client.post(
        "/v1/runs", json={"user_id": "u1", "external_id": "x" * 1025}, headers=headers
    )
    assert r.status_code == 422


# A valid body of each route under /v1/runs/{run_id} that takes one: the route must find the
# run before anything else can refuse the request. A new route needs an entry (KeyError).
_BODIES: dict[str, dict[str, Any]] = {
    "update_run_state": {"checkpoint_id": "c1", "values": {}},
    "resolve_effect": {"idempotency_key": "k", "rerun": True},
    "cancel_run": {},
    "set_budget": {"budget_tokens": 5},
    "approve_run": {"plan_hash": "a" * 64},
    "reject_run": {"plan_hash": "a" * 64},
    "fork_run": {"checkpoint_id": "c1"},
    "append_checkpoint": {"lease_epoch": 1, "step": "s"},
    "begin_effect": {"lease_epoch": 1, "name": "pay", "idempotency_key": "k"},
    "record_effect": {"lease_epoch": 1, "idempotency_key": "k"},
    "await_approval": {"lease_epoch": 1, "plan": {}, "key": "g"},
    "heartbeat": {"lease_epoch": 1},
    "complete": {"lease_epoch": 1},
    "fail": {"lease_epoch": 1, "error": "x"},
}
_QUERIES = {"checkpoint_for_key": {"idempotency_key": "k"}}


def test_every_run_route_answers_an_absent_run_with_the_same_problem(api: Api) -> None:
    tenant = new_tenant()
    headers = api.key(tenant)
    answers: dict[str, tuple[str, str]] = {}
    for op in (*OPERATIONS, *RUN_OPERATIONS):
        if op.route is None or "{run_id}" not in op.route.path:
            continue
        path = op.route.path.format(run_id="absent-1", checkpoint_id="c1")
        r = api.client.request(
            op.route.method,
            path,
            json=_BODIES[op.name] if op.route.method == "POST" else None,
            params=_QUERIES.get(op.name),
            headers=headers,
        )
        assert r.status_code == 404, (op.name, r.text)
        answers[op.name] = (r.json()["type"], r.json()["detail"])
    assert len(answers) > 20
    expected = (PROBLEM + "run-not-found", f"no run 'absent-1' in tenant {tenant!r}")
    assert set(answers.values()) == {expected}, answers
