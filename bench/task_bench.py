"""Task tier benchmark: durable step checkpoints side by side (prints figures; not a test).

Usage::

    pip install -e ".[bench]"      # langgraph + langgraph-checkpoint-sqlite, for the comparison
    python bench/task_bench.py [--steps 2000] [--quick] [--encrypt]

``--encrypt`` runs every figure of ours on an ``EncryptedKVStore`` (encryption at
rest) over the same backends; run it with and without to compare.

Everything is measured in one run on this machine at the same durability:
every acknowledged checkpoint survives a power cut (SQLite ``synchronous=FULL``
on WAL, Redis ``appendfsync always``). fsync latency here is bimodal, so the
ratios of one run mean more than absolute rates.

Figures:

1. floor: a raw single-row SQLite commit, fsync'd;
2. our per-step durable checkpoint on SQLite (one commit per step) and its ratio to the floor;
3. a 3-node LangGraph ``StateGraph`` on ``SqliteSaver`` (nodes/s and invokes/s);
4. the same on Redis with ``appendfsync always`` (ours vs a raw ``SET``);
5. 16 concurrent runs in one process (group commit) vs one writer;
6. bytes stored per step for a ~5 KB state delta (ours vs LangGraph);
7. resume time (take the lease + load the state) vs run length;
8. the CPU one step costs (process time, fsync off), so the Python on the hot path is visible;
9. the bounded-durability mode (``SqliteKVStore(durable=False, flush_interval=...)``:
   commits acknowledged before fsync, flushed in the background and before every
   effect), never the default, reported separately.
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import socket
import sqlite3
import statistics
import string
import subprocess
import tempfile
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any, Protocol, TypedDict

import redis

from tiers import keys
from tiers.backends.base import KVStore
from tiers.backends.encrypted_kv import EncryptedKVStore, MasterKey
from tiers.backends.redis_kv import RedisKVStore
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.task import LATEST_LAYOUT, Charged, TaskTier, pin_layout

PAYLOAD = {"tool": "search", "result": "x" * 100}

# --encrypt: every store of ours is an EncryptedKVStore (encryption at rest) over the backend.
_MASTER_KEY: MasterKey | None = None


def _ours(store: KVStore) -> KVStore:
    return store if _MASTER_KEY is None else EncryptedKVStore(store, _MASTER_KEY)


def _rate(n: int, fn: Callable[[], None]) -> float:
    began = time.perf_counter()
    fn()
    return n / (time.perf_counter() - began)


# -- 1. the floor ---------------------------------------------------------------------


def floor_sqlite(path: Path, n: int) -> float:
    """Raw single-row commits, WAL + synchronous=FULL: the fsync floor on this disk."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE IF NOT EXISTS t (k TEXT PRIMARY KEY, v BLOB) WITHOUT ROWID")
    value = b"x" * 150

    def loop() -> None:
        for i in range(n):
            conn.execute("BEGIN IMMEDIATE")
            conn.execute("INSERT OR REPLACE INTO t VALUES (?, ?)", (f"k{i}", value))
            conn.execute("COMMIT")

    rate = _rate(n, loop)
    conn.close()
    return rate


# -- 2. ours ----------------------------------------------------------------------------


def ours_steps(tasks: TaskTier, run_id: str, n: int) -> float:
    """Steps per second through RunHandle.step (each one durable commit)."""
    run = tasks.start_run("bench", run_id)

    def loop() -> None:
        for _ in range(n):
            run.step("s", lambda: PAYLOAD)

    return _rate(n, loop)


def ours_effects(tasks: TaskTier, run_id: str, n: int) -> float:
    """Top-level effects per second through RunHandle.effect (each two commits)."""
    run = tasks.start_run("bench", run_id)

    def loop() -> None:
        for _ in range(n):
            run.effect("e", lambda: PAYLOAD)

    return _rate(n, loop)


def cpu_per_step(
    path: Path, n: int, *, encrypt: bool | None = None, layout: int = LATEST_LAYOUT
) -> float:
    """Process seconds per step with fsync off (best of 3): the CPU of our code plus SQLite's.

    ``encrypt`` overrides ``--encrypt`` (for the side-by-side figure); ``layout``
    is the task layout version the run is written in (1: the previous release's).
    """
    inner = SqliteKVStore(path, durable=False)
    if encrypt is None:
        store = _ours(inner)
    else:
        store = EncryptedKVStore(inner, MasterKey.generate()[0]) if encrypt else inner
    pin_layout(store, "default", layout, datetime.now(UTC))
    run = TaskTier(store).start_run("bench", "cpu")
    for _ in range(100):
        run.step("s", lambda: PAYLOAD)
    best = float("inf")
    for _ in range(3):
        began = time.process_time()
        for _ in range(n):
            run.step("s", lambda: PAYLOAD)
        best = min(best, (time.process_time() - began) / n)
    store.close()
    return best


# -- 3. LangGraph -------------------------------------------------------------------------


class _LGState(TypedDict):
    data: dict[str, str]
    n: int


class _LGNode(Protocol):
    """A graph node: LangGraph's ``add_node`` passes the state by the name ``state``."""

    def __call__(self, state: _LGState) -> dict[str, Any]: ...


def _langgraph(path: Path, delta: Callable[[str, int], dict[str, str]] | None = None) -> Any:
    from langgraph.checkpoint.sqlite import SqliteSaver
    from langgraph.graph import END, START, StateGraph

    def node(name: str) -> _LGNode:
        def run(state: _LGState) -> dict[str, Any]:
            if delta is None:
                return {"n": state["n"] + 1}
            return {"data": {**state["data"], **delta(name, state["n"])}, "n": state["n"] + 1}

        return run

    builder = StateGraph(_LGState)
    for name in ("a", "b", "c"):
        builder.add_node(name, node(name))
    builder.add_edge(START, "a")
    builder.add_edge("a", "b")
    builder.add_edge("b", "c")
    builder.add_edge("c", END)
    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    # The same durability as ours: fsync every commit.
    conn.execute("PRAGMA synchronous=FULL")
    return builder.compile(checkpointer=saver), conn


def langgraph_rate(path: Path, invokes: int) -> tuple[float, float]:
    """(nodes/s, invokes/s) of a 3-node graph on SqliteSaver."""
    graph, conn = _langgraph(path)
    config = {"configurable": {"thread_id": "bench"}}
    state: dict[str, Any] = {"data": {}, "n": 0}

    def loop() -> None:
        nonlocal state
        for _ in range(invokes):
            state = graph.invoke(state, config)

    per_invoke = _rate(invokes, loop)
    conn.close()
    return per_invoke * 3, per_invoke


# -- 4. Redis ------------------------------------------------------------------------------


class RedisAlways:
    """A redis-server on a free loopback port with appendonly yes, appendfsync always."""

    def __init__(self, workdir: Path) -> None:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            self.port = int(sock.getsockname()[1])
        binary = shutil.which("redis-server")
        if binary is None:
            raise SystemExit("redis-server is not installed (apt-get install redis-server)")
        self.proc = subprocess.Popen(
            [
                binary,
                "--port",
                str(self.port),
                "--bind",
                "127.0.0.1",
                "--dir",
                str(workdir),
                "--save",
                "",
                "--appendonly",
                "yes",
                "--appendfsync",
                "always",
            ],
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
        )
        self.url = f"redis://127.0.0.1:{self.port}/0"
        client = redis.Redis(port=self.port)
        for _ in range(200):
            try:
                client.ping()
                break
            except redis.ConnectionError:
                time.sleep(0.05)
        client.close()

    def stop(self) -> None:
        self.proc.terminate()
        self.proc.wait(10)


def floor_redis(url: str, n: int) -> float:
    client = redis.Redis.from_url(url)
    value = b"x" * 150

    def loop() -> None:
        for i in range(n):
            client.set(f"floor:{i}", value)

    rate = _rate(n, loop)
    client.close()
    return rate


# -- 5. concurrency -------------------------------------------------------------------------


def concurrent_steps(
    tasks: TaskTier, prefix: str, runs: int, steps: int, payload: dict[str, str] = PAYLOAD
) -> float:
    """Total steps/s of ``runs`` runs stepping at once, one thread each, results ``payload``."""
    barrier = threading.Barrier(runs + 1)

    def worker(i: int) -> None:
        run = tasks.start_run("bench", f"{prefix}-{i}")
        barrier.wait()
        for _ in range(steps):
            run.step("s", lambda: payload)

    pool = [threading.Thread(target=worker, args=(i,)) for i in range(runs)]
    for t in pool:
        t.start()
    barrier.wait()
    began = time.perf_counter()
    for t in pool:
        t.join()
    return runs * steps / (time.perf_counter() - began)


# -- 6. bytes per step ----------------------------------------------------------------------


def _text(rng: random.Random, size: int) -> str:
    words = ["".join(rng.choices(string.ascii_lowercase, k=rng.randint(2, 9))) for _ in range(400)]
    out: list[str] = []
    length = 0
    while length < size:
        word = rng.choice(words)
        out.append(word)
        length += len(word) + 1
    return " ".join(out)[:size]


def _file_bytes(path: Path) -> int:
    conn = sqlite3.connect(path)
    conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
    conn.close()
    return path.stat().st_size


def ours_bytes(path: Path, steps: int, delta_size: int) -> tuple[float, float]:
    """(logical bytes/step, file bytes/step) for a run whose state changes by ``delta_size``."""
    rng = random.Random(1)
    store = _ours(SqliteKVStore(path))
    tasks = TaskTier(store)
    run = tasks.start_run("bench", "bytes")
    run.step("warm", lambda: None)
    space = keys.run_space("default", "bytes")
    logical0 = sum(len(k) + len(v) for k, v in store.scan(space))
    file0 = _file_bytes(path)
    for i in range(steps):
        delta = {f"k{i % 10}": _text(rng, delta_size)}
        run.step("s", functools.partial(Charged, None, state=delta))
    logical = sum(len(k) + len(v) for k, v in store.scan(space))
    store.close()
    return (logical - logical0) / steps, (_file_bytes(path) - file0) / steps


def langgraph_bytes(path: Path, invokes: int, delta_size: int) -> tuple[float, float]:
    """(file bytes per node, per invoke) for the same ~5 KB change per node."""
    rng = random.Random(1)
    graph, conn = _langgraph(path, lambda name, n: {f"k{(3 * n) % 10}": _text(rng, delta_size)})
    config = {"configurable": {"thread_id": "bytes"}}
    state: dict[str, Any] = {"data": {}, "n": 0}
    state = graph.invoke(state, config)
    conn.commit()
    before = _file_bytes(path)
    for _ in range(invokes):
        state = graph.invoke(state, config)
    conn.commit()
    conn.close()
    per_invoke = (_file_bytes(path) - before) / invokes
    return per_invoke / 3, per_invoke


# -- 7. resume time --------------------------------------------------------------------------


def resume_times(path: Path, lengths: list[int]) -> list[tuple[int, float]]:
    """Median seconds to take over a run and load its state, per run length."""
    fast = _ours(SqliteKVStore(path, durable=False))
    tasks = TaskTier(fast)
    for length in lengths:
        run = tasks.start_run("bench", f"len-{length}")
        for i in range(length):
            run.step("s", functools.partial(Charged, i, state={f"k{i % 50}": i}))
    fast.close()
    store = _ours(SqliteKVStore(path))
    tasks = TaskTier(store)
    out = []
    for length in lengths:
        samples = []
        for _ in range(15):
            began = time.perf_counter()
            handle = tasks.start_run("bench", f"len-{length}")
            state = handle.state
            samples.append(time.perf_counter() - began)
        assert len(state) == min(50, length)
        out.append((length, statistics.median(samples)))
    store.close()
    return out


# -- main ------------------------------------------------------------------------------------


def main() -> None:
    """Run every figure and print them with their ratios."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2000, help="steps per single-writer figure")
    parser.add_argument("--quick", action="store_true", help="small counts (a smoke run)")
    parser.add_argument(
        "--encrypt",
        action="store_true",
        help="encryption at rest: our stores are EncryptedKVStore over SQLite / Redis",
    )
    args = parser.parse_args()
    global _MASTER_KEY
    if args.encrypt:
        _MASTER_KEY = MasterKey.generate()[0]
    n = 200 if args.quick else args.steps
    work = Path(tempfile.mkdtemp(prefix="tiermem-bench-"))
    encryption = "on (AES-GCM, per-tenant data key)" if args.encrypt else "off"
    print(
        f"task tier benchmark: {n} steps per figure, data in {work}, encryption at rest {encryption}"
    )
    print(_load_average() + "\n", flush=True)
    try:
        lines: list[tuple[str, str]] = []

        def show(label: str, value: str) -> None:
            lines.append((label, value))
            print(f"{label:<62} {value}", flush=True)

        floor = floor_sqlite(work / "floor.sqlite3", n)
        show("SQLite raw single-row fsync'd commit (floor)", f"{floor:8.0f} commits/s")
        store = _ours(SqliteKVStore(work / "ours.sqlite3"))
        ours = ours_steps(TaskTier(store), "single", n)
        show("ours: durable step checkpoint, SQLite", f"{ours:8.0f} steps/s")
        show("  floor / ours (target <= 1.3)", f"{floor / ours:8.2f}x")
        effects = ours_effects(TaskTier(store), "effects", max(n // 2, 50))
        show("ours: durable top-level effect (2 commits), SQLite", f"{effects:8.0f} effects/s")
        show("  floor / (2 x effects/s) (target <= 1.3)", f"{floor / (2 * effects):8.2f}x")

        try:
            lg_nodes, lg_invokes = langgraph_rate(work / "lg.sqlite3", max(n // 3, 20))
        except ImportError:
            lg_nodes = lg_invokes = 0.0
            show("LangGraph", "not installed: pip install -e '.[bench]'")
        if lg_nodes:
            show("LangGraph 3-node StateGraph on SqliteSaver", f"{lg_nodes:8.0f} nodes/s")
            show("  (invokes of the 3-node graph)", f"{lg_invokes:8.0f} invokes/s")
            show("  ours steps/s / LangGraph nodes/s (target >= 5)", f"{ours / lg_nodes:8.2f}x")
            show("  ours steps/s / LangGraph invokes/s", f"{ours / lg_invokes:8.2f}x")

        many = concurrent_steps(TaskTier(store), "conc", 16, max(n // 8, 25))
        show("ours: 16 concurrent runs, SQLite group commit", f"{many:8.0f} steps/s")
        show("  16 runs / single writer (target >= 5)", f"{many / ours:8.2f}x")
        store.close()

        (work / "redis").mkdir()
        server = RedisAlways(work / "redis")
        try:
            rfloor = floor_redis(server.url, n)
            show("Redis raw SET, appendfsync always (floor)", f"{rfloor:8.0f} commits/s")
            rstore = _ours(RedisKVStore(server.url))
            rours = ours_steps(TaskTier(rstore), "single", n)
            show("ours: durable step checkpoint, Redis appendfsync always", f"{rours:8.0f} steps/s")
            show("  floor / ours", f"{rfloor / rours:8.2f}x")
            rmany = concurrent_steps(TaskTier(rstore), "conc", 16, max(n // 8, 25))
            show("ours: 16 concurrent runs, Redis", f"{rmany:8.0f} steps/s")
            show("  16 runs / single writer", f"{rmany / rours:8.2f}x")
            rstore.close()
        finally:
            server.stop()

        delta = 5 * 1024
        logical, physical = ours_bytes(work / "bytes.sqlite3", max(n // 10, 100), delta)
        show("ours: bytes stored per step, 5 KB delta (logical)", f"{logical:8.0f} B")
        show("ours: bytes stored per step, 5 KB delta (SQLite file)", f"{physical:8.0f} B")
        show("  file bytes / delta (target < 2)", f"{physical / delta:8.2f}x")
        if lg_nodes:
            lg_node_b, lg_inv_b = langgraph_bytes(work / "lgbytes.sqlite3", max(n // 30, 30), delta)
            show("LangGraph: file bytes per node, 5 KB delta per node", f"{lg_node_b:8.0f} B")
            show("  (per invoke of 3 nodes)", f"{lg_inv_b:8.0f} B")
            show("  LangGraph / ours, per step", f"{lg_node_b / physical:8.2f}x")

        lengths = [100, 1000, 5000] if not args.quick else [50, 500]
        for length, seconds in resume_times(work / "resume.sqlite3", lengths):
            show(f"resume (lease + state load), run of {length} steps", f"{seconds * 1e3:8.2f} ms")

        cpu = cpu_per_step(work / "cpu.sqlite3", n)
        show("CPU per step (process time, fsync off)", f"{cpu * 1e6:8.0f} us")
        # The previous release's layout beside this one's, alternating, best of 3 each.
        by_layout: dict[int, list[float]] = {1: [], LATEST_LAYOUT: []}
        for round_ in range(3):
            for layout, cpus in by_layout.items():
                path = work / f"cpu-layout{layout}-{round_}.sqlite3"
                cpus.append(cpu_per_step(path, n, layout=layout))
        old_cpu, new_cpu = min(by_layout[1]), min(by_layout[LATEST_LAYOUT])
        show("CPU per step, task layout 1 (previous release)", f"{old_cpu * 1e6:8.0f} us")
        show(f"CPU per step, task layout {LATEST_LAYOUT}", f"{new_cpu * 1e6:8.0f} us")
        met = "met" if new_cpu <= 100e-6 else "not met"
        show("  target <= 100 us (issue 16)", f"{met:>8}")

        # Side by side in one run, alternating, so the machine's load hits both alike.
        plain, encrypted = [], []
        for round_ in range(3):
            plain.append(cpu_per_step(work / f"cpu-plain-{round_}.sqlite3", n, encrypt=False))
            encrypted.append(cpu_per_step(work / f"cpu-enc-{round_}.sqlite3", n, encrypt=True))
        show("CPU per step, encryption at rest off (best of 9)", f"{min(plain) * 1e6:8.0f} us")
        show("CPU per step, encryption at rest on (best of 9)", f"{min(encrypted) * 1e6:8.0f} us")
        show("  on / off", f"{min(encrypted) / min(plain):8.2f}x")

        print("\nbounded durability (not the default): acknowledged before fsync, flushed")
        print("every 50 ms in the background and before every effect's function")
        fast = _ours(SqliteKVStore(work / "fast.sqlite3", durable=False, flush_interval=0.05))
        btasks = TaskTier(fast)
        bounded = ours_steps(btasks, "single", n)
        show("async: step checkpoint, SQLite", f"{bounded:8.0f} steps/s")
        show("  async steps/s / durable steps/s", f"{bounded / ours:8.2f}x")
        beffects = ours_effects(btasks, "effects", max(n // 2, 50))
        show("async: top-level effect (flush before the call)", f"{beffects:8.0f} effects/s")
        began = time.perf_counter()
        btasks.force_flush()
        show(
            "async: force_flush() after the effects",
            f"{(time.perf_counter() - began) * 1e3:8.2f} ms",
        )
        fast.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        print(_load_average())


def _load_average() -> str:
    """The machine's load average now (other work on it skews every figure)."""
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


if __name__ == "__main__":
    main()
