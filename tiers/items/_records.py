"""The records of the item store and the pure helpers every part of it shares."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from urllib.parse import unquote

import numpy as np
from pydantic import JsonValue

from tiers import keys
from tiers.backends.base import Embedder, KVStore
from tiers.codec import decode
from tiers.errors import InvalidInputError
from tiers.models import Record, UtcDatetime

Namespace = tuple[str, ...]
NamespacePattern = Sequence[str | None]
"""A namespace pattern for :meth:`ItemStore.namespaces`: ``None`` matches any one label."""

ITEM_FACT_SOURCE = "item-store"
"""``source`` of the facts :meth:`ItemStore.user_facts` derives from a user's items."""

_FACT_UNSAFE = re.compile(r"[^A-Za-z0-9._@+\-]+")


class ItemRecord(Record):
    """One stored item (the KV record; vectors are stored beside it)."""

    namespace: tuple[str, ...]
    key: str
    value: dict[str, JsonValue]
    created_at: UtcDatetime
    updated_at: UtcDatetime
    expires_at: UtcDatetime | None = None
    ttl_minutes: float | None = None
    user_id: str | None = None
    model: str | None = None
    vectors: int = 0


@dataclass(frozen=True, slots=True)
class StoredItem:
    """An item as read: its value is the caller's own copy.

    Attributes:
        score: Cosine similarity to the query (vector search only).
    """

    namespace: Namespace
    key: str
    value: dict[str, JsonValue]
    created_at: datetime
    updated_at: datetime
    expires_at: datetime | None
    user_id: str | None
    score: float | None = None


@dataclass(frozen=True, slots=True)
class ItemWrite:
    """Put (``value`` a JSON object) or delete (``value=None``) one item.

    Attributes:
        namespace: Non-empty tuple of labels (any strings).
        key: The item's key within its namespace (any string).
        value: The JSON object to store, or ``None`` to delete the item.
        vectors: Embeddings to search the item by (none: not searchable by vector).
        model: Name of the embedder that made ``vectors``; a search only
            compares vectors of the same model.
        ttl_minutes: Expire this many minutes after the write (and after each
            read that refreshes it); ``None``: never.
        user_id: The user the item belongs to: deleted by
            :meth:`ItemStore.delete_user` and part of the user's facts.
    """

    namespace: Namespace
    key: str
    value: Mapping[str, object] | None
    vectors: Sequence[Sequence[float]] = ()
    model: str | None = None
    ttl_minutes: float | None = None
    user_id: str | None = None


@dataclass(frozen=True, slots=True)
class ItemSpaces:
    """Where one tenant's items live in the KV store, and how a stored record is read.

    Attributes:
        kv: The authoritative store.
        tenant: The tenant every space belongs to.
        items: One record per item (see :mod:`tiers.items`).
        vectors: The items' embeddings, authoritative.
        outbox: Items whose vectors the index may not reflect yet.
        namespaces: The namespaces that hold items, each with a write token.
        expiry: Items with a TTL by expiry time.
    """

    kv: KVStore
    tenant: str
    items: str
    vectors: str
    outbox: str
    namespaces: str
    expiry: str

    @classmethod
    def of(cls, kv: KVStore, tenant: str) -> ItemSpaces:
        """The spaces of ``tenant``'s items in ``kv``."""
        return cls(
            kv,
            tenant,
            items=keys.items_space(tenant),
            vectors=keys.item_vectors_space(tenant),
            outbox=keys.item_outbox_space(tenant),
            namespaces=keys.item_namespaces_space(tenant),
            expiry=keys.item_expiry_space(tenant),
        )

    def decode(self, address: str, data: bytes) -> ItemRecord:
        """The item record stored at ``address``."""
        return decode(ItemRecord, data, where=f"{self.items}/{address}")


def check_vectors(vectors: object, field: str, embedder: Embedder) -> list[bytes]:
    """``vectors`` as little-endian float32 bytes, each checked against ``embedder``'s dimension."""
    if isinstance(vectors, str | bytes) or not isinstance(vectors, Sequence):
        raise InvalidInputError(f"{field} must be a sequence of vectors", field=field)
    out: list[bytes] = []
    for vector in vectors:
        try:
            array = np.asarray(vector, dtype=np.float64)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"{field} must hold sequences of numbers", field=field) from exc
        if array.ndim != 1 or array.shape[0] != embedder.dimension:
            raise InvalidInputError(
                f"{field} must hold vectors of {embedder.dimension} numbers (the vector index's "
                f"dimension, set by embedder {embedder.name!r}), got shape "
                f"{array.shape}",
                field=field,
            )
        if not np.all(np.isfinite(array)):
            raise InvalidInputError(f"{field} holds NaN or infinity", field=field)
        out.append(array.astype("<f4").tobytes())
    return out


def stored_item(record: ItemRecord, *, score: float | None = None) -> StoredItem:
    """The item as read from its record (``score``: from a vector search)."""
    return StoredItem(
        namespace=tuple(record.namespace),
        key=record.key,
        value=record.value,
        created_at=record.created_at,
        updated_at=record.updated_at,
        expires_at=record.expires_at,
        user_id=record.user_id,
        score=score,
    )


def is_expired(record: ItemRecord, now: datetime) -> bool:
    """Whether ``record`` has expired at ``now`` (then every read treats it as absent)."""
    return record.expires_at is not None and record.expires_at <= now


def micros(when: datetime) -> int:
    """``when`` in microseconds since the epoch (the expiry index's time)."""
    return int(when.timestamp() * 1_000_000)


def namespace_code(namespace: Namespace) -> str:
    """The code of ``namespace`` in keys (see :func:`tiers.keys.item_namespace_code`)."""
    return keys.item_namespace_code(namespace)


def decode_namespace(code: str) -> Namespace:
    """The namespace whose code is ``code``."""
    return tuple(unquote(part) for part in code.split("/")[:-1])


def fact_key(key: str) -> str:
    """An item key mapped onto the id alphabet, as the key of a user fact."""
    text = _FACT_UNSAFE.sub("_", key)
    text = re.sub(r"^[^A-Za-z0-9]+", "", text)[:128]
    return text or "item"
