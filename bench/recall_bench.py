"""Recall benchmark of the session tier on LoCoMo and LongMemEval_S (dev split).

For each user, every session is stored in chronological order through the
session tier (its raw transcript first, then its summary from the offline
ExtractiveSummarizer, ``created_at`` = the session's date), then each headline
query is asked through ``recall_relevant`` restricted to its user, at its question
date (``now=``; LoCoMo has none: a day after the user's last session). Printed:
recall@1/3/5 and MRR of the gold sessions for

- BM25 on raw session text (baseline),
- dense on raw session text: one MiniLM vector per session (baseline),
- dense on the summary only (baseline),
- ours, summary only: the same, but no transcript stored (what an app that
  only saves summaries gets),
- ours: ``SessionTier.recall_relevant`` (dense windows + BM25 + recency).

The gold sessions, category, answer and headline flag are only used to score;
the system under test never sees them. The data is read from
``../shared/data/recall-dev`` (see its README), never copied into the repo.

Usage::

    python bench/recall_bench.py                       # LoCoMo + 30 LongMemEval users
    python bench/recall_bench.py --datasets locomo
    python bench/recall_bench.py --max-users 0         # every user (LongMemEval: hours on 2 cores)
    python bench/recall_bench.py --embed-cache /tmp/tiermem-emb.npz   # reuse embeddings across runs
"""

from __future__ import annotations

import argparse
import gzip
import hashlib
import json
import os
import re
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import numpy as np

from memory import Memory
from summarizer import ExtractiveSummarizer
from tiers.backends.base import Embedder
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.models import Message, SessionSummary
from tiers.session import (
    BM25Index,
    FusionWeights,
    SessionTier,
    summary_text,
    tokenize,
    transcript_text,
)

# ``shared/`` sits beside the repository (or, for a worktree, beside the folder of worktrees).
DEFAULT_DATA = next(
    (
        candidate
        for parent in Path(__file__).resolve().parents[1:4]
        if (candidate := parent.parent / "shared" / "data" / "recall-dev").is_dir()
    ),
    Path(__file__).resolve().parents[2] / "shared" / "data" / "recall-dev",
)
DATASETS = {
    "locomo": "locomo.sessions.jsonl",
    "longmemeval_s": "longmemeval_s.sessions.jsonl.gz",
}
SYSTEMS = ("bm25-raw", "dense-raw", "dense-summary", "ours-summary-only", "ours")
KS = (1, 3, 5)


# -- data ----------------------------------------------------------------------------------------


@dataclass
class Session:
    """One stored session of the benchmark (no gold information)."""

    user_id: str
    session_id: str
    created_at: datetime
    messages: list[Message]


@dataclass
class Query:
    """One headline query, when it is asked, and its gold sessions and category (for scoring).

    ``asked_at`` is the dataset's question date (LongMemEval); LoCoMo has none, so
    its questions are asked a day after the conversation's last session.
    """

    user_id: str
    text: str
    gold: set[str]
    asked_at: datetime
    category: str


@dataclass
class Dataset:
    """Sessions per user (chronological) and the headline queries of those users."""

    name: str
    sessions: dict[str, list[Session]] = field(default_factory=dict)
    queries: list[Query] = field(default_factory=list)


_UNSAFE = re.compile(r"[^A-Za-z0-9._@+\-]")


def safe_id(raw: str) -> str:
    """Map a dataset id (e.g. ``locomo:conv-44``) onto tiermem's id alphabet."""
    return _UNSAFE.sub(".", raw)


def to_messages(turns: Sequence[dict[str, Any]]) -> list[Message]:
    """Dataset turns as chat messages; named speakers keep their name, photos their caption."""
    speakers: list[str] = []
    out: list[Message] = []
    for turn in turns:
        speaker = str(turn["speaker"])
        text = str(turn["text"])
        if turn.get("image_caption"):
            text += f" [shares a photo: {turn['image_caption']}]"
        if speaker in ("user", "assistant"):
            out.append(Message(role=speaker, content=text))
            continue
        if speaker not in speakers:
            speakers.append(speaker)
        role = "user" if speakers.index(speaker) == 0 else "assistant"
        out.append(Message(role=role, content=text, name=speaker))
    return out


def load(data_dir: Path, name: str, max_users: int, only_users: set[str] | None = None) -> Dataset:
    """Read a dataset; only its first ``max_users`` users (0: all), of ``only_users`` if given."""
    path = data_dir / DATASETS[name]
    opener: Callable[..., Any] = gzip.open if path.suffix == ".gz" else open
    dataset = Dataset(name)
    with opener(path, "rt", encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            user = safe_id(row["user_id"])
            if only_users is not None and user not in only_users:
                continue
            if user not in dataset.sessions:
                if max_users and len(dataset.sessions) >= max_users:
                    continue
                dataset.sessions[user] = []
            created = datetime.fromisoformat(row["date_iso"]).replace(tzinfo=UTC)
            dataset.sessions[user].append(
                Session(user, row["session_id"], created, to_messages(row["turns"]))
            )
    for sessions in dataset.sessions.values():
        sessions.sort(key=lambda s: s.created_at)
    with (data_dir / f"{name}.queries.jsonl").open(encoding="utf-8") as handle:
        for line in handle:
            row = json.loads(line)
            user = safe_id(row["user_id"])
            if row["headline"] and user in dataset.sessions:
                asked_at = (
                    _question_date(row["query_date"])
                    if row.get("query_date")
                    else dataset.sessions[user][-1].created_at + timedelta(days=1)
                )
                dataset.queries.append(
                    Query(
                        user,
                        row["query"],
                        set(row["gold_session_ids"]),
                        asked_at,
                        str(row["category_name"]),
                    )
                )
    return dataset


def _question_date(raw: str) -> datetime:
    """A question date as the datasets write it: ``2023/03/27 (Mon) 23:35`` or ISO."""
    cleaned = re.sub(r"\s*\([A-Za-z]{3}\)", "", raw).replace("/", "-")
    return datetime.fromisoformat(cleaned).replace(tzinfo=UTC)


# -- embeddings ----------------------------------------------------------------------------------


class CachedEmbedder:
    """Wraps an embedder with an optional on-disk cache keyed by model name and text."""

    def __init__(self, inner: Embedder, path: Path | None) -> None:
        self.inner = inner
        self.name = inner.name
        self.dimension = inner.dimension
        self.path = path
        self.cache: dict[str, np.ndarray] = {}
        self.computed = 0
        if path is not None and path.exists():
            with np.load(path) as stored:
                self.cache = dict(zip(stored["keys"].tolist(), stored["vectors"], strict=True))

    def _key(self, text: str) -> str:
        return hashlib.blake2b(f"{self.name}\0{text}".encode(), digest_size=16).hexdigest()

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        keys = [self._key(text) for text in texts]
        missing = [i for i, key in enumerate(keys) if key not in self.cache]
        if missing:
            fresh = self.inner.embed([texts[i] for i in missing])
            self.computed += len(missing)
            for i, vector in zip(missing, fresh, strict=True):
                self.cache[keys[i]] = np.asarray(vector, dtype=np.float32)
        return [self.cache[key].tolist() for key in keys]

    def save(self) -> None:
        if self.path is None or not self.cache:
            return
        keys = list(self.cache)
        np.savez(self.path, keys=np.array(keys), vectors=np.stack([self.cache[k] for k in keys]))


# -- systems -------------------------------------------------------------------------------------


Ranker = Callable[[Query], list[str]]


def bm25_raw(dataset: Dataset) -> Ranker:
    """BM25 over each session's raw transcript text."""
    indexes = {
        user: BM25Index.build((s.session_id, tokenize(transcript_text(s.messages))) for s in ss)
        for user, ss in dataset.sessions.items()
    }

    def rank(query: Query) -> list[str]:
        scores = indexes[query.user_id].scores(tokenize(query.text))
        sessions = dataset.sessions[query.user_id]
        return [
            s.session_id for s in sorted(sessions, key=lambda s: -scores.get(s.session_id, 0.0))
        ]

    return rank


def dense(dataset: Dataset, embedder: Embedder, texts: dict[str, dict[str, str]]) -> Ranker:
    """One vector per session of ``texts[user][session_id]``, cosine ranking."""
    matrices: dict[str, tuple[list[str], np.ndarray]] = {}
    for user, by_session in texts.items():
        ids = list(by_session)
        matrices[user] = (ids, np.asarray(embedder.embed([by_session[i] for i in ids])))
    query_vectors = dict(
        zip(
            [q.text for q in dataset.queries],
            embedder.embed([q.text for q in dataset.queries]),
            strict=True,
        )
    )

    def rank(query: Query) -> list[str]:
        ids, matrix = matrices[query.user_id]
        sims = matrix @ np.asarray(query_vectors[query.text])
        return [ids[i] for i in np.argsort(-sims, kind="stable")]

    return rank


@dataclass
class Ours:
    """The session tier over embedded SQLite + Chroma in a temporary directory."""

    tier: SessionTier
    store_seconds: float
    kv: SqliteKVStore
    index: ChromaVectorIndex
    embedder: Embedder

    def rank(self, query: Query) -> list[str]:
        hits = self.tier.recall_relevant(query.user_id, query.text, top_k=100, now=query.asked_at)
        return [hit.summary.session_id for hit in hits]

    def with_weights(self, weights: FusionWeights) -> Ours:
        """The same stored sessions, ranked with other fusion weights (a second reader)."""
        tier = SessionTier(self.kv, self.index, self.embedder, weights=weights)
        return Ours(tier, 0.0, self.kv, self.index, self.embedder)


def store(
    dataset: Dataset,
    workdir: Path,
    embedder: Embedder,
    summaries: dict[str, dict[str, SessionSummary]],
    *,
    transcripts: bool = True,
) -> Ours:
    """Store every session through the tier: transcript first, then the summary."""
    workdir.mkdir(parents=True, exist_ok=True)
    kv = SqliteKVStore(workdir / "kv.sqlite3", durable=False)
    index = ChromaVectorIndex(workdir / "chroma", embedder=embedder)
    tier = SessionTier(kv, index, embedder)
    started = time.perf_counter()
    for user, sessions in dataset.sessions.items():
        for session in sessions if transcripts else ():
            tier.save_transcript(user, session.session_id, session.messages)
        # One batch per user: its sessions in chronological order, embedded together.
        tier.save_sessions(summaries[user][s.session_id] for s in sessions)
    return Ours(tier, time.perf_counter() - started, kv, index, embedder)


# -- scoring -------------------------------------------------------------------------------------


def summarize(dataset: Dataset) -> dict[str, dict[str, SessionSummary]]:
    """Every session's summary by the offline default summarizer, by user and session id."""
    summarizer = ExtractiveSummarizer()
    return {
        user: {
            s.session_id: summarizer.summarize(
                s.messages, user_id=user, session_id=s.session_id, created_at=s.created_at
            ).summary
            for s in sessions
        }
        for user, sessions in dataset.sessions.items()
    }


def score(queries: Sequence[Query], rank: Ranker) -> dict[str, float]:
    """Mean recall@k and MRR of ``rank`` over ``queries``."""
    totals = {f"r@{k}": 0.0 for k in KS} | {"mrr": 0.0}
    for query in queries:
        ranked = rank(query)
        for k in KS:
            totals[f"r@{k}"] += len(query.gold & set(ranked[:k])) / len(query.gold)
        first = next((i for i, sid in enumerate(ranked) if sid in query.gold), None)
        totals["mrr"] += 0.0 if first is None else 1.0 / (first + 1)
    return {name: value / max(1, len(queries)) for name, value in totals.items()}


def run(dataset: Dataset, embedder: CachedEmbedder, workdir: Path) -> dict[str, dict[str, float]]:
    """Build every system for one dataset and score it."""
    n_sessions = sum(len(ss) for ss in dataset.sessions.values())
    print(
        f"\n{dataset.name}: {len(dataset.sessions)} users, {n_sessions} sessions, "
        f"{len(dataset.queries)} headline queries",
        flush=True,
    )
    started = time.perf_counter()
    summaries = summarize(dataset)
    print(f"  summarized in {time.perf_counter() - started:.1f}s", flush=True)
    results: dict[str, dict[str, float]] = {}
    rankers: dict[str, Ranker] = {"bm25-raw": bm25_raw(dataset)}
    started = time.perf_counter()
    raw = {
        user: {s.session_id: transcript_text(s.messages) for s in ss}
        for user, ss in dataset.sessions.items()
    }
    rankers["dense-raw"] = dense(dataset, embedder, raw)
    summary_texts = {
        user: {sid: summary_text(summary) or summary.render() for sid, summary in by_id.items()}
        for user, by_id in summaries.items()
    }
    rankers["dense-summary"] = dense(dataset, embedder, summary_texts)
    print(f"  baselines embedded in {time.perf_counter() - started:.1f}s", flush=True)
    embedder.save()
    rankers["ours-summary-only"] = store(
        dataset, workdir / "summary-only", embedder, summaries, transcripts=False
    ).rank
    ours = store(dataset, workdir / "ours", embedder, summaries)
    embedder.save()
    print(
        f"  stored + indexed through the session tier in {ours.store_seconds:.1f}s "
        f"({n_sessions / max(ours.store_seconds, 1e-9):.1f} sessions/s)",
        flush=True,
    )
    rankers["ours"] = ours.rank
    for name in SYSTEMS:
        started = time.perf_counter()
        results[name] = score(dataset.queries, rankers[name])
        elapsed = time.perf_counter() - started
        if name == "ours":
            per_query = 1000 * elapsed / max(1, len(dataset.queries))
            print(f"  ours answered {len(dataset.queries)} queries, {per_query:.1f} ms each")
    return results


# -- ingest and recall through the public API ----------------------------------------------------


@dataclass
class ApiRun:
    """What one dataset cost and scored through ``Memory`` on the embedded default."""

    dataset: str
    users: int
    sessions: int
    queries: int
    acknowledged_per_s: float
    searchable_per_s: float  # until recall sees every session (summary vector + keywords)
    indexed_per_s: float  # until every transcript window is indexed too
    cpu_s_searchable: float  # per session, until searchable
    cpu_s_per_session: float  # per session, until fully indexed
    recall_ms: tuple[float, float, float]
    context_ms: tuple[float, float, float]
    quality: dict[str, float]
    quality_windows_pending: dict[str, float]  # before the second pass: base vectors + keywords
    load_average: float


def percentiles(values: Sequence[float]) -> tuple[float, float, float]:
    """p50, p95 and p99 of ``values`` (nearest rank)."""
    ordered = sorted(values)

    def at(q: float) -> float:
        return ordered[min(len(ordered) - 1, int(q * len(ordered)))]

    return at(0.5), at(0.95), at(0.99)


def through_api(dataset: Dataset, workdir: Path) -> ApiRun:
    """Every session through ``Memory.end_session`` with its full transcript, then every query.

    The store is ``Memory.open`` (SQLite, embedded Chroma, local MiniLM, background
    indexing: the embedded default). Ingest is timed from the first ``end_session``
    to every session being searchable (first pass of the index: summary vector, and
    keywords over the full transcript) and to the index holding every transcript
    window too (``Memory.flush``); CPU is the process's (all threads: the index
    worker too) over the same spans. Each query is timed
    through ``recall_relevant(top_k=5)`` and ``build_continuation_context``, query
    embedding included; quality comes from a ``top_k=100`` recall.
    """
    n_sessions = sum(len(ss) for ss in dataset.sessions.values())
    memory = Memory.open(workdir / "api")
    try:
        memory.embedder.embed(["warm up the model"])  # model load is not ingest
        cpu, wall = time.process_time(), time.perf_counter()
        for user, sessions in dataset.sessions.items():
            for session in sessions:
                memory.end_session(
                    user, session.session_id, session.messages, created_at=session.created_at
                )
        acknowledged = time.perf_counter() - wall
        if not memory.sessions.flush(timeout=24 * 3600, windows=False):
            raise RuntimeError("the index did not catch up")
        searchable = time.perf_counter() - wall
        cpu_searchable = time.process_time() - cpu
        if not memory.flush(timeout=24 * 3600):
            raise RuntimeError("the index did not catch up")
        indexed = time.perf_counter() - wall
        cpu_used = time.process_time() - cpu
        recall_times: list[float] = []
        context_times: list[float] = []

        def rank(query: Query) -> list[str]:
            started = time.perf_counter()
            memory.recall_relevant(query.user_id, query.text, top_k=5)
            recall_times.append(1000 * (time.perf_counter() - started))
            started = time.perf_counter()
            memory.build_continuation_context(query.user_id, query.text)
            context_times.append(1000 * (time.perf_counter() - started))
            hits = memory.recall_relevant(query.user_id, query.text, top_k=100)
            return [hit.summary.session_id for hit in hits]

        quality = score(dataset.queries, rank)
    finally:
        memory.close()
    load_average = os.getloadavg()[0]
    return ApiRun(
        dataset=dataset.name,
        users=len(dataset.sessions),
        sessions=n_sessions,
        queries=len(dataset.queries),
        acknowledged_per_s=n_sessions / acknowledged,
        searchable_per_s=n_sessions / searchable,
        indexed_per_s=n_sessions / indexed,
        cpu_s_searchable=cpu_searchable / n_sessions,
        cpu_s_per_session=cpu_used / n_sessions,
        recall_ms=percentiles(recall_times),
        context_ms=percentiles(context_times),
        quality=quality,
        quality_windows_pending=quality_windows_pending(dataset, workdir / "api"),
        load_average=load_average,
    )


def quality_windows_pending(dataset: Dataset, data_dir: Path) -> dict[str, float]:
    """Quality in the state between the index's passes: every session by its base vector only.

    Made deterministic by deleting every window vector (ids ``...#n``) of the indexed
    store and reopening it: recall then ranks exactly as it does while the second pass
    has not reached a session (base vector, keywords over the full transcript).
    """
    memory = Memory.open(data_dir)
    try:
        windows = [vid for vid in memory.index.ids(where={"tenant": "default"}) if "#" in vid]
        memory.index.delete(windows)
    finally:
        memory.close()
    memory = Memory.open(data_dir)
    try:

        def rank(query: Query) -> list[str]:
            hits = memory.recall_relevant(query.user_id, query.text, top_k=100)
            return [hit.summary.session_id for hit in hits]

        return score(dataset.queries, rank)
    finally:
        memory.close()


def api_table(runs: Sequence[ApiRun]) -> Iterator[str]:
    """One Markdown row per dataset: ingest rates, CPU per session, latency, quality."""
    yield (
        "| dataset (users / sessions / queries) | acknowledged saves/s "
        "| recall-sees-it sessions/s | fully indexed sessions/s "
        "| CPU s per session (searchable / fully indexed) "
        "| recall p50 / p95 / p99 ms | context p50 / p95 / p99 ms "
        "| r@1 / r@3 / r@5 / MRR | the same, windows pending | load avg (1 min) |"
    )
    yield "|---|---|---|---|---|---|---|---|---|---|"
    for run in runs:
        q, p = run.quality, run.quality_windows_pending
        yield (
            f"| {run.dataset} ({run.users} / {run.sessions} / {run.queries}) "
            f"| {run.acknowledged_per_s:.1f} | {run.searchable_per_s:.2f} "
            f"| {run.indexed_per_s:.2f} "
            f"| {run.cpu_s_searchable:.3f} / {run.cpu_s_per_session:.3f} "
            f"| {' / '.join(f'{v:.0f}' for v in run.recall_ms)} "
            f"| {' / '.join(f'{v:.0f}' for v in run.context_ms)} "
            f"| {' / '.join(f'{q[k]:.3f}' for k in ('r@1', 'r@3', 'r@5', 'mrr'))} "
            f"| {' / '.join(f'{p[k]:.3f}' for k in ('r@1', 'r@3', 'r@5', 'mrr'))} "
            f"| {run.load_average:.1f} |"
        )


def table(all_results: dict[str, dict[str, dict[str, float]]]) -> Iterator[str]:
    """The results as a Markdown table: one row per system, one column group per dataset."""
    names = list(all_results)
    yield "| system | " + " | ".join(f"{n} r@1 / r@3 / r@5 / MRR" for n in names) + " |"
    yield "|---|" + "---|" * len(names)
    for system in SYSTEMS:
        cells = []
        for name in names:
            m = all_results[name][system]
            cells.append(" / ".join(f"{m[k]:.3f}" for k in ("r@1", "r@3", "r@5", "mrr")))
        yield f"| {system} | " + " | ".join(cells) + " |"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--datasets", nargs="+", choices=sorted(DATASETS), default=list(DATASETS))
    parser.add_argument(
        "--max-users",
        type=int,
        default=30,
        help="users per dataset (0: all); LoCoMo has 3 (always all), LongMemEval_S 150",
    )
    parser.add_argument("--embed-cache", type=Path, default=None, help="npz file to reuse vectors")
    parser.add_argument(
        "--api-only",
        action="store_true",
        help="only the public-API run (end_session + recall_relevant on Memory.open), no baselines",
    )
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        print(f"no benchmark data at {args.data}: pass --data", file=sys.stderr)
        return 2
    model = MiniLMEmbedder()
    model.load()
    embedder = CachedEmbedder(model, args.embed_cache)
    started = time.perf_counter()
    all_results: dict[str, dict[str, dict[str, float]]] = {}
    api_runs: list[ApiRun] = []
    for name in args.datasets:
        dataset = load(args.data, name, args.max_users)
        with tempfile.TemporaryDirectory(prefix=f"recall-bench-{name}-") as workdir:
            if not args.api_only:
                all_results[name] = run(dataset, embedder, Path(workdir))
            api_runs.append(through_api(dataset, Path(workdir)))
            print("\n".join(api_table(api_runs[-1:])), flush=True)
    if all_results:
        print(f"\nheadline queries; recall@k of gold sessions; {embedder.computed} texts embedded")
        print("\n".join(table(all_results)))
    print(
        f"\nthrough the public API (Memory.open: SQLite + embedded Chroma + MiniLM, background "
        f"indexing; {os.cpu_count()} CPUs); MRR over the top 100"
    )
    print("\n".join(api_table(api_runs)))
    print(f"\ntotal {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
