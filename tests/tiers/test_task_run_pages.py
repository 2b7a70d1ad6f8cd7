"""Run lists in pages: ``TaskTier.list_runs`` / ``list_resumable`` with ``limit`` and ``after``.

Whole (no ``limit``, no ``after``), a list is what it always was: every run,
oldest first. Paged, it comes in run-id order, a page reads the heads up to its
last run, and walking the pages gives every run once, whatever the filters.
"""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest

from tiers.backends.base import KVStore
from tiers.errors import InvalidInputError, RunNotFoundError
from tiers.models import RunInfo, RunStatus
from tiers.task import TaskTier, _queries


def _walk(list_page: object, limit: int, **filters: object) -> list[RunInfo]:
    """Every page of ``list_page`` (a list_* method), ``limit`` at a time."""
    assert callable(list_page)
    runs: list[RunInfo] = []
    after: str | None = None
    while True:
        page: list[RunInfo] = list_page(limit=limit, after=after, **filters)
        assert len(page) <= limit
        runs += page
        if len(page) < limit:
            return runs
        after = page[-1].run_id


@pytest.fixture
def tasks(kv: KVStore) -> TaskTier:
    tier = TaskTier(kv)
    # Ids that do not sort by creation time: paged order is the id's, whole order the clock's.
    for i, run_id in enumerate(["r-07", "r-03", "r-11", "r-01", "r-05", "r-09", "r-02"]):
        run = tier.start_run("alice" if i % 2 else "bob", run_id)
        if i % 3 == 0:
            run.complete(None)
        else:
            run.release()
    return tier


def test_a_whole_list_is_what_it_was(tasks: TaskTier) -> None:
    runs = tasks.list_runs()
    assert runs == sorted(runs, key=lambda r: (r.created_at, r.run_id))
    assert [r.run_id for r in runs] == ["r-07", "r-03", "r-11", "r-01", "r-05", "r-09", "r-02"]
    assert tasks.list_runs(limit=None, after=None) == runs


@pytest.mark.parametrize("limit", [1, 2, 3, 7, 50])
def test_pages_walk_every_run_once_in_id_order(tasks: TaskTier, limit: int) -> None:
    everything = sorted(tasks.list_runs(), key=lambda r: r.run_id)
    assert _walk(tasks.list_runs, limit) == everything
    for user in ("alice", "bob"):
        mine = [r for r in everything if r.user_id == user]
        assert _walk(tasks.list_runs, limit, user_id=user) == mine
    done = [r for r in everything if r.status is RunStatus.COMPLETED]
    assert _walk(tasks.list_runs, limit, status="completed") == done
    resumable = sorted(tasks.list_resumable(), key=lambda r: r.run_id)
    assert resumable
    assert _walk(tasks.list_resumable, limit) == resumable


def test_after_is_a_position_not_a_run(tasks: TaskTier) -> None:
    assert [r.run_id for r in tasks.list_runs(after="r-05")] == ["r-07", "r-09", "r-11"]
    assert [r.run_id for r in tasks.list_runs(after="r-04", limit=2)] == ["r-05", "r-07"]
    tasks.delete_run("r-05")
    assert [r.run_id for r in tasks.list_runs(after="r-05", limit=1)] == ["r-07"]
    assert tasks.list_runs(after="r-99") == []
    assert tasks.list_runs(limit=0) == []


def test_a_page_reads_the_heads_up_to_its_last_run(
    tasks: TaskTier, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(_queries, "_RUN_CHUNK", 2)  # several scans per page
    everything = sorted(tasks.list_runs(), key=lambda r: r.run_id)
    assert _walk(tasks.list_runs, 3) == everything
    assert _walk(tasks.list_runs, 2, user_id="alice") == [
        r for r in everything if r.user_id == "alice"
    ]
    later = datetime.now(UTC) + timedelta(days=1)
    assert tasks.list_resumable(now=later, limit=10) == sorted(
        tasks.list_resumable(now=later), key=lambda r: r.run_id
    )


@pytest.mark.parametrize(
    ("kwargs", "field"),
    [
        ({"limit": -1}, "limit"),
        ({"limit": True}, "limit"),
        ({"after": "not an id"}, "after"),
        ({"after": ""}, "after"),
    ],
)
def test_a_bad_page_is_refused_naming_its_field(
    tasks: TaskTier, kwargs: dict[str, object], field: str
) -> None:
    for list_page in (tasks.list_runs, tasks.list_resumable):
        with pytest.raises(InvalidInputError) as caught:
            list_page(**kwargs)
        assert caught.value.field == field


def test_the_ledger_is_counted_without_reading_it_whole(
    kv: KVStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = TaskTier(kv)
    run = tasks.start_run("alice", "fx")
    for i in range(7):
        run.effect("send", lambda i=i: {"i": i}, idempotency_key=f"e-{i}")
    monkeypatch.setattr(_queries, "_EFFECT_CHUNK", 3)  # several scans
    assert tasks.count_effects("fx") == len(tasks.effects("fx")) == 7
    assert tasks.count_effects("fx", after_key="e-2") == 4
    assert tasks.count_effects("fx", after_key="e-6") == 0
    assert tasks.count_effects(tasks.start_run("alice", "none").run_id) == 0
    with pytest.raises(RunNotFoundError):
        tasks.count_effects("no-such-run")
