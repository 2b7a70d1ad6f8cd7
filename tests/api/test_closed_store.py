"""The service's background loops stop when their store is closed, and wait out an outage.

A memory closed under a running app (its owner closed it before the app shut
down) raises :class:`~tiers.errors.StoreClosedError` on every call: final,
unlike an outage. The retention sweeper, the index checker, the summary job
workers and their lease heartbeat used to retry it forever, a warning each
period; now each ends (logging once, at info). A store that is down (a Redis
server gone) is still retried: the loops stay up for it to come back.
"""

from __future__ import annotations

import logging
import threading
from collections.abc import Iterator
from functools import partial
from pathlib import Path

import pytest

from api.state import ServiceState
from memory.facade import Memory
from memory.settings import Settings
from tests.api.conftest import start_app
from tests.conftest import RedisServer
from tests.memory.test_erasure import BlockingSummarizer
from tests.waiting import wait_until


def loop_settings(data_dir: Path, *, workers: int = 2) -> Settings:
    """Every background loop on, with short periods so they meet the closed store at once."""
    return Settings(
        data_dir=data_dir,
        auth_enabled=False,
        run_sweep_interval_seconds=0.1,
        index_check_interval_seconds=0.1,
        summarize_workers=workers,
        job_lease_seconds=3.0,  # the heartbeat beats every second
        shutdown_timeout_seconds=5,
    )


def loops(service: ServiceState) -> list[threading.Thread]:
    """The service's background threads: sweeper, index checker, job workers, lease heartbeat."""
    threads = [service._sweeper, service._index_checker, *service.jobs._threads]
    assert all(thread is not None for thread in threads)
    return [thread for thread in threads if thread is not None]


@pytest.fixture(params=["embedded", "redis"])
def kv_url(request: pytest.FixtureRequest) -> str | None:
    """``None`` (the embedded SQLite store) or the shared Redis server's URL."""
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_url")
        return url
    return None


@pytest.fixture
def own_memory(kv_url: str | None, tmp_path: Path) -> Iterator[Memory]:
    """A memory of this test alone: the test closes it under the app."""
    mem = Memory.from_settings(
        Settings(data_dir=tmp_path / "data", kv_url=kv_url, durable=False, allow_volatile=True)
    )
    yield mem
    mem.close()  # idempotent


def test_every_background_loop_ends_when_its_store_is_closed(
    own_memory: Memory, tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    caplog.set_level(logging.INFO, logger="tiermem.api")
    with start_app(loop_settings(tmp_path), own_memory) as api:
        threads = loops(api.service)
        assert len(threads) == 5
        # A job's life: the loops have met the store before it closes.
        posted = api.client.post(
            "/v1/users/u1/sessions",
            json={"session_id": "s1", "summary": {"task_description": "plan a trip"}},
        )
        assert posted.status_code == 201, posted.text
        assert all(thread.is_alive() for thread in threads)

        own_memory.close()

        for thread in threads:
            thread.join(30)
        assert [thread.name for thread in threads if thread.is_alive()] == []
    stops = [r.getMessage() for r in caplog.records if "its store is closed" in r.getMessage()]
    assert any(m.startswith("retention sweep stops") for m in stops), stops
    assert any(m.startswith("index check stops") for m in stops), stops
    # Logged once for all the job threads, at info: a closed store is not an outage.
    jobs_stop = [r for r in caplog.records if r.getMessage().startswith("summary jobs stop")]
    assert len(jobs_stop) == 1
    assert jobs_stop[0].levelno == logging.INFO


def test_the_lease_heartbeat_of_a_running_job_ends_when_its_store_is_closed(
    own_memory: Memory, tmp_path: Path
) -> None:
    summarizer = BlockingSummarizer()
    own_memory.summarizer = summarizer
    try:
        with start_app(loop_settings(tmp_path, workers=1), own_memory) as api:
            *workers, heartbeat = api.service.jobs._threads
            assert heartbeat.name == "tiermem-job-lease"
            posted = api.client.post(
                "/v1/users/u1/sessions",
                json={
                    "session_id": "s1",
                    "transcript": [{"role": "user", "content": "Plan a trip to Lisbon."}],
                },
            )
            assert posted.status_code == 202, posted.text
            assert summarizer.entered.wait(30)

            own_memory.close()

            # The only worker is busy in the job: the heartbeat itself met the closed store.
            heartbeat.join(30)
            assert not heartbeat.is_alive()
            assert all(worker.is_alive() for worker in workers)
            summarizer.release.set()
            for worker in workers:
                worker.join(30)
            assert not any(worker.is_alive() for worker in workers)
    finally:
        summarizer.release.set()


def test_the_loops_keep_retrying_while_the_store_is_down(
    tmp_path: Path, caplog: pytest.LogCaptureFixture
) -> None:
    server = RedisServer(tmp_path / "redis")
    mem = Memory.from_settings(Settings(data_dir=tmp_path / "data", kv_url=server.url))
    try:
        with start_app(loop_settings(tmp_path), mem) as api:
            threads = loops(api.service)
            server.stop()

            def failed(prefix: str) -> bool:
                return any(
                    r.levelno == logging.WARNING and r.getMessage().startswith(prefix)
                    for r in caplog.records
                )

            # Each loop met the outage, and is still up for the store to come back.
            for what, prefix in [
                ("a failed claim", "summary jobs: cannot claim"),
                ("a failed sweep", "retention sweep failed"),
                ("a failed index check", "index check failed"),
            ]:
                wait_until(partial(failed, prefix), what=what, every_s=0.05)
            assert all(thread.is_alive() for thread in threads)
        # The app's shutdown still stops them.
        assert not any(thread.is_alive() for thread in threads)
    finally:
        server.stop()
        mem.close()
