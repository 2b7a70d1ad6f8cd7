"""Summary jobs across real `tiermem serve` processes: a server SIGKILLed with jobs queued and in
flight, whose jobs the next server on the same store finishes; and two replicas on one Redis
behind a round-robin balancer, where MemoryClient.end_session succeeds every time."""

from __future__ import annotations

import itertools
import os
import signal
import subprocess
import sys
from collections import Counter
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import httpx
import pytest
import redis

from memory.client import MemoryClient
from tests.api.test_routes import TRANSCRIPT, finished_job
from tests.conftest import RedisServer, free_port
from tests.servers import wait_ready
from tests.summarizer.stub_server import StubLLMServer, StubReply
from tests.waiting import wait_until

TIERMEM = str(Path(sys.executable).parent / "tiermem")


class Server:
    """A `tiermem serve` process on a free loopback port, auth off, ready when constructed."""

    def __init__(self, work: Path, name: str, env: Mapping[str, str]) -> None:
        self.port = free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self.log = work / f"{name}.log"
        full = {**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True", **env}
        for unset in ("TIERMEM_KV_URL", "TIERMEM_SUMMARIZER_MODEL"):
            if unset not in env:
                full.pop(unset, None)
        with self.log.open("ab") as out:
            self.process = subprocess.Popen(
                [TIERMEM, "serve", "--port", str(self.port), "--no-auth"],
                env=full,
                stdout=out,
                stderr=out,
            )
        wait_ready(f"{self.url}/readyz", self.process, self.log, what="tiermem serve", timeout=90)

    def job(self, job_id: str) -> httpx.Response:
        return httpx.get(f"{self.url}/v1/jobs/{job_id}", timeout=10)

    def kill(self) -> None:
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGKILL)
            self.process.wait(30)


@pytest.fixture
def servers() -> Iterator[list[Server]]:
    started: list[Server] = []
    yield started
    for server in started:
        server.kill()


def wait_finished(server: Server, job_id: str, timeout: float = 90) -> dict[str, Any]:
    return finished_job(lambda: server.job(job_id), timeout, every_s=0.1)


@pytest.mark.slow
def test_jobs_of_a_killed_server_are_finished_by_the_next_one(
    tmp_path: Path, servers: list[Server]
) -> None:
    store = {
        "TIERMEM_DATA_DIR": str(tmp_path / "data"),
        "TIERMEM_DURABLE": "false",
        "TIERMEM_ALLOW_VOLATILE": "true",
        # Short, since the second server waits it out; not so short that a heartbeat (every
        # third of it) starved for a second or two on a loaded machine loses a live job.
        "TIERMEM_JOB_LEASE_SECONDS": "6",
        "TIERMEM_SUMMARIZE_WORKERS": "1",
    }
    with StubLLMServer() as stub:
        stub.fallback = lambda body: StubReply(500, "{}", delay=120)  # the model hangs
        first = Server(
            tmp_path,
            "first",
            {
                **store,
                "TIERMEM_SUMMARIZER_MODEL": "openai/stub-model",
                "TIERMEM_SUMMARIZER_API_BASE": stub.api_base,
                "TIERMEM_SUMMARIZER_API_KEY": "test",
                "TIERMEM_SUMMARIZER_TIMEOUT": "300",
                "TIERMEM_SUMMARIZER_MAX_RETRIES": "0",
                "TIERMEM_SUMMARIZER_MAX_TRANSIENT_RETRIES": "0",
            },
        )
        servers.append(first)
        job_ids = []
        for session in ("in-flight", "queued"):
            r = httpx.post(
                f"{first.url}/v1/users/u1/sessions",
                json={"session_id": session, "transcript": TRANSCRIPT},
                timeout=30,
            )
            assert r.status_code == 202, r.text
            job_ids.append(r.json()["job_id"])
        wait_until(
            lambda: first.job(job_ids[0]).json()["status"] == "running",
            what="the first job to start",
            every_s=0.05,
        )
        assert first.job(job_ids[1]).json()["status"] == "pending"  # one worker, busy
        first.kill()  # SIGKILL: no shutdown, the lease is never given back

    second = Server(tmp_path, "second", store)  # the offline summarizer this time
    servers.append(second)
    in_flight, queued = (wait_finished(second, job_id) for job_id in job_ids)
    assert (in_flight["status"], in_flight["attempts"]) == ("succeeded", 2)  # retaken
    assert (queued["status"], queued["attempts"]) == ("succeeded", 1)
    for session in ("in-flight", "queued"):
        r = httpx.get(f"{second.url}/v1/users/u1/sessions/{session}", timeout=10)
        assert r.status_code == 200
        assert "Postgres" in r.json()["task_description"]
    pending = httpx.get(f"{second.url}/v1/users/u1/sessions:pending", timeout=10).json()
    assert pending["session_ids"] == []


class RoundRobin(httpx.HTTPTransport):
    """A balancer: each request goes to the next port in turn."""

    def __init__(self, ports: list[int]) -> None:
        super().__init__()
        self._ports = itertools.cycle(ports)
        self.sent: Counter[int] = Counter()

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        port = next(self._ports)
        request.url = request.url.copy_with(port=port)
        self.sent[port] += 1
        return super().handle_request(request)


@pytest.mark.slow
def test_two_replicas_on_one_redis_behind_a_round_robin_balancer(
    tmp_path: Path, redis_server: RedisServer, servers: list[Server]
) -> None:
    db = 7  # a database of the test server that no other test uses
    redis.Redis(port=redis_server.port, db=db).flushdb()
    kv_url = f"redis://127.0.0.1:{redis_server.port}/{db}"
    for name in ("a", "b"):
        env = {"TIERMEM_KV_URL": kv_url, "TIERMEM_DATA_DIR": str(tmp_path / name)}
        servers.append(Server(tmp_path, name, env))
    a, b = servers
    balancer = RoundRobin([a.port, b.port])
    with MemoryClient(a.url, transport=balancer, summarize_timeout=60) as client:
        for n in range(6):
            saved = client.end_session("u1", f"s{n}", TRANSCRIPT)
            assert saved.session_id == f"s{n}"
            assert "Postgres" in saved.task_description
    # Each end_session is a POST and at least one status poll, alternating: the polls went
    # to the replica that did not accept the job (12 requests at the least, 6 on each).
    assert balancer.sent[a.port] >= 6
    assert balancer.sent[b.port] >= 6
    # A job's status is answered by either replica, whichever accepted it.
    r = httpx.post(
        f"{a.url}/v1/users/u2/sessions",
        json={"session_id": "s1", "transcript": TRANSCRIPT},
        timeout=30,
    )
    assert r.status_code == 202, r.text
    job_id = r.json()["job_id"]
    assert b.job(job_id).status_code == 200
    done = wait_finished(b, job_id)
    assert done["status"] == "succeeded"
    assert a.job(job_id).json() == done
