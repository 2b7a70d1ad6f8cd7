"""The SQLite store's durability settings, read back from the writer connection itself.

``durable=True`` promises that an acknowledged commit survives a power cut:
WAL journal with ``synchronous=FULL`` (2), so every commit fsyncs the WAL.
``durable=False`` is the bounded-durability mode: ``synchronous=NORMAL`` (1),
fsync at checkpoints or on ``flush``. A kill test cannot tell FULL from OFF
(the OS keeps the page cache), so the pragmas are checked directly.
"""

from __future__ import annotations

import sqlite3
from pathlib import Path

import pytest

from tiers.backends.base import DeleteSpace, Put
from tiers.backends.sqlite_kv import SqliteKVStore

SYNCHRONOUS = {0: "OFF", 1: "NORMAL", 2: "FULL", 3: "EXTRA"}


def pragma(conn: sqlite3.Connection, name: str) -> object:
    (value,) = conn.execute(f"PRAGMA {name}").fetchone()
    return value


@pytest.mark.parametrize(
    ("kwargs", "synchronous"),
    [
        ({}, "FULL"),
        ({"durable": True}, "FULL"),
        ({"durable": False}, "NORMAL"),
        ({"durable": False, "flush_interval": 60.0}, "NORMAL"),
    ],
)
def test_the_writer_runs_wal_with_the_promised_synchronous_level(
    tmp_path: Path, kwargs: dict[str, object], synchronous: str
) -> None:
    store = SqliteKVStore(tmp_path / "kv.sqlite3", **kwargs)  # type: ignore[arg-type]
    try:
        writer = store._writer  # the connection every commit goes through
        assert pragma(writer, "journal_mode") == "wal"
        assert SYNCHRONOUS[int(pragma(writer, "synchronous"))] == synchronous  # type: ignore[call-overload]
    finally:
        store.close()
    # WAL is a property of the file: a fresh connection sees it too.
    with sqlite3.connect(tmp_path / "kv.sqlite3") as conn:
        assert pragma(conn, "journal_mode") == "wal"
    conn.close()


def test_deleted_rows_are_zeroed_and_scrub_empties_the_wal(tmp_path: Path) -> None:
    """Erasure down to the file: ``secure_delete`` on the writer, and a WAL truncated by scrub."""
    path = tmp_path / "kv.sqlite3"
    secret = b"okapi-in-the-pages-7f3a"
    store = SqliteKVStore(path)
    try:
        assert int(pragma(store._writer, "secure_delete")) == 1  # type: ignore[call-overload]
        store.commit([Put("s", f"k{n}", secret + bytes(2000)) for n in range(20)])
        store.commit([DeleteSpace("s")])
        assert store.scrub() is True
        wal = path.with_name(path.name + "-wal")
        assert not wal.exists() or wal.stat().st_size == 0
        assert secret not in path.read_bytes()
        assert store.get_many("s", ["k0"]) == [None]
    finally:
        store.close()
