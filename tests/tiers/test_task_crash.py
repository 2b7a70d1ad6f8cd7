"""Crash and race tests of the task tier: SIGKILLed workers, racing worker processes, and a
worker frozen (SIGSTOP) past its lease, taken over, then continued (SIGCONT) and fenced.

Every effect of :mod:`tests.tiers.crash_worker`'s script appends its
idempotency key to a log file, so "exactly once" is checked on what really
happened, not on what the store says.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path
from typing import IO

import pytest
from pydantic import JsonValue

from tests.tiers.crash_worker import STEPS, effect_keys, effects_done, open_store, run_to_end
from tests.waiting import wait_until
from tiers import keys
from tiers.backends.base import KVStore
from tiers.errors import RunNotFoundError
from tiers.models import Checkpoint, RunStatus
from tiers.task import EventKind, TaskTier

WORKER = Path(__file__).with_name("crash_worker.py")
ROOT = Path(__file__).resolve().parents[2]


class ForkServer:
    """The crash worker's fork server: forks a warm child per trial (about 1 ms)."""

    def __init__(self, stderr: IO[str]) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, str(WORKER), "serve"],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=stderr,
            text=True,
            cwd=ROOT,
            env={**os.environ, "PYTHONPATH": str(ROOT)},
        )

    def _ask(self, line: str) -> str:
        assert self.proc.stdin is not None
        assert self.proc.stdout is not None
        self.proc.stdin.write(line + "\n")
        self.proc.stdin.flush()
        answer = self.proc.stdout.readline()
        assert answer, "the fork server died"
        return answer.strip()

    def spawn(self, store: str, run_id: str, log: Path) -> int:
        answer = self._ask(f"run {store} {run_id} {log}")
        assert answer.startswith("pid "), answer
        return int(answer.split()[1])

    def spawn_frozen(self, store: str, run_id: str, log: Path, ttl: float, point: str) -> int:
        answer = self._ask(f"freeze {store} {run_id} {log} {ttl} {point}")
        assert answer.startswith("pid "), answer
        return int(answer.split()[1])

    def wait(self, pid: int) -> int:
        answer = self._ask(f"wait {pid}")
        assert answer.startswith("exit "), answer
        return int(answer.split()[1])

    def close(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write("quit\n")
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture(scope="module")
def fork_server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServer]:
    errors = (tmp_path_factory.mktemp("fork-server") / "stderr.txt").open("w")
    server = ForkServer(errors)
    yield server
    server.close()
    errors.close()


def _store(backend: str, tmp_path: Path, request: pytest.FixtureRequest) -> str:
    if backend == "redis":
        url: str = request.getfixturevalue("redis_url")
        return url
    return str(tmp_path / "crash.sqlite3")


def assert_chain(history: list[Checkpoint]) -> None:
    assert [c.seq for c in history] == list(range(1, len(history) + 1))
    assert [c.parent_id for c in history] == [None] + [c.checkpoint_id for c in history[:-1]]


def _normal(outputs: object, run_id: str) -> str:
    return json.dumps(outputs, sort_keys=True).replace(f'"{run_id}/', '"RUN/')


def _kill_trials(
    server: ForkServer, store: str, tmp_path: Path, trials: int, seed: int
) -> Counter[str]:
    kv = open_store(store)
    tier = TaskTier(kv)
    stats: Counter[str] = Counter()
    try:
        ref_log = tmp_path / "reference.log"
        assert server.wait(server.spawn(store, "reference", ref_log)) == 0
        # Uninterrupted runs time the window the kills are spread over: the fastest of three,
        # since a run slowed by a load spike would spread the kills past the trials' end
        # (then none is killed mid-run, and the test proves nothing).
        spans = []
        for n in range(3):
            began = time.monotonic()
            assert server.wait(server.spawn(store, f"timing-{n}", tmp_path / "timing.log")) == 0
            spans.append(time.monotonic() - began)
        span = min(spans)
        expected = tier.get_run("reference").result
        assert Counter(effects_done(ref_log)) == Counter(effect_keys("reference"))

        rng = random.Random(seed)
        for trial in range(trials):
            run_id, log = f"trial-{trial}", tmp_path / f"trial-{trial}.log"
            pid = server.spawn(store, run_id, log)
            time.sleep(rng.uniform(0.0, span * 1.1))
            os.kill(pid, signal.SIGKILL)
            code = server.wait(pid)
            assert code in (0, -signal.SIGKILL), f"worker failed (exit {code}): see stderr.txt"
            stats["killed" if code else "finished"] += 1
            at_kill = Counter(effects_done(log))
            assert max(at_kill.values(), default=1) == 1, at_kill
            try:
                stats["unknown at kill"] += len(tier.unknown_effects(run_id))
            except RunNotFoundError:
                stats["killed before start"] += 1

            outputs = run_to_end(tier, run_id, str(log))

            # Every effect ran exactly once, over the kill and the resume together.
            assert Counter(effects_done(log)) == Counter(effect_keys(run_id)), trial
            assert _normal(outputs, run_id) == _normal(expected, "reference")
            history = tier.history(run_id)
            assert_chain(history)
            assert [c.step for c in history] == STEPS
            info = tier.get_run(run_id)
            assert info.status is RunStatus.COMPLETED
            assert info.spent_tokens == 10  # debited once, whatever the number of resumes
            rebuilt = tier.rebuild(run_id)
            assert (rebuilt.status, rebuilt.head_seq, rebuilt.event_seq) == (
                info.status,
                info.head_seq,
                info.event_seq,
            )
            assert rebuilt.values == {"plan": 3, "booked": 1}
            events = tier.events(run_id)
            assert [e.seq for e in events] == list(range(1, len(events) + 1))
            for event in events:
                if event.data.get("source") == "reconcile":
                    stats[f"reconciled: {event.kind.value}"] += 1
                if event.kind is EventKind.EFFECT_OUTCOME_UNKNOWN:
                    stats["flagged unknown"] += 1
    finally:
        kv.close()
    assert stats["killed"] > 0, stats
    return stats


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_sigkill_never_runs_an_effect_twice(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, fork_server: ForkServer
) -> None:
    store = _store(backend, tmp_path, request)
    _kill_trials(fork_server, store, tmp_path, trials=10, seed=7)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_sigkill_many_trials_reconcile_unknown_outcomes(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest, fork_server: ForkServer
) -> None:
    store = _store(backend, tmp_path, request)
    stats = _kill_trials(fork_server, store, tmp_path, trials=150, seed=20240611)
    # Both reconcile outcomes were exercised: kills between EffectInvoked and the
    # effect (probe says not done, so it runs once now) and between the effect and
    # its record (probe finds it, so it is recorded without running again).
    assert stats["reconciled: EffectNotDone"] > 0, stats
    assert stats["reconciled: EffectRecorded"] > 0, stats


# -- two racing worker processes ------------------------------------------------------


def _race_worker(
    store: str, run_id: str, log: Path, name: str, go: Path, release: Path, ttl: float
):
    return subprocess.Popen(
        [
            sys.executable,
            str(WORKER),
            "race",
            store,
            run_id,
            str(log),
            name,
            str(go),
            str(release),
            str(ttl),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
    )


def _line(proc: subprocess.Popen[str]) -> str:
    assert proc.stdout is not None
    line = proc.stdout.readline().strip()
    if not line:
        raise AssertionError(f"worker said nothing: {proc.communicate(timeout=30)[1]}")
    return line


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_two_workers_race_one_wins_the_other_is_refused(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = _store(backend, tmp_path, request)
    log, go, release = tmp_path / "effects.log", tmp_path / "go", tmp_path / "release"
    procs = [_race_worker(store, "race", log, n, go, release, 60.0) for n in ("w1", "w2")]
    go.touch()
    first = {p.pid: _line(p) for p in procs}
    assert sorted(first.values()) == ["holding", "lease-held"], first
    winner = next(p for p in procs if first[p.pid] == "holding")
    assert _line(winner) == "paused"
    release.touch()
    final = _line(winner)
    assert final.startswith("done "), final
    for p in procs:
        p.communicate(timeout=30)
        assert p.returncode == 0

    kv = open_store(store)
    try:
        tier = TaskTier(kv)
        info = tier.get_run("race")
        assert (info.status, info.lease_epoch) == (RunStatus.COMPLETED, 1)  # never taken over
        history = tier.history("race")
        assert_chain(history)
        assert [c.step for c in history] == STEPS
        assert Counter(effects_done(log)) == Counter(effect_keys("race"))
    finally:
        kv.close()


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
def test_expired_lease_is_taken_over_and_the_old_worker_is_fenced(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    store = _store(backend, tmp_path, request)
    log, go = tmp_path / "effects.log", tmp_path / "go"
    go.touch()
    old = _race_worker(store, "r", log, "old", go, tmp_path / "release-old", 0.3)
    assert _line(old) == "holding"
    assert _line(old) == "paused"  # committed 2 units, now silent: no heartbeat

    kv = open_store(store)
    try:
        tier = TaskTier(kv)
        wait_until(
            lambda: not tier.get_run("r").lease_live(tier._now()),
            what="the lease to expire",
            every_s=0.05,
        )
        assert [r.run_id for r in tier.list_resumable()] == ["r"]

        new = _race_worker(store, "r", log, "new", go, tmp_path / "release-new", 30.0)
        (tmp_path / "release-new").touch()
        assert _line(new) == "holding"
        assert _line(new) == "paused"
        assert _line(new).startswith("done ")
        new.communicate(timeout=30)

        (tmp_path / "release-old").touch()
        assert _line(old) == "fenced"
        old.communicate(timeout=30)

        info = tier.get_run("r")
        assert (info.status, info.lease_epoch) == (RunStatus.COMPLETED, 2)
        history = tier.history("r")
        assert_chain(history)  # one linear history: no fork
        assert [c.step for c in history] == STEPS
        # "charge" ran in the old worker only; the new one replayed it.
        assert Counter(effects_done(log)) == Counter(effect_keys("r"))
        result: JsonValue = info.result
        assert isinstance(result, list)
        assert len(result) == 6
    finally:
        kv.close()


# -- a worker frozen past its lease: taken over, then continued and fenced ------------------

FROZEN_TTL = 0.3


def _proc_state(pid: int) -> str:
    """The kernel's state letter of a process: T when stopped, Z when exited and not yet reaped."""
    stat = Path(f"/proc/{pid}/stat").read_text()
    return stat.rsplit(")", 1)[1].split()[0]


def _run_bytes(kv: KVStore, run_id: str) -> dict[str, object]:
    """Every stored byte of one run: its head and its space."""
    return {
        "head": kv.get_many(keys.runs_space("default"), [run_id]),
        "space": kv.scan(keys.run_space("default", run_id)),
    }


def _fencing_trial(
    server: ForkServer, store: str, log: Path, run_id: str, point: str, stop_after: float = 0.0
) -> str:
    """One trial: freeze the first worker (at ``point``, or from outside after ``stop_after`` s),
    let its lease expire, finish the run here (another process), then continue the frozen one.

    Returns what the frozen worker saw first once continued (``StaleWriterError`` when it was
    fenced; ``completed`` / ``finished`` when it was not frozen before the end).
    """
    kv = open_store(store)
    tier = TaskTier(kv)
    pid = server.spawn_frozen(store, run_id, log, FROZEN_TTL, point)
    continued = False
    try:
        if point == "none":
            time.sleep(stop_after)
            os.kill(pid, signal.SIGSTOP)
        wait_until(lambda: _proc_state(pid) in "TZ", what="the worker to stop", every_s=0.01)

        def lease_gone() -> bool:
            try:
                return not tier.get_run(run_id).lease_live(tier._now())
            except RunNotFoundError:
                return True

        wait_until(lease_gone, what="the frozen worker's lease to expire", every_s=0.01)
        outputs = run_to_end(tier, run_id, str(log), dedupe=True, worker_id="taker", lease_ttl=30)
        before = _run_bytes(kv, run_id)
        os.kill(pid, signal.SIGCONT)
        continued = True
        assert server.wait(pid) == 0, "the frozen worker failed: see the fork server's stderr"
        outcome = json.loads(Path(f"{log}.outcome").read_text())

        info = tier.get_run(run_id)
        assert info.status is RunStatus.COMPLETED
        assert info.result == outputs
        history = tier.history(run_id)
        assert_chain(history)  # one linear lineage, gap-free seqs: no fork
        assert [c.step for c in history] == STEPS
        assert (info.superseded, info.unknown_effects) == ([], [])
        events = tier.events(run_id)
        assert [e.seq for e in events] == list(range(1, len(events) + 1))
        recorded = Counter(
            str(e.data["key"]) for e in events if e.kind is EventKind.EFFECT_RECORDED
        )
        assert recorded == Counter(effect_keys(run_id))  # each effect recorded once
        assert Counter(effects_done(log)) == Counter(effect_keys(run_id))  # and executed once
        assert not Path(f"{log}.zombie").exists()
        if outcome["first"] == "StaleWriterError":
            assert info.lease_epoch == 2
            # Every write the continued worker tried was fenced: nothing it wrote is stored.
            assert set(outcome["stale_writes"].values()) == {"StaleWriterError"}, outcome
            assert _run_bytes(kv, run_id) == before
            resumed = next(e.seq for e in events if e.kind is EventKind.RUN_RESUMED)
            assert {e.epoch for e in events if e.seq >= resumed} == {2}
        first: str = outcome["first"]
        return first
    finally:
        if not continued:
            os.kill(pid, signal.SIGKILL)
            server.wait(pid)
        kv.close()


@pytest.mark.parametrize("backend", ["sqlite", "redis"])
@pytest.mark.parametrize(
    "point",
    [
        "unit:2",  # between two units
        "after:ship",  # inside a top-level effect: it happened, its result is not recorded
        "before:email",  # inside an effect of a step, before the call: the zombie calls it late
    ],
)
def test_a_worker_frozen_past_its_lease_is_fenced_when_it_wakes(
    backend: str,
    point: str,
    tmp_path: Path,
    request: pytest.FixtureRequest,
    fork_server: ForkServer,
) -> None:
    store = _store(backend, tmp_path, request)
    log = tmp_path / "effects.log"
    assert _fencing_trial(fork_server, store, log, "frozen", point) == "StaleWriterError"
    attempts = Counter(effects_done(f"{log}.attempts"))
    # The zombie's late call reached the external system, which deduplicated it by key.
    assert attempts["frozen/notify/0/effect:email/0"] == (2 if point == "before:email" else 1)


@pytest.mark.slow
def test_workers_frozen_at_random_moments_are_fenced(
    tmp_path: Path, request: pytest.FixtureRequest, fork_server: ForkServer
) -> None:
    # Redis only: a process frozen inside a SQLite write transaction holds the
    # database's write lock until it runs again, so the taker would wait for it.
    store = _store("redis", tmp_path, request)
    rng = random.Random(20240612)
    seen: Counter[str] = Counter()
    for trial in range(30):
        log = tmp_path / f"trial-{trial}.log"
        seen[
            _fencing_trial(
                fork_server, store, log, f"frozen-{trial}", "none", rng.uniform(0.0, 0.03)
            )
        ] += 1
    assert seen["StaleWriterError"] > 0, seen
