"""BM25 over passages instead of whole sessions, for the recall bench.

Session 24, issue 19 item 3 (measured, not adopted: ``bench/README.md``); neighbours added in
session 27. ``passages=W`` takes a session's BM25 score as its best passage's plus ``W`` times
its second best, over the summary text and every 120-word transcript window (30 words overlap,
the windows :func:`~tiers.session.windows` makes, all of them), with document frequencies and
mean length over the passages of the user; ``passage_blend=B`` mixes in the whole-session
score, ``(1 - B) * passage / best passage + B * whole / best whole``;
``passage_neighbours=K`` adds the text of the K transcript windows on each side of a window to
its passage (a remark's context, without moving where passages start). The tier's view is
patched for those readers only: what is stored does not change.
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from contextlib import ExitStack
from dataclasses import dataclass, field
from unittest import mock

from tiers.backends.base import KVStore
from tiers.models import Message
from tiers.session import BM25Index, UserView, tokenize, transcript_text, windows


@dataclass(frozen=True, slots=True)
class Passages:
    """How one bench reader scores keywords by passage.

    Attributes:
        second: Weight of a session's second-best passage score added to its best.
        blend: Share of the whole-session score mixed into the passage score.
        neighbours: Transcript windows on each side whose text joins a window's passage.
    """

    second: float = 0.5
    blend: float = 0.0
    neighbours: int = 0

    @classmethod
    def pop(cls, fields: dict[str, float]) -> Passages | None:
        """The passage keys of a parsed variant, removed from ``fields`` (``None``: none set)."""
        second = fields.pop("passages", None)
        blend = fields.pop("passage_blend", 0.0)
        neighbours = int(fields.pop("passage_neighbours", 0))
        if second is None:
            if blend or neighbours:
                raise ValueError("passage_blend and passage_neighbours need passages=W")
            return None
        return cls(second, blend, neighbours)

    def patched(self, transcripts: Mapping[tuple[str, str], Sequence[Message]]) -> ExitStack:
        """A context in which the tier's views score keywords by passage."""
        keywords = PassageKeywords(transcripts, self, UserView.keywords)
        stack = ExitStack()
        # autospec keeps ``self``: the stand-in gets the view it is asked on.
        stack.enter_context(
            mock.patch.object(UserView, "keywords", autospec=True, side_effect=keywords)
        )
        return stack


def with_neighbours(pieces: Sequence[str], neighbours: int) -> list[str]:
    """Each piece joined with the ``neighbours`` pieces on each side of it (in order)."""
    if not neighbours:
        return list(pieces)
    return [
        "\n".join(pieces[max(0, n - neighbours) : n + neighbours + 1]) for n in range(len(pieces))
    ]


@dataclass(slots=True)
class PassageBM25(BM25Index):
    """BM25 over passages (doc ids ``session\\x00n``), scored per session from its best two.

    Attributes:
        second: Weight of a session's second-best passage score (its best counts twice
            when it has one passage, as the dense side does).
        blend: Share of ``whole``'s normalised score in the result.
        whole: BM25 over whole sessions, for ``blend``.
    """

    second: float = 0.5
    blend: float = 0.0
    whole: BM25Index | None = None

    def scores(self, query_tokens: Sequence[str]) -> dict[str, float]:
        """Per session, its best passage's score plus ``second`` times its second best."""
        by_session: dict[str, list[float]] = {}
        for doc_id, score in BM25Index.scores(self, query_tokens).items():
            by_session.setdefault(doc_id.partition("\x00")[0], []).append(score)
        passages: dict[str, float] = {}
        for session_id, values in by_session.items():
            values.sort(reverse=True)
            passages[session_id] = values[0] + self.second * (values[1:] or values)[0]
        if not self.blend or self.whole is None:
            return passages
        whole = self.whole.scores(query_tokens)
        best_passage = max(passages.values(), default=0.0) or 1.0
        best_whole = max(whole.values(), default=0.0) or 1.0
        return {
            sid: (1.0 - self.blend) * passages.get(sid, 0.0) / best_passage
            + self.blend * whole.get(sid, 0.0) / best_whole
            for sid in passages.keys() | whole.keys()
        }


@dataclass
class PassageKeywords:
    """A stand-in for :meth:`UserView.keywords` that scores passages (one per variant).

    Attributes:
        transcripts: Every session's messages, by ``(user_id, session_id)``.
        passages: How passages are scored.
        whole: The product's :meth:`UserView.keywords` (taken before it is patched).
    """

    transcripts: Mapping[tuple[str, str], Sequence[Message]]
    passages: Passages
    whole: Callable[[UserView, KVStore, str, str], BM25Index]
    _built: dict[tuple[str, bytes | None], PassageBM25] = field(default_factory=dict)

    def __call__(self, view: UserView, kv: KVStore, tenant: str, user_id: str) -> BM25Index:
        """The passage index of ``view`` (built once per user and revision)."""
        key = (user_id, view.revision)
        if key not in self._built:
            docs: list[tuple[str, Counter[str]]] = []
            for session_id, text in zip(view.session_ids, view.texts, strict=True):
                messages = self.transcripts.get((user_id, session_id))
                spoken = windows(transcript_text(messages)) if messages else []
                passages = windows(text) + with_neighbours(spoken, self.passages.neighbours)
                docs.extend(
                    (f"{session_id}\x00{n}", Counter(tokenize(passage)))
                    for n, passage in enumerate(passages or [""])
                )
            index = PassageBM25.from_counts(docs)
            assert isinstance(index, PassageBM25)  # from_counts builds its own class
            index.second = self.passages.second
            index.blend = self.passages.blend
            index.whole = self.whole(view, kv, tenant, user_id)
            self._built[key] = index
        return self._built[key]
