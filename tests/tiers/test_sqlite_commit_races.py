"""A lone SQLite commit racing another process, and readers of a file cut short, on real files.

A lone commit runs as inserts and a guarded update and, when one of them finds
its check failed, rolls back and begins again before checking the usual way:
another process may take the file's write lock in between. Readers do not map
the database file into memory (``PRAGMA mmap_size`` 0, as before session
25): a file cut short by another process gives an error, not a SIGBUS that
kills the process.
"""

from __future__ import annotations

import os
import sqlite3
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tiers.backends.base import Check, Put
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import BackendUnavailableError, ConflictError


def _write_between_rollback_and_begin(
    store: SqliteKVStore, other: sqlite3.Connection, value: bytes, *, hold: bool
) -> None:
    """Have ``other`` write ``value`` at the lone commit's second BEGIN (``hold``: uncommitted)."""
    writer = store._writer
    rolled_back = False

    def trace(sql: str) -> None:
        nonlocal rolled_back
        if sql == "ROLLBACK":
            rolled_back = True
        elif rolled_back and sql == "BEGIN IMMEDIATE" and not other.in_transaction:
            other.execute("BEGIN IMMEDIATE")
            other.execute("UPDATE kv SET value = ? WHERE space = 's' AND key = 'head'", (value,))
            if not hold:
                other.execute("COMMIT")

    writer.set_trace_callback(trace)


def test_a_commit_between_the_rollback_and_the_begin_is_checked_against(tmp_path: Path) -> None:
    store = SqliteKVStore(tmp_path / "kv.sqlite3", durable=False)
    other = sqlite3.connect(tmp_path / "kv.sqlite3", isolation_level=None, timeout=5)
    try:
        store.commit([Put("s", "head", b"0")], [Check("s", "head", None)])
        _write_between_rollback_and_begin(store, other, b"moved", hold=False)
        # The guarded update finds "0", not "stale"; then another process moves the head.
        with pytest.raises(ConflictError, match="'head'"):
            store.commit([Put("s", "head", b"1")], [Check("s", "head", b"stale")])
        assert store.get_many("s", ["head"]) == [b"moved"]
        store._writer.set_trace_callback(None)
        store.commit([Put("s", "head", b"2")], [Check("s", "head", b"moved")])
        assert store.get_many("s", ["head"]) == [b"2"]
    finally:
        other.close()
        store.close()


def test_a_lock_held_between_the_rollback_and_the_begin_leaves_the_writer_usable(
    tmp_path: Path,
) -> None:
    store = SqliteKVStore(tmp_path / "kv.sqlite3", durable=False)
    other = sqlite3.connect(tmp_path / "kv.sqlite3", isolation_level=None, timeout=5)
    try:
        store.commit([Put("s", "head", b"0")], [Check("s", "head", None)])
        _write_between_rollback_and_begin(store, other, b"moved", hold=True)
        # Its own check failed, and another process holds the write lock past the busy
        # timeout: the commit fails as any commit on a locked file does.
        store._writer.execute("PRAGMA busy_timeout=200")
        with pytest.raises(BackendUnavailableError, match="locked"):
            store.commit([Put("s", "head", b"1")], [Check("s", "head", b"stale")])
        assert not store._writer.in_transaction
        other.execute("COMMIT")
        store._writer.set_trace_callback(None)
        # The connection is usable, and nothing of the refused commit was written.
        assert store.get_many("s", ["head"]) == [b"moved"]
        with pytest.raises(ConflictError, match="'head'"):
            store.commit([Put("s", "head", b"1")], [Check("s", "head", b"0")])
        store.commit([Put("s", "head", b"2")], [Check("s", "head", b"moved")])
        assert store.get_many("s", ["head"]) == [b"2"]
    finally:
        other.close()
        store.close()


_TRUNCATED_READ = """
import os, sys
from tiers.backends.base import Put
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import BackendUnavailableError

path = sys.argv[1]
store = SqliteKVStore(path, durable=False)
for start in range(0, 1000, 100):
    store.commit([Put("s", f"k{n:05d}", os.urandom(4000)) for n in range(start, start + 100)])
store._writer.execute("PRAGMA wal_checkpoint(TRUNCATE)")
assert len(store.scan("s")) == 1000
os.truncate(path, 4096)  # another process cuts the file short
try:
    store.scan("s")
except BackendUnavailableError:
    print("refused")
"""


def test_a_file_truncated_by_another_process_is_an_error_not_a_crash(tmp_path: Path) -> None:
    result = subprocess.run(
        [sys.executable, "-c", textwrap.dedent(_TRUNCATED_READ), str(tmp_path / "kv.sqlite3")],
        capture_output=True,
        text=True,
        timeout=120,
        env={**os.environ},
        check=False,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "refused"
