"""The item store's write path: validated plans committed with compare-and-set.

A put or delete becomes a :class:`Plan`; plans commit together in one KV
commit that also sets each item's outbox entry, so the index update that
follows (or a later repair) can always finish what the commit started.
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from datetime import datetime, timedelta

from pydantic import JsonValue, ValidationError

from tiers import cas, keys
from tiers.backends.base import Check, Delete, Embedder, Put, Write
from tiers.codec import encode
from tiers.errors import ConflictError, InvalidInputError, ValueTooLargeError
from tiers.ids import check_id
from tiers.items._outbox import IndexOutbox, outbox_bound, outbox_entry
from tiers.items._records import (
    ItemRecord,
    ItemSpaces,
    ItemWrite,
    Namespace,
    check_vectors,
    decode_namespace,
    micros,
    namespace_code,
)
from tiers.items._rules import check_key, check_model, check_namespace, check_ttl, check_value
from tiers.redaction import Redactor

_MIN_REFRESH = timedelta(seconds=1)  # a TTL refresh moving expiry by less is not written


@dataclass(slots=True)
class Plan:
    """One validated item write: its address, and its value and vectors as stored (``None``: delete)."""

    write: ItemWrite
    namespace: Namespace
    code: str
    address: str
    value: dict[str, JsonValue] | None
    vectors: list[bytes]
    recreated: bool = False
    """A put after a delete of the same item in one batch: a new item (new ``created_at``)."""


class ItemWriter:
    """Commits item writes, refreshes TTLs and drops emptied namespaces.

    Args:
        spaces: The tenant's item spaces.
        outbox: Updates the index after each commit.
        embedder: The dimension and name vectors are checked against.
        redactor: Redacts values before they are stored.
        clock: Current UTC time.
    """

    def __init__(
        self,
        spaces: ItemSpaces,
        outbox: IndexOutbox,
        embedder: Embedder,
        redactor: Redactor,
        clock: Callable[[], datetime],
    ) -> None:
        self._spaces = spaces
        self._kv = spaces.kv
        self.tenant = spaces.tenant
        self._items = spaces.items
        self._vectors = spaces.vectors
        self._outbox_space = spaces.outbox
        self._namespaces = spaces.namespaces
        self._expiry = spaces.expiry
        self._index_outbox = outbox
        self._embedder = embedder
        self.redactor = redactor
        self._clock = clock

    def apply(self, plans: list[Plan], *, expected: Mapping[str, bytes] | None) -> int:
        """Commit ``plans`` (see :meth:`_commit`), update the index and drop emptied namespaces.

        Returns:
            How many plans changed something.
        """
        synced, emptied, applied = self._commit(plans, expected=expected)
        self._index_outbox.sync_quietly(synced)
        for code, users in emptied.items():
            self.drop_namespace_if_empty(code, users)
        return applied

    def plan(self, write: ItemWrite) -> Plan:
        """``write`` validated (and its value redacted), before anything is stored."""
        if not isinstance(write, ItemWrite):
            raise InvalidInputError(
                f"writes must be ItemWrite, got {type(write).__name__}", field="writes"
            )
        namespace = check_namespace(write.namespace, "namespace")
        key = check_key(write.key)
        code = namespace_code(namespace)
        address = keys.item_address(code, key)
        if write.value is None:
            return Plan(write, namespace, code, address, None, [])
        value = self.redactor.redact_json(check_value(write.value))
        vectors = check_vectors(write.vectors, "vectors", self._embedder) if write.vectors else []
        if vectors:
            check_model(write.model)
        check_ttl(write.ttl_minutes)
        if write.user_id is not None:
            check_id(write.user_id, "user_id")
        return Plan(write, namespace, code, address, value, vectors)

    def delete_plan(self, address: str) -> Plan:
        """A plan deleting the item at ``address``."""
        code = address.partition("#")[0]
        namespace = decode_namespace(code)
        key = address[len(code) + 1 :]
        return Plan(ItemWrite(namespace, key, None), namespace, code, address, None, [])

    def _commit(
        self, plans: list[Plan], *, expected: Mapping[str, bytes] | None
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
            boxes = self._kv.get_many(self._outbox_space, addresses)
            now = self._clock()
            writes: list[Write] = []
            checks: list[Check] = []
            synced: list[str] = []
            emptied: dict[str, set[str]] = {}
            applied = 0
            for plan, data, box in zip(plans, stored, boxes, strict=True):
                if expected is not None and expected.get(plan.address) != data:
                    continue
                old = self._spaces.decode(plan.address, data) if data is not None else None
                if plan.value is None and old is None:
                    continue
                applied += 1
                checks.append(Check(self._items, plan.address, data))
                checks.append(Check(self._outbox_space, plan.address, box))
                bound = max(old.vectors if old else 0, outbox_bound(box))
                if plan.value is None:
                    assert old is not None
                    writes.append(Delete(self._items, plan.address))
                    writes.extend(self._vector_deletes(plan.address, 0, old.vectors))
                    if old.expires_at is not None:
                        writes.append(
                            Delete(
                                self._expiry,
                                keys.item_expiry_key(micros(old.expires_at), plan.address),
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
                    writes.append(Put(self._outbox_space, plan.address, outbox_entry(bound)))
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

    def _record(self, plan: Plan, old: ItemRecord | None, now: datetime) -> ItemRecord:
        write = plan.write
        ttl = write.ttl_minutes
        try:
            record = ItemRecord(
                namespace=plan.namespace,
                key=write.key,
                value=plan.value or {},
                created_at=old.created_at if old is not None and not plan.recreated else now,
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
            writes.append(Delete(self._expiry, keys.item_expiry_key(micros(before), address)))
        if after is not None:
            writes.append(Put(self._expiry, keys.item_expiry_key(micros(after), address), b""))
        return writes

    def refresh(self, found: Mapping[str, tuple[bytes, ItemRecord]], now: datetime) -> None:
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

    def drop_namespace_if_empty(self, code: str, users: Iterable[str]) -> None:
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
