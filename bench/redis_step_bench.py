"""A durable 5 KB step on Redis beside raw SET, interleaved so the machine's load hits all alike.

Usage::

    flock /tmp/tiermem-bench.lock python bench/redis_step_bench.py [--blocks 40] [--block 50]

One ``redis-server`` with ``appendfsync always``; the systems take turns in
blocks of ``--block`` writes, in rotating order, and each one's time and
client CPU are summed over its blocks, and so are the server's: the
``usec`` that ``INFO commandstats`` adds to the commands a system sends
(``SET``; ``EVALSHA``, and ``HMGET`` for a head read) and the growth of the
append-only file (``aof_current_size``; automatic rewrites are off for the
run), read before and after each block. Rows: raw ``SET`` of the payload's
bytes, ``RunHandle.step`` reading the run's head before every step
(``head_fresh_ms=0``, two round trips), with the default head window (one
round trip), and with the window and no redaction (what redaction costs);
then ``RunHandle.append_checkpoint`` of the same payload (a step the caller ran,
as the Agents SDK session and the HTTP checkpoint route write) without and with
the window. Then ``--history`` reads of a 100-step run's whole history
(``TaskTier.history``): the median wall time, and the client CPU and server
``usec`` per read (what the scan sends: ``EVALSHA``, ``MULTI``, ``HMGET``,
``ZLEXCOUNT``, ``EXEC``).
The load average is printed before and after; quote the ratios, which come
from one run.
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import redis
from step_bench import PAYLOAD
from task_bench import RedisAlways

from tiers.backends.redis_kv import RedisKVStore
from tiers.redaction import Redactor
from tiers.task import RunHandle, TaskTier


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg())


# The commands the systems send themselves (the commit script's own HSET, HGET, ZADD are
# counted inside EVALSHA's time too, so they are left out).
_SENT = ("cmdstat_set", "cmdstat_evalsha", "cmdstat_hmget")
# What a history read sends: the scan script, then the values in one MULTI.
_SCAN_SENT = (
    "cmdstat_evalsha",
    "cmdstat_multi",
    "cmdstat_hmget",
    "cmdstat_zlexcount",
    "cmdstat_exec",
)


def _server_usec(client: redis.Redis, sent: tuple[str, ...] = _SENT) -> float:
    stats: dict[str, Any] = client.info("commandstats")
    return sum(float(stats[name]["usec"]) for name in sent if name in stats)


def _history(kv: RedisKVStore, client: redis.Redis, reads: int) -> None:
    """Print the median wall time, client CPU and server usec of a 100-step run's history."""
    tier = TaskTier(kv, redactor=Redactor())
    handle = tier.start_run("bench", "history")
    for _ in range(100):
        handle.step("search", lambda: PAYLOAD)
    tier.history(handle.run_id)  # the scan script is loaded once per connection
    walls: list[float] = []
    cpu = usec = 0.0
    for _ in range(reads):
        began_usec = _server_usec(client, _SCAN_SENT)
        began, began_cpu = time.perf_counter(), time.process_time()
        assert len(tier.history(handle.run_id)) == 100
        walls.append(time.perf_counter() - began)
        cpu += time.process_time() - began_cpu
        usec += _server_usec(client, _SCAN_SENT) - began_usec
    print(
        f"history of 100 steps, {reads} reads: p50 {statistics.median(walls) * 1e3:.2f} ms  "
        f"client CPU {cpu / reads * 1e3:.2f} ms/read  server {usec / reads:.0f} us/read",
        flush=True,
    )


def _aof_bytes(client: redis.Redis) -> int:
    return int(client.info("persistence")["aof_current_size"])


def main() -> None:
    """Run the interleaved blocks and print each system's rate and client CPU per write."""
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--blocks", type=int, default=40, help="turns each system takes")
    parser.add_argument("--block", type=int, default=50, help="writes per turn")
    parser.add_argument("--history", type=int, default=50, help="reads of a 100-step history")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="tiermem-redis-step-"))
    print(_load(), flush=True)
    server = RedisAlways(work)
    try:
        client = redis.Redis.from_url(server.url)
        client.config_set("auto-aof-rewrite-percentage", 0)  # the file's growth is measured
        kv = RedisKVStore(server.url)
        value = json.dumps(PAYLOAD).encode()
        numbers = itertools.count()

        def run(window: float, redactor: Redactor | None) -> RunHandle:
            handle = TaskTier(kv, redactor=redactor, head_fresh_ms=window).start_run(
                "bench", f"run-{next(numbers)}"
            )
            handle.step("warm", lambda: 0)  # the commit script is loaded once per connection
            return handle

        def steps(handle: RunHandle) -> Callable[[], None]:
            def turn() -> None:
                for _ in range(args.block):
                    handle.step("search", lambda: PAYLOAD)

            return turn

        def appends(handle: RunHandle) -> Callable[[], None]:
            def turn() -> None:
                for _ in range(args.block):
                    handle.append_checkpoint("items", PAYLOAD)

            return turn

        def raw() -> None:
            for _ in range(args.block):
                client.set(f"raw:{next(numbers)}", value)

        default = TaskTier(kv).head_fresh_ms
        systems = {
            "raw Redis SET": raw,
            "step, head read first (head_fresh_ms=0)": steps(run(0, Redactor())),
            f"step, head window (head_fresh_ms={default:g})": steps(run(default, Redactor())),
            "step, head window, no redaction": steps(run(default, None)),
            "append_checkpoint, head read first (0)": appends(run(0, Redactor())),
            f"append_checkpoint, head window ({default:g})": appends(run(default, Redactor())),
        }
        names = list(systems)
        wall = dict.fromkeys(names, 0.0)
        cpu = dict.fromkeys(names, 0.0)
        usec = dict.fromkeys(names, 0.0)
        aof = dict.fromkeys(names, 0)
        for turn in range(args.blocks):
            shift = turn % len(names)
            for name in names[shift:] + names[:shift]:
                began_usec, began_aof = _server_usec(client), _aof_bytes(client)
                began, began_cpu = time.perf_counter(), time.process_time()
                systems[name]()
                wall[name] += time.perf_counter() - began
                cpu[name] += time.process_time() - began_cpu
                usec[name] += _server_usec(client) - began_usec
                aof[name] += _aof_bytes(client) - began_aof
        writes = args.blocks * args.block
        floor = writes / wall["raw Redis SET"]
        print(f"{writes} durable 5 KB writes per system, appendfsync always")
        for name in names:
            rate = writes / wall[name]
            print(
                f"  {name:<44} {rate:7.0f}/s  {rate / floor:.2f}x raw SET  "
                f"client CPU {cpu[name] / writes * 1e6:4.0f} us/write  "
                f"server {usec[name] / writes:5.1f} us/write  AOF {aof[name] / writes:5.0f} B/write",
                flush=True,
            )
        _history(kv, client, args.history)
        kv.close()
        client.close()
    finally:
        server.stop()
        print(_load())


if __name__ == "__main__":
    main()
