"""The SQLite store's group commit and cross-process write lock, shown without timings.

Batches are made deterministic by holding the writer's lock while callers
queue: the first caller leads a batch of itself and waits for the lock, the
others queue behind it, and the first of those leads them all in one batch.
The store's counters (:attr:`SqliteKVStore.group_commit_stats`) then say how
many transactions (each one fsync) the commits took.
"""

from __future__ import annotations

import fcntl
import os
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path

import pytest

from tests.contracts.test_kv_contract import descriptors_under
from tests.waiting import wait_until
from tiers.backends.base import Check, Delete, DeleteSpace, Put, Write
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import ConflictError
from tiers.task import TaskTier

WAIT_S = 30


class _Caller:
    """One thread's commit and its outcome."""

    def __init__(self, store: SqliteKVStore, writes: list[Write], checks: list[Check]) -> None:
        self.error: BaseException | None = None
        self.thread = threading.Thread(target=self._run, args=(store, writes, checks))

    def _run(self, store: SqliteKVStore, writes: list[Write], checks: list[Check]) -> None:
        try:
            store.commit(writes, checks)
        except BaseException as exc:
            self.error = exc


@contextmanager
def _one_batch(store: SqliteKVStore) -> Iterator[Callable[[list[Write], list[Check]], _Caller]]:
    """Queue commits in a known order behind a held writer, and let them go as one batch.

    The first commit queued leads a batch of its own; every later one joins
    the next batch, in the order queued.
    """
    group = store._group
    callers: list[_Caller] = []
    group.lock.acquire()
    try:

        def queue(writes: list[Write], checks: list[Check]) -> _Caller:
            caller = _Caller(store, writes, checks)
            # Queued behind the leader, which has taken its own batch (and so emptied the queue).
            expected = len(callers)
            callers.append(caller)
            caller.thread.start()
            wait_until(lambda: group._leading and len(group._queue) == expected)
            return caller

        yield queue
    finally:
        group.lock.release()
        for caller in callers:
            caller.thread.join(WAIT_S)


def test_concurrent_commits_share_one_transaction(tmp_path: Path) -> None:
    store = SqliteKVStore(tmp_path / "kv.sqlite3")
    try:
        before = store.group_commit_stats
        with _one_batch(store) as queue:
            callers = [queue([Put("s", f"k{i}", bytes([i]))], []) for i in range(16)]
        assert [c.error for c in callers] == [None] * 16
        after = store.group_commit_stats
        # The leader alone, then the 15 that queued behind it: two fsyncs for 16 commits.
        assert (after.commits - before.commits, after.batches - before.batches) == (16, 2)
        assert store.scan("s") == sorted((f"k{i}", bytes([i])) for i in range(16))
    finally:
        store.close()


@pytest.mark.parametrize("savepoints", [False, True], ids=["merged", "savepoint-per-commit"])
def test_a_failed_check_in_a_batch_fails_only_its_own_commit(
    tmp_path: Path, savepoints: bool
) -> None:
    """Each commit's checks see the database plus the accepted commits before it in the batch.

    A ``DeleteSpace`` in the batch sends it down the savepoint-per-commit path;
    both paths must give the same outcomes.
    """
    store = SqliteKVStore(tmp_path / "kv.sqlite3")
    try:
        store.commit([Put("other", "x", b"1")])
        before = store.group_commit_stats
        with _one_batch(store) as queue:
            leader = queue([Put("s", "a", b"1")], [])
            batch: list[tuple[list[Write], list[Check]]] = [
                ([Put("s", "b", b"1")], [Check("s", "a", b"1")]),  # stored value: ok
                ([Put("s", "c", b"1")], [Check("s", "a", b"0")]),  # stale: fails
                ([Put("s", "b", b"2")], [Check("s", "b", b"1")]),  # sees the first write: ok
                ([Put("s", "d", b"1")], [Check("s", "b", None)]),  # b exists by now: fails
                # c was never written (its commit failed): ok
                ([Delete("s", "a"), Put("s", "e", b"1")], [Check("s", "c", None)]),
            ]
            if savepoints:
                batch.insert(0, ([DeleteSpace("other")], []))
            callers = [queue(writes, checks) for writes, checks in batch]
        assert leader.error is None
        outcomes = [type(c.error).__name__ if c.error else "ok" for c in callers]
        expected = ["ok", "ConflictError", "ok", "ConflictError", "ok"]
        assert outcomes == (["ok", *expected] if savepoints else expected)
        assert store.scan("s") == [("b", b"2"), ("e", b"1")]
        assert store.scan("other") == ([] if savepoints else [("x", b"1")])
        after = store.group_commit_stats
        assert after.batches - before.batches == 2
        assert after.commits - before.commits == 1 + len(batch) - 2
    finally:
        store.close()


def test_a_lone_failed_check_writes_nothing_and_counts_no_commit(tmp_path: Path) -> None:
    store = SqliteKVStore(tmp_path / "kv.sqlite3")
    try:
        store.commit([Put("s", "k", b"1")])
        before = store.group_commit_stats
        with pytest.raises(ConflictError):
            store.commit([Put("s", "k", b"2"), Put("s", "j", b"2")], [Check("s", "k", None)])
        assert store.group_commit_stats == before
        assert store.scan("s") == [("k", b"1")]
    finally:
        store.close()


_THREADED_CRASH_CHILD = """
import sys, threading
from tiers.backends.base import Check, Put
from tiers.backends.sqlite_kv import SqliteKVStore
store = SqliteKVStore(sys.argv[1])
printing = threading.Lock()

def worker(tid):
    head = None
    seq = 0
    while True:
        value = str(seq).encode()
        store.commit(
            [Put("crash", f"t{tid}:{seq:06d}", value * 50), Put("crash", f"head{tid}", value)],
            [Check("crash", f"head{tid}", head)],
        )
        with printing:
            print(tid, seq, flush=True)
        head = value
        seq += 1

threads = [threading.Thread(target=worker, args=(t,), daemon=True) for t in range(8)]
for t in threads:
    t.start()
with printing:
    print("started", flush=True)
for t in threads:
    t.join()
"""


def test_every_acknowledged_commit_of_many_threads_survives_a_kill(tmp_path: Path) -> None:
    """Eight threads commit in batches; SIGKILL right after acknowledgements loses none of them."""
    path = tmp_path / "kv.sqlite3"
    child = subprocess.Popen(
        [sys.executable, "-c", _THREADED_CRASH_CHILD, str(path)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    acked: dict[int, int] = {}
    lines = 0
    try:
        for line in child.stdout:
            if line.startswith("started"):
                continue
            tid, seq = map(int, line.split())
            acked[tid] = seq
            lines += 1
            if lines == 400:
                break
        else:
            raise AssertionError(
                f"child exited early: {child.stderr.read() if child.stderr else ''}"
            )
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # Lines printed before the kill were acknowledged too. Read them through the same text
    # stream: communicate() reads the pipe itself and would skip the lines it buffered ahead.
    rest = child.stdout.read()
    child.stdout.close()
    if child.stderr is not None:
        child.stderr.close()
    for line in rest.splitlines():
        if line and not line.startswith("started"):
            tid, seq = map(int, line.split())
            acked[tid] = seq
    assert child.returncode == -signal.SIGKILL
    store = SqliteKVStore(path)
    try:
        for tid, last in acked.items():
            (head,) = store.get_many("crash", [f"head{tid}"])
            assert head is not None
            assert int(head) >= last  # every acknowledged commit is there (maybe one more)
            records = store.scan("crash", prefix=f"t{tid}:")
            assert [k for k, _ in records] == [f"t{tid}:{i:06d}" for i in range(int(head) + 1)]
    finally:
        store.close()


def test_a_commit_waits_while_another_writer_holds_the_write_lock(tmp_path: Path) -> None:
    """The write lock is an OS lock on ``<file>-writelock``, honoured by every store on the file."""
    path = tmp_path / "kv.sqlite3"
    store = SqliteKVStore(path)
    fd = os.open(path.with_name(path.name + "-writelock"), os.O_RDONLY)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        caller = _Caller(store, [Put("s", "k", b"v")], [])
        caller.thread.start()
        caller.thread.join(0.2)
        assert caller.thread.is_alive()  # cannot commit while the lock is held elsewhere
        assert store.get_many("s", ["k"]) == [None]
        fcntl.flock(fd, fcntl.LOCK_UN)
        caller.thread.join(WAIT_S)
        assert caller.error is None
        assert store.get_many("s", ["k"]) == [b"v"]
    finally:
        os.close(fd)
        store.close()


def test_opening_and_closing_stores_leaks_no_descriptor(tmp_path: Path) -> None:
    SqliteKVStore(tmp_path / "kv.sqlite3").close()
    before = descriptors_under(tmp_path)
    for _ in range(20):
        store = SqliteKVStore(tmp_path / "kv.sqlite3")
        store.commit([Put("s", "k", b"v")])
        store.close()
    assert descriptors_under(tmp_path) - before < 3


_STEPPING_CHILD = """
import sys
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.task import TaskTier
store = SqliteKVStore(sys.argv[1])
run = TaskTier(store).start_run("u", sys.argv[2])
print("ready", flush=True)
sys.stdin.readline()
for n in range(60):
    run.step("s", lambda n=n: n)
run.complete(sys.argv[2])
store.close()
"""


def test_two_processes_stepping_on_one_file_both_keep_gap_free_histories(tmp_path: Path) -> None:
    path = tmp_path / "kv.sqlite3"
    SqliteKVStore(path).close()
    children = [
        subprocess.Popen(
            [sys.executable, "-c", _STEPPING_CHILD, str(path), f"run-{i}"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            text=True,
        )
        for i in range(2)
    ]
    for child in children:
        assert child.stdout is not None
        assert child.stdout.readline() == "ready\n"
    for child in children:  # both start stepping at once
        assert child.stdin is not None
        child.stdin.write("go\n")
        child.stdin.flush()
    for child in children:
        child.communicate(timeout=120)
        assert child.returncode == 0
    store = SqliteKVStore(path)
    try:
        tasks = TaskTier(store)
        for i in range(2):
            assert [c.output for c in tasks.history(f"run-{i}")] == list(range(60))
            assert tasks.get_run(f"run-{i}").result == f"run-{i}"
    finally:
        store.close()
