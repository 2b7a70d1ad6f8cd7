"""The words keyword search matches on: a tokenizer (stopwords dropped, plurals folded).

Recall's BM25 scoring over these tokens is in :mod:`tiers.session._recall`;
the per-user term counts it scores are built and cached by
:mod:`tiers.session._view`. Everything here is pure Python and deterministic.
"""

from __future__ import annotations

import functools
import re
from collections import Counter

from tiers.cache_ages import SWEEPER, ClearedMemo

__all__ = ["term_counts", "tokenize"]

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
    Called only for words it may change (letters, or a possessive): a number
    or code ("4111...", "ab12cd") is its own stem, and memoised it would
    outlive its deletion in memory. The memo is cleared whole past the
    process's cache max age (:mod:`tiers.cache_ages`).
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


_STEMS_SWEPT = ClearedMemo(_stem.cache_clear)
SWEEPER.track(_STEMS_SWEPT)


def tokenize(text: str) -> list[str]:
    """Lower-cased, stemmed content words of ``text``, in order (stopwords dropped)."""
    words = _WORD.findall(text.lower().replace("’", "'"))
    return [
        _stem(word) if word.isalpha() or "'" in word else word
        for word in words
        if word not in STOPWORDS
    ]


def term_counts(text: str) -> Counter[str]:
    """How often each token of :func:`tokenize` occurs in ``text`` (the same counts, faster).

    Long transcripts repeat their words many times: counting the raw words
    first and stemming each distinct word once makes this several times
    cheaper than counting the token list.
    """
    counts: Counter[str] = Counter()
    for word, n in Counter(_WORD.findall(text.lower().replace("’", "'"))).items():
        if word not in STOPWORDS:
            counts[_stem(word) if word.isalpha() or "'" in word else word] += n
    return counts
