"""SQLite group commit benchmark: one writer vs N concurrent runs, and two processes on one file.

Usage::

    flock /tmp/tiermem-bench.lock python bench/group_commit_bench.py [--steps 1000] [--rounds 3]

Every figure is durable (``SqliteKVStore()``: WAL, ``synchronous=FULL``, each
step fsync'd before it is acknowledged). Prints, per round (the machine is
shared, so the one-writer baseline is measured in the same round as the figure
it divides, and the load average is printed beside each):

1. one run stepping alone (steps/s) and ``--runs`` runs stepping at once in one
   process, one thread each (steps/s, the ratio, and commits per fsync read off
   the store's :attr:`~tiers.backends.sqlite_kv.SqliteKVStore.group_commit_stats`),
   then the same runs with fsync off (``durable=False``, not durable): the
   rate the CPU of a step allows, which bounds the durable figure;
2. two processes each stepping one run on the same file at once: each one's
   steps/s (while both step) and the per-step latency p50 / p99 / max over
   both (the cross-process write lock decides it).
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from task_bench import concurrent_steps

from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.task import TaskTier

# Each step's output; --payload-bytes changes the size of its result.
PAYLOAD: dict[str, str] = {"tool": "search", "result": "x" * 100}


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load {one:.2f}/{five:.2f}"


def one_writer(store: SqliteKVStore, run_id: str, steps: int) -> float:
    """Steps per second of one run stepping alone."""
    run = TaskTier(store).start_run("bench", run_id)
    began = time.perf_counter()
    for _ in range(steps):
        run.step("s", lambda: PAYLOAD)
    return steps / (time.perf_counter() - began)


_CHILD = """
import sys, time
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.task import TaskTier
path, run_id, steps, start = sys.argv[1], sys.argv[2], int(sys.argv[3]), float(sys.argv[4])
store = SqliteKVStore(path)
run = TaskTier(store).start_run("bench", run_id)
payload = {"tool": "search", "result": "x" * int(sys.argv[5])}
while time.time() < start:
    time.sleep(0.001)
out = []
first = time.perf_counter()
for _ in range(steps):
    began = time.perf_counter()
    run.step("s", lambda: payload)
    out.append(time.perf_counter() - began)
elapsed = time.perf_counter() - first
store.close()
print(f"{elapsed:.6f}", " ".join(f"{s:.6f}" for s in out))
"""


def two_processes(path: Path, steps: int) -> tuple[list[float], list[float]]:
    """(Each process's steps/s, per-step seconds) of two processes stepping on one file at once."""
    SqliteKVStore(path).close()  # created and migrated before the race
    start = time.time() + 1.5
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)}
    children = [
        subprocess.Popen(
            [
                sys.executable,
                "-c",
                _CHILD,
                str(path),
                f"proc-{i}",
                str(steps),
                str(start),
                str(len(PAYLOAD["result"])),
            ],
            stdout=subprocess.PIPE,
            text=True,
            env=env,
        )
        for i in range(2)
    ]
    samples: list[float] = []
    rates: list[float] = []
    for child in children:
        out, _ = child.communicate(timeout=600)
        if child.returncode != 0:
            raise SystemExit(f"a stepping process failed ({child.returncode})")
        elapsed, *steps_s = (float(s) for s in out.split())
        rates.append(len(steps_s) / elapsed)
        samples += steps_s
    return rates, samples


def _quantile(samples: list[float], q: float) -> float:
    ordered = sorted(samples)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    """Run every figure ``--rounds`` times and print them with the load average."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=1000, help="steps of the one writer")
    parser.add_argument("--runs", type=int, default=16, help="concurrent runs in one process")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--payload-bytes", type=int, default=100, help="size of each step's result")
    parser.add_argument("--skip-processes", action="store_true", help="only the thread figure")
    args = parser.parse_args()
    PAYLOAD["result"] = "x" * args.payload_bytes
    work = Path(tempfile.mkdtemp(prefix="tiermem-gc-bench-"))
    print(
        f"group commit benchmark: {args.steps} steps, {args.runs} runs, "
        f"{args.payload_bytes} B results, data in {work}"
    )
    try:
        for round_ in range(args.rounds):
            store = SqliteKVStore(work / f"threads-{round_}.sqlite3")
            one_writer(store, "warm", 50)
            before = store.group_commit_stats
            single = one_writer(store, "single", args.steps)
            mid = store.group_commit_stats
            many = concurrent_steps(
                TaskTier(store), "conc", args.runs, max(args.steps // args.runs, 25), PAYLOAD
            )
            after = store.group_commit_stats
            store.close()
            single_per = (mid[0] - before[0]) / max(mid[1] - before[1], 1)
            many_per = (after[0] - mid[0]) / max(after[1] - mid[1], 1)
            # The same runs with fsync off: what the CPU of a step allows, fsync aside.
            fast = SqliteKVStore(work / f"nosync-{round_}.sqlite3", durable=False)
            ceiling = concurrent_steps(
                TaskTier(fast), "conc", args.runs, max(args.steps // args.runs, 25), PAYLOAD
            )
            fast.close()
            print(
                f"round {round_}: 1 writer {single:7.0f} steps/s ({single_per:.1f} commits/fsync)"
                f" | {args.runs} runs {many:7.0f} steps/s ({many_per:.1f} commits/fsync)"
                f" | ratio {many / single:5.2f}x | {args.runs} runs fsync off {ceiling:7.0f}"
                f" steps/s | {_load()}",
                flush=True,
            )
            if not args.skip_processes:
                rates, samples = two_processes(work / f"procs-{round_}.sqlite3", args.steps // 2)
                print(
                    f"round {round_}: 2 processes {rates[0]:5.0f} + {rates[1]:5.0f} steps/s,"
                    " per step p50"
                    f" {statistics.median(samples) * 1e3:6.2f} ms"
                    f" p99 {_quantile(samples, 0.99) * 1e3:6.2f} ms"
                    f" max {max(samples) * 1e3:6.2f} ms ({len(samples)} steps) | {_load()}",
                    flush=True,
                )
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
