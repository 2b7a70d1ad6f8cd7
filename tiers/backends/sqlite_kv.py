"""SQLite implementation of :class:`~tiers.backends.base.KVStore` (the embedded default).

One table ``kv(space, key, value)``; WAL journal with ``synchronous=FULL`` so a
commit is fsync'd before it is acknowledged. Writes go through one connection
under a lock (SQLite has one writer anyway); reads use a connection per thread,
which WAL lets run beside the writer.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

from tiers.backends.base import (
    DEFAULT_MAX_VALUE_BYTES,
    Check,
    Delete,
    DeleteSpace,
    Put,
    Write,
)
from tiers.backends.common import check_writes, prefix_upper_bound
from tiers.errors import BackendUnavailableError, ConflictError

# Ordered schema migrations: the list index + 1 is the schema version (PRAGMA user_version).
MIGRATIONS: tuple[str, ...] = (
    """
    CREATE TABLE IF NOT EXISTS kv (
        space TEXT NOT NULL,
        key   TEXT NOT NULL,
        value BLOB NOT NULL,
        PRIMARY KEY (space, key)
    ) WITHOUT ROWID
    """,
)

_BUSY_TIMEOUT_S = 30.0


class SqliteKVStore:
    """A :class:`KVStore` in one SQLite file.

    Args:
        path: Database file; its parent directory is created if missing.
        max_value_bytes: Largest value accepted by :meth:`commit`.
        durable: ``True`` (default) fsyncs every commit (``synchronous=FULL``);
            ``False`` uses ``synchronous=NORMAL``: a power cut may lose the last
            commits, a process crash loses nothing.
    """

    def __init__(
        self,
        path: str | Path,
        *,
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
        durable: bool = True,
    ) -> None:
        self.path = Path(path)
        self.max_value_bytes = max_value_bytes
        self._synchronous = "FULL" if durable else "NORMAL"
        self._write_lock = threading.Lock()
        self._local = threading.local()
        self._readers: list[sqlite3.Connection] = []
        self._readers_lock = threading.Lock()
        self._closed = False
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = self._connect()
            self._migrate()
        except (sqlite3.Error, OSError) as exc:
            raise BackendUnavailableError(
                f"cannot open SQLite store at {self.path}: {exc}"
            ) from exc

    def _connect(self) -> sqlite3.Connection:
        conn = sqlite3.connect(
            self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )
        conn.execute("PRAGMA journal_mode=WAL")
        conn.execute(f"PRAGMA synchronous={self._synchronous}")
        return conn

    def _migrate(self) -> None:
        with self._write_lock:
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                (version,) = conn.execute("PRAGMA user_version").fetchone()
                for index in range(version, len(MIGRATIONS)):
                    conn.execute(MIGRATIONS[index])
                conn.execute(f"PRAGMA user_version={len(MIGRATIONS)}")
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    @property
    def schema_version(self) -> int:
        """The schema version of the open database."""
        (version,) = self._reader().execute("PRAGMA user_version").fetchone()
        return int(version)

    def _reader(self) -> sqlite3.Connection:
        if self._closed:
            raise BackendUnavailableError("the SQLite store is closed")
        conn: sqlite3.Connection | None = getattr(self._local, "conn", None)
        if conn is None:
            conn = self._connect()
            self._local.conn = conn
            with self._readers_lock:
                self._readers.append(conn)
        return conn

    @contextmanager
    def _translate(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise BackendUnavailableError(f"SQLite {what} failed: {exc}") from exc

    def get_many(self, space: str, keys: Sequence[str]) -> list[bytes | None]:
        """See :meth:`KVStore.get_many`."""
        if not keys:
            return []
        found: dict[str, bytes] = {}
        with self._translate("read"):
            conn = self._reader()
            # Chunked to stay under SQLite's bound-parameter limit.
            for start in range(0, len(keys), 500):
                chunk = list(keys[start : start + 500])
                marks = ",".join("?" * len(chunk))
                rows = conn.execute(
                    f"SELECT key, value FROM kv WHERE space = ? AND key IN ({marks})",  # noqa: S608
                    [space, *chunk],
                ).fetchall()
                found.update((k, bytes(v)) for k, v in rows)
        return [found.get(k) for k in keys]

    def scan(
        self,
        space: str,
        *,
        prefix: str = "",
        start_after: str | None = None,
        limit: int | None = None,
        reverse: bool = False,
    ) -> list[tuple[str, bytes]]:
        """See :meth:`KVStore.scan`."""
        sql = ["SELECT key, value FROM kv WHERE space = ?"]
        args: list[object] = [space]
        if prefix:
            sql.append("AND key >= ?")
            args.append(prefix)
            upper = prefix_upper_bound(prefix)
            if upper is not None:
                sql.append("AND key < ?")
                args.append(upper)
        if start_after is not None:
            sql.append("AND key < ?" if reverse else "AND key > ?")
            args.append(start_after)
        sql.append("ORDER BY key DESC" if reverse else "ORDER BY key")
        if limit is not None:
            sql.append("LIMIT ?")
            args.append(max(limit, 0))
        with self._translate("scan"):
            rows = self._reader().execute(" ".join(sql), args).fetchall()
        return [(k, bytes(v)) for k, v in rows]

    def commit(self, writes: Sequence[Write], checks: Sequence[Check] = ()) -> None:
        """See :meth:`KVStore.commit`."""
        check_writes(writes, self.max_value_bytes)
        if not writes and not checks:
            return
        with self._write_lock, self._translate("commit"):
            if self._closed:
                raise BackendUnavailableError("the SQLite store is closed")
            conn = self._writer
            conn.execute("BEGIN IMMEDIATE")
            try:
                for check in checks:
                    row = conn.execute(
                        "SELECT value FROM kv WHERE space = ? AND key = ?", (check.space, check.key)
                    ).fetchone()
                    actual = None if row is None else bytes(row[0])
                    if actual != check.expected:
                        raise ConflictError(
                            f"check failed on {check.space!r}/{check.key!r}: the value changed"
                        )
                for write in writes:
                    if isinstance(write, Put):
                        conn.execute(
                            "INSERT INTO kv (space, key, value) VALUES (?, ?, ?) "
                            "ON CONFLICT (space, key) DO UPDATE SET value = excluded.value",
                            (write.space, write.key, write.value),
                        )
                    elif isinstance(write, Delete):
                        conn.execute(
                            "DELETE FROM kv WHERE space = ? AND key = ?", (write.space, write.key)
                        )
                    elif isinstance(write, DeleteSpace):
                        conn.execute("DELETE FROM kv WHERE space = ?", (write.space,))
                conn.execute("COMMIT")
            except BaseException:
                conn.execute("ROLLBACK")
                raise

    def ping(self) -> None:
        """See :meth:`KVStore.ping`."""
        with self._translate("ping"):
            self._reader().execute("SELECT 1").fetchone()

    def close(self) -> None:
        """See :meth:`KVStore.close`."""
        if self._closed:
            return
        self._closed = True
        with self._write_lock:
            self._writer.close()
        with self._readers_lock:
            for conn in self._readers:
                conn.close()
            self._readers.clear()
