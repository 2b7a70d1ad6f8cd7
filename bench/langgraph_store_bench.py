"""Latency of the LangGraph store (TiermemStore) per operation, next to LangGraph's own stores.

Puts ``--users`` x ``--per-user`` memories (one short sentence each, embedded
with the bundled MiniLM), then times get, semantic search within one user's
namespace, and listing, and prints p50 / p95 in milliseconds. The same
workload runs on LangGraph's InMemoryStore (same embedder, no persistence)
and, without vectors, on LangGraph's SqliteStore for the plain key-value cost.

    python bench/langgraph_store_bench.py
    python bench/langgraph_store_bench.py --redis-url redis://127.0.0.1:6379/0
"""

from __future__ import annotations

import argparse
import random
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

from langgraph.store.base import BaseStore
from langgraph.store.memory import InMemoryStore
from langgraph.store.sqlite import SqliteStore

from memory import Memory, Settings
from memory.integrations.langgraph_store import TiermemStore

SUBJECTS = ["pizza", "my cat Tom", "the billing migration", "jazz", "hiking", "Postgres", "tea"]
VERBS = ["I like", "I am worried about", "remind me about", "I never want", "tell me more about"]


def sentence(rng: random.Random) -> str:
    return f"{rng.choice(VERBS)} {rng.choice(SUBJECTS)} ({rng.randrange(10_000)})"


def timed(fn: Callable[[], Any], runs: int) -> tuple[float, float]:
    samples = []
    for _ in range(runs):
        start = time.perf_counter()
        fn()
        samples.append((time.perf_counter() - start) * 1000)
    samples.sort()
    return statistics.median(samples), samples[int(len(samples) * 0.95) - 1]


def run(name: str, store: BaseStore, users: int, per_user: int, semantic: bool) -> None:
    rng = random.Random(7)
    puts = []
    for u in range(users):
        for i in range(per_user):
            start = time.perf_counter()
            store.put(("memories", f"user{u}"), f"m{i}", {"content": sentence(rng)})
            puts.append((time.perf_counter() - start) * 1000)
    puts.sort()
    print(f"\n{name}: {users * per_user} items")
    print(
        f"  put                 p50 {statistics.median(puts):7.2f} ms  p95 {puts[int(len(puts) * 0.95) - 1]:7.2f} ms"
    )

    def one_user() -> tuple[str, ...]:
        return ("memories", f"user{rng.randrange(users)}")

    rows = [
        ("get", lambda: store.get(one_user(), f"m{rng.randrange(per_user)}")),
        ("list (10 newest)", lambda: store.search(one_user(), limit=10)),
        ("filter (all users)", lambda: store.search(("memories",), filter={"content": "x"})),
    ]
    if semantic:
        rows.append(("semantic search", lambda: store.search(one_user(), query="favourite food")))
    for label, fn in rows:
        p50, p95 = timed(fn, 200 if label != "filter (all users)" else 20)
        print(f"  {label:<19} p50 {p50:7.2f} ms  p95 {p95:7.2f} ms")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--users", type=int, default=20)
    parser.add_argument("--per-user", type=int, default=25)
    parser.add_argument("--redis-url", default=None)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        backends = [("tiermem (SQLite)", None)]
        if args.redis_url:
            backends.append(("tiermem (Redis)", args.redis_url))
        for label, url in backends:
            memory = Memory.from_settings(Settings(data_dir=root / label[9:14], kv_url=url))
            try:
                run(label, TiermemStore(memory), args.users, args.per_user, semantic=True)
            finally:
                memory.close()
        embedder = Memory.from_settings(Settings(data_dir=root / "embedder")).embedder
        in_memory = InMemoryStore(index={"dims": embedder.dimension, "embed": embedder.embed})
        run("LangGraph InMemoryStore (same MiniLM)", in_memory, args.users, args.per_user, True)
        with SqliteStore.from_conn_string(str(root / "lg.sqlite3")) as sqlite_store:
            sqlite_store.setup()
            run(
                "LangGraph SqliteStore (no vectors)", sqlite_store, args.users, args.per_user, False
            )


if __name__ == "__main__":
    main()
