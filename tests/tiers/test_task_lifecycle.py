"""Task tier lifecycle on every KV backend: event log and snapshots, leases, approval gates,
time travel, compensation, budgets and retention."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from tiers import keys
from tiers.backends.base import Delete, KVStore
from tiers.errors import (
    ApprovalPendingError,
    BudgetExceededError,
    CompensationError,
    ConflictError,
    EffectOutcomeUnknownError,
    InvalidInputError,
    LeaseHeldError,
    PlanMismatchError,
    RunCancelledError,
    RunStateError,
    StaleWriterError,
)
from tiers.models import RunStatus
from tiers.task import Charged, EventKind, RunHandle, TaskTier

SPACE = keys.run_space("default", "r1")


class Clock:
    """A settable UTC clock for lease expiry and retention."""

    def __init__(self) -> None:
        self.now = datetime(2030, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now

    def advance(self, seconds: float) -> None:
        self.now += timedelta(seconds=seconds)


@pytest.fixture
def clock() -> Clock:
    return Clock()


@pytest.fixture
def tasks(kv: KVStore, clock: Clock) -> TaskTier:
    return TaskTier(kv, clock=clock, snapshot_every=5)


# -- event log and snapshots ---------------------------------------------------------


def test_events_are_gap_free_and_never_change(kv: KVStore, tasks: TaskTier) -> None:
    run = tasks.start_run("u", "r1")
    for i in range(4):
        run.step(f"s{i}", lambda i=i: Charged(i, tokens=3, state={f"k{i}": i}))
    early = dict(kv.scan(SPACE, prefix=keys.EVENT_PREFIX))
    resumed = tasks.start_run("u", "r1")
    resumed.step("s0", lambda: "ignored")
    resumed.step("late", lambda: 1)
    resumed.complete("ok")
    events = tasks.events("r1")
    assert [e.seq for e in events] == list(range(1, len(events) + 1))
    assert tasks.get_run("r1").event_seq == len(events)
    after = dict(kv.scan(SPACE, prefix=keys.EVENT_PREFIX))
    assert {k: after[k] for k in early} == early
    assert events[-1].kind is EventKind.RUN_COMPLETED
    assert [e.epoch for e in events if e.kind is EventKind.RUN_RESUMED] == [2]


def test_state_is_a_fold_of_deltas_loaded_from_the_latest_snapshot(
    kv: KVStore, tasks: TaskTier
) -> None:
    run = tasks.start_run("u", "r1")
    expected: dict[str, object] = {}
    for i in range(23):
        delta = {f"k{i % 4}": i, "last": i}
        expected.update(delta)
        run.step("s", lambda d=delta: Charged(None, state=d))
    assert run.state == expected
    snaps = kv.scan(SPACE, prefix=keys.SNAPSHOT_PREFIX)
    assert len(snaps) >= 4  # one per 5 events, and each step is 1 event
    history = tasks.history("r1")
    folded: dict[str, object] = {}
    for ckpt in history:
        folded.update(ckpt.state_delta or {})
        assert tasks.state_at("r1", ckpt.checkpoint_id) == folded

    # Resuming never reads the checkpoints before the latest snapshot: drop them.
    latest = tasks.get_run("r1").snapshot_event_seq
    before = [c for c in history if c.event_seq is not None and c.event_seq <= latest]
    kv.commit([Delete(SPACE, keys.checkpoint_key(c.seq)) for c in before])
    assert tasks.start_run("u", "r1").state == expected


def test_rebuild_from_snapshot_and_tail_matches_the_head(tasks: TaskTier) -> None:
    run = tasks.start_run("u", "r1", budget_tokens=1000)
    for i in range(7):
        run.step("s", lambda i=i: Charged(i, tokens=i, state={"i": i}))
    run.effect("pay", lambda: "paid")
    with pytest.raises(ApprovalPendingError) as pending:
        run.await_approval({"plan": 1})
    for _ in range(2):
        info = tasks.get_run("r1")
        rebuilt = tasks.rebuild("r1")
        assert rebuilt.status is info.status is RunStatus.PAUSED
        assert rebuilt.pending_plan_hash == pending.value.plan_hash
        assert (rebuilt.head_seq, rebuilt.head_checkpoint_id, rebuilt.event_seq) == (
            info.head_seq,
            info.head_checkpoint_id,
            info.event_seq,
        )
        assert (rebuilt.spent_tokens, rebuilt.values) == (21, {"i": 6})
        assert rebuilt.events_read < info.event_seq  # started from a snapshot
        # Compaction drops the events folded into the snapshot; the fold is unchanged.
        assert tasks.compact("r1") > 0 or tasks.get_run("r1").compacted_through > 0
    assert tasks.events("r1")[0].seq == tasks.get_run("r1").compacted_through + 1


# -- leases ----------------------------------------------------------------------


def test_live_lease_blocks_other_workers_until_it_expires(tasks: TaskTier, clock: Clock) -> None:
    a = tasks.start_run("u", "r1", worker_id="a", lease_ttl=10)
    a.step("one", lambda: 1)
    with pytest.raises(LeaseHeldError, match="steal=True") as held:
        tasks.start_run("u", "r1", worker_id="b", lease_ttl=10)
    assert held.value.owner == "a"
    assert tasks.list_resumable() == []

    clock.advance(8)
    assert a.heartbeat() == clock.now + timedelta(seconds=10)
    clock.advance(8)  # 16 s after the start, but 8 s after the heartbeat
    with pytest.raises(LeaseHeldError):
        tasks.acquire("r1", worker_id="b")
    clock.advance(3)
    assert [r.run_id for r in tasks.list_resumable()] == ["r1"]
    b = tasks.acquire("r1", worker_id="b", lease_ttl=10)
    assert b.epoch == 2
    with pytest.raises(StaleWriterError):
        a.heartbeat()
    with pytest.raises(StaleWriterError):
        a.step("two", lambda: 2)

    c = tasks.start_run("u", "r1", worker_id="c", steal=True)
    assert c.epoch == 3
    released = c.release()
    assert (released.status, released.lease_owner) == (RunStatus.RESUMABLE, None)
    assert [r.run_id for r in tasks.list_resumable()] == ["r1"]
    d = tasks.acquire("r1", worker_id="d")
    assert d.step("one", lambda: "x") == 1
    assert tasks.get_run("r1").status is RunStatus.RUNNING


def test_without_a_worker_id_each_call_holds_its_own_lease(tasks: TaskTier, clock: Clock) -> None:
    """Two threads (or two calls) of one process are two callers: neither takes the other's run."""
    first = tasks.start_run("u", "r1", lease_ttl=10)
    refused: list[BaseException] = []

    def other_thread() -> None:
        try:
            tasks.start_run("u", "r1", lease_ttl=10)
        except BaseException as exc:
            refused.append(exc)

    thread = threading.Thread(target=other_thread)
    thread.start()
    thread.join()
    assert [type(e) for e in refused] == [LeaseHeldError]
    with pytest.raises(LeaseHeldError) as held:
        tasks.start_run("u", "r1")
    assert (held.value.run_id, held.value.owner) == ("r1", first.worker_id)
    assert held.value.expires_at == (clock.now + timedelta(seconds=10)).isoformat()
    with pytest.raises(LeaseHeldError):
        tasks.acquire("r1")
    assert first.step("one", lambda: 1) == 1  # still the first caller's run
    assert tasks.get_run("r1").lease_owner == first.worker_id

    # The holder retakes its own live lease by naming itself; anyone else steals explicitly.
    again = tasks.start_run("u", "r1", worker_id=first.worker_id, lease_ttl=10)
    assert (again.epoch, again.worker_id) == (2, first.worker_id)
    stolen = tasks.acquire("r1", steal=True, lease_ttl=10)
    assert stolen.epoch == 3
    assert stolen.worker_id not in (None, first.worker_id)
    # Resume after a crash: an expired lease is anybody's.
    clock.advance(11)
    resumed = tasks.start_run("u", "r1")
    assert (resumed.epoch, resumed.step("one", lambda: 2)) == (4, 1)


def test_heartbeat_thread_does_not_disturb_steps(tasks: TaskTier) -> None:
    run = tasks.start_run("u", "r1", lease_ttl=30)
    stop = threading.Event()
    errors: list[BaseException] = []

    def beat() -> None:
        try:
            while not stop.is_set():
                run.heartbeat()
        except BaseException as exc:
            errors.append(exc)

    thread = threading.Thread(target=beat)
    thread.start()
    try:
        for i in range(20):
            run.step("s", lambda i=i: i)
    finally:
        stop.set()
        thread.join()
    assert errors == []
    assert tasks.get_run("r1").head_seq == 20


def test_cancel_is_honoured_at_the_next_step_boundary(tasks: TaskTier) -> None:
    run = tasks.start_run("u", "r1")
    run.step("one", lambda: 1)
    tasks.cancel("r1")
    called: list[int] = []
    with pytest.raises(RunCancelledError):
        run.step("two", lambda: called.append(1))
    with pytest.raises(RunCancelledError):
        run.effect("pay", lambda: called.append(1))
    assert called == []
    assert tasks.events("r1")[-1].kind is EventKind.RUN_CANCELLED


# -- approval gates ----------------------------------------------------------------


def test_approval_gate_pauses_and_cannot_be_skipped(tasks: TaskTier) -> None:
    plan = {"refund": 89.99, "to": "maria"}
    run = tasks.start_run("u", "r1")
    run.step("draft", lambda: plan)
    with pytest.raises(ApprovalPendingError) as pending:
        run.await_approval(plan)
    digest = pending.value.plan_hash
    info = tasks.get_run("r1")
    assert info.status is RunStatus.PAUSED
    assert info.pending_approval is not None
    assert info.pending_approval.plan_hash == digest
    # Neither this worker nor a resumed one can go past the gate.
    with pytest.raises(ApprovalPendingError):
        run.step("pay", lambda: 1)
    resumed = tasks.start_run("u", "r1")
    assert resumed.step("draft", lambda: {}) == plan
    with pytest.raises(ApprovalPendingError):
        resumed.await_approval(plan)
    with pytest.raises(ApprovalPendingError):
        resumed.effect("pay", lambda: 1)
    with pytest.raises(PlanMismatchError):
        tasks.approve("r1", "0" * 64, by="alice")
    for malformed in ("z" * 64, digest.upper(), digest[:63]):
        with pytest.raises(InvalidInputError) as bad:
            tasks.approve("r1", malformed, by="alice")
        assert bad.value.field == "plan_hash"
    assert tasks.list_resumable() == []

    approval = tasks.approve("r1", digest, by="alice", note="ok")
    assert (approval.approved, approval.by) == (True, "alice")
    assert tasks.approve("r1", digest, by="alice").approved  # idempotent
    assert tasks.get_run("r1").status is RunStatus.RESUMABLE
    final = tasks.start_run("u", "r1")
    final.step("draft", lambda: {})
    with pytest.raises(PlanMismatchError):
        final.await_approval({"refund": 1000})
    assert final.await_approval(plan).approved
    assert final.step("pay", lambda: "paid") == "paid"
    kinds = [e.kind for e in tasks.events("r1")]
    assert EventKind.APPROVAL_REQUESTED in kinds
    assert EventKind.APPROVAL_GRANTED in kinds


def test_rejected_plan_is_reported_to_the_run(tasks: TaskTier) -> None:
    run = tasks.start_run("u", "r1")
    with pytest.raises(ApprovalPendingError) as pending:
        run.await_approval(["delete", "everything"])
    tasks.reject("r1", pending.value.plan_hash, by="bob")
    with pytest.raises(RunStateError, match="no approval"):
        tasks.approve("r1", pending.value.plan_hash, by="bob")
    decision = run.await_approval(["delete", "everything"])
    assert (decision.approved, decision.by) == (False, "bob")


def test_who_decided_is_recorded_with_the_key_it_was_authenticated_by(tasks: TaskTier) -> None:
    """The library records ``by`` as given and no key; a service passes the caller's key."""
    run = tasks.start_run("u", "r1")
    run.step("s", lambda: 1)
    with pytest.raises(ApprovalPendingError) as pending:
        run.await_approval("plan")
    approval = tasks.approve("r1", pending.value.plan_hash, by="alice")
    assert (approval.by, approval.by_key) == ("alice", None)
    assert run.await_approval("plan").by_key is None
    with pytest.raises(ApprovalPendingError) as pending:
        run.await_approval("plan 2", key="second")
    keyed = tasks.reject("r1", pending.value.plan_hash, by="admin", by_key="0123456789ab")
    assert (keyed.by, keyed.by_key) == ("admin", "0123456789ab")
    assert run.await_approval("plan 2", key="second").by_key == "0123456789ab"
    decided = [e.data for e in tasks.events("r1") if e.kind.startswith("Approval")]
    assert [(d.get("by"), d.get("by_key")) for d in decided[1:]] == [
        ("alice", None),
        (None, None),  # the second request
        ("admin", "0123456789ab"),
    ]

    class Crash(BaseException):
        pass

    def crash() -> object:
        raise Crash

    with pytest.raises(Crash):
        run.effect("ship", crash, idempotency_key="p")
    rec = tasks.resolve_effect("r1", "p", rerun=True, by="ops", by_key="0123456789ab")
    assert (rec.resolved_by, rec.resolved_by_key) == ("ops", "0123456789ab")
    (first,) = tasks.history("r1")
    tasks.update_state("r1", first.checkpoint_id, {"x": 1}, by="carol")
    (edited,) = [e.data for e in tasks.events("r1") if e.kind is EventKind.STATE_UPDATED]
    assert (edited["by"], edited["by_key"]) == ("carol", None)
    with pytest.raises(InvalidInputError) as bad:
        tasks.approve("r1", "0" * 64, by="x", by_key="")
    assert bad.value.field == "by_key"


# -- time travel -----------------------------------------------------------------------


def test_fork_replays_history_up_to_the_checkpoint(tasks: TaskTier) -> None:
    run = tasks.start_run("u", "r1")
    for i in range(4):
        run.step("s", lambda i=i: Charged(i, state={"i": i}))
    third = tasks.history("r1")[2]
    forked = tasks.fork("r1", third.checkpoint_id, "r2")
    assert (forked.parent_run_id, forked.parent_checkpoint_id) == ("r1", third.checkpoint_id)
    assert forked.status is RunStatus.RESUMABLE
    assert tasks.state_at("r2", tasks.history("r2")[-1].checkpoint_id) == {"i": 2}
    calls: list[int] = []
    child = tasks.start_run("u", "r2")
    outs = [child.step("s", lambda i=i: (calls.append(i), i)[1]) for i in range(4)]
    assert outs == [0, 1, 2, 3]
    assert calls == [3]  # only the step after the fork point ran
    assert len(tasks.history("r1")) == 4  # the parent is untouched
    with pytest.raises(ConflictError):
        tasks.fork("r1", third.checkpoint_id, "r2")


def test_update_state_branches_and_reruns_later_steps(tasks: TaskTier) -> None:
    effects: list[str] = []
    run = tasks.start_run("u", "r1")
    run.step("a", lambda: Charged("a", state={"x": 1}))
    run.step("b", lambda: Charged("b", state={"y": 2, "seen": run.effect("pay", effects.append)}))
    run.step("c", lambda: Charged("c", state={"z": 3}))
    first = tasks.history("r1")[0]
    edited = tasks.update_state("r1", first.checkpoint_id, {"x": 100}, by="alice")
    assert edited.parent_id == first.checkpoint_id
    info = tasks.get_run("r1")
    assert info.superseded == [(2, 3)]
    assert info.status is RunStatus.RESUMABLE
    assert tasks.state_at("r1", edited.checkpoint_id) == {"x": 100}
    with pytest.raises(StaleWriterError):
        run.step("d", lambda: 1)  # the running worker was fenced out

    calls: list[str] = []
    resumed = tasks.start_run("u", "r1")
    assert resumed.state == {"x": 100}
    resumed.step("a", lambda: calls.append("a"))
    resumed.step(
        "b",
        lambda: Charged(
            calls.append("b"), state={"y": 20, "p": resumed.effect("pay", effects.append)}
        ),
    )
    resumed.step("c", lambda: Charged(calls.append("c"), state={"z": 30}))
    assert calls == ["b", "c"]  # steps after the branch point ran again
    assert len(effects) == 1  # the recorded effect did not
    assert resumed.state == {"x": 100, "y": 20, "p": None, "z": 30}
    assert len(tasks.history("r1")) == 6
    with pytest.raises(InvalidInputError, match="superseded"):
        tasks.update_state("r1", tasks.history("r1")[1].checkpoint_id, {})


# -- compensation, budgets, retention ----------------------------------------------------


def test_compensation_runs_in_reverse_once_each(tasks: TaskTier) -> None:
    undone: list[object] = []
    run = tasks.start_run("u", "r1")
    run.effect("book-hotel", lambda: "H1", compensation=lambda out: undone.append(out))
    run.effect("book-flight", lambda: "F1", compensation=lambda out: undone.append(out))
    run.effect("notify", lambda: "N1")
    with pytest.raises(CompensationError, match="notify"):
        run.compensate()
    assert undone == []

    run.register_compensation("notify", lambda out: undone.append(out))

    def failing(out: object) -> None:
        raise RuntimeError("flight API down")

    run.register_compensation("book-flight", failing)
    with pytest.raises(CompensationError, match="flight API down"):
        run.compensate()
    assert undone == ["N1"]
    resumed = tasks.start_run("u", "r1")
    resumed.register_compensation("notify", lambda out: undone.append(out))
    resumed.register_compensation("book-flight", lambda out: undone.append(out))
    resumed.register_compensation("book-hotel", lambda out: undone.append(out))
    assert resumed.compensate() == ["r1/effect:book-flight/0", "r1/effect:book-hotel/0"]
    assert undone == ["N1", "F1", "H1"]
    assert resumed.compensate() == []  # compensations are never compensated (one level)
    kinds = [e.kind for e in tasks.events("r1")]
    assert kinds.count(EventKind.COMPENSATED) == 3
    # Each time compensate() stopped, the event log says why, for the human who takes over.
    escalations = [e.data for e in tasks.events("r1") if e.kind is EventKind.COMPENSATION_ESCALATED]
    assert escalations == [
        {"effects": ["notify"], "reason": "no compensation registered"},
        {
            "effects": ["r1/effect:book-flight/0"],
            "reason": "compensation raised RuntimeError: flight API down",
        },
    ]


def test_budget_is_debited_once_and_enforced(tasks: TaskTier) -> None:
    run = tasks.start_run("u", "r1", budget_tokens=100, budget_cost=1.0)
    run.step("llm", lambda: Charged("a", tokens=60, cost=0.25))
    run.effect("api", lambda: Charged("b", tokens=45, cost=0.5))
    info = tasks.get_run("r1")
    assert (info.spent_tokens, info.spent_cost) == (105, 0.75)
    resumed = tasks.start_run("u", "r1")
    assert resumed.step("llm", lambda: Charged("x", tokens=60)) == "a"  # replay: no debit
    assert resumed.effect("api", lambda: "x") == "b"
    assert tasks.get_run("r1").spent_tokens == 105
    called: list[int] = []
    with pytest.raises(BudgetExceededError, match="105 of 100 tokens"):
        resumed.step("more", lambda: called.append(1))
    assert called == []
    tasks.set_budget("r1", tokens=1000)
    assert resumed.step("more", lambda: 1) == 1
    debits = [e for e in tasks.events("r1") if e.kind is EventKind.BUDGET_DEBITED]
    assert [e.data["tokens"] for e in debits] == [60, 45]


def test_sweep_deletes_finished_runs_after_retention(
    kv: KVStore, tasks: TaskTier, clock: Clock
) -> None:
    tasks.start_run("u", "done").complete()
    tasks.start_run("u", "live").step("s", lambda: 1)
    clock.advance(6 * 86400)
    assert tasks.sweep() == []
    clock.advance(2 * 86400)
    assert tasks.sweep() == ["done"]
    assert [r.run_id for r in tasks.list_runs()] == ["live"]
    assert kv.scan(keys.run_space("default", "done")) == []


def _saga(tasks: TaskTier, run_id: str, undone: list[object]) -> RunHandle:
    run = tasks.start_run("u", run_id)
    run.effect("book-hotel", lambda: "H1", compensation=undone.append)
    run.step("plan", lambda: run.effect("book-flight", lambda: "F1", compensation=undone.append))
    return run


@pytest.mark.parametrize("finish", ["cancel", "fail"])
def test_a_cancelled_or_failed_run_can_be_compensated(tasks: TaskTier, finish: str) -> None:
    undone: list[object] = []
    run = _saga(tasks, "r1", undone)
    if finish == "cancel":
        tasks.cancel("r1")
    else:
        run.fail("card declined")
    status = tasks.get_run("r1").status
    # The worker that saw the run end may undo what it did, with the lease it holds...
    assert run.compensate() == ["r1/plan/0/effect:book-flight/0", "r1/effect:book-hotel/0"]
    assert undone == ["F1", "H1"]
    info = tasks.get_run("r1")
    assert (info.status, info.head_seq) == (status, 2)  # still finished, no checkpoint added
    assert tasks.rebuild("r1").status is status
    kinds = [e.kind for e in tasks.events("r1")]
    assert kinds.count(EventKind.COMPENSATED) == 2
    with pytest.raises(RunStateError):
        run.step("more", lambda: 1)


def test_a_finished_run_is_compensated_by_a_worker_acquiring_it_for_that(
    tasks: TaskTier,
) -> None:
    undone: list[object] = []
    _saga(tasks, "r1", undone)
    tasks.cancel("r1")
    with pytest.raises(RunStateError, match="for_compensation=True"):
        tasks.acquire("r1")  # a cancelled run cannot be resumed...
    worker = tasks.acquire("r1", worker_id="undo", for_compensation=True)  # ...only undone
    assert worker.epoch == 2
    for call in (
        lambda: worker.step("s", lambda: 1),
        lambda: worker.effect("e", lambda: 1),
        lambda: worker.append_checkpoint("s", 1),
        lambda: worker.complete(),
    ):
        with pytest.raises(RunStateError, match="compensat"):
            call()
    worker.register_compensation("book-hotel", undone.append)

    def flight_down(out: object) -> None:
        raise RuntimeError("flight API down")

    worker.register_compensation("book-flight", flight_down)
    with pytest.raises(CompensationError, match="flight API down"):
        worker.compensate()
    # A crash of the compensating worker: the next one takes over and finishes.
    again = tasks.acquire("r1", for_compensation=True)
    with pytest.raises(StaleWriterError):
        worker.compensate()
    again.register_compensation("book-hotel", undone.append)
    again.register_compensation("book-flight", undone.append)
    assert again.compensate() == ["r1/plan/0/effect:book-flight/0", "r1/effect:book-hotel/0"]
    assert again.compensate() == []
    assert undone == ["F1", "H1"]
    assert tasks.get_run("r1").status is RunStatus.CANCELLED

    tasks.start_run("u", "r2").complete()
    with pytest.raises(RunStateError, match="completed"):
        tasks.acquire("r2", for_compensation=True)
    tasks.start_run("u", "r3")
    with pytest.raises(RunStateError, match="running"):
        tasks.acquire("r3", for_compensation=True)


def test_compensate_refuses_effects_of_unknown_outcome(tasks: TaskTier) -> None:
    undone: list[object] = []
    run = _saga(tasks, "r1", undone)

    class Crash(BaseException):
        pass

    def crash(key: str) -> object:
        raise Crash

    with pytest.raises(Crash):
        run.effect("charge", crash, compensation=undone.append)

    def ledger() -> list[tuple[str, str, bool]]:
        return [(r.key, r.status.value, r.compensated) for r in tasks.effects("r1")]

    before = ledger()
    for finish in (lambda: None, lambda: tasks.cancel("r1")):
        finish()  # while the run is live, and once it is cancelled
        with pytest.raises(EffectOutcomeUnknownError, match="r1/effect:charge/0") as caught:
            run.compensate()
        assert caught.value.effect_keys == ["r1/effect:charge/0"]
        assert undone == []  # nothing was undone while one outcome is unknown
        assert ledger() == before
    assert tasks.get_run("r1").unknown_effects == ["r1/effect:charge/0"]

    tasks.resolve_effect("r1", "r1/effect:charge/0", output="C1")  # allowed on a finished run
    assert tasks.get_run("r1").unknown_effects == []
    assert run.compensate() == [
        "r1/effect:charge/0",
        "r1/plan/0/effect:book-flight/0",
        "r1/effect:book-hotel/0",
    ]
    assert undone == ["C1", "F1", "H1"]


def test_a_run_blocked_on_an_unknown_outcome_is_flagged_and_not_resumable(
    tasks: TaskTier,
) -> None:
    class Crash(BaseException):
        pass

    def crash(key: str) -> object:
        raise Crash

    run = tasks.start_run("u", "r1")
    with pytest.raises(Crash):
        run.effect("charge", crash)
    run.release()
    # Not known to be blocked yet: the next worker may be able to reconcile it.
    assert [r.run_id for r in tasks.list_resumable()] == ["r1"]
    worker = tasks.acquire("r1")
    with pytest.raises(EffectOutcomeUnknownError):
        worker.effect("charge", lambda: "x")
    worker.release()
    info = tasks.get_run("r1")
    assert (info.status, info.unknown_effects) == (RunStatus.RESUMABLE, ["r1/effect:charge/0"])
    assert tasks.list_resumable() == []  # a pool would retry it forever: an operator decides
    assert tasks.rebuild("r1").unknown_effects == ["r1/effect:charge/0"]

    tasks.resolve_effect("r1", "r1/effect:charge/0", rerun=True)
    assert tasks.get_run("r1").unknown_effects == []
    assert [r.run_id for r in tasks.list_resumable()] == ["r1"]
    assert tasks.acquire("r1").effect("charge", lambda: "charged") == "charged"
    assert tasks.rebuild("r1").unknown_effects == []

    # A reconcile that settles a flagged effect clears the flag in the same commit.
    again = tasks.start_run("u", "r2")
    with pytest.raises(Crash):
        again.effect("charge", crash)
    with pytest.raises(EffectOutcomeUnknownError):
        tasks.start_run("u", "r2").effect("charge", lambda: "x")
    assert tasks.get_run("r2").unknown_effects == ["r2/effect:charge/0"]
    assert tasks.start_run("u", "r2").effect("charge", lambda: "y", reconcile=lambda k: "z") == "z"
    assert tasks.get_run("r2").unknown_effects == []
