"""Durability guardrails: a KV store that may lose acknowledged writes is refused unless allowed.

Redis is durable only with ``appendonly yes`` and ``appendfsync always``; a
server that refuses ``CONFIG GET`` cannot be verified. SQLite with
``durable=false`` acknowledges commits before they are fsync'd. Each is refused
unless the operator opts in with ``allow_volatile`` (then a warning is logged).
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memory import BackendUnavailableError, Memory, Settings
from memory.cli import app as cli
from tests.conftest import RedisServer


@pytest.fixture(scope="module")
def everysec(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("everysec"), appendfsync="everysec")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def no_aof(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("no-aof"), appendonly="no")
    yield server
    server.stop()


@pytest.fixture(scope="module")
def no_config(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    """A durable server that hides CONFIG, as many managed services do."""
    server = RedisServer(
        tmp_path_factory.mktemp("no-config"), extra=["--rename-command", "CONFIG", ""]
    )
    yield server
    server.stop()


@pytest.mark.parametrize(
    ("kind", "reason"),
    [
        ("everysec", "appendfsync everysec"),
        ("no_aof", "appendonly no"),
        ("no_config", "refused CONFIG GET"),
    ],
)
def test_a_redis_that_may_lose_writes_is_refused_unless_allowed(
    kind: str,
    reason: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    caplog: pytest.LogCaptureFixture,
) -> None:
    server: RedisServer = request.getfixturevalue(kind)
    with pytest.raises(BackendUnavailableError, match=reason) as refused:
        Memory.open(tmp_path, kv_url=server.url)
    assert type(refused.value).__name__ == "VolatileStoreError"
    assert "TIERMEM_ALLOW_VOLATILE" in str(refused.value)
    assert server.url.split("//")[1].split("/")[0] not in str(refused.value)  # no host:port

    # Opted in, it opens (the refusal left no lock behind) and says so in the log.
    with (
        caplog.at_level(logging.WARNING, logger="tiermem"),
        Memory.open(tmp_path, kv_url=server.url, allow_volatile=True) as memory,
    ):
        assert memory.allow_volatile
        memory.set_fact("u1", "tone", "concise")
    assert any(reason in r.getMessage() for r in caplog.records if r.levelno == logging.WARNING)


def test_a_durable_redis_opens_without_the_opt_in(tmp_path: Path, redis_url: str) -> None:
    with Memory.open(tmp_path, kv_url=redis_url) as memory:
        assert not memory.allow_volatile
        memory.set_fact("u1", "tone", "concise")


def test_sqlite_without_fsync_needs_the_opt_in(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    # From the environment (how a service is configured) it is refused...
    monkeypatch.setenv("TIERMEM_DURABLE", "false")
    with pytest.raises(BackendUnavailableError, match="durable=false"):
        Memory.from_settings(Settings(data_dir=tmp_path))
    with pytest.raises(BackendUnavailableError, match="durable=false"):
        Memory.open(tmp_path)
    with pytest.raises(BackendUnavailableError, match="durable=false"):
        Memory.open(tmp_path, durable=False, allow_volatile=False)
    monkeypatch.delenv("TIERMEM_DURABLE")
    # ...while durable=False written in the calling code is itself the explicit choice.
    with Memory.open(tmp_path, durable=False, flush_interval=0.05) as memory:
        assert memory.allow_volatile
        memory.set_fact("u1", "tone", "concise")
    with Memory.open(tmp_path) as memory:  # the default fsyncs every commit
        assert not memory.allow_volatile
        assert memory.get_fact("u1", "tone").value == "concise"


def test_the_opt_in_is_a_setting(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("TIERMEM_ALLOW_VOLATILE", "true")
    assert Settings(data_dir=tmp_path).allow_volatile
    monkeypatch.setenv("TIERMEM_ALLOW_VOLATILE", "maybe")
    with pytest.raises(ValueError, match="allow_volatile"):
        Settings(data_dir=tmp_path)


def test_api_keys_are_not_written_to_a_volatile_store(
    everysec: RedisServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERMEM_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TIERMEM_KV_URL", everysec.url)
    refused = CliRunner().invoke(cli, ["keys", "create", "--tenant", "acme"])
    assert refused.exit_code == 1, refused.output
    assert "appendfsync everysec" in refused.stderr
    monkeypatch.setenv("TIERMEM_ALLOW_VOLATILE", "true")
    created = CliRunner().invoke(cli, ["keys", "create", "--tenant", "acme"])
    assert created.exit_code == 0, created.output
