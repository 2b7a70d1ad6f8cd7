"""One problem+json shape for every failure, with the right status, and never a stack trace."""

from __future__ import annotations

import inspect
import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest

import memory.apikeys
import memory.errors
import summarizer.errors
import tiers.errors
from api import errors as api_errors
from api.errors import ERROR_MAP, INTERNAL, problem_for, spec_for
from memory.client import (
    AuthenticationError,
    PermissionDeniedError,
    ServiceError,
    ServiceOverloadedError,
    error_from_problem,
)
from memory.facade import Memory
from memory.problems import LIBRARY_PROBLEMS, SERVICE_PROBLEMS, ProblemRow
from memory.settings import Settings
from summarizer import LiteLLMSummarizer
from tests.api.conftest import Api, new_tenant, start_app
from tests.api.test_routes import wait_job
from tests.conftest import RedisServer
from tests.summarizer.stub_server import StubLLMServer, StubReply
from tiers import keys
from tiers.backends.base import Put
from tiers.errors import NotFoundError, ValueTooLargeError

PROBLEM_KEYS = {"type", "title", "status", "detail"}
GOOD_SUMMARY = {
    "task_description": "Refund a cracked blender",
    "decisions_made": ["Refund to the card"],
    "work_completed": [],
    "open_questions": [],
    "next_recommended_steps": [],
    "facts": [],
}
TRANSCRIPT = [{"role": "user", "content": "My blender arrived cracked, I want a refund."}]


def assert_problem(r: httpx.Response, status: int, kind: str | None = None) -> dict[str, Any]:
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body: dict[str, Any] = r.json()
    assert set(body) >= PROBLEM_KEYS
    assert body["status"] == status
    assert body["type"].startswith("urn:tiermem:problem:")
    if kind is not None:
        assert body["type"] == f"urn:tiermem:problem:{kind}"
    assert body["request_id"] == r.headers["x-request-id"]
    assert "Traceback" not in r.text
    assert 'File "' not in r.text
    return body


# -- client errors -----------------------------------------------------------------------------


def test_400_malformed_json(api: Api, headers: dict[str, str]) -> None:
    r = api.client.put(
        "/v1/users/u1/facts/k",
        content=b'{"value": ',
        headers={**headers, "content-type": "application/json"},
    )
    body = assert_problem(r, 400, "malformed-request")
    assert body["field"] == "body"


def test_404_and_405_of_the_router_are_problems(api: Api, headers: dict[str, str]) -> None:
    assert_problem(api.client.get("/v1/nothing-here", headers=headers), 404, "not-found")
    assert_problem(
        api.client.patch("/v1/users/u1/facts/k", headers=headers), 405, "method-not-allowed"
    )
    assert_problem(
        api.client.get("/v1/users/u1/facts/missing", headers=headers), 404, "fact-not-found"
    )


def test_409_shape(api: Api, headers: dict[str, str]) -> None:
    api.client.post("/v1/runs", json={"user_id": "u1", "run_id": "r1"}, headers=headers)
    r = api.client.post("/v1/runs", json={"user_id": "u2", "run_id": "r1"}, headers=headers)
    body = assert_problem(r, 409, "conflict")
    assert "another user" in body["detail"]


def test_422_names_the_field_in_body_path_and_query(api: Api, headers: dict[str, str]) -> None:
    c = api.client
    body = assert_problem(
        c.put("/v1/users/u1/facts/k", json={"source": "x"}, headers=headers),
        422,
        "validation-error",
    )
    assert body["field"] == "value"
    assert body["errors"][0] == {
        "field": "value",
        "location": "body",
        "message": "Field required",
        "type": "missing",
    }
    body = assert_problem(
        c.get("/v1/users/bad%20id/facts", headers=headers), 422, "validation-error"
    )
    assert (body["field"], body["errors"][0]["location"]) == ("user_id", "path")
    body = assert_problem(c.get("/v1/users/u1/sessions?limit=-1", headers=headers), 422)
    assert (body["field"], body["errors"][0]["location"]) == ("limit", "query")
    r = c.post("/v1/users/u1/sessions:recall", json={"query": "x", "top_k": 1000}, headers=headers)
    assert assert_problem(r, 422)["field"] == "top_k"
    r = c.post(
        "/v1/users/u1/sessions",
        json={"session_id": "s1", "summary": {"decisions_made": [""]}},
        headers=headers,
    )
    assert assert_problem(r, 422)["field"] == "summary.decisions_made.0"
    r = c.post("/v1/users/u1/sessions", json={"session_id": "s1"}, headers=headers)
    assert "exactly one of 'summary' and 'transcript'" in assert_problem(r, 422)["detail"]
    r = c.post("/v1/users/u1/sessions:recall", json={"query": "   "}, headers=headers)
    assert assert_problem(r, 422, "validation-error")["field"] == "query"
    # A refusal only the domain can make (NaN is not JSON it can store) is a 422 naming its field.
    run = c.post("/v1/runs", json={"user_id": "u1"}, headers=headers).json()
    r = c.post(
        f"/v1/runs/{run['run']['run_id']}/checkpoints",
        content=b'{"lease_epoch": 1, "step": "a", "output": NaN}',
        headers={**headers, "content-type": "application/json"},
    )
    body = assert_problem(r, 422, "invalid-input")
    assert body["field"] == "output"


def test_413_for_a_declared_or_streamed_body_over_the_limit(memory: Memory, tmp_path: Path) -> None:
    with start_app(
        Settings(data_dir=tmp_path, max_request_bytes=1000, auth_cache_seconds=0), memory
    ) as api:
        headers = api.key(new_tenant())
        big = json.dumps({"value": "x" * 2000}).encode()
        r = api.client.put(
            "/v1/users/u1/facts/k",
            content=big,
            headers={**headers, "content-type": "application/json"},
        )
        assert "1000 bytes" in assert_problem(r, 413, "request-too-large")["detail"]

        def chunks() -> Iterator[bytes]:
            yield big[:600]
            yield big[600:]

        r = api.client.put(
            "/v1/users/u1/facts/k",
            content=chunks(),
            headers={**headers, "content-type": "application/json"},
        )
        assert_problem(r, 413, "request-too-large")
        assert api.client.get("/v1/users/u1/facts", headers=headers).json() == {"facts": []}


def test_413_for_a_value_over_the_store_limit(api: Api, headers: dict[str, str]) -> None:
    limit = api.service.memory.kv.max_value_bytes
    r = api.client.put("/v1/users/u1/facts/k", json={"value": "x" * limit}, headers=headers)
    assert_problem(r, 413, "value-too-large")
    assert api.client.get("/v1/users/u1/facts/k", headers=headers).status_code == 404


# -- server-side errors ------------------------------------------------------------------------


def test_500_for_a_corrupt_record_hides_internals(api: Api) -> None:
    tenant = new_tenant()
    headers = api.key(tenant)
    api.service.memory.kv.commit([Put(keys.facts_space(tenant, "u1"), "k", b"not json")])
    body = assert_problem(
        api.client.get("/v1/users/u1/facts/k", headers=headers), 500, "corrupt-record"
    )
    assert tenant not in body["detail"]
    assert body["request_id"] in body["detail"]


def test_500_for_an_unexpected_error(api: Api) -> None:
    app = api.client.app

    @app.get("/boom")  # type: ignore[attr-defined, misc]
    def boom() -> None:
        raise RuntimeError("secret internals")

    client = type(api.client)(app, raise_server_exceptions=False)
    body = assert_problem(client.get("/boom"), 500, "internal")
    assert "secret internals" not in json.dumps(body)


def test_503_with_retry_after_when_the_store_is_down(tmp_path: Path) -> None:
    server = RedisServer(tmp_path / "redis")
    mem = Memory.from_settings(Settings(data_dir=tmp_path / "data", kv_url=server.url))
    try:
        with start_app(Settings(data_dir=tmp_path, auth_enabled=False), mem) as api:
            assert api.client.get("/v1/users/u1/facts").status_code == 200
            server.stop()
            r = api.client.get("/v1/users/u1/facts")
            assert_problem(r, 503, "backend-unavailable")
            assert r.headers["retry-after"] == "1"
            ready = api.client.get("/readyz")
            body = assert_problem(ready, 503, "not-ready")
            assert body["checks"]["kv"] != "ok"
            assert body["checks"]["index"] == "ok"
            assert api.client.get("/healthz").status_code == 200
    finally:
        server.stop()
        mem.close()


# -- summarizer errors -------------------------------------------------------------------------


@pytest.fixture
def stub() -> Iterator[StubLLMServer]:
    with StubLLMServer() as server:
        yield server


def memory_with_llm(memory: Memory, stub: StubLLMServer) -> Memory:
    """The module's stores with a litellm summarizer talking to the stub server.

    Close it by its session tier (its index worker) only: ``Memory.close`` would close the
    module's stores, which the later tests still use.
    """
    summarizer = LiteLLMSummarizer(
        "openai/stub-model",
        api_base=stub.api_base,
        api_key="test",
        timeout=10,
        max_retries=0,
        max_transient_retries=0,
        retry_base_delay=0,
        retry_max_delay=0,
    )
    return Memory(
        kv=memory.kv,
        index=memory.index,
        embedder=memory.embedder,
        summarizer=summarizer,
        tenant=new_tenant(),
    )


@pytest.fixture
def llm_memory(memory: Memory, stub: StubLLMServer) -> Iterator[Memory]:
    """:func:`memory_with_llm`, its session tier closed after the test."""
    llm = memory_with_llm(memory, stub)
    yield llm
    llm.sessions.close()


@pytest.mark.slow
def test_502_when_the_model_answers_garbage(
    llm_memory: Memory, stub: StubLLMServer, tmp_path: Path
) -> None:
    stub.fallback = lambda body: StubReply.chat("this is not JSON")
    with start_app(
        Settings(data_dir=tmp_path, auth_enabled=False, job_max_attempts=2),
        llm_memory,
    ) as api:
        r = api.client.post(
            "/v1/users/u1/sessions?wait=true", json={"session_id": "s1", "transcript": TRANSCRIPT}
        )
        assert_problem(r, 502, "summary-generation-failed")
        job = api.client.post(
            "/v1/users/u1/sessions", json={"session_id": "s2", "transcript": TRANSCRIPT}
        ).json()
        job = wait_job(api, {}, job["status_url"])
        assert job["status"] == "failed"
        assert job["error"]["status"] == 502
        assert job["error"]["type"] == "urn:tiermem:problem:summary-generation-failed"
        assert api.client.get("/v1/users/u1/sessions/s2").status_code == 404
        metrics = api.client.get("/metrics").text
        # The request's, then each of the job's two attempts (retried: a model may do better).
        assert 'tiermem_summarizer_failures_total{error="SummaryGenerationError"} 3.0' in metrics
        # Both transcripts were stored before summarizing: nothing is lost, both can be retried.
        pending = api.client.get("/v1/users/u1/sessions:pending")
        assert pending.json() == {"session_ids": ["s1", "s2"]}
        stub.fallback = lambda body: StubReply.json(GOOD_SUMMARY)
        r = api.client.post("/v1/users/u1/sessions/s2:resummarize?wait=true")
        assert r.status_code == 201, r.text
        usage = r.json()["usage"]
        assert usage["model"] == "openai/stub-model"
        assert usage["calls"] == 1
        assert usage["prompt_tokens"] > 0
        job = api.client.post("/v1/users/u1/sessions/s1:resummarize").json()
        job = wait_job(api, {}, job["status_url"])
        assert job["status"] == "succeeded"
        assert api.client.get("/v1/users/u1/sessions:pending").json() == {"session_ids": []}
        assert api.client.get("/v1/users/u1/sessions/s1").json()["usage"]["calls"] == 1
        metrics = api.client.get("/metrics").text
        assert 'tiermem_summaries_total{outcome="succeeded"} 2.0' in metrics
        assert 'tiermem_summarizer_tokens_total{kind="prompt"}' in metrics
        missing = api.client.post("/v1/users/u1/sessions/nope:resummarize")
        assert_problem(missing, 404, "session-not-found")


def test_503_when_the_model_is_unreachable(
    llm_memory: Memory, stub: StubLLMServer, tmp_path: Path
) -> None:
    stub.fallback = lambda body: StubReply.error(503, "overloaded upstream")
    with start_app(Settings(data_dir=tmp_path, auth_enabled=False), llm_memory) as api:
        r = api.client.post(
            "/v1/users/u1/sessions?wait=true", json={"session_id": "s1", "transcript": TRANSCRIPT}
        )
        body = assert_problem(r, 503, "summarizer-unavailable")
        assert body["reason"] == "server_error"
        assert int(r.headers["retry-after"]) >= 1


def test_429_when_too_many_summaries_are_queued(
    memory: Memory, llm_memory: Memory, stub: StubLLMServer, tmp_path: Path
) -> None:
    stub.fallback = lambda body: StubReply.json(GOOD_SUMMARY, delay=1.0)
    settings = Settings(
        data_dir=tmp_path, auth_enabled=False, max_pending_jobs=1, summarize_workers=1
    )
    with start_app(settings, llm_memory) as api:
        first = api.client.post(
            "/v1/users/u1/sessions", json={"session_id": "s1", "transcript": TRANSCRIPT}
        )
        assert first.status_code == 202
        r = api.client.post(
            "/v1/users/u1/sessions", json={"session_id": "s2", "transcript": TRANSCRIPT}
        )
        assert_problem(r, 429, "overloaded")
        assert int(r.headers["retry-after"]) >= 1
    # Leaving the app waited for the accepted job: graceful shutdown loses no acknowledged work.
    assert llm_memory_session(memory, api) is not None


def llm_memory_session(memory: Memory, api: Api) -> object:
    tenant = api.service.memory.tenant
    return memory.for_tenant(tenant).get_session("u1", "s1")


# -- request ids and the error map -------------------------------------------------------------


def test_request_id_is_echoed_or_made(api: Api) -> None:
    r = api.client.get("/v1/users/u1/facts", headers={"X-Request-ID": "req-42.a"})
    assert r.headers["x-request-id"] == "req-42.a"
    assert r.json()["request_id"] == "req-42.a"
    r = api.client.get("/healthz", headers={"X-Request-ID": "bad id with spaces"})
    assert len(r.headers["x-request-id"]) == 32
    assert r.headers["x-request-id"] != "bad id with spaces"


ERROR_MODULES = (tiers.errors, summarizer.errors, memory.errors, memory.apikeys, api_errors)
ROOTS = {
    tiers.errors.TierError,
    summarizer.errors.SummarizerError,
    memory.errors.MemoryLayerError,
    memory.errors.ScopeError,
    memory.apikeys.ApiKeyError,
    api_errors.ApiError,
}
ARGS = {
    "step": "s",
    "idempotency_key": "k",
    "reason": "timeout",
    "attempts": 2,
    "needed": 10,
    "remaining": 1,
    "budget": 5,
    "retry_after": 3.0,
    "field": "f",
}


def error_classes() -> list[type[Exception]]:
    return sorted(
        {
            obj
            for module in ERROR_MODULES
            for obj in vars(module).values()
            if isinstance(obj, type)
            and issubclass(obj, Exception)
            and obj.__module__ == module.__name__
        },
        key=lambda c: c.__name__,
    )


def instance(cls: type[Exception]) -> Exception:
    try:
        params = inspect.signature(cls).parameters.values()
    except ValueError:  # no __init__ of its own: Exception's (message,) signature
        return cls("it went wrong")
    kwargs = {
        p.name: ARGS.get(p.name, "x")
        for p in params
        if p.kind is p.KEYWORD_ONLY and p.default is inspect.Parameter.empty
    }
    return cls("it went wrong", **kwargs)


@pytest.mark.parametrize("cls", error_classes(), ids=lambda c: c.__name__)
def test_every_typed_error_has_a_status_and_round_trips_to_the_client(cls: type[Exception]) -> None:
    spec = spec_for(instance(cls))
    assert cls in ROOTS or spec is not INTERNAL
    assert 400 <= spec.status <= 599
    problem = problem_for(instance(cls)).model_dump(exclude_none=True)
    rebuilt = error_from_problem(spec.status, problem)
    # A root the table does not map yet (memory.errors.MemoryLayerError) is reported as INTERNAL.
    expected: type[Exception] = next((c for c in cls.__mro__ if c in ERROR_MAP), Exception)
    client_side = {
        api_errors.AuthenticationRequiredError: AuthenticationError,
        memory.apikeys.InvalidApiKeyError: AuthenticationError,
        memory.apikeys.ApiKeyError: AuthenticationError,
        api_errors.ForbiddenError: PermissionDeniedError,
        api_errors.OverloadedError: ServiceOverloadedError,
        api_errors.JobNotFoundError: NotFoundError,
        api_errors.RequestTooLargeError: ValueTooLargeError,
        api_errors.JobAbandonedError: ServiceError,  # only ever in a job's status
    }
    if spec.status == 500 and not spec.public_detail:
        return  # internal errors: the client only learns that the server failed
    assert isinstance(rebuilt, client_side.get(expected, expected)), (cls, type(rebuilt))
    if isinstance(rebuilt, tiers.errors.InputMismatchError):
        assert (rebuilt.step, rebuilt.idempotency_key) == ("s", "k")


@pytest.mark.parametrize("row", LIBRARY_PROBLEMS, ids=lambda row: row.error.__name__)
def test_every_row_of_the_problem_table_round_trips(row: ProblemRow) -> None:
    # The server reports the error with the row's status, slug and title; the client reads
    # the problem back as the row's class (rows that stand for more than one error aside).
    problem = problem_for(instance(row.error)).model_dump(exclude_none=True)
    assert (problem["status"], problem["type"], problem["title"]) == (
        row.spec.status,
        row.spec.type,
        row.spec.title,
    )
    rebuilt = error_from_problem(problem["status"], problem)
    if row.rebuild is None:
        assert row.spec.slug in ("internal", "unauthorized")
        assert isinstance(rebuilt, ServiceError | AuthenticationError)
    else:
        assert type(rebuilt) is row.error


@pytest.mark.parametrize("slug", sorted(SERVICE_PROBLEMS))
def test_every_service_problem_is_read_back_by_the_client(slug: str) -> None:
    # The service's own problem types (the API layer's errors, request validation, the
    # framework's 400/405) come back as the client's classes or the library error they mean.
    spec = SERVICE_PROBLEMS[slug].spec
    problem = {"type": spec.type, "title": spec.title, "status": spec.status, "detail": "x"}
    rebuilt = error_from_problem(spec.status, problem, retry_after=2.0)
    expected = {
        "unauthorized": AuthenticationError,
        "forbidden": PermissionDeniedError,
        "overloaded": ServiceOverloadedError,
        "request-too-large": ValueTooLargeError,
        "job-not-found": NotFoundError,
        "validation-error": tiers.errors.InvalidInputError,
        "malformed-request": tiers.errors.InvalidInputError,
    }.get(slug, ServiceError)
    assert type(rebuilt) is expected
    api_specs = {s.slug: s for s in ERROR_MAP.values()}
    assert api_specs.get(slug, spec) == spec  # the API layer reports it with this very spec
