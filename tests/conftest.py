"""Shared fixtures: real backends only (SQLite file, a real redis-server, a real
PostgreSQL server, embedded Chroma)."""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import psycopg
import pytest
import redis
from psycopg import sql

from tiers.backends.base import KVStore
from tiers.backends.postgres_kv import PostgresKVStore
from tiers.backends.redis_cluster_kv import RedisClusterKVStore
from tiers.backends.redis_kv import RedisKVStore
from tiers.backends.sqlite_kv import SqliteKVStore

if TYPE_CHECKING:
    # Imported where used: tests/servers.py imports this module.
    from tests.servers import RedisClusterNodes

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
        deadline = time.monotonic() + 60  # a loaded machine may take seconds to start it
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


# ----------------------------------------------------------------------------- PostgreSQL


def postgres_binary(name: str) -> str | None:
    """A PostgreSQL server binary: on PATH, else the newest under Debian's /usr/lib/postgresql."""
    found = shutil.which(name)
    if found is not None:
        return found
    versions = sorted(
        Path("/usr/lib/postgresql").glob(f"*/bin/{name}"),
        key=lambda path: int(path.parts[-3]) if path.parts[-3].isdigit() else 0,
    )
    return str(versions[-1]) if versions else None


class PostgresServer:
    """A real PostgreSQL server (``initdb`` + ``postgres``) on a free loopback port.

    Durable like a production server (``fsync=on``, ``synchronous_commit=on``);
    ``settings`` adds ``-c name=value`` options. Its cluster lives in a new
    temporary folder: as root, initdb refuses to run, so the server then runs
    as the ``postgres`` user and the folder is that user's. Connections over
    TCP need the password (``url`` carries it), so the tests see a credential
    in every URL they must keep out of messages.
    """

    user = "tiermem"
    password = "pg-secret-pw"  # a throwaway test server's

    def __init__(self, *, settings: Sequence[str] = ()) -> None:
        initdb, postgres = postgres_binary("initdb"), postgres_binary("postgres")
        if initdb is None or postgres is None:
            pytest.fail("PostgreSQL is not installed: run the README's test command")
        self.root = Path(tempfile.mkdtemp(prefix="tiermem-pg-"))
        # As root, the server runs as the ``postgres`` user (which Debian's package creates).
        run_as = "postgres" if os.geteuid() == 0 else None
        self.data = self.root / "data"
        pwfile = self.root / "pw"
        pwfile.write_text(self.password)
        if run_as is not None:
            try:
                shutil.chown(self.root, run_as, run_as)
                shutil.chown(pwfile, run_as, run_as)
            except LookupError:
                shutil.rmtree(self.root)
                pytest.fail("as root, the PostgreSQL tests need a 'postgres' user to run it as")
        # --no-sync: initdb's own files need not reach the disk (a test cluster);
        # the server's commits are fsync'd as configured below.
        subprocess.run(
            [
                initdb,
                "-D",
                str(self.data),
                "-U",
                self.user,
                f"--pwfile={pwfile}",
                "--auth-local=trust",
                "--auth-host=scram-sha-256",
                "--encoding=UTF8",
                "--no-locale",
                "--no-sync",
            ],
            check=True,
            cwd=self.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            user=run_as,
            group=run_as,
            extra_groups=[] if run_as else None,
        )
        self._databases: set[str] = set()
        self.port = free_port()
        self.url = f"postgresql://{self.user}:{self.password}@127.0.0.1:{self.port}/postgres"
        self._postgres, self._run_as, self._settings = postgres, run_as, tuple(settings)
        self.start()

    def start(self) -> None:
        """Start the server on its cluster and port; wait until it takes connections."""
        # Its own process group, so kill() can take down the postmaster and every backend.
        self.process = subprocess.Popen(
            [
                self._postgres,
                "-D",
                str(self.data),
                "-p",
                str(self.port),
                "-c",
                "listen_addresses=127.0.0.1",
                "-c",
                f"unix_socket_directories={self.root}",
                "-c",
                "fsync=on",
                "-c",
                "synchronous_commit=on",
                "-c",
                "max_connections=200",
                *(arg for option in self._settings for arg in ("-c", option)),
            ],
            cwd=self.root,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=self._run_as,
            group=self._run_as,
            extra_groups=[] if self._run_as else None,
            start_new_session=True,
        )
        deadline = time.monotonic() + 30
        while True:
            try:
                psycopg.connect(self.url, connect_timeout=2).close()
                break
            except psycopg.OperationalError:
                if time.monotonic() > deadline or self.process.poll() is not None:
                    self.stop()
                    pytest.fail("postgres did not start")
                time.sleep(0.05)

    def kill(self) -> None:
        """Crash the server: SIGKILL to the postmaster and every backend at once."""
        os.killpg(self.process.pid, signal.SIGKILL)
        self.process.wait()

    def admin(self, database: str = "postgres") -> psycopg.Connection[tuple[object, ...]]:
        """A superuser connection over the server's Unix socket (no password round trips)."""
        return psycopg.connect(
            host=str(self.root), port=self.port, user=self.user, dbname=database, autocommit=True
        )

    def database_url(self, name: str) -> str:
        """The URL of database ``name``, created empty if it does not exist."""
        if name not in self._databases:
            with self.admin() as conn:
                exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (name,))
                if exists.fetchone() is None:
                    conn.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(name)))
            self._databases.add(name)
        return self.url.rsplit("/", 1)[0] + f"/{name}"

    def stop(self) -> None:
        """Stop the server by its pid (fast shutdown) and remove its folder."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGINT)
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        shutil.rmtree(self.root, ignore_errors=True)


@pytest.fixture(scope="session")
def postgres_server() -> Iterator[PostgresServer]:
    server = PostgresServer()
    yield server
    server.stop()


@pytest.fixture
def postgres_url(postgres_server: PostgresServer) -> str:
    """URL of the shared test database, its KV table emptied before each test."""
    url = postgres_server.database_url("tiermem_test")
    with postgres_server.admin("tiermem_test") as conn:
        # The clean-up need not wait for its own fsync; the stores' commits still do.
        conn.execute("SET synchronous_commit = off")
        conn.execute(
            "DO $$ BEGIN IF to_regclass('tiermem_kv') IS NOT NULL THEN DELETE FROM tiermem_kv; "
            "END IF; END $$"
        )
    return url


@pytest.fixture
def postgres_kv(postgres_url: str) -> Iterator[PostgresKVStore]:
    store = PostgresKVStore(postgres_url, max_value_bytes=64 * 1024)
    yield store
    store.close()


# ----------------------------------------------------------------------------- Redis Cluster


@pytest.fixture(scope="session")
def redis_cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[RedisClusterNodes]:
    """A 3-primary, 3-replica Redis Cluster for the whole session (tests/servers.py).

    No test kills one of its nodes, so a long node timeout: with the 1 s default, a primary
    stalled that long (an fsync on a loaded CI disk) would be failed over mid-test.
    """
    from tests.servers import RedisClusterNodes

    nodes = RedisClusterNodes(tmp_path_factory.mktemp("redis-cluster"), node_timeout_ms=5_000)
    yield nodes
    nodes.stop()


@pytest.fixture
def redis_cluster_url(redis_cluster: RedisClusterNodes) -> str:
    """URL of the shared test cluster, every primary flushed before each test."""
    redis_cluster.flush()
    return redis_cluster.url


@pytest.fixture
def redis_cluster_kv(redis_cluster_url: str) -> Iterator[RedisClusterKVStore]:
    store = RedisClusterKVStore(redis_cluster_url, max_value_bytes=64 * 1024)
    yield store
    store.close()


# ----------------------------------------------------------------------------- every KV backend


@pytest.fixture(params=["sqlite_kv", "redis_kv", "postgres_kv", "redis_cluster_kv"])
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


# Backends the fast loop leaves to `./run test`: the same tests run on SQLite and Redis there.
HEAVY_BACKENDS = {
    "postgres_kv",
    "postgres_url",
    "redis_cluster",
    "redis_cluster_kv",
    "redis_cluster_url",
}


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    """Mark ``heavy`` the tests listed in ``heavy_tests.txt`` (by file or by test) and the
    PostgreSQL runs of tests parametrized over backends."""
    lines = HEAVY_TESTS.read_text(encoding="utf-8").splitlines()
    heavy = {line.strip() for line in lines if line.strip() and not line.startswith("#")}
    for item in items:
        test = item.nodeid.split("[", 1)[0]
        callspec = getattr(item, "callspec", None)
        on_heavy_backend = callspec is not None and not HEAVY_BACKENDS.isdisjoint(
            str(value) for value in callspec.params.values()
        )
        if test in heavy or test.split("::", 1)[0] in heavy or on_heavy_backend:
            item.add_marker(pytest.mark.heavy)
