"""Pseudo-relevance feedback for the recall bench: a second pass from the first pass's top sessions.

Session 27, issue 19 item 3; measured, not adopted (``bench/README.md``). Recall ranks once (today's
:func:`tiers.session._recall.rank`); the first pass's top sessions are then taken as
relevant, with no model and nothing stored changed (the vectors and term counts are the ones
the user's view already holds), and a second pass re-scores every session:

- dense (``rocchio=L``): Rocchio on the query vector, ``q' = q + beta * mean(v)``
  re-normalised, where ``v`` are the ``windows`` rows (summary or transcript windows) of each
  of the first ``sessions`` sessions that match ``q`` best; every session's best and
  second-best cosine are taken again against ``q'``;
- sparse (``rm3=L``): RM3 expansion of the BM25 query, the relevance model
  ``P(w|R) = sum_D score(D) * tf(w, D) / |D|`` over the same top sessions (``score``: their
  first-pass fused scores, summing to 1), its ``terms`` heaviest words kept and re-normalised,
  mixed with the query's own words, ``orig * P(w|Q) + (1 - orig) * P(w|R)``; BM25 is scored
  again with those term weights (stopwords are already out of both, see
  :func:`tiers.session.tokenize`);
- both (``prf=L``).

The second pass is fused as today (same weights, priors and date match), and a session's
score is ``(1 - L) * first + L * second``: ``L`` is the one knob chosen on the tuning users.
The other constants are fixed at the usual values (3 sessions, their best 2 windows,
``beta`` 0.75 as SMART's Rocchio, 10 terms and ``orig`` 0.5 as Anserini's RM3); a variant may
set ``fb_sessions``, ``fb_windows``, ``fb_beta``, ``fb_terms``, ``fb_orig`` to look at them.

Each recall is also ranked the product's way on the same inputs, both timed in thread CPU
(alternating which goes first): :func:`costs` prints the added CPU ms per recall.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Iterator, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from datetime import datetime
from unittest import mock

import numpy as np
import numpy.typing as npt

import tiers.session._reads as reads
import tiers.session._recall as recall
from tiers.session import BM25Index, FusionWeights, tokenize
from tiers.session._recall import Ranked
from tiers.session._temporal import date_match, parse_query

_today = recall.rank

# Thread CPU seconds per recall, (today's rank, with feedback), by variant name.
_COSTS: dict[str, list[tuple[float, float]]] = {}


@dataclass(frozen=True, slots=True)
class Feedback:
    """One bench reader's pseudo-relevance feedback (``weight`` 0: today's ranking).

    Attributes:
        weight: Share ``L`` of the second pass in a session's score.
        dense: Re-score the vectors with the Rocchio query.
        sparse: Re-score BM25 with the RM3 query.
        sessions: First-pass sessions taken as relevant.
        windows: Best-matching vectors taken from each of them (Rocchio).
        beta: Weight of their mean against the query's own vector (1).
        terms: Expansion words kept (RM3).
        orig: Weight of the query's own words in the expanded query.
    """

    weight: float = 0.0
    dense: bool = True
    sparse: bool = True
    sessions: int = 3
    windows: int = 2
    beta: float = 0.75
    terms: int = 10
    orig: float = 0.5

    @classmethod
    def pop(cls, fields: dict[str, float]) -> Feedback | None:
        """The feedback keys of a parsed variant, removed from ``fields`` (``None``: none set)."""
        modes = {"prf": (True, True), "rocchio": (True, False), "rm3": (False, True)}
        chosen = [key for key in modes if key in fields]
        if len(chosen) > 1:
            raise ValueError(f"one of prf, rocchio, rm3 at a time, not {chosen}")
        if not chosen:
            if any(key.startswith("fb_") for key in fields):
                raise ValueError("fb_* keys need prf=L, rocchio=L or rm3=L")
            return None
        dense, sparse = modes[chosen[0]]
        return cls(
            weight=fields.pop(chosen[0]),
            dense=dense,
            sparse=sparse,
            sessions=int(fields.pop("fb_sessions", 3)),
            windows=int(fields.pop("fb_windows", 2)),
            beta=fields.pop("fb_beta", 0.75),
            terms=int(fields.pop("fb_terms", 10)),
            orig=fields.pop("fb_orig", 0.5),
        )

    def patched(self, name: str) -> ExitStack:
        """A context in which the tier's recall ranks with this feedback, timed under ``name``."""
        stack = ExitStack()
        stack.enter_context(mock.patch.object(reads, "rank", _TimedRank(self, name)))
        return stack


@dataclass(slots=True)
class _TimedRank:
    """A stand-in for :func:`tiers.session._recall.rank`: feedback ranking, both ways timed."""

    feedback: Feedback
    name: str
    calls: int = field(default=0)

    def __call__(
        self,
        session_ids: Sequence[str],
        *,
        created_at: npt.NDArray[np.float64],
        vectors: npt.NDArray[np.float32],
        owner: npt.NDArray[np.intp],
        query_vector: Sequence[float],
        keywords: BM25Index,
        query: str,
        weights: FusionWeights,
        now: datetime,
    ) -> list[Ranked]:
        today = functools.partial(
            _today,
            session_ids,
            created_at=created_at,
            vectors=vectors,
            owner=owner,
            query_vector=query_vector,
            keywords=keywords,
            query=query,
            weights=weights,
            now=now,
        )
        with_feedback = functools.partial(
            rank,
            session_ids,
            created_at=created_at,
            vectors=vectors,
            owner=owner,
            query_vector=query_vector,
            keywords=keywords,
            query=query,
            weights=weights,
            now=now,
            feedback=self.feedback,
        )
        self.calls += 1
        spent = [0.0, 0.0]
        ranked: list[Ranked] = []
        # Alternate which goes first, so warm caches favour neither.
        for which in (0, 1) if self.calls % 2 else (1, 0):
            started = time.thread_time()
            result = (with_feedback if which else today)()
            spent[which] = time.thread_time() - started
            if which:
                ranked = result
        _COSTS.setdefault(self.name, []).append((spent[0], spent[1]))
        return ranked


def rank(
    session_ids: Sequence[str],
    *,
    created_at: npt.NDArray[np.float64],
    vectors: npt.NDArray[np.float32],
    owner: npt.NDArray[np.intp],
    query_vector: Sequence[float],
    keywords: BM25Index,
    query: str,
    weights: FusionWeights,
    now: datetime,
    feedback: Feedback,
) -> list[Ranked]:
    """Today's ranking, then the feedback pass mixed in (arguments as :func:`recall.rank`'s)."""
    n = len(session_ids)
    dated = parse_query(query, now)
    date_fit = (
        np.array([date_match(float(t), dated.windows) for t in created_at], dtype=np.float64)
        if dated.windows
        else None
    )
    query_terms = tokenize(dated.rest if weights.dates > 0 else query)
    best, second = recall.best_two_similarities(n, vectors, owner, query_vector)
    keyword = keywords.scores(query_terms)
    first = recall.fuse(
        session_ids,
        similarity=best,
        second=second,
        keyword=keyword,
        created_at=created_at,
        weights=weights,
        date_fit=date_fit,
    )
    if feedback.weight <= 0.0 or n < 2:
        return first
    place = {sid: i for i, sid in enumerate(session_ids)}
    top = [place[hit.session_id] for hit in first[: feedback.sessions]]
    best2, second2, keyword2 = best, second, keyword
    if feedback.dense and len(owner):
        expanded = rocchio(
            np.asarray(query_vector, dtype=np.float32), vectors, owner, top, feedback
        )
        best2, second2 = recall.best_two_similarities(n, vectors, owner, expanded.tolist())
    if feedback.sparse:
        shares = np.array([first[i].score for i in range(len(top))], dtype=np.float64)
        term_weights = rm3(query_terms, keywords, top, shares, feedback)
        keyword2 = weighted_scores(keywords, term_weights)
    again = recall.fuse(
        session_ids,
        similarity=best2,
        second=second2,
        keyword=keyword2,
        created_at=created_at,
        weights=weights,
        date_fit=date_fit,
    )
    second_score = {hit.session_id: hit.score for hit in again}
    mixed = [
        (hit, (1.0 - feedback.weight) * hit.score + feedback.weight * second_score[hit.session_id])
        for hit in first
    ]
    mixed.sort(
        key=lambda pair: (-pair[1], -created_at[place[pair[0].session_id]], pair[0].session_id)
    )
    return [
        Ranked(hit.session_id, score=score, similarity=hit.similarity, keyword=hit.keyword)
        for hit, score in mixed
    ]


def rocchio(
    query: npt.NDArray[np.float32],
    vectors: npt.NDArray[np.float32],
    owner: npt.NDArray[np.intp],
    top: Sequence[int],
    feedback: Feedback,
) -> npt.NDArray[np.float32]:
    """``q + beta * mean(best windows of the top sessions)``, unit length."""
    cosines = vectors @ query
    picked: list[npt.NDArray[np.intp]] = []
    for position in top:
        rows = np.flatnonzero(owner == position)
        picked.append(rows[np.argsort(-cosines[rows], kind="stable")[: feedback.windows]])
    rows = np.concatenate(picked) if picked else np.zeros(0, dtype=np.intp)
    if not len(rows):
        return query
    moved = query + feedback.beta * vectors[rows].mean(axis=0)
    norm = float(np.linalg.norm(moved))
    return (moved / norm).astype(np.float32) if norm > 0 else query


def rm3(
    query_terms: Sequence[str],
    keywords: BM25Index,
    top: Sequence[int],
    shares: npt.NDArray[np.float64],
    feedback: Feedback,
) -> dict[str, float]:
    """The expanded query's term weights: the query's words mixed with the top sessions' model."""
    own = list(dict.fromkeys(query_terms))
    total_share = float(shares.sum())
    model: dict[str, float] = {}
    for position, share in zip(top, shares, strict=True):
        counts = keywords._counts[position]
        length = keywords._lengths[position]
        if not length:
            continue
        # Equal shares when every first-pass score is 0 (nothing matched at all).
        weight = share / total_share if total_share > 0 else 1.0 / len(top)
        for term, tf in counts.items():
            model[term] = model.get(term, 0.0) + weight * tf / length
    kept = sorted(model.items(), key=lambda item: (-item[1], item[0]))[: feedback.terms]
    kept_total = sum(value for _, value in kept)
    weights: dict[str, float] = {}
    for term in own:
        weights[term] = feedback.orig / len(own)
    for term, value in kept:
        if kept_total > 0:
            share = (1.0 - feedback.orig) * value / kept_total
            weights[term] = weights.get(term, 0.0) + share
    return weights


def weighted_scores(index: BM25Index, term_weights: Mapping[str, float]) -> dict[str, float]:
    """BM25 of every document against a weighted query (as :meth:`BM25Index.scores`, weighted)."""
    n = len(index._doc_ids)
    if n == 0:
        return {}
    avg_length = max(sum(index._lengths) / n, 1e-9)
    norms = [
        index.k1 * (1.0 - index.b + index.b * length / avg_length) for length in index._lengths
    ]
    totals: dict[int, float] = {}
    for term, weight in term_weights.items():
        hits = [(i, tf) for i, counts in enumerate(index._counts) if (tf := counts.get(term))]
        if not hits:
            continue
        idf = math.log(1.0 + (n - len(hits) + 0.5) / (len(hits) + 0.5))
        for i, tf in hits:
            gain = weight * idf * tf * (index.k1 + 1) / (tf + norms[i])
            totals[i] = totals.get(i, 0.0) + gain
    return {index._doc_ids[i]: score for i, score in totals.items()}


def costs() -> Iterator[str]:
    """Per feedback variant: CPU ms per recall, today and with feedback, p50 / p99, and the added."""
    for name, pairs in _COSTS.items():
        today = np.array([pair[0] for pair in pairs]) * 1000
        added = np.array([pair[1] - pair[0] for pair in pairs]) * 1000
        with_feedback = np.array([pair[1] for pair in pairs]) * 1000
        yield (
            f"{name}: {len(pairs)} recalls, rank CPU ms p50 / p99 today "
            f"{np.percentile(today, 50):.2f} / {np.percentile(today, 99):.2f}, with feedback "
            f"{np.percentile(with_feedback, 50):.2f} / {np.percentile(with_feedback, 99):.2f}, "
            f"added {np.percentile(added, 50):.2f} / {np.percentile(added, 99):.2f}"
        )
