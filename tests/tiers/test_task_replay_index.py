"""A resumed handle reads the run's idempotency index once, then skips each step's lookup.

What it must never do: run a step again whose key is committed. These cases
check the known-keys shortcut against everything that can commit a key behind
the handle's back: the previous worker, an attached handle of the same lease,
a state edit (a superseded branch), and runs too long to read the index at once.
"""

from __future__ import annotations

import pytest

from tiers.backends.base import KVStore
from tiers.task import TaskTier
from tiers.task import _store as task_store


@pytest.fixture
def tasks(kv: KVStore) -> TaskTier:
    return TaskTier(kv)


def test_a_resumed_handle_replays_what_the_previous_worker_committed(tasks: TaskTier) -> None:
    first = tasks.start_run("u", "r1")
    for name in ("a", "b", "c"):
        first.step(name, lambda name=name: name)
    ran: list[str] = []
    resumed = tasks.start_run("u", "r1")
    for name in ("a", "b", "c", "d"):
        assert resumed.step(name, lambda name=name: ran.append(name) or "new") in (name, "new")
    assert ran == ["d"]
    assert resumed.step("x", lambda: 1, idempotency_key="b-key") == 1
    assert resumed.step("x", lambda: 2, idempotency_key="b-key") == 1  # its own, replayed


@pytest.mark.parametrize("limit", [0, 2])
def test_a_run_longer_than_the_limit_reads_each_entry(
    tasks: TaskTier, monkeypatch: pytest.MonkeyPatch, limit: int
) -> None:
    monkeypatch.setattr(task_store, "INDEX_LOAD_LIMIT", limit)
    first = tasks.start_run("u", "r1")
    for name in ("a", "b", "c"):
        first.step(name, lambda name=name: name)
    ran: list[str] = []
    resumed = tasks.start_run("u", "r1")
    for name in ("a", "b", "c", "d"):
        resumed.step(name, lambda name=name: ran.append(name))
    assert ran == ["d"]


def test_a_key_an_attached_handle_commits_is_replayed(tasks: TaskTier) -> None:
    tasks.start_run("u", "r1").step("a", lambda: "a")
    resumed = tasks.start_run("u", "r1")
    assert resumed.step("a", lambda: "again") == "a"  # the index is read now
    info = tasks.get_run("r1")
    attached = tasks.attach("r1", info.lease_epoch)
    assert attached.step("other", lambda: "theirs", idempotency_key="k") == "theirs"
    assert resumed.step("other", lambda: "mine", idempotency_key="k") == "theirs"


def test_a_state_edit_runs_the_superseded_steps_again(tasks: TaskTier) -> None:
    first = tasks.start_run("u", "r1")
    for name in ("a", "b"):
        first.step(name, lambda name=name: name)
    first.release()
    root = tasks.history("r1")[0].checkpoint_id
    tasks.update_state("r1", root, {"edited": True})
    # b's key is still in the index, on the branch the edit superseded: it runs again.
    resumed = tasks.start_run("u", "r1")
    assert resumed.step("a", lambda: "again") == "a"  # the index is read now
    assert resumed.step("b", lambda: "b2") == "b2"
    assert resumed.step("b", lambda: "b3", idempotency_key="r1/b/0") == "b2"
