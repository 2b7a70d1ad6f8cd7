"""Session recall and continuation-context latency at scale, with real transcripts (issue 19 item 2).

Builds a store of ``--users`` x ``--sessions-per-user`` sessions whose transcripts
are real ones resampled from the recall-dev data (LongMemEval_S and LoCoMo
sessions, read at run time from ``--data``; nothing is copied into the repo).
Each user gets a different mix: the sessions of ``--sources-per-user`` source
users (LongMemEval haystacks or LoCoMo conversations) drawn at random, sampled
without replacement and kept in their original chronological order. Every
session goes through ``Memory.end_session`` (full transcript, offline summary) on
``Memory.open`` (SQLite + embedded Chroma + local MiniLM, background indexing:
the embedded default); ingest ends when every session is searchable
(``sessions.flush(windows=False)``: base vector and keywords), or with
``--windows`` when every transcript window is indexed too (``Memory.flush``, about
4x the CPU on LongMemEval sessions).

Then, for ``--rounds`` restarts: the store is opened again (``Memory.open``), one
warm-up query of the last user goes first (model load, opening the index), and
each other user asks one question of one of its source users:
first through ``recall_relevant(top_k=5)`` (cold: nothing of the user is cached),
then again (warm); then in another freshly opened store the same through
``build_continuation_context``. Query embedding is included everywhere.
``--profile`` prints a cProfile of the cold recalls of the first round.
Each call kind also reports its open, its first call after the open (the warm-up:
what the first user of a freshly opened store waits for; ``--open-pause-ms`` lets
the store load in the background first, as an application's start-up would) and
its five slowest cold queries with the second since the open they started at
(a tail of first-open work bunches at the start; one of a loaded box does not).
``--snapshot DIR`` copies the store right after ingest, so its first open can be
replayed on copies.
Each figure line also counts the cyclic GC's full (generation-2) collections
that ran during its queries, with the longest one. As ``tiermem serve`` does
after its warm-up (``api/app.py``), the bench freezes what is alive after the
process's first warm-up query (``gc.collect(); gc.freeze()``), so a full scan
walks only what was made since (``--no-freeze-gc``: as an embedded app that
does not). ``--busy N`` runs N busy-loop
processes beside the measurement (a loaded box on demand; stopped afterwards).
The transcripts of the plan are dropped once ingested, so the bench process
holds what an application would (the questions), not the datasets.

Without ``--windows`` the second index pass (transcript windows, ~1 session/s on
a busy 2-core box) is still queued when ingest ends, and the index worker of
the reopened store would run it beside the queries (both embed, on the same
cores). So while measuring, the bench parks that queue: its outbox entries are
moved to a side space of the KV store and put back afterwards (also when a
measurement fails); recall then ranks each session by its base vector and
keywords, as it does for any session whose windows are not indexed yet.
``--unparked`` measures with the window pass running instead; ``--compare`` measures
both in each round, parked first (the same run, the same load), and reports how many
sessions' windows the pass indexed while the queries ran. ``--gap-ms`` adds a pause
after each query (a client's think time; not counted in the latency): back to back,
the pass (which since session 24 gives way to queries, ``tiers/session/_windows.py``)
gets almost no gap to run in; with a gap it runs between queries and a query may
arrive while one of its model calls is running.

The store is kept in ``--store`` and reused when it holds every user asked for
(ingest skipped); otherwise ingest resumes at the first user not done. The plan
(which sessions each user gets) depends only on the data, ``--seed``,
``--sessions-per-user`` and ``--sources-per-user``, and user n's mix does not
depend on ``--users``: a store of 500 users grows to 1,000 by a rerun with
``--users 1000``.

Usage::

    python bench/session_scale_bench.py --users 200 --sessions-per-user 10 --store /tmp/scale
    python bench/session_scale_bench.py --users 1000 --sessions-per-user 100 --store /tmp/s100k
"""

from __future__ import annotations

import argparse
import cProfile
import gc
import json
import os
import pstats
import random
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from recall_bench import DEFAULT_DATA, Session, load, percentiles

from memory import Memory
from tiers.backends.base import Delete, KVStore, Put
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.keys import session_windows_outbox_space

DONE_FILE = "scale-bench-ingested.json"
TENANT = "default"  # Memory.open's tenant


@dataclass
class User:
    """One bench user: its sessions (a mix of real ones) and the questions it may ask."""

    user_id: str
    sessions: list[Session]
    questions: list[str]


def plan(data: Path, users: int, per_user: int, sources_per_user: int, seed: int) -> list[User]:
    """Each user's sessions and questions, drawn from both datasets (deterministic in ``seed``)."""
    sessions: dict[str, list[Session]] = {}
    questions: dict[str, list[str]] = {}
    for name in ("longmemeval_s", "locomo"):
        dataset = load(data, name, 0)
        sessions.update(dataset.sessions)
        for query in dataset.queries:
            questions.setdefault(query.user_id, []).append(query.text)
    sources = sorted(sessions)
    rng = random.Random(seed)
    out: list[User] = []
    for n in range(users):
        picked = rng.sample(sources, min(sources_per_user, len(sources)))
        pool = [(source, s) for source in picked for s in sessions[source]]
        while len(pool) < per_user:  # a small mix: widen it with one more source
            extra = rng.choice([source for source in sources if source not in picked])
            pool.extend((extra, s) for s in sessions[extra])
            picked.append(extra)
        chosen = sorted(rng.sample(pool, per_user), key=lambda pair: pair[1].created_at)
        user_id = f"scale{n:05d}"
        out.append(
            User(
                user_id,
                [
                    Session(user_id, f"{source}.{s.session_id}", s.created_at, s.messages)
                    for source, s in chosen
                ],
                [q for source in picked for q in questions.get(source, [])],
            )
        )
    return out


def ingest(store: Path, users: list[User], windows: bool) -> None:
    """Every user's sessions through ``end_session``; resumes after the last user done."""
    marker = store / DONE_FILE
    start = int(json.loads(marker.read_text())["users"]) if marker.exists() else 0
    if start >= len(users):
        print(f"reusing the store in {store}: {start} users ingested (ingest skipped)")
        return
    total = sum(len(u.sessions) for u in users[start:])
    print(f"ingesting {total} sessions of users {start}..{len(users) - 1} into {store}")
    memory = Memory.open(store)
    try:
        memory.embedder.embed(["warm up the model"])  # model load is not ingest
        cpu, wall = time.process_time(), time.perf_counter()
        done = 0
        for n, user in enumerate(users[start:], start):
            for session in user.sessions:
                memory.end_session(
                    user.user_id,
                    session.session_id,
                    session.messages,
                    created_at=session.created_at,
                )
            done += len(user.sessions)
            marker.write_text(json.dumps({"users": n + 1}))
            if (n + 1) % 20 == 0:
                elapsed = time.perf_counter() - wall
                print(
                    f"  {n + 1} users, {done}/{total} sessions acknowledged, "
                    f"{done / elapsed:.1f}/s, load {os.getloadavg()[0]:.1f}",
                    flush=True,
                )
        acknowledged = time.perf_counter() - wall
        caught_up = (
            memory.flush(24 * 3600) if windows else memory.sessions.flush(24 * 3600, windows=False)
        )
        if not caught_up:
            raise RuntimeError("the index did not catch up")
        indexed = time.perf_counter() - wall
        cpu_used = time.process_time() - cpu
    finally:
        memory.close()
    what = "every window indexed" if windows else "searchable (windows pending)"
    print(
        f"ingested {total} sessions: {total / acknowledged:.1f}/s acknowledged, "
        f"{total / indexed:.1f}/s {what}, CPU {cpu_used / max(total, 1):.3f} s/session, "
        f"{indexed:.0f} s, load {os.getloadavg()[0]:.1f}"
    )


Call = Callable[[Memory, str, str], object]
CALLS: dict[str, Call] = {
    "recall_relevant(top_k=5)": lambda m, user, text: m.recall_relevant(user, text, top_k=5),
    "build_continuation_context": lambda m, user, text: m.build_continuation_context(user, text),
}


@contextmanager
def windows_parked(store: Path) -> Iterator[int]:
    """Move the queued window pass out of the index worker's way; put it back on exit."""
    queue, parked = session_windows_outbox_space(TENANT), f"{TENANT}:scale-bench-parked-windows"

    def move(source: str, target: str) -> int:
        kv = SqliteKVStore(store / "tiermem.sqlite3")
        try:
            entries = list(kv.scan(source))
            if entries:
                kv.commit(
                    [Put(target, key, value) for key, value in entries]
                    + [Delete(source, key) for key, _ in entries]
                )
            return len(entries)
        finally:
            kv.close()

    moved = move(queue, parked)
    try:
        yield moved
    finally:
        move(parked, queue)


class FullCollections:
    """The cyclic GC's full (generation-2) collections while enabled, and how long each took."""

    def __init__(self) -> None:
        self.pauses_ms: list[float] = []
        self._enabled = False
        self._started = 0.0

    def __call__(self, phase: str, info: dict[str, Any]) -> None:
        if not self._enabled or info["generation"] != 2:
            return
        if phase == "start":
            self._started = time.perf_counter()
        else:
            self.pauses_ms.append((time.perf_counter() - self._started) * 1000)

    @contextmanager
    def counting(self) -> Iterator[None]:
        """Count the full collections inside the ``with`` block."""
        self._enabled = True
        try:
            yield
        finally:
            self._enabled = False

    def report(self) -> str:
        """How many ran, and the longest."""
        if not self.pauses_ms:
            return "no full GC"
        return f"{len(self.pauses_ms)} full GC, longest {max(self.pauses_ms):.1f} ms"


@contextmanager
def busy_loops(count: int) -> Iterator[None]:
    """``count`` processes spinning on a core each, for the ``with`` block (a loaded box)."""
    loops = [subprocess.Popen([sys.executable, "-c", "while True: pass"]) for _ in range(count)]
    try:
        yield
    finally:
        for loop in loops:
            loop.kill()
            loop.wait()


def windows_pending(kv: KVStore) -> int:
    """Sessions whose transcript windows are still queued for the second index pass."""
    return len(kv.scan(session_windows_outbox_space(TENANT)))


_FROZEN: list[bool] = []


def freeze_once() -> None:
    """What the service does after its warm-up, once per process: no garbage, then freeze."""
    if not _FROZEN:
        _FROZEN.append(True)
        gc.collect()
        gc.freeze()


def measure(
    store: Path,
    users: list[User],
    seed: int,
    profile: bool,
    label: str = "",
    gap: float = 0.0,
    freeze_gc: bool = True,
    open_pause: float = 0.0,
) -> None:
    """One round: each call kind in a freshly opened store, cold then warm per user.

    ``open_pause``: seconds between the open and the first (warm-up) call, an
    application's own start-up; what the store loads in the background meanwhile
    (the vector index, ``SessionReader.warm``) the first call then finds done.
    """
    rng = random.Random(seed)
    asks = [(user.user_id, rng.choice(user.questions)) for user in users]
    warm_up, asks = asks[-1], asks[:-1]
    for name, call in CALLS.items():
        opening = time.perf_counter()
        memory = Memory.open(store)
        opened = time.perf_counter()
        try:
            time.sleep(open_pause)
            call(memory, *warm_up)
            first_ms = (time.perf_counter() - opened - open_pause) * 1000
            if freeze_gc:
                freeze_once()
            profiler = cProfile.Profile() if profile and name.startswith("recall") else None
            pending = windows_pending(memory.kv)
            collections = FullCollections()
            gc.callbacks.append(collections)
            cold: list[float] = []
            cold_at: list[float] = []  # seconds since the open, of each cold query's start
            for user, text in asks:
                if profiler:
                    profiler.enable()
                started = time.perf_counter()
                with collections.counting():
                    call(memory, user, text)
                cold.append((time.perf_counter() - started) * 1000)
                cold_at.append(started - opened)
                if profiler:
                    profiler.disable()
                time.sleep(gap)
            warm: list[float] = []
            for user, text in asks:
                started = time.perf_counter()
                with collections.counting():
                    call(memory, user, text)
                warm.append((time.perf_counter() - started) * 1000)
                time.sleep(gap)
            # The worker's commits are done under its lock: this reads what it finished.
            indexed = pending - windows_pending(memory.kv)
        finally:
            gc.callbacks.remove(collections)
            memory.close()
        (c50, c95, c99), (w50, w95, w99) = percentiles(cold), percentiles(warm)
        print(
            f"{label}{name}: cold (each user's first after a restart) n={len(cold)} "
            f"p50 {c50:.1f} / p95 {c95:.1f} / p99 {c99:.1f} / max {max(cold):.1f} ms; "
            f"warm p50 {w50:.1f} / p95 {w95:.1f} / p99 {w99:.1f} ms; "
            f"windows of {indexed} sessions indexed meanwhile; {collections.report()} "
            f"during the queries; load {os.getloadavg()[0]:.1f}",
            flush=True,
        )
        slowest = sorted(range(len(cold)), key=cold.__getitem__, reverse=True)[:5]
        print(
            f"{label}{name}: open {(opened - opening) * 1000:.0f} ms, first call "
            f"{first_ms:.1f} ms after {open_pause * 1000:.0f} ms; slowest cold (ms @ s since "
            "the open): " + ", ".join(f"{cold[n]:.1f} @ {cold_at[n]:.1f}" for n in slowest),
            flush=True,
        )
        if profiler:
            pstats.Stats(profiler).sort_stats("cumulative").print_stats(30)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=200)
    parser.add_argument("--sessions-per-user", type=int, default=10)
    parser.add_argument(
        "--sources-per-user",
        type=int,
        default=3,
        help="source users (LongMemEval haystacks, LoCoMo conversations) each user's mix comes from",
    )
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA, help="the recall-dev data")
    parser.add_argument("--store", type=Path, required=True, help="the store; reused when complete")
    parser.add_argument("--seed", type=int, default=19)
    parser.add_argument("--rounds", type=int, default=2, help="restarts measured")
    parser.add_argument(
        "--windows", action="store_true", help="ingest until every transcript window is indexed"
    )
    parser.add_argument("--profile", action="store_true", help="cProfile the first cold recalls")
    parser.add_argument("--ingest-only", action="store_true")
    parser.add_argument(
        "--unparked", action="store_true", help="measure with the queued window pass running"
    )
    parser.add_argument(
        "--compare", action="store_true", help="each round: parked, then with the pass running"
    )
    parser.add_argument(
        "--gap-ms", type=float, default=0.0, help="pause after each query (not counted)"
    )
    parser.add_argument(
        "--busy", type=int, default=0, help="busy-loop processes run beside the measurement"
    )
    parser.add_argument(
        "--open-pause-ms",
        type=float,
        default=0.0,
        help="pause between each open and its first (warm-up) call, not counted",
    )
    parser.add_argument(
        "--snapshot",
        type=Path,
        help="copy the store here right after ingest (before any open), to replay first opens",
    )
    parser.add_argument(
        "--no-freeze-gc",
        action="store_true",
        help="do not freeze the heap after the first warm-up query (tiermem serve does)",
    )
    args = parser.parse_args()
    started = time.perf_counter()
    users = plan(args.data, args.users, args.sessions_per_user, args.sources_per_user, args.seed)
    print(
        f"planned {args.users} users x {args.sessions_per_user} sessions in {time.perf_counter() - started:.0f} s"
    )
    args.store.mkdir(parents=True, exist_ok=True)
    ingest(args.store, users, args.windows)
    if args.snapshot is not None:
        shutil.copytree(args.store, args.snapshot)  # nothing has the store open now
        print(f"copied the store to {args.snapshot}")
    if args.ingest_only:
        return 0
    for user in users:
        user.sessions = []  # measuring needs the questions only; an application holds no datasets
    gap = args.gap_ms / 1000
    with busy_loops(args.busy):
        print(f"load {os.getloadavg()}, {args.busy} busy loops beside the measurement")
        rounds(args, users, gap)
    return 0


def rounds(args: argparse.Namespace, users: list[User], gap: float) -> None:
    """The measured restarts, parked and/or with the window pass running."""
    freeze, pause = not args.no_freeze_gc, args.open_pause_ms / 1000
    for n in range(args.rounds):
        profile = args.profile and n == 0
        if args.compare or not args.unparked:
            with windows_parked(args.store) as parked:
                label = f"round {n + 1} parked ({parked} sessions' windows): "
                measure(args.store, users, args.seed + n, profile, label, gap, freeze, pause)
        if args.compare or args.unparked:
            label = f"round {n + 1} pass running: "
            measure(args.store, users, args.seed + n, profile, label, gap, freeze, pause)


if __name__ == "__main__":
    sys.exit(main())
