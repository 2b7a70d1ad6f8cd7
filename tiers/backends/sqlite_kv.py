"""SQLite implementation of :class:`~tiers.backends.base.KVStore` (the embedded default).

One table ``kv(space, key, value)`` (rowid rows, unique on space and key); WAL journal with ``synchronous=FULL`` so a
commit is fsync'd before it is acknowledged. Writes go through one connection
under a lock (SQLite has one writer anyway); reads use a connection per thread,
which WAL lets run beside the writer. A reader connection is closed when its
thread has ended (noticed when another thread opens one) or when the store is.
Deleting zeroes the deleted rows in the file (``secure_delete``), and
:meth:`SqliteKVStore.scrub` truncates the WAL, so erased data leaves the disk.

**Group commit.** Concurrent :meth:`SqliteKVStore.commit` calls share fsyncs:
one caller at a time applies every queued transaction in one SQLite
transaction, and a failed check drops only its own commit (the details are in
:mod:`tiers.backends._sqlite_group_commit`; the connections are in
:mod:`tiers.backends._sqlite_connections`). :attr:`SqliteKVStore.group_commit_stats`
says how many commits shared each fsync. Writers in several processes on one
file take turns on an OS lock on ``<file>-writelock`` (a waiter wakes when the
lock is free instead of polling SQLite's lock with growing sleeps).

**Bounded durability** (``durable=False``): ``synchronous=NORMAL`` acknowledges a
commit once it is written to the WAL, before the WAL is fsync'd (SQLite syncs
the WAL only at checkpoints), so a power cut may lose the last commits; a
process crash loses none (the data is in the OS page cache). :meth:`flush`
makes every commit acknowledged before it durable by fsyncing the WAL file,
the cheap way the SQLite developers describe for WAL mode (a PASSIVE
checkpoint is not enough: it may stop early beside readers and writers). With
``flush_interval`` a background thread flushes at that period, so an
acknowledged commit is durable within about ``flush_interval`` seconds.
"""

from __future__ import annotations

import os
import sqlite3
import threading
from collections.abc import Sequence
from contextlib import suppress
from pathlib import Path
from typing import Any

from tiers.backends._sqlite_connections import (
    BUSY_TIMEOUT_S,
    SqliteConnections,
    WriteLock,
    close_readers,
    enable_wal,
    end_transaction,
)
from tiers.backends._sqlite_group_commit import GroupCommitStats, GroupCommitWriter
from tiers.backends.base import DEFAULT_MAX_VALUE_BYTES, Check, Write
from tiers.backends.common import (
    check_checks,
    check_reads,
    check_scan,
    check_writes,
    prefix_upper_bound,
)
from tiers.errors import BackendUnavailableError, InvalidInputError

# Ordered schema migrations, each one or more statements run in one transaction:
# the list index + 1 is the schema version (PRAGMA user_version).
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        """
        CREATE TABLE IF NOT EXISTS kv (
            space TEXT NOT NULL,
            key   TEXT NOT NULL,
            value BLOB NOT NULL,
            PRIMARY KEY (space, key)
        ) WITHOUT ROWID
        """,
    ),
    # Rows in a rowid table, found through a (space, key) index. In the clustered
    # WITHOUT ROWID table a checkpoint's four rows (checkpoint, index entry, event,
    # head) land in four regions of one B-tree of ~600-byte rows, so leaves split and
    # rebalance often: 8.5 WAL pages per commit. Here the rows append to the table
    # and only small index entries scatter: 5.9 pages, and 1.24x the durable commits
    # per second on this disk (measured with raw SQLite, fsync on).
    (
        """
        CREATE TABLE kv_rows (
            space TEXT NOT NULL,
            key   TEXT NOT NULL,
            value BLOB NOT NULL,
            UNIQUE (space, key)
        )
        """,
        "INSERT INTO kv_rows (space, key, value) SELECT space, key, value FROM kv",
        "DROP TABLE kv",
        "ALTER TABLE kv_rows RENAME TO kv",
    ),
)

# Longest scrub() waits for readers of other processes before giving up (commits wait too).
_SCRUB_BUSY_MS = 2000
_GET_ONE = "SELECT value FROM kv WHERE space = ? AND key = ?"
# Keys per statement in get_many, under SQLite's bound-parameter limit.
_CHUNK = 500


class SqliteKVStore:
    """A :class:`KVStore` in one SQLite file.

    Args:
        path: Database file; its parent directory is created if missing.
        max_value_bytes: Largest value accepted by :meth:`commit`.
        durable: ``True`` (default) fsyncs every commit (``synchronous=FULL``);
            ``False`` uses ``synchronous=NORMAL``: a commit is acknowledged
            before it is fsync'd, so a power cut may lose the last commits (a
            process crash loses nothing) until :meth:`flush` or a checkpoint.
        flush_interval: With ``durable=False``, seconds between background
            :meth:`flush` calls: the bound on how long an acknowledged commit
            may stay at risk of a power cut. ``None`` (default): no background
            flush.

    Raises:
        InvalidInputError: ``flush_interval`` is not a number > 0, or is given
            with ``durable=True`` (every commit is durable already).
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
        flush_interval: float | None = None,
    ) -> None:
        if flush_interval is not None:
            if (
                isinstance(flush_interval, bool)
                or not isinstance(flush_interval, int | float)
                or not flush_interval > 0
            ):
                raise InvalidInputError(
                    "flush_interval must be a number of seconds > 0", field="flush_interval"
                )
            if durable:
                raise InvalidInputError(
                    "flush_interval needs durable=False: with durable=True every commit is "
                    "fsync'd before it is acknowledged",
                    field="flush_interval",
                )
        self.path = Path(path)
        self.max_value_bytes = max_value_bytes
        self.durable = durable
        self.flush_interval = None if flush_interval is None else float(flush_interval)
        self._synchronous = "FULL" if durable else "NORMAL"
        self._connections = SqliteConnections(self.path)
        # How many acknowledged commits are known durable; _flush_lock serialises flushes.
        self._flushed = 0
        self._flush_lock = threading.Lock()
        self._stop_flusher = threading.Event()
        self._flusher: threading.Thread | None = None
        writer: sqlite3.Connection | None = None
        write_lock: WriteLock | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            writer = self._connections.connect()
            enable_wal(writer)
            writer.execute(f"PRAGMA synchronous={self._synchronous}")
            # Deleted rows and freed pages are overwritten with zeros, not left in the file.
            writer.execute("PRAGMA secure_delete=ON")
            # Created once the file is known to be a SQLite database in WAL mode.
            write_lock = WriteLock(self.path)
            write_lock.acquire()
            try:
                _migrate(writer, self.path)
            finally:
                write_lock.release()
        except BaseException as exc:
            if writer is not None:
                writer.close()
            if write_lock is not None:
                write_lock.close()
            if isinstance(exc, sqlite3.Error | OSError):
                raise BackendUnavailableError(
                    f"cannot open SQLite store at {self.path}: {exc}"
                ) from exc
            raise
        # The write connection (the pragma tests read it) and the group commit around it.
        self._writer = writer
        self._group = GroupCommitWriter(writer, self._connections, write_lock)
        if self.flush_interval is not None:
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"tiermem-flush-{self.path.name}", daemon=True
            )
            self._flusher.start()

    @property
    def schema_version(self) -> int:
        """The schema version of the open database."""
        with self._connections.reading("schema read") as conn:
            (version,) = conn.execute("PRAGMA user_version").fetchone()
        return int(version)

    def get_many(self, space: str, keys: Sequence[str]) -> list[bytes | None]:
        """See :meth:`KVStore.get_many`."""
        check_reads(space, keys)
        if len(keys) == 1:
            # The hot path (a run's head, once per step).
            rows = self._fetch(_GET_ONE, (space, keys[0]), "read")
            return [rows[0][0] if rows else None]
        if not keys:
            self._connections.ensure_open()
            return []
        found: dict[str, bytes] = {}
        with self._connections.reading("read") as conn:
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
                    found.update(rows)
            finally:
                if chunked:
                    end_transaction(conn, "COMMIT")
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
        check_scan(space, prefix, start_after)
        if limit is not None and limit <= 0:
            self._connections.ensure_open()
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
        return self._fetch(" ".join(sql), args, "scan")

    def _fetch(self, sql: str, args: Sequence[object], what: str) -> list[Any]:
        """The rows of one read statement on this thread's reader, as ``sqlite3`` returns them.

        The hot path of reads (a run's head once per step, a history, the
        latest checkpoint): one prepared statement, no generator-based context
        managers around it. Rows are tuples and a value is ``bytes`` already
        (``sqlite3`` returns a BLOB as bytes, and :meth:`commit` writes only
        bytes), so they are returned as they come, not copied into new tuples.
        """
        try:
            reader = self._connections.local.reader
        except AttributeError:
            with self._connections.translate(what):
                reader = self._connections.thread_reader()
        with reader.lock:
            if self._connections.closed:
                raise self._connections.closed_error()
            try:
                rows: list[Any] = reader.conn.execute(sql, args).fetchall()
            except sqlite3.Error as exc:
                raise BackendUnavailableError(
                    f"SQLite {what} failed on {self.path}: {exc}"
                ) from exc
        return rows

    def spaces(self, *, limit: int | None = None) -> list[str]:
        """See :meth:`~tiers.backends.base.ListsSpaces.spaces` (read off the (space, key) index)."""
        sql = "SELECT DISTINCT space FROM kv ORDER BY space"
        args: list[object] = []
        if limit is not None:
            sql += " LIMIT ?"
            args.append(max(limit, 0))
        with self._connections.reading("space listing") as conn:
            rows = conn.execute(sql, args).fetchall()
        return [space for (space,) in rows]

    def commit(self, writes: Sequence[Write], checks: Sequence[Check] = ()) -> None:
        """See :meth:`KVStore.commit`."""
        check_writes(writes, self.max_value_bytes)
        check_checks(checks)
        if not writes and not checks:
            self._connections.ensure_open()
            return
        self._group.commit(writes, checks)

    def flush(self) -> None:
        """Block until every commit acknowledged before this call is durable (survives a power cut).

        With ``durable=True`` every commit already is, and this returns at
        once. Otherwise it fsyncs the WAL file once for every commit
        acknowledged so far (concurrent callers share the fsync).

        Raises:
            BackendUnavailableError: The store is closed, or the fsync failed
                (then nothing is known to be durable beyond the last flush).
        """
        self._connections.ensure_open()
        self._flush()

    def _flush(self) -> None:
        target = self._group.acked
        if self.durable or self._flushed >= target:
            return
        with self._flush_lock:
            if self._flushed >= target:
                return
            # Read again under the lock: everything acknowledged by now is covered.
            target = self._group.acked
            wal = self.path.with_name(self.path.name + "-wal")
            try:
                fd = os.open(wal, os.O_RDONLY)
            except FileNotFoundError:
                # No WAL: every commit was checkpointed into the database file,
                # which a checkpoint fsyncs.
                self._flushed = target
                return
            except OSError as exc:
                raise BackendUnavailableError(f"cannot open {wal} to flush it: {exc}") from exc
            try:
                os.fsync(fd)
            except OSError as exc:
                raise BackendUnavailableError(f"fsync of {wal} failed: {exc}") from exc
            finally:
                os.close(fd)
            self._flushed = target

    @property
    def group_commit_stats(self) -> GroupCommitStats:
        """Commits acknowledged and transactions committed since the store was opened.

        With ``durable=True`` each transaction is one fsync, so
        ``commits / batches`` says how many concurrent commits shared one.
        """
        return self._group.stats

    @property
    def unflushed(self) -> int:
        """How many acknowledged commits are not known to be durable yet (0 with ``durable=True``)."""
        return 0 if self.durable else self._group.acked - self._flushed

    def _flush_loop(self) -> None:
        interval = self.flush_interval or 0.0
        while not self._stop_flusher.wait(interval):
            try:
                self.flush()
            except BackendUnavailableError:
                if self._connections.closed:
                    return
                # A failed fsync is retried next period; flush() callers see it too.

    def volatility(self) -> str | None:
        """Why an acknowledged commit could be lost, or ``None`` if each is fsync'd first."""
        if self.durable:
            return None
        when = (
            f"within {self.flush_interval:g} s"
            if self.flush_interval is not None
            else "only at WAL checkpoints"
        )
        return (
            "SQLite runs with durable=false (synchronous=NORMAL): a commit is acknowledged "
            f"before it is fsync'd (made durable {when}), so a power cut or OS crash can lose "
            "the last acknowledged commits"
        )

    def scrub(self) -> bool:
        """Drop deleted data from the database's files now (see ``Scrubbable``).

        The writer runs with ``secure_delete``: a deleted row is zeroed in
        its page, and a freed page is zeroed, as part of the delete. Older
        copies of those pages can still sit in the WAL file until SQLite
        writes over them; this checkpoints the WAL into the database and
        truncates it to zero bytes. Commits wait meanwhile.

        Returns:
            False if a reader (another process) kept the checkpoint from
            finishing within :data:`_SCRUB_BUSY_MS`.

        Raises:
            BackendUnavailableError: The store is closed or the checkpoint failed.
        """
        self._connections.ensure_open()
        with self._group.lock:
            if self._connections.closed:
                raise self._connections.closed_error()
            conn = self._writer
            # The checkpoint takes SQLite's write lock: queue behind other processes' writers.
            self._group.write_lock.acquire()
            try:
                conn.execute(f"PRAGMA busy_timeout={_SCRUB_BUSY_MS}")
                try:
                    (busy, _, _) = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                finally:
                    conn.execute(f"PRAGMA busy_timeout={int(BUSY_TIMEOUT_S * 1000)}")
            except sqlite3.Error as exc:
                raise BackendUnavailableError(
                    f"SQLite checkpoint failed on {self.path}: {exc}"
                ) from exc
            finally:
                self._group.write_lock.release()
        return int(busy) == 0

    def ping(self) -> None:
        """See :meth:`KVStore.ping`."""
        with self._connections.reading("ping") as conn:
            conn.execute("SELECT 1").fetchone()

    def close(self) -> None:
        """See :meth:`KVStore.close`.

        Waits for a commit or read in progress in another thread; after it, every
        method raises :class:`BackendUnavailableError`.
        """
        readers = self._connections.mark_closed()
        if readers is None:
            return
        self._stop_flusher.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join()
        with self._group.lock:
            # A last flush, so a clean close leaves every acknowledged commit durable;
            # if it fails, the commits stay in the WAL for the next open.
            with suppress(BackendUnavailableError):
                self._flush()
            self._writer.close()
            self._group.write_lock.close()
        close_readers(readers)


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
            for statement in MIGRATIONS[index]:
                conn.execute(statement)
        if version != len(MIGRATIONS):
            conn.execute(f"PRAGMA user_version={len(MIGRATIONS)}")
        conn.execute("COMMIT")
    except BaseException:
        end_transaction(conn, "ROLLBACK")
        raise
