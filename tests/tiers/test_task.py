"""Task tier on every KV backend: checkpoints, replay, fencing, concurrency, bad input, crashes."""

from __future__ import annotations

import hashlib
import threading
from collections import Counter
from collections.abc import Callable
from pathlib import Path

import pytest

from tiers import keys
from tiers.backends.base import KVStore, Put
from tiers.errors import (
    CheckpointNotFoundError,
    ConflictError,
    CorruptRecordError,
    InputMismatchError,
    InvalidInputError,
    RunNotFoundError,
    RunStateError,
    StaleWriterError,
    ValueTooLargeError,
)
from tiers.models import Checkpoint, RunStatus
from tiers.task import Charged, TaskTier

TENANT = "default"
WORKER = Path(__file__).with_name("crash_worker.py")


@pytest.fixture
def tasks(kv: KVStore) -> TaskTier:
    return TaskTier(kv)


class Calls:
    """A step function that counts its calls and returns a fixed output."""

    def __init__(self) -> None:
        self.count = 0

    def __call__(self, output: object) -> Callable[[], object]:
        def fn() -> object:
            self.count += 1
            return output

        return fn


def snapshot(kv: KVStore, *run_ids: str) -> dict[str, list[tuple[str, bytes]]]:
    """Every stored byte of the tenant's runs index and of the given runs."""
    spaces = [keys.runs_space(TENANT)] + [keys.run_space(TENANT, r) for r in run_ids]
    return {space: kv.scan(space) for space in spaces}


def assert_chain(history: list[Checkpoint]) -> None:
    assert [c.seq for c in history] == list(range(1, len(history) + 1))
    assert [c.parent_id for c in history] == [None] + [c.checkpoint_id for c in history[:-1]]
    assert len({c.checkpoint_id for c in history}) == len(history)


# -- basic run -------------------------------------------------------------------


def test_steps_build_a_chained_history(tasks: TaskTier) -> None:
    handle = tasks.start_run("alice", "r1")
    assert handle.epoch == 1
    assert tasks.get_run("r1").status is RunStatus.RUNNING
    assert tasks.latest_checkpoint("r1") is None

    outputs = [
        handle.step("plan", lambda: {"plan": ["a", "b"]}, input={"goal": "x", "n": 2}),
        handle.step("act", lambda: ("tuple", 1), input=1),
        handle.step("act", lambda: 2, input=2),
    ]
    # Outputs come back after a JSON round trip, the same as a replay returns them.
    assert outputs == [{"plan": ["a", "b"]}, ["tuple", 1], 2]

    history = tasks.history("r1")
    assert_chain(history)
    assert [c.step for c in history] == ["plan", "act", "act"]
    assert [c.idempotency_key for c in history] == ["r1/plan/0", "r1/act/0", "r1/act/1"]
    assert history[0].input_hash == hashlib.sha256(b'{"goal":"x","n":2}').hexdigest()
    assert sorted(c.checkpoint_id for c in history) == [c.checkpoint_id for c in history]
    for ckpt in history:
        assert tasks.get_checkpoint("r1", ckpt.checkpoint_id) == ckpt
        assert ckpt.started_at <= ckpt.created_at
    assert tasks.latest_checkpoint("r1") == history[-1]
    assert tasks.history("r1", limit=2) == history[:2]
    assert tasks.history("r1", after_seq=1) == history[1:]
    assert tasks.history("r1", after_seq=1, limit=1) == history[1:2]

    info = tasks.get_run("r1")
    assert (info.head_seq, info.head_checkpoint_id) == (3, history[-1].checkpoint_id)
    assert info.last_checkpoint_at == history[-1].created_at

    done = handle.complete(result={"answer": 42})
    assert done.status is RunStatus.COMPLETED
    assert tasks.get_run("r1").result == {"answer": 42}
    with pytest.raises(RunStateError, match="completed"):
        handle.step("late", lambda: 1)
    with pytest.raises(RunStateError, match="cannot be resumed"):
        tasks.start_run("alice", "r1")
    assert len(tasks.history("r1")) == 3


def test_generated_run_ids_and_listing(tasks: TaskTier) -> None:
    first = tasks.start_run("alice")
    second = tasks.start_run("bob")
    third = tasks.start_run("alice")
    assert first.run_id.startswith("run-")
    assert first.run_id != third.run_id
    third.fail("tool crashed: " + "x" * 30_000)
    assert [r.run_id for r in tasks.list_runs()] == [first.run_id, second.run_id, third.run_id]
    assert [r.run_id for r in tasks.list_runs(user_id="alice")] == [first.run_id, third.run_id]
    failed = tasks.list_runs(status="failed")
    assert [r.run_id for r in failed] == [third.run_id]
    error = failed[0].error or ""
    assert error.startswith("tool crashed: ")
    assert len(error) == 20_000
    assert [r.run_id for r in tasks.list_runs("alice", RunStatus.RUNNING)] == [first.run_id]


def test_tenants_do_not_see_each_other(kv: KVStore, tasks: TaskTier) -> None:
    tasks.start_run("alice", "r1").step("s", lambda: 1)
    other = TaskTier(kv, tenant="other")
    with pytest.raises(RunNotFoundError):
        other.get_run("r1")
    assert other.list_runs() == []
    # The same run id in another tenant is a different run.
    assert other.start_run("alice", "r1").step("s", lambda: 2) == 2
    assert tasks.latest_checkpoint("r1") is not None
    assert tasks.history("r1")[0].output == 1


# -- replay ---------------------------------------------------------------------


def test_resumed_handle_replays_committed_steps(tasks: TaskTier) -> None:
    calls = Calls()
    first = tasks.start_run("alice", "r1")
    recorded = [
        first.step(name, calls(f"{name}-{i}"), input=i)
        for i, name in enumerate(["fetch", "think", "fetch"])
    ]
    assert calls.count == 3

    handle = tasks.start_run("alice", "r1")
    assert handle.epoch == 2
    replayed = [
        handle.step("fetch", calls("changed"), input=0),
        handle.step("think", calls("changed"), input=1),
        handle.step("fetch", calls("changed"), input=2),
    ]
    assert replayed == recorded == ["fetch-0", "think-1", "fetch-2"]
    assert calls.count == 3  # nothing executed again

    assert handle.step("answer", calls("done"), input=3) == "done"
    assert calls.count == 4
    history = tasks.history("r1")
    assert_chain(history)
    assert [c.step for c in history] == ["fetch", "think", "fetch", "answer"]


def test_failed_step_is_retried_under_the_same_key(tasks: TaskTier) -> None:
    handle = tasks.start_run("alice", "r1")

    def boom() -> object:
        raise RuntimeError("tool down")

    with pytest.raises(RuntimeError, match="tool down"):
        handle.step("call", boom)
    assert tasks.history("r1") == []
    assert handle.step("call", lambda: "ok") == "ok"
    (ckpt,) = tasks.history("r1")
    assert (ckpt.seq, ckpt.idempotency_key) == (1, "r1/call/0")


def test_replay_with_another_input_is_refused(kv: KVStore, tasks: TaskTier) -> None:
    calls = Calls()
    tasks.start_run("alice", "r1").step("fetch", calls("page"), input={"url": "https://a"})
    before = snapshot(kv, "r1")

    handle = tasks.start_run("alice", "r1")
    with pytest.raises(InputMismatchError, match="'fetch'") as caught:
        handle.step("fetch", calls("other"), input={"url": "https://b"})
    assert caught.value.step == "fetch"
    assert caught.value.idempotency_key == "r1/fetch/0"
    assert caught.value.field == "input"
    assert calls.count == 1
    # An explicit key committed by another step is refused too.
    with pytest.raises(InputMismatchError, match="committed by step 'fetch'"):
        handle.step("parse", calls("x"), input={"url": "https://a"}, idempotency_key="r1/fetch/0")
    assert calls.count == 1
    after = snapshot(kv, "r1")
    # The resume changed the head and appended an event; no checkpoint was touched.
    space = keys.run_space(TENANT, "r1")
    assert [i for i in after[space] if not i[0].startswith("ev:")] == [
        i for i in before[space] if not i[0].startswith("ev:")
    ]


def test_append_checkpoint_is_idempotent_by_key(tasks: TaskTier) -> None:
    handle = tasks.start_run("alice", "r1")
    first = handle.append_checkpoint("tool", {"rows": 3}, input="q", idempotency_key="req-1")
    again = handle.append_checkpoint("tool", {"rows": 999}, input="q", idempotency_key="req-1")
    assert again == first  # the first commit wins
    with pytest.raises(InputMismatchError):
        handle.append_checkpoint("tool", {"rows": 3}, input="other", idempotency_key="req-1")
    # Without a key every call appends.
    a = handle.append_checkpoint("note", "x")
    b = handle.append_checkpoint("note", "x")
    assert (a.seq, b.seq) == (2, 3)
    assert a.idempotency_key != b.idempotency_key
    history = tasks.history("r1")
    assert_chain(history)
    assert [c.output for c in history] == [{"rows": 3}, "x", "x"]
    # A resumed step() with the same explicit key replays the appended checkpoint.
    calls = Calls()
    resumed = tasks.start_run("alice", "r1")
    assert resumed.step("tool", calls("new"), input="q", idempotency_key="req-1") == {"rows": 3}
    assert calls.count == 0


# -- fencing and status ---------------------------------------------------------


def test_stale_handle_is_fenced_out(kv: KVStore, tasks: TaskTier) -> None:
    calls = Calls()
    a = tasks.start_run("alice", "r1")
    a.step("one", calls(1))
    b = tasks.start_run("alice", "r1")
    assert (a.epoch, b.epoch) == (1, 2)
    before = snapshot(kv, "r1")

    with pytest.raises(StaleWriterError, match="epoch 2"):
        a.step("two", calls(2))
    with pytest.raises(StaleWriterError):
        a.append_checkpoint("two", 2)
    with pytest.raises(StaleWriterError):
        a.complete()
    with pytest.raises(StaleWriterError):
        a.fail("x")
    assert calls.count == 1  # fenced before the effect ran
    assert snapshot(kv, "r1") == before

    assert b.step("one", calls("ignored")) == 1
    assert b.step("two", calls(2)) == 2
    assert_chain(tasks.history("r1"))
    assert tasks.get_run("r1").head_seq == 2


def test_resume_during_a_step_fences_its_commit(kv: KVStore, tasks: TaskTier) -> None:
    a = tasks.start_run("alice", "r1")
    a.step("one", lambda: 1)
    taken: list[int] = []

    def slow_step() -> object:
        # Another worker takes the lease while this step's effect runs.
        taken.append(tasks.start_run("alice", "r1").epoch)
        return "late"

    with pytest.raises(StaleWriterError):
        a.step("two", slow_step)
    assert taken == [2]
    assert [c.step for c in tasks.history("r1")] == ["one"]
    assert tasks.get_run("r1").head_seq == 1

    b = tasks.start_run("alice", "r1")
    b.step("one", lambda: "ignored")
    assert b.step("two", lambda: "fresh") == "fresh"
    assert_chain(tasks.history("r1"))


def test_cancel_stops_writers(kv: KVStore, tasks: TaskTier) -> None:
    handle = tasks.start_run("alice", "r1")
    handle.step("one", lambda: 1)

    def cancelling() -> object:
        tasks.cancel("r1")
        return 2

    with pytest.raises(RunStateError, match="cancelled"):
        handle.step("two", cancelling)
    assert tasks.get_run("r1").status is RunStatus.CANCELLED
    before = snapshot(kv, "r1")
    assert tasks.cancel("r1").status is RunStatus.CANCELLED  # idempotent
    with pytest.raises(RunStateError):
        handle.append_checkpoint("two", 2)
    with pytest.raises(RunStateError):
        handle.complete()
    with pytest.raises(RunStateError):
        tasks.start_run("alice", "r1")
    assert snapshot(kv, "r1") == before

    done = tasks.start_run("alice", "r2")
    done.complete()
    with pytest.raises(RunStateError, match="completed"):
        tasks.cancel("r2")


def test_concurrent_resumes_and_appends_keep_seqs_gap_free(tasks: TaskTier) -> None:
    tasks.start_run("alice", "race")
    n_threads, rounds, per_round = 4, 4, 5
    barrier = threading.Barrier(n_threads, timeout=60)
    lock = threading.Lock()
    acknowledged: list[object] = []
    refused: list[Exception] = []
    unexpected: list[BaseException] = []

    def worker(tid: int) -> None:
        try:
            for r in range(rounds):
                barrier.wait()
                handle = tasks.start_run("alice", "race")
                if r % 2 == 0:
                    # Everyone has resumed before anyone writes: all but the last
                    # resumer must be refused. Odd rounds race resumes and writes.
                    barrier.wait()
                for j in range(per_round):
                    output = {"tid": tid, "round": r, "j": j}
                    try:
                        result = handle.step(f"w{tid}r{r}", lambda o=output: o, input=output)
                    except (StaleWriterError, ConflictError) as exc:
                        with lock:
                            refused.append(exc)
                        break
                    with lock:
                        acknowledged.append(result)
        except BaseException as exc:
            unexpected.append(exc)
            barrier.abort()

    threads = [threading.Thread(target=worker, args=(t,)) for t in range(n_threads)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert unexpected == []

    history = tasks.history("race")
    assert_chain(history)
    assert tasks.get_run("race").head_seq == len(history)
    assert tasks.get_run("race").lease_epoch == 1 + n_threads * rounds
    # Every acknowledged step is stored exactly once, and nothing else is.
    assert Counter(map(repr, (c.output for c in history))) == Counter(map(repr, acknowledged))
    assert len(acknowledged) == len(history) > 0
    stale = sum(isinstance(e, StaleWriterError) for e in refused)
    assert stale >= (n_threads - 1) * len(range(0, rounds, 2))


def test_committed_checkpoints_never_change(kv: KVStore, tasks: TaskTier) -> None:
    space = keys.run_space(TENANT, "r1")
    a = tasks.start_run("alice", "r1")
    a.step("one", lambda: {"v": 1}, scope={"phase": "plan", "notes": ["n1"]})
    a.step("two", lambda: {"v": 2})
    committed = dict(kv.scan(space, prefix=keys.CHECKPOINT_PREFIX))
    assert len(committed) == 2

    b = tasks.start_run("alice", "r1")
    with pytest.raises(StaleWriterError):
        a.step("three", lambda: "stale")
    with pytest.raises(ValueTooLargeError):
        b.append_checkpoint("huge", "x" * 70_000)
    with pytest.raises(InputMismatchError):
        b.step("one", lambda: 0, input="different")
    b.step("one", lambda: 0)
    b.step("two", lambda: 0)
    b.step("three", lambda: {"v": 3})
    b.complete(result="ok")

    after = dict(kv.scan(space, prefix=keys.CHECKPOINT_PREFIX))
    assert {k: after[k] for k in committed} == committed
    assert len(after) == 3
    assert tasks.history("r1")[0].scope == {"phase": "plan", "notes": ["n1"]}


# -- bad input ------------------------------------------------------------------


def test_bad_input_gets_typed_errors_and_changes_nothing(kv: KVStore, tasks: TaskTier) -> None:
    handle = tasks.start_run("alice", "r1")
    handle.step("one", lambda: 1)
    before = snapshot(kv, "r1", "r2", "nope")
    big = "x" * (64 * 1024 + 1)
    calls = Calls()

    cases: list[tuple[type[Exception], str | None, Callable[[], object]]] = [
        (InvalidInputError, "user_id", lambda: tasks.start_run("", "r2")),
        (InvalidInputError, "run_id", lambda: tasks.start_run("alice", "bad:id")),
        (InvalidInputError, "run_id", lambda: tasks.get_run("")),
        (ConflictError, None, lambda: tasks.start_run("alice", "r1", resume=False)),
        (ConflictError, None, lambda: tasks.start_run("mallory", "r1")),
        (RunNotFoundError, None, lambda: tasks.get_run("nope")),
        (RunNotFoundError, None, lambda: tasks.history("nope")),
        (RunNotFoundError, None, lambda: tasks.latest_checkpoint("nope")),
        (RunNotFoundError, None, lambda: tasks.get_checkpoint("nope", "ckpt-x")),
        (RunNotFoundError, None, lambda: tasks.cancel("nope")),
        (CheckpointNotFoundError, None, lambda: tasks.get_checkpoint("r1", "ckpt-bogus")),
        (
            CheckpointNotFoundError,
            None,
            lambda: tasks.get_checkpoint("r1", "ckpt-000000000001-000000000000"),
        ),
        (InvalidInputError, "limit", lambda: tasks.history("r1", limit=-1)),
        (InvalidInputError, "status", lambda: tasks.list_runs(status="sleeping")),
        (InvalidInputError, "step", lambda: handle.step("  ", calls(1))),
        (InvalidInputError, "step", lambda: handle.append_checkpoint("a\nb", 1)),
        (InvalidInputError, "output", lambda: handle.step("obj", calls(object()))),
        (InvalidInputError, "output", lambda: handle.append_checkpoint("nan", float("nan"))),
        (InvalidInputError, "input", lambda: handle.step("s", calls(1), input={1, 2})),
        (InvalidInputError, "scope", lambda: handle.step("s", calls(1), scope={"x": object()})),
        (
            InvalidInputError,
            "idempotency_key",
            lambda: handle.step("s", calls(1), idempotency_key=""),
        ),
        (ValueTooLargeError, "output", lambda: handle.step("big", calls(big))),
        (ValueTooLargeError, "output", lambda: handle.append_checkpoint("big", big)),
        (ValueTooLargeError, "result", lambda: handle.complete(result=big)),
        (InvalidInputError, "result", lambda: handle.complete(result=object())),
        (InvalidInputError, "error", lambda: handle.fail(42)),
    ]
    for error, field, call in cases:
        with pytest.raises(error) as caught:
            call()
        if field is not None:
            assert getattr(caught.value, "field", None) == field, (error, field, caught.value)
        assert snapshot(kv, "r1", "r2", "nope") == before, caught.value

    with pytest.raises(ValueTooLargeError, match="'big'"):
        handle.step("big", calls(big))
    with pytest.raises(InvalidInputError, match="'obj'"):
        handle.step("obj", calls(object()))
    # The handle still works and its seqs stay gap-free.
    assert handle.step("two", lambda: 2) == 2
    assert_chain(tasks.history("r1"))


def test_nested_steps_are_refused(tasks: TaskTier) -> None:
    handle = tasks.start_run("alice", "r1")
    with pytest.raises(InvalidInputError, match="cannot be nested"):
        handle.step("outer", lambda: handle.step("inner", lambda: 1))
    assert tasks.history("r1") == []
    assert handle.step("outer", lambda: "ok") == "ok"


def test_corrupt_records_are_reported_with_their_key(kv: KVStore, tasks: TaskTier) -> None:
    tasks.start_run("alice", "r1").step("one", lambda: 1)
    space = keys.run_space(TENANT, "r1")
    kv.commit([Put(space, keys.checkpoint_key(1), b'{"not": "a checkpoint"}')])
    with pytest.raises(CorruptRecordError, match=r"run:r1/ckpt:000000000001"):
        tasks.history("r1")
    resumed = tasks.start_run("alice", "r1")
    with pytest.raises(CorruptRecordError):
        resumed.step("one", lambda: 1)  # the replay reads the corrupt checkpoint
    kv.commit([Put(keys.runs_space(TENANT), "r1", b"garbage")])
    with pytest.raises(CorruptRecordError, match=r"default:runs/r1"):
        tasks.get_run("r1")


def test_attach_keeps_writing_with_the_current_epoch_only(kv: KVStore) -> None:
    tier = TaskTier(kv)
    first = tier.start_run("u1", "r-attach")
    attached = tier.attach("r-attach", first.epoch)
    attached.append_checkpoint("a", {"x": 1})
    assert tier.get_run("r-attach").lease_epoch == first.epoch  # attach took no lease
    second = tier.start_run("u1", "r-attach")
    with pytest.raises(StaleWriterError):
        tier.attach("r-attach", first.epoch)
    with pytest.raises(RunNotFoundError):
        tier.attach("nope", 1)
    second.complete()
    with pytest.raises(RunStateError):
        tier.attach("r-attach", second.epoch)


def test_bad_numbers_get_typed_errors_and_store_nothing(kv: KVStore, tasks: TaskTier) -> None:
    tasks.start_run("alice", "r1", budget_cost=2.0)
    before = snapshot(kv, "r1", "r2")
    inf, nan = float("inf"), float("nan")
    cases: list[tuple[str, Callable[[], object]]] = [
        ("lease_ttl", lambda: tasks.start_run("alice", "r2", lease_ttl=inf)),
        ("lease_ttl", lambda: tasks.start_run("alice", "r2", lease_ttl=1e20)),
        ("lease_ttl", lambda: tasks.start_run("alice", "r2", lease_ttl=nan)),
        ("lease_ttl", lambda: tasks.acquire("r1", lease_ttl=1e20)),
        ("lease_ttl", lambda: TaskTier(kv, lease_ttl=inf)),
        ("budget_cost", lambda: tasks.start_run("alice", "r2", budget_cost=nan)),
        ("budget_cost", lambda: tasks.start_run("alice", "r2", budget_cost=inf)),
        ("budget_cost", lambda: tasks.set_budget("r1", cost=nan)),
        ("budget_cost", lambda: tasks.set_budget("r1", cost=inf)),
        ("budget_tokens", lambda: tasks.set_budget("r1", tokens=1.5)),  # type: ignore[arg-type]
        ("cost", lambda: Charged(1, cost=inf)),
    ]
    for field, call in cases:
        with pytest.raises(InvalidInputError) as caught:
            call()
        assert caught.value.field == field, (field, caught.value)
        assert snapshot(kv, "r1", "r2") == before, field
    assert tasks.get_run("r1").budget_cost == 2.0
