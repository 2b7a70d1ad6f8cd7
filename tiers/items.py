"""Namespaced items: JSON documents under string-tuple namespaces, with TTL and vector search.

What LangGraph's ``BaseStore`` holds (the adapter lives in
``memory.integrations.langgraph_store``), in plain terms: an item is a JSON
object stored under ``(namespace, key)``, where a namespace is a tuple of
arbitrary strings such as ``("memories", "alice")``.

Storage (every format in :mod:`tiers.keys`):

- ``items_space``: one record per item at ``<namespace code>#<key>``. The
  namespace code percent-encodes each label and ends each with ``/``, so two
  namespaces never share a code, the code of a namespace is a string prefix of
  exactly its descendants' codes (a prefix search is one ordered scan), and
  nothing a caller puts in a label or key can reach another tenant's space.
- ``item_vectors_space``: the item's embeddings, authoritative. The vector
  index is derived from them, so it can always be repaired or rebuilt without
  the embedder that made them (which may be the caller's own).
- ``item_outbox_space``: items whose vectors the index may not reflect yet,
  with an upper bound of how many it may hold. Set in the commit that changes
  an item, cleared (compare-and-set) once the index matches, replayed by
  :meth:`ItemStore.repair` and before each vector search: whatever crashes
  where, no vector of a deleted item lingers and no item stays unsearchable.
- ``item_namespaces_space``: the namespaces that hold items, each with a token
  every write replaces, so a namespace emptied by a delete is dropped from the
  index only if nothing was written to it meanwhile.
- ``item_expiry_space``: items with a TTL by expiry time, for :meth:`ItemStore.sweep`.
- ``user_item_namespaces_space``: namespaces holding items owned by a user
  (``user_id`` on write), so forgetting the user deletes them and the user's
  continuation context sees them (:meth:`ItemStore.user_facts`).

Expired items are treated as absent by every read, before a sweep deletes
them. Search results are always read from the KV store, never from the index:
a stale vector can cost ranking quality, never return a deleted item or an
old value.
"""

from __future__ import annotations

import logging
import re
import threading
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime, timedelta
from typing import Any
from urllib.parse import unquote

import numpy as np
from pydantic import JsonValue, ValidationError

from tiers import cas, keys
from tiers.backends.base import (
    Check,
    Delete,
    DeleteSpace,
    Embedder,
    KVStore,
    Put,
    VectorIndex,
    VectorItem,
    Write,
)
from tiers.codec import decode, encode
from tiers.errors import (
    BackendUnavailableError,
    ConflictError,
    InvalidInputError,
    ValueTooLargeError,
)
from tiers.ids import check_id
from tiers.item_rules import (
    check_filter,
    check_key,
    check_model,
    check_namespace,
    check_page,
    check_pattern,
    check_ttl,
    check_value,
    matches_filter,
    matches_pattern,
)
from tiers.models import Record, UserFact, UtcDatetime, utcnow
from tiers.redaction import OFF, Redactor

__all__ = [
    "ITEM_FACT_SOURCE",
    "ItemRecord",
    "ItemStore",
    "ItemWrite",
    "Namespace",
    "NamespacePattern",
    "StoredItem",
    "check_value",
    "matches_filter",
]

logger = logging.getLogger(__name__)

Namespace = tuple[str, ...]
NamespacePattern = Sequence[str | None]
"""A namespace pattern for :meth:`ItemStore.namespaces`: ``None`` matches any one label."""

ITEM_FACT_SOURCE = "item-store"
"""``source`` of the facts :meth:`ItemStore.user_facts` derives from a user's items."""

_MAX_CANDIDATES = 50_000  # nearest vectors fetched at most for one search
_PAGE = 256  # rows per scan page / items per commit when sweeping or forgetting
_FACT_UNSAFE = re.compile(r"[^A-Za-z0-9._@+\-]+")
_MIN_REFRESH = timedelta(seconds=1)  # a TTL refresh moving expiry by less is not written


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


@dataclass(slots=True)
class _Plan:
    write: ItemWrite
    namespace: Namespace
    code: str
    address: str
    value: dict[str, JsonValue] | None
    vectors: list[bytes]


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
        self._items = keys.items_space(self.tenant)
        self._vectors = keys.item_vectors_space(self.tenant)
        self._outbox = keys.item_outbox_space(self.tenant)
        self._namespaces = keys.item_namespaces_space(self.tenant)
        self._expiry = keys.item_expiry_space(self.tenant)
        # Index updates of one tenant are serialised in a process, so a slower
        # sync never overwrites a newer item's vectors with older ones.
        self._sync_lock = _sync_lock if _sync_lock is not None else threading.Lock()

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
            keys.item_address(_namespace_code(check_namespace(ns, "namespace")), check_key(k))
            for ns, k in refs
        ]
        now = self._clock()
        stored = self._kv.get_many(self._items, addresses) if addresses else []
        live: dict[str, tuple[bytes, ItemRecord]] = {}
        for address, data in zip(addresses, stored, strict=True):
            if data is not None:
                record = self._decode(address, data)
                if not _expired(record, now):
                    live[address] = (data, record)
        if refresh_ttl:
            self._refresh(live, now)
        return [_item(live[address][1]) if address in live else None for address in addresses]

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
        prefix = check_namespace(prefix, "namespace_prefix", allow_empty=True)
        check_filter(filter)
        check_page(limit, offset)
        now = self._clock()
        found: list[tuple[str, bytes, ItemRecord]] = []
        for address, data in self._kv.scan(self._items, prefix=_namespace_code(prefix)):
            record = self._decode(address, data)
            if not _expired(record, now) and matches_filter(record.value, filter):
                found.append((address, data, record))
        found.sort(key=lambda f: (-f[2].updated_at.timestamp(), f[2].namespace, f[2].key))
        page = found[offset : offset + limit]
        if refresh_ttl:
            self._refresh({address: (data, record) for address, data, record in page}, now)
        return [_item(record) for _, _, record in page]

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
        prefix = check_namespace(prefix, "namespace_prefix", allow_empty=True)
        query = self._check_vectors([vector], "query")[0]
        model = check_model(model)
        check_filter(filter)
        check_page(limit, offset)
        wanted = offset + limit
        if wanted == 0:
            return []
        self._settle()
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
                record = self._decode(address, data)
                # A vector numbered past the record's count is left over from an older value.
                current = [score for score, n in scores if n < record.vectors]
                if (
                    current
                    and record.model == model
                    and not _expired(record, now)
                    and matches_filter(record.value, filter)
                ):
                    ranked.append((max(current), address, data, record))
            if len(ranked) >= wanted or len(hits) < top_k or top_k >= _MAX_CANDIDATES:
                break
            top_k = min(top_k * 4, _MAX_CANDIDATES)
        ranked.sort(key=lambda r: -r[0])
        page = ranked[offset : offset + limit]
        if refresh_ttl:
            self._refresh({address: (data, record) for _, address, data, record in page}, now)
        return [_item(record, score=score) for score, _, _, record in page]

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
        for code, _ in self._kv.scan(self._namespaces, prefix=_namespace_code(tuple(literal))):
            namespace = _decode_namespace(code)
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
        stores none. A put keeps the item's ``created_at``. The vector index
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
        plans: dict[str, _Plan] = {}
        for write in writes:
            plan = self._plan(write)
            plans.pop(plan.address, None)  # last write wins, in its own position
            plans[plan.address] = plan
        if not plans:
            return
        synced, emptied, _ = self._commit(list(plans.values()), expected=None)
        self._sync_quietly(synced)
        for code, users in emptied.items():
            self._drop_namespace_if_empty(code, users)

    def sweep(self, *, now: datetime | None = None) -> int:
        """Delete every item whose TTL ran out (with its vectors).

        An item refreshed or rewritten while the sweep runs is left alone.

        Returns:
            How many items were deleted.
        """
        now = self._clock() if now is None else now
        horizon = _micros(now)
        deleted = 0
        start: str | None = None
        while True:
            page = self._kv.scan(self._expiry, start_after=start, limit=_PAGE)
            due = [k for k, _ in page if int(k.partition("/")[0]) <= horizon]
            if due:
                deleted += self._sweep_page(due, now)
            if len(due) < len(page) or len(page) < _PAGE:
                break
            start = page[-1][0]
        self.repair()
        return deleted

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
                if self._decode(address, data).user_id == user_id
            ]
            for start in range(0, len(owned), _PAGE):
                batch = owned[start : start + _PAGE]
                plans = [self._delete_plan(address) for address in batch]
                synced, emptied, applied = self._commit(plans, expected=None)
                self._sync_quietly(synced)
                for emptied_code, users in emptied.items():
                    self._drop_namespace_if_empty(emptied_code, users)
                deleted += applied
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
                record = self._decode(address, data)
                if record.user_id != user_id or _expired(record, now):
                    continue
                value: JsonValue = record.value
                if len(record.value) == 1:
                    (value,) = record.value.values()
                facts.append(
                    UserFact(
                        user_id=user_id,
                        key=_fact_key(record.key),
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
        done = 0
        while True:
            page = [address for address, _ in self._kv.scan(self._outbox, limit=_PAGE)]
            if not page:
                return done
            self._sync(page)
            done += len(page)
            left = {address for address, _ in self._kv.scan(self._outbox, limit=_PAGE)}
            if left >= set(page):
                # Not one entry cleared (a writer racing every round): stop rather than spin.
                return done

    # -- internals -----------------------------------------------------------------------------

    def _plan(self, write: ItemWrite) -> _Plan:
        if not isinstance(write, ItemWrite):
            raise InvalidInputError(
                f"writes must be ItemWrite, got {type(write).__name__}", field="writes"
            )
        namespace = check_namespace(write.namespace, "namespace")
        key = check_key(write.key)
        code = _namespace_code(namespace)
        address = keys.item_address(code, key)
        if write.value is None:
            return _Plan(write, namespace, code, address, None, [])
        value = self.redactor.redact_json(check_value(write.value))
        vectors = self._check_vectors(write.vectors, "vectors") if write.vectors else []
        if vectors:
            check_model(write.model)
        check_ttl(write.ttl_minutes)
        if write.user_id is not None:
            check_id(write.user_id, "user_id")
        return _Plan(write, namespace, code, address, value, vectors)

    def _delete_plan(self, address: str) -> _Plan:
        code = address.partition("#")[0]
        namespace = _decode_namespace(code)
        key = address[len(code) + 1 :]
        return _Plan(ItemWrite(namespace, key, None), namespace, code, address, None, [])

    def _commit(
        self, plans: list[_Plan], *, expected: Mapping[str, bytes] | None
    ) -> tuple[list[str], dict[str, set[str]], int]:
        """Commit ``plans`` (distinct addresses) with compare-and-set, retrying lost rounds.

        With ``expected``, a plan whose item no longer holds the expected
        bytes is skipped (sweeping must not delete an item refreshed meanwhile).

        Returns:
            The addresses with index work queued, the namespaces that may have
            been emptied (code -> owners of the deleted items), and how many
            plans changed something.
        """
        for attempt in range(cas.ATTEMPTS):
            addresses = [plan.address for plan in plans]
            stored = self._kv.get_many(self._items, addresses)
            boxes = self._kv.get_many(self._outbox, addresses)
            now = self._clock()
            writes: list[Write] = []
            checks: list[Check] = []
            synced: list[str] = []
            emptied: dict[str, set[str]] = {}
            applied = 0
            for plan, data, box in zip(plans, stored, boxes, strict=True):
                if expected is not None and expected.get(plan.address) != data:
                    continue
                old = self._decode(plan.address, data) if data is not None else None
                if plan.value is None and old is None:
                    continue
                applied += 1
                checks.append(Check(self._items, plan.address, data))
                checks.append(Check(self._outbox, plan.address, box))
                bound = max(old.vectors if old else 0, _box_bound(box))
                if plan.value is None:
                    assert old is not None
                    writes.append(Delete(self._items, plan.address))
                    writes.extend(self._vector_deletes(plan.address, 0, old.vectors))
                    if old.expires_at is not None:
                        writes.append(
                            Delete(
                                self._expiry,
                                keys.item_expiry_key(_micros(old.expires_at), plan.address),
                            )
                        )
                    emptied.setdefault(plan.code, set()).update(
                        [old.user_id] if old.user_id else []
                    )
                else:
                    record = self._record(plan, old, now)
                    writes.append(Put(self._items, plan.address, encode(record)))
                    writes.extend(
                        Put(self._vectors, keys.item_vector_key(plan.address, n), vector)
                        for n, vector in enumerate(plan.vectors)
                    )
                    writes.extend(
                        self._vector_deletes(
                            plan.address, len(plan.vectors), old.vectors if old else 0
                        )
                    )
                    writes.extend(self._expiry_writes(plan.address, old, record))
                    writes.append(Put(self._namespaces, plan.code, uuid.uuid4().hex.encode()))
                    if record.user_id is not None:
                        writes.append(
                            Put(
                                keys.user_item_namespaces_space(self.tenant, record.user_id),
                                plan.code,
                                b"",
                            )
                        )
                        writes.append(Put(keys.users_space(self.tenant), record.user_id, b"1"))
                    bound = max(bound, record.vectors)
                if bound:
                    writes.append(Put(self._outbox, plan.address, _box(bound)))
                    synced.append(plan.address)
            if not writes:
                return [], {}, 0
            try:
                self._kv.commit(writes, checks)
            except ConflictError:
                cas.backoff(attempt)
                continue
            return synced, emptied, applied
        which = ", ".join(repr(plan.address) for plan in plans[:3])
        raise ConflictError(f"item(s) {which} are changing too fast; retry")

    def _record(self, plan: _Plan, old: ItemRecord | None, now: datetime) -> ItemRecord:
        write = plan.write
        ttl = write.ttl_minutes
        try:
            record = ItemRecord(
                namespace=plan.namespace,
                key=write.key,
                value=plan.value or {},
                created_at=old.created_at if old is not None else now,
                updated_at=now,
                expires_at=None if ttl is None else now + timedelta(minutes=ttl),
                ttl_minutes=None if ttl is None else float(ttl),
                user_id=write.user_id,
                model=write.model if plan.vectors else None,
                vectors=len(plan.vectors),
            )
        except (ValidationError, OverflowError) as exc:
            raise InvalidInputError(f"invalid item {write.key!r}: {exc}", field="value") from exc
        size = len(encode(record))
        if size > self._kv.max_value_bytes:
            raise ValueTooLargeError(
                f"item {write.key!r} is {size} bytes stored, over the limit of "
                f"{self._kv.max_value_bytes} bytes: store large data elsewhere and keep a "
                "reference in the item",
                field="value",
            )
        return record

    def _vector_deletes(self, address: str, start: int, stop: int) -> list[Write]:
        return [Delete(self._vectors, keys.item_vector_key(address, n)) for n in range(start, stop)]

    def _expiry_writes(
        self, address: str, old: ItemRecord | None, new: ItemRecord | None
    ) -> list[Write]:
        before = old.expires_at if old is not None else None
        after = new.expires_at if new is not None else None
        if before == after:
            return []
        writes: list[Write] = []
        if before is not None:
            writes.append(Delete(self._expiry, keys.item_expiry_key(_micros(before), address)))
        if after is not None:
            writes.append(Put(self._expiry, keys.item_expiry_key(_micros(after), address), b""))
        return writes

    def _refresh(self, found: Mapping[str, tuple[bytes, ItemRecord]], now: datetime) -> None:
        """Restart the TTL of these items; one changed meanwhile keeps what its writer set."""
        updates: list[tuple[str, bytes, list[Write]]] = []
        for address, (data, record) in found.items():
            if record.ttl_minutes is None or record.expires_at is None:
                continue
            try:
                expires = now + timedelta(minutes=record.ttl_minutes)
            except OverflowError:
                continue
            if expires - record.expires_at < _MIN_REFRESH:
                continue
            fresh = record.model_copy(update={"expires_at": expires})
            writes: list[Write] = [Put(self._items, address, encode(fresh))]
            writes.extend(self._expiry_writes(address, record, fresh))
            updates.append((address, data, writes))
        if not updates:
            return
        try:
            self._kv.commit(
                [w for _, _, ws in updates for w in ws],
                [Check(self._items, address, data) for address, data, _ in updates],
            )
        except ConflictError:
            for address, data, ws in updates:
                try:
                    self._kv.commit(ws, [Check(self._items, address, data)])
                except ConflictError:
                    continue

    def _sweep_page(self, due: list[str], now: datetime) -> int:
        addresses = list(dict.fromkeys(k.partition("/")[2] for k in due))
        stored = dict(zip(addresses, self._kv.get_many(self._items, addresses), strict=True))
        expired: dict[str, bytes] = {}
        stale: list[tuple[str, str, bytes | None]] = []
        for expiry_key in due:
            address = expiry_key.partition("/")[2]
            data = stored[address]
            record = self._decode(address, data) if data is not None else None
            if (
                data is not None
                and record is not None
                and record.expires_at is not None
                and keys.item_expiry_key(_micros(record.expires_at), address) == expiry_key
                and _expired(record, now)
            ):
                expired[address] = data
            else:
                stale.append((expiry_key, address, data))
        for expiry_key, address, data in stale:
            # The entry of an item gone, refreshed or rewritten: drop it unless the item changed.
            try:
                self._kv.commit(
                    [Delete(self._expiry, expiry_key)], [Check(self._items, address, data)]
                )
            except ConflictError:
                continue
        if not expired:
            return 0
        plans = [self._delete_plan(address) for address in expired]
        synced, emptied, applied = self._commit(plans, expected=expired)
        self._sync_quietly(synced)
        for code, users in emptied.items():
            self._drop_namespace_if_empty(code, users)
        return applied

    def _drop_namespace_if_empty(self, code: str, users: Iterable[str]) -> None:
        """Drop an emptied namespace from the indexes, unless a write reached it meanwhile.

        The token is read before the emptiness scan and checked by the
        commit: a write after the read replaced it, one before it is seen by the scan.
        """
        (token,) = self._kv.get_many(self._namespaces, [code])
        if token is None or self._kv.scan(self._items, prefix=f"{code}#", limit=1):
            return
        writes: list[Write] = [Delete(self._namespaces, code)]
        writes.extend(
            Delete(keys.user_item_namespaces_space(self.tenant, user), code) for user in users
        )
        try:
            self._kv.commit(writes, [Check(self._namespaces, code, token)])
        except ConflictError:
            return

    def _has_live_item(self, code: str, now: datetime) -> bool:
        start: str | None = None
        while True:
            page = self._kv.scan(self._items, prefix=f"{code}#", start_after=start, limit=32)
            for address, data in page:
                if not _expired(self._decode(address, data), now):
                    return True
            if len(page) < 32:
                return False
            start = page[-1][0]

    def _settle(self) -> None:
        """Finish queued index work first, so a search sees every acknowledged write."""
        if self._kv.scan(self._outbox, limit=1):
            self.repair()

    def _sync_quietly(self, addresses: list[str]) -> None:
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
                    record = self._decode(address, data) if data is not None else None
                    count = record.vectors if record is not None else 0
                    if record is not None and count:
                        upserts.extend(self._vector_items(address, record))
                    removals.extend(
                        keys.item_vector_id(self.tenant, address, n)
                        for n in range(count, max(count, _box_bound(box)))
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

    def _check_vectors(self, vectors: object, field: str) -> list[bytes]:
        if isinstance(vectors, str | bytes) or not isinstance(vectors, Sequence):
            raise InvalidInputError(f"{field} must be a sequence of vectors", field=field)
        out: list[bytes] = []
        for vector in vectors:
            try:
                array = np.asarray(vector, dtype=np.float64)
            except (TypeError, ValueError) as exc:
                raise InvalidInputError(
                    f"{field} must hold sequences of numbers", field=field
                ) from exc
            if array.ndim != 1 or array.shape[0] != self.dimension:
                raise InvalidInputError(
                    f"{field} must hold vectors of {self.dimension} numbers (the vector index's "
                    f"dimension, set by embedder {self.embedder.name!r}), got shape "
                    f"{array.shape}",
                    field=field,
                )
            if not np.all(np.isfinite(array)):
                raise InvalidInputError(f"{field} holds NaN or infinity", field=field)
            out.append(array.astype("<f4").tobytes())
        return out

    def _decode(self, address: str, data: bytes) -> ItemRecord:
        return decode(ItemRecord, data, where=f"{self._items}/{address}")


# -- pure helpers ----------------------------------------------------------------------------


def _item(record: ItemRecord, *, score: float | None = None) -> StoredItem:
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


def _expired(record: ItemRecord, now: datetime) -> bool:
    return record.expires_at is not None and record.expires_at <= now


def _micros(when: datetime) -> int:
    return int(when.timestamp() * 1_000_000)


def _box(bound: int) -> bytes:
    # The token makes every outbox write distinct, so a stale sync's compare-and-set
    # can never clear an entry a newer writer set to the same bound.
    return f"{bound} {uuid.uuid4().hex}".encode()


def _box_bound(box: bytes | None) -> int:
    if box is None:
        return 0
    head = box.split(b" ", 1)[0]
    return int(head) if head.isdigit() else 0


def _namespace_code(namespace: Namespace) -> str:
    return keys.item_namespace_code(namespace)


def _decode_namespace(code: str) -> Namespace:
    return tuple(unquote(part) for part in code.split("/")[:-1])


def _fact_key(key: str) -> str:
    text = _FACT_UNSAFE.sub("_", key)
    text = re.sub(r"^[^A-Za-z0-9]+", "", text)[:128]
    return text or "item"
