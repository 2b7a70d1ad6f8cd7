"""Exactly-once effects of the task tier, on every KV backend (in-process; crashes in test_task_crash)."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest

from tests.kv_spies import CountingKV
from tiers import keys
from tiers.backends.base import KVStore
from tiers.errors import (
    ConflictError,
    EffectNotFoundError,
    EffectOutcomeUnknownError,
    InputMismatchError,
    InvalidInputError,
    RunCancelledError,
    RunNotFoundError,
    RunStateError,
    StaleWriterError,
)
from tiers.models import RunStatus
from tiers.task import NOT_DONE, Charged, EffectStatus, EventKind, TaskTier


class Crash(BaseException):
    """Stands for the worker dying inside an effect's function (nothing after it runs)."""


class External:
    """An external system: counts executions per idempotency key."""

    def __init__(self) -> None:
        self.done: list[str] = []

    def call(self, key: str) -> dict[str, str]:
        self.done.append(key)
        return {"id": f"X-{len(self.done)}", "key": key}

    def crash_after(self, key: str) -> object:
        self.done.append(key)
        raise Crash

    def crash_before(self, key: str) -> object:
        raise Crash

    def probe(self, key: str) -> object:
        return {"id": "probed", "key": key} if key in self.done else NOT_DONE


@pytest.fixture
def tasks(kv: KVStore) -> TaskTier:
    return TaskTier(kv)


def test_recorded_effects_are_replayed_not_repeated(tasks: TaskTier) -> None:
    ext = External()
    run = tasks.start_run("u", "r1")
    first = run.effect("charge", ext.call, input={"amount": 5})
    in_step = run.step("notify", lambda: {"mail": run.effect("mail", ext.call)})
    assert ext.done == ["r1/effect:charge/0", "r1/notify/0/effect:mail/0"]
    assert first == {"id": "X-1", "key": "r1/effect:charge/0"}

    again = tasks.start_run("u", "r1")
    assert again.effect("charge", ext.call, input={"amount": 5}) == first
    assert again.step("notify", lambda: {"mail": again.effect("mail", ext.call)}) == in_step
    assert len(ext.done) == 2
    # A top-level effect is a checkpoint of its own.
    assert [(c.step, c.kind) for c in tasks.history("r1")] == [
        ("charge", "effect"),
        ("notify", "step"),
    ]
    ledger = {r.key: r for r in tasks.effects("r1")}
    assert ledger["r1/effect:charge/0"].status is EffectStatus.RECORDED
    assert ledger["r1/effect:charge/0"].output == first
    assert ledger["r1/notify/0/effect:mail/0"].step_key == "r1/notify/0"


def test_the_effect_ledger_reads_in_pages_in_key_order(tasks: TaskTier) -> None:
    ext = External()
    run = tasks.start_run("u", "paged")
    for n in range(7):
        run.effect("charge", ext.call, idempotency_key=f"k{n:02d}")
    every = [r.key for r in tasks.effects("paged")]
    assert every == [f"k{n:02d}" for n in range(7)]
    pages: list[list[str]] = []
    after: str | None = None
    while page := [r.key for r in tasks.effects("paged", after_key=after, limit=3)]:
        pages.append(page)
        after = page[-1]
    assert pages == [every[0:3], every[3:6], every[6:]]
    assert tasks.effects("paged", limit=0) == []
    with pytest.raises(InvalidInputError):
        tasks.effects("paged", limit=-1)
    with pytest.raises(RunNotFoundError):
        tasks.effects("no-such-run", limit=3)


def test_a_step_replays_its_recorded_effects_when_it_reruns(tasks: TaskTier) -> None:
    ext = External()
    run = tasks.start_run("u", "r1")

    def body() -> object:
        a = run.effect("a", ext.call)
        raise RuntimeError(f"step failed after effect {a}")

    with pytest.raises(RuntimeError):
        run.step("s", body)
    assert tasks.history("r1") == []
    # The retry of the step re-executes its function, but the effect is recorded.
    out = run.step("s", lambda: {"a": run.effect("a", ext.call), "b": run.effect("b", ext.call)})
    assert ext.done == ["r1/s/0/effect:a/0", "r1/s/0/effect:b/0"]
    assert out["a"] == {"id": "X-1", "key": "r1/s/0/effect:a/0"}  # type: ignore[index,call-overload]


def test_costs_one_commit_per_step_and_two_per_effect(kv: KVStore) -> None:
    counting = CountingKV(kv)
    tasks = TaskTier(counting)
    run = tasks.start_run("u", "r1")
    before = counting.commits
    run.step("plain", lambda: 1)
    assert counting.commits - before == 1
    before = counting.commits
    run.effect("pay", External().call)
    assert counting.commits - before == 2
    before = counting.commits
    run.step("replayed-nothing", lambda: 2)
    tasks.start_run("u", "r1").step("plain", lambda: 0)  # a replay writes nothing
    assert counting.commits - before == 2  # the step and the resume


def test_unknown_outcome_blocks_until_an_operator_decides(kv: KVStore, tasks: TaskTier) -> None:
    ext = External()
    run = tasks.start_run("u", "r1")
    with pytest.raises(Crash):
        run.effect("charge", ext.crash_after, input=1)
    key = "r1/effect:charge/0"
    (unknown,) = tasks.unknown_effects("r1")
    assert (unknown.key, unknown.status, unknown.attempt) == (key, EffectStatus.INVOKED, 1)

    resumed = tasks.start_run("u", "r1")
    for _ in range(2):
        with pytest.raises(EffectOutcomeUnknownError, match="resolve_effect") as caught:
            resumed.effect("charge", ext.call, input=1)
        assert (caught.value.effect_key, caught.value.effect_name) == (key, "charge")
    assert ext.done == [key]  # never called again
    kinds = [e.kind for e in tasks.events("r1")]
    assert kinds.count(EventKind.EFFECT_OUTCOME_UNKNOWN) == 1  # flagged once
    with pytest.raises(InvalidInputError):
        tasks.resolve_effect("r1", key)

    tasks.resolve_effect("r1", key, output={"id": "from-operator"})
    assert resumed.effect("charge", ext.call, input=1) == {"id": "from-operator"}
    assert ext.done == [key]
    assert tasks.history("r1")[-1].output == {"id": "from-operator"}
    with pytest.raises(RunStateError, match="not of unknown outcome"):
        tasks.resolve_effect("r1", key, rerun=True)


def test_operator_rerun_calls_the_effect_once_more(tasks: TaskTier) -> None:
    ext = External()
    run = tasks.start_run("u", "r1")
    with pytest.raises(Crash):
        run.effect("charge", ext.crash_before)
    tasks.resolve_effect("r1", "r1/effect:charge/0", rerun=True)
    resumed = tasks.start_run("u", "r1")
    assert resumed.effect("charge", ext.call)["id"] == "X-1"  # type: ignore[index,call-overload]
    assert ext.done == ["r1/effect:charge/0"]
    (rec,) = tasks.effects("r1")
    assert (rec.status, rec.attempt) == (EffectStatus.RECORDED, 2)


@pytest.mark.parametrize("crash", ["before", "after"])
def test_reconcile_probes_by_idempotency_key(tasks: TaskTier, crash: str) -> None:
    ext = External()
    run = tasks.start_run("u", "r1")

    def body() -> object:
        fn = ext.crash_before if crash == "before" else ext.crash_after
        return run.effect("pay", fn, reconcile=ext.probe)

    with pytest.raises(Crash):
        run.step("checkout", body)
    resumed = tasks.start_run("u", "r1")
    out = resumed.step("checkout", lambda: resumed.effect("pay", ext.call, reconcile=ext.probe))
    key = "r1/checkout/0/effect:pay/0"
    assert ext.done == [key]  # exactly once either way
    if crash == "after":
        assert out == {"id": "probed", "key": key}
    else:
        assert out == {"id": "X-1", "key": key}
    sources = [e.data.get("source") for e in tasks.events("r1") if e.data.get("source")]
    assert "reconcile" in sources


def test_safe_to_retry_effects_rerun_after_unknown_outcome(tasks: TaskTier) -> None:
    ext = External()
    run = tasks.start_run("u", "r1")
    with pytest.raises(Crash):
        run.effect("idempotent-put", ext.crash_after, safe_to_retry=True)
    tasks.start_run("u", "r1").effect("idempotent-put", ext.call, safe_to_retry=True)
    assert ext.done == ["r1/effect:idempotent-put/0"] * 2


def test_changed_request_or_name_is_refused(tasks: TaskTier) -> None:
    ext = External()
    run = tasks.start_run("u", "r1")
    run.effect("pay", ext.call, input={"amount": 5}, idempotency_key="order-9")
    with pytest.raises(InputMismatchError):
        tasks.start_run("u", "r1").effect(
            "pay", ext.call, input={"amount": 6}, idempotency_key="order-9"
        )
    again = tasks.start_run("u", "r1")
    with pytest.raises(InputMismatchError):
        again.step("s", lambda: again.effect("refund", ext.call, idempotency_key="order-9"))
    assert ext.done == ["order-9"]


def test_fenced_handle_never_invokes_its_effect(tasks: TaskTier) -> None:
    ext = External()
    stale = tasks.start_run("u", "r1")
    tasks.start_run("u", "r1")
    with pytest.raises(StaleWriterError):
        stale.effect("pay", ext.call)
    with pytest.raises(StaleWriterError):
        stale.step("s", lambda: stale.effect("pay", ext.call))
    assert ext.done == []
    assert tasks.effects("r1") == []


def test_nested_effects_are_refused(tasks: TaskTier) -> None:
    run = tasks.start_run("u", "r1")
    with pytest.raises(InvalidInputError, match="nested"):
        run.effect("outer", lambda: run.effect("inner", lambda: 1))
    with pytest.raises(InvalidInputError, match="nested"):
        run.effect("outer2", lambda: run.step("inner", lambda: 1))


def test_aeffect_awaits_and_is_exactly_once(kv: KVStore) -> None:
    tasks = TaskTier(kv)
    calls: list[str] = []

    async def send(key: str) -> dict[str, str]:
        await asyncio.sleep(0)
        calls.append(key)
        return {"sent": key}

    async def reconcile(key: str) -> object:
        return {"sent": key} if key in calls else NOT_DONE

    async def main() -> None:
        run = tasks.start_run("u", "r1")
        assert await run.aeffect("send", send) == {"sent": "r1/effect:send/0"}

        async def crashing(key: str) -> object:
            calls.append(key)
            raise Crash

        with pytest.raises(Crash):
            await run.aeffect("send", crashing)
        resumed = tasks.start_run("u", "r1")
        assert await resumed.aeffect("send", send) == {"sent": "r1/effect:send/0"}
        assert await resumed.aeffect("send", send, reconcile=reconcile) == {
            "sent": "r1/effect:send/1"
        }

    asyncio.run(main())
    assert calls == ["r1/effect:send/0", "r1/effect:send/1"]


def test_effect_ledger_and_events_are_in_the_run_space(kv: KVStore, tasks: TaskTier) -> None:
    run = tasks.start_run("u", "r1")
    run.effect("pay", External().call)
    space = keys.run_space("default", "r1")
    stored = dict(kv.scan(space, prefix=keys.EFFECT_PREFIX))
    assert list(stored) == ["eff:r1/effect:pay/0"]
    kinds = [e.kind for e in tasks.events("r1")]
    assert kinds == [
        EventKind.RUN_STARTED,
        EventKind.EFFECT_INVOKED,
        EventKind.EFFECT_RECORDED,
        EventKind.STEP_COMMITTED,
    ]


def test_outputs_read_back_exactly_as_written(tasks: TaskTier) -> None:
    padded = {"text": "  indented\n", "items": [" a ", "b\t"]}
    run = tasks.start_run("u", "exact")
    assert run.effect("pad", lambda: " x ") == " x "
    assert run.step("nested", lambda: padded) == padded
    # Replayed from the store, not recomputed: byte-for-byte the same values.
    again = tasks.start_run("u", "exact")
    assert again.effect("pad", lambda: pytest.fail("effect ran twice")) == " x "
    assert again.step("nested", lambda: pytest.fail("step ran twice")) == padded
    assert [c.output for c in tasks.history("exact")] == [" x ", padded]


# -- operator actions, cancels and takeovers while a function runs ----------------------


def _operator_actions(tasks: TaskTier, run_id: str) -> dict[str, Any]:
    """Operator actions that change a run's head without taking its lease."""
    return {
        "set_budget": lambda: tasks.set_budget(run_id, tokens=1000),
        "compact": lambda: tasks.compact(run_id),
        "resolve_other_effect": lambda: tasks.resolve_effect(
            run_id,
            next(r.key for r in tasks.unknown_effects(run_id) if r.name == "old"),
            output="settled",
        ),
    }


def _run_with_history(kv: KVStore, run_id: str) -> tuple[TaskTier, Any]:
    """A run with a snapshot to compact and an unknown-outcome effect to resolve."""
    tasks = TaskTier(kv, snapshot_every=2)
    run = tasks.start_run("u", run_id)
    run.step("a", lambda: 1)
    run.step("b", lambda: 2)
    for n in range(2):  # two unknown-outcome effects an operator resolves
        with pytest.raises(Crash):
            run.effect("old", External().crash_after, idempotency_key=f"old-{n}")
    return tasks, tasks.start_run("u", run_id)


@pytest.mark.parametrize("action", ["set_budget", "compact", "resolve_other_effect"])
def test_an_operator_action_during_an_effect_does_not_lose_its_result(
    kv: KVStore, action: str
) -> None:
    tasks, run = _run_with_history(kv, "rA")
    act = _operator_actions(tasks, "rA")[action]
    ext = External()

    def pay(key: str) -> object:
        act()
        return ext.call(key)

    out = run.effect("pay", pay, idempotency_key="pay-1")
    assert out == {"id": "X-1", "key": "pay-1"}
    ledger = {r.key: r for r in tasks.effects("rA")}
    assert (ledger["pay-1"].status, ledger["pay-1"].output) == (EffectStatus.RECORDED, out)
    assert tasks.history("rA")[-1].output == out
    # Inside a step as well: the effect and the step's checkpoint are both kept.
    in_step = run.step("s", lambda: {"r": run.effect("pay2", pay)})
    assert tasks.history("rA")[-1].output == in_step
    assert ext.done == ["pay-1", "rA/s/0/effect:pay2/0"]
    events = tasks.events("rA")
    assert [e.seq for e in events] == list(range(events[0].seq, events[-1].seq + 1))


@pytest.mark.parametrize("action", ["set_budget", "compact", "resolve_other_effect"])
def test_an_operator_action_during_a_step_does_not_lose_its_output(
    kv: KVStore, action: str
) -> None:
    tasks, run = _run_with_history(kv, "rA")
    act = _operator_actions(tasks, "rA")[action]
    assert run.step("s", lambda: (act(), Charged({"ok": 1}, tokens=5, state={"k": 1}))[1]) == {
        "ok": 1
    }
    info = tasks.get_run("rA")
    assert (tasks.history("rA")[-1].output, info.spent_tokens) == ({"ok": 1}, 5)
    assert run.state == tasks.rebuild("rA").values == {"k": 1}


def test_a_takeover_during_an_effect_still_fences_its_record(tasks: TaskTier) -> None:
    run = tasks.start_run("u", "r1")
    before: list[object] = []

    def pay(key: str) -> object:
        tasks.start_run("u", "r1")
        before.append(tasks.get_run("r1").event_seq)
        return "paid"

    with pytest.raises(StaleWriterError):
        run.effect("pay", pay)
    (rec,) = tasks.effects("r1")
    assert rec.status is EffectStatus.INVOKED  # the new holder reconciles it
    assert tasks.get_run("r1").event_seq == before[0]  # nothing written after the takeover


def test_cancel_during_an_effect_records_it_then_stops_the_worker(tasks: TaskTier) -> None:
    run = tasks.start_run("u", "r1")

    def pay(key: str) -> object:
        tasks.cancel("r1")
        return {"charged": key}

    with pytest.raises(RunCancelledError, match="recorded"):
        run.effect("pay", pay)
    (rec,) = tasks.effects("r1")
    assert (rec.status, rec.output) == (EffectStatus.RECORDED, {"charged": "r1/effect:pay/0"})
    info = tasks.get_run("r1")
    assert (info.status, info.head_seq) == (RunStatus.CANCELLED, 0)  # no checkpoint after cancel
    assert [e.kind for e in tasks.events("r1")][-2:] == [
        EventKind.RUN_CANCELLED,
        EventKind.EFFECT_RECORDED,
    ]
    assert tasks.rebuild("r1").status is RunStatus.CANCELLED

    # Inside a step: the effect is recorded, the step is not committed.
    other = tasks.start_run("u", "r2")
    with pytest.raises(RunCancelledError):
        other.step("s", lambda: other.effect("pay", lambda: (tasks.cancel("r2"), 7)[1]))
    (rec,) = tasks.effects("r2")
    assert (rec.status, rec.output, tasks.history("r2")) == (EffectStatus.RECORDED, 7, [])


def test_an_attached_handle_writing_meanwhile_is_serialised_not_lost(tasks: TaskTier) -> None:
    run = tasks.start_run("u", "r1")
    assert run.state == {}
    other = tasks.attach("r1", run.epoch)  # e.g. an HTTP request holding the same lease

    def step() -> object:
        other.append_checkpoint("from-http", 1, state={"x": 1})
        return Charged("mine", state={"y": 2})

    assert run.step("mine", step) == "mine"
    assert [c.step for c in tasks.history("r1")] == ["from-http", "mine"]
    assert run.state == tasks.rebuild("r1").values == {"x": 1, "y": 2}


# -- the two-phase protocol: begin_effect / record_effect --------------------------------


def test_begin_and_record_is_the_effect_protocol_in_two_calls(kv: KVStore, tasks: TaskTier) -> None:
    run = tasks.start_run("u", "r1")
    start = run.begin_effect("pay", idempotency_key="order-1", input={"amount": 5})
    assert (start.key, start.invoke, start.output) == ("order-1", True, None)
    (rec,) = tasks.effects("r1")
    assert rec.status is EffectStatus.INVOKED  # durable before the caller performs it
    assert run.record_effect("order-1", {"receipt": "R1"}) == {"receipt": "R1"}
    (ckpt,) = tasks.history("r1")
    assert (ckpt.step, ckpt.kind, ckpt.output) == ("pay", "effect", {"receipt": "R1"})

    # A retried request: beginning replays, recording the same output writes nothing.
    before = kv.scan(keys.run_space("default", "r1"))
    again = tasks.attach("r1", run.epoch)
    replay = again.begin_effect("pay", idempotency_key="order-1", input={"amount": 5})
    assert (replay.invoke, replay.output) == (False, {"receipt": "R1"})
    assert again.record_effect("order-1", {"receipt": "R1"}) == {"receipt": "R1"}
    assert kv.scan(keys.run_space("default", "r1")) == before
    with pytest.raises(ConflictError, match="another output"):
        again.record_effect("order-1", {"receipt": "R2"})
    with pytest.raises(InputMismatchError):
        again.begin_effect("pay", idempotency_key="order-1", input={"amount": 6})
    with pytest.raises(EffectNotFoundError):
        again.record_effect("never-begun", 1)
    assert kv.scan(keys.run_space("default", "r1")) == before

    # Begun, never recorded: its outcome is unknown until someone decides.
    run.begin_effect("ship", idempotency_key="ship-1")
    resumed = tasks.start_run("u", "r1")
    with pytest.raises(EffectOutcomeUnknownError) as caught:
        resumed.begin_effect("ship", idempotency_key="ship-1")
    assert caught.value.effect_key == "ship-1"
    assert tasks.get_run("r1").unknown_effects == ["ship-1"]
    tasks.resolve_effect("r1", "ship-1", output={"tracking": "T1"})
    replay = resumed.begin_effect("ship", idempotency_key="ship-1")
    assert (replay.invoke, replay.output) == (False, {"tracking": "T1"})
    assert [c.step for c in tasks.history("r1")] == ["pay", "ship"]


def test_record_effect_after_a_cancel_records_then_stops(tasks: TaskTier) -> None:
    run = tasks.start_run("u", "r1")
    run.begin_effect("pay", idempotency_key="order-1")
    tasks.cancel("r1")
    with pytest.raises(RunCancelledError):
        tasks.attach("r1", run.epoch)  # no more writes on a cancelled run...
    late = tasks.attach("r1", run.epoch, finished_ok=True)  # ...but the result is kept
    with pytest.raises(RunCancelledError, match="recorded"):
        late.record_effect("order-1", {"receipt": "R1"})
    (rec,) = tasks.effects("r1")
    assert (rec.status, rec.output) == (EffectStatus.RECORDED, {"receipt": "R1"})
    with pytest.raises(RunCancelledError):
        late.step("next", lambda: 1)
    with pytest.raises(RunCancelledError):
        late.begin_effect("more", idempotency_key="order-2")
