"""Storage protocols: the whole contract a backend must meet.

A :class:`KVStore` has three primitives (``get_many``, ``scan``, ``commit``);
every tier builds its logic once on top of them. Keys live in *spaces*: a
space groups the keys that are read in order or written together (one run,
one user's sessions, ...), and a backend may keep a space on one node.

A commit's spaces must share a placement (:func:`tiers.keys.placement`: a
space's tenant) on a store that shards: a Redis Cluster keeps each placement
on one primary and refuses, with :class:`~tiers.errors.InvalidInputError`
before anything is sent, a commit that spans placements. Stores on one node
accept any commit.

A :class:`VectorIndex` stores embeddings with a document and flat metadata and
answers filtered nearest-neighbour queries. An :class:`Embedder` turns texts
into unit-length vectors. The contract suite in ``tests/contracts/`` runs
against every implementation.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Final, Protocol, runtime_checkable

import numpy as np
import numpy.typing as npt

DEFAULT_MAX_VALUE_BYTES = 1 << 20


# Put and Check are built several times a commit (six a task step). The __init__ a frozen
# dataclass generates stores each field with object.__setattr__, which ends in the slot's
# descriptor; theirs call those descriptors directly (_PUT_SLOTS, _CHECK_SLOTS): the same
# object (frozen, compared and hashed as before), built in about two thirds of the time.
@dataclass(frozen=True, slots=True, init=False)
class Put:
    """Set ``key`` in ``space`` to ``value``."""

    space: str
    key: str
    value: bytes

    def __init__(self, space: str, key: str, value: bytes) -> None:
        set_space, set_key, set_value = _PUT_SLOTS
        set_space(self, space)
        set_key(self, key)
        set_value(self, value)


@dataclass(frozen=True, slots=True)
class Delete:
    """Remove ``key`` from ``space``; a missing key is not an error."""

    space: str
    key: str


@dataclass(frozen=True, slots=True)
class DeleteSpace:
    """Remove every key of ``space``; an empty space is not an error."""

    space: str


Write = Put | Delete | DeleteSpace


@dataclass(frozen=True, slots=True, init=False)
class Check:
    """A precondition of a commit: ``key`` in ``space`` holds exactly ``expected``.

    ``expected=None`` means the key must be absent.
    """

    space: str
    key: str
    expected: bytes | None

    def __init__(self, space: str, key: str, expected: bytes | None) -> None:
        set_space, set_key, set_expected = _CHECK_SLOTS
        set_space(self, space)
        set_key(self, key)
        set_expected(self, expected)


def _slot_setters(cls: type, *names: str) -> tuple[Callable[[object, object], None], ...]:
    """The ``__set__`` of each named slot of ``cls``: stores a value, bypassing ``__setattr__``."""
    return tuple(vars(cls)[name].__set__ for name in names)


_PUT_SLOTS: Final = _slot_setters(Put, "space", "key", "value")
_CHECK_SLOTS: Final = _slot_setters(Check, "space", "key", "expected")


@runtime_checkable
class KVStore(Protocol):
    """Durable bytes-in/bytes-out store of keys grouped into spaces.

    Implementations are thread-safe. Space and key are non-empty strings;
    keys sort by their UTF-8 bytes (plain code-point order for the ASCII keys
    the tiers use).
    """

    max_value_bytes: int

    def get_many(self, space: str, keys: Sequence[str]) -> list[bytes | None]:
        """Read several keys of one space.

        Returns:
            One entry per key, in order: its value, or ``None`` when absent.

        Raises:
            InvalidInputError: The space or a key is not a str of valid Unicode text.
            BackendUnavailableError: The store failed or is closed.
        """
        ...

    def scan(
        self,
        space: str,
        *,
        prefix: str = "",
        start_after: str | None = None,
        limit: int | None = None,
        reverse: bool = False,
    ) -> list[tuple[str, bytes]]:
        """List the keys of ``space`` that start with ``prefix``, sorted by key.

        Args:
            space: The space to list.
            prefix: Only keys starting with this string.
            start_after: Only keys strictly after this one in the scan's order
                (strictly before it when ``reverse``); for paging.
            limit: At most this many items (none when ``limit <= 0``); ``None`` for all.
            reverse: Descending order.

        Returns:
            ``(key, value)`` pairs. An unknown space gives an empty list.

        Raises:
            InvalidInputError: The space, prefix or start_after is not a str of
                valid Unicode text.
            BackendUnavailableError: The store failed or is closed.
        """
        ...

    def commit(self, writes: Sequence[Write], checks: Sequence[Check] = ()) -> None:
        """Apply ``writes`` atomically and durably if every check holds.

        Either all writes are applied, in order, or none. When this returns,
        the writes survive a process crash (and, on durable configurations, a
        power cut).

        Raises:
            ConflictError: A check did not hold; nothing was written.
            ValueTooLargeError: A value exceeds ``max_value_bytes``; nothing was written.
            InvalidInputError: An empty or non-text space or key, a value that is not
                ``bytes``, a check whose ``expected`` is neither bytes nor ``None``, or
                (on a store that shards) spaces of different placements; nothing was
                written.
            BackendUnavailableError: The store failed or is closed; nothing was
                acknowledged (the commit may or may not have been applied).
        """
        ...

    def ping(self) -> None:
        """Raise :class:`BackendUnavailableError` unless the store answers."""
        ...

    def close(self) -> None:
        """Release connections. Idempotent.

        Afterwards every other method raises :class:`BackendUnavailableError`.
        """
        ...


@runtime_checkable
class Flushable(Protocol):
    """A store that may acknowledge a commit before it is durable (a bounded-durability mode).

    Stores whose every commit is durable when acknowledged need not implement it.
    """

    def flush(self) -> None:
        """Block until every commit acknowledged before this call survives a power cut.

        Raises:
            BackendUnavailableError: The store is closed or the flush failed.
        """
        ...


@runtime_checkable
class Scrubbable(Protocol):
    """A store whose files may keep deleted data for a while, and that can be told to drop it.

    Deleting a key removes it from every read at once; the bytes may still
    sit in a write-ahead or append-only file until the backend compacts it.
    """

    def scrub(self) -> bool:
        """Drop deleted data from the store's files now, as far as the backend allows.

        Returns:
            True when done (or, for a server that does it in the background,
            started after every delete acknowledged before this call); False
            when the backend could not (busy, not permitted, not configured to
            keep files): deleted data may stay on disk until it compacts on its own.

        Raises:
            BackendUnavailableError: The store is closed or failed.
        """
        ...


@runtime_checkable
class ListsSpaces(Protocol):
    """A store that can list its spaces (for maintenance: encrypting a store in place)."""

    def spaces(self, *, limit: int | None = None) -> list[str]:
        """The spaces that hold at least one key, sorted; at most ``limit`` of them if given.

        Raises:
            BackendUnavailableError: The store failed or is closed.
        """
        ...


@runtime_checkable
class TokenizesKeys(Protocol):
    """A store that keeps key names opaque: an encrypted store, whose key names are not encrypted.

    A tier whose keys say something of their records' content (a fact's key
    names its subject) stores them under :meth:`key_token` when its store
    offers it, and keeps the real key inside the (encrypted) value. Stores
    that keep names readable need not implement it.
    """

    def key_token(self, space: str, key: str) -> str:
        """An opaque, stable name for ``key`` in ``space``: a keyed hash, not reversible.

        The same space and key give the same token for the life of the store
        (rotating its master key included); different keys give different
        tokens. A token starts with ``~``, which no id (:mod:`tiers.ids`)
        does, so a token is never mistaken for a readable name.

        Raises:
            InvalidInputError: ``space`` is not open to callers.
            BackendUnavailableError: The store failed or is closed.
        """
        ...


@dataclass(frozen=True, slots=True)
class VectorItem:
    """One document of a vector index."""

    id: str
    embedding: Sequence[float]
    document: str
    metadata: Mapping[str, str | int | float | bool]


@dataclass(frozen=True, slots=True)
class VectorHit:
    """One query result; ``distance`` is cosine distance (0 = same direction)."""

    id: str
    distance: float
    document: str
    metadata: Mapping[str, str | int | float | bool]


@runtime_checkable
class VectorIndex(Protocol):
    """A nearest-neighbour index over embeddings with metadata filters."""

    def upsert(self, items: Sequence[VectorItem]) -> None:
        """Insert or replace items by id, in one batch."""
        ...

    def query(
        self, embedding: Sequence[float], *, where: Mapping[str, str], top_k: int
    ) -> list[VectorHit]:
        """Return up to ``top_k`` items whose metadata equals every ``where`` entry, nearest first."""
        ...

    def get_embeddings(self, ids: Sequence[str]) -> tuple[list[str], npt.NDArray[np.float32]]:
        """The stored embeddings of the items with these ids; unknown ids are left out.

        Returns:
            The ids found, in any order, and a ``(len(found), dimension)``
            matrix of their embeddings, row ``i`` belonging to ``found[i]``.
        """
        ...

    def delete(self, ids: Sequence[str]) -> None:
        """Remove items by id; unknown ids are ignored."""
        ...

    def ids(self, *, where: Mapping[str, str]) -> list[str]:
        """Ids of every item whose metadata equals every ``where`` entry."""
        ...

    def metadata(
        self, *, where: Mapping[str, str], ids: Sequence[str] | None = None
    ) -> dict[str, dict[str, str | int | float | bool]]:
        """Id -> metadata of every item whose metadata equals every ``where`` entry.

        With ``ids``, only those items (unknown ids are left out). What a
        consistency check compares with the KV store (see :mod:`tiers.index_check`).
        """
        ...

    def ping(self) -> None:
        """Raise :class:`BackendUnavailableError` unless the index answers."""
        ...

    def close(self) -> None:
        """Release resources. Idempotent."""
        ...


@runtime_checkable
class Embedder(Protocol):
    """Turns texts into L2-normalised vectors of a fixed dimension."""

    name: str
    dimension: int

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed ``texts`` in one batch; returns one vector per text, in order."""
        ...
