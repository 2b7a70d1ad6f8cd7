"""LangGraph checkpointer benchmark: tiermem's saver beside LangGraph's SqliteSaver (prints figures).

Usage::

    pip install -e ".[bench]"
    python bench/langgraph_bench.py [--turns 300] [--window 10] [--redis]

A growing chat thread on a real 3-node ``StateGraph`` (plan -> answer -> review, each
adding a message to an ``add_messages`` channel), invoked with ``durability="sync"``.
The conversation is real: user and assistant turns of a LongMemEval_S haystack from
``../shared/data/recall-dev/`` (assistant answers of realistic length), so messages
are the sizes users send. Both savers are durable (SQLite WAL, ``synchronous=FULL``:
every commit fsync'd; Redis with ``appendfsync always``).

The two savers run in lock step, one turn each in turn, so both see the same machine
(fsync latency here swings between ~0.05 ms idle and ~4 ms busy). Figures:

1. invokes/s and node steps/s over the first ``--window`` turns and the last ones;
2. ``get_state`` p50/p99 at the last turn: with the saver that ran the thread, and ours also
   "cold" (a new saver each time, as in a process that never saw the thread: it decodes
   everything from storage);
3. bytes stored for the thread (payload bytes, and the database file after a WAL checkpoint);
4. the ratio ours / SqliteSaver of each.
"""

from __future__ import annotations

import argparse
import gzip
import json
import os
import shutil
import socket
import sqlite3
import statistics
import subprocess
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Annotated, Any, TypedDict

from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.sqlite import SqliteSaver
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from memory import Memory, Settings
from memory.integrations.langgraph import TiermemSaver
from tiers import keys
from tiers.threads import thread_key

DATA = Path(__file__).resolve().parents[1].parent / "shared" / "data" / "recall-dev"


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]


def conversation(turns: int) -> list[tuple[str, str]]:
    """(user, assistant) pairs of one LongMemEval_S haystack, in order, at least ``turns`` long."""
    pairs: list[tuple[str, str]] = []
    with gzip.open(DATA / "longmemeval_s.sessions.jsonl.gz", "rt") as lines:
        user = None
        for line in lines:
            session = json.loads(line)
            for turn in session["turns"]:
                if turn["speaker"] == "user":
                    user = turn["text"]
                elif user is not None:
                    pairs.append((user, turn["text"]))
                    user = None
            if len(pairs) >= turns:
                return pairs[:turns]
    raise SystemExit(f"the data has only {len(pairs)} turns")


def graph(saver: Any, answers: dict[str, str]) -> Any:
    def plan(state: Chat) -> dict[str, Any]:
        return {"messages": [AIMessage("Plan: answer the question using the thread so far.")]}

    def answer(state: Chat) -> dict[str, Any]:
        return {"messages": [AIMessage(answers[state["messages"][-2].content])]}

    def review(state: Chat) -> dict[str, Any]:
        return {"messages": [AIMessage("Reviewed: ok.")]}

    builder = StateGraph(Chat)
    builder.add_node("plan", plan)
    builder.add_node("answer", answer)
    builder.add_node("review", review)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "answer")
    builder.add_edge("answer", "review")
    builder.add_edge("review", END)
    return builder.compile(checkpointer=saver)


class System:
    def __init__(self, name: str, saver: Any, bytes_of: Callable[[], tuple[int, int]]) -> None:
        self.name = name
        self.saver = saver
        self.bytes_of = bytes_of
        self.times: list[float] = []
        self.graph: Any = None


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def start_redis(workdir: Path) -> tuple[subprocess.Popen[bytes], str]:
    port = free_port()
    proc = subprocess.Popen(
        ["redis-server", "--port", str(port), "--bind", "127.0.0.1", "--dir", str(workdir),
         "--save", "", "--appendonly", "yes", "--appendfsync", "always"],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    time.sleep(0.5)
    return proc, f"redis://127.0.0.1:{port}/0"


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--turns", type=int, default=300)
    parser.add_argument("--window", type=int, default=10)
    parser.add_argument("--redis", action="store_true", help="also run ours on Redis")
    args = parser.parse_args()
    pairs = conversation(args.turns)
    answers = dict(pairs)
    work = Path(tempfile.mkdtemp(prefix="lg-bench-"))
    thread = "bench-thread"
    config = {"configurable": {"thread_id": thread}}

    conn = sqlite3.connect(work / "sqlitesaver.db", check_same_thread=False)
    theirs = SqliteSaver(conn)
    theirs.setup()

    def sqlite_bytes() -> tuple[int, int]:
        cur = conn.execute(
            "SELECT coalesce(sum(length(checkpoint) + length(metadata)), 0) FROM checkpoints"
        )
        payload = cur.fetchone()[0]
        payload += conn.execute("SELECT coalesce(sum(length(value)), 0) FROM writes").fetchone()[0]
        conn.execute("PRAGMA wal_checkpoint(TRUNCATE)")
        return payload, (work / "sqlitesaver.db").stat().st_size

    systems = [System("LangGraph SqliteSaver", theirs, sqlite_bytes)]

    def add_ours(name: str, memory: Memory, path: Path | None) -> None:
        def ours_bytes() -> tuple[int, int]:
            space = keys.thread_space(memory.tenant, thread_key(thread))
            payload = sum(len(v) for _, v in memory.kv.scan(space))
            size = 0
            if path is not None:
                sqlite3.connect(path).execute("PRAGMA wal_checkpoint(TRUNCATE)").close()
                size = path.stat().st_size
            return payload, size

        systems.append(System(name, TiermemSaver(memory), ours_bytes))

    mem = Memory.from_settings(Settings(data_dir=work / "tiermem"))
    add_ours("tiermem TiermemSaver, SQLite", mem, work / "tiermem" / "tiermem.sqlite3")
    redis_proc = None
    if args.redis and shutil.which("redis-server"):
        redis_proc, url = start_redis(work)
        rmem = Memory.from_settings(Settings(data_dir=work / "tiermem-redis", kv_url=url))
        add_ours("tiermem TiermemSaver, Redis (always)", rmem, None)

    for system in systems:
        system.graph = graph(system.saver, answers)
    try:
        for turn, (user, _) in enumerate(pairs):
            for system in systems:
                began = time.perf_counter()
                system.graph.invoke({"messages": [HumanMessage(user)]}, config, durability="sync")
                system.times.append(time.perf_counter() - began)
            if (turn + 1) % 50 == 0:
                print(f"  turn {turn + 1}", flush=True)
        print(f"\nLangGraph 3-node chat thread, {args.turns} turns, durability='sync' "
              f"(load average {os.getloadavg()[0]:.2f})")  # fmt: skip
        w = args.window
        rows = []
        for system in systems:
            first = w / sum(system.times[:w])
            last = w / sum(system.times[-w:])
            gets = []
            for _ in range(50):
                began = time.perf_counter()
                state = system.graph.get_state(config)
                gets.append(time.perf_counter() - began)
            assert len(state.values["messages"]) == 4 * args.turns
            payload, file_size = system.bytes_of()
            rows.append((system.name, first, last, gets, payload, file_size))
            if isinstance(system.saver, TiermemSaver):
                # Cold: a new saver each time, as in a process that never saw this thread.
                cold = []
                for _ in range(20):
                    fresh = graph(TiermemSaver(system.saver.memory), answers)
                    began = time.perf_counter()
                    fresh.get_state(config)
                    cold.append(time.perf_counter() - began)
                rows.append((system.name + " (cold get)", first, last, cold, payload, file_size))
        base = rows[0]
        header = (f"{'system':40} {'inv/s t1-' + str(w):>12} {'inv/s last':>11} "
                  f"{'get p50 ms':>11} {'get p99 ms':>11} {'payload MB':>11} {'file MB':>8}")  # fmt: skip
        print(header)
        for name, first, last, gets, payload, size in rows:
            print(
                f"{name:40} {first:12.1f} {last:11.1f} {percentile(gets, 0.5) * 1e3:11.2f} "
                f"{percentile(gets, 0.99) * 1e3:11.2f} {payload / 1e6:11.2f} {size / 1e6:8.2f}"
            )
        print(
            "\nratios ours / SqliteSaver (steps/s: higher is better; get, bytes: lower is better)"
        )
        for name, first, last, gets, payload, size in rows[1:]:
            print(
                f"{name:40} first {first / base[1]:.2f}x  last {last / base[2]:.2f}x  "
                f"get p50 {statistics.median(gets) / statistics.median(base[3]):.2f}x  "
                f"payload {payload / base[4]:.3f}x  file {size / base[5] if size else 0:.3f}x"
            )
        print(f"(node steps/s = 3 x invokes/s; {4 * args.turns} messages in the thread at the end)")
    finally:
        for system in systems[1:]:
            system.saver.memory.close()
        if redis_proc is not None:
            redis_proc.terminate()
            redis_proc.wait()
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
