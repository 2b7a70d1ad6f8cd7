"""The SQLite lone-writer commit when it fails, and when concurrency comes back.

``GroupCommitWriter._commit_alone`` commits without the queue after lone batches.
These tests hold the writer's lock so that one caller is committing alone while
another has queued behind it, then make the lone commit fail (a failed check, an
exception between ``BEGIN`` and ``COMMIT``, a store closed meanwhile): the queued
caller must never be stranded, nothing of the failed commit may be written, and
no transaction may stay open. Then 16 writers after a stretch of lone commits
must share transactions again (counted by ``group_commit_stats``, never timed),
on a plain store and on an encrypted one over it. Real SQLite files throughout.
"""

from __future__ import annotations

import sqlite3
import threading
from collections.abc import Iterator, Sequence
from pathlib import Path

import pytest

from tests.waiting import wait_until
from tiers.backends import _sqlite_group_commit as group_commit
from tiers.backends.base import Check, KVStore, Put, Write
from tiers.backends.encrypted_kv import EncryptedKVStore, MasterKey
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import ConflictError, StoreClosedError

WAIT_S = 30
WRITERS = 16
MASTER, _ = MasterKey.generate()


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteKVStore]:
    kv = SqliteKVStore(tmp_path / "kv.db")
    yield kv
    kv.close()


class Outcome:
    """What one committing thread got: nothing (success) or the exception it raised."""

    def __init__(self) -> None:
        self.error: BaseException | None = None
        self.finished = False


def _committer(
    kv: KVStore, writes: Sequence[Write], checks: Sequence[Check] = ()
) -> tuple[threading.Thread, Outcome]:
    outcome = Outcome()

    def run() -> None:
        try:
            kv.commit(writes, checks)
        except BaseException as exc:  # a KeyboardInterrupt too: the test inspects it
            outcome.error = exc
        finally:
            outcome.finished = True

    return threading.Thread(target=run), outcome


def _lone_then_queued(
    store: SqliteKVStore,
    first: tuple[Sequence[Write], Sequence[Check]],
    second: Sequence[Write],
) -> tuple[Outcome, Outcome]:
    """Run ``first`` as a lone commit with ``second`` queued behind it; both outcomes."""
    group = store._group
    lone, lone_outcome = _committer(store, *first)
    queued, queued_outcome = _committer(store, second)
    group.lock.acquire()
    try:
        lone.start()
        wait_until(lambda: group._leading)  # the lone caller waits for the writer
        queued.start()
        wait_until(lambda: len(group._queue) == 1)
    finally:
        group.lock.release()
    for thread in (lone, queued):
        thread.join(WAIT_S)
        assert not thread.is_alive(), "a caller was stranded"
    assert not group._leading
    assert group._queue == []
    assert not store._writer.in_transaction
    return lone_outcome, queued_outcome


def test_a_lone_failed_check_hands_the_lead_to_the_queued_caller(store: SqliteKVStore) -> None:
    store.commit([Put("s", "head", b"h1")])
    before = store.group_commit_stats
    lone, queued = _lone_then_queued(
        store,
        ([Put("s", "head", b"h2"), Put("s", "lost", b"x")], [Check("s", "head", b"stale")]),
        [Put("s", "second", b"2")],
    )
    assert isinstance(lone.error, ConflictError)
    assert queued.error is None
    assert store.get_many("s", ["head", "lost", "second"]) == [b"h1", None, b"2"]
    after = store.group_commit_stats
    assert (after.commits - before.commits, after.batches - before.batches) == (1, 1)


@pytest.mark.parametrize("interrupt", [KeyboardInterrupt, sqlite3.OperationalError, RuntimeError])
def test_an_exception_between_begin_and_commit_rolls_back_and_strands_no_caller(
    store: SqliteKVStore, monkeypatch: pytest.MonkeyPatch, interrupt: type[BaseException]
) -> None:
    real = group_commit._apply_alone

    def failing_after_the_writes(
        conn: sqlite3.Connection, writes: Sequence[Write], checks: Sequence[Check]
    ) -> None:
        real(conn, writes, checks)
        if any(isinstance(w, Put) and w.key == "doomed" for w in writes):
            raise interrupt("between BEGIN and COMMIT")

    monkeypatch.setattr(group_commit, "_apply_alone", failing_after_the_writes)
    store.commit([Put("s", "head", b"h1")])
    lone, queued = _lone_then_queued(
        store,
        ([Put("s", "doomed", b"x"), Put("s", "head", b"h2")], []),
        [Put("s", "second", b"2")],
    )
    assert lone.error is not None
    assert queued.error is None
    assert store.get_many("s", ["doomed", "head", "second"]) == [None, b"h1", b"2"]
    # The writer goes on: the next lone commit works.
    store.commit([Put("s", "third", b"3")])
    assert store.get_many("s", ["third"]) == [b"3"]


def test_a_store_closed_during_a_lone_commit_fails_both_callers_with_a_typed_error(
    store: SqliteKVStore,
) -> None:
    group = store._group
    lone, lone_outcome = _committer(store, [Put("s", "a", b"1")])
    queued, queued_outcome = _committer(store, [Put("s", "b", b"2")])
    closer = threading.Thread(target=store.close)
    group.lock.acquire()
    try:
        lone.start()
        wait_until(lambda: group._leading)
        queued.start()
        wait_until(lambda: len(group._queue) == 1)
        closer.start()
        wait_until(lambda: store._connections.closed)
    finally:
        group.lock.release()
    for thread in (lone, queued, closer):
        thread.join(WAIT_S)
        assert not thread.is_alive(), "a caller was stranded"
    assert isinstance(lone_outcome.error, StoreClosedError)
    assert isinstance(queued_outcome.error, StoreClosedError)
    assert not group._leading
    assert group._queue == []


def _writers_after_lone_commits(kv: KVStore, sqlite: SqliteKVStore) -> tuple[int, int]:
    """Commit lone, then from :data:`WRITERS` threads at once; their (commits, batches)."""
    for n in range(20):
        kv.commit([Put("s", "serial", str(n).encode())])
    lone = sqlite.group_commit_stats
    assert lone.commits == lone.batches  # each serial commit was its own transaction
    assert sqlite._group._batch_sizes == (1, 1)
    group = sqlite._group
    go = threading.Barrier(WRITERS)
    errors: list[BaseException] = []

    def writer(tid: int) -> None:
        try:
            go.wait(WAIT_S)
            for n in range(10):
                kv.commit([Put("s", f"w{tid}-{n}", b"v")])
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=writer, args=(t,)) for t in range(WRITERS)]
    # Held until every writer has queued or leads: the first batch after the lone
    # stretch has them all, whatever the scheduling.
    group.lock.acquire()
    try:
        for thread in threads:
            thread.start()
        wait_until(lambda: len(group._queue) == WRITERS - 1)
    finally:
        group.lock.release()
    for thread in threads:
        thread.join(WAIT_S * 4)
        assert not thread.is_alive()
    assert errors == []
    after = sqlite.group_commit_stats
    return after.commits - lone.commits, after.batches - lone.batches


def test_sixteen_writers_share_transactions_again_after_lone_commits(
    store: SqliteKVStore,
) -> None:
    commits, batches = _writers_after_lone_commits(store, store)
    assert commits == WRITERS * 10
    assert batches < commits
    assert len(store.scan("s", prefix="w")) == WRITERS * 10


def test_an_encrypted_store_over_sqlite_shares_them_too_and_keeps_typed_conflicts(
    tmp_path: Path,
) -> None:
    inner = SqliteKVStore(tmp_path / "kv.db")
    kv = EncryptedKVStore(inner, MASTER)
    try:
        commits, batches = _writers_after_lone_commits(kv, inner)
        assert commits == WRITERS * 10
        assert batches < commits
        kv.commit([Put("s", "head", b"h1")], [Check("s", "head", None)])
        with pytest.raises(ConflictError):
            kv.commit([Put("s", "head", b"h2")], [Check("s", "head", b"stale")])
        assert kv.get_many("s", ["head"]) == [b"h1"]
    finally:
        kv.close()
