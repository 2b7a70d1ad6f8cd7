"""The storage core of :class:`~tiers.task.TaskTier`: configuration, reads, and the one write path.

Every change to a run goes through :meth:`TierCore._apply` (a :class:`~tiers.task._txn.Txn`
committed against the head's exact bytes); operator actions retry it with
:meth:`TierCore._operate`. The feature modules (queries, time travel,
retention, approvals, effects) are mixins over this class.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from datetime import datetime, timedelta

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
from tiers.task._records import (
    EffectRecord,
    IdempotencyEntry,
    Snapshot,
    seq_of_checkpoint_id,
)
from tiers.task._txn import Txn

__all__ = ["DEFAULT_RETENTION", "DEFAULT_SNAPSHOT_EVERY", "TierCore"]


DEFAULT_SNAPSHOT_EVERY = 64
DEFAULT_RETENTION = timedelta(days=7)


MAX_LEASE_TTL = 366 * 86_400.0
"""Longest lease TTL in seconds (a year): a lease must end in a representable time."""


def _positive(value: float | None, field: str) -> float | None:
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


def _budget(value: object, field: str, *, integer: bool) -> int | float | None:
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


class TierCore:
    """Shared state and storage helpers of :class:`~tiers.task.TaskTier` (see its docstring)."""

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
        self._kv = kv
        self._tenant = check_id(tenant, "tenant")
        self._runs = keys.runs_space(self._tenant)
        self._lease_ttl = _positive(lease_ttl, "lease_ttl")
        self.snapshot_every = snapshot_every
        self.retention = retention
        self._clock = clock
        # Applied to what runs store (outputs, state, scopes, results, effect outputs, plans);
        # hashes of inputs and outputs are taken before it, so replays match whatever it does.
        self.redactor = redactor if redactor is not None else OFF
        self._flush: Callable[[], None] | None = kv.flush if isinstance(kv, Flushable) else None

    @property
    def tenant(self) -> str:
        """The tenant whose runs this tier reads and writes."""
        return self._tenant

    def _now(self) -> datetime:
        return self._clock()

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
        if self._flush is not None:
            self._flush()

    def get_run(self, run_id: str) -> RunInfo:
        """The head of a run.

        Raises:
            RunNotFoundError: No such run in this tenant.
            CorruptRecordError: The stored head is not a valid record.
        """
        check_id(run_id, "run_id")
        data = self._read_head(run_id)
        if data is None:
            raise RunNotFoundError(f"no run {run_id!r} in tenant {self._tenant!r}")
        return self._decode_head(run_id, data)

    def get_checkpoint(self, run_id: str, checkpoint_id: str) -> Checkpoint:
        """One checkpoint of a run by its id: one point read (the id names its seq).

        Raises:
            InvalidInputError: Bad ``run_id``.
            RunNotFoundError: No such run.
            CheckpointNotFoundError: The run has no checkpoint with that id.
        """
        check_id(run_id, "run_id")
        seq = seq_of_checkpoint_id(checkpoint_id)
        ckpt = self._read_checkpoint(run_id, seq) if seq else None
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
        space = keys.run_space(self._tenant, run_id)
        start = keys.checkpoint_key(info.head_seq + 1)
        while True:
            page = self._kv.scan(
                space, prefix=keys.CHECKPOINT_PREFIX, start_after=start, reverse=True, limit=64
            )
            for key, data in page:
                ckpt = self._decode_checkpoint(run_id, key, data)
                if ckpt.scope is not None and info.in_lineage(ckpt.seq):
                    return ckpt.scope
            if len(page) < 64:
                return None
            start = page[-1][0]

    def _operate(
        self, run_id: str, build: Callable[[RunInfo, datetime], Txn | RunInfo], what: str
    ) -> RunInfo:
        """Compare-and-set an operator's change onto the head (``build`` may return the head unchanged)."""
        for attempt in range(cas.ATTEMPTS):
            data = self._read_head(run_id)
            if data is None:
                raise RunNotFoundError(f"no run {run_id!r} in tenant {self._tenant!r}")
            info = self._decode_head(run_id, data)
            txn = build(info, self._now())
            if isinstance(txn, RunInfo):
                return txn
            try:
                new, _ = self._apply(txn, data)
            except ConflictError:
                cas.backoff(attempt)
                continue
            return new
        raise ConflictError(f"run {run_id!r} is changing too fast to {what}; retry")

    def _apply(self, txn: Txn, head: bytes | None) -> tuple[RunInfo, bytes]:
        """Commit ``txn`` if the head still holds exactly ``head`` (``None``: absent)."""
        space = keys.run_space(self._tenant, txn.run_id)
        new_info = txn.head()
        new_head = encode(new_info)
        writes: list[Write] = list(txn.puts)
        writes += [Put(space, keys.event_key(e.seq), encode(e)) for e in txn.events]
        writes.append(Put(self._runs, txn.run_id, new_head))
        self._kv.commit(writes, [*txn.checks, Check(self._runs, txn.run_id, head)])
        return new_info, new_head

    def _fit(self, data: bytes) -> bytes:
        if len(data) > self._kv.max_value_bytes:
            raise ValueTooLargeError(
                f"the run's state snapshot is {len(data)} bytes, over the store's limit of "
                f"{self._kv.max_value_bytes}: keep large values elsewhere and store references",
                field="values",
            )
        return data

    def _read_head(self, run_id: str) -> bytes | None:
        (data,) = self._kv.get_many(self._runs, [run_id])
        return data

    def _decode_head(self, run_id: str, data: bytes) -> RunInfo:
        info = decode(RunInfo, data, where=f"{self._runs}/{run_id}")
        if info.run_id != run_id:
            raise CorruptRecordError(
                f"stored RunInfo at {self._runs}/{run_id} names another run {info.run_id!r}"
            )
        return info

    def _read_checkpoint(self, run_id: str, seq: int) -> Checkpoint | None:
        key = keys.checkpoint_key(seq)
        (data,) = self._kv.get_many(keys.run_space(self._tenant, run_id), [key])
        return None if data is None else self._decode_checkpoint(run_id, key, data)

    def _decode_checkpoint(self, run_id: str, key: str, data: bytes) -> Checkpoint:
        where = f"{keys.run_space(self._tenant, run_id)}/{key}"
        ckpt = decode(Checkpoint, data, where=where)
        if ckpt.run_id != run_id or keys.checkpoint_key(ckpt.seq) != key:
            raise CorruptRecordError(
                f"stored Checkpoint at {where} is for run {ckpt.run_id!r} seq {ckpt.seq}"
            )
        return ckpt

    def _lookup(
        self, run_id: str, key: str, info: RunInfo
    ) -> tuple[Checkpoint | None, bytes | None]:
        """The checkpoint on the run's current branch that committed ``key``, and the index bytes.

        An entry pointing to a superseded checkpoint gives ``(None, bytes)``: the
        step runs again and its new checkpoint replaces the entry.
        """
        space = keys.run_space(self._tenant, run_id)
        index_key = keys.idempotency_key(key)
        (data,) = self._kv.get_many(space, [index_key])
        if data is None:
            return None, None
        entry = decode(IdempotencyEntry, data, where=f"{space}/{index_key}")
        if not info.in_lineage(entry.seq):
            return None, data
        ckpt = self._read_checkpoint(run_id, entry.seq)
        if ckpt is None or ckpt.checkpoint_id != entry.checkpoint_id:
            raise CorruptRecordError(
                f"idempotency entry {space}/{index_key} points to checkpoint "
                f"{entry.checkpoint_id!r} (seq {entry.seq}), which is not stored"
            )
        return ckpt, data

    def _read_effect(self, run_id: str, key: str) -> tuple[EffectRecord | None, bytes | None]:
        data = self._read_effect_bytes(run_id, key)
        if data is None:
            return None, None
        where = f"{keys.run_space(self._tenant, run_id)}/{keys.effect_key(key)}"
        return decode(EffectRecord, data, where=where), data

    def _read_effect_bytes(self, run_id: str, key: str) -> bytes | None:
        space = keys.run_space(self._tenant, run_id)
        (data,) = self._kv.get_many(space, [keys.effect_key(key)])
        return data

    def _effect_records(self, run_id: str) -> list[EffectRecord]:
        space = keys.run_space(self._tenant, run_id)
        return [
            decode(EffectRecord, data, where=f"{space}/{key}")
            for key, data in self._kv.scan(space, prefix=keys.EFFECT_PREFIX)
        ]

    def _values_at(self, run_id: str, seq: int) -> dict[str, JsonValue]:
        """State values as of checkpoint ``seq``: latest snapshot at or before it + the deltas after.

        Every branch root has a snapshot, so the checkpoints between the
        snapshot and ``seq`` are one linear stretch of the same branch.
        """
        if seq <= 0:
            return {}
        space = keys.run_space(self._tenant, run_id)
        found = self._kv.scan(
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
            for key, data in self._kv.scan(
                space,
                prefix=keys.CHECKPOINT_PREFIX,
                start_after=keys.checkpoint_key(base),
                limit=seq - base,
            ):
                ckpt = self._decode_checkpoint(run_id, key, data)
                if ckpt.state_delta:
                    values.update(ckpt.state_delta)
        return values
