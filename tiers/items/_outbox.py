"""The item outbox: items whose vectors the index may not reflect yet, and how the index catches up.

An entry is set in the commit that changes an item, holding an upper bound of
how many vectors the index may hold for it; it is cleared (compare-and-set)
once the index matches the stored vectors, and replayed by :meth:`IndexOutbox.repair`
and before each vector search.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Sequence

import numpy as np

from tiers import cas, keys
from tiers.backends.base import Check, Delete, VectorIndex, VectorItem
from tiers.errors import BackendUnavailableError, ConflictError
from tiers.items._records import ItemRecord, ItemSpaces

# The log of the item store, which an operator knows the postponed index updates by.
logger = logging.getLogger("tiers.items")

PAGE = 256  # rows per scan page / items per commit when sweeping, forgetting or repairing


def outbox_entry(bound: int) -> bytes:
    """An outbox entry saying the index may hold up to ``bound`` vectors of the item."""
    # The token makes every outbox write distinct, so a stale sync's compare-and-set
    # can never clear an entry a newer writer set to the same bound.
    return f"{bound} {uuid.uuid4().hex}".encode()


def outbox_bound(box: bytes | None) -> int:
    """The bound an outbox entry holds (0 for none)."""
    if box is None:
        return 0
    head = box.split(b" ", 1)[0]
    return int(head) if head.isdigit() else 0


class IndexOutbox:
    """Brings the vector index in line with the KV store for the items with queued index work.

    Args:
        spaces: The tenant's item spaces.
        index: The vector index.
        sync_lock: Serialises index updates of one tenant in a process, so a
            slower sync never overwrites a newer item's vectors with older ones.
    """

    def __init__(self, spaces: ItemSpaces, index: VectorIndex, sync_lock: threading.Lock) -> None:
        self._spaces = spaces
        self._kv = spaces.kv
        self.tenant = spaces.tenant
        self._items = spaces.items
        self._vectors = spaces.vectors
        self._outbox = spaces.outbox
        self._index = index
        self._sync_lock = sync_lock

    def repair(self) -> int:
        """Bring the index in line with the KV store for every item with queued index work.

        Returns:
            How many items were looked at.

        Raises:
            BackendUnavailableError: The index or the KV store failed.
        """
        done = 0
        while True:
            page = [address for address, _ in self._kv.scan(self._outbox, limit=PAGE)]
            if not page:
                return done
            self._sync(page)
            done += len(page)
            left = {address for address, _ in self._kv.scan(self._outbox, limit=PAGE)}
            if left >= set(page):
                # Not one entry cleared (a writer racing every round): stop rather than spin.
                return done

    def settle(self) -> None:
        """Finish queued index work first, so a search sees every acknowledged write."""
        if self._kv.scan(self._outbox, limit=1):
            self.repair()

    def sync_quietly(self, addresses: list[str]) -> None:
        """Update the index for ``addresses``; on failure leave their outbox entries queued."""
        if not addresses:
            return
        try:
            self._sync(addresses)
        except BackendUnavailableError as exc:
            # The write is durable; its outbox entry makes the next search or repair finish it.
            logger.warning("item index update postponed, queued for repair: %s", exc)

    def _sync(self, addresses: Sequence[str]) -> None:
        """Make the index hold exactly the stored vectors of these items, then clear their outbox."""
        pending = list(dict.fromkeys(addresses))
        with self._sync_lock:
            for _ in range(cas.ATTEMPTS):
                if not pending:
                    return
                boxes = self._kv.get_many(self._outbox, pending)
                stored = self._kv.get_many(self._items, pending)
                upserts: list[VectorItem] = []
                removals: list[str] = []
                for address, box, data in zip(pending, boxes, stored, strict=True):
                    record = self._spaces.decode(address, data) if data is not None else None
                    count = record.vectors if record is not None else 0
                    if record is not None and count:
                        upserts.extend(self._vector_items(address, record))
                    removals.extend(
                        keys.item_vector_id(self.tenant, address, n)
                        for n in range(count, max(count, outbox_bound(box)))
                    )
                if upserts:
                    self._index.upsert(upserts)
                if removals:
                    self._index.delete(removals)
                clear = [(a, b) for a, b in zip(pending, boxes, strict=True) if b is not None]
                if not clear:
                    return
                try:
                    self._kv.commit(
                        [Delete(self._outbox, a) for a, _ in clear],
                        [Check(self._outbox, a, b) for a, b in clear],
                    )
                except ConflictError:
                    # A writer changed some of them while we synced: do those again.
                    pending = [a for a, _ in clear]
                    continue
                return

    def _vector_items(self, address: str, record: ItemRecord) -> list[VectorItem]:
        vector_keys = [keys.item_vector_key(address, n) for n in range(record.vectors)]
        raw = self._kv.get_many(self._vectors, vector_keys)
        metadata: dict[str, str | int | float | bool] = {
            "kind": "item",
            "tenant": self.tenant,
            "model": record.model or "",
            "addr": address,
            "depth": len(record.namespace),
        }
        metadata.update({f"ns{d}": label for d, label in enumerate(record.namespace)})
        items: list[VectorItem] = []
        for n, data in enumerate(raw):
            if data is None:
                logger.warning("item %r lacks stored vector %d; left out of the index", address, n)
                continue
            items.append(
                VectorItem(
                    id=keys.item_vector_id(self.tenant, address, n),
                    embedding=np.frombuffer(data, dtype="<f4").tolist(),
                    document="",
                    metadata={**metadata, "n": n},
                )
            )
        return items
