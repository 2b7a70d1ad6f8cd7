"""Cold recalls of many tenants in one process: the view-reading workers past the cap (issue 19 item 2).

A service keeps a tier per tenant (``Memory.for_tenant``); every tier's cold
recalls read the user's view in a worker beside the query's embedding, and all
tiers' workers share a cap of ``MAX_PROCESS_READ_WORKERS`` = 16 threads. This
bench builds ``--tenants`` tenants of ``--users-per-tenant`` users, each user
holding ``--sessions-per-user`` real transcripts (LongMemEval_S / LoCoMo
sessions resampled as in ``session_scale_bench.py``, through ``end_session``),
then in a freshly opened store (model loaded first, the window pass parked as
there) asks, tenant after tenant as a service's first requests would, each
user's first (cold) ``recall_relevant(top_k=5)``; a tenant's view is made at
its first request. It reports cold recall p50 / p95 / p99 for the first 16
tenants and for the later ones, and how many cold recalls had their vectors
read by a worker thread rather than in the caller. Run it on two trees (e.g.
``PYTHONPATH=<tree>``) for a before / after.

Usage::

    python bench/tenant_recall_bench.py --store /tmp/tenants40 --tenants 40 --rounds 2
"""

from __future__ import annotations

import argparse
import json
import os
import threading
import time
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path

import numpy as np
import numpy.typing as npt
from recall_bench import DEFAULT_DATA, percentiles
from session_scale_bench import User, plan

from memory import Memory
from tiers.backends.base import Delete, Put
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.keys import session_windows_outbox_space

DONE_FILE = "tenant-bench-ingested.json"
FIRST = 16  # MAX_PROCESS_READ_WORKERS: the tenants that can start a worker of their own
WORKER = "tiermem-recall-view"


def tenant_of(n: int) -> str:
    return f"tenant{n:03d}"


def ingest(store: Path, tenants: list[list[User]]) -> None:
    """Every tenant's users' sessions through ``end_session``, until searchable."""
    marker = store / DONE_FILE
    if marker.exists() and json.loads(marker.read_text())["tenants"] >= len(tenants):
        print(f"reusing the store in {store} (ingest skipped)")
        return
    memory = Memory.open(store)
    try:
        started = time.perf_counter()
        for n, users in enumerate(tenants):
            view = memory.for_tenant(tenant_of(n))
            for user in users:
                for session in user.sessions:
                    view.end_session(
                        user.user_id,
                        session.session_id,
                        session.messages,
                        created_at=session.created_at,
                    )
        for n in range(len(tenants)):
            if not memory.for_tenant(tenant_of(n)).sessions.flush(3600, windows=False):
                raise RuntimeError("the index did not catch up")
        marker.write_text(json.dumps({"tenants": len(tenants)}))
        print(f"ingested in {time.perf_counter() - started:.0f} s")
    finally:
        memory.close()


@contextmanager
def windows_parked(store: Path, count: int) -> Iterator[None]:
    """Move every tenant's queued window pass out of the index worker's way, and back."""
    kv = SqliteKVStore(store / "tiermem.sqlite3")

    def move(source: str, target: str) -> None:
        entries = list(kv.scan(source))
        if entries:
            kv.commit(
                [Put(target, key, value) for key, value in entries]
                + [Delete(source, key) for key, _ in entries]
            )

    spaces = [session_windows_outbox_space(tenant_of(n)) for n in range(count)]
    try:
        for space in spaces:
            move(space, f"{space}:tenant-bench-parked")
        yield
    finally:
        for space in spaces:
            move(f"{space}:tenant-bench-parked", space)
        kv.close()


def measure(store: Path, tenants: list[list[User]]) -> None:
    """One round in a freshly opened store: each user's first recall, tenant after tenant."""
    memory = Memory.open(store)
    in_worker = [0, 0]  # [first tenants, later tenants]: cold reads of vectors in a worker
    in_caller = [0, 0]
    side = [0]  # which of the two the recall being measured counts in (one at a time)
    read = memory.index.get_embeddings

    def counted(ids: Sequence[str]) -> tuple[list[str], npt.NDArray[np.float32]]:
        if not any("warm-up" in i for i in ids):  # not a tier's loading of the index
            if threading.current_thread().name == WORKER:
                in_worker[side[0]] += 1
            else:
                in_caller[side[0]] += 1
        return read(ids)

    setattr(memory.index, "get_embeddings", counted)  # noqa: B010 (mypy refuses the assignment)
    try:
        memory.embedder.embed(["warm up the model"])  # a service loads it at start
        times: list[list[float]] = [[], []]
        for n, users in enumerate(tenants):
            side[0] = int(n >= FIRST)
            view = memory.for_tenant(tenant_of(n))  # a service's first request of the tenant
            for user in users:
                started = time.perf_counter()
                view.recall_relevant(user.user_id, user.questions[0], top_k=5)
                times[side[0]].append((time.perf_counter() - started) * 1000)
        for n, name in enumerate((f"tenants 1..{FIRST}", f"tenants {FIRST + 1}..")):
            p50, p95, p99 = percentiles(times[n])
            print(
                f"  {name}: cold recall p50 / p95 / p99 {p50:.1f} / {p95:.1f} / {p99:.1f} ms "
                f"(n = {len(times[n])}); vectors read in a worker {in_worker[n]}, "
                f"in the caller {in_caller[n]}"
            )
    finally:
        memory.close()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--store", type=Path, required=True)
    parser.add_argument("--tenants", type=int, default=40)
    parser.add_argument("--users-per-tenant", type=int, default=3)
    parser.add_argument("--sessions-per-user", type=int, default=4)
    parser.add_argument("--rounds", type=int, default=1)
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--seed", type=int, default=28)
    args = parser.parse_args()
    users = plan(
        args.data, args.tenants * args.users_per_tenant, args.sessions_per_user, 3, args.seed
    )
    tenants = [
        users[n * args.users_per_tenant : (n + 1) * args.users_per_tenant]
        for n in range(args.tenants)
    ]
    args.store.mkdir(parents=True, exist_ok=True)
    ingest(args.store, tenants)
    for round_ in range(args.rounds):
        print(f"round {round_ + 1}, load {' '.join(map(str, os.getloadavg()))}", flush=True)
        with windows_parked(args.store, args.tenants):
            measure(args.store, tenants)
    print(f"load {' '.join(map(str, os.getloadavg()))}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
