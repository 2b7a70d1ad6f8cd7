"""Checkpoint reads on 5 KB chat-state checkpoints: a 100-step history and the latest checkpoint.

Usage::

    flock /tmp/tiermem-bench.lock python bench/read_bench.py [--runs 10] [--passes 20]

What the peers harness reads (issue 16): ``Memory.open(dir)`` (SQLite, and the
same over a ``redis-server`` with ``appendfsync always``), ``--runs`` runs of
100 steps each, every step's output a chat state of about 5 KB (messages, tool
results, an effect log), written with the default redaction. Then, in rounds
that rotate the order: ``memory.run_history(run_id)`` of every run, and
``memory.tasks.latest_checkpoint(run_id)`` and ``get_checkpoint`` of every run
(read-latest ten times a round). Printed: p50 and p90 wall milliseconds per
call, and client CPU per call.

To compare two trees in one session, run it with each on ``PYTHONPATH``
(the script only uses the public facade), one after the other, and quote the
ratios; the load average is printed before and after, and whether redis-py
parses replies with hiredis (the peers harness's venv has it; ours does not).
"""

from __future__ import annotations

import argparse
import functools
import os
import random
import shutil
import statistics
import string
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from _payloads import ChatShape, Vocabulary
from redis.utils import HIREDIS_AVAILABLE
from task_bench import RedisAlways

from memory import Memory

# The shape this bench was first measured with: more of the size in messages than the peers'
# payload, one tool, uniformly drawn words (each made by its own seed).
SHAPE = ChatShape(
    message_share=0.55,
    tool_share=0.12,
    tools=["search"],
    effects=["http.post", "email.send", "db.write"],
    parent_link=False,
)
WORDS = Vocabulary(
    ["".join(random.Random(n).choices(string.ascii_lowercase, k=2 + n % 9)) for n in range(2000)]
)


def chat_state(run: int, step: int, size: int = 5000) -> dict[str, object]:
    """A deterministic agent checkpoint of about ``size`` JSON bytes (the peers' shape)."""
    rng = random.Random(run * 100_003 + step)
    return SHAPE.state(rng, WORDS, f"run-{run:05d}", step, size)


def _same(state: dict[str, object]) -> dict[str, object]:
    return state


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


def _timed(
    samples: dict[str, list[tuple[float, float]]], name: str, call: Callable[[], object]
) -> None:
    began, began_cpu = time.perf_counter(), time.process_time()
    call()
    samples[name].append((time.perf_counter() - began, time.process_time() - began_cpu))


def bench(memory: Memory, runs: int, passes: int) -> dict[str, list[tuple[float, float]]]:
    """Write ``runs`` runs of 100 chat-state steps, then time the reads in rotating rounds."""
    heads: dict[str, str] = {}
    for run in range(runs):
        handle = memory.start_run("bench", f"read-{run}")
        for step in range(100):
            state = chat_state(run, step)
            handle.step("agent_step", functools.partial(_same, state))
        heads[handle.run_id] = handle.info.head_checkpoint_id or ""
    samples: dict[str, list[tuple[float, float]]] = {
        "history(100)": [],
        "read-latest": [],
        "get-by-id": [],
    }

    def history() -> None:
        for run_id in heads:
            _timed(samples, "history(100)", functools.partial(memory.run_history, run_id))

    def latest() -> None:
        for _ in range(10):
            for run_id in heads:
                _timed(
                    samples,
                    "read-latest",
                    functools.partial(memory.tasks.latest_checkpoint, run_id),
                )

    def by_id() -> None:
        for run_id, checkpoint_id in heads.items():
            _timed(
                samples,
                "get-by-id",
                functools.partial(memory.tasks.get_checkpoint, run_id, checkpoint_id),
            )

    rounds = [history, latest, by_id]
    for turn in range(passes):
        shift = turn % len(rounds)
        for read in rounds[shift:] + rounds[:shift]:
            read()
    assert len(memory.run_history(next(iter(heads)))) == 100
    return samples


def report(backend: str, samples: dict[str, list[tuple[float, float]]]) -> None:
    """Print p50/p90 wall and mean client CPU per call, in milliseconds."""
    for name, pairs in samples.items():
        walls = sorted(wall for wall, _ in pairs)
        cpu = statistics.fmean(c for _, c in pairs)
        print(
            f"  {backend:<7} {name:<13} p50 {statistics.median(walls) * 1e3:7.3f} ms  "
            f"p90 {walls[int(len(walls) * 0.9)] * 1e3:7.3f} ms  CPU {cpu * 1e3:7.3f} ms  (n={len(walls)})",
            flush=True,
        )


def main() -> None:
    """Run the reads on SQLite, then on Redis, and print each one's latencies."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=10, help="runs of 100 steps")
    parser.add_argument("--passes", type=int, default=20, help="rounds of reads")
    parser.add_argument("--only", choices=["sqlite", "redis"], help="one backend")
    args = parser.parse_args()
    print(
        _load(),
        "| tiers from",
        Path(sys.modules["memory"].__file__ or "").parent.parent,
        # redis-py parses replies in Python without hiredis: several times slower on 5 KB values.
        "| hiredis",
        "yes" if HIREDIS_AVAILABLE else "no",
        flush=True,
    )
    work = Path(tempfile.mkdtemp(prefix="tiermem-read-"))
    try:
        if args.only in (None, "sqlite"):
            memory = Memory.open(work / "sqlite")
            report("sqlite", bench(memory, args.runs, args.passes))
            memory.close()
        if args.only in (None, "redis"):
            (work / "redis-data").mkdir()
            server = RedisAlways(work / "redis-data")
            try:
                memory = Memory.open(work / "redis", kv_url=server.url)
                report("redis", bench(memory, args.runs, args.passes))
                memory.close()
            finally:
                server.stop()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        print(_load())


if __name__ == "__main__":
    main()
