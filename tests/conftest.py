"""Shared fixtures: real backends only (SQLite file, a real redis-server, embedded Chroma)."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest
import redis

from tiers.backends.base import KVStore
from tiers.backends.redis_kv import RedisKVStore
from tiers.backends.sqlite_kv import SqliteKVStore

# Offline: never let litellm fetch its price list during tests.
os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


class RedisServer:
    """A real redis-server process on a free loopback port.

    Durable by default (``appendonly yes``, ``appendfsync always``): tiermem refuses
    any other configuration unless ``allow_volatile`` is set. ``extra`` adds
    command-line options (e.g. ``--rename-command CONFIG ""``).
    """

    def __init__(
        self,
        workdir: Path,
        *,
        appendfsync: str = "always",
        appendonly: str = "yes",
        extra: Sequence[str] = (),
    ) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            pytest.fail("redis-server is not installed: run the README's test command")
        self.port = free_port()
        self.url = f"redis://127.0.0.1:{self.port}/0"
        workdir.mkdir(parents=True, exist_ok=True)
        self.process = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(workdir),
                "--save",
                "",
                "--appendonly",
                appendonly,
                "--appendfsync",
                appendfsync,
                "--protected-mode",
                "no",
                *extra,
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        client = redis.Redis(port=self.port)
        deadline = time.monotonic() + 10
        while True:
            try:
                client.ping()
                break
            except redis.ConnectionError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    pytest.fail("redis-server did not start")
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        self.process.terminate()
        try:
            self.process.wait(5)
        except subprocess.TimeoutExpired:
            self.process.kill()
            self.process.wait()


@pytest.fixture(scope="session")
def redis_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisServer]:
    server = RedisServer(tmp_path_factory.mktemp("redis"))
    yield server
    server.stop()


@pytest.fixture
def redis_url(redis_server: RedisServer) -> Iterator[str]:
    """URL of the shared test server, flushed before each test."""
    client = redis.Redis.from_url(redis_server.url)
    client.flushall()
    client.close()
    return redis_server.url


@pytest.fixture
def sqlite_kv(tmp_path: Path) -> Iterator[SqliteKVStore]:
    store = SqliteKVStore(tmp_path / "kv.sqlite3", max_value_bytes=64 * 1024)
    yield store
    store.close()


@pytest.fixture
def redis_kv(redis_url: str) -> Iterator[RedisKVStore]:
    store = RedisKVStore(redis_url, max_value_bytes=64 * 1024)
    yield store
    store.close()


@pytest.fixture(params=["sqlite_kv", "redis_kv"])
def kv(request: pytest.FixtureRequest) -> KVStore:
    """Every KV backend, one after the other."""
    store: KVStore = request.getfixturevalue(request.param)
    return store


@pytest.fixture(autouse=True)
def no_network(monkeypatch: pytest.MonkeyPatch) -> None:
    """Fail any connection to a non-loopback address (catches run-time downloads).

    On for every test: the product must work offline, so any test that reaches
    for the network is a bug to see, not a flake to retry.
    """
    real_connect = socket.socket.connect
    real_getaddrinfo = socket.getaddrinfo
    loopback = {"127.0.0.1", "::1", "localhost"}

    def guarded_getaddrinfo(host: object, *args: object, **kwargs: object) -> object:
        if host not in loopback and host is not None:
            raise OSError(f"network access to {host!r} blocked by the no_network fixture")
        return real_getaddrinfo(host, *args, **kwargs)  # type: ignore[arg-type]

    def guarded_connect(self: socket.socket, address: object) -> None:
        if isinstance(address, tuple) and address and address[0] not in loopback:
            raise OSError(f"network access to {address!r} blocked by the no_network fixture")
        real_connect(self, address)  # type: ignore[arg-type]

    monkeypatch.setattr(socket, "getaddrinfo", guarded_getaddrinfo)
    monkeypatch.setattr(socket.socket, "connect", guarded_connect)


# -- markers: `heavy` (see tests/heavy_tests.txt) is what `./run fast` leaves out.

HEAVY_TESTS = Path(__file__).with_name("heavy_tests.txt")


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark the tests listed in ``heavy_tests.txt`` (by file or by test) ``heavy``."""
    lines = HEAVY_TESTS.read_text(encoding="utf-8").splitlines()
    heavy = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    for item in items:
        test = item.nodeid.split("[", 1)[0]
        if test in heavy or test.split("::", 1)[0] in heavy:
            item.add_marker(pytest.mark.heavy)
