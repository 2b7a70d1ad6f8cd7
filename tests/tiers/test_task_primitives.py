"""Run primitives the framework adapters build on, on every KV backend.

Deleting a run whole (and what a live handle of it does next), checkpoint
lookups by id and by idempotency key, history pages in both directions whose
reads are bounded by the page, and external ids mapped to run ids.
"""

from __future__ import annotations

import string
from datetime import UTC, datetime
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.kv_spies import CountingKV
from tiers import keys
from tiers.backends.base import KVStore
from tiers.errors import (
    CheckpointNotFoundError,
    ConflictError,
    InvalidInputError,
    RunNotFoundError,
)
from tiers.ids import DERIVED_ID_PATTERN, ID_PATTERN, MAX_EXTERNAL_ID, run_id_for
from tiers.models import RunInfo, RunStatus
from tiers.task import Charged, TaskTier
from tiers.task._records import checkpoint_id, input_hash

TENANT = "default"


@pytest.fixture
def tasks(kv: KVStore) -> TaskTier:
    return TaskTier(kv, snapshot_every=4)


def stored(kv: KVStore, run_id: str) -> tuple[bytes | None, list[tuple[str, bytes]]]:
    """A run's head and every row of its space."""
    (head,) = kv.get_many(keys.runs_space(TENANT), [run_id])
    return head, kv.scan(keys.run_space(TENANT, run_id))


# -- delete_run ---------------------------------------------------------------------------


def test_delete_run_removes_head_and_everything_in_one_go(kv: KVStore, tasks: TaskTier) -> None:
    run = tasks.start_run("u1", "doomed")
    for n in range(6):  # enough events for snapshots (every 4)
        run.step("s", lambda n=n: f"secret-{n}", idempotency_key=f"k{n}")
    run.effect("pay", lambda: "paid-secret", idempotency_key="pay-1")
    keep = tasks.start_run("u1", "kept")
    keep.step("s", lambda: "kept-output")
    kept_before = stored(kv, "kept")
    head, rows = stored(kv, "doomed")
    assert head is not None
    prefixes = {key.split(":")[0] for key, _ in rows}
    assert prefixes >= {"ckpt", "idem", "ev", "eff", "snap"}

    assert tasks.delete_run("doomed") is True
    assert stored(kv, "doomed") == (None, [])
    with pytest.raises(RunNotFoundError):
        tasks.get_run("doomed")
    assert [r.run_id for r in tasks.list_runs()] == ["kept"]
    assert stored(kv, "kept") == kept_before
    assert tasks.delete_run("doomed") is False  # gone is gone; deleting again says so


def test_a_live_handle_of_a_deleted_run_writes_nothing_and_cannot_recreate_it(
    kv: KVStore, tasks: TaskTier
) -> None:
    run = tasks.start_run("u1", "r1", lease_ttl=60)
    run.step("first", lambda: 1)
    assert tasks.delete_run("r1")
    calls: list[str] = []
    attempts = [
        lambda: run.step("second", lambda: calls.append("step")),
        lambda: run.append_checkpoint("third", 3),
        lambda: run.effect("pay", lambda: calls.append("effect"), idempotency_key="p"),
        run.heartbeat,
        run.complete,
        lambda: run.fail("x"),
        run.release,
    ]
    for attempt in attempts:
        with pytest.raises(RunNotFoundError):
            attempt()
    assert calls == []  # refused before any function ran
    with pytest.raises(RunNotFoundError):
        tasks.attach("r1", run.epoch)
    assert stored(kv, "r1") == (None, [])
    # A new run under the same id starts empty; the old handle is still refused.
    fresh = tasks.start_run("u1", "r1")
    assert (fresh.resumed, fresh.info.head_seq, fresh.epoch) == (False, 0, 1)
    with pytest.raises(RunNotFoundError):
        run.step("late", lambda: 0)


def test_an_effect_whose_run_is_deleted_meanwhile_is_not_recorded(
    kv: KVStore, tasks: TaskTier
) -> None:
    run = tasks.start_run("u1", "r2")

    def pay() -> str:
        assert tasks.delete_run("r2")  # an operator deletes the run while the call is out
        return "receipt"

    with pytest.raises(RunNotFoundError):
        run.effect("pay", pay, idempotency_key="pay-r2")
    assert stored(kv, "r2") == (None, [])


def test_delete_run_deletes_runs_of_every_status(tasks: TaskTier) -> None:
    done = tasks.start_run("u1", "done")
    done.complete("ok")
    cancelled = tasks.start_run("u1", "cancelled")
    tasks.cancel(cancelled.run_id)
    paused = tasks.start_run("u1", "paused")
    with pytest.raises(Exception, match="awaiting approval"):
        paused.await_approval({"plan": 1}, key="gate")
    assert tasks.get_run("paused").status is RunStatus.PAUSED
    for run_id in ("done", "cancelled", "paused"):
        assert tasks.delete_run(run_id) is True
    assert tasks.list_runs() == []


def test_delete_run_refuses_bad_ids(tasks: TaskTier) -> None:
    with pytest.raises(InvalidInputError) as bad:
        tasks.delete_run("a:b")
    assert bad.value.field == "run_id"


# -- checkpoint lookups -------------------------------------------------------------------


def test_get_checkpoint_by_id(tasks: TaskTier) -> None:
    run = tasks.start_run("u1", "r1")
    run.step("a", lambda: "A")
    run.step("b", lambda: "B")
    other = tasks.start_run("u1", "r2")
    other.step("a", lambda: "other")
    first, second = tasks.history("r1")
    assert tasks.get_checkpoint("r1", second.checkpoint_id) == second
    # A well-formed id of another run's checkpoint, and ids that name no checkpoint.
    (foreign,) = tasks.history("r2")
    for missing in (foreign.checkpoint_id, "ckpt-000000000009-000000000000", "nonsense"):
        with pytest.raises(CheckpointNotFoundError):
            tasks.get_checkpoint("r1", missing)
    with pytest.raises(RunNotFoundError):
        tasks.get_checkpoint("no-run", first.checkpoint_id)
    with pytest.raises(InvalidInputError):
        tasks.get_checkpoint("bad/id", first.checkpoint_id)


def test_checkpoint_for_key_is_what_a_replay_returns(tasks: TaskTier) -> None:
    run = tasks.start_run("u1", "r1")
    run.step("plan", lambda: "p", idempotency_key="plan-1")
    run.step("draft", lambda: "d")  # default key r1/draft/0
    found = tasks.checkpoint_for_key("r1", "plan-1")
    assert found is not None
    assert (found.step, found.output, found.seq) == ("plan", "p", 1)
    default = tasks.checkpoint_for_key("r1", "r1/draft/0")
    assert default is not None
    assert default.output == "d"
    assert tasks.checkpoint_for_key("r1", "never-used") is None
    # A state edit from checkpoint 1 supersedes the draft: its key no longer counts.
    tasks.update_state("r1", found.checkpoint_id, {"x": 1})
    assert tasks.checkpoint_for_key("r1", "r1/draft/0") is None
    assert tasks.checkpoint_for_key("r1", "plan-1") == found
    with pytest.raises(RunNotFoundError):
        tasks.checkpoint_for_key("no-run", "plan-1")
    with pytest.raises(InvalidInputError) as bad:
        tasks.checkpoint_for_key("r1", "bad\x00key")
    assert bad.value.field == "idempotency_key"


# -- history pages ------------------------------------------------------------------------


def test_history_pages_newest_first_and_oldest_first(tasks: TaskTier) -> None:
    run = tasks.start_run("u1", "long")
    for n in range(1, 26):
        run.append_checkpoint("s", n)
    assert [c.seq for c in tasks.history("long")] == list(range(1, 26))  # default unchanged

    pages, cursor = [], None
    while True:
        page = tasks.history("long", newest_first=True, limit=10, before_seq=cursor)
        if not page:
            break
        pages.append([c.seq for c in page])
        cursor = page[-1].seq
    assert pages == [list(range(25, 15, -1)), list(range(15, 5, -1)), [5, 4, 3, 2, 1]]

    pages, after = [], None
    while page := tasks.history("long", limit=10, after_seq=after):
        pages.append([c.seq for c in page])
        after = page[-1].seq
    assert pages == [list(range(1, 11)), list(range(11, 21)), list(range(21, 26))]

    assert [c.seq for c in tasks.history("long", after_seq=3, before_seq=7)] == [4, 5, 6]
    assert [c.seq for c in tasks.history("long", newest_first=True, after_seq=20)] == [
        25,
        24,
        23,
        22,
        21,
    ]
    assert [c.seq for c in tasks.history("long", newest_first=True, before_seq=10**15)][:1] == [25]
    assert tasks.history("long", limit=0) == []
    assert tasks.history("long", after_seq=25) == []
    assert tasks.history("long", before_seq=1) == []
    assert tasks.history("long", after_seq=5, before_seq=6) == []
    for name in ("limit", "after_seq", "before_seq"):
        with pytest.raises(InvalidInputError) as bad:
            tasks.history("long", **{name: -1})
        assert bad.value.field == name
    with pytest.raises(RunNotFoundError):
        tasks.history("nothing-here", newest_first=True, limit=1)


def test_a_history_page_reads_only_its_rows(kv: KVStore) -> None:
    counting = CountingKV(kv)
    tasks = TaskTier(counting)
    run = tasks.start_run("u1", "long")
    for n in range(300):
        run.append_checkpoint("s", n)
    for kwargs in (
        {"newest_first": True, "limit": 5},
        {"newest_first": True, "limit": 5, "before_seq": 150},
        {"limit": 5, "after_seq": 200},
        {"after_seq": 10, "before_seq": 16},
    ):
        counting.rows_scanned = 0
        page = tasks.history("long", **kwargs)  # type: ignore[arg-type]
        assert len(page) == 5
        assert counting.rows_scanned == 5, kwargs


# -- external ids -------------------------------------------------------------------------


def test_run_id_for_keeps_valid_ids_and_derives_the_rest() -> None:
    for valid in ("abc", "550e8400-e29b-41d4-a716-446655440000", "alice+tag@example.com"):
        assert run_id_for(valid) == valid
    derived = run_id_for("user:42/chat")
    assert derived.startswith("user_42_chat+")
    assert DERIVED_ID_PATTERN.fullmatch(derived)
    assert derived == run_id_for("user:42/chat")  # deterministic
    assert run_id_for("user:42/chat") != run_id_for("user/42:chat")  # same prefix, other digest
    # An id that looks derived is derived again, so identity never meets a derived id.
    assert run_id_for(derived) != derived
    for weird in ("x" * 500, ":::", "é", "\ud800", " leading", "_underscore"):
        out = run_id_for(weird)
        assert ID_PATTERN.fullmatch(out), weird
        assert len(out) <= 128
    for bad in ("", None, 42, b"bytes"):
        with pytest.raises(InvalidInputError) as err:
            run_id_for(bad)  # type: ignore[arg-type]
        assert err.value.field == "external_id"


@settings(max_examples=300, deadline=None)
@given(st.text(min_size=1, max_size=300), st.text(min_size=1, max_size=300))
def test_run_id_for_is_valid_and_one_to_one(first: str, second: str) -> None:
    a, b = run_id_for(first), run_id_for(second)
    assert ID_PATTERN.fullmatch(a)
    assert ID_PATTERN.fullmatch(b)
    assert (a == b) == (first == second)


@settings(max_examples=200, deadline=None)
@given(st.text(alphabet=string.ascii_letters + string.digits + "._@+-", min_size=1, max_size=128))
def test_run_id_for_never_maps_a_valid_id_onto_another(value: str) -> None:
    out = run_id_for(value)
    if ID_PATTERN.fullmatch(value) and not DERIVED_ID_PATTERN.fullmatch(value):
        assert out == value
    else:
        assert out != value
        assert DERIVED_ID_PATTERN.fullmatch(out)


def test_a_run_keeps_its_external_id(tasks: TaskTier) -> None:
    run = tasks.start_run("u1", external_id="user:42/chat")
    assert run.run_id == run_id_for("user:42/chat")
    assert tasks.get_run(run.run_id).external_id == "user:42/chat"
    again = tasks.start_run("u1", external_id="user:42/chat")  # resumes the same run
    assert (again.run_id, again.resumed, again.epoch) == (run.run_id, True, 2)
    with pytest.raises(ConflictError, match="another external id"):
        tasks.start_run("u1", run.run_id, external_id="user:43/chat")
    plain = tasks.start_run("u1", "plain")
    assert plain.info.external_id is None
    with pytest.raises(ConflictError):
        tasks.start_run("u1", "plain", external_id="plain")
    chosen = tasks.start_run("u1", "chosen", external_id="thread 7")  # an explicit run id wins
    assert (chosen.run_id, chosen.info.external_id) == ("chosen", "thread 7")
    with pytest.raises(InvalidInputError) as long:
        tasks.start_run("u1", external_id="x" * (MAX_EXTERNAL_ID + 1))
    assert long.value.field == "external_id"


def test_heads_stored_before_external_ids_still_read() -> None:
    old = RunInfo(run_id="r", user_id="u").model_dump(mode="json")
    del old["external_id"]
    assert RunInfo.model_validate(old).external_id is None


# -- step names -----------------------------------------------------------------------------


class _Name(str):
    """A str subclass: checked like a str, never kept in a handle's table of checked names."""


def test_a_step_name_checked_once_is_the_same_name_every_later_call(tasks: TaskTier) -> None:
    # A handle keeps the names it checked; every later call of a name must give what the
    # check gave (the stripped name, in the default key), and a bad name is refused every time.
    run = tasks.start_run("u1", "names")
    assert run.step("  search ", lambda: 1) == 1
    assert run.step("  search ", lambda: 2) == 2
    assert run.step("search", lambda: 3) == 3
    assert [c.idempotency_key for c in tasks.history(run.run_id)] == [
        "names/search/0",
        "names/search/1",
        "names/search/2",
    ]
    for _ in range(2):
        for bad in ("", "   ", "a\nb", "x" * 257):
            with pytest.raises(InvalidInputError) as refused:
                run.step(bad, lambda: 0)
            assert refused.value.field == "step"
        not_a_name: Any = None
        with pytest.raises(InvalidInputError):
            run.step(not_a_name, lambda: 0)
    assert run.step(_Name(" search "), lambda: 4) == 4
    latest = tasks.latest_checkpoint(run.run_id)
    assert latest is not None
    assert (latest.step, latest.idempotency_key) == ("search", "names/search/3")


def test_a_steps_checkpoint_holds_each_field_where_it_belongs(kv: KVStore) -> None:
    # The writer hands the checkpoint's fields over by position: each must land in its own.
    times = iter(datetime(2026, 11, 27, 9, 0, second, tzinfo=UTC) for second in range(60))
    tier = TaskTier(kv, clock=lambda: next(times))
    run = tier.start_run("u1", "fields")
    first = run.step("plan", lambda: {"a": 1}, input={"q": 1})
    run.step("act", lambda: Charged("done", tokens=3, state={"k": "v"}), scope={"s": 1})
    one, two = tier.history(run.run_id)
    assert first == one.output == {"a": 1}
    assert (one.seq, one.parent_id, one.step, one.kind) == (1, None, "plan", "step")
    assert one.checkpoint_id == checkpoint_id("fields", 1, "fields/plan/0")
    assert (one.idempotency_key, one.input_hash) == ("fields/plan/0", input_hash({"q": 1}))
    assert one.started_at < one.created_at
    assert (two.seq, two.parent_id, two.output) == (2, one.checkpoint_id, "done")
    assert (two.idempotency_key, two.input_hash) == ("fields/act/0", input_hash(None))
    assert (two.scope, two.state_delta) == ({"s": 1}, {"k": "v"})
    assert one.created_at < two.started_at < two.created_at
    assert one.event_seq is not None
    assert two.event_seq is not None
    assert two.event_seq > one.event_seq
