"""Every /v1 route end to end on the real app, on the embedded default and on Redis."""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any, Protocol

import pytest

from tests.api.conftest import Api, new_tenant
from tests.waiting import wait_until
from tiers.errors import ApprovalPendingError

SUMMARY = {
    "task_description": "Migrate the billing database from MySQL to Postgres",
    "decisions_made": ["Use logical replication for the cutover"],
    "work_completed": ["Wrote the schema conversion script"],
    "open_questions": ["What about the stored procedures?"],
    "next_recommended_steps": ["Port the three stored procedures to PL/pgSQL"],
}
TRANSCRIPT = [
    {
        "role": "user",
        "content": "I need help migrating our billing service from MySQL to Postgres.",
    },
    {"role": "assistant", "content": "We decided to use logical replication for the cutover."},
    {"role": "user", "content": "I prefer short answers with code samples."},
    {"role": "assistant", "content": "Next step: port the three stored procedures to PL/pgSQL."},
]


class Response(Protocol):
    """What :func:`finished_job` reads of an HTTP response (the app's test client's or httpx's)."""

    status_code: int

    @property
    def text(self) -> str: ...

    def json(self) -> Any: ...


def finished_job(
    fetch: Callable[[], Response], timeout_s: float = 60, *, every_s: float = 0.02
) -> dict[str, Any]:
    """Poll a summary job until it has succeeded or failed, and return it.

    Args:
        fetch: Reads the job's status (a ``GET`` of its URL) from the server that runs it.
        timeout_s: How long to poll before failing, the job's last status in the message.
        every_s: The pause between polls.

    Returns:
        The job's body once its status is ``succeeded`` or ``failed``.
    """

    def job() -> dict[str, Any]:
        r = fetch()
        assert r.status_code == 200, r.text
        body: dict[str, Any] = r.json()
        return body

    def done() -> dict[str, Any] | None:
        body = job()
        return body if body["status"] in ("succeeded", "failed") else None

    return wait_until(done, timeout_s, what=lambda: f"the job to finish: {job()}", every_s=every_s)


def wait_job(api: Api, headers: dict[str, str], url: str) -> dict[str, Any]:
    """The job at ``url`` of the app ``api`` once it has succeeded or failed."""
    return finished_job(lambda: api.client.get(url, headers=headers))


# -- facts -------------------------------------------------------------------------------------


def test_fact_lifecycle(api: Api, headers: dict[str, str]) -> None:
    c = api.client
    assert c.get("/v1/users/u1/facts", headers=headers).json() == {"facts": []}

    r = c.put("/v1/users/u1/facts/language", json={"value": "fr"}, headers=headers)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    assert r.json()["value"] == "fr"
    assert r.json()["source"] == "api"
    c.put("/v1/users/u1/facts/language", json={"value": "de", "source": "crm"}, headers=headers)

    fact = c.get("/v1/users/u1/facts/language", headers=headers).json()
    assert (fact["value"], fact["source"], fact["user_id"]) == ("de", "crm", "u1")
    history = c.get("/v1/users/u1/facts/language/history", headers=headers).json()["facts"]
    assert [v["value"] for v in history] == ["fr", "de"]

    assert c.delete("/v1/users/u1/facts/language", headers=headers).status_code == 204
    assert c.get("/v1/users/u1/facts/language", headers=headers).status_code == 404
    assert c.delete("/v1/users/u1/facts/language", headers=headers).status_code == 404
    history = c.get("/v1/users/u1/facts/language/history", headers=headers).json()["facts"]
    assert history[-1]["source"] == "deleted"
    assert history[-1]["value"] is None


def test_bulk_facts_and_delete_all(api: Api, headers: dict[str, str]) -> None:
    c = api.client
    body = {"facts": {"tone": "short", "langs": ["fr", "en"], "age": 41}, "source": "import"}
    r = c.put("/v1/users/u2/facts", json=body, headers=headers)
    assert r.status_code == 200
    assert [f["key"] for f in r.json()["facts"]] == ["tone", "langs", "age"]
    listed = c.get("/v1/users/u2/facts", headers=headers).json()["facts"]
    assert {f["key"]: f["value"] for f in listed} == {
        "tone": "short",
        "langs": ["fr", "en"],
        "age": 41,
    }
    assert [f["key"] for f in listed] == sorted(f["key"] for f in listed)

    assert c.delete("/v1/users/u2/facts", headers=headers).status_code == 204
    assert c.get("/v1/users/u2/facts", headers=headers).json() == {"facts": []}


def test_bulk_facts_with_one_value_too_large_write_nothing(
    api: Api, headers: dict[str, str]
) -> None:
    limit = api.service.memory.kv.max_value_bytes
    body = {"facts": {"small": "ok", "huge": "x" * limit}}
    r = api.client.put("/v1/users/u3/facts", json=body, headers=headers)
    assert r.status_code == 413
    assert r.json()["field"] == "facts.huge"
    assert api.client.get("/v1/users/u3/facts", headers=headers).json() == {"facts": []}


# JSON text Python's parser accepts but a stored JSON value cannot hold: NaN, infinities
# (1e400 parses as inf) and strings with a lone surrogate (valid as a \\u escape, not in UTF-8).
NOT_JSON_VALUES = ["NaN", "Infinity", "-Infinity", "1e400", '"\\ud800"', '{"a": ["x\\udfff"]}']


@pytest.mark.parametrize("raw", NOT_JSON_VALUES)
def test_fact_values_json_cannot_hold_are_422_naming_the_field(
    api: Api, headers: dict[str, str], raw: str
) -> None:
    c = api.client
    json_headers = {**headers, "Content-Type": "application/json"}
    assert c.put("/v1/users/u4/facts/k", json={"value": "before"}, headers=headers).is_success
    r = c.put("/v1/users/u4/facts/k", content=f'{{"value": {raw}}}', headers=json_headers)
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["field"] == "value"
    r = c.put(
        "/v1/users/u4/facts",
        content=f'{{"facts": {{"k": "after", "other": 1, "bad": {raw}}}}}',
        headers=json_headers,
    )
    assert r.status_code == 422, r.text
    assert r.json()["field"] == "facts.bad"
    facts = c.get("/v1/users/u4/facts", headers=headers).json()["facts"]
    assert [(f["key"], f["value"]) for f in facts] == [("k", "before")]


@pytest.mark.parametrize(
    ("body", "field"),
    [
        ('{"session_id": "s1", "summary": {"task_description": "a\\ud800"}}', "task_description"),
        ('{"session_id": "s1", "summary": {"open_questions": ["\\udc00?"]}}', "open_questions"),
        ('{"session_id": "s1", "transcript": [{"role": "user", "content": "\\ud800"}]}', "content"),
    ],
)
def test_session_text_with_a_lone_surrogate_is_422(
    api: Api, headers: dict[str, str], body: str, field: str
) -> None:
    r = api.client.post(
        "/v1/users/u4/sessions?wait=true",
        content=body,
        headers={**headers, "Content-Type": "application/json"},
    )
    assert r.status_code == 422, r.text
    assert field in r.text
    assert api.client.get("/v1/users/u4/sessions", headers=headers).json() == {"sessions": []}
    pending = api.client.get("/v1/users/u4/sessions:pending", headers=headers).json()
    assert pending == {"session_ids": []}


def test_forget_user_removes_facts_and_sessions(api: Api, headers: dict[str, str]) -> None:
    c = api.client
    c.put("/v1/users/gone/facts/k", json={"value": 1}, headers=headers)
    c.post(
        "/v1/users/gone/sessions", json={"session_id": "s1", "summary": SUMMARY}, headers=headers
    )
    c.put("/v1/users/stays/facts/k", json={"value": 2}, headers=headers)
    assert c.delete("/v1/users/gone", headers=headers).status_code == 204
    assert c.get("/v1/users/gone/facts", headers=headers).json() == {"facts": []}
    assert c.get("/v1/users/gone/sessions", headers=headers).json() == {"sessions": []}
    assert c.get("/v1/users/stays/facts/k", headers=headers).json()["value"] == 2


# -- sessions ----------------------------------------------------------------------------------


def test_structured_summary_roundtrip_list_recall_delete(api: Api, headers: dict[str, str]) -> None:
    c = api.client
    old = (datetime.now(UTC) - timedelta(days=3)).isoformat()
    r = c.post(
        "/v1/users/u1/sessions",
        json={"session_id": "s-db", "summary": SUMMARY, "created_at": old},
        headers=headers,
    )
    assert r.status_code == 201
    assert r.json()["decisions_made"] == SUMMARY["decisions_made"]
    other = {
        "task_description": "Plan the team offsite in Lisbon",
        "decisions_made": ["Book in May"],
    }
    r = c.post(
        "/v1/users/u1/sessions", json={"session_id": "s-trip", "summary": other}, headers=headers
    )
    assert r.status_code == 201

    got = c.get("/v1/users/u1/sessions/s-db", headers=headers).json()
    assert got["task_description"] == SUMMARY["task_description"]
    assert got["created_at"].startswith(old[:19])
    listed = c.get("/v1/users/u1/sessions", headers=headers).json()["sessions"]
    assert [s["session_id"] for s in listed] == ["s-trip", "s-db"]  # newest first
    assert len(c.get("/v1/users/u1/sessions?limit=1", headers=headers).json()["sessions"]) == 1

    recall = c.post(
        "/v1/users/u1/sessions:recall",
        json={"query": "postgres replication", "top_k": 2},
        headers=headers,
    ).json()["results"]
    assert [hit["session"]["session_id"] for hit in recall] == ["s-db", "s-trip"]
    assert recall[0]["score"] > recall[1]["score"]

    assert c.delete("/v1/users/u1/sessions/s-db", headers=headers).status_code == 204
    assert c.get("/v1/users/u1/sessions/s-db", headers=headers).status_code == 404
    assert c.delete("/v1/users/u1/sessions/s-db", headers=headers).status_code == 404
    recall = c.post(
        "/v1/users/u1/sessions:recall", json={"query": "postgres replication"}, headers=headers
    ).json()["results"]
    assert [hit["session"]["session_id"] for hit in recall] == ["s-trip"]


def test_transcript_is_summarized_in_the_background(api: Api, headers: dict[str, str]) -> None:
    c = api.client
    r = c.post(
        "/v1/users/u1/sessions",
        json={"session_id": "s1", "transcript": TRANSCRIPT},
        headers=headers,
    )
    assert r.status_code == 202
    job = r.json()
    assert r.headers["location"] == job["status_url"] == f"/v1/jobs/{job['job_id']}"
    assert job["session_url"] == "/v1/users/u1/sessions/s1"
    assert job["status"] in ("pending", "running", "succeeded")

    done = wait_job(api, headers, job["status_url"])
    assert done["status"] == "succeeded", done
    assert done["finished_at"] is not None
    saved = c.get(done["session_url"], headers=headers).json()
    assert saved == done["session"]
    assert "Postgres" in saved["task_description"]
    # Facts the summarizer found are stored with the session as their source.
    facts = c.get("/v1/users/u1/facts", headers=headers).json()["facts"]
    assert facts
    assert all(f["source"] == "session:s1" for f in facts)


def test_transcript_with_wait_answers_with_the_summary(api: Api, headers: dict[str, str]) -> None:
    r = api.client.post(
        "/v1/users/u1/sessions?wait=true",
        json={"session_id": "s2", "transcript": TRANSCRIPT},
        headers=headers,
    )
    assert r.status_code == 201
    assert r.json()["session_id"] == "s2"
    assert api.client.get("/v1/users/u1/sessions/s2", headers=headers).json() == r.json()


# -- context -----------------------------------------------------------------------------------


def test_context_has_sections_token_counts_and_fits_the_budget(api: Api) -> None:
    tenant = new_tenant()
    headers = api.key(tenant)
    c = api.client
    c.put(
        "/v1/users/u1/facts", json={"facts": {"language": "fr", "tone": "short"}}, headers=headers
    )
    c.post(
        "/v1/users/u1/sessions", json={"session_id": "s-db", "summary": SUMMARY}, headers=headers
    )

    r = c.post(
        "/v1/users/u1/context",
        json={"query": "database migration", "max_tokens": 500},
        headers=headers,
    )
    assert r.status_code == 200
    ctx = r.json()
    assert ctx["max_tokens"] == 500
    assert 0 < ctx["tokens"] <= 500
    assert [s["name"] for s in ctx["sections"]] == ["user_facts", "sessions"]
    assert set(ctx["sections"][0]["items"]) == {"language", "tone"}
    assert ctx["sections"][1]["items"] == ["s-db"]
    assert all(s["text"] in ctx["text"] and s["tokens"] > 0 for s in ctx["sections"])
    # The API answers exactly what the library assembles for the same tenant.
    library = api.service.memory.for_tenant(tenant)
    assert ctx["text"] == library.build_continuation_context("u1", "database migration", 500)

    tight = c.post("/v1/users/u1/context", json={"max_tokens": 40}, headers=headers).json()
    assert tight["tokens"] <= 40
    assert tight["omitted_session_ids"] == ["s-db"]


def test_context_of_an_unknown_user_is_empty(api: Api, headers: dict[str, str]) -> None:
    ctx = api.client.post("/v1/users/nobody/context", json={}, headers=headers).json()
    assert ctx["text"] == ""
    assert ctx["sections"] == []


# -- runs --------------------------------------------------------------------------------------


def start(api: Api, headers: dict[str, str], **body: Any) -> tuple[str, int]:
    r = api.client.post("/v1/runs", json={"user_id": "u1", **body}, headers=headers)
    assert r.status_code in (200, 201), r.json()
    return r.json()["run"]["run_id"], r.json()["lease_epoch"]


def test_run_create_checkpoint_complete(api: Api, headers: dict[str, str]) -> None:
    c = api.client
    r = c.post("/v1/runs", json={"user_id": "u1", "run_id": "refund-1"}, headers=headers)
    assert r.status_code == 201
    assert r.json()["lease_epoch"] == 1
    assert r.json()["run"]["status"] == "running"
    ckpts = []
    for step in ("authenticate", "validate", "refund"):
        r = c.post(
            "/v1/runs/refund-1/checkpoints",
            json={"lease_epoch": 1, "step": step, "output": {"ok": step}, "input": {"order": 7}},
            headers=headers,
        )
        assert r.status_code == 201
        ckpts.append(r.json())
    assert [ck["seq"] for ck in ckpts] == [1, 2, 3]
    assert ckpts[1]["parent_id"] == ckpts[0]["checkpoint_id"]

    history = c.get("/v1/runs/refund-1/checkpoints", headers=headers).json()["checkpoints"]
    assert history == ckpts
    page = c.get("/v1/runs/refund-1/checkpoints?after_seq=1&limit=1", headers=headers).json()
    assert [ck["seq"] for ck in page["checkpoints"]] == [2]
    one = c.get(f"/v1/runs/refund-1/checkpoints/{ckpts[2]['checkpoint_id']}", headers=headers)
    assert one.json() == ckpts[2]
    assert (
        c.get(
            "/v1/runs/refund-1/checkpoints/ckpt-000000000009-abcdefabcdef", headers=headers
        ).status_code
        == 404
    )

    run = c.get("/v1/runs/refund-1", headers=headers).json()
    assert (run["head_seq"], run["head_checkpoint_id"]) == (3, ckpts[2]["checkpoint_id"])
    assert run["last_checkpoint_at"] == ckpts[2]["created_at"]

    r = c.post(
        "/v1/runs/refund-1:complete",
        json={"lease_epoch": 1, "result": {"refunded": 42}},
        headers=headers,
    )
    assert r.status_code == 200
    assert (r.json()["status"], r.json()["result"]) == ("completed", {"refunded": 42})
    r = c.post(
        "/v1/runs/refund-1/checkpoints", json={"lease_epoch": 1, "step": "late"}, headers=headers
    )
    assert r.status_code == 409
    assert r.json()["type"].endswith(":run-state")
    assert c.get("/v1/runs/refund-1", headers=headers).json()["head_seq"] == 3


def test_resume_fences_out_the_old_lease(api: Api, headers: dict[str, str]) -> None:
    c = api.client
    run_id, epoch = start(api, headers)
    c.post(
        f"/v1/runs/{run_id}/checkpoints", json={"lease_epoch": epoch, "step": "a"}, headers=headers
    )
    r = c.post("/v1/runs", json={"user_id": "u1", "run_id": run_id}, headers=headers)
    assert r.status_code == 200  # resumed, not created
    assert r.json()["lease_epoch"] == epoch + 1

    stale = c.post(
        f"/v1/runs/{run_id}/checkpoints", json={"lease_epoch": epoch, "step": "b"}, headers=headers
    )
    assert stale.status_code == 409
    assert stale.json()["type"] == "urn:tiermem:problem:stale-lease"
    assert c.get(f"/v1/runs/{run_id}", headers=headers).json()["head_seq"] == 1  # nothing written
    stale_done = c.post(f"/v1/runs/{run_id}:complete", json={"lease_epoch": epoch}, headers=headers)
    assert stale_done.status_code == 409

    r = c.post(f"/v1/runs/{run_id}", json={}, headers=headers)
    assert r.status_code == 405  # a run is created with POST /v1/runs
    no_resume = c.post(
        "/v1/runs", json={"user_id": "u1", "run_id": run_id, "resume": False}, headers=headers
    )
    assert no_resume.status_code == 409


def test_idempotency_key_replays_and_refuses_a_changed_input(
    api: Api, headers: dict[str, str]
) -> None:
    c = api.client
    run_id, epoch = start(api, headers)
    body = {
        "lease_epoch": epoch,
        "step": "charge",
        "input": {"cents": 500},
        "output": "ch_1",
        "idempotency_key": "charge-1",
    }
    first = c.post(f"/v1/runs/{run_id}/checkpoints", json=body, headers=headers)
    again = c.post(
        f"/v1/runs/{run_id}/checkpoints", json={**body, "output": "ch_2"}, headers=headers
    )
    assert (first.status_code, again.status_code) == (201, 200)
    assert again.json() == first.json()  # the first commit wins

    changed = c.post(
        f"/v1/runs/{run_id}/checkpoints", json={**body, "input": {"cents": 900}}, headers=headers
    )
    assert changed.status_code == 409
    problem = changed.json()
    assert problem["type"] == "urn:tiermem:problem:input-mismatch"
    assert (problem["step"], problem["idempotency_key"], problem["field"]) == (
        "charge",
        "charge-1",
        "input",
    )
    assert c.get(f"/v1/runs/{run_id}", headers=headers).json()["head_seq"] == 1


def test_fail_cancel_and_list_runs(api: Api, headers: dict[str, str]) -> None:
    c = api.client
    failed, epoch = start(api, headers, run_id="r-fail")
    r = c.post(
        f"/v1/runs/{failed}:fail",
        json={"lease_epoch": epoch, "error": "card declined"},
        headers=headers,
    )
    assert (r.json()["status"], r.json()["error"]) == ("failed", "card declined")
    cancelled, _ = start(api, headers, run_id="r-cancel")
    assert c.post(f"/v1/runs/{cancelled}:cancel", headers=headers).json()["status"] == "cancelled"
    assert c.post(f"/v1/runs/{cancelled}:cancel", headers=headers).status_code == 200  # idempotent
    start(api, headers, user_id="u2", run_id="r-other-user")

    runs = c.get("/v1/runs", headers=headers).json()["runs"]
    assert [r["run_id"] for r in runs] == ["r-fail", "r-cancel", "r-other-user"]
    only_u1 = c.get("/v1/runs?user_id=u1", headers=headers).json()["runs"]
    assert [r["run_id"] for r in only_u1] == ["r-fail", "r-cancel"]
    only_failed = c.get("/v1/runs?status=failed", headers=headers).json()["runs"]
    assert [r["run_id"] for r in only_failed] == ["r-fail"]
    assert c.get("/v1/runs/nope", headers=headers).status_code == 404
    assert c.post(f"/v1/runs/{failed}:cancel", headers=headers).status_code == 409


def test_approve_and_reject_a_paused_run(api: Api) -> None:
    tenant = new_tenant()
    headers = api.key(tenant)
    library = api.service.memory.for_tenant(tenant)
    plans: dict[str, str] = {}
    for run_id in ("to-approve", "to-reject"):
        handle = library.start_run("u1", run_id)
        with pytest.raises(ApprovalPendingError) as pending:
            handle.await_approval({"refund_cents": 4000, "run": run_id})
        plans[run_id] = pending.value.plan_hash
    c = api.client

    paused = c.get("/v1/runs/to-approve", headers=headers).json()
    assert paused["status"] == "paused"
    assert paused["pending_approval"]["plan_hash"] == plans["to-approve"]

    wrong = c.post("/v1/runs/to-approve:approve", json={"plan_hash": "0" * 64}, headers=headers)
    assert wrong.status_code == 409
    assert wrong.json()["type"] == "urn:tiermem:problem:plan-mismatch"
    r = c.post(
        "/v1/runs/to-approve:approve",
        json={"plan_hash": plans["to-approve"], "by": "ops@example.com", "note": "fine"},
        headers=headers,
    )
    assert r.status_code == 200
    assert (r.json()["approved"], r.json()["by"], r.json()["note"]) == (
        True,
        "ops@example.com",
        "fine",
    )
    resumed = c.get("/v1/runs/to-approve", headers=headers).json()
    assert (resumed["status"], resumed["pending_approval"]) == ("resumable", None)

    key_id = headers["Authorization"].split("_")[1]
    r = c.post("/v1/runs/to-reject:reject", json={"plan_hash": plans["to-reject"]}, headers=headers)
    assert (r.json()["approved"], r.json()["by"]) == (False, f"api-key:{key_id}")
    # The worker sees the decision at its gate when it resumes.
    decision = library.start_run("u1", "to-reject").await_approval(
        {"refund_cents": 4000, "run": "to-reject"}
    )
    assert decision.approved is False


def test_fork_starts_a_new_run_from_a_checkpoint(api: Api, headers: dict[str, str]) -> None:
    c = api.client
    run_id, epoch = start(api, headers, run_id="original")
    first = c.post(
        f"/v1/runs/{run_id}/checkpoints", json={"lease_epoch": epoch, "step": "a"}, headers=headers
    ).json()
    c.post(
        f"/v1/runs/{run_id}/checkpoints", json={"lease_epoch": epoch, "step": "b"}, headers=headers
    )
    r = c.post(
        f"/v1/runs/{run_id}:fork",
        json={"checkpoint_id": first["checkpoint_id"], "new_run_id": "what-if"},
        headers=headers,
    )
    assert r.status_code == 201
    fork = r.json()
    assert (fork["run_id"], fork["parent_run_id"], fork["parent_checkpoint_id"]) == (
        "what-if",
        "original",
        first["checkpoint_id"],
    )
    assert fork["head_seq"] == 1
    assert c.get("/v1/runs/original", headers=headers).json()["head_seq"] == 2
    missing = c.post(
        f"/v1/runs/{run_id}:fork",
        json={"checkpoint_id": "ckpt-000000000009-abcdefabcdef"},
        headers=headers,
    )
    assert missing.status_code == 404


def test_leases_with_a_ttl_are_renewed_by_heartbeat(api: Api, headers: dict[str, str]) -> None:
    c = api.client
    body = {"user_id": "u1", "run_id": "leased", "worker_id": "w1", "lease_ttl": 30}
    first = c.post("/v1/runs", json=body, headers=headers).json()
    key_id = headers["Authorization"].removeprefix("Bearer tmk_")[:12]
    owner = f"w1 (api-key:{key_id})"  # the worker id, qualified by the caller's key
    assert (first["run"]["lease_owner"], first["worker_id"]) == (owner, "w1")
    expires = first["run"]["lease_expires_at"]
    beat = c.post("/v1/runs/leased:heartbeat", json={"lease_epoch": 1}, headers=headers)
    assert beat.status_code == 200
    assert beat.json()["lease_expires_at"] > expires
    held = c.post("/v1/runs", json={**body, "worker_id": "w2"}, headers=headers)
    assert held.status_code == 409
    assert (held.json()["type"], held.json()["owner"]) == ("urn:tiermem:problem:lease-held", owner)
    stolen = c.post("/v1/runs", json={**body, "worker_id": "w2", "steal": True}, headers=headers)
    assert stolen.json()["lease_epoch"] == 2
    stale = c.post("/v1/runs/leased:heartbeat", json={"lease_epoch": 1}, headers=headers)
    assert stale.json()["type"] == "urn:tiermem:problem:stale-lease"
