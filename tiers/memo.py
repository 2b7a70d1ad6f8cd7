"""A bounded memo of a pure function of a text, kept by the text's digest, never the text.

A memo keyed by the text itself (``functools.lru_cache``) keeps a user's words
alive in the process after the user is forgotten: erasure cannot reach it
(invariant 8, deleting means gone). :class:`TextMemo` keeps a 128-bit BLAKE2b
digest of the text and the function's answer, which for the answers memoised
here (a token count, a yes/no, a label) holds nothing of the text.

Bounded in entries by two generations (as the redactor's clean strings,
:mod:`tiers.redaction._verdicts`): entries go into the young one; when it is
full it becomes the old one and the older is dropped; a hit in the old one is
copied into the young one. Each operation is a dict lookup or store, atomic
under the GIL: a race between threads at worst computes an answer twice.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from hashlib import blake2b
from typing import Generic, TypeVar

__all__ = ["TextMemo"]

T = TypeVar("T")

_MISSING = object()


class TextMemo(Generic[T]):
    """``fn(text, *args)``, memoised by the text's digest and ``args``.

    Args:
        fn: A pure function of a text (and hashable arguments).
        entries: Answers a generation keeps (at most twice this many kept).
    """

    __slots__ = ("_entries", "_fn", "_old", "_young")

    def __init__(self, fn: Callable[..., T], entries: int) -> None:
        self._fn = fn
        self._entries = entries
        self._young: dict[tuple[bytes, tuple[Hashable, ...]], T] = {}
        self._old: dict[tuple[bytes, tuple[Hashable, ...]], T] = {}

    def __call__(self, text: str, *args: Hashable) -> T:
        # str.encode, not text.encode: a str subclass's own encode could give two texts one digest.
        digest = blake2b(str.encode(text, "utf-8", "surrogatepass"), digest_size=16).digest()
        key = (digest, args)
        found = self._young.get(key, _MISSING)
        if found is not _MISSING:
            return found  # type: ignore[return-value]
        found = self._old.get(key, _MISSING)
        answer: T = self._fn(text, *args) if found is _MISSING else found  # type: ignore[assignment]
        if len(self._young) >= self._entries:
            self._old = self._young
            self._young = {}
        self._young[key] = answer
        return answer

    def __len__(self) -> int:
        return len(self._young) + len(self._old)
