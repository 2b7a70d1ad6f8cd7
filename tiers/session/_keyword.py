"""Keyword relevance: a tokenizer and an Okapi BM25 index over a small set of documents.

Used by the session tier to score one user's sessions against a query by the
words they share, which finds what dense vectors miss: rare proper nouns,
numbers, product names. Everything here is pure Python and deterministic.
"""

from __future__ import annotations

import functools
import math
import re
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

__all__ = ["BM25Index", "tokenize"]

# Words of letters and digits; an inner apostrophe keeps "don't" whole (it is a stopword).
_WORD = re.compile(r"[^\W_]+(?:'[^\W_]+)*")

# Function words carry no topic: leaving them out keeps long transcripts from
# matching every query through "the", "and", "you".
_STOPWORD_TEXT = """
    a about above after again against all am an and any are aren't as at be because been
    before being below between both but by can can't cannot could couldn't did didn't do does
    doesn't doing don't down during each few for from further had hadn't has hasn't have haven't
    having he he'd he'll he's her here here's hers herself him himself his how how's i i'd i'll
    i'm i've if in into is isn't it it's its itself let's me more most mustn't my myself no nor
    not of off on once only or other ought our ours ourselves out over own same shan't she she'd
    she'll she's should shouldn't so some such than that that's the their theirs them themselves
    then there there's these they they'd they'll they're they've this those through to too under
    until up very was wasn't we we'd we'll we're we've were weren't what what's when when's where
    where's which while who who's whom why why's with won't would wouldn't you you'd you'll you're
    you've your yours yourself yourselves also just will would really yeah yes oh ok okay s t
"""
STOPWORDS: frozenset[str] = frozenset(_STOPWORD_TEXT.split())


@functools.lru_cache(maxsize=65_536)
def _stem(word: str) -> str:
    """A light plural stemmer: "cities" -> "city", "dogs" -> "dog", "glass" stays.

    Deliberately conservative: heavier stemmers conflate unrelated words in
    short chat text more often than they help. Cached: vocabularies are small.
    """
    if word.endswith("'s"):
        word = word[:-2]
    if len(word) <= 3 or not word.isalpha():
        return word
    if word.endswith("ies") and len(word) > 4:
        return word[:-3] + "y"
    if word.endswith(("sses", "shes", "ches", "xes")):
        return word[:-2]
    if word.endswith("s") and not word.endswith(("ss", "us", "is")):
        return word[:-1]
    return word


def tokenize(text: str) -> list[str]:
    """Lower-cased, stemmed content words of ``text``, in order (stopwords dropped)."""
    words = _WORD.findall(text.lower().replace("’", "'"))
    return [_stem(word) for word in words if word not in STOPWORDS]


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
