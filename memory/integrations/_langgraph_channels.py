"""How :class:`~memory.integrations.langgraph.TiermemSaver` turns channel values into stored
blobs and back, with no I/O: a list channel that grew by appending is stored as its tail
relative to the newest version this process stored or read (kept in a bounded cache), and a
read of that very version is served from the cache. The cache's lists are swept past the
process's cache max age (:mod:`tiers.cache_ages`): after that the next put stores the list whole.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from langgraph.checkpoint.base import ChannelVersions
from langgraph.checkpoint.serde.base import SerializerProtocol

from tiers.cache_ages import SWEEPER, Stamps
from tiers.errors import InvalidInputError
from tiers.threads import Blob

_FULL = b"F"
_TAIL = b"T"


def typed(pair: tuple[str, bytes]) -> bytes:
    kind, data = pair
    return kind.encode() + b"\x00" + bytes(data)


def untyped(data: bytes) -> tuple[str, bytes]:
    kind, _, rest = data.partition(b"\x00")
    return kind.decode(), rest


def dumps(serde: SerializerProtocol, value: Any) -> bytes:
    """``value`` serialized with its type tag."""
    return typed(serde.dumps_typed(value))


def loads(serde: SerializerProtocol, data: bytes) -> Any:
    """The value :func:`dumps` stored as ``data``."""
    return serde.loads_typed(untyped(data))


def _contents(items: Sequence[Any]) -> tuple[Any, ...]:
    """A snapshot of what a list's elements hold: each element's type and attribute values, flat.

    Comparing two snapshots with ``==`` runs in C (identity first, then
    equality) and tells whether elements still hold what was stored: an
    element whose attribute was reassigned in place compares unequal.
    """
    out: list[Any] = []
    for item in items:
        attrs = getattr(item, "__dict__", None)
        if attrs is None:
            out.append(item.copy() if isinstance(item, dict) else item)
        else:
            out.append(type(item))
            out.extend(attrs.values())
    return tuple(out)


def _equal(a: tuple[Any, ...], b: tuple[Any, ...]) -> bool:
    try:
        return bool(a == b)
    except (TypeError, ValueError):  # elements whose == is not a bool (arrays)
        return False


@dataclass
class _ListState:
    """The newest stored version of a list channel, as this process stored or read it.

    A later version that only appended to it is stored as the tail; a read of
    this very version is served from ``items`` (a shallow copy) without
    decoding, when its elements still hold what was stored.
    """

    version: str
    items: list[Any]
    contents: tuple[Any, ...]
    chain: list[str]

    def tail_of(self, value: list[Any]) -> tuple[list[Any], tuple[Any, ...]] | None:
        """The items ``value`` appended to this version, and the new version's snapshot."""
        length = len(self.items)
        if len(value) < length:
            return None
        head = _contents(value[:length])
        if not _equal(head, self.contents):
            return None
        tail = value[length:]
        return tail, head + _contents(tail)

    def intact(self) -> list[Any] | None:
        """A copy of the stored value, or ``None`` if an element was changed in place since."""
        if not _equal(_contents(self.items), self.contents):
            return None
        return list(self.items)


def _state_of(version: str, value: list[Any], chain: list[str]) -> _ListState:
    return _ListState(version, list(value), _contents(value), chain)


class _Lists(OrderedDict[tuple[str, str, str], _ListState]):
    """The newest list-channel states, least recently used dropped first past a budget of elements."""

    def __init__(self, budget: int) -> None:
        super().__init__()
        self.budget = budget
        self.size = 0
        self.stamps: Stamps[tuple[str, str, str]] = Stamps()

    def remember(self, key: tuple[str, str, str], state: _ListState) -> None:
        self.forget(key)
        self[key] = state
        self.stamps.stamp(key)
        self.size += len(state.items)
        while self.size > self.budget and self:
            self.forget(next(iter(self)))

    def forget(self, key: tuple[str, str, str]) -> None:
        old = self.pop(key, None)
        if old is not None:
            self.size -= len(old.items)
            self.stamps.discard(key)


class ChannelCodec:
    """Channel values to :class:`~tiers.threads.Blob` s and back, with the list-channel cache.

    The saver's serializer is passed to each call, not kept: a clone of the saver
    (``with_allowlist``) shares this codec but has a serializer of its own.

    Args:
        delta: Store a list channel that grew by appending as its new tail.
        delta_every: Store a list whole at least every this many versions.
        cache_items: Budget of list elements kept in the cache, over all threads.
        lock: The saver's lock, which guards the cache with the saver's own views.
    """

    def __init__(
        self,
        *,
        delta: bool,
        delta_every: int,
        cache_items: int,
        lock: threading.Lock,
    ) -> None:
        self.delta = delta
        self._delta_every = delta_every
        self._lock = lock
        # (thread, ns, channel) -> the newest stored version of a list channel.
        self.lists = _Lists(cache_items)
        SWEEPER.track(self)

    def sweep(self, cutoff: float) -> None:
        """Drop the lists cached at ``cutoff`` (``time.monotonic``) or before."""
        with self._lock:
            for key in self.lists.stamps.expired(cutoff):
                self.lists.forget(key)

    def cached(self, thread_id: str, ns: str, channel: str, version: str) -> list[Any] | None:
        """A copy of this version of a list channel from the cache, if it holds it intact."""
        with self._lock:
            state = self.lists.get((thread_id, ns, channel))
        return state.intact() if state is not None and state.version == version else None

    def remember(self, thread_id: str, ns: str, states: dict[str, _ListState | None]) -> None:
        """Cache the list states :meth:`encode` returned (the caller holds the lock)."""
        for channel, state in states.items():
            if state is None or not SWEEPER.keeping:
                self.lists.forget((thread_id, ns, channel))
            else:
                self.lists.remember((thread_id, ns, channel), state)

    def forget(self, match: Callable[[tuple[str, ...]], bool]) -> None:
        """Drop the cached lists whose (thread, ns, channel) ``match`` (the caller holds the lock)."""
        for key in [k for k in self.lists if match(k)]:
            self.lists.forget(key)

    def assemble(
        self,
        serde: SerializerProtocol,
        thread_id: str,
        ns: str,
        channel: str,
        chain: Sequence[tuple[str, bytes]],
        *,
        cache: bool,
    ) -> Any:
        """A channel's value from its stored chain: a whole value, then tails appended to it."""
        first_version, first = chain[0]
        if first[:1] != _FULL:
            raise InvalidInputError(
                f"stored value of channel {channel!r} at version {first_version!r} does not "
                "start from a whole value",
                field="channel_values",
            )
        value = loads(serde, first[1:])
        for _, data in chain[1:]:
            value = value + loads(serde, data[1:])
        if cache and self.delta and isinstance(value, list) and SWEEPER.keeping:
            with self._lock:
                self.lists.remember(
                    (thread_id, ns, channel),
                    _state_of(chain[-1][0], value, [v for v, _ in chain]),
                )
        return value

    def encode(
        self,
        serde: SerializerProtocol,
        thread_id: str,
        ns: str,
        values: dict[str, Any],
        new_versions: ChannelVersions,
        use_delta: bool,
    ) -> tuple[dict[tuple[str, str], Blob], dict[str, _ListState | None]]:
        """The blobs of the channels ``new_versions`` names, and each list channel's new state.

        A list that only appended to the cached version is stored as its tail when
        ``use_delta``; anything else whole. A ``None`` state drops the channel from the
        cache (:meth:`remember`).
        """
        blobs: dict[tuple[str, str], Blob] = {}
        states: dict[str, _ListState | None] = {}
        for channel, raw_version in new_versions.items():
            if channel not in values:
                continue  # empty at this version: nothing to store
            version = str(raw_version)
            value = values[channel]
            if not isinstance(value, list):
                blobs[(channel, version)] = Blob(_FULL + dumps(serde, value))
                states[channel] = None
                continue
            with self._lock:
                last = self.lists.get((thread_id, ns, channel)) if use_delta else None
            found = None
            if last is not None and len(last.chain) < self._delta_every:
                found = last.tail_of(value)
            if last is None or found is None:
                blobs[(channel, version)] = Blob(_FULL + dumps(serde, value))
                states[channel] = _state_of(version, value, [version]) if self.delta else None
            else:
                tail, contents = found
                data = _TAIL + dumps(serde, tail)
                blobs[(channel, version)] = Blob(data, tuple(last.chain))
                states[channel] = _ListState(version, list(value), contents, [*last.chain, version])
        return blobs, states
