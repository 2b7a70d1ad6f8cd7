"""What the cache sweeper (tiers.cache_ages) costs the hot paths (prints figures; not a test).

Usage::

    python bench/cache_ages_bench.py [--passes 7] [--steps 2000]
    TIERMEM_CACHE_MAX_AGE_SECONDS=0.2 python bench/cache_ages_bench.py   # sweeps every 50 ms

Per figure, the best of ``--passes`` passes (the least disturbed by the machine): a run's step
on SQLite without fsync (the CPU of the step's path, where a sweep would show as contention),
``get_facts`` of a user with 20 facts (the decoded-fact memo hit), and a recall of a user with
20 sessions (the cached view). Only the public API is used, so the same script measures a
checkout without the sweeper: run it from each and compare.
"""

from __future__ import annotations

import argparse
import os
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from memory import Memory


def best_us(passes: int, n: int, fn: Callable[[], object]) -> float:
    """Microseconds per call of ``fn``: the best of ``passes`` passes of ``n`` calls."""
    best = float("inf")
    for _ in range(passes):
        start = time.perf_counter()
        for _ in range(n):
            fn()
        best = min(best, (time.perf_counter() - start) / n)
    return best * 1e6


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--passes", type=int, default=7)
    parser.add_argument("--steps", type=int, default=2000)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp, Memory.open(Path(tmp), durable=False) as memory:
        run = memory.start_run("bench", "r1")
        payload = {"answer": "x" * 200, "n": 1}
        step_us = best_us(args.passes, args.steps, lambda: run.step("s", lambda: payload))

        for n in range(20):
            memory.set_fact("ann", f"k{n}", f"value number {n} of the user's preferences")
        facts_us = best_us(args.passes, 2000, lambda: memory.get_facts("ann"))

        for n in range(20):
            memory.end_session(
                "ann",
                f"s{n}",
                [
                    {"role": "user", "content": f"session {n}: I like green tea and hiking"},
                    {"role": "assistant", "content": "Noted."},
                ],
            )
        assert memory.flush(120)
        recall_us = best_us(args.passes, 200, lambda: memory.recall_relevant("ann", "tea"))
    age = os.environ.get("TIERMEM_CACHE_MAX_AGE_SECONDS", "default")
    print(f"cache max age: {age}; best of {args.passes} passes")
    print(f"step (SQLite, no fsync): {step_us:8.1f} us")
    print(f"get_facts (20 facts):    {facts_us:8.1f} us")
    print(f"recall (20 sessions):    {recall_us:8.1f} us")


if __name__ == "__main__":
    main()
