"""Soak test of the replicated service under crashes, on loopback, bounded in time.

Starts, each on a free loopback port and in its own temporary directory:

- ``redis-server`` (``appendonly yes``, ``appendfsync always``: the only Redis tiermem accepts),
- a ``chroma run`` server (the venv's ``chroma``),
- an API key (``tiermem keys create --tenant soak`` against that Redis),
- two ``tiermem serve`` replicas on that Redis + Chroma (job lease 5 s, index check every 10 s).

Then for ``--seconds`` it runs ``--threads`` client threads, each a ``MemoryClient`` on a random
replica that retries a request on the other replica when the first cannot be reached. The mix:

- ``fact``: ``set_fact`` of a unique value (every attempt and every acknowledgement recorded),
- ``session``: ``POST /v1/users/{u}/sessions`` of a small transcript (202: the job id recorded),
- ``run``: ``start_run``, a checkpoint, an effect through ``RemoteRun.effect`` whose body appends
  its idempotency key to a local ledger file, the same effect asked again (must not run), complete,
- ``read``: recall, continuation context or the facts list.

A chaos thread every ``--chaos-interval`` seconds (jittered) SIGKILLs one of: a replica (either),
Redis, the Chroma server (each once per round of three, in random order), and restarts it on the
same port and directory (Redis replays its AOF).

At the end chaos stops, the remaining jobs get ``--drain`` seconds, the replicas are stopped, and a
fresh ``Memory`` on the same Redis + Chroma audits what was acknowledged:

- lost: an acknowledged fact that reads back neither its value nor a later attempted one; an
  acknowledged checkpoint or completed run that is gone;
- duplicated: an idempotency key whose effect body ran more than once (the ledger);
- unsummarized: a 202-accepted transcript whose session has no summary (or whose job did not
  succeed), and sessions still pending;
- index: ``Memory.check_index()`` after the outbox is flushed (missing, stale, orphan vectors).

Usage::

    python bench/soak.py [--seconds 60] [--threads 4] [--chaos-interval 6] [--drain 60] [--seed N]

Exit status 0 when every audit line is 0, 1 otherwise. Not a test: nothing here runs in the suite.
"""

from __future__ import annotations

import argparse
import os
import random
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections import Counter, defaultdict
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar

import httpx

from memory import Memory
from memory.client import ClientError, MemoryClient, RemoteRun
from memory.settings import Settings
from tiers.errors import BackendUnavailableError

T = TypeVar("T")

VENV_BIN = Path(sys.executable).parent
TIERMEM = str(VENV_BIN / "tiermem")
TENANT = "soak"
TOPICS = [
    ("Postgres", "We moved the orders table to Postgres 16 and fixed the slow migration."),
    ("Kafka", "The Kafka consumer lag alert fired; we raised the partition count to 12."),
    ("React", "The React dashboard now lazy-loads charts; bundle size dropped by 40%."),
    ("Terraform", "Terraform state was split per environment; staging applies on merge."),
]


def free_port() -> int:
    """A free TCP port on loopback."""
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def wait_until(
    check: Callable[[], bool], proc: subprocess.Popen[bytes], what: str, timeout: float
) -> None:
    deadline = time.monotonic() + timeout
    while True:
        try:
            if check():
                return
        except Exception:
            pass
        if proc.poll() is not None:
            raise RuntimeError(f"{what} exited with {proc.returncode} while starting")
        if time.monotonic() > deadline:
            raise RuntimeError(f"{what} did not become ready in {timeout:.0f} s")
        time.sleep(0.1)


def sigkill(proc: subprocess.Popen[bytes] | None) -> None:
    if proc is not None and proc.poll() is None:
        proc.send_signal(signal.SIGKILL)
        proc.wait(30)


def terminate(proc: subprocess.Popen[bytes] | None, timeout: float = 20) -> None:
    if proc is not None and proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            sigkill(proc)


class Stack:
    """Redis, a Chroma server and two replicas, each restartable on its own port and directory."""

    def __init__(self, work: Path) -> None:
        self.work = work
        self.redis_port = free_port()
        self.chroma_port = free_port()
        self.replica_ports = [free_port(), free_port()]
        self.kv_url = f"redis://127.0.0.1:{self.redis_port}/0"
        self.vector_url = f"http://127.0.0.1:{self.chroma_port}"
        self.redis: subprocess.Popen[bytes] | None = None
        self.chroma: subprocess.Popen[bytes] | None = None
        self.replicas: list[subprocess.Popen[bytes] | None] = [None, None]
        self.api_key = ""
        self.env = {
            **os.environ,
            "TIERMEM_KV_URL": self.kv_url,
            "TIERMEM_VECTOR_URL": self.vector_url,
            "TIERMEM_JOB_LEASE_SECONDS": "5",
            "TIERMEM_INDEX_CHECK_INTERVAL_SECONDS": "10",
            "TIERMEM_SHUTDOWN_TIMEOUT_SECONDS": "10",
            "TIERMEM_ACCESS_LOG": "false",
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "ANONYMIZED_TELEMETRY": "False",
        }
        for unset in ("TIERMEM_SUMMARIZER_MODEL", "TIERMEM_TENANT", "TIERMEM_DATA_DIR"):
            self.env.pop(unset, None)

    def _log(self, name: str) -> Any:
        return (self.work / f"{name}.log").open("ab")

    def start_redis(self) -> None:
        binary = shutil.which("redis-server")
        if binary is None:
            raise RuntimeError("redis-server is not installed")
        data = self.work / "redis"
        data.mkdir(exist_ok=True)
        with self._log("redis") as log:
            self.redis = subprocess.Popen(
                [binary, "--port", str(self.redis_port), "--bind", "127.0.0.1", "--dir", str(data),
                 "--save", "", "--appendonly", "yes", "--appendfsync", "always",
                 "--protected-mode", "no"],
                stdout=log, stderr=subprocess.STDOUT,
            )  # fmt: skip

        def ping() -> bool:
            with socket.create_connection(("127.0.0.1", self.redis_port), timeout=1) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")

        wait_until(ping, self.redis, "redis-server", 30)

    def start_chroma(self) -> None:
        binary = shutil.which("chroma", path=str(VENV_BIN)) or shutil.which("chroma")
        if binary is None:
            raise RuntimeError("the `chroma` CLI is not installed (pip install chromadb)")
        with self._log("chroma") as log:
            self.chroma = subprocess.Popen(
                [binary, "run", "--host", "127.0.0.1", "--port", str(self.chroma_port),
                 "--path", str(self.work / "chroma")],
                stdout=log, stderr=subprocess.STDOUT, env=self.env,
            )  # fmt: skip
        wait_until(
            lambda: httpx.get(f"{self.vector_url}/api/v2/heartbeat", timeout=2).status_code == 200,
            self.chroma, "chroma run", 60,
        )  # fmt: skip

    def create_key(self) -> None:
        out = subprocess.run(
            [TIERMEM, "keys", "create", "--tenant", TENANT, "--name", "soak"],
            env={**self.env, "TIERMEM_DATA_DIR": str(self.work / "keys-data")},
            capture_output=True, text=True, check=True, timeout=120,
        )  # fmt: skip
        self.api_key = out.stdout.strip().splitlines()[0]

    def start_replica(self, i: int) -> None:
        port = self.replica_ports[i]
        env = {**self.env, "TIERMEM_DATA_DIR": str(self.work / f"replica{i}-data")}
        with self._log(f"replica{i}") as log:
            proc = subprocess.Popen(
                [TIERMEM, "serve", "--host", "127.0.0.1", "--port", str(port)],
                stdout=log, stderr=subprocess.STDOUT, env=env,
            )  # fmt: skip
        self.replicas[i] = proc
        wait_until(
            lambda: httpx.get(f"http://127.0.0.1:{port}/readyz", timeout=2).status_code == 200,
            proc, f"replica {i}", 120,
        )  # fmt: skip

    def urls(self) -> list[str]:
        return [f"http://127.0.0.1:{p}" for p in self.replica_ports]

    def stop_all(self) -> None:
        for proc in self.replicas:
            terminate(proc)
        terminate(self.chroma)
        terminate(self.redis)


class Stats:
    """Counters shared by the threads (one lock; the counts are small)."""

    def __init__(self) -> None:
        self.lock = threading.Lock()
        self.served: Counter[str] = Counter()
        self.errors: Counter[str] = Counter()
        self.failovers = 0
        self.kills: Counter[str] = Counter()
        # (user, key) -> every value attempted, in order; index of the last acknowledged one.
        self.fact_attempts: dict[tuple[str, str], list[str]] = defaultdict(list)
        self.fact_acked: dict[tuple[str, str], int] = {}
        self.sessions: dict[tuple[str, str], str] = {}  # 202-accepted (user, session) -> job id
        self.checkpoints: list[tuple[str, str]] = []  # acknowledged (run id, checkpoint id)
        self.completed_runs: list[str] = []
        self.effects_recorded: list[tuple[str, str]] = []  # (run id, key) acknowledged
        self.replayed_effect_ran = 0

    def error(self, exc: BaseException) -> None:
        with self.lock:
            self.errors[classify(exc)] += 1


def classify(exc: BaseException) -> str:
    """An error's class: the transport error for an unreachable replica, else type and status."""
    cause = exc.__cause__
    if isinstance(cause, httpx.TransportError):
        return f"unreachable ({type(cause).__name__})"
    if isinstance(exc, BackendUnavailableError):
        return "BackendUnavailableError (503 from a replica: Redis or Chroma down)"
    if isinstance(exc, ClientError):
        return f"{type(exc).__name__} {exc.status}"
    return type(exc).__name__


def unreachable(exc: BaseException) -> bool:
    return isinstance(exc, BackendUnavailableError) and isinstance(
        exc.__cause__, httpx.TransportError
    )


class Ledger:
    """The effects' side: one line per execution of an effect body, keyed by idempotency key."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.lock = threading.Lock()

    def append(self, key: str) -> None:
        with self.lock, self.path.open("a") as f:
            f.write(key + "\n")

    def counts(self) -> Counter[str]:
        if not self.path.exists():
            return Counter()
        return Counter(line for line in self.path.read_text().splitlines() if line)


class Worker(threading.Thread):
    def __init__(
        self, n: int, urls: list[str], key: str, stats: Stats, ledger: Ledger, stop: threading.Event,
        seed: int,
    ) -> None:  # fmt: skip
        super().__init__(name=f"worker-{n}", daemon=True)
        self.n = n
        self.clients = [MemoryClient(u, key, timeout=15) for u in urls]
        self.stats = stats
        self.ledger = ledger
        self.stop = stop
        self.rng = random.Random(seed)
        self.seq = 0

    def call(self, fn: Callable[[MemoryClient], T]) -> T:
        """``fn`` on a random replica; on the other one if that one cannot be reached."""
        first = self.rng.randrange(len(self.clients))
        try:
            return fn(self.clients[first])
        except BackendUnavailableError as exc:
            if not unreachable(exc):
                raise
        with self.stats.lock:
            self.stats.failovers += 1
        return fn(self.clients[1 - first])

    def run(self) -> None:
        ops = [self.fact, self.session, self.run_op, self.read]
        weights = [4, 2, 2, 3]
        while not self.stop.is_set():
            op = self.rng.choices(ops, weights)[0]
            kind = op.__name__.removesuffix("_op")
            self.seq += 1
            try:
                op()
            except Exception as exc:  # every failure is counted by class, none stops the soak
                self.stats.error(exc)
                self.stop.wait(0.2)  # back off a little: an outage is counted, not spun on
            else:
                with self.stats.lock:
                    self.stats.served[kind] += 1

    def user(self) -> str:
        return f"u{self.n}-{self.rng.randrange(3)}"

    def fact(self) -> None:
        user, key = self.user(), f"k{self.rng.randrange(5)}"
        value = f"v-{self.n}-{self.seq}"
        with self.stats.lock:
            attempts = self.stats.fact_attempts[(user, key)]
            attempts.append(value)
            index = len(attempts) - 1
        self.call(lambda c: c.set_fact(user, key, value))
        with self.stats.lock:
            self.stats.fact_acked[(user, key)] = index

    def session(self) -> None:
        user, session_id = self.user(), f"s-{self.n}-{self.seq}"
        topic, text = self.rng.choice(TOPICS)
        transcript = [
            {"role": "user", "content": f"Session {self.seq} about {topic}. {text}"},
            {
                "role": "assistant",
                "content": f"Noted the {topic} change; next step is to verify it.",
            },
        ]
        body = {"session_id": session_id, "transcript": transcript}
        response = self.call(
            lambda c: c._request("POST", f"/v1/users/{user}/sessions", json=body)  # the raw 202
        )
        if response.status_code == 202:
            with self.stats.lock:
                self.stats.sessions[(user, session_id)] = response.json()["job_id"]

    def run_op(self) -> None:
        user, run_id = self.user(), f"r-{self.n}-{self.seq}-{uuid.uuid4().hex[:6]}"
        handle = self.call(lambda c: c.start_run(user, run_id))

        def on(c: MemoryClient) -> RemoteRun:
            # The lease re-held over this replica's connection (a client is not one).
            return RemoteRun(c._connection, handle.info, handle.epoch, worker_id=handle.worker_id)

        checkpoint = self.call(
            lambda c: on(c).append_checkpoint("plan", {"n": self.seq}, idempotency_key="plan")
        )
        with self.stats.lock:
            self.stats.checkpoints.append((run_id, checkpoint.checkpoint_id))
        key = f"{run_id}:charge"

        def body(k: str) -> dict[str, str]:
            self.ledger.append(k)
            return {"charged": k}

        self.call(lambda c: on(c).effect("charge", body, idempotency_key=key))
        with self.stats.lock:
            self.stats.effects_recorded.append((run_id, key))
        replayed: list[str] = []
        self.call(lambda c: on(c).effect("charge", replayed.append, idempotency_key=key))
        if replayed:
            with self.stats.lock:
                self.stats.replayed_effect_ran += 1
        self.call(lambda c: on(c).complete({"ok": True}))
        with self.stats.lock:
            self.stats.completed_runs.append(run_id)

    def read(self) -> None:
        user = self.user()
        topic = self.rng.choice(TOPICS)[0]
        choice = self.rng.randrange(3)
        if choice == 0:
            self.call(lambda c: c.recall_relevant(user, f"what changed in {topic}", 3))
        elif choice == 1:
            self.call(lambda c: c.continuation_context(user, f"continue the {topic} work", 500))
        else:
            self.call(lambda c: c.get_facts(user))


class Chaos(threading.Thread):
    def __init__(
        self, stack: Stack, stats: Stats, stop: threading.Event, interval: float, seed: int
    ) -> None:
        super().__init__(name="chaos", daemon=True)
        self.stack, self.stats, self.stop, self.interval = stack, stats, stop, interval
        self.rng = random.Random(seed)
        self.failures: list[str] = []

    def run(self) -> None:
        order: list[str] = []
        while not self.stop.wait(self.interval * self.rng.uniform(0.5, 1.5)):
            if not order:  # each component once per round of three, in a random order
                order = self.rng.sample(["replica", "redis", "chroma"], 3)
            victim = order.pop()
            try:
                if victim == "replica":
                    i = self.rng.randrange(2)
                    sigkill(self.stack.replicas[i])
                    time.sleep(self.rng.uniform(0, 2))
                    self.stack.start_replica(i)
                    victim = f"replica{i}"
                elif victim == "redis":
                    sigkill(self.stack.redis)
                    time.sleep(self.rng.uniform(0, 2))
                    self.stack.start_redis()
                else:
                    sigkill(self.stack.chroma)
                    time.sleep(self.rng.uniform(0, 2))
                    self.stack.start_chroma()
            except Exception as exc:
                self.failures.append(f"{victim}: {exc}")
                return  # the stack is broken; the soak goes on without chaos
            with self.stats.lock:
                self.stats.kills[victim] += 1


def drain(stack: Stack, stats: Stats, timeout: float) -> tuple[Counter[str], float]:
    """Poll every accepted job (any replica) until all are finished or ``timeout``."""
    client = httpx.Client(headers={"Authorization": f"Bearer {stack.api_key}"}, timeout=10)
    start = time.monotonic()
    left = dict(stats.sessions)
    status: Counter[str] = Counter()
    done: dict[str, str] = {}
    while left and time.monotonic() - start < timeout:
        for (user, sid), job in list(left.items()):
            url = random.choice(stack.urls())
            try:
                r = client.get(f"{url}/v1/jobs/{job}")
            except httpx.TransportError:
                continue
            state = r.json().get("status") if r.status_code == 200 else f"http {r.status_code}"
            if state in ("succeeded", "failed"):
                done[job] = state
                del left[(user, sid)]
        if left:
            time.sleep(0.5)
    client.close()
    status.update(done.values())
    status["unfinished"] = len(left)
    return status, time.monotonic() - start


def audit(stack: Stack, stats: Stats, ledger: Ledger) -> dict[str, Any]:
    settings = Settings(
        kv_url=stack.kv_url, vector_url=stack.vector_url, tenant=TENANT,
        data_dir=stack.work / "audit-data",
    )  # fmt: skip
    memory = Memory.from_settings(settings)
    out: dict[str, Any] = {"lost_details": []}
    try:
        lost = 0
        for (user, key), index in stats.fact_acked.items():
            allowed = stats.fact_attempts[(user, key)][index:]
            try:
                value = memory.get_fact(user, key).value
            except Exception as exc:
                value = f"<{type(exc).__name__}>"
            if value not in allowed:
                lost += 1
                out["lost_details"].append(
                    f"fact {user}/{key}: read {value!r}, acked {allowed[0]!r}"
                )
        for run_id, cid in stats.checkpoints:
            try:
                memory.get_checkpoint(run_id, cid)
            except Exception as exc:
                lost += 1
                out["lost_details"].append(f"checkpoint {run_id}/{cid}: {type(exc).__name__}")
        for run_id in stats.completed_runs:
            status = memory.get_run(run_id).status
            if str(getattr(status, "value", status)) != "completed":
                lost += 1
                out["lost_details"].append(f"run {run_id}: {status}")
        recorded_keys = {key for _, key in stats.effects_recorded}
        for run_id, key in stats.effects_recorded:
            effects = {e.key: e for e in memory.run_effects(run_id)}
            if key not in effects or effects[key].recorded_seq is None:
                lost += 1
                out["lost_details"].append(f"effect {key}: not recorded")
        out["lost"] = lost
        out["facts_acked"] = len(stats.fact_acked)
        out["checkpoints_acked"] = len(stats.checkpoints)
        out["runs_completed"] = len(stats.completed_runs)

        counts = ledger.counts()
        out["effects_executed"] = len(counts)
        out["effects_recorded"] = len(recorded_keys)
        out["duplicated"] = sum(1 for c in counts.values() if c > 1) + stats.replayed_effect_ran

        unsummarized = []
        users = set()
        for user, sid in stats.sessions:
            users.add(user)
            try:
                summary = memory.get_session(user, sid)
                if not summary.task_description:
                    unsummarized.append(f"{user}/{sid}: empty summary")
            except Exception as exc:
                unsummarized.append(f"{user}/{sid}: {type(exc).__name__}")
        pending = sorted(f"{u}/{s}" for u in users for s in memory.pending_summaries(u))
        out["sessions_accepted"] = len(stats.sessions)
        out["unsummarized"] = unsummarized
        out["pending"] = pending

        flushed = memory.flush(60)
        report = memory.check_index()
        out["index_flushed"] = flushed
        out["index"] = report
        if not report.consistent:
            repair = memory.repair_index()
            out["index_after_repair"] = repair.after.describe()
    finally:
        memory.close()
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="traffic time")
    parser.add_argument("--threads", type=int, default=4, help="client threads")
    parser.add_argument(
        "--chaos-interval", type=float, default=6.0, help="mean seconds between kills"
    )
    parser.add_argument(
        "--drain", type=float, default=60.0, help="seconds to wait for jobs at the end"
    )
    parser.add_argument("--seed", type=int, default=None)
    parser.add_argument("--keep", action="store_true", help="keep the temp dir (logs, data)")
    args = parser.parse_args()
    seed = args.seed if args.seed is not None else random.randrange(1 << 30)

    work = Path(tempfile.mkdtemp(prefix="tiermem-soak-"))
    stack = Stack(work)
    stats = Stats()
    ledger = Ledger(work / "effects.ledger")
    stop_traffic, stop_chaos = threading.Event(), threading.Event()
    started = time.monotonic()
    try:
        stack.start_redis()
        stack.start_chroma()
        stack.create_key()
        stack.start_replica(0)
        stack.start_replica(1)
        print(f"stack up in {time.monotonic() - started:.1f} s: redis :{stack.redis_port}, chroma "
              f":{stack.chroma_port}, replicas :{stack.replica_ports[0]} :{stack.replica_ports[1]}; "
              f"seed {seed}; work dir {work}", flush=True)  # fmt: skip

        workers = [
            Worker(n, stack.urls(), stack.api_key, stats, ledger, stop_traffic, seed + n)
            for n in range(args.threads)
        ]
        chaos = Chaos(stack, stats, stop_chaos, args.chaos_interval, seed - 1)
        traffic_start = time.monotonic()
        for w in workers:
            w.start()
        chaos.start()
        time.sleep(args.seconds)
        stop_chaos.set()
        chaos.join(180)  # a restart in progress finishes
        stop_traffic.set()
        for w in workers:
            w.join(60)
        traffic = time.monotonic() - traffic_start

        jobs, waited = drain(stack, stats, args.drain)
        for proc in stack.replicas:
            terminate(proc)
        result = audit(stack, stats, ledger)

        print(f"\nsoak: {args.seconds:.0f} s of traffic, {args.threads} threads, "
              f"chaos every ~{args.chaos_interval:.0f} s, load average {os.getloadavg()[0]:.2f} "
              f"{os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")  # fmt: skip
        print("\n| requests served | count |\n|---|---|")
        for kind in ("fact", "session", "run", "read"):
            print(f"| {kind} | {stats.served[kind]} |")
        print(f"| (failed over to the other replica) | {stats.failovers} |")
        print("\n| errors by class | count |\n|---|---|")
        for cls, count in stats.errors.most_common():
            print(f"| {cls} | {count} |")
        if not stats.errors:
            print("| none | 0 |")
        print("\n| kills (SIGKILL + restart) | count |\n|---|---|")
        for victim in ("replica0", "replica1", "redis", "chroma"):
            print(f"| {victim} | {stats.kills[victim]} |")
        for failure in chaos.failures:
            print(f"| restart FAILED: {failure} | |")
        print(f"\njobs after {waited:.1f} s of drain: {dict(jobs)}")
        report = result["index"]
        index_bad = report.missing + report.stale + report.orphans + report.pending
        lines = [
            ("acknowledged writes lost", result["lost"],
             f"{result['facts_acked']} fact keys, {result['checkpoints_acked']} checkpoints, "
             f"{result['runs_completed']} completed runs, {result['effects_recorded']} effects"),
            ("duplicated effects", result["duplicated"],
             f"{result['effects_executed']} effect keys executed, replay re-ran "
             f"{stats.replayed_effect_ran}"),
            ("accepted transcripts unsummarized", len(result["unsummarized"]) + len(result["pending"]),
             f"{result['sessions_accepted']} accepted, {len(result['pending'])} pending"),
            ("index out of line with KV", index_bad,
             f"{report.vectors} vectors expected: {report.missing} missing, {report.stale} stale, "
             f"{report.orphans} orphaned, {report.pending} pending (flushed: "
             f"{result['index_flushed']})"),
        ]  # fmt: skip
        print("\n| audit | count | of |\n|---|---|---|")
        for name, count, detail in lines:
            print(f"| {name} | {count} | {detail} |")
        for detail in (
            result["lost_details"][:20] + result["unsummarized"][:20] + result["pending"][:20]
        ):
            print(f"  - {detail}")
        if "index_after_repair" in result:
            print(f"  - after repair_index(): {result['index_after_repair']}")
        print(
            f"\ntotal {time.monotonic() - started:.1f} s (stack start, {traffic:.1f} s of traffic with the last restart, drain, audit)"
        )
        return 0 if all(count == 0 for _, count, _ in lines) else 1
    finally:
        stop_chaos.set()
        stop_traffic.set()
        stack.stop_all()
        if args.keep:
            print(f"kept {work}")
        else:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
