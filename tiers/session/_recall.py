"""How recall ranks one user's sessions against a query: everything that decides the order.

Recall scores *every* stored session of the user exactly (no approximate
search: one user's few hundred sessions are cheap to score); the tier first
finishes index work still queued for the user, so its acknowledged writes
count. What ranking needs is read and cached per user by
:mod:`tiers.session._view` (creation times, vectors, term counts); the words
are cut by :func:`tiers.session._keyword.tokenize`. From those inputs,
:func:`rank` orders the sessions in five steps, each written once below:

1. **Dense similarity** (:func:`best_similarity`): a session is stored as
   several vectors (its summary, and windows of its transcript, see
   :mod:`tiers.session._chunking`); its similarity is the *best* cosine of
   the query with any of them, so one matching passage of a long session
   counts fully. For ranking (step 5) it is blended with the session's
   *second best* cosine (:func:`best_two_similarities`): of two sessions with
   an equally good passage, the one that comes back to the subject ranks
   first. A session with no vector indexed yet has none (NaN).
2. **Keyword match** (:class:`BM25Index`): Okapi BM25 (``k1`` 1.2, ``b``
   0.75, the "+1" IDF that stays positive) over the tokens of the summary
   text and transcript; a query word repeated counts once.
3. **Recency priors**: the session's place in the user's history (0 the
   oldest, 1 the newest), weighted lightly (:class:`FusionWeights`), so it
   only decides between sessions about equally relevant: of two that say
   conflicting things ("I live in Berlin", later "I moved to Lisbon"), the
   newer wins, whatever their ages. An optional decay by age,
   ``0.5 ** (age / half_life_days)`` counted back from the user's newest
   session, is off by default (it is 0 for every session older than a few
   half-lives, and cost quality on the dev data).
4. **Dates in the query** (:mod:`tiers.session._temporal`): a query that
   names a time ("last March", "two weeks ago", "on 7 May 2023", relative to
   the time it is asked) gives each session a date match in [0, 1] (1 when
   the session's ``created_at`` falls in the named time, less near it); the
   time words themselves are left out of the keyword match. A query that
   names no time has no date match and ranks exactly as without this step.
5. **Fusion** (:func:`fuse`): dense vectors find paraphrases ("vacation" for
   "holiday"); BM25 finds the exact rare words vectors blur (names, numbers,
   error codes). Neither is reliably better, so both are normalised to
   [0, 1] per query and combined convexly (the fusion found most robust in
   Bruch et al., "An Analysis of Fusion Functions for Hybrid Retrieval", 2023):

   - dense: ``(best + w * second) / (1 + w)`` with ``w =
     weights.second_window`` (a session with one vector counts its best as
     its second), rescaled so the query's best session is 1 and its worst is 0
     (one candidate, or all equally similar: 1 each); a session without
     vectors counts 0;
   - keyword: the session's BM25 score divided by the query's best BM25
     score (0 when no session shares a word with the query);
   - ``dense * weights.dense + keyword * (1 - weights.dense)``, plus
     ``weights.recency * recency + weights.newer * place`` and, when the
     query names a time, ``weights.dates * date_match``, divided by the sum
     of the weights (``1 + weights.recency + weights.newer``
     [``+ weights.dates``]) so the fused score stays in [0, 1].

   **Tie-breaks**: equal scores go to the newer session, then to the smaller
   session id, so a ranking is deterministic.
"""

from __future__ import annotations

import math
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import numpy.typing as npt

from tiers.session._keyword import tokenize
from tiers.session._temporal import date_match, parse_query

__all__ = [
    "BM25Index",
    "FusionWeights",
    "Ranked",
    "best_similarity",
    "best_two_similarities",
    "fuse",
    "rank",
]

_SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class FusionWeights:
    """How the signals are combined.

    Attributes:
        dense: Weight of dense similarity; keyword gets ``1 - dense``.
        recency: Weight of the recency prior by age, added on top. Off by
            default since issue 19 item 3: ``newer`` orders equally relevant
            sessions at any age, and on the LoCoMo dev set the age decay only
            cost quality (``bench/README.md``).
        half_life_days: Age at which the recency prior halves.
        newer: Weight of the session's place in the user's history (0 the
            oldest session, 1 the newest), added on top: of two sessions
            about equally relevant, the newer one wins, however old both are.
        dates: Weight of the date match, added on top when the query names
            a time (see :mod:`tiers.session._temporal`).
        second_window: Weight of a session's second-best cosine against its
            best (1) in the dense score it is ranked by, ``(best + w *
            second) / (1 + w)``; 0 ranks by the best vector alone (the
            reported ``similarity`` is the best cosine either way). 0.5 since session
            24: evidence spread over two passages of one session is a
            better sign than one passage (``bench/README.md``).
    """

    dense: float = 0.5
    recency: float = 0.0
    half_life_days: float = 30.0
    newer: float = 0.02
    dates: float = 0.75
    second_window: float = 0.5

    def __post_init__(self) -> None:
        if not 0.0 <= self.dense <= 1.0:
            raise ValueError("dense weight must be within [0, 1]")
        if self.recency < 0.0 or self.half_life_days <= 0.0:
            raise ValueError("recency must be >= 0 and half_life_days > 0")
        if self.newer < 0.0 or self.dates < 0.0 or self.second_window < 0.0:
            raise ValueError("newer, dates and second_window must be >= 0")


@dataclass(frozen=True, slots=True)
class Ranked:
    """One session's place in a ranking.

    Attributes:
        session_id: The session.
        score: Fused relevance in [0, 1].
        similarity: Best cosine similarity of the query with the session's
            vectors, or ``None`` when none of them is indexed yet.
        keyword: BM25 score relative to the query's best match, in [0, 1].
    """

    session_id: str
    score: float
    similarity: float | None
    keyword: float


def fuse(
    session_ids: Sequence[str],
    *,
    similarity: npt.NDArray[np.float64],
    keyword: Mapping[str, float],
    created_at: npt.NDArray[np.float64],
    weights: FusionWeights = FusionWeights(),
    date_fit: npt.NDArray[np.float64] | None = None,
    second: npt.NDArray[np.float64] | None = None,
) -> list[Ranked]:
    """Rank sessions best first; ties go to the newer session, then to the smaller id.

    Args:
        session_ids: The candidate sessions.
        similarity: Per session, its best cosine with the query; NaN where the
            session has no vector (yet).
        keyword: BM25 score per session id; missing means 0.
        created_at: Per session, its creation time as a POSIX timestamp.
        weights: The fusion weights.
        date_fit: Per session, how well its time fits the dates the query
            names, in [0, 1]; ``None`` when the query names none.
        second: Per session, its second-best cosine with the query (NaN: it
            has fewer than two vectors), blended into its dense score with
            ``weights.second_window``; ``None``: the best cosine alone.
    """
    n = len(session_ids)
    if n == 0:
        return []
    dense = np.asarray(similarity, dtype=np.float64)
    known = ~np.isnan(dense)
    blended = dense
    if second is not None and weights.second_window > 0.0:
        # A session with one vector counts its best as its second: no penalty for being short.
        runner_up = np.where(np.isnan(second), dense, np.asarray(second, dtype=np.float64))
        blended = (dense + weights.second_window * runner_up) / (1.0 + weights.second_window)
    dense_norm = np.zeros(n)
    if known.any():
        low, high = float(blended[known].min()), float(blended[known].max())
        spread = high - low
        # One candidate, or all equally similar: similarity cannot order them, so it counts fully.
        dense_norm[known] = (blended[known] - low) / spread if spread > 1e-9 else 1.0
    raw_keyword = np.array([keyword.get(sid, 0.0) for sid in session_ids], dtype=np.float64)
    best_keyword = float(raw_keyword.max())
    keyword_norm = raw_keyword / best_keyword if best_keyword > 0 else raw_keyword
    created = np.asarray(created_at, dtype=np.float64)
    age_days = (float(created.max()) - created) / _SECONDS_PER_DAY
    recency = np.power(0.5, age_days / weights.half_life_days)
    # How many sessions are older, as a share of the others (ties count alike).
    place = np.searchsorted(np.sort(created), created, side="left") / max(n - 1, 1)
    fused = weights.dense * dense_norm + (1.0 - weights.dense) * keyword_norm
    fused = fused + weights.recency * recency + weights.newer * place
    total_weight = 1.0 + weights.recency + weights.newer
    if date_fit is not None:
        fused = fused + weights.dates * np.asarray(date_fit, dtype=np.float64)
        total_weight += weights.dates
    fused = fused / total_weight
    order = sorted(range(n), key=lambda i: (-fused[i], -created[i], session_ids[i]))
    return [
        Ranked(
            session_id=session_ids[i],
            score=float(min(1.0, max(0.0, fused[i]))),
            similarity=None if not known[i] else float(max(-1.0, min(1.0, dense[i]))),
            keyword=float(keyword_norm[i]),
        )
        for i in order
    ]


def best_similarity(
    sessions: int,
    vectors: npt.NDArray[np.float32],
    owner: npt.NDArray[np.intp],
    query_vector: Sequence[float],
) -> npt.NDArray[np.float64]:
    """Per session, the best cosine of ``query_vector`` with its vectors (NaN: none indexed).

    Args:
        sessions: How many sessions are ranked.
        vectors: One row per stored vector, unit length (so a dot product is the cosine).
        owner: Per row of ``vectors``, the position of its session.
        query_vector: The query's embedding, unit length.
    """
    return best_two_similarities(sessions, vectors, owner, query_vector)[0]


def best_two_similarities(
    sessions: int,
    vectors: npt.NDArray[np.float32],
    owner: npt.NDArray[np.intp],
    query_vector: Sequence[float],
) -> tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]:
    """Per session, the best and the second-best cosine of ``query_vector`` with its vectors.

    Args:
        sessions: How many sessions are ranked.
        vectors: One row per stored vector, unit length (so a dot product is the cosine).
        owner: Per row of ``vectors``, the position of its session.
        query_vector: The query's embedding, unit length.

    Returns:
        ``(best, second)``, one value per session each: NaN for a session
        with no vector indexed; a session with one vector has NaN as second.
    """
    best = np.full(sessions, np.nan)
    second = np.full(sessions, np.nan)
    if not len(owner):
        return best, second
    query = np.asarray(query_vector, dtype=np.float32)
    cosines = (vectors @ query).astype(np.float64)
    np.fmax.at(best, owner, cosines)
    # Rows grouped by session, best first: a session's second row holds its second best.
    order = np.lexsort((-cosines, owner))
    grouped = owner[order]
    is_second = np.zeros(len(order), dtype=bool)
    is_second[1:] = grouped[1:] == grouped[:-1]
    is_second[2:] &= grouped[2:] != grouped[:-2]
    second[grouped[is_second]] = cosines[order][is_second]
    return best, second


@dataclass(slots=True)
class BM25Index:
    """Okapi BM25 over a fixed set of documents, each held as its term counts.

    Scoring walks every document once per query term: for the few hundred
    documents of one user that is cheaper than building postings lists,
    which a cache rebuilt on every change would pay for again and again.

    Args:
        k1: Term-frequency saturation.
        b: Length normalisation (0: none, 1: full).
    """

    k1: float = 1.2
    b: float = 0.75
    _doc_ids: list[str] = field(default_factory=list)
    _counts: list[Mapping[str, int]] = field(default_factory=list)
    _lengths: list[int] = field(default_factory=list)

    @classmethod
    def build(
        cls, docs: Iterable[tuple[str, Sequence[str]]], *, k1: float = 1.2, b: float = 0.75
    ) -> BM25Index:
        """Index ``(doc_id, tokens)`` pairs; a repeated doc_id is indexed twice."""
        return cls.from_counts(((doc_id, Counter(tokens)) for doc_id, tokens in docs), k1=k1, b=b)

    @classmethod
    def from_counts(
        cls, docs: Iterable[tuple[str, Mapping[str, int]]], *, k1: float = 1.2, b: float = 0.75
    ) -> BM25Index:
        """Index ``(doc_id, term counts)`` pairs (counts as made by :func:`collections.Counter`)."""
        index = cls(k1=k1, b=b)
        for doc_id, counts in docs:
            index._doc_ids.append(doc_id)
            index._counts.append(counts)
            index._lengths.append(sum(counts.values()))
        return index

    def __len__(self) -> int:
        return len(self._doc_ids)

    def entries(self) -> int:
        """Total distinct terms over all documents (a measure of memory held)."""
        return sum(len(counts) for counts in self._counts)

    def scores(self, query_tokens: Sequence[str]) -> dict[str, float]:
        """BM25 score of every document sharing a term with the query (others score 0).

        A query term repeated counts once: queries are short and a repeat is
        rarely deliberate emphasis.
        """
        n = len(self._doc_ids)
        if n == 0:
            return {}
        avg_length = max(sum(self._lengths) / n, 1e-9)
        norms = [
            self.k1 * (1.0 - self.b + self.b * length / avg_length) for length in self._lengths
        ]
        totals: dict[int, float] = {}
        for term in dict.fromkeys(query_tokens):
            hits = [(i, tf) for i, counts in enumerate(self._counts) if (tf := counts.get(term))]
            if not hits:
                continue
            # The "+1" form of IDF stays positive even for a term in every document.
            idf = math.log(1.0 + (n - len(hits) + 0.5) / (len(hits) + 0.5))
            for i, tf in hits:
                totals[i] = totals.get(i, 0.0) + idf * tf * (self.k1 + 1) / (tf + norms[i])
        return {self._doc_ids[i]: score for i, score in totals.items()}


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
) -> list[Ranked]:
    """Rank one user's sessions against a query, best first (the steps of the module docstring).

    Args:
        session_ids: Every session of the user.
        created_at: Per session, its creation time as a POSIX timestamp.
        vectors: The sessions' stored vectors, one per row.
        owner: Per row of ``vectors``, the position of its session in ``session_ids``.
        query_vector: The query's embedding.
        keywords: BM25 over the sessions' summary and transcript text.
        query: The query text.
        weights: The fusion weights.
        now: When the query is asked: "yesterday" in it counts back from here.
    """
    dated = parse_query(query, now)
    date_fit = (
        np.array([date_match(float(t), dated.windows) for t in created_at], dtype=np.float64)
        if dated.windows
        else None
    )
    best, second = best_two_similarities(len(session_ids), vectors, owner, query_vector)
    return fuse(
        session_ids,
        similarity=best,
        second=second,
        # The time words leave the keyword match only when the date match stands in for them.
        keyword=keywords.scores(tokenize(dated.rest if weights.dates > 0 else query)),
        created_at=created_at,
        weights=weights,
        date_fit=date_fit,
    )
