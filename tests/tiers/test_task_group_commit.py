"""Group commit of the SQLite store under concurrent task runs: one fsync, separate outcomes."""

from __future__ import annotations

import threading
from collections import Counter
from pathlib import Path

from tiers.backends.base import Check, Put
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import ConflictError
from tiers.task import TaskTier


def test_concurrent_commits_keep_each_ones_checks_and_writes(tmp_path: Path) -> None:
    """Threads race compare-and-set increments on one shared key and on keys of their own.

    Batched into shared transactions, a failed check must undo exactly its own
    commit's writes: every acknowledged increment of the shared key is there
    once, and every thread's private counter matches its acknowledged commits.
    """
    store = SqliteKVStore(tmp_path / "kv.sqlite3")
    threads, rounds = 16, 40
    wins: Counter[int] = Counter()
    conflicts: Counter[int] = Counter()
    barrier = threading.Barrier(threads, timeout=60)
    errors: list[BaseException] = []

    def worker(tid: int) -> None:
        try:
            barrier.wait()
            mine = 0
            for _ in range(rounds):
                (shared,) = store.get_many("s", ["shared"])
                value = int(shared or b"0")
                try:
                    store.commit(
                        [
                            Put("s", "shared", str(value + 1).encode()),
                            Put("s", f"mine-{tid}", str(mine + 1).encode()),
                        ],
                        [Check("s", "shared", shared), Check("s", f"mine-{tid}", _enc(mine))],
                    )
                except ConflictError:
                    conflicts[tid] += 1
                    continue
                mine += 1
                wins[tid] += 1
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(t,)) for t in range(threads)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == []
    assert sum(wins.values()) + sum(conflicts.values()) == threads * rounds
    assert sum(conflicts.values()) > 0  # the shared key was contended
    (shared,) = store.get_many("s", ["shared"])
    assert int(shared or b"0") == sum(wins.values())
    for tid in range(threads):
        (mine,) = store.get_many("s", [f"mine-{tid}"])
        assert int(mine or b"0") == wins[tid]
    store.close()


def _enc(n: int) -> bytes | None:
    return None if n == 0 else str(n).encode()


def test_sixteen_concurrent_runs_have_gap_free_histories(tmp_path: Path) -> None:
    store = SqliteKVStore(tmp_path / "kv.sqlite3")
    tasks = TaskTier(store)
    errors: list[BaseException] = []

    def worker(i: int) -> None:
        try:
            run = tasks.start_run("u", f"run-{i}")
            for n in range(25):
                run.step("s", lambda n=n: {"i": i, "n": n})
            run.complete(i)
        except BaseException as exc:
            errors.append(exc)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(16)]
    for t in pool:
        t.start()
    for t in pool:
        t.join()
    assert errors == []
    for i in range(16):
        history = tasks.history(f"run-{i}")
        assert [c.seq for c in history] == list(range(1, 26))
        assert [c.output for c in history] == [{"i": i, "n": n} for n in range(25)]
        assert tasks.get_run(f"run-{i}").result == i
    store.close()
