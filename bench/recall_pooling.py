"""Other poolings of a session's vector cosines into its dense score, for the recall bench.

Session 25 (later), issue 19 item 3; measured, not adopted (``bench/README.md``). Today a
session's dense score is ``(best + w * second) / (1 + w)`` over the cosines of the query with
its stored vectors (the summary's, then its transcript windows'). A :class:`Pooling` replaces
:func:`tiers.session._recall.best_two_similarities` for one reader of the bench, using only the
vectors already stored (no new embedding, nothing stored changes):

- ``centroid=C``: the cosine with the session's centroid (mean of its transcript-window
  vectors, or its summary vector when it has none, re-normalised) mixed in,
  ``(1 - C) * today + C * centroid``;
- ``soft_max=T``: ``T * log(sum(exp(cosine / T)))`` over the session's vectors in place of
  best + w * second (a smooth maximum that grows with every vector near the best);
- ``smooth=K``: each transcript window's vector averaged with its K neighbours on each side
  (same session, windows only, re-normalised) before any of the above.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from unittest import mock

import numpy as np
import numpy.typing as npt

import tiers.session._recall as recall
from tiers.backends.chroma_index import ChromaVectorIndex

Similarities = tuple[npt.NDArray[np.float64], npt.NDArray[np.float64]]
_today = recall.best_two_similarities


@dataclass(frozen=True, slots=True)
class Pooling:
    """How one bench reader pools a session's cosines (every field off: today's pooling).

    Attributes:
        centroid: Share of the session centroid's cosine in the dense score.
        soft_max: Temperature of the log-sum-exp that replaces best + w * second; 0: off.
        smooth: Neighbours on each side a window vector is averaged with; 0: off.
    """

    centroid: float = 0.0
    soft_max: float = 0.0
    smooth: int = 0

    @classmethod
    def pop(cls, fields: dict[str, float]) -> Pooling | None:
        """The pooling keys of a parsed variant, removed from ``fields`` (``None``: none set)."""
        pooling = cls(
            centroid=fields.pop("centroid", 0.0),
            soft_max=fields.pop("soft_max", 0.0),
            smooth=int(fields.pop("smooth", 0)),
        )
        return None if pooling == cls() else pooling

    def patched(self) -> ExitStack:
        """A context in which the tier ranks by this pooling (rows read in id order)."""
        stack = ExitStack()
        stack.enter_context(
            mock.patch.object(
                ChromaVectorIndex,
                "get_embeddings",
                autospec=True,
                side_effect=_in_request_order(ChromaVectorIndex.get_embeddings),
            )
        )
        stack.enter_context(mock.patch.object(recall, "best_two_similarities", self.similarities))
        return stack

    def similarities(
        self,
        sessions: int,
        vectors: npt.NDArray[np.float32],
        owner: npt.NDArray[np.intp],
        query_vector: Sequence[float],
    ) -> Similarities:
        """``(best, second)`` as :func:`~tiers.session._recall.fuse` takes them, pooled.

        Rows must be grouped by session, its summary vector first (as the view asks for
        them, which :meth:`patched` keeps).
        """
        query = np.asarray(query_vector, dtype=np.float32)
        first = np.ones(len(owner), dtype=bool)
        first[1:] = owner[1:] != owner[:-1]
        rows = _smoothed(vectors, owner, ~first, self.smooth) if self.smooth else vectors
        best, second = _today(sessions, rows, owner, query_vector)
        if self.soft_max:
            cosines = (rows @ query).astype(np.float64)
            sums = np.zeros(sessions)
            np.add.at(sums, owner, np.exp((cosines - best[owner]) / self.soft_max))
            known = sums > 0
            best[known] += self.soft_max * np.log(sums[known])
            second = np.full(sessions, np.nan)
        if self.centroid:
            # Blending best and second alike blends fuse's (best + w * second) / (1 + w).
            centroid = _centroids(sessions, rows, owner, ~first) @ query
            second = np.where(np.isnan(second), best, second)
            best = (1.0 - self.centroid) * best + self.centroid * centroid
            second = (1.0 - self.centroid) * second + self.centroid * centroid
        return best, second


def _in_request_order(
    original: Callable[
        [ChromaVectorIndex, Sequence[str]], tuple[list[str], npt.NDArray[np.float32]]
    ],
) -> Callable[[ChromaVectorIndex, Sequence[str]], tuple[list[str], npt.NDArray[np.float32]]]:
    def get(
        index: ChromaVectorIndex, ids: Sequence[str]
    ) -> tuple[list[str], npt.NDArray[np.float32]]:
        found, matrix = original(index, ids)
        place = {vector_id: n for n, vector_id in enumerate(ids)}
        order = sorted(range(len(found)), key=lambda i: place[found[i]])
        return [found[i] for i in order], matrix[order]

    return get


def _smoothed(
    vectors: npt.NDArray[np.float32],
    owner: npt.NDArray[np.intp],
    window: npt.NDArray[np.bool_],
    neighbours: int,
) -> npt.NDArray[np.float32]:
    """Each window row averaged with its ``neighbours`` on each side of the same session."""
    sums = vectors.astype(np.float64)
    positions = np.arange(len(owner))
    for step in range(1, neighbours + 1):
        for offset in (step, -step):
            other = np.clip(positions + offset, 0, len(owner) - 1)
            inside = (positions + offset == other) & window & window[other]
            inside &= owner[other] == owner
            sums[inside] += vectors[other[inside]]
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    return (sums / np.where(norms > 0, norms, 1.0)).astype(np.float32)


def _centroids(
    sessions: int,
    vectors: npt.NDArray[np.float32],
    owner: npt.NDArray[np.intp],
    window: npt.NDArray[np.bool_],
) -> npt.NDArray[np.float32]:
    """Per session, its windows' mean vector (its summary's without windows), unit length."""
    sums = np.zeros((sessions, vectors.shape[1]))
    np.add.at(sums, owner[window], vectors[window])
    bare = ~np.isin(np.arange(sessions), owner[window])
    np.add.at(sums, owner[~window & bare[owner]], vectors[~window & bare[owner]])
    norms = np.linalg.norm(sums, axis=1, keepdims=True)
    return (sums / np.where(norms > 0, norms, 1.0)).astype(np.float32)
