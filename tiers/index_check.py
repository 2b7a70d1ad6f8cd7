"""Is the vector index in line with the KV store? Find out per tenant, and queue the repair.

The KV store is the truth (invariant 4); the vector index is derived from it and
converges through outboxes (:mod:`tiers.session._index`, :mod:`tiers.items`). An
index that was lost (a Chroma server restarted on an empty volume, a deleted
collection, an old backup restored) is otherwise silent: recall falls back to
keyword order and every probe says ok. :func:`check_index` compares one
tenant's KV records with what the index holds:

- **missing**: a vector the KV store says is indexed is not in the index;
- **stale**: a vector is there but was made from other content: a session
  vector whose ``rev`` is not the fingerprint of the stored summary and
  transcript header (:func:`~tiers.session._index.session_fingerprint`), an item
  vector whose embedding is not the stored one;
- **orphans**: a vector of the tenant with no record behind it (a deleted
  session or item, a window past the session's count, an unknown id).

Sessions and items with queued index work are left out: their outbox finishes
them. A session searchable by its base vector whose other windows wait for the
indexer's second pass (``session_windows_outbox_space``) is not stale either:
its base vector is checked, its windows are the second pass's business. The
index is listed *before* the KV store is read and every KV commit
precedes its index write, so a save racing the check is never taken for an
orphan (at worst it is reported missing once and re-indexed, which is harmless).

The check is exact and linear in the tenant's sessions, items and vectors: the
index is listed in pages, the KV store read a user at a time.

:func:`queue_repair` puts what a check found back into the outboxes (first
raising a session's window bound over its orphan windows), so the tiers' own
repair re-embeds or deletes it under the same compare-and-set guards as any
save: a repair racing a writer never undoes the newer write.
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Iterable
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np

from tiers import keys
from tiers.backends.base import Check, KVStore, Put, VectorIndex
from tiers.codec import decode
from tiers.errors import BackendUnavailableError, ConflictError, CorruptRecordError
from tiers.items import ItemRecord, outbox_bound, outbox_entry
from tiers.models import SessionSummary, utcnow
from tiers.session import FINGERPRINT_KEY, Ref, header_key, session_fingerprint

__all__ = [
    "IndexRepair",
    "IndexReport",
    "QueuedRepair",
    "bump_revisions",
    "check_index",
    "queue_repair",
    "register_tenant",
    "registered_tenants",
]

logger = logging.getLogger(__name__)

_ITEM_MARK = "|item|"
_PAGE = 512  # item records per KV read


@dataclass(frozen=True, slots=True)
class IndexReport:
    """What :func:`check_index` found for one tenant.

    Attributes:
        tenant: The tenant checked.
        vectors: Vectors the KV store says the index holds (queued work aside).
        missing: Of those, how many the index lacks.
        stale: Vectors in the index made from content the KV store no longer holds.
        orphans: Vectors of the tenant in the index with no record behind them.
        pending: Sessions and items with index work queued (not checked: their
            outbox brings them in line).
        windows_pending: Sessions checked by their base vector only: their
            other windows are queued for the indexer's second pass.
        unindexable: Session records that do not decode (never indexed; see the log).
        checked_at: When the check started.
        sessions: Sessions whose vectors need re-indexing or deleting, each with
            the highest window number the index holds of it (0: none past its count).
        items: Items whose vectors need re-indexing or deleting, each with a
            bound on the vector numbers the index holds of it.
        strays: Ids of the tenant's vectors of no known shape (deleted directly).
    """

    tenant: str
    vectors: int = 0
    missing: int = 0
    stale: int = 0
    orphans: int = 0
    pending: int = 0
    unindexable: int = 0
    checked_at: datetime = field(default_factory=utcnow)
    windows_pending: int = 0
    sessions: tuple[tuple[Ref, int], ...] = ()
    items: tuple[tuple[str, int], ...] = ()
    strays: tuple[str, ...] = ()

    @property
    def consistent(self) -> bool:
        """Whether the index holds exactly what the KV store says (queued work aside)."""
        return not (self.missing or self.stale or self.orphans)

    def describe(self) -> str:
        """One line for logs and the CLI."""
        state = "consistent" if self.consistent else "DAMAGED"
        return (
            f"tenant {self.tenant}: index {state}: {self.vectors} vectors expected, "
            f"{self.missing} missing, {self.stale} stale, {self.orphans} orphaned, "
            f"{self.pending} queued for indexing"
            + (f", {self.windows_pending} with windows queued" if self.windows_pending else "")
        )


Metadata = dict[str, str | int | float | bool]


@dataclass(slots=True)
class _Scan:
    """What one check read: the index listing first, then the KV store's expectations."""

    present: dict[str, Metadata]  # the listing, taken before the KV store is read
    accounted: set[str] = field(default_factory=set)  # ids a record or queued work explains
    # Vector id -> the session it is of, the fingerprint it must carry, the stored summary.
    sessions: dict[str, tuple[Ref, str, bytes]] = field(default_factory=dict)
    items: dict[str, int] = field(default_factory=dict)  # damaged item -> vector bound
    item_vectors: int = 0
    item_missing: int = 0
    item_stale: int = 0
    pending: int = 0
    windows_pending: int = 0
    unindexable: int = 0


def check_index(kv: KVStore, index: VectorIndex, tenant: str) -> IndexReport:
    """Compare ``tenant``'s session and item records with the vectors the index holds.

    What looks wrong is looked up again in the index after the KV store was
    read, so work that finished meanwhile is not reported.

    Raises:
        BackendUnavailableError: The KV store or the index failed.
    """
    started = utcnow()
    where = {"tenant": tenant}
    # The index first: whatever it holds was committed to the KV store before (see above).
    scan = _Scan(present=index.metadata(where=where))
    users = {user_id for user_id, _ in kv.scan(keys.users_space(tenant))}
    # A user being forgotten has left the users index but may still have work queued.
    users.update(key.partition("/")[0] for key, _ in kv.scan(keys.session_outbox_space(tenant)))
    for user_id in sorted(users):
        _read_user_sessions(kv, tenant, user_id, scan)
    _check_items(kv, index, tenant, scan)

    suspects = [
        vector_id
        for vector_id, (_, rev, _) in scan.sessions.items()
        if scan.present.get(vector_id, {}).get(FINGERPRINT_KEY) != rev
    ]
    suspects += [vector_id for vector_id in scan.present if vector_id not in scan.accounted]
    now = index.metadata(where=where, ids=suspects) if suspects else {}

    missing = stale = 0
    damaged: dict[Ref, int] = {}
    checked: dict[Ref, bool] = {}
    for vector_id, (ref, rev, record) in scan.sessions.items():
        metadata = scan.present.get(vector_id)
        if metadata is not None and metadata.get(FINGERPRINT_KEY) == rev:
            continue
        metadata = now.get(vector_id)
        if metadata is not None and metadata.get(FINGERPRINT_KEY) == rev:
            continue  # indexed while the check ran
        if ref not in checked:
            checked[ref] = _decodes(record, tenant, ref)
        if not checked[ref]:
            continue  # never indexable (the indexer removes its vectors): not the index's fault
        if metadata is None:
            missing += 1
        else:
            stale += 1
        damaged.setdefault(ref, 0)
    unindexable = sum(1 for ok in checked.values() if not ok)
    expected = scan.item_vectors + sum(
        1 for ref, _, _ in scan.sessions.values() if checked.get(ref, True)
    )

    orphans = 0
    items = dict(scan.items)
    strays: list[str] = []
    for vector_id, metadata in scan.present.items():
        if vector_id in scan.accounted or vector_id not in now:
            continue  # explained by a record, or deleted while the check ran
        orphans += 1
        session = _session_ref(tenant, vector_id)
        address = metadata.get("addr")
        if session is not None:
            damaged[session] = max(damaged.get(session, 0), _window(vector_id))
        elif _ITEM_MARK in vector_id and isinstance(address, str):
            items[address] = max(items.get(address, 0), _window(vector_id) + 1)
        else:
            strays.append(vector_id)
    report = IndexReport(
        tenant=tenant,
        vectors=expected,
        missing=missing + scan.item_missing,
        stale=stale + scan.item_stale,
        orphans=orphans,
        pending=scan.pending,
        unindexable=unindexable + scan.unindexable,
        checked_at=started,
        windows_pending=scan.windows_pending,
        sessions=tuple(damaged.items()),
        items=tuple(items.items()),
        strays=tuple(strays),
    )
    if not report.consistent:
        logger.warning("vector index check: %s", report.describe())
    return report


def _read_user_sessions(kv: KVStore, tenant: str, user_id: str, scan: _Scan) -> None:
    """Note the vectors the user's sessions must have, and account for those they may have."""
    records = dict(kv.scan(keys.sessions_space(tenant, user_id)))
    counts = dict(kv.scan(keys.session_vectors_space(tenant, user_id)))
    prefix = keys.session_outbox_key(user_id, "")
    queued = {
        key[len(prefix) :] for key, _ in kv.scan(keys.session_outbox_space(tenant), prefix=prefix)
    }
    windows_queued = {
        key[len(prefix) :]
        for key, _ in kv.scan(keys.session_windows_outbox_space(tenant), prefix=prefix)
    }
    session_ids = [sid for sid in records if sid not in queued]
    headers = (
        kv.get_many(keys.transcripts_space(tenant, user_id), [header_key(s) for s in session_ids])
        if session_ids
        else []
    )
    header_of = dict(zip(session_ids, headers, strict=True))
    for session_id in sorted({*records, *queued}):
        raw = counts.get(session_id, b"0")
        windows = int(raw) if raw.isdigit() else 0
        ids = [keys.session_vector_id(tenant, user_id, session_id)] + [
            keys.session_chunk_vector_id(tenant, user_id, session_id, n)
            for n in range(1, windows + 1)
        ]
        # Every id the session may hold is accounted for; those of a session with
        # queued work are its outbox's business, the others are checked.
        scan.accounted.update(ids)
        if session_id in queued:
            scan.pending += 1
            continue
        record = records[session_id]
        rev = session_fingerprint(record, header_of[session_id])
        if session_id in windows_queued:
            # Searchable by its base vector; the rest is the second pass's (present or not).
            scan.windows_pending += 1
            ids = ids[:1]
        for vector_id in ids:
            scan.sessions[vector_id] = ((user_id, session_id), rev, record)


def _decodes(record: bytes, tenant: str, ref: Ref) -> bool:
    user_id, session_id = ref
    try:
        decode(SessionSummary, record, where=f"{keys.sessions_space(tenant, user_id)}/{session_id}")
    except CorruptRecordError:
        return False
    return True


def _check_items(kv: KVStore, index: VectorIndex, tenant: str, scan: _Scan) -> None:
    """Compare every item's stored vectors with the index's (read after the KV store)."""
    items_space = keys.items_space(tenant)
    queued = dict(kv.scan(keys.item_outbox_space(tenant)))
    for address, box in queued.items():
        # Vectors up to the outbox's bound are its business (the item may be gone already).
        scan.pending += 1
        scan.accounted.update(_item_ids(tenant, address, outbox_bound(box)))
    start: str | None = None
    while True:
        page = kv.scan(items_space, start_after=start, limit=_PAGE)
        if not page:
            return
        start = page[-1][0]
        wanted: list[tuple[str, int]] = []
        models: dict[str, str] = {}
        for address, data in page:
            try:
                record = decode(ItemRecord, data, where=f"{items_space}/{address}")
            except CorruptRecordError:
                scan.unindexable += 1
                continue
            scan.accounted.update(_item_ids(tenant, address, record.vectors))
            if address in queued:
                continue
            wanted.extend((address, n) for n in range(record.vectors))
            models[address] = record.model or ""
        stored = (
            kv.get_many(
                keys.item_vectors_space(tenant),
                [keys.item_vector_key(address, n) for address, n in wanted],
            )
            if wanted
            else []
        )
        expected = {
            keys.item_vector_id(tenant, address, n): (address, raw)
            for (address, n), raw in zip(wanted, stored, strict=True)
            if raw is not None  # a vector never stored is never indexed (see ItemStore)
        }
        scan.item_vectors += len(expected)
        if expected:
            now = index.metadata(where={"tenant": tenant}, ids=list(expected))
            found, matrix = index.get_embeddings(list(now))
            rows = dict(zip(found, matrix, strict=True))
            for vector_id, (address, raw) in expected.items():
                row = rows.get(vector_id)
                if row is not None and (
                    now[vector_id].get("model") == models[address]
                    and np.allclose(row, np.frombuffer(raw, dtype="<f4"), rtol=0.0, atol=1e-6)
                ):
                    continue
                if row is None:
                    scan.item_missing += 1
                else:
                    scan.item_stale += 1
                scan.items.setdefault(address, 0)
        if len(page) < _PAGE:
            return


def _item_ids(tenant: str, address: str, count: int) -> list[str]:
    return [keys.item_vector_id(tenant, address, n) for n in range(count)]


def _session_ref(tenant: str, vector_id: str) -> Ref | None:
    """The (user, session) of a session vector id of ``tenant``, or ``None`` for another shape."""
    prefix = keys.session_vector_id(tenant, "", "")[:-1]  # "<tenant>/"
    if not vector_id.startswith(prefix):
        return None
    user_id, _, rest = vector_id[len(prefix) :].partition("/")
    session_id = rest.partition("#")[0]
    if not user_id or not session_id:
        return None
    return user_id, session_id


def _window(vector_id: str) -> int:
    tail = vector_id.rpartition("#")[2]
    return int(tail) if tail.isdigit() else 0


@dataclass(frozen=True, slots=True)
class QueuedRepair:
    """What :func:`queue_repair` did.

    Attributes:
        sessions: Sessions queued for re-indexing.
        items: Items queued for re-indexing.
        deleted: Stray vectors deleted.
        left: Damaged sessions and items not queued (over the limit, or changed meanwhile).
    """

    sessions: tuple[Ref, ...] = ()
    items: int = 0
    deleted: int = 0
    left: int = 0


def queue_repair(
    kv: KVStore, index: VectorIndex, report: IndexReport, *, limit: int | None = None
) -> QueuedRepair:
    """Queue what ``report`` found for re-indexing, and delete its stray vectors.

    Puts outbox entries (and raises a session's window bound over its orphan
    windows first), so the tiers' repair (``SessionTier.repair``,
    ``ItemStore.repair``) re-embeds or deletes the vectors under their usual
    guards. A session or item that changed since the check is skipped: its
    own write queued it already.

    Args:
        kv: The tenant's KV store.
        index: The vector index (for the strays).
        report: A check of the tenant.
        limit: At most this many sessions and items queued; ``None``: all.

    Raises:
        BackendUnavailableError: The KV store or the index failed.
    """
    budget = len(report.sessions) + len(report.items) if limit is None else max(0, limit)
    tenant = report.tenant
    queued: list[Ref] = []
    outbox = keys.session_outbox_space(tenant)
    for (user_id, session_id), bound in report.sessions[:budget]:
        writes = [Put(outbox, keys.session_outbox_key(user_id, session_id), _token())]
        checks: list[Check] = []
        if bound:
            counts = keys.session_vectors_space(tenant, user_id)
            (raw,) = kv.get_many(counts, [session_id])
            if raw is None or not raw.isdigit() or int(raw) < bound:
                # Raised before the sync reads it, so the orphan windows are deleted too.
                writes.insert(0, Put(counts, session_id, str(bound).encode()))
                checks.append(Check(counts, session_id, raw))
        try:
            kv.commit(writes, checks)
        except ConflictError:
            continue  # the session's indexing moved on meanwhile: the next check sees
        queued.append((user_id, session_id))
    items = 0
    item_outbox = keys.item_outbox_space(tenant)
    for address, bound in report.items[: max(0, budget - len(queued))]:
        (box,) = kv.get_many(item_outbox, [address])
        try:
            kv.commit(
                [Put(item_outbox, address, outbox_entry(max(bound, outbox_bound(box))))],
                [Check(item_outbox, address, box)],
            )
        except ConflictError:
            continue
        items += 1
    if report.strays:
        index.delete(report.strays)
    left = len(report.sessions) + len(report.items) - len(queued) - items
    return QueuedRepair(sessions=tuple(queued), items=items, deleted=len(report.strays), left=left)


def bump_revisions(kv: KVStore, tenant: str, user_ids: Iterable[str]) -> None:
    """Give these users' sessions a new revision, so every process drops what it cached.

    Call after their vectors were re-indexed: a process that read the index
    while it was damaged cached no vectors for them. A user forgotten
    meanwhile is left alone (no record of them comes back).

    Raises:
        BackendUnavailableError: The KV store failed.
    """
    revisions = keys.session_revisions_space(tenant)
    users = keys.users_space(tenant)
    for user_id in dict.fromkeys(user_ids):
        try:
            kv.commit([Put(revisions, user_id, _token())], [Check(users, user_id, b"1")])
        except ConflictError:
            continue


def _token() -> bytes:
    return uuid.uuid4().hex.encode()


@dataclass(frozen=True, slots=True)
class IndexRepair:
    """What a repair of one tenant's index did (``Memory.repair_index``).

    Attributes:
        before: The check that found the damage.
        after: A check after the repair (consistent unless work was left).
        sessions: Sessions re-indexed (or whose vectors were deleted).
        items: Items re-indexed (or whose vectors were deleted).
        deleted: Stray vectors deleted.
    """

    before: IndexReport
    after: IndexReport
    sessions: int = 0
    items: int = 0
    deleted: int = 0


def register_tenant(kv: KVStore, tenant: str) -> None:
    """Record ``tenant`` in :func:`~tiers.keys.tenants_space` (a read when it is there already).

    An outage is logged, not raised: the tenant is registered by the next open.
    """
    space = keys.tenants_space()
    try:
        if kv.get_many(space, [tenant]) == [None]:
            kv.commit([Put(space, tenant, b"1")])
    except BackendUnavailableError as exc:
        logger.warning("could not register tenant %s (next open does): %s", tenant, exc)


def registered_tenants(kv: KVStore) -> list[str]:
    """Every tenant :func:`register_tenant` recorded, sorted.

    Raises:
        BackendUnavailableError: The KV store failed.
    """
    return [tenant for tenant, _ in kv.scan(keys.tenants_space())]
