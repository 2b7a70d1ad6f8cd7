"""Facts already decoded, by their exact stored bytes (see :class:`DecodedFacts`)."""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Sequence

from tiers.codec import decode
from tiers.models import UserFact


class DecodedFacts:
    """Facts already decoded, by their exact stored bytes: an LRU bounded by count and bytes.

    Validating a stored fact costs about ten times reading it, and a user's
    preferences are read far more often than they change. The key is the
    whole stored value, so a hit is the very record the store holds now: a
    change made by any process has other bytes and simply misses. Nothing
    here can be stale; it only skips re-validating identical bytes.

    Records are immutable, but a container ``value`` (a JSON object or array)
    is not: a fact holding one is always returned as a copy with its own
    value, so a caller mutating it never changes what later callers get.
    Thread-safe.

    Args:
        max_entries: Decoded facts kept at most.
        max_bytes: Stored bytes of the kept facts at most (a rough memory bound).
    """

    def __init__(self, max_entries: int = 16_384, max_bytes: int = 16 * 1024 * 1024) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._facts: OrderedDict[bytes, UserFact] = OrderedDict()
        self._bytes = 0
        self._lock = threading.Lock()

    def decode(self, data: bytes, *, where: str) -> UserFact:
        """The fact stored as ``data``.

        Raises:
            CorruptRecordError: ``data`` is not a valid fact (never cached).
        """
        space, _, key = where.rpartition("/")
        (fact,) = self.decode_all(space, [(key, data)])
        return fact

    def decode_all(self, space: str, stored: Sequence[tuple[str, bytes]]) -> list[UserFact]:
        """The facts stored as these ``(key, data)`` pairs of ``space``, in order (one lock).

        Raises:
            CorruptRecordError: A value is not a valid fact (never cached); names its key.
        """
        with self._lock:
            found = [self._facts.get(data) for _, data in stored]
            for (_, data), fact in zip(stored, found, strict=True):
                if fact is not None:
                    self._facts.move_to_end(data)
        out: list[UserFact] = []
        for (key, data), hit in zip(stored, found, strict=True):
            fact = hit
            if fact is None:
                fact = decode(UserFact, data, where=f"{space}/{key}")
                self._put(data, fact)
            if isinstance(fact.value, (dict, list)):
                # The kept instance never leaves: a caller gets a value of its own to mutate.
                fact = fact.model_copy(update={"value": copy.deepcopy(fact.value)})
            out.append(fact)
        return out

    def __len__(self) -> int:
        return len(self._facts)

    def _put(self, data: bytes, fact: UserFact) -> None:
        if len(data) > self._max_bytes:
            return
        with self._lock:
            if data in self._facts:
                return
            self._facts[data] = fact
            self._bytes += len(data)
            while len(self._facts) > self._max_entries or self._bytes > self._max_bytes:
                old, _ = self._facts.popitem(last=False)
                self._bytes -= len(old)


# One per process, shared by every tenant's tier: equal bytes decode to an equal fact,
# whoever reads them (the bytes hold the user id and key), so sharing leaks nothing.
SHARED = DecodedFacts()
