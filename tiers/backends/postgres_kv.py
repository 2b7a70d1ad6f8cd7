"""PostgreSQL implementation of :class:`~tiers.backends.base.KVStore`.

One table holds every space: ``(space bytea, key bytea, value bytea)`` with
primary key ``(space, key)``. Spaces and keys are stored as their UTF-8
bytes, so the index orders them byte-wise (the contract's key order, whatever
the database's collation) and a key may hold ``U+0000``, which a ``text``
column refuses.

The schema is created and upgraded on first use by an ordered list of
migrations (:data:`MIGRATIONS`; the index is the version, as in LangGraph's
checkpoint-postgres), applied under a transaction-level advisory lock so
stores opening together on a new database apply each migration once.

A commit is one call of a PL/pgSQL function the schema defines
(``<table>_commit``), sent as one statement with its arguments as arrays: one
round trip, and (autocommit) one transaction, so one WAL flush. The function
first takes transaction-level advisory locks: an exclusive one per key the
commit checks or writes, with a shared one on the key's space, and an
exclusive one per space it deletes whole; all in one global order (by lock
id, whatever the mode), so two commits cannot deadlock. Then it compares the
checked values byte for byte (returning the first failed check, having
written nothing) and applies the writes in order. The key lock, not
``SELECT ... FOR UPDATE``, is what makes a check of an *absent* key hold
until the commit ends: there is no row to lock, and two commits that both saw
the key absent must not both insert it. So commits that share a key (or
delete a space another one touches) run one at a time, and all others in
parallel, their WAL flushes grouped by the server. Reads are single
statements, so each sees one committed state (no half of a commit).

A commit is never re-sent after a lost connection: it may have been applied,
and a re-sent checked commit would then conflict with itself. Such a failure
is a :class:`BackendUnavailableError` (not acknowledged; the caller re-reads).

Durability is the server's: with ``fsync = on`` and ``synchronous_commit`` on
(or ``local``/``remote_write``/``remote_apply``), ``COMMIT`` returns only after
the commit's WAL record is flushed to disk. :meth:`PostgresKVStore.volatility`
reports any other configuration, which tiermem refuses unless the operator
opts in.
"""

from __future__ import annotations

import hashlib
import select
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager

from tiers.backends import MissingExtraError, redact_url
from tiers.backends.base import DEFAULT_MAX_VALUE_BYTES, Check, Delete, DeleteSpace, Put, Write
from tiers.backends.common import (
    check_checks,
    check_reads,
    check_scan,
    check_writes,
    prefix_upper_bound,
)
from tiers.errors import BackendUnavailableError, ConflictError, InvalidInputError, StoreClosedError

try:
    import psycopg
    from psycopg import sql
    from psycopg.conninfo import conninfo_to_dict
    from psycopg.rows import TupleRow
except ModuleNotFoundError as exc:
    raise MissingExtraError(
        "'psycopg' is not installed: the PostgreSQL KV store needs the 'postgres' extra, "
        "install it with: pip install 'tiermem[postgres]'"
    ) from exc

__all__ = ["MIGRATIONS", "PostgresKVStore"]

# The schema, one entry per version: entry ``i`` takes a database from version ``i``
# to ``i + 1``. Append only; never edit an entry that has shipped. ``{table}`` is the
# store's table name.
MIGRATIONS: tuple[tuple[str, ...], ...] = (
    (
        "CREATE TABLE {table} ("
        " space bytea NOT NULL, key bytea NOT NULL, value bytea NOT NULL,"
        " PRIMARY KEY (space, key))",
    ),
    # A commit as one server-side call (see PostgresKVStore.commit): one round trip and
    # one transaction. Returns 0 once the writes are applied, else the 1-based number of
    # the first check that failed (and writes nothing).
    (
        "CREATE OR REPLACE FUNCTION {commit}("
        " lock_ids bigint[], lock_exclusive boolean[],"
        " check_spaces bytea[], check_keys bytea[], check_values bytea[],"
        " write_kinds smallint[], write_spaces bytea[], write_keys bytea[],"
        " write_values bytea[]) RETURNS integer LANGUAGE plpgsql AS $$"
        " DECLARE i integer; stored bytea;"
        " BEGIN"
        "  FOR i IN 1 .. coalesce(array_length(lock_ids, 1), 0) LOOP"
        "   IF lock_exclusive[i] THEN PERFORM pg_advisory_xact_lock(lock_ids[i]);"
        "   ELSE PERFORM pg_advisory_xact_lock_shared(lock_ids[i]); END IF;"
        "  END LOOP;"
        "  FOR i IN 1 .. coalesce(array_length(check_keys, 1), 0) LOOP"
        "   stored := NULL;"
        "   SELECT t.value INTO stored FROM {table} t"
        "    WHERE t.space = check_spaces[i] AND t.key = check_keys[i];"
        "   IF stored IS DISTINCT FROM check_values[i] THEN RETURN i; END IF;"
        "  END LOOP;"
        "  FOR i IN 1 .. coalesce(array_length(write_kinds, 1), 0) LOOP"
        "   IF write_kinds[i] = 0 THEN"
        "    INSERT INTO {table} AS t (space, key, value)"
        "     VALUES (write_spaces[i], write_keys[i], write_values[i])"
        "     ON CONFLICT (space, key) DO UPDATE SET value = EXCLUDED.value;"
        "   ELSIF write_kinds[i] = 1 THEN"
        "    DELETE FROM {table} t WHERE t.space = write_spaces[i] AND t.key = write_keys[i];"
        "   ELSE"
        "    DELETE FROM {table} t WHERE t.space = write_spaces[i];"
        "   END IF;"
        "  END LOOP;"
        "  RETURN 0;"
        " END $$",
    ),
)

# Write kinds as the commit function numbers them.
_PUT, _DELETE, _DELETE_SPACE = 0, 1, 2

# Idle connections kept for reuse; more are opened when more threads are busy at once.
_MAX_IDLE = 8
# A connection idle longer than this is checked before use (the server or a proxy
# may have dropped it), as redis-py's health_check_interval does.
_CHECK_IDLE_AFTER_S = 30.0
_CONNECT_TIMEOUT_S = 10


def _lock_id(scope: str, name: bytes) -> int:
    """A signed 64-bit advisory-lock id for ``name`` in ``scope``.

    Advisory locks are database-wide; a collision (with another scope, or another
    application's locks) only makes two transactions wait for each other.
    """
    digest = hashlib.blake2b(name, digest_size=8, key=scope.encode()).digest()
    return int.from_bytes(digest, "big", signed=True)


def _describe(exc: psycopg.Error) -> str:
    """What went wrong, without the host, port, user or password psycopg may quote."""
    if exc.sqlstate:
        return f"{exc.sqlstate} {exc.diag.message_primary or type(exc).__name__}"
    # A client-side failure: libpq's text names the server ("connection to server at
    # "host", port 5432 failed: REASON"); keep the reason only.
    reason = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    reason = reason.rsplit("failed:", 1)[-1].strip()
    if '"' in reason or "@" in reason:
        reason = ""
    return f"{type(exc).__name__}{f' ({reason})' if reason else ''}"


class _Connections:
    """A small thread-safe pool: idle connections reused newest first, checked when stale.

    Opening a connection is done by the calling thread, so an unreachable
    server fails the call at once instead of making it wait for a pool's
    background reconnects.
    """

    def __init__(self, conninfo: str) -> None:
        self._conninfo = conninfo
        self._lock = threading.Lock()
        self._idle: list[tuple[psycopg.Connection[TupleRow], float]] = []
        self.closed = False

    def _connect(self) -> psycopg.Connection[TupleRow]:
        return psycopg.connect(self._conninfo, autocommit=True, connect_timeout=_CONNECT_TIMEOUT_S)

    def take(self) -> psycopg.Connection[TupleRow]:
        """An open connection for this thread's exclusive use until :meth:`give_back`."""
        while True:
            with self._lock:
                if not self._idle:
                    break
                conn, since = self._idle.pop()
            # An idle connection has nothing to read; a readable one was most likely
            # ended by the server (restart, pg_terminate_backend): check it first.
            if not _readable(conn) and time.monotonic() - since < _CHECK_IDLE_AFTER_S:
                return conn
            try:
                conn.execute("SELECT 1")
                return conn
            except psycopg.Error:
                conn.close()
        return self._connect()

    def give_back(self, conn: psycopg.Connection[TupleRow]) -> None:
        """Return a connection; a broken one, or any after :meth:`close`, is closed instead."""
        reusable = not conn.closed and conn.info.transaction_status == _IDLE
        with self._lock:
            if reusable and not self.closed and len(self._idle) < _MAX_IDLE:
                self._idle.append((conn, time.monotonic()))
                return
        conn.close()

    def close(self) -> None:
        """Close every idle connection; busy ones are closed when given back."""
        with self._lock:
            self.closed = True
            idle, self._idle = self._idle, []
        for conn, _ in idle:
            conn.close()


_IDLE = psycopg.pq.TransactionStatus.IDLE


def _readable(conn: psycopg.Connection[TupleRow]) -> bool:
    # poll, not select: select() refuses descriptors above 1023.
    poller = select.poll()
    poller.register(conn.fileno(), select.POLLIN)
    return bool(poller.poll(0))


class PostgresKVStore:
    """A :class:`KVStore` in one table of a PostgreSQL database.

    Construction does not connect: the first call does, and creates or
    upgrades the table then (a server down at start-up is a
    :class:`BackendUnavailableError` of that call, not of the constructor).

    Args:
        url: A ``postgresql://`` or ``postgres://`` URL (libpq's URI syntax, e.g.
            ``postgresql://user:password@host:5432/db?sslmode=require``).
        table: Name of the table (and prefix of its migrations table) in the
            connection's default schema.
        max_value_bytes: Largest value accepted by :meth:`commit`.

    Raises:
        InvalidInputError: The URL or ``table`` is malformed.
    """

    def __init__(
        self,
        url: str,
        *,
        table: str = "tiermem_kv",
        max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    ) -> None:
        if not table.isidentifier() or not table.isascii() or len(table) > 48:
            raise InvalidInputError(
                "table must be an ASCII identifier of at most 48 characters", field="table"
            )
        try:
            conninfo_to_dict(url)
        except psycopg.ProgrammingError as exc:
            # libpq's message may quote the URL, password included: leave it out.
            raise InvalidInputError(
                f"invalid PostgreSQL URL {redact_url(url)!r}: not a libpq connection URI",
                field="url",
            ) from exc
        self.max_value_bytes = max_value_bytes
        self._table = sql.Identifier(table)
        self._migrations_table = sql.Identifier(f"{table}_migrations")
        self._commit_function = sql.Identifier(f"{table}_commit")
        self._commit_call = sql.SQL(
            "SELECT {}(%b::bigint[], %b::boolean[], %b::bytea[], %b::bytea[], %b::bytea[], "
            "%b::smallint[], %b::bytea[], %b::bytea[], %b::bytea[])"
        ).format(self._commit_function)
        # Parameters and results binary: bytea as its bytes, not twice as many hex digits.
        self._get_many_query = sql.SQL(
            "SELECT key, value FROM {} WHERE space = %b AND key = ANY(%b::bytea[])"
        ).format(self._table)
        self._schema_lock_id = _lock_id("tiermem-schema", table.encode())
        self._space_scope = f"tiermem-space:{table}"
        self._key_scope = f"tiermem-key:{table}"
        self._connections = _Connections(url)
        self._schema_lock = threading.Lock()
        self._schema_version: int | None = None
        self._closed = False

    # ------------------------------------------------------------------ plumbing

    def _closed_error(self, during: str | None = None) -> StoreClosedError:
        when = f" during a {during}" if during else ""
        return StoreClosedError(
            f"the PostgreSQL store was closed{when}; open it again (Memory.open, or a new "
            "PostgresKVStore)"
        )

    @contextmanager
    def _connection(self, what: str) -> Iterator[psycopg.Connection[TupleRow]]:
        """A connection on an up-to-date schema; psycopg's errors become ours."""
        if self._closed:
            raise self._closed_error()
        conn = None
        try:
            conn = self._connections.take()
            if self._schema_version is None:
                self._migrate(conn)
            yield conn
        except psycopg.Error as exc:
            if self._closed:
                raise self._closed_error(what) from exc
            raise BackendUnavailableError(f"PostgreSQL {what} failed: {_describe(exc)}") from exc
        finally:
            if conn is not None:
                self._connections.give_back(conn)

    @property
    def schema_version(self) -> int:
        """How many of :data:`MIGRATIONS` the database has (connects on first use).

        Raises:
            BackendUnavailableError: The server cannot be reached, or its schema is newer.
        """
        with self._connection("schema check"):
            pass
        assert self._schema_version is not None  # set by the first _connection
        return self._schema_version

    def _migrate(self, conn: psycopg.Connection[TupleRow]) -> None:
        with self._schema_lock:
            if self._schema_version is not None:
                return
            with conn.transaction():
                # Stores opening together on a new database queue here, so each
                # migration runs once (CREATE ... IF NOT EXISTS alone races).
                conn.execute("SELECT pg_advisory_xact_lock(%s)", (self._schema_lock_id,))
                conn.execute(
                    sql.SQL("CREATE TABLE IF NOT EXISTS {} (v integer PRIMARY KEY)").format(
                        self._migrations_table
                    )
                )
                row = conn.execute(
                    sql.SQL("SELECT coalesce(max(v) + 1, 0) FROM {}").format(self._migrations_table)
                ).fetchone()
                version = int(row[0]) if row else 0
                if version > len(MIGRATIONS):
                    raise BackendUnavailableError(
                        f"the PostgreSQL table is at schema version {version}, newer than this "
                        f"tiermem's {len(MIGRATIONS)}: upgrade tiermem"
                    )
                for number in range(version, len(MIGRATIONS)):
                    for statement in MIGRATIONS[number]:
                        conn.execute(
                            sql.SQL(statement).format(
                                table=self._table, commit=self._commit_function
                            )
                        )
                    conn.execute(
                        sql.SQL("INSERT INTO {} (v) VALUES (%s)").format(self._migrations_table),
                        (number,),
                    )
            self._schema_version = len(MIGRATIONS)

    # ------------------------------------------------------------------ reads

    def get_many(self, space: str, keys: Sequence[str]) -> list[bytes | None]:
        """See :meth:`KVStore.get_many`."""
        check_reads(space, keys)
        if not keys:
            if self._closed:
                raise self._closed_error()
            return []
        wanted = list({key.encode(): None for key in keys})
        with self._connection("read") as conn:
            rows = conn.execute(
                self._get_many_query, (space.encode(), wanted), binary=True
            ).fetchall()
        found = {_bytes(key).decode(): _bytes(value) for key, value in rows}
        return [found.get(key) for key in keys]

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
            if self._closed:
                raise self._closed_error()
            return []
        where = [sql.SQL("space = %s")]
        params: list[bytes | int] = [space.encode()]
        if prefix:
            where.append(sql.SQL("key >= %s"))
            params.append(prefix.encode())
            upper = prefix_upper_bound(prefix)
            if upper is not None:
                where.append(sql.SQL("key < %s"))
                params.append(upper.encode())
        if start_after is not None:
            where.append(sql.SQL("key < %s") if reverse else sql.SQL("key > %s"))
            params.append(start_after.encode())
        query = sql.SQL("SELECT key, value FROM {} WHERE {} ORDER BY key {}").format(
            self._table,
            sql.SQL(" AND ").join(where),
            sql.SQL("DESC" if reverse else "ASC"),
        )
        if limit is not None:
            query = sql.SQL("{} LIMIT %s").format(query)
            params.append(limit)
        with self._connection("scan") as conn:
            rows = conn.execute(query, params, binary=True).fetchall()
        return [(_bytes(key).decode(), _bytes(value)) for key, value in rows]

    def spaces(self, *, limit: int | None = None) -> list[str]:
        """See :meth:`~tiers.backends.base.ListsSpaces.spaces` (read off the primary key)."""
        if limit is not None and limit <= 0:
            if self._closed:
                raise self._closed_error()
            return []
        query = sql.SQL("SELECT DISTINCT space FROM {} ORDER BY space").format(self._table)
        params: list[int] = []
        if limit is not None:
            query = sql.SQL("{} LIMIT %s").format(query)
            params.append(limit)
        with self._connection("space listing") as conn:
            rows = conn.execute(query, params).fetchall()
        return [_bytes(space).decode() for (space,) in rows]

    # ------------------------------------------------------------------ commit

    def commit(self, writes: Sequence[Write], checks: Sequence[Check] = ()) -> None:
        """See :meth:`KVStore.commit`."""
        check_writes(writes, self.max_value_bytes)
        check_checks(checks)
        if not writes and not checks:
            if self._closed:
                raise self._closed_error()
            return
        # One order for every commit, so two commits never wait for each other in a cycle.
        locks = sorted(self._locks(writes, checks).items())
        spaces: list[bytes] = []
        keys: list[bytes | None] = []
        values: list[bytes | None] = []
        kinds: list[int] = []
        for write in writes:
            spaces.append(write.space.encode())
            if isinstance(write, Put):
                kinds.append(_PUT)
                keys.append(write.key.encode())
                values.append(write.value)
            elif isinstance(write, Delete):
                kinds.append(_DELETE)
                keys.append(write.key.encode())
                values.append(None)
            else:
                kinds.append(_DELETE_SPACE)
                keys.append(None)
                values.append(None)
        # The whole commit (locks, checks, writes in order) is one call of the schema's
        # commit function, sent in one round trip; autocommit makes it one transaction,
        # so one WAL flush, and its locks are held only while it runs on the server.
        with self._connection("commit") as conn:
            row = conn.execute(
                self._commit_call,
                (
                    [lock_id for lock_id, _ in locks],
                    [exclusive for _, exclusive in locks],
                    [c.space.encode() for c in checks],
                    [c.key.encode() for c in checks],
                    [c.expected for c in checks],
                    kinds,
                    spaces,
                    keys,
                    values,
                ),
            ).fetchone()
        failed = int(row[0]) if row else 0
        if failed:
            check = checks[failed - 1]
            raise ConflictError(
                f"check failed on {check.space!r}/{check.key!r}: the value changed; "
                "re-read and retry"
            )

    def _locks(self, writes: Sequence[Write], checks: Sequence[Check]) -> dict[int, bool]:
        """Advisory-lock id -> exclusive? for a commit of ``writes`` under ``checks``."""
        locks: dict[int, bool] = {}
        for item in (*checks, *writes):
            space = item.space.encode()
            space_lock = _lock_id(self._space_scope, space)
            if isinstance(item, DeleteSpace):
                locks[space_lock] = True
                continue
            locks.setdefault(space_lock, False)
            # Length-prefixed, so (space, key) pairs never run together.
            address = len(space).to_bytes(4, "big") + space + item.key.encode()
            locks[_lock_id(self._key_scope, address)] = True
        return locks

    # ------------------------------------------------------------------ operations

    def volatility(self) -> str | None:
        """Why an acknowledged commit could be lost, or ``None`` if each one is flushed to disk.

        Reads the server's ``fsync`` and this connection's ``synchronous_commit``
        (which a role, database or the URL's ``options`` may set).

        Raises:
            BackendUnavailableError: PostgreSQL cannot be reached.
        """
        with self._connection("durability check") as conn:
            fsync = _setting(conn, "fsync")
            synchronous_commit = _setting(conn, "synchronous_commit")
        if fsync != "on":
            return (
                f"PostgreSQL runs with fsync {fsync}: nothing is flushed to disk, so a crash of "
                "its host loses acknowledged commits and can corrupt the database (durable "
                "needs fsync on)"
            )
        if synchronous_commit == "off":
            return (
                "PostgreSQL runs with synchronous_commit off: a commit is acknowledged before "
                "its WAL is flushed, so a crash of the server loses the last ones (durable "
                "needs synchronous_commit on)"
            )
        return None

    def ping(self) -> None:
        """See :meth:`KVStore.ping`."""
        with self._connection("ping") as conn:
            conn.execute("SELECT 1")

    def close(self) -> None:
        """See :meth:`KVStore.close`.

        Calls in flight finish; afterwards every method raises
        :class:`BackendUnavailableError`.
        """
        if self._closed:
            return
        self._closed = True
        self._connections.close()


def _bytes(value: object) -> bytes:
    # psycopg returns bytea as bytes; the row type is not known to mypy.
    assert isinstance(value, bytes)
    return value


def _setting(conn: psycopg.Connection[TupleRow], name: str) -> str:
    row = conn.execute("SELECT current_setting(%s)", (name,)).fetchone()
    return str(row[0]) if row else "?"
