"""The storage core of the task tier: configuration, reads, and the one write path.

Every change to a run goes through :meth:`RunStore.apply` (a :class:`~tiers.task._txn.Txn`
committed against the head's exact bytes); operator actions retry it with
:meth:`RunStore.operate`. The feature objects (queries, time travel, retention,
approvals, effects) and every :class:`~tiers.task.RunHandle` hold a reference to
one :class:`RunStore`; none of them writes to the store another way.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from datetime import datetime, timedelta

import orjson
from pydantic import JsonValue

from tiers import cas, keys
from tiers.backends.base import Check, Flushable, KVStore, Put, Write
from tiers.codec import decode, encode
from tiers.errors import (
    CheckpointNotFoundError,
    ConflictError,
    CorruptRecordError,
    InvalidInputError,
    RunNotFoundError,
    ValueTooLargeError,
)
from tiers.ids import check_id
from tiers.models import Checkpoint, RunInfo, utcnow
from tiers.redaction import OFF, Redactor
from tiers.task import _format as task_format
from tiers.task._checkpoint_encode import encode_head
from tiers.task._fresh import RecentHeads
from tiers.task._observer import NULL_OBSERVER, TaskObserver
from tiers.task._records import (
    EffectRecord,
    Event,
    IdempotencyEntry,
    Snapshot,
    decode_checkpoint,
    decode_stored_checkpoint,
    seq_of_checkpoint_id,
    step_committed,
)
from tiers.task._txn import Txn

__all__ = [
    "DEFAULT_RETENTION",
    "DEFAULT_SNAPSHOT_EVERY",
    "RunStore",
    "check_budget",
    "check_ttl",
]


DEFAULT_SNAPSHOT_EVERY = 64
DEFAULT_RETENTION = timedelta(days=7)


_SCAN_PAGE = 64

INDEX_LOAD_LIMIT = 512
"""Most idempotency entries a resumed handle reads at once to skip each step's replay lookup."""

MAX_LEASE_TTL = 366 * 86_400.0
"""Longest lease TTL in seconds (a year): a lease must end in a representable time."""


def check_ttl(value: float | None, field: str) -> float | None:
    """A TTL in seconds: a finite number in (0, :data:`MAX_LEASE_TTL`], or ``None``."""
    if value is None:
        return None
    # `not 0 < value <= MAX` also refuses NaN; infinity and 1e20 would overflow a datetime.
    if (
        isinstance(value, bool)
        or not isinstance(value, int | float)
        or not 0 < value <= MAX_LEASE_TTL
    ):
        raise InvalidInputError(
            f"{field} must be a number of seconds > 0 and <= {MAX_LEASE_TTL:g} (a year)",
            field=field,
        )
    return float(value)


def check_budget(value: object, field: str, *, integer: bool) -> int | float | None:
    """A budget: ``None`` (unlimited), or a finite number >= 0 (an integer for tokens).

    NaN and infinity are refused: stored as JSON they would read back as
    ``null``, i.e. silently unlimited.
    """
    if value is None:
        return None
    if integer:
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise InvalidInputError(f"{field} must be an integer >= 0, or None", field=field)
        return value
    if isinstance(value, bool) or not isinstance(value, int | float) or not 0 <= value < math.inf:
        raise InvalidInputError(
            f"{field} must be a finite number >= 0, or None for unlimited", field=field
        )
    return float(value)


class RunStore:
    """Configuration, reads and the one write path of the task tier's runs on a KV store.

    The lifecycle table (:mod:`tiers.task._lifecycle`) moves a run's status inside
    each transaction this commits; the status is never written another way.

    Args: as for :class:`~tiers.task.TaskTier` (validated here).
    """

    def __init__(
        self,
        kv: KVStore,
        *,
        tenant: str = "default",
        lease_ttl: float | None = None,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        retention: timedelta = DEFAULT_RETENTION,
        clock: Callable[[], datetime] = utcnow,
        redactor: Redactor | None = None,
    ) -> None:
        if isinstance(snapshot_every, bool) or not isinstance(snapshot_every, int):
            raise InvalidInputError(
                "snapshot_every must be an integer >= 1", field="snapshot_every"
            )
        if snapshot_every < 1:
            raise InvalidInputError(
                "snapshot_every must be an integer >= 1", field="snapshot_every"
            )
        if not isinstance(retention, timedelta) or retention <= timedelta(0):
            raise InvalidInputError("retention must be a timedelta > 0", field="retention")
        self.kv = kv
        self.tenant = check_id(tenant, "tenant")
        self.runs = keys.runs_space(self.tenant)
        self.lease_ttl = check_ttl(lease_ttl, "lease_ttl")
        self.snapshot_every = snapshot_every
        self.retention = retention
        self.clock = clock
        # Applied to what runs store (outputs, state, scopes, results, effect outputs, plans);
        # hashes of inputs and outputs are taken before it, so replays match whatever it does.
        self.redactor = redactor if redactor is not None else OFF
        self.flusher: Callable[[], None] | None = kv.flush if isinstance(kv, Flushable) else None
        self.observer: TaskObserver = NULL_OBSERVER
        # How long a handle's step trusts the head it last read or wrote (set by TaskTier),
        # and the head each run last got through this store (tiers.task._fresh).
        self.head_fresh_ms: float = 0.0
        self.recent_heads = RecentHeads()
        # The layout version writes use (tiers.task._format), resolved when first needed,
        # and the format record to write with the first commit when it moved up on open.
        self._layout: int | None = None
        self.layout_stamp: Put | None = None

    def layout(self, *, taking: bool = False) -> int:
        """The layout version this store's writes to the tenant's runs use (read once, then kept).

        Resolved when a worker first takes a run (``taking``), before it
        writes: a tenant with nothing in flight moves to the newest layout
        then, its format record written with that take's commit
        (:attr:`layout_stamp`; see :mod:`tiers.task._format`). Resolved
        first by any other write (an attached handle's), a tenant without a
        record stays on layout 1 for this store. A migration while this store
        is open takes effect at its next open; until then it writes the older
        layout, which every reader reads.
        """
        if self._layout is None:
            self._layout, self.layout_stamp = task_format.resolve_layout(
                self.kv, self.tenant, self.clock(), may_stamp=taking
            )
        return self._layout

    def stamp(self, txn: Txn) -> bool:
        """Add the pending format record (if any) to ``txn``; ``True`` if it did."""
        if self.layout_stamp is None:
            return False
        txn.puts.append(self.layout_stamp)
        txn.checks.append(task_format.stamp_check(self.tenant))
        return True

    def stamped(self, written: bool) -> None:
        """After a take's commit: the record is stored (``written``), or resolve again."""
        if written:
            self.layout_stamp = None
        else:
            self._layout, self.layout_stamp = None, None

    def force_flush(self) -> None:
        """Block until every checkpoint and event acknowledged so far is durable.

        Only does something on a store in a bounded-durability mode, e.g.
        ``SqliteKVStore(path, durable=False, flush_interval=0.05)``, which
        acknowledges a commit before it is fsync'd and flushes in the
        background. :meth:`RunHandle.effect` calls this before it invokes an
        effect's function, so an irreversible effect never runs ahead of its
        durable ``EffectInvoked`` record. On a store that fsyncs every commit
        (the default) it returns at once. On Redis durability is the server's
        ``appendfsync``: with ``always`` every acknowledged commit is durable,
        with ``everysec`` within about a second, and this is a no-op.

        Raises:
            BackendUnavailableError: The store is closed or the flush failed.
        """
        if self.flusher is not None:
            started = time.perf_counter()
            self.flusher()
            self.observer.flushed(time.perf_counter() - started)

    def get_run(self, run_id: str) -> RunInfo:
        """The head of a run.

        Raises:
            RunNotFoundError: No such run in this tenant.
            CorruptRecordError: The stored head is not a valid record.
        """
        check_id(run_id, "run_id")
        data = self.read_head(run_id)
        if data is None:
            raise RunNotFoundError.absent(run_id, self.tenant)
        return self.decode_head(run_id, data)

    def get_checkpoint(self, run_id: str, checkpoint_id: str) -> Checkpoint:
        """One checkpoint of a run by its id: one point read (the id names its seq).

        Raises:
            InvalidInputError: Bad ``run_id``.
            RunNotFoundError: No such run.
            CheckpointNotFoundError: The run has no checkpoint with that id.
        """
        check_id(run_id, "run_id")
        seq = seq_of_checkpoint_id(checkpoint_id)
        ckpt = self.read_checkpoint(run_id, seq) if seq else None
        if ckpt is None or ckpt.checkpoint_id != checkpoint_id:
            # Only a miss reads the head: a run's checkpoints are deleted with it, atomically.
            self.get_run(run_id)
            raise CheckpointNotFoundError(f"run {run_id!r} has no checkpoint {checkpoint_id!r}")
        return ckpt

    def latest_scope(self, run_id: str) -> dict[str, JsonValue] | None:
        """The newest scope snapshot on the run's current branch: what a resumed worker restores.

        Steps store one with ``step(..., scope=manager.snapshot)``; checkpoints
        without one (effects, approvals, steps that passed none) are skipped,
        and so are checkpoints a state edit superseded.

        Raises:
            RunNotFoundError: No such run.
        """
        info = self.get_run(run_id)
        space = keys.run_space(self.tenant, run_id)
        start = keys.checkpoint_key(info.head_seq + 1)
        while True:
            page = self.kv.scan(
                space, prefix=keys.CHECKPOINT_PREFIX, start_after=start, reverse=True, limit=64
            )
            for key, data in page:
                ckpt = self.decode_checkpoint(run_id, key, data)
                if ckpt.scope is not None and info.in_lineage(ckpt.seq):
                    return ckpt.scope
            if len(page) < 64:
                return None
            start = page[-1][0]

    def operate(
        self, run_id: str, build: Callable[[RunInfo, datetime], Txn | RunInfo], what: str
    ) -> RunInfo:
        """Compare-and-set an operator's change onto the head (``build`` may return the head unchanged)."""
        for attempt in range(cas.ATTEMPTS):
            data = self.read_head(run_id)
            if data is None:
                raise RunNotFoundError.absent(run_id, self.tenant)
            info = self.decode_head(run_id, data)
            txn = build(info, self.clock())
            if isinstance(txn, RunInfo):
                return txn
            try:
                new, _ = self.apply(txn, data)
            except ConflictError:
                cas.backoff(attempt)
                continue
            return new
        raise ConflictError(f"run {run_id!r} is changing too fast to {what}; retry")

    def apply(self, txn: Txn, head: bytes | None) -> tuple[RunInfo, bytes]:
        """Commit ``txn`` if the head still holds exactly ``head`` (``None``: absent)."""
        new_info = txn.head()
        new_head = encode_head(new_info)
        writes: list[Write] = list(txn.puts)
        if txn.events:
            space = keys.run_space(self.tenant, txn.run_id)
            writes += [Put(space, keys.event_key(e.seq), encode(e)) for e in txn.events]
        writes.append(Put(self.runs, txn.run_id, new_head))
        # Measured only for an observer that hears it (every step commits).
        observer = self.observer
        timed = observer is not NULL_OBSERVER
        started = time.perf_counter() if timed else 0.0
        self.kv.commit(writes, [*txn.checks, Check(self.runs, txn.run_id, head)])
        self.recent_heads.wrote(txn.run_id, new_head)
        if timed:
            written = sum(len(w.value) for w in writes if isinstance(w, Put))
            observer.committed(time.perf_counter() - started, written)
        return new_info, new_head

    def fit(self, data: bytes) -> bytes:
        """``data`` (a state snapshot), refused if over the store's value limit."""
        if len(data) > self.kv.max_value_bytes:
            raise ValueTooLargeError(
                f"the run's state snapshot is {len(data)} bytes, over the store's limit of "
                f"{self.kv.max_value_bytes}: keep large values elsewhere and store references",
                field="values",
            )
        return data

    def read_head(self, run_id: str) -> bytes | None:
        """The run's head as stored (``None``: no such run)."""
        (data,) = self.kv.get_many(self.runs, [run_id])
        return data

    def decode_head(self, run_id: str, data: bytes) -> RunInfo:
        """The head ``data`` of ``run_id`` as a record, refused if it names another run."""
        info = decode(RunInfo, data, where=f"{self.runs}/{run_id}")
        if info.run_id != run_id:
            raise CorruptRecordError(
                f"stored RunInfo at {self.runs}/{run_id} names another run {info.run_id!r}"
            )
        return info

    def read_checkpoint(self, run_id: str, seq: int) -> Checkpoint | None:
        """Checkpoint ``seq`` of the run, or ``None``."""
        key = keys.checkpoint_key(seq)
        (data,) = self.kv.get_many(keys.run_space(self.tenant, run_id), [key])
        return None if data is None else self.decode_checkpoint(run_id, key, data)

    def decode_checkpoint(self, run_id: str, key: str, data: bytes) -> Checkpoint:
        """The checkpoint stored at ``key``, refused if it is another run's or seq's."""
        where = f"{keys.run_space(self.tenant, run_id)}/{key}"
        ckpt = decode_checkpoint(data, where=where)
        if ckpt.run_id != run_id or keys.checkpoint_key(ckpt.seq) != key:
            raise CorruptRecordError(
                f"stored Checkpoint at {where} is for run {ckpt.run_id!r} seq {ckpt.seq}"
            )
        return ckpt

    def lookup(
        self, run_id: str, key: str, info: RunInfo
    ) -> tuple[Checkpoint | None, bytes | None]:
        """The checkpoint on the run's current branch that committed ``key``, and the index bytes.

        An entry pointing to a superseded checkpoint gives ``(None, bytes)``: the
        step runs again and its new checkpoint replaces the entry.
        """
        space = keys.run_space(self.tenant, run_id)
        index_key = keys.idempotency_key(key)
        (data,) = self.kv.get_many(space, [index_key])
        if data is None:
            return None, None
        entry = decode(IdempotencyEntry, data, where=f"{space}/{index_key}")
        if not info.in_lineage(entry.seq):
            return None, data
        ckpt = self.read_checkpoint(run_id, entry.seq)
        if ckpt is None or ckpt.checkpoint_id != entry.checkpoint_id:
            raise CorruptRecordError(
                f"idempotency entry {space}/{index_key} points to checkpoint "
                f"{entry.checkpoint_id!r} (seq {entry.seq}), which is not stored"
            )
        return ckpt, data

    def index_keys(self, run_id: str, info: RunInfo) -> set[str] | None:
        """Every key of the run's idempotency index, or ``None`` for a run of more than
        :data:`INDEX_LOAD_LIMIT` checkpoints (then each step reads its own entry)."""
        if info.head_seq > INDEX_LOAD_LIMIT:
            return None
        space = keys.run_space(self.tenant, run_id)
        found = self.kv.scan(space, prefix=keys.IDEMPOTENCY_PREFIX, limit=INDEX_LOAD_LIMIT + 1)
        if len(found) > INDEX_LOAD_LIMIT:
            return None
        start = len(keys.IDEMPOTENCY_PREFIX)
        return {key[start:] for key, _ in found}

    def read_effect(self, run_id: str, key: str) -> tuple[EffectRecord | None, bytes | None]:
        """The ledger entry of effect ``key`` and its bytes (for a commit's check), or ``None``s."""
        data = self.read_effect_bytes(run_id, key)
        if data is None:
            return None, None
        where = f"{keys.run_space(self.tenant, run_id)}/{keys.effect_key(key)}"
        return decode(EffectRecord, data, where=where), data

    def read_effect_bytes(self, run_id: str, key: str) -> bytes | None:
        """The stored bytes of effect ``key``'s ledger entry, or ``None``."""
        space = keys.run_space(self.tenant, run_id)
        (data,) = self.kv.get_many(space, [keys.effect_key(key)])
        return data

    def effect_records(
        self, run_id: str, *, after_key: str | None = None, limit: int | None = None
    ) -> list[EffectRecord]:
        """The run's effect ledger in key order: all of it, or a page after ``after_key``."""
        space = keys.run_space(self.tenant, run_id)
        start = None if after_key is None else keys.effect_key(after_key)
        return [
            decode(EffectRecord, data, where=f"{space}/{key}")
            for key, data in self.kv.scan(
                space, prefix=keys.EFFECT_PREFIX, start_after=start, limit=limit
            )
        ]

    def values_at(self, run_id: str, seq: int) -> dict[str, JsonValue]:
        """State values as of checkpoint ``seq``: latest snapshot at or before it + the deltas after.

        Every branch root has a snapshot, so the checkpoints between the
        snapshot and ``seq`` are one linear stretch of the same branch.
        """
        if seq <= 0:
            return {}
        space = keys.run_space(self.tenant, run_id)
        found = self.kv.scan(
            space,
            prefix=keys.SNAPSHOT_PREFIX,
            start_after=keys.snapshot_key(seq + 1),
            reverse=True,
            limit=1,
        )
        values: dict[str, JsonValue] = {}
        base = 0
        if found:
            key, data = found[0]
            snap = decode(Snapshot, data, where=f"{space}/{key}")
            values, base = dict(snap.values), snap.seq
        if base < seq:
            for key, data in self.kv.scan(
                space,
                prefix=keys.CHECKPOINT_PREFIX,
                start_after=keys.checkpoint_key(base),
                limit=seq - base,
            ):
                ckpt = self.decode_checkpoint(run_id, key, data)
                if ckpt.state_delta:
                    values.update(ckpt.state_delta)
        return values

    def inline_events(self, run_id: str, info: RunInfo, wanted: list[int]) -> list[Event]:
        """The ``StepCommitted`` events of seqs ``wanted`` (ascending) that checkpoints hold (layout 2).

        A checkpoint's ``event_seq`` never decreases with its seq, so a binary
        search of point reads finds the first, and a scan from there the rest.

        Raises:
            CorruptRecordError: A wanted event is neither a row nor in a checkpoint.
        """
        if not wanted:
            return []
        space = keys.run_space(self.tenant, run_id)
        low, high = 1, max(info.head_seq, 1)
        while low < high:  # the first checkpoint whose event_seq reaches wanted[0]
            middle = (low + high) // 2
            (data,) = self.kv.get_many(space, [keys.checkpoint_key(middle)])
            if data is not None and _event_seq_of(data) < wanted[0]:
                low = middle + 1
            else:
                high = middle
        found: list[Event] = []
        left = set(wanted)
        start = keys.checkpoint_key(low - 1) if low > 1 else None
        while left:
            page = self.kv.scan(
                space, prefix=keys.CHECKPOINT_PREFIX, start_after=start, limit=_SCAN_PAGE
            )
            for key, data in page:
                ckpt, commit_epoch = decode_stored_checkpoint(data, where=f"{space}/{key}")
                event_seq = ckpt.event_seq or 0
                if event_seq > wanted[-1]:
                    break  # past every wanted event
                if commit_epoch is not None and event_seq in left:
                    left.discard(event_seq)
                    found.append(step_committed(ckpt, commit_epoch))
            else:
                if len(page) == _SCAN_PAGE:
                    start = page[-1][0]
                    continue
            break
        if left:
            raise CorruptRecordError(
                f"run {run_id!r}: event {min(left)} is neither stored nor held by a checkpoint"
            )
        return found


def _event_seq_of(data: bytes) -> int:
    """The ``event_seq`` of a stored checkpoint, without validating the rest (0 if it has none)."""
    try:
        value = orjson.loads(data).get("event_seq")
    except (orjson.JSONDecodeError, AttributeError):
        return 0
    return value if type(value) is int else 0
