"""The item store's reads by query: semantic search, filtered listing, and namespace listing.

Results are always read from the KV store, never from the index: a stale
vector can cost ranking quality, never return a deleted item or an old value.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

import numpy as np

from tiers.backends.base import Embedder, VectorIndex
from tiers.errors import InvalidInputError
from tiers.items._outbox import IndexOutbox
from tiers.items._records import (
    ItemRecord,
    ItemSpaces,
    Namespace,
    NamespacePattern,
    StoredItem,
    check_vectors,
    decode_namespace,
    is_expired,
    namespace_code,
    stored_item,
)
from tiers.items._rules import (
    check_filter,
    check_model,
    check_namespace,
    check_page,
    check_pattern,
    matches_filter,
    matches_pattern,
)
from tiers.items._writes import ItemWriter

_MAX_CANDIDATES = 50_000  # nearest vectors fetched at most for one search


class ItemSearch:
    """Finds items by vector, by filter and by namespace pattern (see :class:`ItemStore`).

    Args:
        spaces: The tenant's item spaces.
        index: The vector index.
        outbox: Finishes queued index work before a vector search.
        writer: Refreshes the TTL of the items found, when asked.
        embedder: The dimension query vectors are checked against.
        clock: Current UTC time.
    """

    def __init__(
        self,
        spaces: ItemSpaces,
        index: VectorIndex,
        outbox: IndexOutbox,
        writer: ItemWriter,
        embedder: Embedder,
        clock: Callable[[], datetime],
    ) -> None:
        self._spaces = spaces
        self._kv = spaces.kv
        self.tenant = spaces.tenant
        self._items = spaces.items
        self._namespaces = spaces.namespaces
        self._index = index
        self._index_outbox = outbox
        self._writer = writer
        self._embedder = embedder
        self._clock = clock

    def list_items(
        self,
        prefix: Namespace = (),
        *,
        filter: Mapping[str, Any] | None = None,
        limit: int = 10,
        offset: int = 0,
        refresh_ttl: bool = False,
    ) -> list[StoredItem]:
        """See :meth:`ItemStore.list_items`."""
        prefix = check_namespace(prefix, "namespace_prefix", allow_empty=True)
        check_filter(filter)
        check_page(limit, offset)
        now = self._clock()
        found: list[tuple[str, bytes, ItemRecord]] = []
        for address, data in self._kv.scan(self._items, prefix=namespace_code(prefix)):
            record = self._spaces.decode(address, data)
            if not is_expired(record, now) and matches_filter(record.value, filter):
                found.append((address, data, record))
        found.sort(key=lambda f: (-f[2].updated_at.timestamp(), f[2].namespace, f[2].key))
        page = found[offset : offset + limit]
        if refresh_ttl:
            self._writer.refresh({address: (data, record) for address, data, record in page}, now)
        return [stored_item(record) for _, _, record in page]

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
        """See :meth:`ItemStore.search`."""
        prefix = check_namespace(prefix, "namespace_prefix", allow_empty=True)
        query = check_vectors([vector], "query", self._embedder)[0]
        model = check_model(model)
        check_filter(filter)
        check_page(limit, offset)
        wanted = offset + limit
        if wanted == 0:
            return []
        self._index_outbox.settle()
        where = {"kind": "item", "tenant": self.tenant, "model": model}
        where.update({f"ns{depth}": label for depth, label in enumerate(prefix)})
        embedding = np.frombuffer(query, dtype="<f4").tolist()
        now = self._clock()
        top_k = max(2 * wanted, 10)
        while True:
            hits = self._index.query(embedding, where=where, top_k=top_k)
            nearest: dict[str, list[tuple[float, int]]] = {}
            for hit in hits:
                address = hit.metadata.get("addr")
                n = hit.metadata.get("n")
                if isinstance(address, str) and isinstance(n, int):
                    nearest.setdefault(address, []).append((1.0 - hit.distance, n))
            stored = self._kv.get_many(self._items, list(nearest))
            ranked: list[tuple[float, str, bytes, ItemRecord]] = []
            for (address, scores), data in zip(nearest.items(), stored, strict=True):
                if data is None:
                    continue
                record = self._spaces.decode(address, data)
                # A vector numbered past the record's count is left over from an older value.
                current = [score for score, n in scores if n < record.vectors]
                if (
                    current
                    and record.model == model
                    and not is_expired(record, now)
                    and matches_filter(record.value, filter)
                ):
                    ranked.append((max(current), address, data, record))
            if len(ranked) >= wanted or len(hits) < top_k or top_k >= _MAX_CANDIDATES:
                break
            top_k = min(top_k * 4, _MAX_CANDIDATES)
        ranked.sort(key=lambda r: -r[0])
        page = ranked[offset : offset + limit]
        if refresh_ttl:
            self._writer.refresh(
                {address: (data, record) for _, address, data, record in page}, now
            )
        return [stored_item(record, score=score) for score, _, _, record in page]

    def namespaces(
        self,
        *,
        prefixes: Sequence[NamespacePattern] = (),
        suffixes: Sequence[NamespacePattern] = (),
        max_depth: int | None = None,
        limit: int = 100,
        offset: int = 0,
    ) -> list[Namespace]:
        """See :meth:`ItemStore.namespaces`."""
        prefixes = [check_pattern(p, "prefix") for p in prefixes]
        suffixes = [check_pattern(p, "suffix") for p in suffixes]
        if max_depth is not None and (
            not isinstance(max_depth, int) or isinstance(max_depth, bool) or max_depth < 1
        ):
            raise InvalidInputError(
                f"max_depth must be a positive integer or None, got {max_depth!r}",
                field="max_depth",
            )
        check_page(limit, offset)
        # The literal labels every prefix pattern starts with narrow the scan.
        literal: list[str] = []
        if prefixes:
            for label in prefixes[0]:
                if label is None:
                    break
                literal.append(label)
        candidates: list[tuple[Namespace, str]] = []
        for code, _ in self._kv.scan(self._namespaces, prefix=namespace_code(tuple(literal))):
            namespace = decode_namespace(code)
            if all(matches_pattern(namespace, p, suffix=False) for p in prefixes) and all(
                matches_pattern(namespace, p, suffix=True) for p in suffixes
            ):
                candidates.append((namespace, code))
        candidates.sort()
        now = self._clock()
        out: list[Namespace] = []
        seen: set[Namespace] = set()
        for namespace, code in candidates:
            if len(out) >= offset + limit:
                break
            shown = namespace if max_depth is None else namespace[:max_depth]
            if shown in seen or not self._has_live_item(code, now):
                continue
            seen.add(shown)
            out.append(shown)
        return out[offset : offset + limit]

    def _has_live_item(self, code: str, now: datetime) -> bool:
        start: str | None = None
        while True:
            page = self._kv.scan(self._items, prefix=f"{code}#", start_after=start, limit=32)
            for address, data in page:
                if not is_expired(self._spaces.decode(address, data), now):
                    return True
            if len(page) < 32:
                return False
            start = page[-1][0]
