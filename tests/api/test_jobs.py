"""Background summary jobs through the service: durable in the store, refused per tenant before
anything is stored, fair across tenants and users, retried until done or failed for good, and
given back at shutdown for the next start.

Each test runs on a KV store of its own (a fresh SQLite file, or a fresh key prefix on the test
Redis), so no other test's queued jobs are claimed by its app, nor its own by theirs.
"""

from __future__ import annotations

import threading
import time
import uuid
from collections.abc import Iterator
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest

from memory.facade import Memory
from memory.settings import Settings
from summarizer import LiteLLMSummarizer
from summarizer.base import Summarizer
from tests.api.conftest import Api, new_tenant, start_app
from tests.api.test_errors import GOOD_SUMMARY, TRANSCRIPT
from tests.api.test_routes import wait_job
from tests.summarizer.stub_server import StubLLMServer, StubReply
from tests.waiting import wait_until
from tiers.backends.base import KVStore
from tiers.backends.redis_kv import RedisKVStore
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import SessionNotFoundError


@pytest.fixture
def stub() -> Iterator[StubLLMServer]:
    with StubLLMServer() as server:
        yield server


@pytest.fixture
def store(memory: Memory, request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVStore]:
    """A KV store of the module memory's backend that no other test uses."""
    kv: KVStore
    if isinstance(getattr(memory.kv, "inner", memory.kv), RedisKVStore):
        server = request.getfixturevalue("redis_server")
        kv = RedisKVStore(server.url, key_prefix=f"jobs-{uuid.uuid4().hex[:8]}")
    else:
        kv = SqliteKVStore(tmp_path / "jobs.sqlite3")
    yield kv
    kv.close()


def memory_on(store: KVStore, memory: Memory, summarizer: Summarizer | None = None) -> Memory:
    """A memory on ``store`` sharing the module memory's index and model."""
    return Memory(
        kv=store,
        index=memory.index,
        embedder=memory.embedder,
        summarizer=summarizer,
        tenant=new_tenant(),
        background_indexing=False,
    )


def llm(stub: StubLLMServer) -> LiteLLMSummarizer:
    return LiteLLMSummarizer(
        "openai/stub-model",
        api_base=stub.api_base,
        api_key="test",
        timeout=60,
        max_retries=0,
        max_transient_retries=0,
        retry_base_delay=0,
        retry_max_delay=0,
    )


def settings(tmp_path: Path, **values: Any) -> Settings:
    return Settings(data_dir=tmp_path / "app", auth_cache_seconds=0, **values)


def post(api: Api, headers: dict[str, str], user: str, session: str) -> Any:
    return api.client.post(
        f"/v1/users/{user}/sessions",
        json={"session_id": session, "transcript": TRANSCRIPT},
        headers=headers,
    )


def test_a_full_tenant_queue_refuses_before_storing_and_only_that_tenant(
    memory: Memory, store: KVStore, stub: StubLLMServer, tmp_path: Path
) -> None:
    # The model holds s1 until the test ends (the stub's stop wakes it): with a delay of some
    # seconds, a slow CI step let s1 finish and free a slot before the 429s were asserted.
    stub.fallback = lambda body: StubReply.json(GOOD_SUMMARY, delay=600)
    mem = memory_on(store, memory, llm(stub))
    values = {"summarize_workers": 1, "max_pending_jobs": 2, "shutdown_timeout_seconds": 0.5}
    with start_app(settings(tmp_path, **values), mem) as api:
        busy_tenant = new_tenant()
        busy, calm = api.key(busy_tenant), api.key(new_tenant())
        for session in ("s1", "s2"):
            assert post(api, busy, "u1", session).status_code == 202
        refused = post(api, busy, "u1", "s3")
        assert refused.status_code == 429, refused.text
        assert refused.json()["type"].endswith(":overloaded")
        assert int(refused.headers["retry-after"]) >= 1
        # The refusal came before anything was stored: no transcript, nothing pending.
        with pytest.raises(SessionNotFoundError):
            api.service.view(busy_tenant).sessions.transcript_header("u1", "s3")
        pending = api.client.get("/v1/users/u1/sessions:pending", headers=busy).json()
        assert "s3" not in pending["session_ids"]
        again = api.client.post("/v1/users/u1/sessions/s1:resummarize", headers=busy)
        assert again.status_code == 429
        # The other tenant is not refused for the busy one's queue.
        assert post(api, calm, "u2", "s1").status_code == 202


@pytest.mark.slow
def test_one_users_bulk_does_not_hold_back_other_users_or_tenants(
    memory: Memory, store: KVStore, stub: StubLLMServer, tmp_path: Path
) -> None:
    # The model answers once everything is posted: alice's queue is then deep however slowly
    # a loaded machine serves the posts (with a fixed model delay, the one worker could keep
    # up with the posting and leave nothing queued to be fair about).
    posted = threading.Event()

    def answer_once_posted(body: dict[str, Any]) -> StubReply:
        posted.wait(60)
        return StubReply.json(GOOD_SUMMARY)

    stub.fallback = answer_once_posted
    mem = memory_on(store, memory, llm(stub))
    with start_app(settings(tmp_path, summarize_workers=1), mem) as api:
        mine, theirs = api.key(new_tenant()), api.key(new_tenant())
        urls = []
        try:
            for n in range(40):
                r = post(api, mine, "alice", f"a{n}")
                assert r.status_code == 202
                urls.append((mine, r.json()["status_url"]))
            for headers, user in ((mine, "bob"), (theirs, "carol")):
                r = post(api, headers, user, "s1")
                assert r.status_code == 202
                urls.append((headers, r.json()["status_url"]))
        finally:
            posted.set()
        jobs = [wait_job(api, headers, url) for headers, url in urls]
    assert {job["status"] for job in jobs} == {"succeeded"}
    stamp = {job["job_id"]: datetime.fromisoformat(job["finished_at"]) for job in jobs}
    order = sorted(stamp, key=stamp.__getitem__)
    bulk = jobs[:40]
    for job in jobs[40:]:  # bob's, then carol's (another tenant)
        queued_at = datetime.fromisoformat(job["created_at"])
        done_before = sum(1 for a in bulk if stamp[a["job_id"]] <= queued_at)
        waiting = 40 - done_before
        assert waiting >= 10, "alice's queue was not deep when the others posted: inconclusive"
        # One of alice's runs when it is queued; the other newcomer may go first: 3 slots at most.
        assert order.index(job["job_id"]) < done_before + 3, (job["user_id"], order)


def test_a_job_that_keeps_failing_is_retried_then_fails_for_good_with_its_error(
    memory: Memory, store: KVStore, stub: StubLLMServer, tmp_path: Path
) -> None:
    stub.fallback = lambda body: StubReply.error(503, "upstream is down")
    mem = memory_on(store, memory, llm(stub))
    with start_app(settings(tmp_path, summarize_workers=1, job_max_attempts=2), mem) as api:
        headers = api.key(new_tenant())
        job = wait_job(api, headers, post(api, headers, "u1", "s1").json()["status_url"])
        assert (job["status"], job["attempts"], job["max_attempts"]) == ("failed", 2, 2)
        assert job["error"]["type"].endswith(":summarizer-unavailable")
        assert job["error"]["status"] == 503
        assert len(stub.requests) == 2  # one model call per attempt, no more
        pending = api.client.get("/v1/users/u1/sessions:pending", headers=headers).json()
        assert pending["session_ids"] == ["s1"]  # the transcript is kept
        # A failure that goes away: the retry succeeds.
        stub.enqueue(StubReply.error(503, "a blip"), StubReply.json(GOOD_SUMMARY))
        job = wait_job(api, headers, post(api, headers, "u1", "s2").json()["status_url"])
        assert (job["status"], job["attempts"]) == ("succeeded", 2)
        assert job["session"]["task_description"] == GOOD_SUMMARY["task_description"]
        text = api.client.get("/metrics").text
    assert 'tiermem_summary_job_attempts_total{outcome="retried"} 2.0' in text
    assert 'tiermem_summary_job_attempts_total{outcome="failed"} 1.0' in text
    assert 'tiermem_summary_job_attempts_total{outcome="succeeded"} 1.0' in text


def test_shutdown_gives_a_running_job_back_and_the_next_start_runs_it(
    memory: Memory, store: KVStore, stub: StubLLMServer, tmp_path: Path
) -> None:
    stub.fallback = lambda body: StubReply.json(GOOD_SUMMARY, delay=600)
    slow = memory_on(store, memory, llm(stub))
    values = {"summarize_workers": 1, "shutdown_timeout_seconds": 0.5}
    with start_app(settings(tmp_path, **values), slow) as api:
        tenant = new_tenant()
        headers = api.key(tenant)
        url = post(api, headers, "u1", "s1").json()["status_url"]
        wait_until(
            lambda: api.client.get(url, headers=headers).json()["status"] == "running",
            what="the job to run",
            every_s=0.05,
        )
        leaving = time.monotonic()
    assert time.monotonic() - leaving < 60  # bounded by the shutdown timeout, not the model's 600 s
    job = slow.for_tenant(tenant).jobs.get(url.rsplit("/", 1)[-1])
    assert job is not None
    assert (job.status, job.attempts) == ("pending", 0)
    # The next start (here with the offline summarizer) finishes it.
    with start_app(settings(tmp_path), memory_on(store, memory)) as api:
        done = wait_job(api, headers, url)
    assert (done["status"], done["attempts"]) == ("succeeded", 1)
