"""A store written by the previous release opens, migrates to layout 2 and resumes its runs.

The store (``tests/data/task_store_v1.json``) was written by the release before
task layout versions; it is loaded byte for byte into each backend. Its runs:
``r-done`` (completed, compacted), ``r-mid`` (released, with an effect, state
and a scope), ``r-fork`` (forked from it), ``r-edited`` (a state edit),
``r-leased`` (held by a worker without a lease TTL) and, in tenant ``acme``,
``r-acme`` (released).
"""

from __future__ import annotations

from datetime import datetime, timedelta
from typing import Any

import pytest

from tiers import keys
from tiers.backends.base import KVStore
from tiers.errors import InvalidInputError, StaleWriterError
from tiers.task import (
    LATEST_LAYOUT,
    EventKind,
    TaskTier,
    layout_version,
    migrate_layout,
    pin_layout,
)
from tiers.task._records import decode_stored_checkpoint

from .v1_store import V1_WRITTEN_AT, dump, load_v1_store, v1_rows

RUNS = ["r-done", "r-edited", "r-fork", "r-leased", "r-mid"]


class Clock:
    """A UTC clock a minute after the v1 store was written, a millisecond more per call."""

    def __init__(self) -> None:
        self.now = V1_WRITTEN_AT + timedelta(minutes=1)

    def __call__(self) -> datetime:
        self.now += timedelta(milliseconds=1)
        return self.now


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def v1(kv: KVStore) -> KVStore:
    load_v1_store(kv)
    return kv


def view(tasks: TaskTier, run_id: str) -> dict[str, Any]:
    """Everything a reader sees of a run."""
    history = tasks.history(run_id)
    return {
        "head": tasks.get_run(run_id),
        "history": history,
        "events": tasks.events(run_id),
        "effects": tasks.effects(run_id),
        "rebuilt": tasks.rebuild(run_id),
        "states": [tasks.state_at(run_id, c.checkpoint_id) for c in history],
        "scope": tasks.latest_scope(run_id),
        "keys": [tasks.checkpoint_for_key(run_id, c.idempotency_key) for c in history],
    }


def check_log(tasks: TaskTier, run_id: str) -> None:
    """The run's event log is gap-free up to its head, and its fold is the head."""
    info = tasks.get_run(run_id)
    events = tasks.events(run_id)
    assert [e.seq for e in events] == list(range(info.compacted_through + 1, info.event_seq + 1))
    rebuilt = tasks.rebuild(run_id)
    assert (rebuilt.status, rebuilt.head_seq, rebuilt.head_checkpoint_id) == (
        info.status,
        info.head_seq,
        info.head_checkpoint_id,
    )
    assert (rebuilt.spent_tokens, rebuilt.event_seq) == (info.spent_tokens, info.event_seq)
    for size in (1, 2, 3):  # every page agrees with the whole log
        paged, after = [], 0
        while page := tasks.events(run_id, after_seq=after, limit=size):
            paged += page
            after = page[-1].seq
        assert paged == events


def test_the_v1_store_reads_the_same_before_and_after_migration(v1: KVStore, clock: Clock) -> None:
    spaces = {space for space, _, _ in v1_rows()}
    stored = dump(v1, spaces)
    tasks = TaskTier(v1, clock=clock)
    before = {run_id: view(tasks, run_id) for run_id in RUNS}
    assert layout_version(v1, "default") == 1  # no format record: the previous release's

    report = migrate_layout(v1, "default", clock(), force=True)
    assert (report.before, report.after, report.changed) == (1, LATEST_LAYOUT, True)
    assert report.runs == len(RUNS)
    assert sorted(report.unfinished) == ["r-edited", "r-fork", "r-leased", "r-mid"]

    # No record was rewritten: the migration only wrote the tenant's format record.
    assert dump(v1, spaces) == stored
    assert layout_version(v1, "default") == LATEST_LAYOUT
    again = TaskTier(v1, clock=clock)
    assert {run_id: view(again, run_id) for run_id in RUNS} == before
    for run_id in RUNS:
        check_log(again, run_id)


def test_migrate_is_a_dry_run_refuses_live_leases_and_is_idempotent(
    v1: KVStore, clock: Clock
) -> None:
    dry = migrate_layout(v1, "default", clock(), dry_run=True)
    assert (dry.before, dry.after, dry.changed, dry.leased) == (1, 1, False, ["r-leased"])
    refused = migrate_layout(v1, "default", clock())
    assert refused.refused is not None
    assert "r-leased" in refused.refused
    assert not refused.changed
    assert layout_version(v1, "default") == 1
    # acme has no live lease: it migrates on its own, default is untouched.
    acme = migrate_layout(v1, "acme", clock())
    assert (acme.before, acme.after, acme.changed) == (1, LATEST_LAYOUT, True)
    assert layout_version(v1, "default") == 1
    forced = migrate_layout(v1, "default", clock(), force=True)
    assert forced.changed
    done = migrate_layout(v1, "default", clock(), force=True)
    assert (done.before, done.after, done.changed) == (LATEST_LAYOUT, LATEST_LAYOUT, False)


def test_a_store_with_runs_in_flight_keeps_writing_layout_1_until_migrated(
    v1: KVStore, clock: Clock
) -> None:
    tasks = TaskTier(v1, clock=clock)
    run = tasks.start_run("alice", "r-mid", worker_id="w-new")
    assert run.step("plan", lambda: "never") == "p"  # replayed
    run.step("ship", lambda: "shipped")
    space = keys.run_space("default", "r-mid")
    info = tasks.get_run("r-mid")
    events = dict(v1.scan(space, prefix=keys.EVENT_PREFIX))
    assert keys.event_key(info.event_seq) in events  # its StepCommitted has a row: layout 1
    assert layout_version(v1, "default") == 1
    check_log(tasks, "r-mid")


def test_migrated_runs_resume_exactly_once_on_layout_2(v1: KVStore, clock: Clock) -> None:
    migrate_layout(v1, "default", clock(), force=True)
    tasks = TaskTier(v1, clock=clock)
    history = tasks.history("r-mid")
    paid: list[int] = []
    run = tasks.start_run("alice", "r-mid", worker_id="w-new")
    # The committed steps and the effect replay by key; nothing runs again.
    assert run.step("plan", lambda: "again") == "p"
    assert run.effect("pay", lambda: paid.append(1), input={"amount": 5}) == {"paid": 5}
    assert run.step("draft", lambda: "again") == "d"
    assert run.step("review", lambda: "again") == "r"
    assert run.step("polish", lambda: "again") == "pol"
    assert paid == []
    shipped = run.step("ship", lambda: "shipped")
    assert shipped == "shipped"
    run.effect("notify", lambda: paid.append(2), idempotency_key="notify-1")
    run.effect("notify", lambda: paid.append(3), idempotency_key="notify-1")  # recorded
    assert paid == [2]
    run.complete("ok")

    info = tasks.get_run("r-mid")
    space = keys.run_space("default", "r-mid")
    ship = tasks.history("r-mid")[len(history)]
    stored = dict(v1.scan(space))
    # Layout 2: the new StepCommitted events live in their checkpoints, not in rows.
    assert ship.event_seq is not None
    assert keys.event_key(ship.event_seq) not in stored
    _, commit_epoch = decode_stored_checkpoint(stored[keys.checkpoint_key(ship.seq)], where="x")
    assert commit_epoch == info.lease_epoch
    assert tasks.history("r-mid")[: len(history)] == history  # the v1 checkpoints, unchanged
    step_events = [e for e in tasks.events("r-mid") if e.kind is EventKind.STEP_COMMITTED]
    assert [e.data["step"] for e in step_events] == [
        "plan", "pay", "draft", "review", "polish", "ship", "notify",
    ]  # fmt: skip
    assert step_events[-2].epoch == info.lease_epoch
    assert tasks.state_at("r-mid", ship.checkpoint_id) == {"k": 2, "draft": "v1"}
    check_log(tasks, "r-mid")

    # A fork of the mixed run, at an old and at a new checkpoint, reads as its source.
    tasks.fork("r-mid", history[2].checkpoint_id, "r-fork-old")
    tasks.fork("r-mid", ship.checkpoint_id, "r-fork-new")
    assert [c.output for c in tasks.history("r-fork-new")] == [
        c.output for c in tasks.history("r-mid")[: ship.seq]
    ]
    assert tasks.state_at("r-fork-old", tasks.history("r-fork-old")[-1].checkpoint_id) == (
        tasks.state_at("r-mid", history[2].checkpoint_id)
    )
    for run_id in ("r-fork-old", "r-fork-new"):
        check_log(tasks, run_id)


def test_the_old_release_worker_is_fenced_and_its_run_resumes(v1: KVStore, clock: Clock) -> None:
    migrate_layout(v1, "default", clock(), force=True)
    tasks = TaskTier(v1, clock=clock)
    stale = tasks.attach("r-leased", 1)  # what the old worker held
    run = tasks.start_run("bob", "r-leased", worker_id="w-new", steal=True)
    called: list[int] = []
    with pytest.raises(StaleWriterError):
        stale.step("late", lambda: called.append(1), idempotency_key="late")
    assert called == []
    assert run.step("one", lambda: called.append(1)) == 1
    run.step("two", lambda: 2)
    assert called == []
    check_log(tasks, "r-leased")


def test_a_state_edit_and_compaction_after_migration(v1: KVStore, clock: Clock) -> None:
    migrate_layout(v1, "default", clock(), force=True)
    tasks = TaskTier(v1, clock=clock, snapshot_every=3)
    run = tasks.start_run("bob", "r-edited", worker_id="w-new")
    for name in ("d", "e", "f", "g"):
        run.step(name, lambda name=name: name)
    run.release()
    first = tasks.history("r-edited")[0]
    tasks.update_state("r-edited", first.checkpoint_id, {"again": 2})
    head = tasks.get_run("r-edited").head_checkpoint_id
    assert head is not None
    # The edit branches from the first checkpoint: the earlier edit is off the lineage.
    assert tasks.state_at("r-edited", head) == {"a": True, "again": 2}
    check_log(tasks, "r-edited")
    assert tasks.compact("r-edited") > 0
    check_log(tasks, "r-edited")


def test_a_tenant_with_nothing_in_flight_moves_on_open(v1: KVStore, clock: Clock) -> None:
    fresh = TaskTier(v1, tenant="fresh", clock=clock)
    run = fresh.start_run("u", "r1")
    assert layout_version(v1, "fresh") == LATEST_LAYOUT  # stamped with the first take
    run.step("s", lambda: 1)
    assert keys.event_key(2) not in dict(v1.scan(keys.run_space("fresh", "r1")))
    check_log(fresh, "r1")
    # The v1 tenants with runs in flight stay where they are.
    assert layout_version(v1, "default") == 1
    assert layout_version(v1, "acme") == 1


def test_a_pinned_tenant_stays_on_its_layout_until_migrated(kv: KVStore, clock: Clock) -> None:
    assert pin_layout(kv, "default", 1, clock())  # e.g. while previous-release workers run
    assert not pin_layout(kv, "default", 1, clock())
    tasks = TaskTier(kv, clock=clock)
    run = tasks.start_run("u", "r1")  # nothing in flight, but the pin holds
    run.step("s", lambda: 1)
    assert keys.event_key(2) in dict(kv.scan(keys.run_space("default", "r1")))
    assert layout_version(kv, "default") == 1
    run.complete()
    assert migrate_layout(kv, "default", clock()).changed
    tasks = TaskTier(kv, clock=clock)
    again = tasks.start_run("u", "r2")
    again.step("s", lambda: 1)
    assert keys.event_key(2) not in dict(kv.scan(keys.run_space("default", "r2")))
    check_log(tasks, "r1")
    check_log(tasks, "r2")
    with pytest.raises(InvalidInputError, match="layout version 3 is unknown"):
        pin_layout(kv, "default", 3, clock())
