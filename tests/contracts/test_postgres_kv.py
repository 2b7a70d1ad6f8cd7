"""What only the PostgreSQL KV store has: its schema migrations, its URL, a lost or
missing server, and its durability settings. The KV contract itself runs on it
through the ``kv`` and ``backend`` fixtures (tests/contracts/test_kv_contract.py).
"""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import psycopg
import pytest
from psycopg import pq
from typer.testing import CliRunner

from memory import Memory
from memory.cli import app as cli
from tests.conftest import PostgresServer, free_port
from tiers.backends import open_kv_store, redact_url, require_durable
from tiers.backends import postgres_kv as postgres_module
from tiers.backends.base import Check, Delete, DeleteSpace, Put
from tiers.backends.postgres_kv import MIGRATIONS, PostgresKVStore
from tiers.errors import (
    BackendUnavailableError,
    ConflictError,
    InvalidInputError,
    VolatileStoreError,
)


@pytest.fixture(scope="module")
def no_fsync() -> Iterator[PostgresServer]:
    """A server that never flushes to disk: fast, and loses acknowledged commits in a crash."""
    server = PostgresServer(settings=["fsync=off"])
    yield server
    server.stop()


def _secrets(server: PostgresServer, port: int | None = None) -> list[str]:
    return [server.password, "127.0.0.1", str(port or server.port)]


# ----------------------------------------------------------------------------- schema


def _create(url: str, table: str) -> None:
    store = PostgresKVStore(url, table=table)
    assert store.schema_version == len(MIGRATIONS)
    store.close()


def test_a_new_table_is_created_at_the_current_version(postgres_url: str) -> None:
    store = PostgresKVStore(postgres_url, table="fresh_schema")
    try:
        assert store.schema_version == len(MIGRATIONS)
        store.commit([Put("s", "k", b"v")])
    finally:
        store.close()
    for _ in range(3):
        again = PostgresKVStore(postgres_url, table="fresh_schema")
        assert again.schema_version == len(MIGRATIONS)
        assert again.scan("s") == [("k", b"v")]
        again.close()


def test_each_migration_is_applied_once(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    _create(postgres_url, "counted")
    # A later migration that counts its runs in a row: applying it twice would show.
    counting = (
        "INSERT INTO {table} (space, key, value) VALUES ('\\x6d'::bytea, '\\x72'::bytea, "
        "'\\x01'::bytea) ON CONFLICT (space, key) DO UPDATE SET value = {table}.value || '\\x01'"
    )
    monkeypatch.setattr(postgres_module, "MIGRATIONS", (*MIGRATIONS, (counting,)))
    for _ in range(3):
        store = PostgresKVStore(postgres_url, table="counted")
        assert store.schema_version == len(MIGRATIONS) + 1
        assert store.get_many("m", ["r"]) == [b"\x01"]
        store.close()


def test_stores_opened_together_on_a_new_table_all_work(postgres_url: str) -> None:
    # Workers of a pool start together on a new database: each must find the table.
    barrier = threading.Barrier(6, timeout=30)
    errors: list[BaseException] = []

    def first_use(slot: int) -> None:
        store = PostgresKVStore(postgres_url, table="opened_together")
        try:
            barrier.wait()
            store.commit([Put("s", f"k{slot}", b"v")])
        except BaseException as exc:
            errors.append(exc)
        finally:
            store.close()

    threads = [threading.Thread(target=first_use, args=(i,)) for i in range(6)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    store = PostgresKVStore(postgres_url, table="opened_together")
    assert [k for k, _ in store.scan("s")] == [f"k{i}" for i in range(6)]
    store.close()


def test_a_table_from_a_newer_version_is_refused(postgres_url: str) -> None:
    _create(postgres_url, "future")
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute("INSERT INTO future_migrations (v) VALUES (%s)", (len(MIGRATIONS) + 4,))
    store = PostgresKVStore(postgres_url, table="future")
    with pytest.raises(BackendUnavailableError, match="newer"):
        store.get_many("s", ["k"])
    store.close()


def test_a_table_created_before_the_commit_function_is_upgraded(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    # A database made by the tiermem that committed in several statements (schema
    # version 1: the table only) gets the commit function on first use, data kept.
    with monkeypatch.context() as old_tiermem:
        old_tiermem.setattr(postgres_module, "MIGRATIONS", MIGRATIONS[:1])
        old = PostgresKVStore(postgres_url, table="before_function")
        assert old.schema_version == 1
        old.close()
    with psycopg.connect(postgres_url, autocommit=True) as conn:
        conn.execute(
            "INSERT INTO before_function (space, key, value) VALUES (%s, %s, %s), (%s, %s, %s)",
            (b"s", b"k", b"old", b"s", b"gone", b"x"),
        )
    store = PostgresKVStore(postgres_url, table="before_function")
    try:
        assert store.schema_version == len(MIGRATIONS) == 2
        assert store.scan("s") == [("gone", b"x"), ("k", b"old")]
        store.commit([Put("s", "k", b"new"), Delete("s", "gone")], [Check("s", "k", b"old")])
        with pytest.raises(ConflictError):
            store.commit([Put("s", "k", b"lost")], [Check("s", "k", b"old")])
        assert store.scan("s") == [("k", b"new")]
    finally:
        store.close()


def _race_to_create(kv: PostgresKVStore, key: str, racers: int) -> list[int]:
    """``racers`` threads commit ``key`` at once, each checking it is absent; the winners."""
    barrier = threading.Barrier(racers, timeout=30)
    won: list[int] = []
    errors: list[BaseException] = []

    def create(slot: int) -> None:
        barrier.wait()
        try:
            kv.commit(
                [Put("s", key, b"%d" % slot), Put("other", f"{key}-{slot}", b"x")],
                [Check("s", key, None)],
            )
            won.append(slot)
        except ConflictError:
            pass
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=create, args=(i,)) for i in range(racers)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert errors == []
    return won


def test_of_commits_that_all_find_a_key_absent_exactly_one_creates_it(
    postgres_kv: PostgresKVStore,
) -> None:
    # No row to lock yet: the key's advisory lock is what makes the losers see the winner.
    for round_no in range(10):
        key = f"new-{round_no}"
        won = _race_to_create(postgres_kv, key, 6)
        assert len(won) == 1
        assert postgres_kv.get_many("s", [key]) == [b"%d" % won[0]]
        assert [k for k, _ in postgres_kv.scan("other", prefix=f"{key}-")] == [f"{key}-{won[0]}"]


# ----------------------------------------------------------------------------- round trips


def _exchanges(trace: str) -> list[list[str]]:
    """libpq trace lines grouped into round trips: what the client sent, then what came back."""
    exchanges: list[list[str]] = []
    sending = False
    for line in trace.splitlines():
        direction, _, message = line.split("\t")[:3]
        if direction == "F" and not sending:
            exchanges.append([])
        sending = direction == "F"
        exchanges[-1].append(f"{direction} {message}")
    return exchanges


def _traced(
    postgres_url: str, monkeypatch: pytest.MonkeyPatch, warm_up: Callable[[PostgresKVStore], None]
) -> tuple[PostgresKVStore, Callable[[Callable[[], object]], list[list[str]]]]:
    """A store, and a function that runs a call and returns the round trips it made.

    Every connection the store opens is recorded (psycopg's own ``connect``), and the
    call is traced by libpq (``PQtrace``): each message as it is sent or received.
    """
    opened: list[psycopg.Connection[Any]] = []
    real_connect = psycopg.connect

    def recording_connect(*args: Any, **kwargs: Any) -> psycopg.Connection[Any]:
        conn = real_connect(*args, **kwargs)
        opened.append(conn)
        return conn

    monkeypatch.setattr(psycopg, "connect", recording_connect)
    store = PostgresKVStore(postgres_url)
    warm_up(store)

    def round_trips(call: Callable[[], object]) -> list[list[str]]:
        with tempfile.TemporaryFile("w+") as trace:
            for conn in opened:
                conn.pgconn.trace(trace.fileno())
                conn.pgconn.set_trace_flags(pq.Trace.SUPPRESS_TIMESTAMPS | pq.Trace.REGRESS_MODE)
            try:
                call()
            finally:
                for conn in opened:
                    if not conn.closed:
                        conn.pgconn.untrace()  # flushes libpq's buffered trace
            trace.seek(0)
            return _exchanges(trace.read())

    return store, round_trips


def test_a_commit_is_one_round_trip(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    def warm_up(store: PostgresKVStore) -> None:
        store.commit([Put("s", "k", b"v0")])
        for n in range(1, 8):  # past psycopg's prepare threshold: later commits skip Parse
            store.commit(
                [Put("s", "k", b"v%d" % n), Delete("s", "d"), DeleteSpace("gone")],
                [Check("s", "k", b"v%d" % (n - 1)), Check("s", "absent", None)],
            )

    store, round_trips = _traced(postgres_url, monkeypatch, warm_up)
    try:
        checked = round_trips(
            lambda: store.commit(
                [Put("s", "k", b"v8"), Delete("s", "d"), DeleteSpace("gone")],
                [Check("s", "k", b"v7"), Check("s", "absent", None)],
            )
        )
        assert len(checked) == 1, checked
        (messages,) = checked
        assert messages[-1] == "B ReadyForQuery"
        assert "F Parse" not in messages  # the prepared call, not the SQL text again

        def conflicting() -> None:
            with pytest.raises(ConflictError):
                store.commit(
                    [Put("s", "k", b"lost"), Delete("s", "d"), DeleteSpace("gone")],
                    [Check("s", "k", b"v7"), Check("s", "absent", None)],
                )

        failed = round_trips(conflicting)
        assert len(failed) == 1, failed
        assert store.get_many("s", ["k"]) == [b"v8"]
    finally:
        store.close()


def test_a_read_is_one_round_trip(postgres_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    store, round_trips = _traced(
        postgres_url, monkeypatch, lambda store: store.commit([Put("s", "k", b"v")])
    )
    try:
        assert len(round_trips(lambda: store.get_many("s", ["k", "other"]))) == 1
        assert len(round_trips(lambda: store.scan("s", prefix="k", limit=2))) == 1
    finally:
        store.close()


def test_tables_are_isolated(postgres_url: str) -> None:
    first = PostgresKVStore(postgres_url, table="first_table")
    second = PostgresKVStore(postgres_url, table="second_table")
    first.commit([Put("s", "k", b"1")])
    assert second.get_many("s", ["k"]) == [None]
    first.close()
    second.close()


@pytest.mark.parametrize("table", ["", "kv; DROP TABLE x", "1kv", "k" * 49, "tábla"])
def test_a_malformed_table_name_is_invalid_input(postgres_url: str, table: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        PostgresKVStore(postgres_url, table=table)
    assert info.value.field == "table"


# ----------------------------------------------------------------------------- URL


@pytest.mark.parametrize("scheme", ["postgresql", "postgres"])
def test_a_postgres_url_opens_the_postgres_store(
    postgres_server: PostgresServer, postgres_url: str, scheme: str
) -> None:
    url = scheme + postgres_url.removeprefix("postgresql")
    store = open_kv_store(url, max_value_bytes=100)
    try:
        assert isinstance(store, PostgresKVStore)
        assert store.max_value_bytes == 100
        store.commit([Put("s", "k", b"v")])
        assert store.get_many("s", ["k"]) == [b"v"]
        assert store.spaces() == ["s"]
    finally:
        store.close()


def test_redact_url_hides_postgres_passwords() -> None:
    assert redact_url("postgresql://u:secret@db:5432/app") == "postgresql://***@db:5432/app"
    assert (
        redact_url("postgresql://db/app?sslmode=require&password=secret&user=u")
        == "postgresql://db/app?sslmode=require&password=***&user=u"
    )
    assert (
        redact_url("postgresql://db/app?sslmode=require") == "postgresql://db/app?sslmode=require"
    )


def test_tiermem_info_names_the_backend_without_the_password(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.setenv("TIERMEM_DATA_DIR", str(tmp_path))
    monkeypatch.setenv("TIERMEM_KV_URL", "postgresql://app:pg-pw@db.internal:5432/memory")
    result = CliRunner().invoke(cli, ["info"])
    assert result.exit_code == 0, result.output
    assert "pg-pw" not in result.output
    assert "kv_backend = PostgreSQL at postgresql://***@db.internal:5432/memory" in result.output
    monkeypatch.delenv("TIERMEM_KV_URL")
    result = CliRunner().invoke(cli, ["info"])
    assert f"kv_backend = SQLite at {tmp_path / 'tiermem.sqlite3'}" in result.output


def test_without_psycopg_a_postgres_url_names_the_extra_to_install() -> None:
    child = subprocess.run(
        [sys.executable, "-c", _WITHOUT_PSYCOPG],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])},
    )
    assert child.returncode == 0, child.stderr
    assert "pip install 'tiermem[postgres]'" in child.stdout


_WITHOUT_PSYCOPG = """
import sys
sys.modules["psycopg"] = None  # as if not installed
from memory.integrations import MissingExtraError
from tiers.backends import open_kv_store
try:
    open_kv_store("postgresql://u@127.0.0.1:1/db")
except MissingExtraError as exc:
    print(exc)
"""


def test_an_invalid_url_is_invalid_input_without_the_password() -> None:
    with pytest.raises(InvalidInputError) as info:
        PostgresKVStore("postgresql://u:hunter2@db/app?nosuchoption=1")
    assert info.value.field == "url"
    assert "hunter2" not in str(info.value)


# ----------------------------------------------------------------------------- a lost server


USES: list[Callable[[PostgresKVStore], object]] = [
    lambda kv: kv.ping(),
    lambda kv: kv.get_many("s", ["k"]),
    lambda kv: kv.scan("s"),
    lambda kv: kv.commit([Put("s", "k", b"v")]),
    lambda kv: kv.spaces(),
    lambda kv: kv.volatility(),
]
USE_IDS = ["ping", "get_many", "scan", "commit", "spaces", "volatility"]


@pytest.mark.parametrize("use", USES, ids=USE_IDS)
def test_unreachable_postgres_is_unavailable_and_named_without_credentials(
    postgres_server: PostgresServer, use: Callable[[PostgresKVStore], object]
) -> None:
    port = free_port()
    url = f"postgresql://tiermem:{postgres_server.password}@127.0.0.1:{port}/db"
    store = PostgresKVStore(url)
    try:
        with pytest.raises(BackendUnavailableError) as info:
            use(store)
        assert isinstance(info.value.__cause__, psycopg.Error)
        for secret in _secrets(postgres_server, port):
            assert secret not in str(info.value)
    finally:
        store.close()


def test_connections_the_server_ended_are_replaced(
    postgres_server: PostgresServer, postgres_url: str
) -> None:
    store = PostgresKVStore(postgres_url)
    store.commit([Put("s", "k", b"v")])
    with psycopg.connect(postgres_url, autocommit=True) as admin:
        admin.execute(
            "SELECT pg_terminate_backend(pid) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        )
        deadline = time.monotonic() + 60
        while admin.execute(
            "SELECT count(*) FROM pg_stat_activity "
            "WHERE datname = current_database() AND pid <> pg_backend_pid()"
        ).fetchone() != (0,):
            assert time.monotonic() < deadline, "the terminated backends never went away"
            time.sleep(0.02)
    # The pooled connection is dead: the store notices and uses a new one, no error.
    assert store.get_many("s", ["k"]) == [b"v"]
    store.commit([Put("s", "k", b"w")], [Check("s", "k", b"v")])
    assert store.scan("s") == [("k", b"w")]
    store.close()


# ----------------------------------------------------------------------------- durability


def test_a_durable_server_reports_no_volatility(postgres_kv: PostgresKVStore) -> None:
    assert postgres_kv.volatility() is None
    assert require_durable(postgres_kv, allow_volatile=False) is None


def test_synchronous_commit_off_is_refused_unless_allowed(
    postgres_server: PostgresServer, postgres_url: str, tmp_path: Path
) -> None:
    url = f"{postgres_url}?options=-csynchronous_commit%3Doff"
    store = PostgresKVStore(url)
    reason = store.volatility()
    assert reason is not None
    assert "synchronous_commit off" in reason
    with pytest.raises(VolatileStoreError, match="synchronous_commit off") as refused:
        require_durable(store, allow_volatile=False)
    for secret in _secrets(postgres_server):
        assert secret not in str(refused.value)
    assert require_durable(store, allow_volatile=True) == reason
    store.close()
    with pytest.raises(VolatileStoreError):
        Memory.open(tmp_path, kv_url=url)
    with Memory.open(tmp_path, kv_url=url, allow_volatile=True) as memory:
        assert memory.allow_volatile
        memory.set_fact("u1", "tone", "concise")


def test_fsync_off_is_refused_unless_allowed(no_fsync: PostgresServer, tmp_path: Path) -> None:
    url = no_fsync.database_url("guard")
    with pytest.raises(VolatileStoreError, match="fsync off") as refused:
        Memory.open(tmp_path, kv_url=url)
    assert "TIERMEM_ALLOW_VOLATILE" in str(refused.value)
    for secret in _secrets(no_fsync):
        assert secret not in str(refused.value)
    with Memory.open(tmp_path, kv_url=url, allow_volatile=True) as memory:
        memory.set_fact("u1", "tone", "concise")


def test_a_stopped_server_gives_typed_errors_without_credentials(
    no_fsync: PostgresServer,
) -> None:
    # Last test of the module: it stops the module's server.
    store = PostgresKVStore(no_fsync.database_url("stopped"))
    store.commit([Put("s", "k", b"v")])
    no_fsync.stop()
    for use in USES:
        with pytest.raises(BackendUnavailableError) as info:
            use(store)
        for secret in _secrets(no_fsync):
            assert secret not in str(info.value)
    store.close()
