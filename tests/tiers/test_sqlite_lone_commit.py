"""The SQLite group commit's lone-writer path: which commits take it, and what it keeps.

A commit that finds no leader, after batches of one caller each, commits
without queueing (``GroupCommitWriter._commit_alone``). These tests count the
queued entries (``_Pending``) a commit makes to tell the two paths apart, and
check that the lone path keeps what the queue gives: a caller arriving while it
commits is handed the lead, a failed check or a closed store releases the lead,
and after batches of several callers the next commit gathers as before.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.waiting import wait_until
from tiers.backends import _sqlite_group_commit as group_commit
from tiers.backends.base import Check, Put, Write
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import ConflictError, StoreClosedError

WAIT_S = 30


@pytest.fixture
def queued(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """How many commits were queued (made a ``_Pending``): the queued path's count."""
    made: list[int] = []
    real = group_commit._Pending.__init__

    def counting(self: group_commit._Pending, writes: list[Write], checks: list[Check]) -> None:
        made.append(1)
        real(self, writes, checks)

    monkeypatch.setattr(group_commit._Pending, "__init__", counting)
    return made


@pytest.fixture
def store(tmp_path: Path) -> Iterator[SqliteKVStore]:
    kv = SqliteKVStore(tmp_path / "kv.db")
    yield kv
    kv.close()


def _step_like(key: str, head: bytes | None, new_head: bytes) -> tuple[list[Write], list[Check]]:
    """A commit shaped like a step's: a new row and a head expected to hold ``head``."""
    return (
        [Put("run", key, b"checkpoint " + key.encode()), Put("runs", "r", new_head)],
        [Check("run", key, None), Check("runs", "r", head)],
    )


def test_a_lone_commit_is_not_queued_and_counts_one_transaction(
    store: SqliteKVStore, queued: list[int]
) -> None:
    store.commit(*_step_like("a", None, b"h1"))
    store.commit(*_step_like("b", b"h1", b"h2"))
    assert queued == []
    assert tuple(store.group_commit_stats) == (2, 2)
    assert store.get_many("run", ["a", "b"]) == [b"checkpoint a", b"checkpoint b"]
    assert store.get_many("runs", ["r"]) == [b"h2"]
    group = store._group
    assert not group._leading
    assert group._queue == []


def test_a_lone_failed_check_raises_writes_nothing_and_releases_the_lead(
    store: SqliteKVStore, queued: list[int]
) -> None:
    store.commit(*_step_like("a", None, b"h1"))
    with pytest.raises(ConflictError, match="'runs'/'r'"):
        store.commit(*_step_like("b", b"stale", b"h2"))
    assert store.get_many("run", ["b"]) == [None]
    assert tuple(store.group_commit_stats) == (1, 1)
    store.commit(*_step_like("c", b"h1", b"h3"))
    assert queued == []
    assert store.get_many("runs", ["r"]) == [b"h3"]


def test_a_caller_arriving_during_a_lone_commit_queues_and_is_handed_the_lead(
    store: SqliteKVStore, queued: list[int]
) -> None:
    group = store._group
    errors: list[BaseException] = []

    def commit(writes: list[Write]) -> None:
        try:
            store.commit(writes)
        except BaseException as exc:
            errors.append(exc)

    first = threading.Thread(target=commit, args=([Put("s", "first", b"1")],))
    second = threading.Thread(target=commit, args=([Put("s", "second", b"2")],))
    group.lock.acquire()
    try:
        first.start()
        # The first caller leads alone (nothing queued) and waits for the writer.
        wait_until(lambda: group._leading)
        second.start()
        wait_until(lambda: len(group._queue) == 1)
    finally:
        group.lock.release()
    first.join(WAIT_S)
    second.join(WAIT_S)
    assert not first.is_alive()
    assert not second.is_alive()
    assert errors == []
    assert queued == [1]  # only the second caller queued
    assert store.get_many("s", ["first", "second"]) == [b"1", b"2"]
    assert tuple(store.group_commit_stats) == (2, 2)
    assert not group._leading
    assert group._queue == []


def test_after_batches_of_several_callers_a_commit_is_queued(
    store: SqliteKVStore, queued: list[int]
) -> None:
    group = store._group
    # As after a batch of three: the next leader gathers (briefly) for the callers
    # of the last batches, which only the queued path does.
    group._batch_sizes = (1, 3)
    store.commit([Put("s", "k", b"1")])
    assert queued == [1]
    assert group._batch_sizes == (3, 1)
    store.commit([Put("s", "k", b"2")])
    assert queued == [1, 1]
    # Two lone batches in a row: the next commit takes the lone path again.
    store.commit([Put("s", "k", b"3")])
    assert queued == [1, 1]
    assert store.get_many("s", ["k"]) == [b"3"]


def test_a_lone_commit_on_a_closed_store_raises_and_leaves_no_lead(tmp_path: Path) -> None:
    store = SqliteKVStore(tmp_path / "kv.db")
    group = store._group
    store.close()
    with pytest.raises(StoreClosedError):
        group.commit([Put("s", "k", b"v")], [])
    assert not group._leading
    assert group._queue == []
    with pytest.raises(StoreClosedError):
        group.commit([Put("s", "k", b"v")], [])
