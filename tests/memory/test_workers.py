"""The worker fleet (``tiermem worker``): registered workflows run to the end exactly once.

The fleet tests start real ``tiermem worker`` processes on a real store (Redis,
then PostgreSQL), kill some with SIGKILL at random moments, drain one with
SIGTERM, and check what the store and the "external system" (a file the
workflow's effect appends to) hold.
This module is also the workers' ``--app``: :data:`workflows` below.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
import time
from collections import Counter
from collections.abc import Callable, Iterator, Sequence
from functools import partial
from pathlib import Path

import httpx
import pytest
from prometheus_client.parser import text_string_to_metric_families
from pydantic import JsonValue

from memory.facade import Memory
from memory.metrics import TiermemMetrics
from memory.workers import (
    REGISTRATION_KEY,
    WORKFLOW_STATE_KEY,
    Worker,
    WorkerApp,
    WorkflowRun,
    Workflows,
    load_app,
    registration,
)
from tests.conftest import free_port
from tests.waiting import wait_until
from tiers.backends import open_kv_store
from tiers.backends.base import KVStore
from tiers.errors import ConflictError, InvalidInputError
from tiers.models import RunStatus
from tiers.task import NOT_DONE, Charged, EventKind, TaskTier

ROOT = Path(__file__).resolve().parents[2]
APP = "tests.memory.test_workers:workflows"

workflows = Workflows()


def _pause(output: JsonValue, seconds: float) -> JsonValue:
    time.sleep(seconds)
    return output


def _append(log: Path, key: str) -> JsonValue:
    """The external system: one line per call, no deduplication of its own."""
    with log.open("a") as file:
        file.write(key + "\n")
    return {"line": key}


def _find(log: Path, key: str) -> object:
    """Reconcile an effect of unknown outcome: did its line reach the file?"""
    lines = log.read_text().splitlines() if log.exists() else []
    return {"line": key} if key in lines else NOT_DONE


@workflows.workflow("fleet")
def fleet_workflow(run: WorkflowRun, input: JsonValue) -> JsonValue:
    """Steps before and after one effect, each step taking ``pause`` seconds."""
    assert isinstance(input, dict)
    log = Path(str(input["log"]))
    n = input["n"]
    assert isinstance(n, int)
    pause = float(str(input.get("pause", 0.1)))
    for i in range(int(str(input.get("steps_before", 2)))):
        run.step(f"before-{i}", partial(_pause, {"n": n, "i": i}, pause))
    run.effect("append", lambda key: _append(log, key), reconcile=lambda key: _find(log, key))
    for i in range(int(str(input.get("steps_after", 2)))):
        run.step(f"after-{i}", partial(_pause, {"n": n, "i": i}, pause))
    return {"n": n, "double": 2 * n}


@workflows.workflow("broken")
def broken_workflow(run: WorkflowRun, input: JsonValue) -> JsonValue:
    """Fails after one step: the run ends failed with the error."""
    run.step("one", lambda: 1)
    raise ValueError(f"bad input {input!r}")


@workflows.workflow("gated")
def gated_workflow(run: WorkflowRun, input: JsonValue) -> JsonValue:
    """Waits for a human's approval of its plan between two steps."""
    plan = run.step("plan", lambda: {"refund": input})
    decision = run.await_approval(plan)
    return {"approved": decision.approved}


@workflows.workflow("spender")
def spender_workflow(run: WorkflowRun, input: JsonValue) -> JsonValue:
    """Spends 10 tokens a step, three steps."""
    for i in range(3):
        run.step(f"think-{i}", partial(Charged, i, tokens=10))
    return "done"


@pytest.fixture(params=["redis_url", "postgres_url"])
def store_url(request: pytest.FixtureRequest) -> str:
    """Each store a fleet can share: a real Redis server, then a real PostgreSQL server."""
    url: str = request.getfixturevalue(request.param)
    return url


@pytest.fixture
def store(store_url: str) -> Iterator[KVStore]:
    kv = open_kv_store(store_url)
    yield kv
    kv.close()


@pytest.fixture
def tasks(store: KVStore) -> TaskTier:
    return TaskTier(store)


# -- in one process ---------------------------------------------------------------------


def test_start_records_the_workflow_and_leaves_the_run_resumable(
    tasks: TaskTier, tmp_path: Path
) -> None:
    info = workflows.start(tasks, "maria", "fleet", {"n": 1, "log": "x"}, run_id="r-1")
    assert info.status is RunStatus.RESUMABLE
    assert info.lease_owner is None
    assert registration(tasks, "r-1") == ("fleet", {"n": 1, "log": "x"})
    assert [r.run_id for r in tasks.list_resumable()] == ["r-1"]
    handle = tasks.acquire("r-1")
    assert handle.state[WORKFLOW_STATE_KEY] == "fleet"
    assert tasks.checkpoint_for_key("r-1", REGISTRATION_KEY) is not None
    handle.release()
    # Starting again the same way is safe; another workflow or input under that id is not.
    again = workflows.start(tasks, "maria", "fleet", {"n": 1, "log": "x"}, run_id="r-1")
    assert again.run_id == "r-1"
    assert again.head_seq == info.head_seq
    with pytest.raises(ConflictError):
        workflows.start(tasks, "maria", "fleet", {"n": 2, "log": "x"}, run_id="r-1")
    with pytest.raises(ConflictError):
        workflows.start(tasks, "other", "fleet", {"n": 1, "log": "x"}, run_id="r-1")


def test_unknown_and_duplicate_workflows_are_refused(tasks: TaskTier) -> None:
    with pytest.raises(InvalidInputError, match="unknown workflow 'nope'"):
        workflows.start(tasks, "maria", "nope", {})
    assert tasks.list_runs() == []
    with pytest.raises(InvalidInputError, match="registered already"):
        workflows.workflow("fleet")(fleet_workflow)


def test_load_app_accepts_a_registry_or_an_app() -> None:
    assert load_app(APP).workflows is workflows
    assert load_app("tests.memory.test_workers:APP_WITH_MEMORY").workflows is workflows
    with pytest.raises(TypeError, match="module:attr"):
        load_app("tests.memory.test_workers")
    with pytest.raises(TypeError, match=r"not a memory\.workers\.Workflows"):
        load_app("tests.memory.test_workers:ROOT")


# The same workflows in workers that open the whole Memory from their settings.
APP_WITH_MEMORY = WorkerApp(workflows, open_memory=Memory.from_settings)


def test_a_worker_runs_runs_to_the_end_and_fails_broken_ones(
    tasks: TaskTier, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    for n in range(3):
        workflows.start(
            tasks, "maria", "fleet", {"n": n, "log": str(log), "pause": 0}, run_id=f"r-{n}"
        )
    workflows.start(tasks, "maria", "broken", 7, run_id="bad")
    # A run that is no workflow's is left alone.
    tasks.start_run("maria", "plain").release()
    worker = Worker(tasks, workflows, lease_ttl=5)
    done = []
    while (run_id := worker.run_once()) is not None:
        done.append(run_id)
    assert sorted(done) == ["bad", "r-0", "r-1", "r-2"]
    for n in range(3):
        info = tasks.get_run(f"r-{n}")
        assert info.status is RunStatus.COMPLETED
        assert info.result == {"n": n, "double": 2 * n}
    bad = tasks.get_run("bad")
    assert bad.status is RunStatus.FAILED
    assert bad.error == "ValueError: bad input 7"
    assert tasks.get_run("plain").status is RunStatus.RESUMABLE
    assert sorted(log.read_text().splitlines()) == [f"r-{n}/effect:append/0" for n in range(3)]


def test_a_run_paused_at_an_approval_gate_is_left_until_approved(tasks: TaskTier) -> None:
    workflows.start(tasks, "maria", "gated", 30, run_id="g")
    worker = Worker(tasks, workflows, lease_ttl=60)
    assert worker.run_once() == "g"
    info = tasks.get_run("g")
    assert info.status is RunStatus.PAUSED
    assert info.pending_approval is not None
    assert info.lease_owner is None  # released: no TTL to wait once approved
    assert worker.run_once() is None  # a paused run is nobody's work
    tasks.approve("g", info.pending_approval.plan_hash, by="ops")
    assert worker.run_once() == "g"
    done = tasks.get_run("g")
    assert done.status is RunStatus.COMPLETED
    assert done.result == {"approved": True}


def test_a_run_out_of_budget_fails_instead_of_coming_back(tasks: TaskTier) -> None:
    workflows.start(tasks, "maria", "spender", None, run_id="s", budget_tokens=15)
    worker = Worker(tasks, workflows, lease_ttl=60)
    assert worker.run_once() == "s"
    info = tasks.get_run("s")
    assert info.status is RunStatus.FAILED
    assert info.error is not None
    assert info.error.startswith("BudgetExceededError: ")
    assert info.spent_tokens == 20
    assert worker.run_once() is None


def test_stop_lets_the_current_step_commit_then_releases_the_run(
    tasks: TaskTier, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    workflows.start(
        tasks,
        "maria",
        "fleet",
        {"n": 5, "log": str(log), "pause": 0.5, "steps_before": 4},
        run_id="r",
    )
    worker = Worker(tasks, workflows, lease_ttl=60, poll_interval=0.05)
    serving = threading.Thread(target=worker.run)
    serving.start()
    wait_until(
        lambda: tasks.get_run("r").head_seq >= 2,
        60,
        what="the worker to commit two steps",
        every_s=0.05,
    )
    # The head at stop() lies between these two reads: a test thread descheduled for a step's
    # 0.5 s between one read and stop() must not look like a step started after stop().
    committed = tasks.get_run("r").head_seq
    worker.stop()
    at_stop = tasks.get_run("r").head_seq
    serving.join(60)
    assert not serving.is_alive()
    info = tasks.get_run("r")
    # The step in progress at stop() was committed, the next one never started.
    assert committed <= info.head_seq <= at_stop + 1
    assert info.status is RunStatus.RESUMABLE
    assert info.lease_owner is None
    assert tasks.events("r")[-1].kind is EventKind.RUN_RELEASED
    # Another worker resumes it at once (its lease was given back, no TTL to wait).
    assert Worker(tasks, workflows, lease_ttl=60).run_once() == "r"
    assert tasks.get_run("r").status is RunStatus.COMPLETED
    assert log.read_text().splitlines() == ["r/effect:append/0"]


def test_a_worker_stops_when_its_store_is_closed_instead_of_polling_it_forever(
    store: KVStore, tasks: TaskTier
) -> None:
    worker = Worker(tasks, workflows, lease_ttl=60, poll_interval=0.05, concurrency=2)
    serving = threading.Thread(target=worker.run)
    serving.start()
    try:
        store.close()  # a closed store is final: polling it again cannot succeed
        serving.join(120)
        assert not serving.is_alive(), "the worker kept polling a closed store"
        assert worker.draining
    finally:
        worker.stop()
        serving.join(60)


def test_a_worker_counts_runs_claimed_finished_by_outcome_and_its_idle_time(
    tasks: TaskTier, tmp_path: Path
) -> None:
    metrics = TiermemMetrics()
    log = tmp_path / "effects.log"
    for n in range(2):
        workflows.start(
            tasks, "maria", "fleet", {"n": n, "log": str(log), "pause": 0}, run_id=f"m-{n}"
        )
    workflows.start(tasks, "maria", "broken", 1, run_id="m-bad")
    workflows.start(tasks, "maria", "gated", 2, run_id="m-gated")
    worker = Worker(tasks, workflows, lease_ttl=60, poll_interval=0.05, metrics=metrics)
    while worker.run_once() is not None:
        pass

    def value(name: str, **labels: str) -> float:
        found = metrics.registry.get_sample_value(name, labels)
        return 0.0 if found is None else found

    assert value("tiermem_worker_runs_claimed_total") == 4
    assert value("tiermem_worker_runs_finished_total", outcome="completed") == 2
    assert value("tiermem_worker_runs_finished_total", outcome="failed") == 1
    assert value("tiermem_worker_runs_finished_total", outcome="released") == 1  # paused
    assert value("tiermem_worker_runs_active") == 0
    assert value("tiermem_worker_claim_duration_seconds_count") == 5  # the last found none

    serving = threading.Thread(target=worker.run)
    serving.start()
    wait_until(  # polled, found nothing, waited
        lambda: value("tiermem_worker_idle_seconds_total") > 0,
        60,
        what="the worker to count idle seconds",
        every_s=0.02,
    )
    # Far more steps than it takes to see three: the run is still active when the test looks
    # and stops the worker, however long the test thread was descheduled in between (the
    # drain ends it after the step in progress, so the steps left cost nothing).
    workflows.start(
        tasks,
        "maria",
        "fleet",
        {"n": 9, "log": str(log), "pause": 0.3, "steps_before": 200},
        run_id="m-long",
    )
    wait_until(
        lambda: tasks.get_run("m-long").head_seq >= 3,
        60,
        what="the worker to commit three steps of m-long",
        every_s=0.02,
    )
    assert value("tiermem_worker_runs_active") == 1
    worker.stop()
    serving.join(60)
    assert not serving.is_alive()
    assert value("tiermem_worker_runs_finished_total", outcome="drained") == 1
    assert value("tiermem_worker_runs_claimed_total") == 5
    assert value("tiermem_worker_runs_active") == 0


# -- a fleet of processes ---------------------------------------------------------------


class Fleet:
    """``tiermem worker`` processes on one store, their output in files for diagnosis."""

    def __init__(self, kv_url: str, workdir: Path, lease_ttl: float) -> None:
        self.kv_url = kv_url
        self.workdir = workdir
        self.lease_ttl = lease_ttl
        self.processes: list[subprocess.Popen[bytes]] = []

    def spawn(
        self, concurrency: int = 2, app: str = APP, options: Sequence[str] = ()
    ) -> subprocess.Popen[bytes]:
        index = len(self.processes)
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT),
            "TIERMEM_KV_URL": self.kv_url,
            "TIERMEM_DATA_DIR": str(self.workdir / f"data-{index}"),
        }
        with (self.workdir / f"worker-{index}.log").open("wb") as out:
            process = subprocess.Popen(
                [
                    sys.executable,
                    "-m",
                    "memory.cli",
                    "worker",
                    "--app",
                    app,
                    "--concurrency",
                    str(concurrency),
                    "--lease-ttl",
                    str(self.lease_ttl),
                    "--poll-interval",
                    "0.2",
                    *options,
                ],
                env=env,
                stdout=out,
                stderr=subprocess.STDOUT,
            )
        self.processes.append(process)
        return process

    def alive(self) -> list[subprocess.Popen[bytes]]:
        return [p for p in self.processes if p.poll() is None]

    def logs(self) -> str:
        return "\n".join(
            f"--- worker-{i} (exit {p.poll()}):\n"
            + (self.workdir / f"worker-{i}.log").read_text(errors="replace")[-3000:]
            for i, p in enumerate(self.processes)
        )

    def serving(self, index: int) -> bool:
        """Worker ``index`` has installed its SIGTERM handler (it says so as it starts serving)."""
        log = (self.workdir / f"worker-{index}.log").read_text(errors="replace")
        return ": serving " in log

    def stop_all(self) -> None:
        # As a deploy would once the pod is ready: a SIGTERM during interpreter start-up, before
        # the handler exists, ends a worker that holds nothing with -15, which is not a drain.
        wait_until(
            lambda: (
                not any(
                    p.poll() is None and not self.serving(i) for i, p in enumerate(self.processes)
                )
            ),
            60,
            what=lambda: f"every worker to start serving\n{self.logs()}",
            every_s=0.05,
        )
        for process in self.alive():
            process.send_signal(signal.SIGTERM)
        for process in self.processes:
            try:
                process.wait(60)
            except subprocess.TimeoutExpired:
                process.kill()
                process.wait()


@pytest.fixture
def fleet(store_url: str, tmp_path: Path) -> Iterator[Fleet]:
    # Short enough to wait out a few times, long enough that a loaded machine
    # does not starve a live worker of its heartbeats.
    group = Fleet(store_url, tmp_path, lease_ttl=5.0)
    yield group
    group.stop_all()


def _wait_for(
    condition: Callable[[], object], what: str, fleet: Fleet, timeout: float = 180
) -> None:
    """Wait for ``condition``; a timeout shows the workers' logs."""
    wait_until(condition, timeout, what=lambda: f"{what}\n{fleet.logs()}", every_s=0.1)


@pytest.mark.slow
def test_a_fleet_with_killed_workers_completes_every_run_exactly_once(
    fleet: Fleet, tasks: TaskTier, tmp_path: Path
) -> None:
    seed = random.randrange(1_000_000)
    rng = random.Random(seed)
    log = tmp_path / "effects.log"
    runs = [f"run-{n}" for n in range(12)]
    for n, run_id in enumerate(runs):
        workflows.start(
            tasks, "maria", "fleet", {"n": n, "log": str(log), "pause": 0.15}, run_id=run_id
        )
    for _ in range(3):
        fleet.spawn()
    for _ in range(3):
        # SIGKILL a worker at a random moment (while it holds runs, mid-step or mid-effect),
        # and start a new one in its place, as a deploy or a crash would.
        time.sleep(rng.uniform(0.5, 2.5))
        victims = fleet.alive()
        rng.choice(victims).send_signal(signal.SIGKILL)
        fleet.spawn(app="tests.memory.test_workers:APP_WITH_MEMORY")

    def all_done() -> bool:
        return all(tasks.get_run(r).status is RunStatus.COMPLETED for r in runs)

    _wait_for(all_done, f"every run to complete (seed {seed})", fleet)
    fleet.stop_all()
    for n, run_id in enumerate(runs):
        info = tasks.get_run(run_id)
        assert info.result == {"n": n, "double": 2 * n}, run_id
        assert sum(e.kind is EventKind.RUN_COMPLETED for e in tasks.events(run_id)) == 1
    lines = Counter(log.read_text().splitlines())
    assert lines == Counter({f"{run_id}/effect:append/0": 1 for run_id in runs}), f"seed {seed}"
    # Only killed workers exit otherwise than 0 (-9); every drained one exits 0.
    assert sorted({p.returncode for p in fleet.processes}) in ([-9, 0], [0]), fleet.logs()


@pytest.mark.slow
def test_sigterm_drains_and_another_worker_resumes_before_the_ttl(
    store_url: str, tasks: TaskTier, tmp_path: Path
) -> None:
    # A TTL far beyond the test's waits: the run can only move on because it was released.
    fleet = Fleet(store_url, tmp_path, lease_ttl=600.0)
    log = tmp_path / "effects.log"
    workflows.start(
        tasks,
        "maria",
        "fleet",
        # Steps enough (about 5 s) that the first worker still holds the run when its SIGTERM
        # comes, even if the test was descheduled for seconds after seeing its third step.
        {"n": 3, "log": str(log), "pause": 0.4, "steps_before": 3, "steps_after": 12},
        run_id="long",
    )
    try:
        first = fleet.spawn(concurrency=1)
        _wait_for(lambda: tasks.get_run("long").head_seq >= 3, "the first worker's steps", fleet)
        second = fleet.spawn(concurrency=1)
        first.send_signal(signal.SIGTERM)
        assert first.wait(120) == 0, fleet.logs()
        _wait_for(
            lambda: tasks.get_run("long").status is RunStatus.COMPLETED,
            "the second worker to finish the run",
            fleet,
            timeout=120,
        )
        events = tasks.events("long")
        released = [e for e in events if e.kind is EventKind.RUN_RELEASED]
        resumed = [e for e in events if e.kind is EventKind.RUN_RESUMED]
        assert len(released) >= 2  # by the starter, then by the drained worker
        drained = released[-1]
        assert f"-{first.pid}-" in str(drained.data["owner"])
        takeover = [e for e in resumed if e.seq > drained.seq]
        assert len(takeover) == 1
        # Taken as a free run (released), not as an expired lease of the drained worker.
        assert takeover[0].data["previous_owner"] is None
        assert f"-{second.pid}-" in str(takeover[0].data["owner"])
        assert tasks.get_run("long").result == {"n": 3, "double": 6}
        assert log.read_text().splitlines() == ["long/effect:append/0"]
    finally:
        fleet.stop_all()
    assert second.returncode == 0


@pytest.mark.slow
def test_a_worker_process_serves_its_metrics_on_the_metrics_port(
    fleet: Fleet, tasks: TaskTier, tmp_path: Path
) -> None:
    log = tmp_path / "effects.log"
    for n in range(2):
        workflows.start(
            tasks, "maria", "fleet", {"n": n, "log": str(log), "pause": 0}, run_id=f"p-{n}"
        )
    port = free_port()
    fleet.spawn(concurrency=1, options=["--metrics-port", str(port)])
    scraped: dict[str, float] = {}

    def both_counted() -> bool:
        try:
            text = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
        except httpx.TransportError:
            return False  # not listening yet
        scraped.clear()
        for family in text_string_to_metric_families(text):
            for sample in family.samples:
                labels = ",".join(f"{k}={v}" for k, v in sorted(sample.labels.items()))
                scraped[f"{sample.name}{{{labels}}}"] = sample.value
        return scraped.get("tiermem_worker_runs_finished_total{outcome=completed}") == 2

    _wait_for(both_counted, "the worker's metrics to count both runs", fleet, timeout=120)
    assert scraped["tiermem_worker_runs_claimed_total{}"] == 2
    assert scraped["tiermem_worker_runs_active{}"] == 0
    assert scraped["tiermem_checkpoint_commit_latency_seconds_count{}"] > 0  # the task tier's
    for n in range(2):
        assert tasks.get_run(f"p-{n}").status is RunStatus.COMPLETED
    fleet.stop_all()
    assert [p.returncode for p in fleet.processes] == [0], fleet.logs()


def test_the_worker_refuses_the_embedded_store(tmp_path: Path) -> None:
    env = {k: v for k, v in os.environ.items() if k != "TIERMEM_KV_URL"}
    env.update(PYTHONPATH=str(ROOT), TIERMEM_DATA_DIR=str(tmp_path / "data"))
    done = subprocess.run(
        [sys.executable, "-m", "memory.cli", "worker", "--app", APP],
        env=env,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 2
    assert "needs a store shared by processes" in done.stderr
    assert "redis://" in done.stderr
    assert "postgresql://" in done.stderr
    assert not (tmp_path / "data").exists()
