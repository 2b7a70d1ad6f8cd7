"""Run routes for stateless HTTP workers: two-phase effects, approval requests, time travel,
the resumable listing, and the status codes and limits the OpenAPI document promises."""

from __future__ import annotations

from datetime import datetime
from typing import Any

import pytest

from tests.api.conftest import Api, new_tenant
from tiers.task import Charged

PROBLEM = "urn:tiermem:problem:"


class Worker:
    """A stateless HTTP worker of one run: it keeps only the lease epoch."""

    def __init__(self, api: Api, headers: dict[str, str], run_id: str, **body: Any) -> None:
        self.c, self.headers, self.run_id = api.client, headers, run_id
        r = self.c.post(
            "/v1/runs", json={"user_id": "u1", "run_id": run_id, **body}, headers=headers
        )
        assert r.status_code in (200, 201), r.json()
        self.epoch: int = r.json()["lease_epoch"]

    def post(self, path: str, **body: Any) -> Any:
        return self.c.post(
            f"/v1/runs/{self.run_id}{path}",
            json={"lease_epoch": self.epoch, **body},
            headers=self.headers,
        )

    def get(self, path: str = "") -> Any:
        return self.c.get(f"/v1/runs/{self.run_id}{path}", headers=self.headers)


def test_two_phase_effects_are_exactly_once_over_http(api: Api) -> None:
    tenant = new_tenant()
    headers = api.key(tenant)
    w = Worker(api, headers, "pay-1")
    begin = {"name": "charge", "idempotency_key": "order-7", "input": {"cents": 500}}
    r = w.post("/effects:begin", **begin)
    assert (r.status_code, r.json()) == (
        200,
        {"idempotency_key": "order-7", "invoke": True, "output": None},
    )
    (invoked,) = w.get("/effects").json()["effects"]
    assert (invoked["key"], invoked["status"]) == ("order-7", "invoked")  # before the call

    r = w.post("/effects:record", idempotency_key="order-7", output={"id": "ch_1"}, tokens=3)
    assert r.status_code == 200, r.json()
    assert (r.json()["status"], r.json()["output"], r.json()["source"]) == (
        "recorded",
        {"id": "ch_1"},
        "fn",
    )
    (ckpt,) = w.get("/checkpoints").json()["checkpoints"]
    assert (ckpt["step"], ckpt["output"]) == ("charge", {"id": "ch_1"})
    assert w.get().json()["head_seq"] == 1

    # A retried request: begin replays the output, record of the same output writes nothing.
    replay = w.post("/effects:begin", **begin).json()
    assert (replay["invoke"], replay["output"]) == (False, {"id": "ch_1"})
    assert w.post("/effects:record", idempotency_key="order-7", output={"id": "ch_1"}).json()[
        "output"
    ] == {"id": "ch_1"}
    other = w.post("/effects:record", idempotency_key="order-7", output={"id": "ch_2"})
    assert (other.status_code, other.json()["type"]) == (409, PROBLEM + "conflict")
    changed = w.post("/effects:begin", **{**begin, "input": {"cents": 900}})
    assert (changed.status_code, changed.json()["type"]) == (409, PROBLEM + "input-mismatch")
    missing = w.post("/effects:record", idempotency_key="never-begun", output=1)
    assert (missing.status_code, missing.json()["type"]) == (404, PROBLEM + "effect-not-found")
    assert api.service.memory.for_tenant(tenant).get_run("pay-1").spent_tokens == 3
    assert w.get().json()["head_seq"] == 1


def test_an_unknown_outcome_blocks_the_run_until_resolved_over_http(api: Api) -> None:
    headers = api.key(new_tenant())
    first = Worker(api, headers, "ship-1")
    assert first.post("/effects:begin", name="ship", idempotency_key="parcel-1").json()["invoke"]
    # The worker dies before recording; another resumes the run.
    second = Worker(api, headers, "ship-1")
    assert second.epoch == first.epoch + 1
    stale = first.post("/effects:record", idempotency_key="parcel-1", output="late")
    assert (stale.status_code, stale.json()["type"]) == (409, PROBLEM + "stale-lease")
    r = second.post("/effects:begin", name="ship", idempotency_key="parcel-1")
    assert r.status_code == 409
    problem = r.json()
    assert (problem["type"], problem["effect_key"], problem["effect_keys"]) == (
        PROBLEM + "effect-outcome-unknown",
        "parcel-1",
        ["parcel-1"],
    )
    assert second.get().json()["unknown_effects"] == ["parcel-1"]
    c = api.client
    assert c.get("/v1/runs:resumable", headers=headers).json() == {"runs": []}

    neither = c.post(
        "/v1/runs/ship-1/effects:resolve", json={"idempotency_key": "parcel-1"}, headers=headers
    )
    assert (neither.status_code, neither.json()["field"]) == (422, "output")
    resolved = c.post(
        "/v1/runs/ship-1/effects:resolve",
        json={"idempotency_key": "parcel-1", "output": None, "by": "ops"},
        headers=headers,
    )
    assert resolved.status_code == 200, resolved.json()
    assert (resolved.json()["status"], resolved.json()["source"]) == ("recorded", "operator")
    assert second.get().json()["unknown_effects"] == []
    replay = second.post("/effects:begin", name="ship", idempotency_key="parcel-1").json()
    assert (replay["invoke"], replay["output"]) == (False, None)  # null is an output too
    again = c.post(
        "/v1/runs/ship-1/effects:resolve",
        json={"idempotency_key": "parcel-1", "rerun": True},
        headers=headers,
    )
    assert (again.status_code, again.json()["type"]) == (409, PROBLEM + "run-state")


def test_a_result_recorded_after_a_cancel_is_kept_then_the_worker_stops(
    api: Api, headers: dict[str, str]
) -> None:
    w = Worker(api, headers, "cancel-1")
    w.post("/effects:begin", name="charge", idempotency_key="order-9")
    assert api.client.post("/v1/runs/cancel-1:cancel", headers=headers).status_code == 200
    r = w.post("/effects:record", idempotency_key="order-9", output={"id": "ch_9"})
    assert (r.status_code, r.json()["type"]) == (409, PROBLEM + "run-cancelled")
    assert "recorded" in r.json()["detail"]
    (rec,) = w.get("/effects").json()["effects"]
    assert (rec["status"], rec["output"]) == ("recorded", {"id": "ch_9"})
    late = w.post("/checkpoints", step="after")
    assert (late.status_code, late.json()["type"]) == (409, PROBLEM + "run-cancelled")


def test_an_http_worker_requests_an_approval_and_gets_the_decision(api: Api) -> None:
    headers = api.key(new_tenant())
    w = Worker(api, headers, "gate-1")
    plan = {"refund_cents": 4000}
    r = w.post("/approvals", plan=plan, key="refund-gate")
    assert r.status_code == 202, r.json()
    pending = r.json()
    assert (pending["run_id"], pending["approval_key"]) == ("gate-1", "refund-gate")
    run = w.get().json()
    assert (run["status"], run["pending_approval"]["plan_hash"]) == (
        "paused",
        pending["plan_hash"],
    )
    blocked = w.post("/checkpoints", step="pay")
    assert (blocked.status_code, blocked.json()["type"]) == (409, PROBLEM + "approval-pending")
    assert w.post("/approvals", plan=plan, key="refund-gate").status_code == 202  # still pending

    decision = {"plan_hash": pending["plan_hash"], "by": "ops", "note": "n" * 2000}
    assert api.client.post("/v1/runs/gate-1:approve", json=decision, headers=headers).is_success
    r = w.post("/approvals", plan=plan, key="refund-gate")
    assert r.status_code == 200
    assert (r.json()["approved"], r.json()["by"]) == (True, "ops")
    other = w.post("/approvals", plan={"refund_cents": 9999}, key="refund-gate")
    assert (other.status_code, other.json()["type"]) == (409, PROBLEM + "plan-mismatch")
    assert w.post("/checkpoints", step="pay").status_code == 201


def test_time_travel_and_the_resumable_listing_over_http(api: Api) -> None:
    tenant = new_tenant()
    headers = api.key(tenant)
    handle = api.service.memory.for_tenant(tenant).start_run("u1", "tt-1")
    for i in range(3):
        handle.step("s", lambda i=i: Charged(i, state={"i": i, f"k{i}": True}))
    c = api.client
    ckpts = c.get("/v1/runs/tt-1/checkpoints", headers=headers).json()["checkpoints"]
    state = c.get(f"/v1/runs/tt-1/checkpoints/{ckpts[1]['checkpoint_id']}/state", headers=headers)
    assert state.json() == {
        "run_id": "tt-1",
        "checkpoint_id": ckpts[1]["checkpoint_id"],
        "values": {"i": 1, "k0": True, "k1": True},
    }
    missing = c.get(
        "/v1/runs/tt-1/checkpoints/ckpt-000000000009-abcdefabcdef/state", headers=headers
    )
    assert (missing.status_code, missing.json()["type"]) == (404, PROBLEM + "checkpoint-not-found")

    edit = {"checkpoint_id": ckpts[0]["checkpoint_id"], "values": {"i": 100}}
    r = c.post("/v1/runs/tt-1:update-state", json=edit, headers=headers)
    assert r.status_code == 201, r.json()
    edited = r.json()
    assert (edited["seq"], edited["parent_id"]) == (4, ckpts[0]["checkpoint_id"])
    run = c.get("/v1/runs/tt-1", headers=headers).json()
    assert (run["status"], run["lease_epoch"]) == ("resumable", 2)  # the worker is fenced out
    after = c.get(f"/v1/runs/tt-1/checkpoints/{edited['checkpoint_id']}/state", headers=headers)
    assert after.json()["values"] == {"i": 100, "k0": True}
    bad = c.post("/v1/runs/tt-1:update-state", json={**edit, "values": [1]}, headers=headers)
    assert (bad.status_code, bad.json()["field"]) == (422, "values")

    listed = c.get("/v1/runs:resumable", headers=headers).json()["runs"]
    assert [r["run_id"] for r in listed] == ["tt-1"]
    Worker(api, headers, "tt-1", lease_ttl=60)  # a live lease: not for another worker
    assert c.get("/v1/runs:resumable", headers=headers).json() == {"runs": []}


def test_a_live_lease_protects_a_run_from_every_other_http_caller(api: Api) -> None:
    tenant = new_tenant()
    alice, bob = api.key(tenant), api.key(tenant)
    c = api.client
    body = {"user_id": "u1", "run_id": "lease-1", "lease_ttl": 30}
    first = c.post("/v1/runs", json=body, headers=alice)
    assert first.status_code == 201, first.json()
    lease = first.json()
    for headers in (alice, bob):  # without a worker id every request is a caller of its own
        held = c.post("/v1/runs", json=body, headers=headers)
        assert held.status_code == 409, held.json()
        problem = held.json()
        assert (problem["type"], problem["run_id"], problem["owner"]) == (
            PROBLEM + "lease-held",
            "lease-1",
            lease["run"]["lease_owner"],
        )
        assert datetime.fromisoformat(problem["expires_at"]) == datetime.fromisoformat(
            lease["run"]["lease_expires_at"]
        )
        assert "steal" in problem["detail"]
    beat = c.post("/v1/runs/lease-1:heartbeat", json={"lease_epoch": 1}, headers=alice)
    assert beat.status_code == 200, beat.json()  # still the first caller's lease

    # The first caller retakes its own lease with the worker id it was given.
    mine = c.post("/v1/runs", json={**body, "worker_id": lease["worker_id"]}, headers=alice)
    assert (mine.status_code, mine.json()["lease_epoch"]) == (200, 2)
    # The same worker id claimed with another key is another caller.
    theirs = c.post("/v1/runs", json={**body, "worker_id": lease["worker_id"]}, headers=bob)
    assert (theirs.status_code, theirs.json()["type"]) == (409, PROBLEM + "lease-held")
    named = {**body, "run_id": "lease-2", "worker_id": "w1"}
    assert c.post("/v1/runs", json=named, headers=alice).status_code == 201
    assert c.post("/v1/runs", json=named, headers=bob).status_code == 409
    again = c.post("/v1/runs", json=named, headers=alice)
    assert (again.status_code, again.json()["lease_epoch"]) == (200, 2)
    assert again.json()["worker_id"] == "w1"
    # Taking a live lease from another caller is explicit.
    stolen = c.post("/v1/runs", json={**body, "steal": True}, headers=bob)
    assert (stolen.status_code, stolen.json()["lease_epoch"]) == (200, 3)
    stale = c.post("/v1/runs/lease-1:heartbeat", json={"lease_epoch": 2}, headers=alice)
    assert stale.json()["type"] == PROBLEM + "stale-lease"


def test_resuming_a_fork_answers_200_like_any_resume(api: Api, headers: dict[str, str]) -> None:
    w = Worker(api, headers, "parent-1")
    ckpt = w.post("/checkpoints", step="a", output=1).json()
    fork = api.client.post(
        "/v1/runs/parent-1:fork",
        json={"checkpoint_id": ckpt["checkpoint_id"], "new_run_id": "child-1"},
        headers=headers,
    )
    assert fork.status_code == 201
    r = api.client.post("/v1/runs", json={"user_id": "u1", "run_id": "child-1"}, headers=headers)
    assert (r.status_code, r.json()["lease_epoch"]) == (200, 1)  # resumed, not created
    new = api.client.post("/v1/runs", json={"user_id": "u1", "run_id": "new-1"}, headers=headers)
    assert new.status_code == 201


def test_the_documented_approval_note_limit_is_the_enforced_one(
    api: Api, headers: dict[str, str]
) -> None:
    schemas = api.client.get("/openapi.json").json()["components"]["schemas"]
    note = schemas["ApprovalDecision"]["properties"]["note"]
    limits = [branch.get("maxLength") for branch in note.get("anyOf", [note])]
    assert 2000 in limits
    too_long = {"plan_hash": "0" * 64, "note": "n" * 2001}
    r = api.client.post("/v1/runs/nope:approve", json=too_long, headers=headers)
    assert (r.status_code, r.json()["field"]) == (422, "note")


@pytest.mark.parametrize(
    ("path", "body", "field"),
    [
        ("/effects:begin", {"name": "x"}, "idempotency_key"),
        ("/effects:begin", {"name": "x", "idempotency_key": "a\nb"}, "idempotency_key"),
        ("/effects:record", {"idempotency_key": "k", "cost": 1e300}, "cost"),
        ("/effects:record", {"idempotency_key": "k", "tokens": -1}, "tokens"),
        ("/approvals", {"plan": 1}, "key"),
    ],
)
def test_bad_effect_and_approval_requests_name_the_field(
    api: Api, headers: dict[str, str], path: str, body: dict[str, Any], field: str
) -> None:
    w = Worker(api, headers, "bad-1")
    r = w.post(path, **body)
    assert (r.status_code, r.json()["field"]) == (422, field)
    assert w.get("/effects").json() == {"effects": []}
    assert w.get().json()["head_seq"] == 0


def test_the_event_log_is_the_audit_trail_over_http(api: Api) -> None:
    headers = api.key(new_tenant())
    w = Worker(api, headers, "audit-1")
    assert w.post("/checkpoints", step="plan", output=1).status_code == 201
    begin = {"name": "charge", "idempotency_key": "order-9"}
    assert w.post("/effects:begin", **begin).json()["invoke"] is True
    assert w.post("/effects:record", idempotency_key="order-9", output="ok").status_code == 200
    assert w.post(":complete").status_code == 200

    events = w.get("/events").json()["events"]
    assert [e["kind"] for e in events] == [
        "RunStarted",
        "StepCommitted",
        "EffectInvoked",
        "EffectRecorded",
        "StepCommitted",
        "RunCompleted",
    ]
    assert [e["seq"] for e in events] == list(range(1, len(events) + 1))
    assert {e["run_id"] for e in events} == {"audit-1"}
    assert events[2]["data"]["key"] == "order-9"
    page = w.c.get(
        "/v1/runs/audit-1/events", params={"after_seq": 2, "limit": 2}, headers=headers
    ).json()["events"]
    assert [e["seq"] for e in page] == [3, 4]
    missing = w.c.get("/v1/runs/no-such-run/events", headers=headers)
    assert (missing.status_code, missing.json()["type"]) == (404, PROBLEM + "run-not-found")
    bad = w.c.get("/v1/runs/audit-1/events", params={"after_seq": -1}, headers=headers)
    assert bad.status_code == 422


def _key_id(headers: dict[str, str]) -> str:
    """The public id of the key in ``headers`` (``tmk_<key_id>_<secret>``)."""
    return headers["Authorization"].removeprefix("Bearer tmk_")[:12]


def test_decisions_record_the_authenticated_key_beside_the_claimed_name(api: Api) -> None:
    tenant = new_tenant()
    worker_key, operator = api.key(tenant), api.key(tenant)
    op_id = _key_id(operator)
    assert op_id != _key_id(worker_key)
    c = api.client
    claimed = {"by": "admin"}

    # Approve and reject: the decision, the gate's answer to the worker and the event log.
    gate = Worker(api, worker_key, "gate-a")
    pending = gate.post("/approvals", plan={"refund": 1}, key="g").json()
    r = c.post(
        "/v1/runs/gate-a:approve",
        json={"plan_hash": pending["plan_hash"], **claimed},
        headers=operator,
    )
    assert r.status_code == 200, r.json()
    assert (r.json()["by"], r.json()["by_key"]) == ("admin", op_id)
    seen = gate.post("/approvals", plan={"refund": 1}, key="g").json()
    assert (seen["by"], seen["by_key"]) == ("admin", op_id)
    (granted,) = [e for e in gate.get("/events").json()["events"] if e["kind"] == "ApprovalGranted"]
    assert (granted["data"]["by"], granted["data"]["by_key"]) == ("admin", op_id)
    gate_r = Worker(api, worker_key, "gate-r")
    pending = gate_r.post("/approvals", plan=[], key="g").json()
    r = c.post("/v1/runs/gate-r:reject", json={"plan_hash": pending["plan_hash"]}, headers=operator)
    assert (r.json()["approved"], r.json()["by"], r.json()["by_key"]) == (
        False,
        f"api-key:{op_id}",  # no claimed name: the key's id stands for it
        op_id,
    )

    # Resolving an effect of unknown outcome: the ledger entry and the event.
    Worker(api, worker_key, "eff-1").post("/effects:begin", name="ship", idempotency_key="p")
    blocked = Worker(api, worker_key, "eff-1").post(
        "/effects:begin", name="ship", idempotency_key="p"
    )
    assert blocked.status_code == 409
    r = c.post(
        "/v1/runs/eff-1/effects:resolve",
        json={"idempotency_key": "p", "rerun": True, **claimed},
        headers=operator,
    )
    assert r.status_code == 200, r.json()
    assert (r.json()["resolved_by"], r.json()["resolved_by_key"]) == ("admin", op_id)
    (ledger,) = c.get("/v1/runs/eff-1/effects", headers=worker_key).json()["effects"]
    assert (ledger["resolved_by"], ledger["resolved_by_key"]) == ("admin", op_id)
    events = c.get("/v1/runs/eff-1/events", headers=worker_key).json()["events"]
    (not_done,) = [e for e in events if e["kind"] == "EffectNotDone"]
    assert (not_done["data"]["by"], not_done["data"]["by_key"]) == ("admin", op_id)

    # Editing state.
    edit = Worker(api, worker_key, "edit-1")
    ckpt = edit.post("/checkpoints", step="s", output=1, state={"x": 1}).json()
    r = c.post(
        "/v1/runs/edit-1:update-state",
        json={"checkpoint_id": ckpt["checkpoint_id"], "values": {"x": 2}, **claimed},
        headers=operator,
    )
    assert r.status_code == 201, r.json()
    events = edit.get("/events").json()["events"]
    (updated,) = [e for e in events if e["kind"] == "StateUpdated"]
    assert (updated["data"]["by"], updated["data"]["by_key"]) == ("admin", op_id)
