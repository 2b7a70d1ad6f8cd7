"""The bounded-durability mode: commits acknowledged before fsync, flushed before any effect.

What these tests can observe, and what they cannot: a process killed with
SIGKILL loses nothing that reached the OS page cache, so no test short of a
power cut can show that an unflushed commit is at risk. They check instead
the ordering contract the mode rests on: ``flush`` fsyncs the store's WAL
file (observed by recording the real ``os.fsync`` calls), an effect's
function runs only after the fsync that covers its ``EffectInvoked`` record,
plain steps are not fsync'd one by one, the background flusher empties the
backlog, and everything acknowledged before ``force_flush`` returned is there
after the process is killed.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.waiting import wait_until
from tiers.backends.base import Flushable, KVStore
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import InvalidInputError
from tiers.task import EventKind, TaskTier

ROOT = Path(__file__).resolve().parents[2]


class FsyncLog:
    """Records which files the real ``os.fsync`` was called on, in order with other events."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.events: list[str] = []
        real = os.fsync

        def fsync(fd: int) -> None:
            real(fd)
            self.events.append(f"fsync {Path(os.readlink(f'/proc/self/fd/{fd}')).name}")

        monkeypatch.setattr(os, "fsync", fsync)


def test_flush_interval_needs_a_non_durable_store(tmp_path: Path) -> None:
    with pytest.raises(InvalidInputError, match="durable=False"):
        SqliteKVStore(tmp_path / "a.sqlite3", flush_interval=0.1)
    for bad in (0, -1.0, True, "1"):
        with pytest.raises(InvalidInputError, match="flush_interval"):
            SqliteKVStore(tmp_path / "b.sqlite3", durable=False, flush_interval=bad)  # type: ignore[arg-type]


def test_a_durable_store_has_nothing_to_flush(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteKVStore(tmp_path / "kv.sqlite3")
    log = FsyncLog(monkeypatch)
    run = TaskTier(store).start_run("u", "r")
    run.step("s", lambda: 1)
    assert store.unflushed == 0
    run.force_flush()
    assert log.events == []  # SQLite fsyncs itself (synchronous=FULL); flush adds nothing
    store.close()


def test_steps_are_acknowledged_before_fsync_and_force_flush_fsyncs_the_wal(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteKVStore(tmp_path / "kv.sqlite3", durable=False)
    assert isinstance(store, Flushable)
    tasks = TaskTier(store)
    run = tasks.start_run("u", "r")
    log = FsyncLog(monkeypatch)
    for i in range(5):
        run.step("s", lambda i=i: i)
    assert store.unflushed == 6  # the start and five steps, none fsync'd yet
    assert log.events == []
    tasks.force_flush()
    assert store.unflushed == 0
    assert log.events == ["fsync kv.sqlite3-wal"]
    tasks.force_flush()  # nothing new: no second fsync
    assert log.events == ["fsync kv.sqlite3-wal"]
    store.close()


def test_an_effect_runs_only_after_its_invoked_record_is_flushed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    store = SqliteKVStore(tmp_path / "kv.sqlite3", durable=False)
    tasks = TaskTier(store)
    run = tasks.start_run("u", "r")
    run.step("plan", lambda: "p")
    log = FsyncLog(monkeypatch)

    def send() -> str:
        # What is on disk when the effect runs: its EffectInvoked, already fsync'd.
        log.events.append(f"effect (unflushed={store.unflushed})")
        invoked = [e for e in tasks.events("r") if e.kind is EventKind.EFFECT_INVOKED]
        log.events.append(f"invoked records: {len(invoked)}")
        return "sent"

    assert run.effect("send", send) == "sent"
    assert log.events == [
        "fsync kv.sqlite3-wal",
        "effect (unflushed=0)",
        "invoked records: 1",
    ]
    # The EffectRecorded commit after the call is acknowledged without an fsync.
    assert store.unflushed == 1
    store.close()


def test_the_background_flusher_bounds_the_backlog(tmp_path: Path) -> None:
    store = SqliteKVStore(tmp_path / "kv.sqlite3", durable=False, flush_interval=0.01)
    run = TaskTier(store).start_run("u", "r")
    for i in range(20):
        run.step("s", lambda i=i: i)
    wait_until(
        lambda: store.unflushed == 0,
        what=lambda: f"the flusher to empty the backlog ({store.unflushed} unflushed)",
        every_s=0.01,
    )
    store.close()
    assert store.unflushed == 0


def _kv_fixture_is_durable(kv: KVStore) -> bool:
    return not isinstance(kv, Flushable) or getattr(kv, "durable", True)


def test_force_flush_is_a_no_op_on_the_default_stores(kv: KVStore) -> None:
    # SQLite with synchronous=FULL, or Redis (durability is the server's appendfsync).
    assert _kv_fixture_is_durable(kv)
    tasks = TaskTier(kv)
    run = tasks.start_run("u", "r")
    assert run.effect("e", lambda: 1) == 1
    run.force_flush()
    tasks.force_flush()
    assert [c.output for c in tasks.history("r")] == [1]


CHILD = textwrap.dedent(
    """
    import sys, time
    from tiers.backends.sqlite_kv import SqliteKVStore
    from tiers.task import TaskTier

    store = SqliteKVStore(sys.argv[1], durable=False)
    tasks = TaskTier(store)
    run = tasks.start_run("u", "r")
    for i in range(int(sys.argv[2])):
        run.step("s", lambda i=i: i)
    tasks.force_flush()
    print("flushed", store.unflushed, flush=True)
    time.sleep(60)
    """
)


def test_everything_acknowledged_before_force_flush_survives_sigkill(tmp_path: Path) -> None:
    """The child flushes, reports, and is killed before it could close the store.

    This shows the acknowledged steps outlive the process; that they also
    outlive a power cut rests on the fsync the tests above observe.
    """
    path = tmp_path / "kv.sqlite3"
    child = subprocess.Popen(
        [sys.executable, "-c", CHILD, str(path), "40"],
        stdout=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )
    try:
        assert child.stdout is not None
        assert child.stdout.readline().split() == ["flushed", "0"]
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait(30)
    assert child.returncode == -signal.SIGKILL
    store = SqliteKVStore(path)
    assert [c.output for c in TaskTier(store).history("r")] == list(range(40))
    store.close()
