"""Dry-run replay (``Memory.plan_resume``): what a resume would do, and not one byte written."""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator
from pathlib import Path

import pytest

from memory import Memory
from memory.settings import Settings
from tiers.errors import ApprovalPendingError, RunNotFoundError
from tiers.models import RunStatus


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    mem = Memory.from_settings(Settings(data_dir=tmp_path / "data"))
    yield mem
    mem.close()


def _rows(path: Path) -> list[tuple[object, ...]]:
    """Every row of every table of the SQLite store, read beside the open memory."""
    with sqlite3.connect(path) as db:
        tables = [r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
        return [
            (table, *row)
            for table in sorted(tables)
            for row in db.execute(f"SELECT * FROM {table} ORDER BY 1, 2")
        ]


def test_a_dry_run_reports_the_resume_and_writes_nothing(memory: Memory, tmp_path: Path) -> None:
    run = memory.start_run("alice", "r1", lease_ttl=60, budget_tokens=100)
    run.step("plan", lambda: {"secret plan": 1})
    run.effect("charge", lambda: {"charged": "secret receipt"}, idempotency_key="charge-1")
    run.begin_effect("ship", idempotency_key="ship-1")  # invoked, never recorded
    with pytest.raises(ApprovalPendingError):
        run.await_approval({"refund": "secret"}, key="refund")

    store = tmp_path / "data" / "tiermem.sqlite3"
    memory.force_flush()
    before = _rows(store)
    assert len(before) > 10  # the run's head, checkpoints, events, ledger, gate
    plan = memory.plan_resume("r1")
    assert _rows(store) == before  # nothing written, not even a lease or an event

    assert plan.status is RunStatus.PAUSED
    assert not plan.resumable
    assert [r.step for r in plan.replays] == ["plan", "charge"]
    assert plan.last_seq == plan.replays[-1].seq
    assert plan.last_checkpoint_id
    assert plan.replays[-1].idempotency_key == "charge-1"
    assert plan.recorded_effects == ["charge-1"]
    assert [(e.key, e.reconcile) for e in plan.unknown_effects] == [("ship-1", "probe")]
    assert (plan.approval_key, plan.approval_status) == ("refund", "requested")
    assert plan.lease_live
    assert plan.lease_owner == run.worker_id
    assert plan.lease_expires_at is not None
    assert plan.lease_epoch == 1
    assert plan.budget_tokens_left == 100
    assert plan.budget_cost_left is None
    assert "secret" not in plan.model_dump_json()  # names and keys, never content


def test_a_dry_run_of_an_absent_run_is_not_found(memory: Memory) -> None:
    with pytest.raises(RunNotFoundError):
        memory.plan_resume("nope")
