"""Recall quality of the session tier by question category, for several fusion weightings.

Stores every session of the dev data once through ``SessionTier`` (as ``recall_bench.py``
does: transcript, then the extractive summary, ``created_at`` = the session's date), then asks
every headline query at its question date (LongMemEval's ``query_date``; LoCoMo has none: a
day after the user's last session) through readers with different
:class:`~tiers.session.FusionWeights` over the same store. Printed: recall@1/3/5 and MRR
overall and per category, one row per weighting, with the load average. Gold sessions and
categories are only used to score.

Usage::

    python bench/recall_categories_bench.py --datasets locomo
    python bench/recall_categories_bench.py --datasets longmemeval_s --max-users 10 \\
        --embed-cache /tmp/tiermem-emb.npz
    python bench/recall_categories_bench.py --variant recency=0.1 --variant prf=0.3

Besides :class:`~tiers.session.FusionWeights` fields, a variant may score keywords
by passage (session 24, issue 19 item 3; measured, not adopted: ``bench/README.md``):
``passages=W``, ``passage_blend=B``, ``passage_neighbours=K``, see :mod:`recall_passages`.

A variant may also set the dense window grain (session 25, issue 19 item 3; measured, not
adopted): ``window_words=W,window_overlap=O,windows_cap=C`` cuts transcripts on a word
grid, ``turn_words=W`` on message boundaries (:func:`turn_windows`), ``plus_coarse=1``
keeps the product's windows besides; unset ones keep the product's values (120 / 30 / 8).
The dataset is stored once per grain, with the tier's windowing patched for that store.
``--leave-one-out`` picks a variant on all users but one and scores that one;
``--cpu-sessions N`` only times embedding N sessions' windows per grain.

A variant may also pool a session's cosines otherwise (session 25 later; measured, not
adopted): ``centroid=C``, ``soft_max=T``, ``smooth=K``, see :mod:`recall_pooling`.
A variant may also score a question's aspects apart (session 26, query decomposition;
measured, not adopted): ``aspects=W``, ``cover=1``, ``no_and=1``, ``aspect_common=S``, see
:mod:`recall_aspects`; or add pseudo-relevance feedback (session 27): ``prf=L``, ``rocchio=L``,
``rm3=L``, see :mod:`recall_feedback` (its added CPU per recall printed after the table).
``--holdout-last N`` also scores the last N users apart (``held:``) from the others
(``tune:``); ``--store-dir DIR`` keeps the stores and reuses a complete one.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from pathlib import Path
from unittest import mock

from recall_aspects import AspectMode
from recall_bench import (
    DATASETS,
    DEFAULT_DATA,
    KS,
    CachedEmbedder,
    Dataset,
    Ours,
    Query,
    Ranker,
    load,
    safe_id,
    store,
    summarize,
)
from recall_feedback import Feedback, costs
from recall_passages import Passages
from recall_pooling import Pooling

import tiers.session._plans as session_plans
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.models import Message, SessionSummary
from tiers.session import (
    FusionWeights,
    SessionTier,
    summary_text,
    transcript_text,
    windows,
)
from tiers.session._chunking import TRANSCRIPT_WINDOWS, WINDOW_OVERLAP, WINDOW_WORDS

METRICS = (*(f"r@{k}" for k in KS), "mrr")
# Prefix of the per-user groups of a result (for leaving one user out; not in the table).
USER_GROUP = "user "


def users_of(data_dir: Path, name: str, categories: Sequence[str] | None) -> set[str] | None:
    """Users with a headline query of one of ``categories`` (``None``: no restriction)."""
    if categories is None:
        return None
    with (data_dir / f"{name}.queries.jsonl").open(encoding="utf-8") as handle:
        rows = [json.loads(line) for line in handle]
    return {
        safe_id(row["user_id"])
        for row in rows
        if row["headline"] and row["category_name"] in categories
    }


def turn_windows(messages: Sequence[Message], *, words: int, overlap: int, cap: int) -> list[str]:
    """Windows on turn boundaries: each message its own window, short neighbours merged.

    Consecutive messages (``speaker: text`` lines) are merged while the window stays
    within ``words`` words; a longer message is split into ``words``-word windows
    sharing ``overlap`` words. When that gives more than ``cap`` windows the word
    budget grows until it does not, so every turn stays inside some window.
    """
    lines = transcript_text(messages).split("\n")
    budget = words
    while True:
        out: list[str] = []
        current: list[str] = []
        for line in lines:
            size = len(line.split())
            if current and len(" ".join(current).split()) + size > budget:
                out.append("\n".join(current))
                current = []
            if size > budget:
                out.extend(windows(line, size=budget, overlap=min(overlap, budget - 1)))
            else:
                current.append(line)
        if current:
            out.append("\n".join(current))
        if len(out) <= cap:
            return out
        budget = max(budget + 1, math.ceil(budget * len(out) / cap))


@dataclass(frozen=True)
class Grain:
    """How a session's transcript is cut into embedded windows (each grain has its own store).

    Attributes:
        words: Words per transcript window (with ``turns``: the merge budget).
        overlap: Words shared by consecutive windows (with ``turns``: by pieces of a long turn).
        cap: Transcript windows per session at most.
        turns: Cut on message boundaries (:func:`turn_windows`) instead of a word grid.
        plus_coarse: Also embed the product's windows (120 words, at most 8) of the transcript.
    """

    words: int = WINDOW_WORDS
    overlap: int = WINDOW_OVERLAP
    cap: int = TRANSCRIPT_WINDOWS
    turns: bool = False
    plus_coarse: bool = False

    def session_windows(
        self, summary: SessionSummary, messages: Sequence[Message] | None
    ) -> list[str]:
        """What the tier embeds per session at this grain (the summary's windows unchanged)."""
        texts = windows(summary_text(summary)) or [summary.render()]
        if not messages:
            return texts
        if self.plus_coarse:
            texts.extend(windows(transcript_text(messages), max_windows=TRANSCRIPT_WINDOWS))
        if self.turns:
            texts.extend(
                turn_windows(messages, words=self.words, overlap=self.overlap, cap=self.cap)
            )
        else:
            texts.extend(
                windows(
                    transcript_text(messages),
                    size=self.words,
                    overlap=self.overlap,
                    max_windows=self.cap,
                )
            )
        return texts


@dataclass(frozen=True)
class Variant:
    """One reader over a stored dataset: its fusion weights, keyword scoring and window grain.

    Attributes:
        name: The row's name.
        weights: The fusion weights.
        passages: ``None``: BM25 over whole sessions (the product); else over passages.
        grain: The window grain of the store it reads.
        pooling: How a session's cosines make its dense score; ``None``: the product's.
        aspect_mode: How the query's aspects are used; ``None``: the product's way.
        feedback: Pseudo-relevance feedback; ``None``: none (the product).
    """

    name: str
    weights: FusionWeights
    passages: Passages | None = None
    grain: Grain = Grain()
    pooling: Pooling | None = None
    aspect_mode: AspectMode | None = None
    feedback: Feedback | None = None


def parse_variant(spec: str) -> Variant:
    """``dates=0.3,recency=0.1``, ``passages=0.5`` or ``window_words=40`` as a named variant.

    Grain keys: ``window_words``, ``window_overlap``, ``windows_cap`` (a word grid), or
    ``turn_words`` (turn windows, merge budget; with ``window_overlap`` and ``windows_cap``);
    ``plus_coarse=1`` keeps the product's windows besides. Pooling keys: ``centroid``,
    ``soft_max``, ``smooth`` (:class:`~recall_pooling.Pooling`).
    Other keys are :class:`~tiers.session.FusionWeights` fields; unnamed ones keep defaults.
    """
    fields = {}
    for part in spec.split(","):
        key, _, value = part.partition("=")
        fields[key.strip()] = float(value)
    passages = Passages.pop(fields)
    pooling = Pooling.pop(fields)
    aspect_mode = AspectMode.pop(fields)
    feedback = Feedback.pop(fields)
    if feedback and passages:
        raise ValueError(f"{spec}: feedback expands whole-session BM25, not passages")
    turn_words = fields.pop("turn_words", None)
    grain = Grain(
        words=int(fields.pop("window_words", turn_words or WINDOW_WORDS)),
        overlap=int(fields.pop("window_overlap", WINDOW_OVERLAP)),
        cap=int(fields.pop("windows_cap", TRANSCRIPT_WINDOWS)),
        turns=turn_words is not None,
        plus_coarse=bool(fields.pop("plus_coarse", 0)),
    )
    weights = FusionWeights(**fields)
    return Variant(spec, weights, passages, grain, pooling, aspect_mode, feedback)


def score_by_category(
    queries: Sequence[Query], rank: Ranker, held: set[str] | None = None
) -> dict[str, dict[str, float]]:
    """Mean recall@k and MRR per category and over all queries (``all``), with counts (``n``).

    With ``held`` (user ids), each group is also scored over those users' queries alone
    (``held:all``, ``held:<category>``) and over the other users' (``tune:...``).
    """
    totals: dict[str, dict[str, float]] = {}
    for query in queries:
        ranked = rank(query)
        first = next((i for i, sid in enumerate(ranked) if sid in query.gold), None)
        values = {f"r@{k}": len(query.gold & set(ranked[:k])) / len(query.gold) for k in KS}
        values["mrr"] = 0.0 if first is None else 1.0 / (first + 1)
        groups = ["all", query.category]
        if held is not None:
            side = "held:" if query.user_id in held else "tune:"
            groups += [side + group for group in groups]
        for group in (*groups, f"{USER_GROUP}{query.user_id}"):
            sums = totals.setdefault(group, dict.fromkeys((*METRICS, "n"), 0.0))
            for name, value in values.items():
                sums[name] += value
            sums["n"] += 1
    return {
        group: {name: sums[name] / sums["n"] for name in METRICS} | {"n": sums["n"]}
        for group, sums in totals.items()
    }


def measure(
    dataset: Dataset,
    embedder: CachedEmbedder,
    workdir: Path,
    variants: Sequence[Variant],
    held: set[str] | None = None,
) -> dict[str, dict[str, dict[str, float]]]:
    """Store the dataset once per window grain, then score every variant by category.

    A grain's store already complete in ``workdir`` (a ``stored`` marker, from a run with the
    same dataset and ``--store-dir``) is opened instead of stored again.
    """
    summaries = summarize(dataset)
    stores: dict[Grain, Ours] = {}
    for n, grain in enumerate(dict.fromkeys(variant.grain for variant in variants)):
        grain_dir = workdir / f"grain-{n}"
        if (grain_dir / "stored").exists():
            stores[grain] = reopen(grain_dir, embedder)
            continue
        with mock.patch.object(session_plans, "session_windows", grain.session_windows):
            stores[grain] = store(dataset, grain_dir, embedder, summaries)
        (grain_dir / "stored").write_text(str(grain))
        embedder.save()
        print(
            f"  {dataset.name}: {grain} stored in {stores[grain].store_seconds:.0f}s, "
            f"{vectors_per_session(dataset, summaries, grain):.1f} vectors per session",
            flush=True,
        )
    transcripts = {
        (user, s.session_id): s.messages
        for user, sessions in dataset.sessions.items()
        for s in sessions
    }
    results: dict[str, dict[str, dict[str, float]]] = {}
    for variant in variants:
        reader = stores[variant.grain].with_weights(variant.weights)
        with ExitStack() as patches:
            if variant.pooling is not None:
                patches.enter_context(variant.pooling.patched())
            if variant.aspect_mode is not None:
                patches.enter_context(variant.aspect_mode.patched(embedder))
            if variant.feedback is not None:
                patches.enter_context(variant.feedback.patched(f"{dataset.name} {variant.name}"))
            if variant.passages is not None:
                patches.enter_context(variant.passages.patched(transcripts))
            results[variant.name] = score_by_category(dataset.queries, reader.rank, held)
    embedder.save()  # the aspects' vectors, for the next run
    return results


def reopen(workdir: Path, embedder: CachedEmbedder) -> Ours:
    """A store left complete by an earlier run in ``workdir``, opened as it is."""
    kv = SqliteKVStore(workdir / "kv.sqlite3", durable=False)
    index = ChromaVectorIndex(workdir / "chroma", embedder=embedder)
    return Ours(SessionTier(kv, index, embedder), 0.0, kv, index, embedder)


def vectors_per_session(
    dataset: Dataset, summaries: Mapping[str, Mapping[str, SessionSummary]], grain: Grain
) -> float:
    """Mean vectors per session (summary windows and transcript windows) at ``grain``."""
    counts = [
        len(grain.session_windows(summaries[user][s.session_id], s.messages))
        for user, sessions in dataset.sessions.items()
        for s in sessions
    ]
    return sum(counts) / max(1, len(counts))


def embedding_cpu(
    dataset: Dataset, grains: Sequence[Grain], sessions: int
) -> Iterator[tuple[Grain, float, float]]:
    """Per grain: vectors and CPU seconds per session of embedding the first ``sessions``.

    As the background pass embeds them: the one-thread model, two texts per call
    (``WINDOW_CHUNK``), no cache; the model is loaded and warmed before timing.
    """
    model = MiniLMEmbedder().for_background()
    model.embed(["warm up the model"])
    summaries = summarize(dataset)
    picked = [s for user_sessions in dataset.sessions.values() for s in user_sessions][:sessions]
    for grain in grains:
        texts = [
            grain.session_windows(summaries[s.user_id][s.session_id], s.messages) for s in picked
        ]
        started = time.process_time()
        for session_texts in texts:
            for begin in range(0, len(session_texts), 2):
                model.embed(session_texts[begin : begin + 2])
        cpu = time.process_time() - started
        yield grain, sum(map(len, texts)) / len(texts), cpu / len(texts)


def table(results: dict[str, dict[str, dict[str, float]]], side: str = "") -> Iterator[str]:
    """One row per weighting; one column for all queries, then one per category.

    ``side`` (``held:`` or ``tune:``) picks the groups of one side of a held-out split.
    """
    first = next(iter(results.values()))
    mine = [
        g
        for g in first
        if not g.startswith(USER_GROUP) and (g.startswith(side) if side else ":" not in g)
    ]
    groups = [f"{side}all", *sorted(g for g in mine if g != f"{side}all")]
    header = [f"{g.removeprefix(side)} ({int(first[g]['n'])})" for g in groups]
    yield "| weighting | " + " | ".join(header) + " |"
    yield "|---|" + "---|" * len(groups)
    for name, by_group in results.items():
        cells = [" / ".join(f"{by_group[g][m]:.3f}" for m in METRICS) for g in groups]
        yield f"| {name} | " + " | ".join(cells) + " |"


def user_table(results: dict[str, dict[str, dict[str, float]]]) -> Iterator[str]:
    """One row per variant: r@5 / MRR of each user's queries."""
    first = next(iter(results.values()))
    users = sorted(g for g in first if g.startswith(USER_GROUP))
    header = [f"{u.removeprefix(USER_GROUP)} ({int(first[u]['n'])})" for u in users]
    yield "| variant | " + " | ".join(header) + " |"
    yield "|---|" + "---|" * len(users)
    for name, by_group in results.items():
        cells = [f"{by_group[u]['r@5']:.3f} / {by_group[u]['mrr']:.3f}" for u in users]
        yield f"| {name} | " + " | ".join(cells) + " |"


def leave_one_user_out(results: dict[str, dict[str, dict[str, float]]]) -> Iterator[str]:
    """Per user: the variant the other users pick (best r@5, then MRR) and its held-out figures.

    Ends with the held-out figures pooled over users (weighted by their queries).
    """
    first = next(iter(results.values()))
    users = sorted(g for g in first if g.startswith(USER_GROUP))
    pooled = dict.fromkeys((*METRICS, "n"), 0.0)

    def on(variant: str, groups: Sequence[str]) -> tuple[float, float]:
        n = sum(results[variant][g]["n"] for g in groups)
        r5, mrr = (
            sum(results[variant][g][m] * results[variant][g]["n"] for g in groups) / n
            for m in ("r@5", "mrr")
        )
        return r5, mrr

    for user in users:
        others = [g for g in users if g != user]
        chosen = max(results, key=lambda variant: on(variant, others))
        held = results[chosen][user]
        for name in METRICS:
            pooled[name] += held[name] * held["n"]
        pooled["n"] += held["n"]
        figures = " / ".join(f"{held[m]:.3f}" for m in METRICS)
        yield f"{user.removeprefix(USER_GROUP)} ({int(held['n'])}): picks {chosen}: {figures}"
    figures = " / ".join(f"{pooled[m] / pooled['n']:.3f}" for m in METRICS)
    yield f"held out, pooled ({int(pooled['n'])}): {figures}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=DEFAULT_DATA)
    parser.add_argument("--datasets", nargs="+", choices=sorted(DATASETS), default=list(DATASETS))
    parser.add_argument("--max-users", type=int, default=10, help="users per dataset (0: all)")
    parser.add_argument("--embed-cache", type=Path, default=None, help="npz file to reuse vectors")
    parser.add_argument(
        "--categories",
        nargs="+",
        default=None,
        help="only users with a headline query of these categories (a stratified sample)",
    )
    parser.add_argument(
        "--variant",
        action="append",
        default=[],
        help="extra weighting to score, e.g. dates=0.3,recency=0.1, passages=0.5 or aspects=0.15",
    )
    parser.add_argument(
        "--leave-one-out",
        action="store_true",
        help="also choose a variant on all users but one and score that one, for every user",
    )
    parser.add_argument(
        "--holdout-last",
        type=int,
        default=0,
        help="also score the last N users apart (held:) from the others (tune:)",
    )
    parser.add_argument(
        "--store-dir",
        type=Path,
        default=None,
        help="keep the stores here and reuse a complete one (same dataset and users only)",
    )
    parser.add_argument(
        "--cpu-sessions",
        type=int,
        default=0,
        help="only time embedding the first N sessions' windows per variant grain (no scoring)",
    )
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        print(f"no benchmark data at {args.data}: pass --data", file=sys.stderr)
        return 2
    variants = [
        Variant("default", FusionWeights()),
        Variant("no dates (dates=0)", FusionWeights(dates=0.0)),
        Variant("best window only (second_window=0)", FusionWeights(second_window=0.0)),
        *(parse_variant(spec) for spec in args.variant),
    ]
    if args.cpu_sessions:
        grains = list(dict.fromkeys(variant.grain for variant in variants))
        for name in args.datasets:
            dataset = load(args.data, name, args.max_users)
            for grain, vectors, cpu in embedding_cpu(dataset, grains, args.cpu_sessions):
                print(f"{name} {grain}: {vectors:.1f} vectors, {cpu:.3f} CPU s per session")
        print(f"load average {os.getloadavg()[0]:.1f}")
        return 0
    model = MiniLMEmbedder()
    model.load()
    embedder = CachedEmbedder(model, args.embed_cache)
    started = time.perf_counter()
    for name in args.datasets:
        dataset = load(args.data, name, args.max_users, users_of(args.data, name, args.categories))
        print(
            f"\n{name}: {len(dataset.sessions)} users, "
            f"{sum(len(s) for s in dataset.sessions.values())} sessions, "
            f"{len(dataset.queries)} headline queries",
            flush=True,
        )
        held = set(list(dataset.sessions)[-args.holdout_last :]) if args.holdout_last else None
        with ExitStack() as scope:
            workdir = (
                args.store_dir / f"{name}-{args.max_users}"
                if args.store_dir
                else Path(scope.enter_context(tempfile.TemporaryDirectory(prefix=name)))
            )
            results = measure(dataset, embedder, workdir, variants, held)
        print(f"r@1 / r@3 / r@5 / MRR; load average {os.getloadavg()[0]:.1f}")
        print("\n".join(table(results)), flush=True)
        print("\n".join(line for line in costs() if line.startswith(name)), flush=True)
        for side in ("tune:", "held:") if held else ():
            print(f"\n{side} users {'last' if side == 'held:' else 'first'} of the split:")
            print("\n".join(table(results, side)), flush=True)
        if args.leave_one_out:
            print("\nr@5 / MRR per user:")
            print("\n".join(user_table(results)))
            print("\nleave one user out over these variants, r@1 / r@3 / r@5 / MRR:")
            print("\n".join(leave_one_user_out(results)), flush=True)
    print(f"\ntotal {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
