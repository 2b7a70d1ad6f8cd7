"""Hybrid ranking of one user's sessions: dense similarity + BM25 + a mild recency prior.

Dense vectors find paraphrases ("vacation" for "holiday"); BM25 finds the
exact rare words vectors blur (names, numbers, error codes). Neither is
reliably better, so both are normalised to [0, 1] per query and combined
convexly (the fusion found most robust in Bruch et al., "An Analysis of Fusion
Functions for Hybrid Retrieval", 2023):

- dense: the session's best cosine over its vectors (summary and transcript
  windows), rescaled so the query's best session is 1 and its worst is 0;
- keyword: the session's BM25 score divided by the query's best BM25 score
  (0 when no session shares a word with the query);
- recency: ``0.5 ** (age / half_life)``, age counted back from the user's
  newest session; weighted lightly, so it mostly breaks near-ties.

The fused score is rescaled into [0, 1].
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np
import numpy.typing as npt

__all__ = ["FusionWeights", "Ranked", "fuse"]

_SECONDS_PER_DAY = 86_400.0


@dataclass(frozen=True, slots=True)
class FusionWeights:
    """How the signals are combined.

    Attributes:
        dense: Weight of dense similarity; keyword gets ``1 - dense``.
        recency: Weight of the recency prior, added on top.
        half_life_days: Age at which the recency prior halves.
    """

    dense: float = 0.5
    recency: float = 0.05
    half_life_days: float = 30.0

    def __post_init__(self) -> None:
        if not 0.0 <= self.dense <= 1.0:
            raise ValueError("dense weight must be within [0, 1]")
        if self.recency < 0.0 or self.half_life_days <= 0.0:
            raise ValueError("recency must be >= 0 and half_life_days > 0")


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
) -> list[Ranked]:
    """Rank sessions best first; ties go to the newer session, then to the smaller id.

    Args:
        session_ids: The candidate sessions.
        similarity: Per session, its best cosine with the query; NaN where the
            session has no vector (yet).
        keyword: BM25 score per session id; missing means 0.
        created_at: Per session, its creation time as a POSIX timestamp.
        weights: The fusion weights.
    """
    n = len(session_ids)
    if n == 0:
        return []
    dense = np.asarray(similarity, dtype=np.float64)
    known = ~np.isnan(dense)
    dense_norm = np.zeros(n)
    if known.any():
        low, high = float(dense[known].min()), float(dense[known].max())
        spread = high - low
        # One candidate, or all equally similar: similarity cannot order them, so it counts fully.
        dense_norm[known] = (dense[known] - low) / spread if spread > 1e-9 else 1.0
    raw_keyword = np.array([keyword.get(sid, 0.0) for sid in session_ids], dtype=np.float64)
    best_keyword = float(raw_keyword.max())
    keyword_norm = raw_keyword / best_keyword if best_keyword > 0 else raw_keyword
    created = np.asarray(created_at, dtype=np.float64)
    age_days = (float(created.max()) - created) / _SECONDS_PER_DAY
    recency = np.power(0.5, age_days / weights.half_life_days)
    fused = weights.dense * dense_norm + (1.0 - weights.dense) * keyword_norm
    fused = (fused + weights.recency * recency) / (1.0 + weights.recency)
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
