"""Recall quality of the session tier by question category, for several fusion weightings.

Stores every session of the dev data once through ``SessionTier`` (as
``recall_bench.py`` does: transcript, then the extractive summary, ``created_at``
= the session's date), then asks every headline query, at its question date
(LongMemEval's ``query_date``; LoCoMo has none: a day after the user's last
session), through readers with different :class:`~tiers.session.FusionWeights`
over the same store. Printed: recall@1/3/5 and MRR overall and per category
(LoCoMo: single-hop, multi-hop, temporal, open-domain; LongMemEval:
temporal-reasoning, knowledge-update, ...), one row per weighting, with the
load average. Gold sessions and categories are only used to score.

Usage::

    python bench/recall_categories_bench.py --datasets locomo
    python bench/recall_categories_bench.py --datasets longmemeval_s --max-users 10 \\
        --embed-cache /tmp/tiermem-emb.npz
    python bench/recall_categories_bench.py --variant recency=0.1 --variant dates=0.3
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import tempfile
import time
from collections.abc import Iterator, Sequence
from pathlib import Path

from recall_bench import (
    DATASETS,
    DEFAULT_DATA,
    KS,
    CachedEmbedder,
    Dataset,
    Query,
    Ranker,
    load,
    safe_id,
    store,
    summarize,
)

from tiers.backends.embedders import MiniLMEmbedder
from tiers.session import FusionWeights

METRICS = (*(f"r@{k}" for k in KS), "mrr")


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


def parse_variant(spec: str) -> tuple[str, FusionWeights]:
    """``dates=0.3,recency=0.1`` as a named weighting (unnamed fields keep their defaults)."""
    fields = {}
    for part in spec.split(","):
        key, _, value = part.partition("=")
        fields[key.strip()] = float(value)
    return spec, FusionWeights(**fields)


def score_by_category(queries: Sequence[Query], rank: Ranker) -> dict[str, dict[str, float]]:
    """Mean recall@k and MRR per category and over all queries (``all``), with counts (``n``)."""
    totals: dict[str, dict[str, float]] = {}
    for query in queries:
        ranked = rank(query)
        first = next((i for i, sid in enumerate(ranked) if sid in query.gold), None)
        values = {f"r@{k}": len(query.gold & set(ranked[:k])) / len(query.gold) for k in KS}
        values["mrr"] = 0.0 if first is None else 1.0 / (first + 1)
        for group in ("all", query.category):
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
    variants: Sequence[tuple[str, FusionWeights]],
) -> dict[str, dict[str, dict[str, float]]]:
    """Store the dataset once, then score every weighting by category."""
    summaries = summarize(dataset)
    ours = store(dataset, workdir, embedder, summaries)
    embedder.save()
    print(f"  {dataset.name}: stored in {ours.store_seconds:.0f}s", flush=True)
    return {
        name: score_by_category(dataset.queries, ours.with_weights(weights).rank)
        for name, weights in variants
    }


def table(results: dict[str, dict[str, dict[str, float]]]) -> Iterator[str]:
    """One row per weighting; one column for all queries, then one per category."""
    first = next(iter(results.values()))
    groups = ["all", *sorted(g for g in first if g != "all")]
    header = [f"{g} ({int(first[g]['n'])})" for g in groups]
    yield "| weighting | " + " | ".join(header) + " |"
    yield "|---|" + "---|" * len(groups)
    for name, by_group in results.items():
        cells = [" / ".join(f"{by_group[g][m]:.3f}" for m in METRICS) for g in groups]
        yield f"| {name} | " + " | ".join(cells) + " |"


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
        help="extra weighting to score, e.g. dates=0.3,recency=0.1 (repeatable)",
    )
    args = parser.parse_args(argv)
    if not args.data.is_dir():
        print(f"no benchmark data at {args.data}: pass --data", file=sys.stderr)
        return 2
    variants = [
        ("default", FusionWeights()),
        ("no dates (dates=0)", FusionWeights(dates=0.0)),
        ("best window only (second_window=0)", FusionWeights(second_window=0.0)),
        *(parse_variant(spec) for spec in args.variant),
    ]
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
        with tempfile.TemporaryDirectory(prefix=f"recall-categories-{name}-") as workdir:
            results = measure(dataset, embedder, Path(workdir), variants)
        print(f"r@1 / r@3 / r@5 / MRR; load average {os.getloadavg()[0]:.1f}")
        print("\n".join(table(results)), flush=True)
    print(f"\ntotal {time.perf_counter() - started:.0f}s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
