"""Facts already decoded, by their exact stored bytes (see :class:`DecodedFacts`)."""

from __future__ import annotations

import copy
import threading
from collections import OrderedDict
from collections.abc import Sequence

from tiers.cache_ages import SWEEPER, Stamps
from tiers.codec import decode
from tiers.models import UserFact


class DecodedFacts:
    """Facts already decoded, by their exact stored bytes: an LRU bounded by count and bytes.

    Validating a stored fact costs about ten times reading it, and a user's
    preferences are read far more often than they change. The key is the
    whole stored value, so a hit is the very record the store holds now: a
    change made by any process has other bytes and simply misses. Nothing
    here can be stale; it only skips re-validating identical bytes.

    Deleting means gone (invariant 8): a fact is kept by its space too, and
    :meth:`forget` drops every fact of a space, which the user tier calls
    after each commit deleting from it. A delete made by another process is
    forgotten here at this process's next listing of that user's facts
    (:meth:`decode_all` of a whole space drops what it no longer holds), or
    when the fact is evicted as the least recently used. A read in flight
    when the delete forgets the space must not keep what it read: each read
    takes :meth:`mark` before it reads the store, and a fact read before any
    later :meth:`forget` is decoded but not kept.

    Records are immutable, but a container ``value`` (a JSON object or array)
    is not: a fact holding one is always returned as a copy with its own
    value, so a caller mutating it never changes what later callers get.
    Thread-safe.

    Read or not, a fact goes once it is older than the process's cache max
    age (:mod:`tiers.cache_ages`), so one deleted elsewhere does not stay.

    Args:
        max_entries: Decoded facts kept at most.
        max_bytes: Stored bytes of the kept facts at most (a rough memory bound).
    """

    def __init__(self, max_entries: int = 16_384, max_bytes: int = 16 * 1024 * 1024) -> None:
        self._max_entries = max_entries
        self._max_bytes = max_bytes
        self._facts: OrderedDict[tuple[str, bytes], UserFact] = OrderedDict()
        # Each space's kept facts, so a delete forgets them without a pass over all.
        self._spaces: dict[str, dict[bytes, None]] = {}
        self._bytes = 0
        # Bumped by each forget: facts read before it are not kept (see mark).
        self._forgets = 0
        self._lock = threading.Lock()
        self._stamps: Stamps[tuple[str, bytes]] = Stamps()
        SWEEPER.track(self)

    def mark(self) -> int:
        """Take it before reading facts from the store, and pass it to the decode as ``read_at``."""
        return self._forgets

    def decode(self, space: str, name: str, data: bytes, *, read_at: int) -> UserFact:
        """The fact stored as ``data`` at ``name`` of ``space``, read after :meth:`mark` gave ``read_at``.

        Raises:
            CorruptRecordError: ``data`` is not a valid fact (never cached).
        """
        (fact,) = self.decode_all(space, [(name, data)], read_at=read_at)
        return fact

    def decode_all(
        self,
        space: str,
        stored: Sequence[tuple[str, bytes]],
        *,
        read_at: int,
        whole: bool = False,
    ) -> list[UserFact]:
        """The facts stored as these ``(key, data)`` pairs of ``space``, in order (one lock).

        Args:
            space: The space they were read from.
            stored: Its ``(key, data)`` pairs.
            read_at: What :meth:`mark` gave before they were read: if a
                forget came since, they may be deleted already and are not kept.
            whole: ``stored`` is all the space holds now: kept facts of the
                space it does not list are forgotten (deleted or replaced
                meanwhile, maybe by another process).

        Raises:
            CorruptRecordError: A value is not a valid fact (never cached); names its key.
        """
        with self._lock:
            found: list[UserFact | None] = []
            hits = 0
            for _, data in stored:
                at = (space, data)
                fact = self._facts.get(at)
                if fact is not None:
                    hits += 1
                    self._facts.move_to_end(at)
                found.append(fact)
            # Each hit is a kept fact of the space (a fact's bytes hold its key: no two alike), so
            # it keeps one the listing lacks only if it keeps more: the usual listing builds no set.
            if whole and len(self._spaces.get(space, ())) > hits:
                listed = {data for _, data in stored}
                for data in [d for d in self._spaces[space] if d not in listed]:
                    self._drop(space, data)
        out: list[UserFact] = []
        for (key, data), hit in zip(stored, found, strict=True):
            fact = hit
            if fact is None:
                fact = decode(UserFact, data, where=f"{space}/{key}")
                self._put(space, data, fact, read_at)
            if isinstance(fact.value, (dict, list)):
                # The kept instance never leaves: a caller gets a value of its own to mutate.
                fact = fact.model_copy(update={"value": copy.deepcopy(fact.value)})
            out.append(fact)
        return out

    def forget(self, space: str) -> None:
        """Drop every fact kept of ``space`` (after a commit that deleted from it)."""
        with self._lock:
            self._forgets += 1
            for data in list(self._spaces.get(space, ())):
                self._drop(space, data)

    def sweep(self, cutoff: float) -> None:
        """Drop every fact kept at ``cutoff`` (``time.monotonic``) or before."""
        with self._lock:
            for space, data in self._stamps.expired(cutoff):
                self._drop(space, data)

    def __len__(self) -> int:
        return len(self._facts)

    def _put(self, space: str, data: bytes, fact: UserFact, read_at: int) -> None:
        if len(data) > self._max_bytes:
            return
        if not SWEEPER.keeping:  # a max age of 0
            return
        with self._lock:
            if read_at != self._forgets or (space, data) in self._facts:
                return
            self._facts[(space, data)] = fact
            self._stamps.stamp((space, data))
            self._spaces.setdefault(space, {})[data] = None
            self._bytes += len(data)
            while len(self._facts) > self._max_entries or self._bytes > self._max_bytes:
                old_space, old = next(iter(self._facts))
                self._drop(old_space, old)

    def _drop(self, space: str, data: bytes) -> None:
        """Forget one kept fact (the caller holds the lock)."""
        if self._facts.pop((space, data), None) is None:
            return
        self._bytes -= len(data)
        self._stamps.discard((space, data))
        kept = self._spaces[space]
        del kept[data]
        if not kept:
            del self._spaces[space]


# One per process, shared by every tenant's tier: facts are kept by space (tenant and user) and
# bytes, so a tier finds only what it read from its own spaces.
SHARED = DecodedFacts()
