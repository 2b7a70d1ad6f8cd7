"""Worker fleet benchmark: ``tiermem worker`` processes on a shared store (prints figures; not a test).

Usage::

    python bench/fleet_bench.py [--runs 200] [--workers 1,2,4] [--concurrency 2] [--ttl 5]
                                [--postgres | --postgres-url postgresql://...] [--quick]

A redis-server (``appendonly yes``, ``appendfsync always``) is started on a
free loopback port; ``--postgres`` adds the same figures on a PostgreSQL server
it starts the same way (``initdb`` on PATH; fsync and synchronous_commit on),
``--postgres-url`` on one of yours. Every worker is a real process
(``python -m memory.cli worker --app fleet_bench:workflows``).

The workflow is the shape of an agent task: four steps, each returning ~5 KB
(a tool result or an LLM answer), and one effect in the middle (an append to a
file with a reconcile probe, the external system).

Figures:

1. runs/s with K workers: the runs are created and held (the bench takes their
   leases), the K workers start and poll, then every run is released at once;
   the clock runs from the first release to the last completion (read from the
   runs' heads);
2. death to resume: a worker holding a run is SIGKILLed; the time from the kill
   to another worker's ``RunResumed`` event is bound by the lease TTL (every
   commit renews the lease and a heartbeat does every TTL/3, so what is left of
   it at the kill is between 2/3 of the TTL and, for a run committing steps
   often, nearly all of it) plus a poll interval; printed beside the TTL;
3. drain to resume: the same with SIGTERM: the worker finishes its step and
   releases the run, so the other worker takes it within a poll interval.

Numbers are printed, never asserted; the machine's other load shows in them.
"""

from __future__ import annotations

import argparse
import os
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from datetime import datetime
from functools import partial
from pathlib import Path

from pydantic import JsonValue
from task_bench import RedisAlways

from memory.workers import WorkflowRun, Workflows
from tiers.backends import open_kv_store
from tiers.backends.base import KVStore
from tiers.models import RunStatus
from tiers.task import NOT_DONE, EventKind, RunHandle, TaskTier

ROOT = Path(__file__).resolve().parents[1]
APP = "fleet_bench:workflows"
POLL = 0.2

workflows = Workflows()


def _output(step: str, n: int, size: int) -> JsonValue:
    """~``size`` bytes of text, different per run and step (so nothing compresses to nothing)."""
    seed = f"{step}-{n}-"
    return {"step": step, "text": (seed * (size // len(seed) + 1))[:size]}


def _append(log: Path, key: str) -> JsonValue:
    with log.open("a") as file:
        file.write(key + "\n")
    return {"line": key}


def _find(log: Path, key: str) -> object:
    lines = log.read_text().splitlines() if log.exists() else []
    return {"line": key} if key in lines else NOT_DONE


@workflows.workflow("agent-task")
def agent_task(run: WorkflowRun, input: JsonValue) -> JsonValue:
    """Plan, search, draft, effect, summarise: four ~5 KB steps and one effect."""
    assert isinstance(input, dict)
    n = int(str(input["n"]))
    pause = float(str(input.get("pause", 0)))
    size = int(str(input.get("size", 5000)))
    log = Path(str(input["log"]))

    def work(step: str) -> JsonValue:
        if pause:
            time.sleep(pause)
        return _output(step, n, size)

    run.step("plan", lambda: work("plan"))
    run.step("search", lambda: work("search"))
    run.step("draft", lambda: work("draft"))
    run.effect("send", lambda key: _append(log, key), reconcile=lambda key: _find(log, key))
    for i in range(int(str(input.get("extra_steps", 0)))):
        run.step(f"extra-{i}", partial(work, f"extra-{i}"))
    run.step("summarise", lambda: work("summarise"))
    return {"n": n}


# -- processes ----------------------------------------------------------------------------


class LocalPostgres:
    """A PostgreSQL server (``initdb`` + ``postgres``, fsync on) on a free loopback port.

    As root, initdb refuses to run, so the server then runs as the ``postgres`` user.
    """

    def __init__(self) -> None:
        initdb, postgres = shutil.which("initdb"), shutil.which("postgres")
        if initdb is None or postgres is None:
            raise SystemExit("PostgreSQL is not installed (initdb and postgres on PATH)")
        run_as = "postgres" if os.geteuid() == 0 else None
        # A folder of its own: the server's user must be able to reach it.
        self.workdir = workdir = Path(tempfile.mkdtemp(prefix="fleet-bench-pg-"))
        if run_as is not None:
            shutil.chown(workdir, run_as, run_as)
        data = workdir / "data"
        subprocess.run(
            [initdb, "-D", str(data), "-U", "tiermem", "--auth=trust", "--no-sync"],
            check=True,
            stdout=subprocess.DEVNULL,
            user=run_as,
            group=run_as,
            extra_groups=[] if run_as else None,
        )
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = int(sock.getsockname()[1])
        command = [postgres, "-D", str(data), "-p", str(port), "-c", "listen_addresses=127.0.0.1"]
        command += ["-c", f"unix_socket_directories={workdir}", "-c", "fsync=on"]
        command += ["-c", "synchronous_commit=on", "-c", "max_connections=200"]
        self.proc = subprocess.Popen(
            command,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            user=run_as,
            group=run_as,
            extra_groups=[] if run_as else None,
        )
        self.url = f"postgresql://tiermem@127.0.0.1:{port}/postgres"
        ready = shutil.which("pg_isready")
        for _ in range(600):
            if (
                ready is None
                or subprocess.run(
                    [ready, "-q", "-h", "127.0.0.1", "-p", str(port)], check=False
                ).returncode
                == 0
            ):
                break
            time.sleep(0.05)

    def stop(self) -> None:
        self.proc.send_signal(signal.SIGINT)  # fast shutdown
        self.proc.wait(30)
        shutil.rmtree(self.workdir, ignore_errors=True)


class Fleet:
    """Worker processes of one tenant on one store; each one's output in a file."""

    def __init__(self, url: str, tenant: str, workdir: Path, ttl: float, concurrency: int) -> None:
        self.url, self.tenant, self.workdir = url, tenant, workdir
        self.ttl, self.concurrency = ttl, concurrency
        self.procs: list[subprocess.Popen[bytes]] = []

    def spawn(self) -> subprocess.Popen[bytes]:
        log = self.workdir / f"{self.tenant}-worker-{len(self.procs)}.log"
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join([str(ROOT / "bench"), str(ROOT)]),
            "TIERMEM_KV_URL": self.url,
            "TIERMEM_DATA_DIR": str(self.workdir / "data"),
        }
        command = [sys.executable, "-m", "memory.cli", "worker", "--app", APP]
        command += ["--tenant", self.tenant, "--concurrency", str(self.concurrency)]
        command += ["--lease-ttl", str(self.ttl), "--poll-interval", str(POLL)]
        with log.open("wb") as out:
            proc = subprocess.Popen(command, env=env, stdout=out, stderr=subprocess.STDOUT)
        self.procs.append(proc)
        return proc

    def wait_ready(self) -> None:
        """Until every worker has imported its app and connected (it prints ``serving``)."""
        for i, proc in enumerate(self.procs):
            log = self.workdir / f"{self.tenant}-worker-{i}.log"
            _wait(partial(_says, log, "serving"), f"worker {proc.pid} to start", 120)

    def stop(self) -> None:
        for proc in self.procs:
            if proc.poll() is None:
                proc.send_signal(signal.SIGTERM)
        for proc in self.procs:
            try:
                proc.wait(60)
            except subprocess.TimeoutExpired:
                proc.kill()
                proc.wait()


def _says(log: Path, text: str) -> bool:
    return text in log.read_text()


def _wait(condition: Callable[[], bool], what: str, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        if time.monotonic() > deadline:
            raise SystemExit(f"timed out waiting for {what}")
        time.sleep(0.02)


def _start(tasks: TaskTier, run_id: str, n: int, log: Path, **extra: JsonValue) -> None:
    workflows.start(tasks, "bench", "agent-task", {"n": n, "log": str(log), **extra}, run_id=run_id)


# -- 1. throughput ------------------------------------------------------------------------


def throughput(
    url: str, kv: KVStore, workdir: Path, k: int, runs: int, args: argparse.Namespace
) -> float:
    tenant = f"tput{k}"
    tasks = TaskTier(kv, tenant=tenant)
    log = workdir / f"{tenant}.log"
    held: list[RunHandle] = []
    for n in range(runs):
        _start(tasks, f"r{n}", n, log)
        # Held by the bench until every worker is up, so none of them gets a head start.
        held.append(tasks.acquire(f"r{n}", lease_ttl=3600))
    fleet = Fleet(url, tenant, workdir, args.ttl, args.concurrency)
    try:
        for _ in range(k):
            fleet.spawn()
        fleet.wait_ready()
        began = datetime.now().astimezone()
        for handle in held:
            handle.release()
        ids = [f"r{n}" for n in range(runs)]
        _wait(
            lambda: all(tasks.get_run(r).status is RunStatus.COMPLETED for r in ids),
            "every run to complete",
            3600,
        )
        ended = max(tasks.get_run(r).finished_at or began for r in ids)
    finally:
        fleet.stop()
    lines = log.read_text().splitlines()
    if not len(lines) == len(set(lines)) == runs:
        raise SystemExit(
            f"{len(lines)} effect lines for {runs} runs: an effect was lost or repeated"
        )
    return runs / (ended - began).total_seconds()


# -- 2 and 3. death or drain to resume ----------------------------------------------------


def takeover(
    url: str, kv: KVStore, workdir: Path, how: signal.Signals, trial: int, ttl: float
) -> float:
    """Seconds from the signal to the holder to ``RunResumed`` by the other worker."""
    tenant = f"take{how.name.lower()}{trial}"
    tasks = TaskTier(kv, tenant=tenant)
    log = workdir / f"{tenant}.log"
    fleet = Fleet(url, tenant, workdir, ttl, 1)
    try:
        first = fleet.spawn()
        fleet.wait_ready()
        _start(tasks, "long", 0, log, pause=0.3, extra_steps=40)
        _wait(lambda: tasks.get_run("long").head_seq >= 3, "the first worker's steps", 120)
        fleet.spawn()
        fleet.wait_ready()
        time.sleep(ttl * (trial % 3) / 3 / 3)  # kill at different points of the heartbeat cycle
        sent = datetime.now().astimezone()
        first.send_signal(how)

        def resumed_after() -> datetime | None:
            for event in tasks.events("long"):
                if event.kind is EventKind.RUN_RESUMED and event.at > sent:
                    return event.at
            return None

        _wait(lambda: resumed_after() is not None, "another worker to resume the run", ttl * 4 + 60)
        at = resumed_after()
        assert at is not None
        return (at - sent).total_seconds()
    finally:
        fleet.stop()


def bench_store(name: str, url: str, workdir: Path, args: argparse.Namespace) -> None:
    # Each store's effect files and worker logs apart: the tenants' names repeat per store.
    workdir = Path(tempfile.mkdtemp(prefix="store-", dir=workdir))
    kv = open_kv_store(url)
    try:
        print(f"\n== {name} ==")
        print(
            f"workflow: 4 steps of ~5 KB, 1 effect; {args.runs} runs; "
            f"{args.concurrency} threads per worker; lease TTL {args.ttl} s; poll {POLL} s"
        )
        for k in args.workers:
            rate = throughput(url, kv, workdir, k, args.runs, args)
            print(f"  {k} worker(s) x {args.concurrency} threads: {rate:7.1f} runs/s")
        for how in (signal.SIGKILL, signal.SIGTERM):
            times = [takeover(url, kv, workdir, how, t, args.ttl) for t in range(args.trials)]
            what = "killed (SIGKILL)" if how is signal.SIGKILL else "drained (SIGTERM)"
            print(
                f"  {what} -> resumed by another worker: median {statistics.median(times):.2f} s, "
                f"max {max(times):.2f} s over {len(times)} trials (lease TTL {args.ttl} s, "
                f"poll {POLL} s)"
            )
    finally:
        kv.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=200)
    parser.add_argument("--workers", default="1,2,4", help="comma-separated worker counts")
    parser.add_argument("--concurrency", type=int, default=2, help="threads per worker")
    parser.add_argument("--ttl", type=float, default=5.0, help="lease TTL in seconds")
    parser.add_argument("--trials", type=int, default=3, help="kills and drains measured")
    parser.add_argument("--postgres", action="store_true", help="also bench a local PostgreSQL")
    parser.add_argument("--postgres-url", help="also bench this PostgreSQL database instead")
    parser.add_argument("--quick", action="store_true", help="40 runs, 1 and 2 workers, 1 trial")
    args = parser.parse_args()
    args.workers = [int(k) for k in str(args.workers).split(",")]
    if args.quick:
        args.runs, args.workers, args.trials = 40, [1, 2], 1
    with tempfile.TemporaryDirectory(prefix="fleet-bench-") as tmp:
        workdir = Path(tmp)
        (workdir / "redis").mkdir()
        server = RedisAlways(workdir / "redis")
        try:
            bench_store("Redis (appendfsync always)", server.url, workdir, args)
        finally:
            server.stop()
        if args.postgres_url:
            bench_store("PostgreSQL", args.postgres_url, workdir, args)
        elif args.postgres:
            local = LocalPostgres()
            try:
                bench_store(
                    "PostgreSQL (fsync on, synchronous_commit on)", local.url, workdir, args
                )
            finally:
                local.stop()


if __name__ == "__main__":
    main()
