"""SQLite implementation of :class:`~tiers.backends.base.KVStore` (the embedded default).

One table ``kv(space, key, value)``; WAL journal with ``synchronous=FULL`` so a
commit is fsync'd before it is acknowledged. Writes go through one connection
under a lock (SQLite has one writer anyway); reads use a connection per thread,
which WAL lets run beside the writer. A reader connection is closed when its
thread has ended (noticed when another thread opens one) or when the store is.

**Group commit.** Concurrent :meth:`SqliteKVStore.commit` calls share fsyncs: a
caller queues its transaction, and whichever caller holds the writer lock
applies every queued transaction in one SQLite transaction (each inside its
own savepoint, so its checks see the ones before it and a failed check undoes
only its own writes) and commits once. Each caller returns only after the
fsync that made its transaction durable; serial callers see no difference.
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
from tiers.backends.common import (
    check_checks,
    check_reads,
    check_text,
    check_writes,
    prefix_upper_bound,
)
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
# Keys per statement in get_many, under SQLite's bound-parameter limit.
_CHUNK = 500
# Checks per SELECT and rows per INSERT of a commit (under the same limit).
_CHECKS_PER_STATEMENT = 100
_PUTS_PER_STATEMENT = 200


class _Reader:
    """One thread's read connection; ``lock`` lets :meth:`SqliteKVStore.close` wait for it."""

    __slots__ = ("conn", "lock", "thread")

    def __init__(self, conn: sqlite3.Connection, thread: threading.Thread) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.thread = thread


class _Pending:
    """One queued commit: its batch, and its outcome once a writer has applied it."""

    __slots__ = ("checks", "done", "error", "writes")

    def __init__(self, writes: Sequence[Write], checks: Sequence[Check]) -> None:
        self.writes = writes
        self.checks = checks
        self.done = False
        self.error: BaseException | None = None


class SqliteKVStore:
    """A :class:`KVStore` in one SQLite file.

    Args:
        path: Database file; its parent directory is created if missing.
        max_value_bytes: Largest value accepted by :meth:`commit`.
        durable: ``True`` (default) fsyncs every commit (``synchronous=FULL``);
            ``False`` uses ``synchronous=NORMAL``: a power cut may lose the last
            commits, a process crash loses nothing.

    Raises:
        BackendUnavailableError: The file cannot be opened or created, is not a
            SQLite database, or was written by a newer tiermem (its schema
            version is above ``len(MIGRATIONS)``).
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
        # Commits waiting for the writer, and whether a caller is committing a
        # batch now (the leader); both guarded by _queue_cond.
        self._queue: list[_Pending] = []
        self._leading = False
        self._queue_cond = threading.Condition(threading.Lock())
        self._local = threading.local()
        self._readers: list[_Reader] = []
        # Guards _readers and _closed, so no reader is registered after close().
        self._readers_lock = threading.Lock()
        self._closed = False
        writer: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            writer = self._connect()
            writer.execute("PRAGMA journal_mode=WAL")
            writer.execute(f"PRAGMA synchronous={self._synchronous}")
            _migrate(writer, self.path)
        except (sqlite3.Error, OSError) as exc:
            if writer is not None:
                writer.close()
            raise BackendUnavailableError(
                f"cannot open SQLite store at {self.path}: {exc}"
            ) from exc
        except BaseException:
            if writer is not None:
                writer.close()
            raise
        self._writer = writer

    def _connect(self) -> sqlite3.Connection:
        # check_same_thread=False: close() and the dead-thread sweep close
        # connections from another thread; every use is serialised by a lock.
        return sqlite3.connect(
            self.path, timeout=_BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )

    @property
    def schema_version(self) -> int:
        """The schema version of the open database."""
        with self._reading("schema read") as conn:
            (version,) = conn.execute("PRAGMA user_version").fetchone()
        return int(version)

    def _ensure_open(self) -> None:
        if self._closed:
            raise self._closed_error()

    def _closed_error(self) -> BackendUnavailableError:
        return BackendUnavailableError(
            f"the SQLite store at {self.path} is closed; open a new SqliteKVStore"
        )

    def _thread_reader(self) -> _Reader:
        reader: _Reader | None = getattr(self._local, "reader", None)
        if reader is not None:
            return reader
        with self._readers_lock:
            if self._closed:
                raise self._closed_error()
            # Connections of ended threads are unreachable (their thread-local
            # is gone): close them here, or a pool whose idle threads expire
            # would leak a file descriptor per thread.
            alive: list[_Reader] = []
            for other in self._readers:
                if other.thread.is_alive():
                    alive.append(other)
                else:
                    other.conn.close()
            conn = self._connect()
            conn.execute("PRAGMA query_only=ON")
            reader = _Reader(conn, threading.current_thread())
            alive.append(reader)
            self._readers = alive
        self._local.reader = reader
        return reader

    @contextmanager
    def _reading(self, what: str) -> Iterator[sqlite3.Connection]:
        with self._translate(what):
            reader = self._thread_reader()
            with reader.lock:
                # close() may have run since this thread last read.
                if self._closed:
                    raise self._closed_error()
                yield reader.conn

    @contextmanager
    def _translate(self, what: str) -> Iterator[None]:
        try:
            yield
        except sqlite3.Error as exc:
            raise BackendUnavailableError(f"SQLite {what} failed on {self.path}: {exc}") from exc

    def get_many(self, space: str, keys: Sequence[str]) -> list[bytes | None]:
        """See :meth:`KVStore.get_many`."""
        check_reads(space, keys)
        if not keys:
            self._ensure_open()
            return []
        found: dict[str, bytes] = {}
        with self._reading("read") as conn:
            chunked = len(keys) > _CHUNK
            if chunked:
                # One read transaction, so every chunk sees the same snapshot.
                conn.execute("BEGIN")
            try:
                for start in range(0, len(keys), _CHUNK):
                    chunk = list(keys[start : start + _CHUNK])
                    marks = ",".join("?" * len(chunk))
                    rows = conn.execute(
                        f"SELECT key, value FROM kv WHERE space = ? AND key IN ({marks})",  # noqa: S608
                        [space, *chunk],
                    ).fetchall()
                    found.update((k, bytes(v)) for k, v in rows)
            finally:
                if chunked:
                    _end_transaction(conn, "COMMIT")
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
        check_reads(space)
        check_text(prefix, "prefix")
        if start_after is not None:
            check_text(start_after, "start_after")
        if limit is not None and limit <= 0:
            self._ensure_open()
            return []
        # The column's BINARY collation compares the UTF-8 bytes: the protocol's order.
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
            args.append(limit)
        with self._reading("scan") as conn:
            rows = conn.execute(" ".join(sql), args).fetchall()
        return [(k, bytes(v)) for k, v in rows]

    def commit(self, writes: Sequence[Write], checks: Sequence[Check] = ()) -> None:
        """See :meth:`KVStore.commit`."""
        check_writes(writes, self.max_value_bytes)
        check_checks(checks)
        if not writes and not checks:
            self._ensure_open()
            return
        pending = _Pending(writes, checks)
        with self._queue_cond:
            self._queue.append(pending)
            # Wait while another caller (the leader) commits; it may take this one along.
            while not pending.done and self._leading:
                self._queue_cond.wait()
            if not pending.done:
                self._leading = True
                batch, self._queue = self._queue, []
        if not pending.done:
            try:
                with self._write_lock:
                    self._commit_batch(batch, pending)
            finally:
                with self._queue_cond:
                    self._leading = False
                    self._queue_cond.notify_all()
        if pending.error is not None:
            raise pending.error

    def _commit_batch(self, batch: list[_Pending], own: _Pending) -> None:
        """Apply queued commits in one transaction and one fsync; record each one's outcome.

        Raises:
            BaseException: What failed the whole batch (nothing of it was
                committed); the other callers of the batch get a
                :class:`BackendUnavailableError` naming it.
        """
        failure: BaseException | None = None
        try:
            if self._closed:
                raise self._closed_error()
            conn = self._writer
            with self._translate("commit"):
                # IMMEDIATE takes the write lock first, so the checks and the writes
                # see the same state even with other processes on the file.
                conn.execute("BEGIN IMMEDIATE")
                try:
                    if len(batch) == 1:
                        # Alone: a failed check rolls the whole transaction back.
                        try:
                            _apply(conn, batch[0].writes, batch[0].checks)
                        except ConflictError as exc:
                            batch[0].error = exc
                            conn.execute("ROLLBACK")
                            return
                    else:
                        for pending in batch:
                            conn.execute("SAVEPOINT one")
                            try:
                                _apply(conn, pending.writes, pending.checks)
                            except ConflictError as exc:
                                # Undo only this commit's writes; the batch goes on.
                                conn.execute("ROLLBACK TO one")
                                pending.error = exc
                            conn.execute("RELEASE one")
                    conn.execute("COMMIT")
                except BaseException:
                    _end_transaction(conn, "ROLLBACK")
                    raise
        except BaseException as exc:
            failure = exc
        finally:
            for pending in batch:
                if failure is not None and pending is not own:
                    error = BackendUnavailableError(
                        f"SQLite commit failed on {self.path} (in a group commit): {failure}"
                    )
                    error.__cause__ = failure
                    pending.error = error
                pending.done = True
        if failure is not None:
            raise failure

    def ping(self) -> None:
        """See :meth:`KVStore.ping`."""
        with self._reading("ping") as conn:
            conn.execute("SELECT 1").fetchone()

    def close(self) -> None:
        """See :meth:`KVStore.close`.

        Waits for a commit or read in progress in another thread; after it, every
        method raises :class:`BackendUnavailableError`.
        """
        with self._readers_lock:
            if self._closed:
                return
            self._closed = True
            readers, self._readers = self._readers, []
        with self._write_lock:
            self._writer.close()
        for reader in readers:
            with reader.lock:
                reader.conn.close()


def _apply(conn: sqlite3.Connection, writes: Sequence[Write], checks: Sequence[Check]) -> None:
    """Run one commit's checks, then its writes (the caller holds a transaction).

    Checks are read with one statement and runs of puts are written with one
    multi-row statement: on a busy machine each statement costs as much as the
    row it writes, so a checkpoint of 4 rows and 3 checks takes 2 statements, not 7.
    """
    for start in range(0, len(checks), _CHECKS_PER_STATEMENT):
        chunk = checks[start : start + _CHECKS_PER_STATEMENT]
        where = " OR ".join(["(space = ? AND key = ?)"] * len(chunk))
        args: list[object] = []
        for check in chunk:
            args += [check.space, check.key]
        found = {
            (space, key): bytes(value)
            for space, key, value in conn.execute(
                f"SELECT space, key, value FROM kv WHERE {where}",  # noqa: S608
                args,
            )
        }
        for check in chunk:
            if found.get((check.space, check.key)) != check.expected:
                raise ConflictError(
                    f"check failed on {check.space!r}/{check.key!r}: the value changed; "
                    "re-read and retry"
                )
    puts: list[Put] = []
    for write in writes:
        if isinstance(write, Put):
            puts.append(write)
            continue
        _put_rows(conn, puts)
        puts = []
        if isinstance(write, Delete):
            conn.execute("DELETE FROM kv WHERE space = ? AND key = ?", (write.space, write.key))
        elif isinstance(write, DeleteSpace):
            conn.execute("DELETE FROM kv WHERE space = ?", (write.space,))
    _put_rows(conn, puts)


def _put_rows(conn: sqlite3.Connection, puts: list[Put]) -> None:
    """Upsert ``puts`` in order (a later put of the same key wins), in as few statements as fit."""
    for start in range(0, len(puts), _PUTS_PER_STATEMENT):
        chunk = puts[start : start + _PUTS_PER_STATEMENT]
        args: list[object] = []
        for put in chunk:
            args += [put.space, put.key, put.value]
        rows = ",".join(["(?, ?, ?)"] * len(chunk))
        conn.execute(
            f"INSERT INTO kv (space, key, value) VALUES {rows} "  # noqa: S608
            "ON CONFLICT (space, key) DO UPDATE SET value = excluded.value",
            args,
        )


def _migrate(conn: sqlite3.Connection, path: Path) -> None:
    """Apply the migrations the database lacks, once each, in one transaction."""
    conn.execute("BEGIN IMMEDIATE")
    try:
        # Read under the write lock: another process may be migrating the same file.
        (version,) = conn.execute("PRAGMA user_version").fetchone()
        if version > len(MIGRATIONS):
            raise BackendUnavailableError(
                f"the SQLite store at {path} has schema version {version}, newer than the "
                f"{len(MIGRATIONS)} this tiermem knows: upgrade tiermem to open it"
            )
        for index in range(version, len(MIGRATIONS)):
            conn.execute(MIGRATIONS[index])
        if version != len(MIGRATIONS):
            conn.execute(f"PRAGMA user_version={len(MIGRATIONS)}")
        conn.execute("COMMIT")
    except BaseException:
        _end_transaction(conn, "ROLLBACK")
        raise


def _end_transaction(conn: sqlite3.Connection, how: str) -> None:
    """End the open transaction, if any, without masking the error being raised."""
    if not conn.in_transaction:
        return
    try:
        conn.execute(how)
    except sqlite3.Error:
        # The connection is broken; the error that brought us here says more.
        if how != "ROLLBACK":
            raise
