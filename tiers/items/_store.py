"""The item store: one tenant's namespaced items, composed of its write path, search, TTL
sweep and index outbox (see :mod:`tiers.items`)."""

from __future__ import annotations

import threading
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import JsonValue

from tiers import keys
from tiers.backends.base import DeleteSpace, Embedder, KVStore, VectorIndex
from tiers.ids import check_id
from tiers.items._outbox import PAGE, IndexOutbox
from tiers.items._records import (
    ITEM_FACT_SOURCE,
    ItemRecord,
    ItemSpaces,
    ItemWrite,
    Namespace,
    NamespacePattern,
    StoredItem,
    fact_key,
    is_expired,
    namespace_code,
    stored_item,
)
from tiers.items._rules import check_key, check_namespace
from tiers.items._search import ItemSearch
from tiers.items._sweep import ExpirySweeper
from tiers.items._writes import ItemWriter, Plan
from tiers.models import UserFact, utcnow
from tiers.redaction import OFF, Redactor


class ItemStore:
    """Namespaced JSON items of one tenant, with TTL and vector search. Thread-safe.

    Args:
        kv: The authoritative store.
        index: The vector index (shared with the session tier; item vectors
            carry their own metadata and ids, so neither sees the other's).
        embedder: Embeds texts for callers without an embedder of their own;
            its ``dimension`` is the index's.
        tenant: Namespace of every key written.
        clock: Current UTC time (injectable for tests of expiry).
        redactor: Redacts item values before they are stored (a string under a
            key such as ``password`` or ``api_key`` whole); callers that embed
            values should embed :attr:`redactor`'s output too. ``None``: nothing
            is redacted.
    """

    def __init__(
        self,
        kv: KVStore,
        index: VectorIndex,
        embedder: Embedder,
        *,
        tenant: str = "default",
        clock: Callable[[], datetime] = utcnow,
        redactor: Redactor | None = None,
        _sync_lock: threading.Lock | None = None,
    ) -> None:
        self._kv = kv
        self.redactor = redactor if redactor is not None else OFF
        self._index = index
        self.embedder = embedder
        self.tenant = check_id(tenant, "tenant")
        self._clock = clock
        spaces = ItemSpaces.of(kv, self.tenant)
        self._spaces = spaces
        self._items = spaces.items
        # Index updates of one tenant are serialised in a process, so a slower
        # sync never overwrites a newer item's vectors with older ones.
        self._sync_lock = _sync_lock if _sync_lock is not None else threading.Lock()
        self._index_outbox = IndexOutbox(spaces, index, self._sync_lock)
        self._writer = ItemWriter(spaces, self._index_outbox, embedder, self.redactor, clock)
        self._search = ItemSearch(spaces, index, self._index_outbox, self._writer, embedder, clock)
        self._sweeper = ExpirySweeper(spaces, self._index_outbox, self._writer, clock)

    def with_clock(self, clock: Callable[[], datetime]) -> ItemStore:
        """The same store (same data, same index lock) reading the time from ``clock``."""
        return ItemStore(
            self._kv,
            self._index,
            self.embedder,
            tenant=self.tenant,
            clock=clock,
            redactor=self.redactor,
            _sync_lock=self._sync_lock,
        )

    @property
    def dimension(self) -> int:
        """Length of every vector the index holds."""
        return self.embedder.dimension

    def embed(self, texts: Sequence[str]) -> list[list[float]]:
        """Embed ``texts`` with this store's embedder (one vector per text, in order)."""
        return self.embedder.embed(list(texts)) if texts else []

    # -- reads ---------------------------------------------------------------------------------

    def get(
        self, namespace: Namespace, key: str, *, refresh_ttl: bool = False
    ) -> StoredItem | None:
        """The item, or ``None`` if there is none (or it expired).

        Args:
            namespace: The item's namespace.
            key: The item's key.
            refresh_ttl: Restart the item's TTL (if it has one).

        Raises:
            InvalidInputError: A bad namespace or key (``field`` names it).
        """
        return self.get_many([(namespace, key)], refresh_ttl=refresh_ttl)[0]

    def get_many(
        self, refs: Sequence[tuple[Namespace, str]], *, refresh_ttl: bool = False
    ) -> list[StoredItem | None]:
        """Several items in one read: one entry per ``(namespace, key)``, ``None`` when absent.

        Raises:
            InvalidInputError: A bad namespace or key.
        """
        addresses = [
            keys.item_address(namespace_code(check_namespace(ns, "namespace")), check_key(k))
            for ns, k in refs
        ]
        now = self._clock()
        stored = self._kv.get_many(self._items, addresses) if addresses else []
        live: dict[str, tuple[bytes, ItemRecord]] = {}
        for address, data in zip(addresses, stored, strict=True):
            if data is not None:
                record = self._spaces.decode(address, data)
                if not is_expired(record, now):
                    live[address] = (data, record)
        if refresh_ttl:
            self._writer.refresh(live, now)
        return [stored_item(live[address][1]) if address in live else None for address in addresses]

    def list_items(
        self,
        prefix: Namespace = (),
        *,
        filter: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool = False,
    ) -> list[StoredItem]:
        """Items in ``prefix`` and below matching ``filter``, most recently updated first.

        Reads every item under the prefix (one ordered scan): meant for the
        few hundred items of a user or a topic, not a whole large tenant.

        Args:
            prefix: Namespace prefix; ``()`` for every namespace.
            filter: See :func:`matches_filter`.
            limit: At most this many items (0..10000).
            offset: Skip this many matching items first.
            refresh_ttl: Restart the TTL of the items returned.

        Raises:
            InvalidInputError: A bad prefix, filter, limit or offset.
        """
        return self._search.list_items(
            prefix, filter=filter, limit=limit, offset=offset, refresh_ttl=refresh_ttl
        )

    def search(
        self,
        prefix: Namespace,
        vector: Sequence[float],
        *,
        model: str,
        filter: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool = False,
    ) -> list[StoredItem]:
        """Items in ``prefix`` and below nearest to ``vector``, best first, with their score.

        An item's score is the highest cosine similarity of any of its vectors
        made by ``model``; items without such vectors are not returned.
        ``filter`` applies to the values read from the KV store.

        Raises:
            InvalidInputError: A bad prefix, vector, model, filter, limit or offset.
            BackendUnavailableError: The index or the KV store failed.
        """
        return self._search.search(
            prefix,
            vector,
            model=model,
            filter=filter,
            limit=limit,
            offset=offset,
            refresh_ttl=refresh_ttl,
        )

    def namespaces(
        self,
        *,
        prefixes: Sequence[NamespacePattern] = (),
        suffixes: Sequence[NamespacePattern] = (),
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Namespace]:
        """Namespaces holding live items, sorted, matching every pattern given.

        Args:
            prefixes: Each pattern must match the namespace's first labels.
            suffixes: Each pattern must match the namespace's last labels.
            max_depth: Namespaces deeper than this are cut to it (and listed once).
            limit: At most this many (0..10000).
            offset: Skip this many first.

        Raises:
            InvalidInputError: A bad pattern, depth, limit or offset.
        """
        return self._search.namespaces(
            prefixes=prefixes, suffixes=suffixes, max_depth=max_depth, limit=limit, offset=offset
        )

    # -- writes --------------------------------------------------------------------------------

    def put(
        self,
        namespace: Namespace,
        key: str,
        value: Mapping[str, object],
        *,
        vectors: Sequence[Sequence[float]] = (),
        model: str | None = None,
        ttl_minutes: float | None = None,
        user_id: str | None = None,
    ) -> None:
        """Store one item (see :class:`ItemWrite` and :meth:`write`)."""
        self.write(
            [
                ItemWrite(
                    namespace,
                    key,
                    value,
                    vectors=vectors,
                    model=model,
                    ttl_minutes=ttl_minutes,
                    user_id=user_id,
                )
            ]
        )

    def delete(self, namespace: Namespace, key: str) -> None:
        """Delete one item and its vectors; a missing item is not an error."""
        self.write([ItemWrite(namespace, key, None)])

    def write(self, writes: Sequence[ItemWrite]) -> None:
        """Apply puts and deletes in one atomic commit (the last write of an item wins).

        Every write is validated before anything is stored: one bad write
        stores none. A put keeps the item's ``created_at``, unless the same batch
        deleted the item before it (then it is a new item). The vector index
        is updated after the commit; if it fails, the write stands (it is
        durable) and the index catches up at the next search or
        :meth:`repair`.

        Raises:
            InvalidInputError: A bad namespace, key, value, vector, model, TTL
                or user id (``field`` names it); nothing was written.
            ValueTooLargeError: An item is over the store's per-value limit
                (``field`` is ``value``); nothing was written.
            ConflictError: Other writers kept changing these items; nothing was written.
        """
        plans: dict[str, Plan] = {}
        for write in writes:
            plan = self._writer.plan(write)
            earlier = plans.pop(plan.address, None)  # last write wins, in its own position
            if earlier is not None and plan.value is not None:
                plan.recreated = earlier.recreated or earlier.value is None
            plans[plan.address] = plan
        if not plans:
            return
        self._writer.apply(list(plans.values()), expected=None)

    def sweep(self, *, now: datetime | None = None) -> int:
        """Delete every item whose TTL ran out (with its vectors).

        An item refreshed or rewritten while the sweep runs is left alone.

        Returns:
            How many items were deleted.
        """
        return self._sweeper.sweep(now=now)

    def delete_user(self, user_id: str) -> int:
        """Delete every item the user owns (and its vectors), in every namespace.

        Returns:
            How many items were deleted.
        """
        check_id(user_id, "user_id")
        space = keys.user_item_namespaces_space(self.tenant, user_id)
        deleted = 0
        for code, _ in self._kv.scan(space):
            owned = [
                address
                for address, data in self._kv.scan(self._items, prefix=f"{code}#")
                if self._spaces.decode(address, data).user_id == user_id
            ]
            for start in range(0, len(owned), PAGE):
                batch = owned[start : start + PAGE]
                plans = [self._writer.delete_plan(address) for address in batch]
                deleted += self._writer.apply(plans, expected=None)
        self._kv.commit([DeleteSpace(space)])
        return deleted

    def user_facts(self, user_id: str) -> list[UserFact]:
        """The user's live items as facts, for the continuation context (never stored as facts).

        Each fact's key is the item's key mapped onto the id alphabet, its
        value the item's only field when it has exactly one (LangMem's
        ``{"content": ...}``), else the whole value; ``source`` is
        :data:`ITEM_FACT_SOURCE`.
        """
        check_id(user_id, "user_id")
        now = self._clock()
        facts: list[UserFact] = []
        for code, _ in self._kv.scan(keys.user_item_namespaces_space(self.tenant, user_id)):
            for address, data in self._kv.scan(self._items, prefix=f"{code}#"):
                record = self._spaces.decode(address, data)
                if record.user_id != user_id or is_expired(record, now):
                    continue
                value: JsonValue = record.value
                if len(record.value) == 1:
                    (value,) = record.value.values()
                facts.append(
                    UserFact(
                        user_id=user_id,
                        key=fact_key(record.key),
                        value=value,
                        source=ITEM_FACT_SOURCE,
                        updated_at=record.updated_at,
                    )
                )
        return facts

    def repair(self) -> int:
        """Bring the index in line with the KV store for every item with queued index work.

        Returns:
            How many items were looked at.

        Raises:
            BackendUnavailableError: The index or the KV store failed.
        """
        return self._index_outbox.repair()
