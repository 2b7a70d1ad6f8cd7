"""How a session's several vectors make its dense score: the best, blended with the second best.

Constructed sessions, the real MiniLM embedder; ranking is called directly so
each session's vectors are exactly the passages written here.
"""

from __future__ import annotations

import math
from datetime import UTC, datetime

import numpy as np
import pytest

from tiers.backends.embedders import MiniLMEmbedder
from tiers.session import BM25Index, FusionWeights
from tiers.session._recall import best_similarity, best_two_similarities, rank

QUERY = "How is Maya getting on with learning the cello?"

# One passage answers the query well; the rest of the session is about something else.
ONE_PASSAGE = [
    "Planning the garden beds for spring and ordering seeds.",
    "Maya said her cello lessons are going well and she practises every evening.",
    "We compared prices for a new lawn mower and a hedge trimmer.",
]
# No single passage matches quite as well, but the whole session is about the subject.
WHOLE_SESSION = [
    "Maya has started taking music lessons on a string instrument.",
    "Maya keeps practising the cello pieces from her lessons.",
    "Her teacher thinks Maya is making good progress on the instrument.",
]


def test_best_two_similarities_per_session() -> None:
    vectors = np.array([[1.0, 0.0], [0.6, 0.8], [0.0, 1.0], [0.8, 0.6], [0.0, -1.0]], np.float32)
    # Session 0 has three vectors, session 1 one, session 2 none, session 3 one (negative).
    owner = np.array([0, 0, 1, 0, 3], dtype=np.intp)
    best, second = best_two_similarities(4, vectors, owner, [1.0, 0.0])
    assert best[0] == pytest.approx(1.0)
    assert second[0] == pytest.approx(0.8)
    assert best[1] == pytest.approx(0.0)
    assert math.isnan(second[1])  # one vector: no second best
    assert math.isnan(best[2])
    assert math.isnan(second[2])
    assert best[3] == pytest.approx(0.0)
    assert math.isnan(second[3])
    assert np.array_equal(best_similarity(4, vectors, owner, [1.0, 0.0]), best, equal_nan=True)
    empty_best, empty_second = best_two_similarities(
        2, np.zeros((0, 2), np.float32), np.zeros(0, np.intp), [1.0, 0.0]
    )
    assert np.isnan(empty_best).all()
    assert np.isnan(empty_second).all()


def ranked_ids(embedder: MiniLMEmbedder, weights: FusionWeights) -> list[tuple[str, float]]:
    """The two constructed sessions ranked against QUERY: (session id, reported similarity)."""
    vectors = np.array(embedder.embed(ONE_PASSAGE + WHOLE_SESSION), dtype=np.float32)
    owner = np.array([0] * len(ONE_PASSAGE) + [1] * len(WHOLE_SESSION), dtype=np.intp)
    ranked = rank(
        ["one-passage", "whole-session"],
        created_at=np.zeros(2),
        vectors=vectors,
        owner=owner,
        query_vector=embedder.embed([QUERY])[0],
        # No keyword index: the order is the dense score's alone.
        keywords=BM25Index.build([]),
        query=QUERY,
        weights=weights,
        now=datetime(2025, 1, 1, tzinfo=UTC),
    )
    return [(hit.session_id, hit.similarity or math.nan) for hit in ranked]


def test_a_session_that_keeps_to_the_subject_outranks_one_good_passage(
    embedder: MiniLMEmbedder, no_network: None
) -> None:
    best_only = ranked_ids(embedder, FusionWeights(second_window=0.0))
    # The single passage is the closest match of all ...
    assert [sid for sid, _ in best_only] == ["one-passage", "whole-session"]
    blended = ranked_ids(embedder, FusionWeights())
    # ... but by default the second-best passage counts too, and only one session has one.
    assert [sid for sid, _ in blended] == ["whole-session", "one-passage"]
    # The reported similarity stays the best cosine, whatever the ranking blends.
    assert dict(blended) == pytest.approx(dict(best_only))
    assert dict(blended)["one-passage"] > dict(blended)["whole-session"]


def test_second_window_weight_is_checked() -> None:
    with pytest.raises(ValueError, match="second_window"):
        FusionWeights(second_window=-0.1)
