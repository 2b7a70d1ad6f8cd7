"""What the service tells clients when something fails: enough to act on, nothing of its insides.

A backend's failure names its host, port or file: clients get a generic problem
(the log has the details). Library advice (``steal=True``,
``TaskTier.resolve_effect(...)``) is rewritten into the HTTP route's. A body
that cannot be read as JSON is a 400 naming the body and what was wrong.
"""

from __future__ import annotations

import json
import logging
import re
from pathlib import Path
from typing import Any

import httpx
import pytest
from typer.testing import CliRunner

from memory.cli import app as cli
from memory.facade import Memory
from memory.settings import Settings
from summarizer.errors import SummarizerUnavailableError
from tests.api.conftest import Api, new_tenant, start_app
from tests.api.test_errors import assert_problem
from tests.conftest import RedisServer
from tiers.errors import BackendUnavailableError, EmbedderError


def test_a_down_redis_is_a_503_that_names_no_host_or_port(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "redis")
    mem = Memory.from_settings(Settings(data_dir=tmp_path / "data", kv_url=server.url))
    try:
        with start_app(Settings(data_dir=tmp_path, auth_enabled=False), mem) as api:
            server.stop()
            with caplog.at_level(logging.ERROR, logger="tiermem"):
                r = api.client.get("/v1/users/u1/facts")
            body = assert_problem(r, 503, "backend-unavailable")
            assert str(server.port) not in r.text
            assert "127.0.0.1" not in r.text
            assert "storage unavailable" in body["detail"]
            assert body["request_id"] in body["detail"]
            # The operator finds the details in the log.
            assert any(str(server.port) in rec.getMessage() for rec in caplog.records)
    finally:
        server.stop()
        mem.close()


def test_a_failed_sqlite_store_is_a_503_that_names_no_path(tmp_path: Path) -> None:
    mem = Memory.open(tmp_path / "data")
    try:
        with start_app(Settings(data_dir=tmp_path, auth_enabled=False), mem) as api:
            mem.kv.close()  # every read now fails with the file's path in the message
            for r in (
                api.client.get("/v1/users/u1/facts"),
                api.client.put("/v1/users/u1/facts/k", json={"value": 1}),
                api.client.post("/v1/runs", json={"user_id": "u1"}),
            ):
                assert_problem(r, 503, "backend-unavailable")
                assert str(tmp_path) not in r.text
                assert "sqlite" not in r.text.lower()
    finally:
        mem.close()


def test_tiermem_info_masks_credentials(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TIERMEM_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TIERMEM_KV_URL", "redis://:s3cret-pw@127.0.0.1:6379/0")
    monkeypatch.setenv("TIERMEM_VECTOR_URL", "http://admin:chroma-pw@127.0.0.1:8000")
    monkeypatch.setenv("TIERMEM_SUMMARIZER_API_KEY", "sk-very-secret")
    result = CliRunner().invoke(cli, ["info"])
    assert result.exit_code == 0, result.output
    assert "s3cret-pw" not in result.output
    assert "chroma-pw" not in result.output
    assert "sk-very-secret" not in result.output
    assert "kv_url = redis://***@127.0.0.1:6379/0" in result.output
    assert "vector_url = http://***@127.0.0.1:8000" in result.output


def test_a_malformed_redis_url_is_refused_without_its_password(tmp_path: Path) -> None:
    from tiers.errors import InvalidInputError

    with pytest.raises(InvalidInputError) as refused:
        Memory.open(tmp_path, kv_url="redis://:s3cret-pw@127.0.0.1:notaport/0")
    assert "s3cret-pw" not in str(refused.value)


# -- advice in HTTP terms -----------------------------------------------------------------------

# Python-isms that make no sense to an HTTP client.
LIBRARY_ADVICE = re.compile(
    r"=True\b|=False\b|=\.\.\.|\b(TaskTier|RunHandle|Memory|SessionTier|UserTier)\.\w|"
    r"\b\w+=\s|\w\(\)"
)


def _problem(r: httpx.Response, status: int) -> dict[str, Any]:
    assert r.status_code == status, r.text
    body: dict[str, Any] = r.json()
    assert not LIBRARY_ADVICE.search(body["detail"]), body["detail"]
    return body


def test_http_errors_give_the_routes_advice_not_the_librarys(api: Api) -> None:
    c = api.client
    h = api.key(new_tenant())
    lease = c.post("/v1/runs", json={"user_id": "u1", "run_id": "r1", "lease_ttl": 60}, headers=h)
    assert lease.status_code == 201, lease.text
    held = _problem(c.post("/v1/runs", json={"user_id": "u1", "run_id": "r1"}, headers=h), 409)
    assert '"steal": true' in held["detail"]
    exists = c.post("/v1/runs", json={"user_id": "u1", "run_id": "r1", "resume": False}, headers=h)
    assert "choose another run_id" in _problem(exists, 409)["detail"]

    # An effect begun and never recorded, then the run taken over: its outcome is unknown.
    first = c.post("/v1/runs", json={"user_id": "u1", "run_id": "r2"}, headers=h).json()
    effect = {"name": "pay", "idempotency_key": "k1"}
    begun = c.post(
        "/v1/runs/r2/effects:begin", json={"lease_epoch": first["lease_epoch"], **effect}, headers=h
    )
    assert begun.status_code == 200, begun.text
    taken = c.post(
        "/v1/runs", json={"user_id": "u1", "run_id": "r2", "steal": True}, headers=h
    ).json()
    unknown = c.post(
        "/v1/runs/r2/effects:begin", json={"lease_epoch": taken["lease_epoch"], **effect}, headers=h
    )
    assert "POST /v1/runs/r2/effects:resolve" in _problem(unknown, 409)["detail"]
    neither = c.post("/v1/runs/r2/effects:resolve", json={"idempotency_key": "k1"}, headers=h)
    assert '"rerun": true' in _problem(neither, 422)["detail"]

    gated = c.post("/v1/runs", json={"user_id": "u1", "run_id": "r3"}, headers=h).json()
    epoch = gated["lease_epoch"]
    ask = {"lease_epoch": epoch, "plan": {"refund": 10}, "key": "g1"}
    assert c.post("/v1/runs/r3/approvals", json=ask, headers=h).status_code == 202
    step = c.post("/v1/runs/r3/checkpoints", json={"lease_epoch": epoch, "step": "x"}, headers=h)
    assert "POST /v1/runs/r3:approve or :reject" in _problem(step, 409)["detail"]

    # A spent budget: raised over HTTP, not with the library's Memory.set_budget.
    spent = c.post(
        "/v1/runs", json={"user_id": "u1", "run_id": "r5", "budget_tokens": 0}, headers=h
    ).json()
    begin = {"lease_epoch": spent["lease_epoch"], **effect}
    over = c.post("/v1/runs/r5/effects:begin", json=begin, headers=h)
    assert "POST /v1/runs/r5:set-budget" in _problem(over, 409)["detail"]
    nothing = c.post("/v1/runs/r5:set-budget", json={}, headers=h)
    assert '"budget_tokens", "budget_cost" or both' in _problem(nothing, 422)["detail"]

    failed = c.post("/v1/runs", json={"user_id": "u1", "run_id": "r4"}, headers=h).json()
    fail = {"lease_epoch": failed["lease_epoch"], "error": "boom"}
    assert c.post("/v1/runs/r4:fail", json=fail, headers=h).status_code == 200
    _problem(c.post("/v1/runs", json={"user_id": "u1", "run_id": "r4"}, headers=h), 409)


# -- bodies that are not JSON -------------------------------------------------------------------

UNREADABLE = [
    pytest.param(b'{"value": "\xff\xfe"}', "application/json", "UTF-8", id="not-utf8"),
    pytest.param(
        '{"value": "é"}'.encode("latin-1"),
        "application/json; charset=latin-1",
        "UTF-8",
        id="latin1",
    ),
    pytest.param(b"[" * 100_000 + b"]" * 100_000, "application/json", "nested", id="deep"),
    pytest.param(b'{"value": ' + b"9" * 5000 + b"}", "application/json", "digits", id="huge-int"),
    pytest.param(b'{"value": ', "application/json", "JSON", id="truncated"),
]


@pytest.mark.parametrize(("body", "content_type", "named"), UNREADABLE)
@pytest.mark.parametrize(
    ("method", "path"),
    [("PUT", "/v1/users/u1/facts/k"), ("POST", "/v1/users/u1/sessions"), ("POST", "/v1/runs")],
)
def test_an_unreadable_body_is_a_400_naming_the_body_and_the_problem(
    api: Api, body: bytes, content_type: str, named: str, method: str, path: str
) -> None:
    h = {**api.key(new_tenant()), "content-type": content_type}
    r = api.client.request(method, path, content=body, headers=h)
    problem = assert_problem(r, 400, "malformed-request")
    assert problem["field"] == "body"
    assert named in problem["detail"]
    assert problem["errors"][0]["location"] == "body"
    assert len(json.dumps(problem)) < 2000  # never an echo of the body


BACKEND_FAILURES = [
    BackendUnavailableError("Redis read failed: Error 111 connecting to 10.1.2.3:6390."),
    EmbedderError("cannot read the embedding model /opt/models/model.onnx: permission denied"),
    SummarizerUnavailableError(
        "openai/x unreachable at http://10.1.2.3:4000/v1", reason="connection", attempts=3
    ),
]


@pytest.mark.parametrize("exc", BACKEND_FAILURES, ids=lambda e: type(e).__name__)
def test_mcp_tool_errors_name_no_backend_host_or_path(
    exc: Exception, caplog: pytest.LogCaptureFixture
) -> None:
    from memory.integrations.mcp import _describe

    with caplog.at_level(logging.ERROR, logger="tiermem"):
        text = _describe(exc)  # type: ignore[arg-type]
    assert text.startswith(type(exc).__name__)
    assert "10.1.2.3" not in text
    assert "/opt/models" not in text
    assert any(str(exc) in record.getMessage() for record in caplog.records)
