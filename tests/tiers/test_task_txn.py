"""The task tier's transaction builder and run state machine, without a store."""

from __future__ import annotations

import pytest

import tiers.task
from tiers.backends.base import KVStore
from tiers.errors import RunStateError
from tiers.models import RunInfo, RunStatus, utcnow
from tiers.task import TaskTier
from tiers.task._lifecycle import TRANSITIONS, lifecycle_table
from tiers.task._records import EventKind
from tiers.task._txn import Txn


def _txn(status: RunStatus = RunStatus.RUNNING) -> Txn:
    return Txn("r1", 1, RunInfo(run_id="r1", user_id="u", status=status), utcnow())


def test_an_unknown_head_field_raises_where_it_is_set() -> None:
    txn = _txn()
    txn.update.lease_owner = "w1"
    misspelled = "lease_ownr"  # an old dict update dropped it without a word
    with pytest.raises(ValueError, match="lease_ownr"):
        setattr(txn.update, misspelled, "w2")
    assert txn.head().lease_owner == "w1"


def test_only_the_fields_set_change_the_head() -> None:
    txn = _txn()
    txn.update.spent_tokens = 5
    head = txn.head()
    assert (head.spent_tokens, head.head_seq, head.lease_owner) == (5, 0, None)


def test_the_status_moves_only_with_events() -> None:
    txn = _txn(RunStatus.RESUMABLE)
    field = "status"  # not a field a transaction sets: events move it
    with pytest.raises(ValueError, match="status"):
        setattr(txn.update, field, RunStatus.COMPLETED)
    txn.add_event(EventKind.STEP_COMMITTED, seq=1)
    assert txn.head().status is RunStatus.RUNNING
    txn.add_event(EventKind.RUN_COMPLETED)
    assert txn.head().status is RunStatus.COMPLETED


def test_an_illegal_transition_raises_run_state_error() -> None:
    txn = _txn(RunStatus.COMPLETED)
    with pytest.raises(RunStateError, match="RunCancelled"):
        txn.add_event(EventKind.RUN_CANCELLED)
    assert txn.events == []


def test_an_operators_effect_decision_does_not_resume_the_run() -> None:
    txn = _txn(RunStatus.RESUMABLE)
    txn.add_event(EventKind.EFFECT_NOT_DONE, key="k", source="operator")
    assert txn.status is RunStatus.RESUMABLE


def test_every_event_kind_is_in_the_table_and_the_docs_quote_it() -> None:
    assert set(TRANSITIONS) == set(EventKind)
    table = lifecycle_table().splitlines()
    assert table[0].split() == ["event", *(status.value for status in RunStatus)]
    assert len(table) == 1 + len(EventKind)
    cancelled = table[-2].split()
    assert cancelled == ["RunCancelled", "cancelled", "cancelled", "-", "-", "-", "cancelled"]
    # The package's docstring quotes the table as it is printed.
    assert all(f"    {line}" in (tiers.task.__doc__ or "") for line in table)


def test_a_released_run_released_again_stays_resumable_as_rebuild_says(kv: KVStore) -> None:
    tasks = TaskTier(kv)
    run = tasks.start_run("u", "r1")
    run.release()
    # A stateless caller attached with the epoch it kept releases the run once more.
    tasks.attach("r1", run.epoch).release()
    assert tasks.get_run("r1").status is RunStatus.RESUMABLE
    assert tasks.rebuild("r1").status is RunStatus.RESUMABLE
