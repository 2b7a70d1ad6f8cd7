"""SQLite implementation of :class:`~tiers.backends.base.KVStore` (the embedded default).

One table ``kv(space, key, value)`` (rowid rows, unique on space and key); WAL journal with ``synchronous=FULL`` so a
commit is fsync'd before it is acknowledged. Writes go through one connection
under a lock (SQLite has one writer anyway); reads use a connection per thread,
which WAL lets run beside the writer. A reader connection is closed when its
thread has ended (noticed when another thread opens one) or when the store is.
Deleting zeroes the deleted rows in the file (``secure_delete``), and
:meth:`SqliteKVStore.scrub` truncates the WAL, so erased data leaves the disk.

**Group commit.** Concurrent :meth:`SqliteKVStore.commit` calls share fsyncs: a
caller queues its transaction, and one caller at a time (the leader) applies
every queued transaction in one SQLite transaction and commits once. Each
queued commit's checks are evaluated in order against the database plus the
writes of the commits before it in the batch, so a failed check drops only its
own commit (a batch with a ``DeleteSpace`` uses a savepoint per commit
instead). Each caller returns only after the fsync that made its transaction
durable; serial callers see no difference. When the last batches had several
callers, a leader waits briefly (at most one commit's duration, capped at
:data:`_MAX_GATHER_S`) for the callers of the last batch to queue again:
otherwise the first caller back after an fsync commits alone and batches
alternate between one caller and all the others.

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
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager, suppress
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
from tiers.errors import BackendUnavailableError, ConflictError, InvalidInputError

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

_BUSY_TIMEOUT_S = 30.0
# Longest scrub() waits for readers of other processes before giving up (commits wait too).
_SCRUB_BUSY_MS = 2000
_GET_ONE = "SELECT value FROM kv WHERE space = ? AND key = ?"
# Longest a group-commit leader waits for the callers of the last batches.
_MAX_GATHER_S = 0.002
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
        self._write_lock = threading.Lock()
        # Commits waiting for the writer, and whether a caller is committing a
        # batch now (the leader); all guarded by the lock of _queue_cond, which
        # _gather_cond shares (a gathering leader waits on it for arrivals).
        self._queue: list[_Pending] = []
        self._leading = False
        self._gathering = False
        queue_lock = threading.Lock()
        self._queue_cond = threading.Condition(queue_lock)
        self._gather_cond = threading.Condition(queue_lock)
        # Sizes of the last two batches and how long the last commit took.
        self._batch_sizes = (1, 1)
        self._commit_seconds = 0.0
        # Commits acknowledged (counted after COMMIT) and how many of them are
        # known durable; _flush_lock serialises flushes.
        self._acked = 0
        self._flushed = 0
        self._flush_lock = threading.Lock()
        self._stop_flusher = threading.Event()
        self._flusher: threading.Thread | None = None
        self._local = threading.local()
        self._readers: list[_Reader] = []
        # Guards _readers and _closed, so no reader is registered after close().
        self._readers_lock = threading.Lock()
        self._closed = False
        writer: sqlite3.Connection | None = None
        try:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            writer = self._connect()
            _enable_wal(writer)
            writer.execute(f"PRAGMA synchronous={self._synchronous}")
            # Deleted rows and freed pages are overwritten with zeros, not left in the file.
            writer.execute("PRAGMA secure_delete=ON")
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
        if self.flush_interval is not None:
            self._flusher = threading.Thread(
                target=self._flush_loop, name=f"tiermem-flush-{self.path.name}", daemon=True
            )
            self._flusher.start()

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
        if len(keys) == 1:
            # The hot path (a run's head, once per step): one prepared
            # statement, no generator-based context managers.
            try:
                reader = self._local.reader
            except AttributeError:
                with self._translate("read"):
                    reader = self._thread_reader()
            with reader.lock:
                if self._closed:
                    raise self._closed_error()
                try:
                    row = reader.conn.execute(_GET_ONE, (space, keys[0])).fetchone()
                except sqlite3.Error as exc:
                    raise BackendUnavailableError(
                        f"SQLite read failed on {self.path}: {exc}"
                    ) from exc
            return [None if row is None else bytes(row[0])]
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

    def spaces(self, *, limit: int | None = None) -> list[str]:
        """See :meth:`~tiers.backends.base.ListsSpaces.spaces` (read off the (space, key) index)."""
        sql = "SELECT DISTINCT space FROM kv ORDER BY space"
        args: list[object] = []
        if limit is not None:
            sql += " LIMIT ?"
            args.append(max(limit, 0))
        with self._reading("space listing") as conn:
            rows = conn.execute(sql, args).fetchall()
        return [space for (space,) in rows]

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
            if self._gathering:
                self._gather_cond.notify()
            # Wait while another caller (the leader) commits; it may take this one along.
            while not pending.done and self._leading:
                self._queue_cond.wait()
            if not pending.done:
                self._leading = True
                self._gather()
                batch, self._queue = self._queue, []
        if not pending.done:
            try:
                with self._write_lock:
                    began = time.perf_counter()
                    self._commit_batch(batch, pending)
                    self._commit_seconds = time.perf_counter() - began
            finally:
                with self._queue_cond:
                    self._batch_sizes = (self._batch_sizes[1], len(batch))
                    self._leading = False
                    self._queue_cond.notify_all()
        if pending.error is not None:
            raise pending.error

    def _gather(self) -> None:
        """As the new leader, wait briefly for the callers of the last batches (lock held).

        Callers acknowledged by the last fsync come back one by one (each runs
        its own code first); committing at once would send the first of them
        alone. Waiting costs at most about one commit's duration, and only
        when recent batches had several callers, so a lone writer never waits.
        """
        expect = max(self._batch_sizes)
        if expect <= 1 or len(self._queue) >= expect:
            return
        deadline = time.monotonic() + min(_MAX_GATHER_S, self._commit_seconds)
        self._gathering = True
        try:
            while len(self._queue) < expect:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._gather_cond.wait(left)
        finally:
            self._gathering = False

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
            try:
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
                    elif any(isinstance(w, DeleteSpace) for p in batch for w in p.writes):
                        _apply_with_savepoints(conn, batch)
                    else:
                        _apply_merged(conn, batch)
                    conn.execute("COMMIT")
                except BaseException:
                    _end_transaction(conn, "ROLLBACK")
                    raise
            except sqlite3.Error as exc:
                raise BackendUnavailableError(
                    f"SQLite commit failed on {self.path}: {exc}"
                ) from exc
            self._acked += sum(1 for p in batch if p.error is None)
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

    def flush(self) -> None:
        """Block until every commit acknowledged before this call is durable (survives a power cut).

        With ``durable=True`` every commit already is, and this returns at
        once. Otherwise it fsyncs the WAL file once for every commit
        acknowledged so far (concurrent callers share the fsync).

        Raises:
            BackendUnavailableError: The store is closed, or the fsync failed
                (then nothing is known to be durable beyond the last flush).
        """
        self._ensure_open()
        self._flush()

    def _flush(self) -> None:
        target = self._acked
        if self.durable or self._flushed >= target:
            return
        with self._flush_lock:
            if self._flushed >= target:
                return
            # Read again under the lock: everything acknowledged by now is covered.
            target = self._acked
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
    def unflushed(self) -> int:
        """How many acknowledged commits are not known to be durable yet (0 with ``durable=True``)."""
        return 0 if self.durable else self._acked - self._flushed

    def _flush_loop(self) -> None:
        interval = self.flush_interval or 0.0
        while not self._stop_flusher.wait(interval):
            try:
                self.flush()
            except BackendUnavailableError:
                if self._closed:
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
        self._ensure_open()
        with self._write_lock:
            if self._closed:
                raise self._closed_error()
            conn = self._writer
            try:
                conn.execute(f"PRAGMA busy_timeout={_SCRUB_BUSY_MS}")
                try:
                    (busy, _, _) = conn.execute("PRAGMA wal_checkpoint(TRUNCATE)").fetchone()
                finally:
                    conn.execute(f"PRAGMA busy_timeout={int(_BUSY_TIMEOUT_S * 1000)}")
            except sqlite3.Error as exc:
                raise BackendUnavailableError(
                    f"SQLite checkpoint failed on {self.path}: {exc}"
                ) from exc
        return int(busy) == 0

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
        self._stop_flusher.set()
        if self._flusher is not None and self._flusher is not threading.current_thread():
            self._flusher.join()
        with self._write_lock:
            # A last flush, so a clean close leaves every acknowledged commit durable;
            # if it fails, the commits stay in the WAL for the next open.
            with suppress(BackendUnavailableError):
                self._flush()
            self._writer.close()
        for reader in readers:
            with reader.lock:
                reader.conn.close()


def _apply_with_savepoints(conn: sqlite3.Connection, batch: list[_Pending]) -> None:
    """Apply each queued commit in its own savepoint: a failed check undoes only its writes."""
    for pending in batch:
        conn.execute("SAVEPOINT one")
        try:
            _apply(conn, pending.writes, pending.checks)
        except ConflictError as exc:
            conn.execute("ROLLBACK TO one")
            pending.error = exc
        conn.execute("RELEASE one")


_ABSENT = object()


def _apply_merged(conn: sqlite3.Connection, batch: list[_Pending]) -> None:
    """Apply queued commits (no ``DeleteSpace``) with one read and as few writes as fit.

    Every check of the batch is read in one pass; each commit's checks are then
    evaluated in order against those values overlaid with the writes of the
    commits accepted before it, exactly what a savepoint per commit would see.
    A commit whose check fails gets a :class:`ConflictError` and writes nothing.
    """
    wanted = list({(c.space, c.key): None for p in batch for c in p.checks})
    stored: dict[tuple[str, str], bytes] = {}
    for start in range(0, len(wanted), _CHECKS_PER_STATEMENT):
        chunk = wanted[start : start + _CHECKS_PER_STATEMENT]
        where = " OR ".join(["(space = ? AND key = ?)"] * len(chunk))
        args: list[object] = []
        for space, key in chunk:
            args += [space, key]
        stored.update(
            ((space, key), bytes(value))
            for space, key, value in conn.execute(
                f"SELECT space, key, value FROM kv WHERE {where}",  # noqa: S608
                args,
            )
        )
    overlay: dict[tuple[str, str], bytes | None] = {}
    accepted: list[Write] = []
    for pending in batch:
        failed: Check | None = None
        for check in pending.checks:
            address = (check.space, check.key)
            current = overlay.get(address, _ABSENT)
            if current is _ABSENT:
                current = stored.get(address)
            if current != check.expected:
                failed = check
                break
        if failed is not None:
            pending.error = _conflict(failed)
            continue
        for write in pending.writes:
            if isinstance(write, Put):
                overlay[(write.space, write.key)] = write.value
            elif isinstance(write, Delete):
                overlay[(write.space, write.key)] = None
        accepted.extend(pending.writes)
    _apply(conn, accepted, ())


def _conflict(check: Check) -> ConflictError:
    return ConflictError(
        f"check failed on {check.space!r}/{check.key!r}: the value changed; re-read and retry"
    )


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
                raise _conflict(check)
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


def _enable_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL, waiting (up to the busy timeout) for other processes opening it.

    Changing the journal mode of a new file needs an exclusive lock, and SQLite
    answers SQLITE_BUSY at once instead of calling the busy handler: processes
    opening one new file together would fail without this retry.
    """
    deadline = time.monotonic() + _BUSY_TIMEOUT_S
    delay = 0.001
    while True:
        try:
            conn.execute("PRAGMA journal_mode=WAL")
            return
        except sqlite3.OperationalError as exc:
            if exc.sqlite_errorcode != sqlite3.SQLITE_BUSY or time.monotonic() >= deadline:
                raise
        time.sleep(delay)
        delay = min(delay * 2, 0.05)


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
