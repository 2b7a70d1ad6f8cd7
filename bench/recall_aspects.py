"""Query decomposition for the recall bench: a question's aspects scored apart (session 26).

Issue 19 item 3; measured, not adopted (``bench/README.md``). "How many days had passed
between the Hindu festival of Holi and the Sunday mass at St. Mary's Church?" names two
events, told in two sessions; one vector and one BM25 match over the whole question may rank
the session of the more salient event high and the other low. :func:`query_aspects` cuts a
question at its connectives ("between X and Y", "X or Y", "since X when Y", "before",
"after", "than", commas; its time expressions taken out first) and keeps the parts that
still name something: a content word outside the question's frame ("how many days had
passed") and not a bare number. A question with fewer than two such parts has none.

An :class:`AspectMode` makes one bench reader rank with them, nothing stored changed:
each aspect is embedded (the product would batch them with the query in one model call:
measured +5 ms p50 for two aspects), every session is scored against it alone with today's
fusion of dense and BM25 (no priors), and

- ``aspects=W``: the session's fused score becomes ``(whole + W * best aspect) / (1 + W)``;
- ``cover=1``: then each aspect's best session not already in the first ``1 + aspects``
  places moves up, right after the first place (a coverage pick);
- ``no_and=1``: ``and`` does not split (only clause connectives, ``or`` and commas), so
  "Audrey and Andrew" stays one part;
- ``aspect_common=S``: an aspect counts only with a word in at most a share ``S`` of the
  user's sessions (default 0.5; 1: every aspect): "Andrew" in Andrew's chats tells none apart.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from contextlib import ExitStack
from dataclasses import dataclass
from datetime import datetime
from typing import Any
from unittest import mock

import numpy as np

import tiers.session._reads as reads
import tiers.session._recall as recall
from tiers.backends.base import Embedder
from tiers.session import BM25Index, FusionWeights, tokenize
from tiers.session._recall import Ranked
from tiers.session._temporal import parse_query

# A bound on the extra texts embedded per query.
MAX_ASPECTS = 4

_CONNECTIVES = r"between|since|when|while|before|after|than|versus|vs\.?|compared\s+(?:to|with)"
_SPLIT = re.compile(rf"\s*[,;]\s*|\s+[-–—]\s+|\s+(?:and|or|{_CONNECTIVES})\s+", re.IGNORECASE)
_SPLIT_NO_AND = re.compile(rf"\s*[,;]\s*|\s+[-–—]\s+|\s+(?:or|{_CONNECTIVES})\s+", re.IGNORECASE)

# The frame of a question about events ("how many days had passed", "which happened first"):
# these words name no event, so a part made only of them is not an aspect.
_FRAME = frozenset(
    tokenize(
        """
        many much long day days week weeks month months year years hour hours minute minutes
        time times passed pass happened happen first second third earlier later latest earliest
        event events total number order difference count take took taken ago recently recent
        which thing things
        """
    )
)


def aspect_words(part: str) -> list[str]:
    """The words of one part of a query that name its event: no frame words, no bare numbers."""
    return [word for word in tokenize(part) if word not in _FRAME and not word.isdigit()]


def query_aspects(query: str, now: datetime, *, split_and: bool = True) -> list[str]:
    """The parts of ``query`` that each name an event or thing, or ``[]`` if it names one.

    Args:
        query: The recall query.
        now: When it is asked (time expressions are told apart relative to it).
        split_and: Also split at ``and``.

    Returns:
        Two to :data:`MAX_ASPECTS` distinct parts, in the query's order; ``[]`` when
        fewer than two parts name something.
    """
    aspects: list[str] = []
    seen: set[tuple[str, ...]] = set()
    # Time expressions go first: the comma of "October 24, 2023" joins no events, and the
    # date prior already ranks by the query's dates.
    undated = parse_query(query, now).rest.strip().rstrip("?.!")
    for part in (_SPLIT if split_and else _SPLIT_NO_AND).split(undated):
        words = tuple(aspect_words(part))
        if words and words not in seen:
            seen.add(words)
            aspects.append(" ".join(part.split()))
    return aspects[:MAX_ASPECTS] if len(aspects) >= 2 else []


@dataclass(frozen=True, slots=True)
class AspectMode:
    """How one bench reader uses a query's aspects (see the module docstring).

    Attributes:
        weight: Weight of a session's best aspect relevance against the whole query's score.
        cover: Move each aspect's best session into the top places.
        no_and: Do not split a query at ``and``.
        common: An aspect needs a word in at most this share of the user's sessions.
    """

    weight: float = 0.0
    cover: bool = False
    no_and: bool = False
    common: float = 0.5

    @classmethod
    def pop(cls, fields: dict[str, float]) -> AspectMode | None:
        """The aspect keys of a parsed variant, removed from ``fields`` (``None``: none set)."""
        keys = ("aspects", "cover", "no_and", "aspect_common")
        if not any(key in fields for key in keys):
            return None
        return cls(
            weight=fields.pop("aspects", 0.0),
            cover=bool(fields.pop("cover", 0)),
            no_and=bool(fields.pop("no_and", 0)),
            common=fields.pop("aspect_common", 0.5),
        )

    def patched(self, embedder: Embedder) -> ExitStack:
        """A context in which the tier's recall ranks with the aspects (embedded by ``embedder``)."""
        stack = ExitStack()
        stack.enter_context(mock.patch.object(reads, "rank", _AspectRank(self, embedder)))
        return stack


@dataclass(frozen=True, slots=True)
class _AspectRank:
    """A stand-in for :func:`tiers.session._recall.rank` that also scores the query's aspects."""

    mode: AspectMode
    embedder: Embedder

    def __call__(self, session_ids: Sequence[str], **kwargs: Any) -> list[Ranked]:
        ranked = recall.rank(session_ids, **kwargs)
        keywords: BM25Index = kwargs["keywords"]
        aspects = [
            text
            for text in query_aspects(
                kwargs["query"], kwargs["now"], split_and=not self.mode.no_and
            )
            if any(_share(keywords, word) <= self.mode.common for word in aspect_words(text))
        ]
        if len(aspects) < 2 or len(ranked) < 2:
            return ranked
        relevance = self._relevance(session_ids, aspects, kwargs)
        best = np.max(np.stack(relevance), axis=0)
        if self.mode.weight > 0.0:
            created = dict(zip(session_ids, kwargs["created_at"], strict=True))
            fit = dict(zip(session_ids, best, strict=True))
            w = self.mode.weight
            rescored = [
                Ranked(
                    hit.session_id,
                    (hit.score + w * float(fit[hit.session_id])) / (1.0 + w),
                    hit.similarity,
                    hit.keyword,
                )
                for hit in ranked
            ]
            ranked = sorted(
                rescored, key=lambda h: (-h.score, -float(created[h.session_id]), h.session_id)
            )
        if self.mode.cover:
            ranked = _cover(ranked, [session_ids[int(np.argmax(r))] for r in relevance])
        return ranked

    def _relevance(
        self, session_ids: Sequence[str], aspects: list[str], kwargs: dict[str, Any]
    ) -> list[np.ndarray[Any, np.dtype[np.float64]]]:
        """Per aspect, every session's dense + BM25 fusion against it alone, in [0, 1]."""
        weights: FusionWeights = kwargs["weights"]
        alone = FusionWeights(
            dense=weights.dense, newer=0.0, dates=0.0, second_window=weights.second_window
        )
        position = {sid: n for n, sid in enumerate(session_ids)}
        out = []
        for text, vector in zip(aspects, self.embedder.embed(aspects), strict=True):
            best, second = recall.best_two_similarities(
                len(session_ids), kwargs["vectors"], kwargs["owner"], vector
            )
            fused = recall.fuse(
                session_ids,
                similarity=best,
                second=second,
                keyword=kwargs["keywords"].scores(aspect_words(text)),
                created_at=kwargs["created_at"],
                weights=alone,
            )
            scores = np.zeros(len(session_ids))
            for hit in fused:
                scores[position[hit.session_id]] = hit.score
            out.append(scores)
        return out


def _share(keywords: BM25Index, word: str) -> float:
    """The share of the user's sessions whose text holds ``word``."""
    return len(keywords.scores([word])) / max(1, len(keywords))


def _cover(ranked: list[Ranked], bests: list[str]) -> list[Ranked]:
    """``ranked`` with each aspect's best session moved up right after the first place."""
    top = {hit.session_id for hit in ranked[: 1 + len(bests)]}
    by_id = {hit.session_id: hit for hit in ranked}
    promoted = [by_id[sid] for sid in dict.fromkeys(bests) if sid not in top]
    moved = {hit.session_id for hit in promoted}
    return [ranked[0], *promoted, *(hit for hit in ranked[1:] if hit.session_id not in moved)]
