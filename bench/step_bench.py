"""One durable 5 KB step, side by side in one run: raw SQLite, ours, SqliteSaver, SQLiteSession, Redis.

Usage::

    pip install -e ".[bench]"      # langgraph-checkpoint-sqlite and openai-agents, for the comparison
    flock /tmp/tiermem-bench.lock python bench/step_bench.py [--steps 500] [--rounds 2]

Every system writes the same ~5 KB JSON payload (a search tool's result: 21
hits, 107 strings) per step, every write durable (SQLite ``synchronous=FULL``
on WAL, Redis ``appendfsync always``), in one process, round after round, so
the machine's load hits all alike; the load average is printed before and
after. Ours is the embedded default: ``SqliteKVStore`` fsync'ing every commit
and the default redactor (``Redactor()``, what :class:`~memory.Memory` uses).

Figures per round:

1. durable writes/s: raw ``sqlite3`` single-row commit of the payload's bytes,
   ``RunHandle.step``, LangGraph's ``SqliteSaver.put``, the Agents SDK's
   ``SQLiteSession.add_items``, raw Redis ``SET`` and ``RunHandle.step`` on Redis;
2. CPU per step (process time) with fsync off and on, default redaction and none;
3. reads: the latest checkpoint, and a 100-step history, against raw ``SELECT``s.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import random
import sqlite3
import tempfile
import time
from collections.abc import Callable
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import redis
from task_bench import RedisAlways

from tiers import keys
from tiers.backends.redis_kv import RedisKVStore
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.redaction import Redactor
from tiers.task import LATEST_LAYOUT, TaskTier, pin_layout

_WORDS = [
    "agent",
    "memory",
    "checkpoint",
    "result",
    "search",
    "the",
    "of",
    "and",
    "latency",
    "report",
    "python",
    "sqlite",
    "durable",
    "commit",
    "query",
    "answer",
    "user",
    "session",
    "tool",
    "budget",
]


CPU_TARGET = 100e-6
"""Issue 16's target: process time per durable 5 KB step, fsync off, embedded default."""
REDIS_TARGET = 0.9
"""Issue 16's target: durable steps/s on Redis over raw ``SET``/s, both appendfsync always."""


def payload(seed: int = 7) -> dict[str, Any]:
    """A search tool's result: ~5.5 KB of JSON, 107 strings (titles, URLs, snippets, tags)."""
    rng = random.Random(seed)

    def text(size: int) -> str:
        words: list[str] = []
        while sum(len(w) + 1 for w in words) < size:
            words.append(rng.choice(_WORDS))
        return " ".join(words)[:size]

    hits = [
        {
            "title": text(40).title(),
            "url": f"https://example.com/{text(20).replace(' ', '-')}/{n}",
            "snippet": text(72),
            "source": rng.choice(["web", "docs", "kb"]),
            "score": round(rng.random(), 3),
            "rank": n,
            "tags": [rng.choice(_WORDS)],
        }
        for n in range(21)
    ]
    return {"tool": "search", "query": text(60), "results": hits}


PAYLOAD = payload()


def _rate(n: int, fn: Callable[[int], object]) -> float:
    began = time.perf_counter()
    for i in range(n):
        fn(i)
    return n / (time.perf_counter() - began)


def raw_sqlite(path: Path, n: int) -> float:
    """Single-row commits of the payload's JSON bytes, WAL + synchronous=FULL."""
    conn = sqlite3.connect(path, isolation_level=None)
    conn.execute("PRAGMA journal_mode=WAL")
    conn.execute("PRAGMA synchronous=FULL")
    conn.execute("CREATE TABLE t (k TEXT PRIMARY KEY, v BLOB) WITHOUT ROWID")
    value = json.dumps(PAYLOAD).encode()

    def put(i: int) -> None:
        conn.execute("BEGIN IMMEDIATE")
        conn.execute("INSERT INTO t VALUES (?, ?)", (f"k{i:09d}", value))
        conn.execute("COMMIT")

    rate = _rate(n, put)
    conn.close()
    return rate


def ours(tasks: TaskTier, n: int) -> float:
    """``RunHandle.step`` with the payload as output: one durable commit each."""
    run = tasks.start_run("bench", f"step-{time.time_ns()}")
    return _rate(n, lambda _: run.step("search", lambda: PAYLOAD))


def sqlite_saver(path: Path, n: int) -> float:
    """LangGraph's ``SqliteSaver.put`` of a checkpoint holding the payload (fsync'd)."""
    from langgraph.checkpoint.base import create_checkpoint, empty_checkpoint
    from langgraph.checkpoint.sqlite import SqliteSaver

    conn = sqlite3.connect(path, check_same_thread=False)
    saver = SqliteSaver(conn)
    saver.setup()
    conn.execute("PRAGMA synchronous=FULL")
    base = empty_checkpoint()
    base["channel_values"] = {"result": PAYLOAD}
    config: Any = {"configurable": {"thread_id": "bench", "checkpoint_ns": ""}}

    def put(i: int) -> None:
        nonlocal config
        checkpoint = create_checkpoint(base, None, i)
        config = saver.put(config, checkpoint, {"source": "loop", "step": i}, {})

    rate = _rate(n, put)
    conn.close()
    return rate


def sqlite_session(path: Path, n: int) -> float:
    """The Agents SDK's ``SQLiteSession.add_items`` of one tool output item holding the payload."""
    from agents.memory import SQLiteSession

    session = SQLiteSession("bench", path)
    item: Any = {"type": "function_call_output", "call_id": "c1", "output": json.dumps(PAYLOAD)}

    async def loop() -> float:
        began = time.perf_counter()
        for _ in range(n):
            await session.add_items([item])
        return n / (time.perf_counter() - began)

    rate = asyncio.run(loop())
    session.close()
    return rate


def raw_redis(url: str, n: int) -> float:
    """Raw ``SET`` of the payload's JSON bytes (appendfsync always)."""
    client = redis.Redis.from_url(url)
    value = json.dumps(PAYLOAD).encode()
    rate = _rate(n, lambda i: client.set(f"raw:{i}", value))
    client.close()
    return rate


def cpu_per_step(
    path: Path, n: int, *, durable: bool, redactor: Redactor | None, layout: int = LATEST_LAYOUT
) -> float:
    """Process seconds per step (best of 3 passes of ``n``), after 50 warm-up steps."""
    kv = SqliteKVStore(path, durable=durable)
    pin_layout(kv, "default", layout, datetime.now(UTC))
    run = TaskTier(kv, redactor=redactor).start_run("bench", "cpu")
    for _ in range(50):
        run.step("search", lambda: PAYLOAD)
    best = float("inf")
    for _ in range(3):
        began = time.process_time()
        for _ in range(n):
            run.step("search", lambda: PAYLOAD)
        best = min(best, (time.process_time() - began) / n)
    kv.close()
    return best


def reads(path: Path) -> tuple[float, float, float, float]:
    """(ours latest, raw latest, ours 100-step history, raw 100 rows), seconds, best of 20."""
    kv = SqliteKVStore(path)
    tasks = TaskTier(kv)
    run = tasks.start_run("bench", "reads")
    for _ in range(100):
        run.step("search", lambda: PAYLOAD)
    conn = sqlite3.connect(path)

    def best(fn: Callable[[], object]) -> float:
        times = []
        for _ in range(20):
            began = time.perf_counter()
            fn()
            times.append(time.perf_counter() - began)
        return min(times)

    ours_latest = best(lambda: tasks.latest_checkpoint(run.run_id))
    space = keys.run_space("default", run.run_id)
    scan = "SELECT value FROM kv WHERE space = ? AND key > 'ckpt:' AND key < 'ckpt;' ORDER BY key"
    raw_latest = best(
        lambda: json.loads(conn.execute(f"{scan} DESC LIMIT 1", (space,)).fetchone()[0])
    )
    ours_history = best(lambda: tasks.history(run.run_id, limit=100))
    raw_history = best(
        lambda: [json.loads(row[0]) for row in conn.execute(f"{scan} LIMIT 100", (space,))]
    )
    conn.close()
    kv.close()
    return ours_latest, raw_latest, ours_history, raw_history


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    """Run the figures round after round and print them."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=500, help="durable writes per figure")
    parser.add_argument("--rounds", type=int, default=2)
    args = parser.parse_args()
    n = args.steps
    work = Path(tempfile.mkdtemp(prefix="tiermem-step-bench-"))
    print(f"5 KB durable step, {n} writes per figure; payload {len(json.dumps(PAYLOAD))} B")
    print(_load(), flush=True)

    def show(label: str, value: str) -> None:
        print(f"  {label:<58} {value}", flush=True)

    (work / "redis").mkdir()
    server = RedisAlways(work / "redis")
    try:
        for round_ in range(args.rounds):
            print(f"round {round_ + 1}")
            floor = raw_sqlite(work / f"raw-{round_}.sqlite3", n)
            show("raw sqlite3 single-row commit", f"{floor:7.0f} writes/s")
            kv = SqliteKVStore(work / f"ours-{round_}.sqlite3")
            mine = ours(TaskTier(kv, redactor=Redactor()), n)
            kv.close()
            show("ours: RunHandle.step, SQLite, default redaction", f"{mine:7.0f} steps/s")
            show("  raw / ours", f"{floor / mine:7.2f}x")
            try:
                saver = sqlite_saver(work / f"lg-{round_}.sqlite3", n)
                show(
                    "LangGraph SqliteSaver.put", f"{saver:7.0f} writes/s (ours {mine / saver:.2f}x)"
                )
            except ImportError:
                show("LangGraph SqliteSaver", "not installed: pip install -e '.[bench]'")
            try:
                sdk = sqlite_session(work / f"sdk-{round_}.sqlite3", n)
                show(
                    "Agents SDK SQLiteSession.add_items",
                    f"{sdk:7.0f} writes/s (ours {mine / sdk:.2f}x)",
                )
            except ImportError:
                show("Agents SDK SQLiteSession", "not installed: pip install -e '.[bench]'")
            rfloor = raw_redis(server.url, n)
            show("raw Redis SET, appendfsync always", f"{rfloor:7.0f} writes/s")
            rkv = RedisKVStore(server.url)
            rmine = ours(TaskTier(rkv, redactor=Redactor()), n)
            rkv.close()
            show("ours: RunHandle.step, Redis", f"{rmine:7.0f} steps/s ({rmine / rfloor:.2f}x raw)")
            met = "met" if rmine / rfloor >= REDIS_TARGET else "not met"
            show(f"  target >= {REDIS_TARGET}x raw SET", met)
        print("CPU per step (process time, best of 3), task layout 1 (previous) and 2 (now)")
        for durable in (False, True):
            for redactor, what in ((Redactor(), "default redaction"), (None, "no redaction")):
                cpus = []
                for layout in (1, LATEST_LAYOUT):
                    path = work / f"cpu-{durable}-{redactor is None}-{layout}.sqlite3"
                    cpus.append(
                        cpu_per_step(path, n, durable=durable, redactor=redactor, layout=layout)
                    )
                fsync = "on" if durable else "off"
                target = ""
                if not durable:
                    met = "met" if cpus[-1] <= CPU_TARGET else "not met"
                    target = f"  (target <= {CPU_TARGET * 1e6:.0f} us: {met})"
                show(
                    f"fsync {fsync}, {what}: layout 1 / 2",
                    f"{cpus[0] * 1e6:5.0f} / {cpus[-1] * 1e6:5.0f} us{target}",
                )
        latest, raw_latest, history, raw_history = reads(work / "reads.sqlite3")
        print("reads (best of 20)")
        show(
            "latest checkpoint: ours / raw SELECT + json.loads",
            f"{latest * 1e3:.3f} / {raw_latest * 1e3:.3f} ms",
        )
        show("100-step history: ours / raw", f"{history * 1e3:.2f} / {raw_history * 1e3:.2f} ms")
    finally:
        server.stop()
        print(_load())


if __name__ == "__main__":
    main()
