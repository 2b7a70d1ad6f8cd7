"""A step trusts its handle's held head for ``head_fresh_ms``: what a change by another writer does then.

The worker's tier gives a window far longer than any step takes (every step
below is inside it unless the test says otherwise); the other writer is a
second :class:`TaskTier` on the same store, as another process would be. A
change it makes inside the window is found by the step's commit: the step is
refused with the error a read before its function would have raised and
nothing is stored, but the function has run once. Outside the window (or
with a window of 0) the function does not run. A change made through the
worker's own tier is seen at once, window or not. ``append_checkpoint`` trusts
the same window; it has no function to run, so a change inside the window only
moves its refusal from a read before the commit to the commit.
"""

from __future__ import annotations

import time
import uuid

import pytest

from tests.live_objects import holders
from tiers import keys
from tiers.backends.base import KVStore
from tiers.backends.encrypted_kv import EncryptedKVStore, MasterKey
from tiers.errors import (
    BudgetExceededError,
    InvalidInputError,
    RunCancelledError,
    RunNotFoundError,
    StaleWriterError,
)
from tiers.models import RunStatus
from tiers.task import Charged, RunHandle, TaskTier

TENANT = "default"
WINDOW_MS = 60_000


class Calls:
    """Counts the calls of the step functions it makes."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, output: object) -> object:
        self.count += 1
        return output


def stored(kv: KVStore, run_id: str) -> tuple[bytes | None, list[tuple[str, bytes]]]:
    """A run's head and every row of its space."""
    (head,) = kv.get_many(keys.runs_space(TENANT), [run_id])
    return head, kv.scan(keys.run_space(TENANT, run_id))


@pytest.fixture
def worker(kv: KVStore) -> TaskTier:
    return TaskTier(kv, head_fresh_ms=WINDOW_MS)


@pytest.fixture
def other(kv: KVStore) -> TaskTier:
    return TaskTier(kv)


def started(worker: TaskTier, budget_tokens: int | None = None) -> RunHandle:
    run = worker.start_run("u", "r1", budget_tokens=budget_tokens)
    run.step("one", lambda: 1)
    return run


def outside_the_window(run: RunHandle, how: str) -> None:
    """Make the handle's next step read the head first: no window, or after it passed."""
    if how == "no-window":
        run.head_fresh_ms = 0
    else:
        run.head_fresh_ms = 1
        time.sleep(0.01)  # the head the handle holds is older than its 1 ms window


# -- inside the window: refused at the commit, nothing stored -----------------------


def test_a_cancel_inside_the_window_refuses_the_step_at_its_commit(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = started(worker)
    other.cancel("r1")
    before = stored(kv, "r1")
    calls = Calls()
    with pytest.raises(RunCancelledError):
        run.step("two", lambda: calls(2))
    assert calls.count == 1  # the bound: the function ran once, on a head it did not re-read
    assert stored(kv, "r1") == before
    assert worker.get_run("r1").status is RunStatus.CANCELLED
    with pytest.raises(RunCancelledError):  # and the head the handle holds is now fresh
        run.step("two", lambda: calls(2))
    assert calls.count == 1


def test_a_takeover_inside_the_window_fences_the_step_at_its_commit(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = started(worker)
    taker = other.start_run("u", "r1")
    assert taker.epoch == run.epoch + 1
    before = stored(kv, "r1")
    calls = Calls()
    with pytest.raises(StaleWriterError):
        run.step("two", lambda: calls(2))
    assert calls.count == 1
    assert stored(kv, "r1") == before
    assert taker.step("two", lambda: 22) == 22


def test_a_budget_spent_by_another_writer_inside_the_window_refuses_the_step(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = started(worker, budget_tokens=100)
    attached = other.attach("r1", run.epoch)
    attached.step("spend", lambda: Charged("x", tokens=100))
    before = stored(kv, "r1")
    calls = Calls()
    with pytest.raises(BudgetExceededError, match="100 of 100 tokens"):
        run.step("two", lambda: Charged(calls(2), tokens=5))
    assert calls.count == 1
    assert stored(kv, "r1") == before
    assert worker.get_run("r1").spent_tokens == 100


def test_a_budget_lowered_by_another_tier_inside_the_window_refuses_the_step(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = worker.start_run("u", "r1", budget_tokens=100)
    run.step("one", lambda: Charged(1, tokens=50))
    other.set_budget("r1", tokens=50)
    before = stored(kv, "r1")
    calls = Calls()
    with pytest.raises(BudgetExceededError):
        run.step("two", lambda: calls(2))
    assert calls.count == 1
    assert stored(kv, "r1") == before


def test_a_delete_inside_the_window_refuses_the_step_and_does_not_recreate_the_run(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = started(worker)
    assert other.delete_run("r1")
    with pytest.raises(RunNotFoundError):
        run.step("two", lambda: 2)
    assert stored(kv, "r1") == (None, [])


def test_a_step_committed_meanwhile_by_another_user_of_the_lease_is_replayed(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = started(worker)
    other.attach("r1", run.epoch).step("two", lambda: "theirs")
    calls = Calls()
    assert run.step("two", lambda: calls("mine")) == "theirs"
    assert calls.count == 1
    assert [c.output for c in worker.history("r1")] == [1, "theirs"]
    assert run.step("three", lambda: 3) == 3  # the occurrence counted: a new key


def test_a_change_that_still_allows_the_step_keeps_its_output(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = started(worker, budget_tokens=100)
    other.set_budget("r1", tokens=1000)
    assert run.step("two", lambda: Charged(2, tokens=5)) == 2
    info = worker.get_run("r1")
    assert (info.head_seq, info.spent_tokens, info.budget_tokens) == (2, 5, 1000)


def test_an_effect_reads_the_head_first_whatever_the_window(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = started(worker)
    other.cancel("r1")
    sent: list[str] = []
    with pytest.raises(RunCancelledError):
        run.effect("pay", lambda: sent.append("top-level"), idempotency_key="p1")
    assert sent == []


def test_an_effect_inside_a_step_on_a_cancelled_run_is_not_invoked(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = started(worker)
    other.cancel("r1")
    before = stored(kv, "r1")
    sent: list[str] = []
    calls = Calls()

    def step() -> object:
        calls(None)
        return run.effect("pay", lambda: sent.append("in a step"), idempotency_key="p1")

    with pytest.raises(RunCancelledError):
        run.step("two", step)
    assert (calls.count, sent) == (1, [])  # the step's function ran; its effect did not
    assert stored(kv, "r1") == before


# -- a refusal is never decided on a trusted head alone -----------------------------


def test_a_budget_raised_by_another_tier_lets_the_refused_handle_step_again(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = worker.start_run("u", "r1", budget_tokens=10)
    run.step("one", lambda: Charged(1, tokens=10))
    other.set_budget("r1", tokens=1000)  # the head the handle holds still says spent
    assert run.step("two", lambda: 2) == 2


# -- outside the window (or none): refused before the function runs -----------------


@pytest.mark.parametrize("how", ["no-window", "window-passed"])
def test_outside_the_window_a_cancel_refuses_before_the_function_runs(
    kv: KVStore, worker: TaskTier, other: TaskTier, how: str
) -> None:
    run = started(worker)
    other.cancel("r1")
    outside_the_window(run, how)
    calls = Calls()
    with pytest.raises(RunCancelledError):
        run.step("two", lambda: calls(2))
    assert calls.count == 0


@pytest.mark.parametrize("how", ["no-window", "window-passed"])
def test_outside_the_window_a_takeover_fences_before_the_function_runs(
    kv: KVStore, worker: TaskTier, other: TaskTier, how: str
) -> None:
    run = started(worker)
    other.start_run("u", "r1")
    outside_the_window(run, how)
    calls = Calls()
    with pytest.raises(StaleWriterError):
        run.step("two", lambda: calls(2))
    assert calls.count == 0


@pytest.mark.parametrize("how", ["no-window", "window-passed"])
def test_outside_the_window_a_spent_budget_refuses_before_the_function_runs(
    kv: KVStore, worker: TaskTier, other: TaskTier, how: str
) -> None:
    run = worker.start_run("u", "r1", budget_tokens=100)
    run.step("one", lambda: Charged(1, tokens=50))
    other.set_budget("r1", tokens=50)
    outside_the_window(run, how)
    calls = Calls()
    with pytest.raises(BudgetExceededError):
        run.step("two", lambda: calls(2))
    assert calls.count == 0


def test_a_tier_with_no_window_reads_before_every_step(kv: KVStore, other: TaskTier) -> None:
    tasks = TaskTier(kv, head_fresh_ms=0)
    run = tasks.start_run("u", "r1")
    run.step("one", lambda: 1)
    other.cancel("r1")
    calls = Calls()
    with pytest.raises(RunCancelledError):
        run.step("two", lambda: calls(2))
    assert calls.count == 0


# -- a change through the worker's own tier is seen at once -------------------------


def test_a_cancel_through_the_same_tier_refuses_before_the_function_runs(
    worker: TaskTier,
) -> None:
    run = started(worker)
    worker.cancel("r1")
    calls = Calls()
    with pytest.raises(RunCancelledError):
        run.step("two", lambda: calls(2))
    assert calls.count == 0


def test_a_takeover_through_the_same_tier_fences_before_the_function_runs(
    worker: TaskTier,
) -> None:
    run = started(worker)
    worker.start_run("u", "r1")
    calls = Calls()
    with pytest.raises(StaleWriterError):
        run.step("two", lambda: calls(2))
    assert calls.count == 0


# -- append_checkpoint: the same window, the same refusals ---------------------------


def test_a_cancel_inside_the_window_refuses_an_appended_checkpoint_at_its_commit(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = started(worker)
    other.cancel("r1")
    before = stored(kv, "r1")
    with pytest.raises(RunCancelledError):
        run.append_checkpoint("two", 2)
    assert stored(kv, "r1") == before
    with pytest.raises(RunCancelledError):  # decided on the head the commit read
        run.append_checkpoint("two", 2, idempotency_key="k2")
    assert stored(kv, "r1") == before


def test_a_takeover_inside_the_window_fences_an_appended_checkpoint(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = started(worker)
    taker = other.start_run("u", "r1")
    before = stored(kv, "r1")
    with pytest.raises(StaleWriterError):
        run.append_checkpoint("two", 2, idempotency_key="k2")
    assert stored(kv, "r1") == before
    assert taker.append_checkpoint("two", 22, idempotency_key="k2").output == 22


def test_a_delete_inside_the_window_refuses_an_appended_checkpoint_and_does_not_recreate_the_run(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = started(worker)
    assert other.delete_run("r1")
    with pytest.raises(RunNotFoundError):
        run.append_checkpoint("two", 2)
    assert stored(kv, "r1") == (None, [])


def test_a_key_appended_meanwhile_by_another_user_of_the_lease_is_answered_with_its_checkpoint(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = started(worker)
    theirs = other.attach("r1", run.epoch).append_checkpoint("two", "theirs", idempotency_key="k")
    mine = run.append_checkpoint("two", "mine", idempotency_key="k")
    assert (mine.checkpoint_id, mine.output) == (theirs.checkpoint_id, "theirs")
    assert [c.output for c in worker.history("r1")] == [1, "theirs"]
    assert run.append_checkpoint("three", 3).seq == 3


def test_a_change_that_still_allows_an_appended_checkpoint_commits_it(
    kv: KVStore, worker: TaskTier, other: TaskTier
) -> None:
    run = started(worker, budget_tokens=100)
    other.set_budget("r1", tokens=1000)
    assert run.append_checkpoint("two", 2, state={"k": "v"}).seq == 2
    info = worker.get_run("r1")
    assert (info.head_seq, info.budget_tokens) == (2, 1000)
    assert worker.state_at("r1", info.head_checkpoint_id or "") == {"k": "v"}


@pytest.mark.parametrize("how", ["no-window", "window-passed"])
def test_outside_the_window_an_appended_checkpoint_is_refused_on_the_head_read_first(
    kv: KVStore, worker: TaskTier, other: TaskTier, how: str
) -> None:
    run = started(worker)
    other.cancel("r1")
    outside_the_window(run, how)
    before = stored(kv, "r1")
    with pytest.raises(RunCancelledError):
        run.append_checkpoint("two", 2)
    assert stored(kv, "r1") == before


@pytest.mark.parametrize("how", ["no-window", "window-passed"])
def test_outside_the_window_a_takeover_fences_an_appended_checkpoint(
    kv: KVStore, worker: TaskTier, other: TaskTier, how: str
) -> None:
    run = started(worker)
    other.start_run("u", "r1")
    outside_the_window(run, how)
    before = stored(kv, "r1")
    with pytest.raises(StaleWriterError):
        run.append_checkpoint("two", 2)
    assert stored(kv, "r1") == before


def test_a_cancel_through_the_same_tier_refuses_an_appended_checkpoint(
    kv: KVStore, worker: TaskTier
) -> None:
    run = started(worker)
    worker.cancel("r1")
    before = stored(kv, "r1")
    with pytest.raises(RunCancelledError):
        run.append_checkpoint("two", 2)
    assert stored(kv, "r1") == before


# -- the option ----------------------------------------------------------------------


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), True, "50", None])
def test_a_bad_window_is_refused(kv: KVStore, bad: object) -> None:
    with pytest.raises(InvalidInputError) as refused:
        TaskTier(kv, head_fresh_ms=bad)  # type: ignore[arg-type]
    assert refused.value.field == "head_fresh_ms"
    run = TaskTier(kv).start_run("u", "r1")
    with pytest.raises(InvalidInputError):
        run.head_fresh_ms = bad  # type: ignore[assignment]


def test_the_window_is_the_tiers_unless_the_handle_sets_its_own(kv: KVStore) -> None:
    tasks = TaskTier(kv, head_fresh_ms=20)
    assert tasks.head_fresh_ms == 20
    run = tasks.start_run("u", "r1")
    assert run.head_fresh_ms == 20
    run.head_fresh_ms = 0
    assert (run.head_fresh_ms, tasks.start_run("u", "r2").head_fresh_ms) == (0, 20)
    assert TaskTier(kv).head_fresh_ms == 50


def test_a_run_deleted_by_another_writer_leaves_nothing_of_its_head_in_the_workers_tier(
    worker: TaskTier, other: TaskTier
) -> None:
    # Deleting means gone from memory too: the head table keeps no run result past its delete.
    token = uuid.uuid4().hex[:12]
    run = worker.start_run("u1", "r-erased")
    run.step("one", lambda: 1)
    run.complete({"answer": f"okapi{token} was the answer"})
    del run  # the handle is the caller's: what the tier keeps must not hold the head
    assert other.delete_run("r-erased")
    assert holders(f"okapi{token} was") == []


@pytest.mark.parametrize("encrypted", [False, True], ids=["plain", "encrypted"])
def test_a_collision_in_the_head_table_is_fenced_by_the_commits_exact_bytes_check(
    kv: KVStore, encrypted: bool
) -> None:
    # The table keeps hash(head): two heads of one run with one hash would let a step trust the
    # older one. Put the table in that state (it names the handle's head as the last one written
    # after a cancel through the same tier): the commit's check of the exact bytes still refuses.
    store = EncryptedKVStore(kv, MasterKey.generate()[0]) if encrypted else kv
    tier = TaskTier(store, head_fresh_ms=WINDOW_MS)
    run = started(tier)
    tier.cancel("r1")
    tier._store.recent_heads.wrote("r1", run._writer.head)
    before = stored(store, "r1")
    calls = Calls()
    with pytest.raises(RunCancelledError):
        run.step("two", lambda: calls(2))
    assert calls.count == 1  # it ran on the trusted head, as with a cancel made elsewhere
    assert stored(store, "r1") == before
