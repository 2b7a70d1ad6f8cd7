"""The connections of one :class:`~tiers.backends.sqlite_kv.SqliteKVStore`.

Reads use a connection per thread, which WAL lets run beside the writer. A
reader connection is closed when its thread has ended (noticed when another
thread opens one) or when the store is. Every use of a connection is
serialised by a lock, so connections are opened with ``check_same_thread=False``.

Writers of one file in several processes queue on :class:`WriteLock` (an OS
lock on a side file) before they ask SQLite for its write lock: SQLite's own
busy handler polls, sleeping 1, 2, 5, 10 ... up to 100 ms between tries, so a
writer that lost a race waited tens of milliseconds after the lock was free.
"""

from __future__ import annotations

import fcntl
import os
import sqlite3
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from tiers.errors import BackendUnavailableError, StoreClosedError

BUSY_TIMEOUT_S = 30.0
# How much of the database file a reader maps into memory: none. Mapped (1 GiB), a 100-step
# history of 5 KB checkpoints scanned in half the SQLite CPU (~0.2 ms of a 2-3 ms history),
# but a read of a mapped page the file no longer has (another process truncated it) or
# cannot give (an I/O error) is a SIGBUS that kills the whole process, where a read through
# the page cache raises BackendUnavailableError. Set explicitly so no build default maps it.
READ_MMAP_BYTES = 0


class Reader:
    """One thread's read connection; ``lock`` lets the store's ``close`` wait for it."""

    __slots__ = ("conn", "lock", "thread")

    def __init__(self, conn: sqlite3.Connection, thread: threading.Thread) -> None:
        self.conn = conn
        self.lock = threading.Lock()
        self.thread = thread


class SqliteConnections:
    """Opens the connections to one SQLite file, keeps one reader per thread, and knows
    whether the store is closed.

    Args:
        path: The database file.
    """

    def __init__(self, path: Path) -> None:
        self.path = path
        # Each thread's Reader, as attribute ``reader``.
        self.local = threading.local()
        self._readers: list[Reader] = []
        # Guards _readers and closed, so no reader is registered after close().
        self._readers_lock = threading.Lock()
        self.closed = False

    def connect(self) -> sqlite3.Connection:
        """A new connection in autocommit mode (transactions are begun explicitly)."""
        # check_same_thread=False: close() and the dead-thread sweep close
        # connections from another thread; every use is serialised by a lock.
        return sqlite3.connect(
            self.path, timeout=BUSY_TIMEOUT_S, isolation_level=None, check_same_thread=False
        )

    def ensure_open(self) -> None:
        """Raise :meth:`closed_error` if the store is closed."""
        if self.closed:
            raise self.closed_error()

    def closed_error(self) -> StoreClosedError:
        """The error every method raises once the store is closed."""
        return StoreClosedError(
            f"the SQLite store at {self.path} is closed; open it again (Memory.open, or a new "
            "SqliteKVStore)"
        )

    def thread_reader(self) -> Reader:
        """This thread's read connection, opened on first use."""
        reader: Reader | None = getattr(self.local, "reader", None)
        if reader is not None:
            return reader
        with self._readers_lock:
            if self.closed:
                raise self.closed_error()
            # Connections of ended threads are unreachable (their thread-local
            # is gone): close them here, or a pool whose idle threads expire
            # would leak a file descriptor per thread.
            alive: list[Reader] = []
            for other in self._readers:
                if other.thread.is_alive():
                    alive.append(other)
                else:
                    other.conn.close()
            conn = self.connect()
            conn.execute("PRAGMA query_only=ON")
            conn.execute(f"PRAGMA mmap_size={READ_MMAP_BYTES}")
            reader = Reader(conn, threading.current_thread())
            alive.append(reader)
            self._readers = alive
        self.local.reader = reader
        return reader

    @contextmanager
    def reading(self, what: str) -> Iterator[sqlite3.Connection]:
        """This thread's read connection, held; SQLite errors become ``BackendUnavailableError``."""
        with self.translate(what):
            reader = self.thread_reader()
            with reader.lock:
                # close() may have run since this thread last read.
                if self.closed:
                    raise self.closed_error()
                yield reader.conn

    @contextmanager
    def translate(self, what: str) -> Iterator[None]:
        """Raise a SQLite error as :class:`BackendUnavailableError` naming ``what`` failed."""
        try:
            yield
        except sqlite3.Error as exc:
            raise BackendUnavailableError(f"SQLite {what} failed on {self.path}: {exc}") from exc

    def mark_closed(self) -> list[Reader] | None:
        """Mark the store closed; the readers to close, or ``None`` if it was closed already."""
        with self._readers_lock:
            if self.closed:
                return None
            self.closed = True
            readers, self._readers = self._readers, []
        return readers


class WriteLock:
    """An exclusive ``flock`` on ``<database>-writelock``, taken around each write transaction.

    A waiter sleeps in the kernel and wakes as soon as the holder releases, so
    two processes writing one file take turns without polling. The lock
    belongs to the open file, so the OS drops it when its holder dies (SIGKILL
    included). It only orders tiermem's writers: SQLite's own lock still
    guards the file against everything else, so a writer that does not take
    this lock is safe too, it is only served by SQLite's polling.

    Args:
        database: The database file; the lock file is created beside it.

    Raises:
        OSError: The lock file cannot be opened or created.
    """

    def __init__(self, database: Path) -> None:
        self.path = database.with_name(database.name + "-writelock")
        # Read-only is enough for flock; the file holds no data.
        self._fd = os.open(self.path, os.O_RDONLY | os.O_CREAT, 0o644)

    def acquire(self) -> None:
        """Block until this store holds the lock (the GIL is released while waiting)."""
        fcntl.flock(self._fd, fcntl.LOCK_EX)

    def release(self) -> None:
        """Let the next writer in."""
        fcntl.flock(self._fd, fcntl.LOCK_UN)

    def close(self) -> None:
        """Close the lock file (which releases the lock if held)."""
        os.close(self._fd)


def close_readers(readers: list[Reader]) -> None:
    """Close ``readers``, each once a read in progress on it has finished."""
    for reader in readers:
        with reader.lock:
            reader.conn.close()


def enable_wal(conn: sqlite3.Connection) -> None:
    """Switch the file to WAL, waiting (up to the busy timeout) for other processes opening it.

    Changing the journal mode of a new file needs an exclusive lock, and SQLite
    answers SQLITE_BUSY at once instead of calling the busy handler: processes
    opening one new file together would fail without this retry.
    """
    deadline = time.monotonic() + BUSY_TIMEOUT_S
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


def end_transaction(conn: sqlite3.Connection, how: str) -> None:
    """End the open transaction, if any, without masking the error being raised."""
    if not conn.in_transaction:
        return
    try:
        conn.execute(how)
    except sqlite3.Error:
        # The connection is broken; the error that brought us here says more.
        if how != "ROLLBACK":
            raise
