"""Group commit for :class:`~tiers.backends.sqlite_kv.SqliteKVStore`: concurrent commits share fsyncs.

A caller queues its transaction, and one caller at a time (the leader) applies
every queued transaction in one SQLite transaction and commits once. Each
queued commit's checks are evaluated in order against the database plus the
writes of the commits before it in the batch, so a failed check drops only its
own commit (a batch with a ``DeleteSpace`` uses a savepoint per commit
instead). A commit alone in its batch whose checks its own puts cover (a
step's) runs as inserts and a guarded update, with no check read
(:func:`_apply_alone`). Each caller returns only after the fsync that made its
transaction durable; serial callers see no difference. Callers that queue while a batch
is being committed sleep each on a lock of its own; the leader wakes exactly
the callers of its batch, and hands the lead to the first caller that queued
meanwhile. When the last batches had several callers, a leader waits briefly
(at most one commit's duration, capped at :data:`_MAX_GATHER_S`) for the
callers of the last batch to queue again: otherwise the first caller back
after an fsync commits alone and batches alternate between one caller and all
the others. Around each transaction the leader holds the file's
:class:`~tiers.backends._sqlite_connections.WriteLock`, so writers in other
processes queue behind it instead of polling SQLite's lock.

:attr:`GroupCommitWriter.stats` counts commits and transactions: with
``synchronous=FULL`` each transaction is one fsync of the WAL.
"""

from __future__ import annotations

import functools
import sqlite3
import threading
import time
from collections.abc import Callable, Sequence
from typing import Concatenate, NamedTuple, ParamSpec

from tiers.backends._sqlite_connections import SqliteConnections, WriteLock, end_transaction
from tiers.backends.base import Check, Delete, DeleteSpace, Put, Write
from tiers.errors import BackendUnavailableError, ConflictError

_Args = ParamSpec("_Args")

# The sizes of the last two batches when each had one caller: the next lone caller commits
# without queueing (GroupCommitWriter._commit_alone).
_LONE = (1, 1)
# Longest a group-commit leader waits for the callers of the last batches.
_MAX_GATHER_S = 0.002
# Checks per SELECT and rows per INSERT of a commit (under SQLite's bound-parameter limit).
_CHECKS_PER_STATEMENT = 100
_PUTS_PER_STATEMENT = 200


class GroupCommitStats(NamedTuple):
    """Counters of one store's group commit since it was opened.

    Attributes:
        commits: Commits acknowledged (a failed check is not counted).
        batches: Transactions committed, each one fsync with ``durable=True``;
            ``commits / batches`` is how many commits shared an fsync.
    """

    commits: int
    batches: int


class _Pending:
    """One queued commit: its batch, and its outcome once a writer has applied it.

    ``wake`` is held from the moment the commit queues behind a leader; a
    leader releases it once the commit is done, or to hand it the lead.
    """

    __slots__ = ("checks", "done", "error", "lead", "wake", "writes")

    def __init__(self, writes: Sequence[Write], checks: Sequence[Check]) -> None:
        self.writes = writes
        self.checks = checks
        self.done = False
        # Set when a leader hands this caller the lead of the next batch.
        self.lead = False
        self.error: BaseException | None = None
        self.wake = threading.Lock()


class GroupCommitWriter:
    """The write connection of one store, and the queue of commits waiting for it.

    Args:
        conn: The write connection (its transactions are begun explicitly).
        connections: The store's connections, which say whether it is closed.
        write_lock: The lock the writers of every process take around a transaction.
    """

    def __init__(
        self, conn: sqlite3.Connection, connections: SqliteConnections, write_lock: WriteLock
    ) -> None:
        self.conn = conn
        # One cursor for every statement of a transaction: conn.execute builds a new
        # cursor per call (~0.14 us each, four a step's commit). Used only under ``lock``.
        self._cursor = conn.cursor()
        self.write_lock = write_lock
        self._connections = connections
        # Held while a batch is committed, and by whoever else uses the write connection.
        self.lock = threading.Lock()
        # Commits waiting for the writer, and whether a caller is committing a
        # batch now (the leader); all guarded by _queue_lock, which _gather_cond
        # shares (a gathering leader waits on it for arrivals).
        self._queue: list[_Pending] = []
        self._leading = False
        # While a leader gathers: how many queued callers it waits for (0: not gathering).
        self._gather_for = 0
        self._queue_lock = threading.Lock()
        self._gather_cond = threading.Condition(self._queue_lock)
        # Sizes of the last two batches and how long the last commit took.
        self._batch_sizes = (1, 1)
        self._commit_seconds = 0.0
        # Commits acknowledged and transactions committed (counted after COMMIT).
        self.acked = 0
        self.batches = 0

    def commit(self, writes: Sequence[Write], checks: Sequence[Check]) -> None:
        """Commit one validated, non-empty transaction, in a batch with any concurrent ones.

        A caller that finds a leader at work sleeps on its own lock until the
        leader has committed it or hands it the lead (the first of those that
        queued meanwhile leads the next batch), so each wake-up is one the
        caller needs: no waiter is woken to find it has to wait again.

        Raises:
            ConflictError: A check failed; nothing of this transaction was written.
            BackendUnavailableError: The store is closed or SQLite failed.
        """
        with self._queue_lock:
            # No leader, and the last batches were lone commits (so a leader would not
            # gather): commit without queueing (_commit_alone).
            alone = not self._leading and self._batch_sizes == _LONE
            if alone:
                self._leading = True
        if alone:
            self._commit_alone(writes, checks)
            return
        pending = _Pending(writes, checks)
        with self._queue_lock:
            self._queue.append(pending)
            follows = self._leading
            if follows:
                pending.wake.acquire()
                if self._gather_for and len(self._queue) >= self._gather_for:
                    # Only the arrival the leader waits for wakes it.
                    self._gather_cond.notify()
            else:
                self._leading = True
        if follows:
            # Released by a leader: this commit is done, or it leads the next batch.
            try:
                pending.wake.acquire()
            except BaseException:
                self._abandon(pending)
                raise
        if not pending.done:
            self._lead(pending)
        if pending.error is not None:
            raise pending.error

    def _commit_alone(self, writes: Sequence[Write], checks: Sequence[Check]) -> None:
        """Commit one transaction as the leader of a batch of one, without the queue.

        What :meth:`_lead` does for a lone caller, without its bookkeeping (a
        queued entry and its lock, the gathering, the batch's loops): callers
        that arrive meanwhile find a leader and queue, and the first of them is
        handed the lead once this commit is done, as after any batch. The
        commit is applied by :func:`_apply_alone` itself, without a closure:
        every step of a lone writer commits this way.

        Raises:
            ConflictError: A check failed; nothing was written.
            BackendUnavailableError: The store is closed or SQLite failed.
        """
        try:
            with self.lock:
                began = time.perf_counter()
                # A failed check raises ConflictError: _transact rolls back and re-raises it.
                self._transact(_apply_alone, writes, checks)
                self.acked += 1
                self.batches += 1
                self._commit_seconds = time.perf_counter() - began
        finally:
            with self._queue_lock:
                self._hand_over()

    def _transact(
        self,
        apply: Callable[Concatenate[sqlite3.Cursor, _Args], None],
        *args: _Args.args,
        **kwargs: _Args.kwargs,
    ) -> bool:
        """Run ``apply(cursor, *args, **kwargs)`` in one write transaction; whether it committed.

        False when ``apply`` rolled the transaction back itself.

        Under the OS write lock, ``BEGIN IMMEDIATE`` takes SQLite's write lock
        first, so checks and writes see the same state even with other processes
        on the file; any error rolls back, and SQLite's is raised as
        :class:`BackendUnavailableError`.
        """
        if self._connections.closed:
            raise self._connections.closed_error()
        conn = self.conn
        cursor = self._cursor
        self.write_lock.acquire()
        try:
            cursor.execute("BEGIN IMMEDIATE")
            try:
                apply(cursor, *args, **kwargs)
                if not conn.in_transaction:
                    return False
                cursor.execute("COMMIT")
                return True
            except BaseException:
                end_transaction(conn, "ROLLBACK")
                raise
        except sqlite3.Error as exc:
            raise BackendUnavailableError(
                f"SQLite commit failed on {self._connections.path}: {exc}"
            ) from exc
        finally:
            self.write_lock.release()

    def _lead(self, own: _Pending) -> None:
        """Commit every queued transaction in one batch, then wake its callers and the next leader."""
        batch: list[_Pending] = []
        try:
            with self._queue_lock:
                self._gather()
                batch, self._queue = self._queue, []
            with self.lock:
                began = time.perf_counter()
                self._commit_batch(batch, own)
                self._commit_seconds = time.perf_counter() - began
        finally:
            with self._queue_lock:
                if batch:
                    self._batch_sizes = (self._batch_sizes[1], len(batch))
                else:
                    # Interrupted while gathering: this caller's commit was never tried.
                    self._queue.remove(own)
                for pending in batch:
                    if pending is own:
                        continue
                    if not pending.done:
                        # Interrupted before its batch was tried (a KeyboardInterrupt).
                        pending.error = BackendUnavailableError(
                            f"SQLite commit on {self._connections.path} was interrupted"
                        )
                        pending.done = True
                    pending.wake.release()
                self._hand_over()

    def _hand_over(self) -> None:
        """Wake the first queued caller to lead the next batch, or mark no one leading (lock held)."""
        if self._queue:
            self._queue[0].lead = True
            self._queue[0].wake.release()
        else:
            self._leading = False

    def _abandon(self, pending: _Pending) -> None:
        """Take a waiter interrupted in its wait (a KeyboardInterrupt) out of the queue.

        Its commit may have been applied already (then it stays applied); if it
        was handed the lead, the lead passes on, or the queue would stall.
        """
        with self._queue_lock:
            if pending.done:
                return
            if pending in self._queue:
                self._queue.remove(pending)
            if pending.lead:
                self._hand_over()

    @property
    def stats(self) -> GroupCommitStats:
        """How many commits were acknowledged, and in how many transactions."""
        return GroupCommitStats(self.acked, self.batches)

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
        self._gather_for = expect
        try:
            while len(self._queue) < expect:
                left = deadline - time.monotonic()
                if left <= 0:
                    break
                self._gather_cond.wait(left)
        finally:
            self._gather_for = 0

    def _commit_batch(self, batch: list[_Pending], own: _Pending) -> None:
        """Apply queued commits in one transaction and one fsync; record each one's outcome.

        Raises:
            BaseException: What failed the whole batch (nothing of it was
                committed); the other callers of the batch get a
                :class:`BackendUnavailableError` naming it.
        """
        failure: BaseException | None = None
        try:

            def apply(cursor: sqlite3.Cursor) -> None:
                if len(batch) == 1:
                    # Alone: a failed check rolls the whole transaction back.
                    try:
                        _apply_alone(cursor, batch[0].writes, batch[0].checks)
                    except ConflictError as exc:
                        batch[0].error = exc
                        cursor.execute("ROLLBACK")
                elif any(isinstance(w, DeleteSpace) for p in batch for w in p.writes):
                    _apply_with_savepoints(cursor, batch)
                else:
                    _apply_merged(cursor, batch)

            if self._transact(apply):
                self.acked += sum(1 for p in batch if p.error is None)
                self.batches += 1
        except BaseException as exc:
            failure = exc
        finally:
            for pending in batch:
                if failure is not None and pending is not own:
                    error = BackendUnavailableError(
                        f"SQLite commit failed on {self._connections.path} (in a group commit): {failure}"
                    )
                    error.__cause__ = failure
                    pending.error = error
                pending.done = True
        if failure is not None:
            raise failure


def _apply_with_savepoints(cursor: sqlite3.Cursor, batch: list[_Pending]) -> None:
    """Apply each queued commit in its own savepoint: a failed check undoes only its writes."""
    for pending in batch:
        cursor.execute("SAVEPOINT one")
        try:
            _apply(cursor, pending.writes, pending.checks)
        except ConflictError as exc:
            cursor.execute("ROLLBACK TO one")
            pending.error = exc
        cursor.execute("RELEASE one")


_ABSENT = object()


def _apply_merged(cursor: sqlite3.Cursor, batch: list[_Pending]) -> None:
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
        args: list[object] = []
        for space, key in chunk:
            args += [space, key]
        stored.update(
            ((space, key), bytes(value))
            for space, key, value in cursor.execute(_select_statement(len(chunk)), args)
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
    _apply(cursor, accepted, ())


def _conflict(check: Check) -> ConflictError:
    return ConflictError(
        f"check failed on {check.space!r}/{check.key!r}: the value changed; re-read and retry"
    )


def _apply(cursor: sqlite3.Cursor, writes: Sequence[Write], checks: Sequence[Check]) -> None:
    """Run one commit's checks, then its writes (the caller holds a transaction).

    Checks are read with one statement and runs of puts are written with one
    multi-row statement: on a busy machine each statement costs as much as the
    row it writes, so a checkpoint of 4 rows and 3 checks takes 2 statements, not 7.
    """
    for start in range(0, len(checks), _CHECKS_PER_STATEMENT):
        chunk = checks[start : start + _CHECKS_PER_STATEMENT]
        args: list[object] = []
        for check in chunk:
            args += [check.space, check.key]
        found = {
            (space, key): bytes(value)
            for space, key, value in cursor.execute(_select_statement(len(chunk)), args)
        }
        for check in chunk:
            if found.get((check.space, check.key)) != check.expected:
                raise _conflict(check)
    puts: list[Put] = []
    for write in writes:
        if isinstance(write, Put):
            puts.append(write)
            continue
        _put_rows(cursor, puts)
        puts = []
        if isinstance(write, Delete):
            cursor.execute("DELETE FROM kv WHERE space = ? AND key = ?", (write.space, write.key))
        elif isinstance(write, DeleteSpace):
            cursor.execute("DELETE FROM kv WHERE space = ?", (write.space,))
    _put_rows(cursor, puts)


def _apply_alone(cursor: sqlite3.Cursor, writes: Sequence[Write], checks: Sequence[Check]) -> None:
    """Run a lone commit whose checks its own writes can enforce, else :func:`_apply`.

    When each check is on the address of exactly one of the commit's puts (a
    step: the checkpoint and index entry expected absent, the head expected to
    hold its bytes), the writes carry their checks and no read runs: a put
    expected absent is a plain ``INSERT`` (a row there fails its uniqueness),
    a put expected to replace given bytes an ``UPDATE ... WHERE value = ?`` that
    must change one row. If one fails, the transaction is rolled back and begun
    again, and :func:`_apply` checks and writes as usual: it raises the same
    :class:`ConflictError` naming the first failed check. The caller holds the
    file's write lock, so no tiermem writer commits in between; a foreign
    writer that does is checked against like any other state.

    Raises:
        ConflictError: A check failed; the caller rolls the transaction back.
    """
    guarded = _guarded(writes, checks)
    if guarded is None:
        _apply(cursor, writes, checks)
        return
    inserts, updates = guarded
    try:
        held = True
        for args in updates:
            if cursor.execute(_UPDATE_IF_HOLDS, args).rowcount != 1:
                held = False
                break
        if held and inserts:
            cursor.execute(_insert_statement(len(inserts) // 3), inserts)
    except sqlite3.IntegrityError:
        held = False  # a row where a put was expected absent
    if not held:
        cursor.execute("ROLLBACK")
        cursor.execute("BEGIN IMMEDIATE")
        _apply(cursor, writes, checks)


_UPDATE_IF_HOLDS = "UPDATE kv SET value = ? WHERE space = ? AND key = ? AND value = ?"


def _guarded(
    writes: Sequence[Write], checks: Sequence[Check]
) -> tuple[list[object], list[tuple[bytes, str, str, bytes]]] | None:
    """The insert parameters and updates that enforce ``checks`` by ``writes`` (``None``: they cannot).

    Each check must be on the address of exactly one put, and each put checked
    once: then a put expected absent is an insert, one expected to replace
    bytes an update guarded by them, and together they write what the upserts would.
    """
    if len(writes) != len(checks) or len(writes) > _PUTS_PER_STATEMENT:
        return None
    expected: dict[tuple[str, str], bytes | None] = {}
    for check in checks:
        expected[(check.space, check.key)] = check.expected
    if len(expected) != len(checks):
        return None  # two checks of one address
    inserts: list[object] = []
    updates: list[tuple[bytes, str, str, bytes]] = []
    for write in writes:
        if type(write) is not Put:
            return None
        want = expected.pop((write.space, write.key), _ABSENT)
        if want is None:
            inserts += [write.space, write.key, write.value]
        elif isinstance(want, bytes):
            updates.append((write.value, write.space, write.key, want))
        else:
            return None  # an unchecked put (or a second put of one address)
    return inserts, updates


def _put_rows(cursor: sqlite3.Cursor, puts: list[Put]) -> None:
    """Upsert ``puts`` in order (a later put of the same key wins), in as few statements as fit."""
    for start in range(0, len(puts), _PUTS_PER_STATEMENT):
        chunk = puts[start : start + _PUTS_PER_STATEMENT]
        args: list[object] = []
        for put in chunk:
            args += [put.space, put.key, put.value]
        cursor.execute(_upsert_statement(len(chunk)), args)


# The statements for n rows, built once per n: a commit of a step runs the same ones.
@functools.lru_cache(maxsize=_CHECKS_PER_STATEMENT)
def _select_statement(rows: int) -> str:
    """Read the values at ``rows`` addresses (two parameters each)."""
    where = " OR ".join(["(space = ? AND key = ?)"] * rows)
    return f"SELECT space, key, value FROM kv WHERE {where}"  # noqa: S608


@functools.lru_cache(maxsize=_PUTS_PER_STATEMENT)
def _insert_statement(rows: int) -> str:
    """Insert ``rows`` new rows (three parameters each); an existing address fails it."""
    values = ",".join(["(?, ?, ?)"] * rows)
    return f"INSERT INTO kv (space, key, value) VALUES {values}"  # noqa: S608


@functools.lru_cache(maxsize=_PUTS_PER_STATEMENT)
def _upsert_statement(rows: int) -> str:
    """Upsert ``rows`` rows in order (three parameters each)."""
    values = ",".join(["(?, ?, ?)"] * rows)
    return (
        f"INSERT INTO kv (space, key, value) VALUES {values} "  # noqa: S608
        "ON CONFLICT (space, key) DO UPDATE SET value = excluded.value"
    )
