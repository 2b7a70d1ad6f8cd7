"""The task tier against a plain Python model, driven by a Hypothesis state machine.

Random operations run on the real :class:`TaskTier` (SQLite and Redis) and on
a model of what each run should hold: starting and resuming runs, steps with
idempotency keys (some repeated, to replay), effects that succeed, raise, or
"crash" (the exception escapes and the worker abandons its handle), effects of
unknown outcome settled by ``reconcile``, ``safe_to_retry`` or an operator,
leases (a live one refuses a second worker; a handle taken over is fenced),
approval gates, forks, compaction, and the end of a run (complete, fail,
cancel). After every step each run's status, history, effect ledger, unknown
effects, event seqs and place in ``list_resumable`` must be what the model
says, and every effect function must have been called exactly as often as the
model allows (at most once, unless it was settled as not done).

Only the public API of :mod:`tiers.task` and :class:`RunHandle` is used.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable
from datetime import timedelta
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule
from hypothesis.stateful import run_state_machine_as_test as run_machine
from pydantic import JsonValue

from tests.tiers.task_model import (
    Clock,
    RunModel,
    WorkerCrashError,
    effect_name,
    endable,
    releasable,
    step_name,
    unsettled,
)
from tiers.backends.base import KVStore
from tiers.backends.redis_kv import RedisKVStore
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import (
    ApprovalPendingError,
    EffectOutcomeUnknownError,
    LeaseHeldError,
    PlanMismatchError,
    RunCancelledError,
    RunStateError,
    StaleWriterError,
)
from tiers.models import RunStatus
from tiers.task import NOT_DONE, EffectStatus, RunHandle, TaskTier, input_hash

USER = "u1"
LEASE_TTL = 30.0
# Few keys per kind, so they repeat (replays, re-invocations) often.
STEP_KEYS = ("s0", "s1", "s2")
EFFECT_KEYS = ("e0", "e1")
GATES = ("g0", "g1")
PLANS = ("refund", "delete")
MAX_RUNS = 3

run_picks = st.integers(min_value=0, max_value=MAX_RUNS - 1)
# How a worker asks to settle an effect invoked before but never recorded.
settlers = st.sampled_from(
    ["none", "none", "safe_to_retry", "reconcile_done", "reconcile_not_done"]
)


class TaskModelMachine(RuleBasedStateMachine):
    """One task tier on a real store and the model, stepped together."""

    def __init__(self, open_store: Callable[[], KVStore]) -> None:
        super().__init__()
        self.store = open_store()
        self.clock = Clock()
        self.tier = TaskTier(self.store, lease_ttl=LEASE_TTL, snapshot_every=3, clock=self.clock)
        self.runs: list[RunModel] = []
        self.forks = 0
        # Calls of each (run, effect key)'s function: what happened, and what the model allows.
        self.calls: Counter[tuple[str, str]] = Counter()
        self.allowed: Counter[tuple[str, str]] = Counter()

    def teardown(self) -> None:
        self.store.close()

    # -- helpers

    def _pick(self, pick: int, wanted: Callable[[RunModel], bool]) -> RunModel:
        """One of the runs ``wanted`` accepts (the rule's precondition says there is one)."""
        candidates = [run for run in self.runs if wanted(run)]
        return candidates[pick % len(candidates)]

    def _pick_worker(self, pick: int) -> tuple[RunModel, RunHandle]:
        """A run with a handle, one that goes on if there is any (else the refusals are tested)."""
        going_on = [run for run in self.runs if run.writable]
        run = self._pick(pick, lambda r: r in going_on or (not going_on and r.handle is not None))
        assert run.handle is not None
        return run, run.handle

    def _any(self, wanted: Callable[[RunModel], bool]) -> bool:
        return any(wanted(run) for run in self.runs)

    def _took(self, run: RunModel, handle: RunHandle) -> None:
        """A new lease epoch: every earlier handle of the run is fenced."""
        run.stale += run.abandoned + ([run.handle] if run.handle is not None else [])
        run.abandoned = []
        run.handle = handle
        run.lease_live = True
        if run.status is not RunStatus.PAUSED:
            run.status = RunStatus.RUNNING

    def _wrote(self, run: RunModel) -> None:
        """The current handle committed: its lease is renewed and the run is running."""
        run.lease_live = True
        if run.status is RunStatus.RESUMABLE:
            run.status = RunStatus.RUNNING

    def _effect_fn(self, run: RunModel, key: str, behaviour: str) -> Callable[[], JsonValue]:
        def fn() -> JsonValue:
            self.calls[(run.run_id, key)] += 1
            if behaviour == "raises":
                raise ValueError("the payment service answered 500")
            if behaviour == "crash":
                raise WorkerCrashError
            return {"effect": key, "call": self.calls[(run.run_id, key)]}

        return fn

    # -- taking runs

    @initialize()
    def first_run(self) -> None:
        self.start_run()

    @precondition(lambda self: len(self.runs) < MAX_RUNS)
    @rule()
    def start_run(self) -> None:
        run = RunModel(f"r{len(self.runs)}")
        handle = self.tier.start_run(USER, run.run_id)
        assert not handle.resumed
        self.runs.append(run)
        self._took(run, handle)

    @precondition(lambda self: bool(self.runs))
    @rule(pick=run_picks, how=st.sampled_from(["acquire", "after_expiry", "steal", "retake"]))
    def take(self, pick: int, how: str) -> None:
        """Another worker acquires the run (after every lease expired, or stealing), or the
        holder retakes its own live lease; every handle taken over is fenced from then on."""
        run = self._pick(pick, lambda r: True)
        if how == "after_expiry":
            self.clock.now += timedelta(seconds=LEASE_TTL * 2)
            for each in self.runs:
                each.lease_live = False
        worker_id = run.handle.worker_id if how == "retake" and run.handle is not None else None
        steal = how == "steal"
        if run.status.finished:
            with pytest.raises(RunStateError):
                self.tier.acquire(run.run_id, worker_id=worker_id, steal=steal)
            return
        if run.lease_live and not steal and worker_id is None:
            with pytest.raises(LeaseHeldError):
                self.tier.acquire(run.run_id)
            return
        handle = self.tier.acquire(run.run_id, worker_id=worker_id, steal=steal)
        assert handle.resumed
        self._took(run, handle)
        for stale in run.stale:
            self._fenced(stale)

    @staticmethod
    def _fenced(stale: RunHandle) -> None:
        """A handle whose lease epoch is over writes nothing, and its step's function never runs."""
        called: list[bool] = []
        with pytest.raises(StaleWriterError):
            stale.step("late", lambda: called.append(True), idempotency_key="late")
        assert not called

    @precondition(lambda self: self._any(releasable))
    @rule(pick=run_picks)
    def release(self, pick: int) -> None:
        run = self._pick(pick, releasable)
        assert run.handle is not None
        run.handle.release()
        run.handle = None
        run.lease_live = False
        if run.status is RunStatus.RUNNING:
            run.status = RunStatus.RESUMABLE

    # -- steps

    @precondition(lambda self: self._any(lambda r: r.handle is not None))
    @rule(
        pick=run_picks,
        key=st.sampled_from(STEP_KEYS),
        value=st.integers(0, 3),
        raises=st.booleans(),
    )
    def step(self, pick: int, key: str, value: int, raises: bool) -> None:
        run, handle = self._pick_worker(pick)
        called: list[int] = []

        def fn() -> JsonValue:
            called.append(value)
            if raises:
                raise ValueError("the model call failed")
            return {"step": key, "value": value}

        recorded = run.outputs
        if key in recorded and not run.status.finished:
            # A committed key replays its recorded output, also while the run is paused.
            assert handle.step(step_name(key), fn, idempotency_key=key) == recorded[key]
            assert not called
            return
        expected = self._refusal(run)
        if expected is not None:
            with pytest.raises(expected) as refused:
                handle.step(step_name(key), fn, idempotency_key=key)
            assert type(refused.value) is expected  # not merely a subclass
            assert not called
            return
        if raises:
            with pytest.raises(ValueError, match="model call failed"):
                handle.step(step_name(key), fn, idempotency_key=key)
            return
        output = handle.step(step_name(key), fn, idempotency_key=key)
        assert output == {"step": key, "value": value}
        run.checkpoints.append((step_name(key), key, output))
        self._wrote(run)

    def _refusal(self, run: RunModel) -> type[Exception] | None:
        """What the current handle's new write raises, or ``None`` if the run takes it."""
        if run.status is RunStatus.CANCELLED:
            return RunCancelledError
        if run.status.finished:
            return RunStateError
        if run.status is RunStatus.PAUSED:
            return ApprovalPendingError
        return None

    # -- effects

    @precondition(lambda self: self._any(lambda r: r.handle is not None))
    @rule(
        pick=run_picks,
        key=st.sampled_from(EFFECT_KEYS),
        behaviour=st.sampled_from(["ok", "ok", "raises", "crash"]),
        settle=settlers,
    )
    def effect(self, pick: int, key: str, behaviour: str, settle: str) -> None:
        run, _ = self._pick_worker(pick)
        self._effect(run, key, behaviour, settle)

    @precondition(lambda self: self._any(unsettled))
    @rule(pick=run_picks, behaviour=st.sampled_from(["ok", "raises"]), settle=settlers)
    def effect_again(self, pick: int, behaviour: str, settle: str) -> None:
        """The resumed script reaches an effect that was invoked, or settled, without a checkpoint."""
        run = self._pick(pick, unsettled)
        self._effect(run, min(run.effects), behaviour, settle)

    def _effect(self, run: RunModel, key: str, behaviour: str, settle: str) -> None:
        assert run.handle is not None
        handle, ledger_key = run.handle, (run.run_id, key)
        reconciled: JsonValue = {"effect": key, "reconciled": True}

        def reconcile(idempotency_key: str) -> object:
            assert idempotency_key == key
            return reconciled if settle == "reconcile_done" else NOT_DONE

        def call() -> JsonValue:
            return handle.effect(
                effect_name(key),
                self._effect_fn(run, key, behaviour),
                idempotency_key=key,
                safe_to_retry=settle == "safe_to_retry",
                reconcile=reconcile if settle.startswith("reconcile") else None,
            )

        recorded = run.outputs
        if key in recorded and not run.status.finished:
            assert call() == recorded[key]  # replayed: never called again
            return
        expected = self._refusal(run)
        if expected is not None:
            with pytest.raises(expected) as refused:
                call()
            assert type(refused.value) is expected
            return
        state = run.effects.get(key)
        if state == "resolved":
            # An operator recorded it: the checkpoint is committed now, without a call.
            output = run.resolved.pop(key)
            assert call() == output
            self._checkpoint_effect(run, key, output)
            return
        if state == "invoked":
            if settle == "none":
                with pytest.raises(EffectOutcomeUnknownError):
                    call()
                if key not in run.flagged:
                    run.flagged.add(key)
                    self._wrote(run)
                return
            if settle == "reconcile_done":
                assert call() == reconciled
                self._checkpoint_effect(run, key, reconciled)
                return
        # A new effect, or one settled as not done: EffectInvoked, then the call.
        self.allowed[ledger_key] += 1
        run.flagged.discard(key)
        run.effects[key] = "invoked"
        self._wrote(run)
        if behaviour == "ok":
            output = call()
            assert output == {"effect": key, "call": self.calls[ledger_key]}
            self._checkpoint_effect(run, key, output)
            return
        with pytest.raises(WorkerCrashError if behaviour == "crash" else ValueError):
            call()
        if behaviour == "crash":
            run.abandoned.append(handle)
            run.handle = None

    def _checkpoint_effect(self, run: RunModel, key: str, output: JsonValue) -> None:
        run.checkpoints.append((effect_name(key), key, output))
        run.recorded.add(key)
        run.effects.pop(key, None)
        run.flagged.discard(key)
        self._wrote(run)

    @precondition(lambda self: self._any(lambda r: "invoked" in r.effects.values()))
    @rule(pick=run_picks, rerun=st.booleans())
    def operator_resolves_effect(self, pick: int, rerun: bool) -> None:
        run = self._pick(pick, lambda r: "invoked" in r.effects.values())
        key = min(k for k, state in run.effects.items() if state == "invoked")
        if rerun:
            rec = self.tier.resolve_effect(run.run_id, key, rerun=True, by="ops")
            assert rec.status is EffectStatus.NOT_DONE
            run.effects[key] = "not_done"
        else:
            output: JsonValue = {"effect": key, "resolved": True}
            rec = self.tier.resolve_effect(run.run_id, key, output=output, by="ops")
            assert rec.status is EffectStatus.RECORDED
            run.effects[key] = "resolved"
            run.resolved[key] = output
        run.flagged.discard(key)

    # -- approvals

    @precondition(lambda self: self._any(lambda r: r.handle is not None))
    @rule(pick=run_picks, gate=st.sampled_from(GATES), plan=st.sampled_from(PLANS))
    def await_approval(self, pick: int, gate: str, plan: str) -> None:
        run, handle = self._pick_worker(pick)
        known = run.gates.get(gate)
        if run.status.finished:
            with pytest.raises(
                RunCancelledError if run.status is RunStatus.CANCELLED else RunStateError
            ):
                handle.await_approval(plan, key=gate)
            return
        if known is not None:
            frozen, decision = known
            if frozen != plan:
                with pytest.raises(PlanMismatchError):
                    handle.await_approval(plan, key=gate)
            elif decision == "requested":
                with pytest.raises(ApprovalPendingError):
                    handle.await_approval(plan, key=gate)
            else:
                assert handle.await_approval(plan, key=gate).approved == (decision == "granted")
            return
        with pytest.raises(ApprovalPendingError) as raised:
            handle.await_approval(plan, key=gate)
        if run.pending is not None:
            return  # another gate is pending: nothing was written
        assert raised.value.plan_hash == input_hash(plan, field="plan")
        run.gates[gate] = (plan, "requested")
        run.pending = gate
        self._wrote(run)
        run.status = RunStatus.PAUSED

    @precondition(lambda self: self._any(lambda r: r.pending is not None and not r.status.finished))
    @rule(pick=run_picks, grant=st.booleans())
    def operator_decides(self, pick: int, grant: bool) -> None:
        run = self._pick(pick, lambda r: r.pending is not None and not r.status.finished)
        assert run.pending is not None
        gate = run.pending
        plan_hash = input_hash(run.gates[gate][0], field="plan")
        decide = self.tier.approve if grant else self.tier.reject
        assert decide(run.run_id, plan_hash, by="ops").approved == grant
        run.gates[gate] = (run.gates[gate][0], "granted" if grant else "rejected")
        run.pending = None
        run.status = RunStatus.RESUMABLE

    # -- forks and compaction

    @precondition(
        lambda self: len(self.runs) < MAX_RUNS and self._any(lambda r: bool(r.checkpoints))
    )
    @rule(pick=run_picks, at=st.integers(min_value=0, max_value=20))
    def fork(self, pick: int, at: int) -> None:
        source = self._pick(pick, lambda r: bool(r.checkpoints))
        index = at % len(source.checkpoints)
        target = self.tier.history(source.run_id)[index]
        self.forks += 1
        run = RunModel(f"f{self.forks}", status=RunStatus.RESUMABLE)
        info = self.tier.fork(source.run_id, target.checkpoint_id, run.run_id)
        assert (info.parent_run_id, info.parent_checkpoint_id) == (
            source.run_id,
            target.checkpoint_id,
        )
        # The fork holds the prefix; effects recorded after the fork point run again there.
        run.checkpoints = list(source.checkpoints[: index + 1])
        self.runs.append(run)

    @precondition(lambda self: bool(self.runs))
    @rule(pick=run_picks)
    def compact(self, pick: int) -> None:
        run = self._pick(pick, lambda r: True)
        self.tier.compact(run.run_id)

    # -- the end of a run

    @precondition(lambda self: self._any(endable))
    @rule(pick=run_picks, ending=st.sampled_from(["complete", "fail", "cancel"]))
    def end_run(self, pick: int, ending: str) -> None:
        """The worker completes or fails its run, or an operator cancels it."""
        run = self._pick(pick, endable)
        if ending == "cancel":
            assert self.tier.cancel(run.run_id).status is RunStatus.CANCELLED
            run.status = RunStatus.CANCELLED
        elif run.handle is None or not run.writable:
            return
        elif ending == "complete":
            run.status = run.handle.complete({"done": True}).status
            assert run.status is RunStatus.COMPLETED
        else:
            run.status = run.handle.fail("gave up").status
            assert run.status is RunStatus.FAILED
        run.lease_live = False
        # A finished run refuses to be cancelled; a cancelled one stays cancelled.
        if run.status is RunStatus.CANCELLED:
            assert self.tier.cancel(run.run_id).status is RunStatus.CANCELLED
        else:
            with pytest.raises(RunStateError):
                self.tier.cancel(run.run_id)

    # -- invariants

    @invariant()
    def runs_hold_what_the_model_says(self) -> None:
        for run in self.runs:
            info = self.tier.get_run(run.run_id)
            assert info.status is run.status, run.run_id
            history = self.tier.history(run.run_id)
            assert [c.seq for c in history] == list(range(1, len(run.checkpoints) + 1))
            assert [(c.step, c.idempotency_key, c.output) for c in history] == run.checkpoints
            assert info.head_seq == len(run.checkpoints)
            for key, output in run.outputs.items():
                ckpt = self.tier.checkpoint_for_key(run.run_id, key)
                assert ckpt is not None
                assert ckpt.output == output
            assert set(info.unknown_effects) == run.flagged
            pending = info.pending_approval
            assert (None if pending is None else pending.key) == run.pending
            # Events are gap-free (after what compaction dropped), and fold to the same head.
            seqs = [e.seq for e in self.tier.events(run.run_id)]
            assert seqs == list(range(info.compacted_through + 1, info.event_seq + 1))
            rebuilt = self.tier.rebuild(run.run_id)
            assert (rebuilt.status, rebuilt.head_seq) == (run.status, len(run.checkpoints))
            assert set(rebuilt.unknown_effects) == run.flagged

    @invariant()
    def effect_ledger_matches(self) -> None:
        wanted = {
            "invoked": EffectStatus.INVOKED,
            "resolved": EffectStatus.RECORDED,
            "not_done": EffectStatus.NOT_DONE,
        }
        for run in self.runs:
            ledger = {rec.key: rec.status for rec in self.tier.effects(run.run_id)}
            for key, state in run.effects.items():
                assert ledger[key] is wanted[state], (run.run_id, key)
            for key in run.recorded:
                assert ledger[key] is EffectStatus.RECORDED, (run.run_id, key)

    @invariant()
    def each_effect_ran_as_often_as_allowed(self) -> None:
        assert self.calls == self.allowed

    @invariant()
    def resumable_runs_are_the_unblocked_unleased_ones(self) -> None:
        listed = {info.run_id for info in self.tier.list_resumable()}
        expected = {
            run.run_id
            for run in self.runs
            if run.status in (RunStatus.RUNNING, RunStatus.RESUMABLE)
            and not run.flagged
            and not run.lease_live
        }
        assert listed == expected


MODEL_SETTINGS = settings(
    max_examples=60,
    stateful_step_count=40,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.filter_too_much],
)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_task_tier_behaves_like_its_model(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    stores = iter(range(1_000_000))  # each example gets an empty store

    def opener() -> KVStore:
        if backend == "sqlite":
            return SqliteKVStore(tmp_path / f"model-{next(stores)}.sqlite3")
        url: str = request.getfixturevalue("redis_url")
        client = redis.Redis.from_url(url)
        client.flushall()
        client.close()
        return RedisKVStore(url)

    run_machine(lambda: TaskModelMachine(opener), settings=MODEL_SETTINGS)


def test_release_after_a_decision_leaves_the_run_resumable(sqlite_kv: SqliteKVStore) -> None:
    """Found by the model (fixed): ``release`` promises a resumable run, and ``rebuild`` folds one."""
    tasks = TaskTier(sqlite_kv)
    run = tasks.start_run(USER, "r0")
    with pytest.raises(ApprovalPendingError) as pending:
        run.await_approval("refund")
    tasks.approve("r0", pending.value.plan_hash, by="ops")
    assert tasks.get_run("r0").status is RunStatus.RESUMABLE
    run.release()
    assert tasks.rebuild("r0").status is RunStatus.RESUMABLE
    assert tasks.get_run("r0").status is RunStatus.RESUMABLE
