"""Operability: lifespan, probes, Prometheus metrics, JSON logs with request ids."""

from __future__ import annotations

import io
import json
import logging
import re
import socket
from collections.abc import Iterator
from pathlib import Path

import pytest

from api.logs import JsonFormatter
from memory.facade import Memory
from memory.settings import Settings
from summarizer.embeddings import LiteLLMEmbedder
from tests.api.conftest import Api, new_tenant, start_app
from tests.waiting import wait_until
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import BackendUnavailableError


@pytest.mark.parametrize("backend", ["embedded", "redis"])
def test_lifespan_opens_and_closes_its_own_stores(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    kv_url = request.getfixturevalue("redis_url") if backend == "redis" else None
    settings = Settings(data_dir=tmp_path, kv_url=kv_url, auth_enabled=False)
    with start_app(settings) as api:
        assert api.client.get("/readyz").json() == {
            "status": "ok",
            "checks": {"kv": "ok", "index": "ok", "embedder": "ok", "durability": "ok"},
            "volatile": False,
            "volatile_reason": None,
            "index_reason": None,
            "index_damage": None,
        }
        assert api.client.put("/v1/users/u1/facts/k", json={"value": 1}).status_code == 200
        opened = api.service.memory
    with pytest.raises(BackendUnavailableError):
        opened.kv.ping()
    # What was acknowledged is in the store the next app opens.
    with start_app(settings) as api:
        assert api.client.get("/v1/users/u1/facts/k").json()["value"] == 1


def _memory_with_hosted_embedder(data: Path, **embedder_kwargs: object) -> Memory:
    embedder = LiteLLMEmbedder("openai/text-embedding-3-small", dimension=8, **embedder_kwargs)
    return Memory(
        kv=SqliteKVStore(data / "kv.sqlite3"),
        index=ChromaVectorIndex(data / "chroma", embedder=embedder),
        embedder=embedder,
    )


def test_readiness_asks_a_hosted_embedder(tmp_path: Path) -> None:
    answering = _memory_with_hosted_embedder(tmp_path / "a", mock_response=[0.5] * 8)
    with start_app(Settings(data_dir=tmp_path), answering) as api:
        assert api.client.get("/readyz").json()["checks"]["embedder"] == "ok"
    answering.close()

    # Nothing listens on the port: the model cannot answer, so the service is not ready.
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        dead_port = probe.getsockname()[1]
    silent = _memory_with_hosted_embedder(
        tmp_path / "b", api_base=f"http://127.0.0.1:{dead_port}/v1", api_key="k", max_retries=0
    )
    with start_app(Settings(data_dir=tmp_path), silent) as api:
        ready = api.client.get("/readyz")
        assert ready.status_code == 503
        assert ready.headers["Retry-After"] == "1"
        assert ready.json()["checks"] == {
            "kv": "ok",
            "index": "ok",
            "embedder": "EmbedderError",
            "durability": "ok",
        }
    silent.close()


def test_an_app_given_a_memory_leaves_it_open(memory: Memory, tmp_path: Path) -> None:
    with start_app(Settings(data_dir=tmp_path), memory):
        pass
    memory.kv.ping()


def test_metrics_count_routes_by_template_and_time_the_core(api: Api) -> None:
    headers = api.key(new_tenant())
    c = api.client
    for user in ("u1", "u2", "u3"):
        c.get(f"/v1/users/{user}/facts", headers=headers)
    c.post(
        "/v1/users/u1/sessions",
        json={"session_id": "s", "summary": {"task_description": "x"}},
        headers=headers,
    )
    c.post("/v1/users/u1/sessions:recall", json={"query": "x"}, headers=headers)
    c.post("/v1/users/u1/context", json={"query": "x"}, headers=headers)
    run = c.post("/v1/runs", json={"user_id": "u1"}, headers=headers).json()
    c.post(
        f"/v1/runs/{run['run']['run_id']}/checkpoints",
        json={"lease_epoch": run["lease_epoch"], "step": "a"},
        headers=headers,
    )
    c.get("/v1/users/u1/facts")  # 401

    text = c.get("/metrics").text
    facts = 'method="GET",route="/v1/users/{user_id}/facts"'
    assert f'tiermem_http_request_duration_seconds_count{{{facts},status="200"}} 3.0' in text
    assert f'tiermem_http_request_duration_seconds_count{{{facts},status="401"}} 1.0' in text
    assert "u1" not in text  # ids never become label values
    for histogram in ("recall", "context", "checkpoint_commit"):
        assert f"tiermem_{histogram}_duration_seconds_count 1.0" in text
    # Every tenant's unfinished jobs, read from the store (the same on every replica).
    assert re.search(r"^tiermem_session_jobs_pending \d+\.0$", text, re.MULTILINE)
    assert "tiermem_session_outbox_backlog 0.0" in text
    assert "tiermem_http_requests_in_flight" in text


@pytest.fixture
def access_log() -> Iterator[io.StringIO]:
    stream = io.StringIO()
    handler = logging.StreamHandler(stream)
    handler.setFormatter(JsonFormatter())
    logger = logging.getLogger("tiermem")
    old_level = logger.level
    logger.addHandler(handler)
    logger.setLevel(logging.INFO)
    yield stream
    logger.removeHandler(handler)
    logger.setLevel(old_level)


def test_each_request_logs_one_json_line_with_its_request_id(
    api: Api, access_log: io.StringIO
) -> None:
    tenant = new_tenant()
    headers = api.key(tenant)
    api.client.get("/v1/users/u1/facts/missing", headers={**headers, "X-Request-ID": "abc-1"})
    (entry,) = [
        json.loads(line) for line in access_log.getvalue().splitlines() if '"abc-1"' in line
    ]
    assert entry["logger"] == "tiermem.access"
    assert entry["request_id"] == "abc-1"
    assert entry["route"] == "/v1/users/{user_id}/facts/{key}"
    assert (entry["status"], entry["method"], entry["tenant"]) == (404, "GET", tenant)
    assert entry["duration_ms"] >= 0


def test_openapi_documents_the_headers_the_service_sends(api: Api) -> None:
    schema = api.client.get("/openapi.json").json()
    facts = schema["paths"]["/v1/users/{user_id}/facts"]["get"]["responses"]
    assert set(facts["200"]["headers"]) == {"X-Request-ID"}
    assert set(facts["401"]["headers"]) == {"X-Request-ID", "WWW-Authenticate"}
    assert set(facts["503"]["headers"]) == {"X-Request-ID", "Retry-After"}
    # and the service does send them
    unauthorised = api.client.get("/v1/users/u/facts")
    assert unauthorised.status_code == 401
    assert unauthorised.headers["WWW-Authenticate"].startswith("Bearer")
    assert unauthorised.headers["X-Request-ID"]


def test_the_service_sweeps_finished_runs_of_every_tenant(tmp_path: Path) -> None:
    settings = Settings(
        data_dir=tmp_path,
        durable=False,
        allow_volatile=True,
        run_retention_days=1e-9,  # about 0.1 ms
        run_sweep_interval_seconds=0.05,
    )
    with start_app(settings) as api:
        headers = api.key(new_tenant())
        c = api.client
        ids = {}
        for name in ("finished", "running"):
            lease = c.post("/v1/runs", json={"user_id": "u1"}, headers=headers).json()
            ids[name] = lease["run"]["run_id"]
            if name == "finished":
                done = c.post(
                    f"/v1/runs/{ids[name]}:complete",
                    json={"lease_epoch": lease["lease_epoch"]},
                    headers=headers,
                )
                assert done.status_code == 200, done.text
        wait_until(
            lambda: c.get(f"/v1/runs/{ids['finished']}", headers=headers).status_code == 404,
            what="the finished run to be swept",
            every_s=0.05,
        )
        assert c.get(f"/v1/runs/{ids['running']}", headers=headers).json()["status"] == "running"
