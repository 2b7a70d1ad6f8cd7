"""Observability over HTTP: the resume plan route, and the library's families on ``/metrics``."""

from __future__ import annotations

from pathlib import Path

import httpx

from memory.client import MemoryClient
from memory.settings import Settings
from tests.api.conftest import Api, new_tenant, start_app


def test_the_resume_plan_route_answers_what_a_resume_would_do(api: Api) -> None:
    c, headers = api.client, api.key(new_tenant())
    lease = c.post("/v1/runs", json={"user_id": "u1", "run_id": "r1"}, headers=headers).json()
    body = {"lease_epoch": lease["lease_epoch"], "step": "plan", "output": {"secret": 1}}
    assert c.post("/v1/runs/r1/checkpoints", json=body, headers=headers).status_code == 201
    plan = c.get("/v1/runs/r1:resume-plan", headers=headers)
    assert plan.status_code == 200, plan.json()
    assert [r["step"] for r in plan.json()["replays"]] == ["plan"]
    assert plan.json()["lease_epoch"] == lease["lease_epoch"]
    assert "secret" not in plan.text
    assert c.get("/v1/runs/absent:resume-plan", headers=headers).status_code == 404


def test_the_client_reads_the_resume_plan(api: Api) -> None:
    headers = api.key(new_tenant())
    key = headers["Authorization"].split()[1]
    api.client.post("/v1/runs", json={"user_id": "u1", "run_id": "r2"}, headers=headers)

    def forward(request: httpx.Request) -> httpx.Response:
        # The app under test, in this process: the client's requests go to its TestClient.
        answer = api.client.request(
            request.method, request.url.path, headers=request.headers, content=request.content
        )
        return httpx.Response(answer.status_code, headers=answer.headers, content=answer.content)

    client = MemoryClient("http://testserver", key, transport=httpx.MockTransport(forward))
    plan = client.plan_resume("r2")
    assert (plan.run_id, plan.replays, plan.lease_epoch) == ("r2", [], 1)


def test_metrics_show_the_library_families_beside_the_service_ones(tmp_path: Path) -> None:
    settings = Settings(data_dir=tmp_path, auth_enabled=False)
    with start_app(settings) as running:
        c = running.client
        lease = c.post("/v1/runs", json={"user_id": "u1", "run_id": "r1"}).json()
        body = {"lease_epoch": lease["lease_epoch"], "step": "plan"}
        assert c.post("/v1/runs/r1/checkpoints", json=body).status_code == 201
        c.post("/v1/runs", json={"user_id": "u1", "run_id": "r1"})  # a resume
        text = c.get("/metrics").text
    assert "tiermem_checkpoint_commit_latency_seconds_count" in text
    assert 'tiermem_recovery_attempts_total{action="replay"} 1.0' in text
    assert "tiermem_runs_resumed_total 1.0" in text
    assert "tiermem_http_request_duration_seconds_count" in text  # the service's own
