"""Speed of the session tier on the embedded default (SQLite + embedded Chroma + local MiniLM).

Measures, on a store of ``--users`` x ``--sessions-per-user`` synthetic but
varied session summaries (default 1,000 x 100 = 100,000):

1. ``Memory.build_continuation_context`` latency, p50/p99, query embedding
   included: for users whose recall data is not cached yet (cold, the usual
   case with many users) and again for the same users (warm);
2. ``save_session`` throughput: one call at a time in the foreground, one call
   at a time with background indexing (until the index has caught up), and
   ``save_sessions`` batches;
3. real transcripts through the public API: ``--transcript-users`` LongMemEval_S
   users (default 10, about 48 sessions of ~1,650 words each), every session
   through ``Memory.end_session`` with its full transcript on ``Memory.open``,
   then every query through ``recall_relevant`` and ``build_continuation_context``
   (see ``recall_bench.through_api``): acknowledged saves/s, indexed sessions/s,
   process CPU s per session, latency percentiles and recall quality, one table.
   CPU seconds per session are the figure to compare on a busy machine.
4. the same store after a restart (``--restart-rounds``, default 3): ``Memory.open``
   again, and each user's first ``recall_relevant`` (``top_k=5``) and, in another
   fresh process state, first ``build_continuation_context``: the cold case, where
   nothing of the user is cached. ``--transcript-dir`` keeps the store of part 3 and
   reuses it on the next run (part 3 is then skipped: only this part is measured).

Population goes through ``SessionTier.save_sessions`` (embedded in batches of
256, one Chroma upsert per batch) and takes a while on 2 cores; pass
``--data-dir`` to keep the store and reuse it on the next run.

Usage::

    python bench/session_bench.py                          # 100k sessions in a temp dir
    python bench/session_bench.py --data-dir /tmp/tm100k   # populate once, rerun fast
    python bench/session_bench.py --users 100              # a quick 10k run
    python bench/session_bench.py --users 100 --encrypt    # the same, encrypted at rest
    python bench/session_bench.py --users 0 --transcript-users 20   # real transcripts only
    python bench/session_bench.py --users 0 --transcript-users 10 --transcript-dir /tmp/lme10
"""

from __future__ import annotations

import argparse
import os
import random
import statistics
import sys
import tempfile
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path

from recall_bench import (
    DEFAULT_DATA,
    Dataset,
    Query,
    api_table,
    load,
    percentiles,
    through_api,
)

from memory import Memory
from tiers.backends.base import KVStore
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.backends.encrypted_kv import EncryptedKVStore, MasterKey
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.models import SessionSummary
from tiers.session import SessionTier

SUBJECTS = [
    "the billing service",
    "the mobile app",
    "the data pipeline",
    "the marketing site",
    "the search ranking model",
    "the quarterly tax return",
    "the kitchen remodel",
    "the trip to {place}",
    "the onboarding flow",
    "the payments API",
    "the warehouse robots",
    "the customer survey",
    "the wedding plans",
    "the grant proposal",
    "the novel draft",
    "the garden irrigation",
    "the home network",
    "the podcast launch",
    "the Kubernetes cluster",
    "the recipe book",
    "the hiring plan",
    "the security audit",
    "the board presentation",
]
PLACES = ["Lisbon", "Kyoto", "Patagonia", "Nairobi", "Reykjavik", "Oaxaca", "Tasmania", "Tbilisi"]
VERBS = [
    "migrate",
    "redesign",
    "debug",
    "budget",
    "schedule",
    "document",
    "benchmark",
    "review",
    "simplify",
    "secure",
    "automate",
    "translate",
    "price",
    "test",
    "refactor",
    "plan",
]
DECISIONS = [
    "use {tool} instead of {tool2}",
    "postpone {thing} until {month}",
    "cap the budget at {n} euros",
    "hire a contractor for {thing}",
    "drop support for {thing}",
    "run {thing} every {day}",
    "ask {name} to own {thing}",
    "keep {thing} behind a feature flag",
]
TOOLS = [
    "PostgreSQL",
    "Redis",
    "Terraform",
    "Figma",
    "Airflow",
    "Stripe",
    "Excel",
    "Notion",
    "Rust",
]
THINGS = [
    "the legacy export",
    "the invoice emails",
    "the staging cluster",
    "the nightly backups",
    "the dark theme",
    "the loyalty program",
    "the API keys rotation",
    "the supplier contracts",
    "the photo gallery",
    "the load tests",
    "the price increase",
    "the translation files",
]
NAMES = ["Amara", "Bogdan", "Chen", "Dolores", "Emeka", "Farah", "Goran", "Hiroko", "Ines", "Jonas"]
MONTHS = ["March", "June", "September", "December"]
DAYS = ["Monday", "Friday", "weekend", "night"]


def fill(rng: random.Random, template: str) -> str:
    """Fill a template's placeholders with random vocabulary."""
    return template.format(
        place=rng.choice(PLACES),
        tool=rng.choice(TOOLS),
        tool2=rng.choice(TOOLS),
        thing=rng.choice(THINGS),
        month=rng.choice(MONTHS),
        n=rng.randrange(500, 50_000, 500),
        day=rng.choice(DAYS),
        name=rng.choice(NAMES),
    )


def summary(rng: random.Random, user: int, n: int, when: datetime) -> SessionSummary:
    """One synthetic session summary (about 60 words)."""
    subject = fill(rng, rng.choice(SUBJECTS))
    return SessionSummary(
        session_id=f"s{n:04d}",
        user_id=f"user{user:05d}",
        task_description=f"{rng.choice(VERBS).capitalize()} {subject}",
        decisions_made=[fill(rng, rng.choice(DECISIONS)).capitalize() for _ in range(2)],
        work_completed=[f"{rng.choice(VERBS).capitalize()}d {fill(rng, rng.choice(THINGS))}"],
        open_questions=[f"Should we {rng.choice(VERBS)} {rng.choice(THINGS)} first?"],
        next_recommended_steps=[f"{rng.choice(NAMES)} to {rng.choice(VERBS)} {subject}"],
        created_at=when,
    )


def summaries(users: int, per_user: int, seed: int = 7) -> Iterator[SessionSummary]:
    """Every user's sessions, one user after the other, a day or so apart."""
    rng = random.Random(seed)
    start = datetime(2024, 1, 1, tzinfo=UTC)
    for user in range(users):
        when = start + timedelta(hours=rng.randrange(0, 24 * 30))
        for n in range(per_user):
            when += timedelta(hours=rng.randrange(6, 72))
            yield summary(rng, user, n, when)


def query(rng: random.Random) -> str:
    """A natural start-of-session query."""
    return rng.choice(
        [
            f"what did we decide about {fill(rng, rng.choice(SUBJECTS))}?",
            f"continue where we left off with {rng.choice(THINGS)}",
            f"did {rng.choice(NAMES)} finish the {rng.choice(VERBS)} work on {rng.choice(THINGS)}?",
            f"status of {fill(rng, rng.choice(SUBJECTS))} and {rng.choice(TOOLS)}",
        ]
    )


def percentile(values: list[float], q: float) -> float:
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, int(q * len(ordered)))]


def populate(tier: SessionTier, users: int, per_user: int) -> None:
    total = users * per_user
    started = time.perf_counter()
    batch: list[SessionSummary] = []
    done = 0
    for item in summaries(users, per_user):
        batch.append(item)
        if len(batch) == 1024:
            tier.save_sessions(batch)
            done += len(batch)
            batch = []
            if done % 10_240 == 0:
                rate = done / (time.perf_counter() - started)
                print(f"  {done}/{total} stored, {rate:.0f} sessions/s", flush=True)
    if batch:
        tier.save_sessions(batch)
    elapsed = time.perf_counter() - started
    print(f"populated {total} sessions in {elapsed:.0f}s ({total / elapsed:.0f} sessions/s)")


def bench_context(memory: Memory, users: int, queries: int) -> None:
    rng = random.Random(11)
    picked = rng.sample(range(users), min(users, queries))
    asks = [(f"user{u:05d}", query(rng)) for u in picked]
    memory.build_continuation_context(*asks[0])  # model load and first-use costs
    for label in ("cold (first query of each user)", "warm (same users again)"):
        times: list[float] = []
        for user, text in asks:
            started = time.perf_counter()
            context = memory.build_continuation_context(user, text)
            times.append((time.perf_counter() - started) * 1000)
            assert "Earlier sessions" in context
        print(
            f"build_continuation_context, {label}: n={len(times)} "
            f"p50 {statistics.median(times):.1f} ms, p99 {percentile(times, 0.99):.1f} ms, "
            f"max {max(times):.1f} ms"
        )


def bench_saves(kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, n: int) -> None:
    rng = random.Random(23)
    when = datetime(2026, 1, 1, tzinfo=UTC)

    def fresh(tag: str, count: int) -> list[SessionSummary]:
        return [
            summary(rng, rng.randrange(1000), 0, when).model_copy(
                update={"session_id": f"{tag}{i:05d}"}
            )
            for i in range(count)
        ]

    foreground = SessionTier(kv, index, embedder)
    items = fresh("fg", max(20, n // 4))
    started = time.perf_counter()
    for item in items:
        foreground.save_session(item)
    elapsed = time.perf_counter() - started
    print(f"save_session, foreground, one at a time: {len(items) / elapsed:.0f} sessions/s")

    background = SessionTier(kv, index, embedder, background=True)
    items = fresh("bg", n)
    started = time.perf_counter()
    for item in items:
        background.save_session(item)
    acknowledged = time.perf_counter() - started
    assert background.flush(timeout=600)
    elapsed = time.perf_counter() - started
    background.close()
    print(
        f"save_session, background indexing (the Memory default), one at a time: "
        f"{n / elapsed:.0f} sessions/s "
        f"indexed ({n / acknowledged:.0f}/s acknowledged)"
    )

    items = fresh("bt", n)
    started = time.perf_counter()
    for start in range(0, n, 256):
        foreground.save_sessions(items[start : start + 256])
    elapsed = time.perf_counter() - started
    print(f"save_sessions, batches of 256: {n / elapsed:.0f} sessions/s")


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--users", type=int, default=1000)
    parser.add_argument("--sessions-per-user", type=int, default=100)
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--saves", type=int, default=1000)
    parser.add_argument("--data-dir", type=Path, default=None, help="keep the store here")
    parser.add_argument(
        "--transcript-users",
        type=int,
        default=10,
        help="LongMemEval_S users whose full transcripts go through end_session (0: skip)",
    )
    parser.add_argument(
        "--encrypt",
        action="store_true",
        help="encryption at rest: the KV store is an EncryptedKVStore over SQLite (a new store "
        "each run: a --data-dir populated one way cannot be reused the other way)",
    )
    parser.add_argument(
        "--transcript-dir",
        type=Path,
        default=None,
        help="keep the real-transcript store here; reused when it exists (ingest skipped)",
    )
    parser.add_argument(
        "--restart-rounds",
        type=int,
        default=3,
        help="restarts measured on the real-transcript store (each user's first query cold)",
    )
    args = parser.parse_args()
    if args.users:
        synthetic(args)
    if args.transcript_users:
        dataset = load(DEFAULT_DATA, "longmemeval_s", args.transcript_users)
        with tempfile.TemporaryDirectory(prefix="session-bench-api-") as tmp:
            workdir = args.transcript_dir or Path(tmp)
            if (workdir / "api").is_dir():
                print(f"reusing the real-transcript store in {workdir} (ingest skipped)")
            else:
                run = through_api(dataset, workdir)
                print("real transcripts through the public API (Memory.open, end_session):")
                print("\n".join(api_table([run])))
            for _ in range(args.restart_rounds):
                after_restart(dataset, workdir / "api")
    return 0


def after_restart(dataset: Dataset, data_dir: Path) -> None:
    """Part 4: each user's first recall, then first context, each in a freshly opened store.

    The first query of the process (opening the index, first use of the model) is
    not a user's cost: a warm-up query of the last user goes first and that user is
    left out of the cold figures.
    """
    firsts = {query.user_id: query for query in reversed(dataset.queries)}
    warm_up = dataset.queries[-1]
    cold_users = [user for user in firsts if user != warm_up.user_id]
    calls: dict[str, Callable[[Memory, Query], object]] = {
        "recall_relevant(top_k=5)": lambda m, q: m.recall_relevant(q.user_id, q.text, top_k=5),
        "build_continuation_context": lambda m, q: m.build_continuation_context(q.user_id, q.text),
    }
    for label, call in calls.items():
        memory = Memory.open(data_dir)
        try:
            call(memory, warm_up)
            cold: list[float] = []
            for user in cold_users:
                started = time.perf_counter()
                call(memory, firsts[user])
                cold.append((time.perf_counter() - started) * 1000)
            warm: list[float] = []
            for user in cold_users:
                started = time.perf_counter()
                call(memory, firsts[user])
                warm.append((time.perf_counter() - started) * 1000)
        finally:
            memory.close()
        (c50, c95, c99), (w50, _, w99) = percentiles(cold), percentiles(warm)
        print(
            f"after a restart, {label}: cold (each user's first) n={len(cold)} "
            f"p50 {c50:.1f} / p95 {c95:.1f} / p99 {c99:.1f} ms; warm p50 {w50:.1f} / "
            f"p99 {w99:.1f} ms; load {os.getloadavg()[0]:.1f}"
        )


def synthetic(args: argparse.Namespace) -> None:
    """Parts 1 and 2: the synthetic store of summaries."""
    with tempfile.TemporaryDirectory(prefix="session-bench-") as tmp:
        data_dir = args.data_dir or Path(tmp)
        data_dir.mkdir(parents=True, exist_ok=True)
        embedder = MiniLMEmbedder()
        embedder.load()
        kv: KVStore = SqliteKVStore(data_dir / "tiermem.sqlite3")
        if args.encrypt:
            kv = EncryptedKVStore(kv, MasterKey.generate()[0])
            print("encryption at rest: on (AES-GCM, per-tenant data key)")
        index = ChromaVectorIndex(data_dir / "chroma", embedder=embedder)
        try:
            tier = SessionTier(kv, index, embedder)
            total = args.users * args.sessions_per_user
            have = index.count()
            if have < total:
                print(f"populating {total} sessions ({have} indexed already) in {data_dir}")
                populate(tier, args.users, args.sessions_per_user)
            else:
                print(f"reusing {have} indexed sessions in {data_dir}")
            memory = Memory(kv=kv, index=index, embedder=embedder, background_indexing=False)
            bench_context(memory, args.users, args.queries)
            bench_saves(kv, index, embedder, args.saves)
        finally:
            index.close()
            kv.close()


if __name__ == "__main__":
    sys.exit(main())
