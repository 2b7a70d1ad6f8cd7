"""The task tier: checkpoint-resume for long agent runs.

A *run* is one execution of an agent task, possibly spread over several
worker processes: a worker that crashes or is redeployed resumes the run, and
the steps already committed are replayed from their checkpoints instead of
being executed again.

Storage (every format is in :mod:`tiers.keys`):

- ``runs_space(tenant)`` / ``run_id`` -> :class:`~tiers.models.RunInfo`, the run's
  *head*: owner, status, ``head_seq``/``head_checkpoint_id`` and ``lease_epoch``.
  Every change to a run is a compare-and-set on the head's bytes, so the head
  serialises all writers of the run.
- ``run_space(tenant, run_id)`` / ``checkpoint_key(seq)`` ->
  :class:`~tiers.models.Checkpoint`, append-only: written once, never changed.
- ``run_space(tenant, run_id)`` / ``idempotency_key(key)`` -> which checkpoint
  committed ``key`` (:class:`IdempotencyEntry`).

**Leases and fencing.** :meth:`TaskTier.start_run` on an existing run takes its
lease by incrementing ``lease_epoch`` (compare-and-set) and returns a
:class:`RunHandle` carrying that epoch. Every write of a handle is one KV
commit that also checks "the head is exactly the bytes this handle read, with
this handle's epoch"; a handle whose run was resumed by another worker writes
nothing and gets :class:`~tiers.errors.StaleWriterError`. The epoch is the
fencing token; a later lease TTL/heartbeat adds fields to the head without
changing this scheme.

**One commit per checkpoint.** The checkpoint, its idempotency entry and the
new head (``head_seq + 1``) are written together or not at all, with checks
that the checkpoint and idempotency keys are absent. Hence sequence numbers
are gap-free and strictly increasing, and a committed checkpoint is never
overwritten. Later records of the same run (event log, effect ledger) join
this commit as extra writes.

**Delivery.** :meth:`RunHandle.step` executes ``fn`` and then commits its
checkpoint. A step whose checkpoint is committed is never executed again; a
worker killed between ``fn`` and the commit executes that one step again on
resume (at-least-once for the step in flight).

**Ids.** A checkpoint id is ``ckpt-<seq, 12 digits>-<12 hex digits of
SHA-256(run_id, seq, idempotency key)>``: it sorts by sequence within a run,
differs between runs, and needs neither a clock nor randomness, so a retried
commit builds the same id.

**Threads.** :class:`TaskTier` is stateless beyond its store and may be
shared by threads. A :class:`RunHandle` is used by one thread at a time (it
keeps per-handle step counters); give each worker thread its own handle.
"""

from __future__ import annotations

import hashlib
import json
import re
import secrets
import time
from collections.abc import Callable
from datetime import datetime
from typing import Any

from pydantic import Field, JsonValue, ValidationError

from tiers import keys
from tiers.backends.base import Check, KVStore, Put
from tiers.codec import decode, encode
from tiers.errors import (
    CheckpointNotFoundError,
    ConflictError,
    CorruptRecordError,
    InputMismatchError,
    InvalidInputError,
    RunNotFoundError,
    RunStateError,
    StaleWriterError,
    ValueTooLargeError,
)
from tiers.ids import check_id
from tiers.models import MAX_TEXT, Checkpoint, Record, RunInfo, RunStatus, utcnow

__all__ = [
    "IdempotencyEntry",
    "RunHandle",
    "TaskTier",
    "canonical_json",
    "input_hash",
    "new_run_id",
]

_CAS_ATTEMPTS = 16
_STEP_MAX = 256
_KEY_MAX = 512
_CONTROL = re.compile(r"[\x00-\x1f\x7f]")
_CHECKPOINT_ID = re.compile(r"ckpt-(\d{12})-[0-9a-f]{12}")


class IdempotencyEntry(Record):
    """Index entry of a run: the checkpoint that committed an idempotency key."""

    seq: int = Field(ge=1)
    checkpoint_id: str
    input_hash: str


def new_run_id() -> str:
    """A fresh run id that sorts by creation time: ``run-<epoch millis>-<12 hex>``."""
    return f"run-{time.time_ns() // 1_000_000:013d}-{secrets.token_hex(6)}"


def canonical_json(value: object, *, field: str, step: str | None = None) -> str:
    """Canonical JSON text of ``value``: sorted keys, no whitespace, UTF-8 (not ``\\u`` escapes).

    Args:
        value: Any JSON-serialisable value (dicts, lists, tuples, str, numbers, bool, None).
        field: Name of the argument, for the error.
        step: Step name, for the error.

    Raises:
        InvalidInputError: ``value`` is not JSON-serialisable (objects, sets, NaN,
            mixed-type dict keys, lone surrogates).
    """
    try:
        text = json.dumps(
            value, sort_keys=True, separators=(",", ":"), ensure_ascii=False, allow_nan=False
        )
        text.encode()
    except (TypeError, ValueError) as exc:
        where = f"step {step!r}: " if step is not None else ""
        raise InvalidInputError(
            f"{where}{field} must be JSON-serialisable (dict/list/str/number/bool/None, "
            f"no NaN): {exc}",
            field=field,
        ) from exc
    return text


def input_hash(value: object, *, step: str | None = None) -> str:
    """SHA-256 hex digest of the canonical JSON (:func:`canonical_json`) of a step's input."""
    return hashlib.sha256(canonical_json(value, field="input", step=step).encode()).hexdigest()


def _to_json(value: object, *, field: str, step: str | None = None) -> JsonValue:
    # A JSON round trip, so a first execution returns exactly what a replay will.
    parsed: JsonValue = json.loads(canonical_json(value, field=field, step=step))
    return parsed


def _check_step(name: object) -> str:
    if not isinstance(name, str):
        raise InvalidInputError(
            f"step name must be a string, got {type(name).__name__}", field="step"
        )
    step = name.strip()
    if not step:
        raise InvalidInputError("step name must not be empty", field="step")
    if len(step) > _STEP_MAX or _CONTROL.search(step):
        raise InvalidInputError(
            f"step name {step[:80]!r} is invalid: use 1-{_STEP_MAX} characters without "
            "control characters",
            field="step",
        )
    return step


def _check_key(key: object) -> str:
    if not isinstance(key, str):
        raise InvalidInputError(
            f"idempotency_key must be a string, got {type(key).__name__}",
            field="idempotency_key",
        )
    value = key.strip()
    if not value or len(value) > _KEY_MAX or _CONTROL.search(value):
        raise InvalidInputError(
            f"idempotency_key {value[:80]!r} is invalid: use 1-{_KEY_MAX} characters without "
            "control characters",
            field="idempotency_key",
        )
    return value


def _checkpoint_id(run_id: str, seq: int, key: str) -> str:
    digest = hashlib.sha256(f"{run_id}\0{seq}\0{key}".encode()).hexdigest()[:12]
    return f"ckpt-{seq:0{keys.SEQ_WIDTH}d}-{digest}"


def _check_fits(kv: KVStore, data: bytes, what: str, field: str) -> None:
    if len(data) > kv.max_value_bytes:
        raise ValueTooLargeError(
            f"{what} is {len(data)} bytes, over the store's limit of {kv.max_value_bytes} "
            "bytes: keep large data elsewhere and record a reference, or raise max_value_bytes",
            field=field,
        )


class TaskTier:
    """Runs and their checkpoints, on a :class:`~tiers.backends.base.KVStore`.

    Args:
        kv: The authoritative store.
        tenant: Namespace of every key this tier writes.
    """

    def __init__(self, kv: KVStore, *, tenant: str = "default") -> None:
        self._kv = kv
        self._tenant = check_id(tenant, "tenant")
        self._runs = keys.runs_space(self._tenant)

    @property
    def tenant(self) -> str:
        """The tenant whose runs this tier reads and writes."""
        return self._tenant

    # -- runs ------------------------------------------------------------------

    def start_run(
        self, user_id: str, run_id: str | None = None, *, resume: bool = True
    ) -> RunHandle:
        """Create a run, or resume an existing one, and take its lease.

        Resuming increments the run's ``lease_epoch``: any handle with an older
        epoch (another worker of the same run) is fenced out from then on.

        Args:
            user_id: Owner of the run.
            run_id: The run's id; ``None`` creates a new run with :func:`new_run_id`.
            resume: Whether an existing run may be resumed.

        Returns:
            A handle holding the new lease epoch.

        Raises:
            InvalidInputError: Bad ``user_id`` or ``run_id``.
            ConflictError: The run exists and ``resume`` is false, or it belongs to
                another user, or too many workers resumed it at once.
            RunStateError: The run is finished (completed, failed or cancelled).
        """
        check_id(user_id, "user_id")
        run_id = new_run_id() if run_id is None else check_id(run_id, "run_id")
        for _ in range(_CAS_ATTEMPTS):
            data = self._read_head(run_id)
            if data is None:
                info = RunInfo(run_id=run_id, user_id=user_id, lease_epoch=1)
            else:
                current = self._decode_head(run_id, data)
                if current.user_id != user_id:
                    raise ConflictError(
                        f"run id {run_id!r} is taken by another user: choose another run_id"
                    )
                if not resume:
                    raise ConflictError(
                        f"run {run_id!r} already exists: pass resume=True to resume it, or "
                        "choose another run_id"
                    )
                if current.status.finished:
                    raise RunStateError(
                        f"run {run_id!r} is {current.status.value} and cannot be resumed: "
                        "start a new run"
                    )
                info = current.model_copy(
                    update={
                        "lease_epoch": current.lease_epoch + 1,
                        "status": RunStatus.RUNNING,
                        "updated_at": utcnow(),
                    }
                )
            head = encode(info)
            try:
                self._kv.commit([Put(self._runs, run_id, head)], [Check(self._runs, run_id, data)])
            except ConflictError:
                continue
            return RunHandle(self, info, head)
        raise ConflictError(f"run {run_id!r} is being resumed by many workers at once; retry")

    def attach(self, run_id: str, epoch: int) -> RunHandle:
        """A handle on a run for a worker that already holds its lease.

        Unlike :meth:`start_run` this does not take the lease: it is how a
        stateless caller (an HTTP request) keeps writing with the epoch it got
        when it started or resumed the run.

        Raises:
            RunNotFoundError: No such run.
            StaleWriterError: ``epoch`` is not the run's current lease epoch.
            RunStateError: The run is finished.
        """
        check_id(run_id, "run_id")
        data = self._read_head(run_id)
        if data is None:
            raise RunNotFoundError(f"no run {run_id!r}")
        info = self._decode_head(run_id, data)
        if info.lease_epoch != epoch:
            raise StaleWriterError(
                f"run {run_id!r} is leased with epoch {info.lease_epoch}, not {epoch}: "
                "another worker resumed it; stop writing"
            )
        if info.status.finished:
            raise RunStateError(f"run {run_id!r} is {info.status.value}")
        return RunHandle(self, info, data)

    def cancel(self, run_id: str) -> RunInfo:
        """Cancel a run: every handle's next write gets :class:`RunStateError`.

        Cancelling a cancelled run does nothing.

        Returns:
            The cancelled run's head.

        Raises:
            RunNotFoundError: No such run.
            RunStateError: The run already completed or failed.
        """
        check_id(run_id, "run_id")
        for _ in range(_CAS_ATTEMPTS):
            data = self._read_head(run_id)
            if data is None:
                raise RunNotFoundError(f"no run {run_id!r} in tenant {self._tenant!r}")
            info = self._decode_head(run_id, data)
            if info.status is RunStatus.CANCELLED:
                return info
            if info.status.finished:
                raise RunStateError(
                    f"run {run_id!r} is {info.status.value}; it cannot be cancelled"
                )
            new = info.model_copy(update={"status": RunStatus.CANCELLED, "updated_at": utcnow()})
            try:
                self._kv.commit(
                    [Put(self._runs, run_id, encode(new))], [Check(self._runs, run_id, data)]
                )
            except ConflictError:
                continue
            return new
        raise ConflictError(f"run {run_id!r} is changing too fast to cancel; retry")

    # -- queries ---------------------------------------------------------------

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

    def latest_checkpoint(self, run_id: str) -> Checkpoint | None:
        """The run's head checkpoint, or ``None`` if it has none yet.

        Raises:
            RunNotFoundError: No such run.
        """
        info = self.get_run(run_id)
        if info.head_seq == 0:
            return None
        ckpt = self._read_checkpoint(run_id, info.head_seq)
        if ckpt is None:
            raise CorruptRecordError(
                f"run {run_id!r} has head_seq {info.head_seq} but no checkpoint at "
                f"{keys.run_space(self._tenant, run_id)}/{keys.checkpoint_key(info.head_seq)}"
            )
        return ckpt

    def history(
        self, run_id: str, *, limit: int | None = None, after_seq: int | None = None
    ) -> list[Checkpoint]:
        """Checkpoints of a run in sequence order.

        Args:
            run_id: The run.
            limit: At most this many (``None``: all).
            after_seq: Only checkpoints with a larger seq (for paging).

        Raises:
            RunNotFoundError: No such run.
            InvalidInputError: Negative ``limit`` or ``after_seq``.
        """
        for name, value in (("limit", limit), ("after_seq", after_seq)):
            if value is not None and (not isinstance(value, int) or value < 0):
                raise InvalidInputError(f"{name} must be an integer >= 0", field=name)
        self.get_run(run_id)
        space = keys.run_space(self._tenant, run_id)
        start = keys.checkpoint_key(after_seq) if after_seq else None
        items = self._kv.scan(space, prefix=keys.CHECKPOINT_PREFIX, start_after=start, limit=limit)
        return [self._decode_checkpoint(run_id, key, data) for key, data in items]

    def get_checkpoint(self, run_id: str, checkpoint_id: str) -> Checkpoint:
        """One checkpoint of a run by its id.

        Raises:
            RunNotFoundError: No such run.
            CheckpointNotFoundError: The run has no checkpoint with that id.
        """
        self.get_run(run_id)
        match = _CHECKPOINT_ID.fullmatch(checkpoint_id) if isinstance(checkpoint_id, str) else None
        ckpt = self._read_checkpoint(run_id, int(match.group(1))) if match else None
        if ckpt is None or ckpt.checkpoint_id != checkpoint_id:
            raise CheckpointNotFoundError(f"run {run_id!r} has no checkpoint {checkpoint_id!r}")
        return ckpt

    def list_runs(
        self, user_id: str | None = None, status: RunStatus | str | None = None
    ) -> list[RunInfo]:
        """Runs of this tenant, oldest first, optionally only one user's or one status.

        Raises:
            InvalidInputError: Bad ``user_id`` or unknown ``status``.
        """
        if user_id is not None:
            check_id(user_id, "user_id")
        wanted: RunStatus | None = None
        if status is not None:
            try:
                wanted = RunStatus(status)
            except ValueError as exc:
                choices = ", ".join(s.value for s in RunStatus)
                raise InvalidInputError(
                    f"unknown run status {status!r}: use one of {choices}", field="status"
                ) from exc
        runs = [
            decode(RunInfo, data, where=f"{self._runs}/{key}")
            for key, data in self._kv.scan(self._runs)
        ]
        runs = [
            r
            for r in runs
            if (user_id is None or r.user_id == user_id) and (wanted is None or r.status is wanted)
        ]
        runs.sort(key=lambda r: (r.created_at, r.run_id))
        return runs

    # -- storage helpers (shared with RunHandle) ---------------------------------

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

    def _find_committed(self, run_id: str, key: str) -> Checkpoint | None:
        space = keys.run_space(self._tenant, run_id)
        index_key = keys.idempotency_key(key)
        (data,) = self._kv.get_many(space, [index_key])
        if data is None:
            return None
        entry = decode(IdempotencyEntry, data, where=f"{space}/{index_key}")
        ckpt = self._read_checkpoint(run_id, entry.seq)
        if ckpt is None or ckpt.checkpoint_id != entry.checkpoint_id:
            raise CorruptRecordError(
                f"idempotency entry {space}/{index_key} points to checkpoint "
                f"{entry.checkpoint_id!r} (seq {entry.seq}), which is not stored"
            )
        return ckpt


class RunHandle:
    """A worker's lease on one run: the only way to append to it.

    Obtained from :meth:`TaskTier.start_run`. Every write first re-reads the
    run's head and then commits with a check on exactly those bytes, so it
    fails as a whole if the run was resumed elsewhere (:class:`StaleWriterError`),
    finished (:class:`RunStateError`) or changed by another user of this same
    handle (:class:`ConflictError`).

    A handle is used by one thread at a time.
    """

    def __init__(self, tier: TaskTier, info: RunInfo, head: bytes) -> None:
        self._tier = tier
        self._info = info
        self._head = head
        self._epoch = info.lease_epoch
        self._occurrences: dict[str, int] = {}
        self._active_step: str | None = None

    @property
    def run_id(self) -> str:
        """The run this handle writes to."""
        return self._info.run_id

    @property
    def user_id(self) -> str:
        """Owner of the run."""
        return self._info.user_id

    @property
    def epoch(self) -> int:
        """The lease epoch this handle holds (its fencing token)."""
        return self._epoch

    @property
    def info(self) -> RunInfo:
        """The run's head as this handle last read or wrote it."""
        return self._info

    def step(
        self,
        name: str,
        fn: Callable[[], object],
        *,
        input: object = None,
        idempotency_key: str | None = None,
        scope: dict[str, Any] | None = None,
    ) -> JsonValue:
        """Run a step once: replay its recorded output if committed, else call ``fn`` and commit.

        The default idempotency key is ``<run_id>/<step name>/<n>``, where ``n``
        counts this handle's earlier completed calls of the same step name: a
        script re-executed after a crash makes the same calls in the same order,
        so each call finds its own checkpoint. A call that raises does not count,
        so a retry of a failed step reuses its key.

        Args:
            name: Step name (1-256 characters; surrounding whitespace is dropped).
            fn: Called with no arguments (close over what it needs) when the step
                is not committed yet. Its return value must be JSON-serialisable.
            input: The step's input, recorded as its SHA-256 (:func:`input_hash`);
                a replay with a different input raises :class:`InputMismatchError`.
            idempotency_key: Explicit key instead of the default one.
            scope: Optional JSON-serialisable snapshot stored with the checkpoint.

        Returns:
            The step's output after a JSON round trip (tuples become lists, dict
            keys strings), identical for the first execution and every replay.

        Raises:
            InvalidInputError: Bad name, key, non-JSON input/output/scope, or a step
                called from inside another step of this handle (nesting would make
                the default keys differ between runs).
            InputMismatchError: The key is committed with another input or step name.
            ValueTooLargeError: The checkpoint would exceed the store's value limit;
                ``fn`` already ran, nothing was written.
            StaleWriterError: The run was resumed by another handle; nothing was written.
            RunStateError: The run is finished; nothing was written.
            RunNotFoundError: The run was deleted.
            ConflictError: This handle was used concurrently; nothing was written.
            Exception: Whatever ``fn`` raises, unchanged; nothing was written.
        """
        step = _check_step(name)
        if self._active_step is not None:
            raise InvalidInputError(
                f"step {step!r} called while step {self._active_step!r} is running on this "
                "handle: steps cannot be nested, and a handle is used by one thread at a time",
                field="step",
            )
        occurrence = self._occurrences.get(step, 0)
        key = (
            f"{self.run_id}/{step}/{occurrence}"
            if idempotency_key is None
            else _check_key(idempotency_key)
        )
        digest = input_hash(input, step=step)
        scope_value = self._scope(scope, step)
        info, head = self._fresh_head()
        existing = self._tier._find_committed(self.run_id, key)
        if existing is not None:
            self._verify_replay(existing, step, digest, key)
            self._occurrences[step] = occurrence + 1
            return existing.output
        started_at = utcnow()
        self._active_step = step
        try:
            raw = fn()
        finally:
            self._active_step = None
        output = _to_json(raw, field="output", step=step)
        ckpt = self._commit(info, head, step, digest, output, key, scope_value, started_at)
        self._occurrences[step] = occurrence + 1
        return ckpt.output

    def append_checkpoint(
        self,
        step: str,
        output: object,
        *,
        input: object = None,
        idempotency_key: str | None = None,
        scope: dict[str, Any] | None = None,
    ) -> Checkpoint:
        """Commit the checkpoint of a step the caller executed itself.

        With an ``idempotency_key`` already committed (same step name and input
        hash), the existing checkpoint is returned and nothing is written, even
        if ``output`` differs: the first commit wins. Without a key, every call
        appends (its key is ``<run_id>/<step>/@<seq>``).

        Args:
            step: Step name (1-256 characters).
            output: The step's JSON-serialisable output.
            input: The step's input, recorded as its SHA-256.
            idempotency_key: Key that makes retries of this call safe.
            scope: Optional JSON-serialisable snapshot stored with the checkpoint.

        Returns:
            The committed (or previously committed) checkpoint.

        Raises:
            InvalidInputError: Bad step, key, or non-JSON input/output/scope.
            InputMismatchError: The key is committed with another input or step name.
            ValueTooLargeError: The checkpoint would exceed the store's value limit.
            StaleWriterError: The run was resumed by another handle; nothing was written.
            RunStateError: The run is finished; nothing was written.
            ConflictError: This handle was used concurrently; nothing was written.
        """
        name = _check_step(step)
        key = None if idempotency_key is None else _check_key(idempotency_key)
        digest = input_hash(input, step=name)
        value = _to_json(output, field="output", step=name)
        scope_value = self._scope(scope, name)
        info, head = self._fresh_head()
        if key is None:
            key = f"{self.run_id}/{name}/@{info.head_seq + 1}"
        else:
            existing = self._tier._find_committed(self.run_id, key)
            if existing is not None:
                self._verify_replay(existing, name, digest, key)
                return existing
        return self._commit(info, head, name, digest, value, key, scope_value, utcnow())

    def complete(self, result: object = None) -> RunInfo:
        """Mark the run completed, with an optional JSON-serialisable result.

        Raises:
            InvalidInputError: ``result`` is not JSON-serialisable.
            ValueTooLargeError: The head with ``result`` exceeds the value limit.
            StaleWriterError: The run was resumed by another handle.
            RunStateError: The run is already finished.
        """
        value = _to_json(result, field="result")
        return self._finish(RunStatus.COMPLETED, {"result": value})

    def fail(self, error: str) -> RunInfo:
        """Mark the run failed. ``error`` is kept (truncated to 20,000 characters).

        Raises:
            InvalidInputError: ``error`` is not a string.
            StaleWriterError: The run was resumed by another handle.
            RunStateError: The run is already finished.
        """
        if not isinstance(error, str):
            raise InvalidInputError(
                f"error must be a string, got {type(error).__name__}", field="error"
            )
        return self._finish(RunStatus.FAILED, {"error": error[:MAX_TEXT]})

    # -- internals -------------------------------------------------------------

    def _fresh_head(self) -> tuple[RunInfo, bytes]:
        """Re-read the head; refuse early if this handle may no longer write.

        The commit re-checks these exact bytes, so a change between this read
        and the commit is still caught.
        """
        data = self._tier._read_head(self.run_id)
        if data is None:
            raise RunNotFoundError(f"run {self.run_id!r} no longer exists")
        info = self._tier._decode_head(self.run_id, data)
        self._refuse_if_fenced(info)
        self._info, self._head = info, data
        return info, data

    def _refuse_if_fenced(self, info: RunInfo) -> None:
        if info.lease_epoch != self._epoch:
            raise StaleWriterError(
                f"run {self.run_id!r} was resumed by another worker (lease epoch "
                f"{info.lease_epoch}, this handle holds {self._epoch}): stop using this "
                "handle; nothing was written"
            )
        if info.status.finished:
            raise RunStateError(
                f"run {self.run_id!r} is {info.status.value}: no more checkpoints can be added"
            )

    def _conflict(self, step: str | None) -> ConflictError | RunStateError | RunNotFoundError:
        """Explain why a commit's check failed (to be raised by the caller)."""
        what = f"step {step!r}" if step is not None else "status change"
        try:
            self._fresh_head()
        except (StaleWriterError, RunStateError, RunNotFoundError) as exc:
            return exc
        return ConflictError(
            f"{what} of run {self.run_id!r}: the run changed under this handle without a "
            f"new lease (same epoch {self._epoch}), so another thread used this handle; "
            "nothing was written. Use one handle per thread, then retry"
        )

    def _verify_replay(self, ckpt: Checkpoint, step: str, digest: str, key: str) -> None:
        if ckpt.step != step:
            raise InputMismatchError(
                f"idempotency key {key!r} of run {self.run_id!r} was committed by step "
                f"{ckpt.step!r} (seq {ckpt.seq}), not by step {step!r}: use another key",
                step=step,
                idempotency_key=key,
            )
        if ckpt.input_hash != digest:
            raise InputMismatchError(
                f"step {step!r} of run {self.run_id!r} is replayed with a different input than "
                f"the one recorded at seq {ckpt.seq} (idempotency key {key!r}): make the "
                "step's input deterministic, or give a changed step a new name or key",
                step=step,
                idempotency_key=key,
            )

    @staticmethod
    def _scope(scope: dict[str, Any] | None, step: str) -> dict[str, Any] | None:
        if scope is None:
            return None
        if not isinstance(scope, dict):
            raise InvalidInputError(
                f"step {step!r}: scope must be a dict, got {type(scope).__name__}", field="scope"
            )
        value = _to_json(scope, field="scope", step=step)
        assert isinstance(value, dict)  # a dict stays a dict through JSON
        return value

    def _commit(
        self,
        info: RunInfo,
        head: bytes,
        step: str,
        digest: str,
        output: JsonValue,
        key: str,
        scope: dict[str, Any] | None,
        started_at: datetime,
    ) -> Checkpoint:
        tier = self._tier
        seq = info.head_seq + 1
        now = utcnow()
        try:
            ckpt = Checkpoint(
                checkpoint_id=_checkpoint_id(self.run_id, seq, key),
                run_id=self.run_id,
                seq=seq,
                parent_id=info.head_checkpoint_id,
                step=step,
                input_hash=digest,
                output=output,
                idempotency_key=key,
                scope=scope,
                started_at=started_at,
                created_at=now,
            )
        except ValidationError as exc:
            first = exc.errors()[0]
            field = ".".join(str(p) for p in first["loc"]) or "output"
            raise InvalidInputError(
                f"step {step!r}: invalid checkpoint: {field}: {first['msg']}", field=field
            ) from exc
        data = encode(ckpt)
        _check_fits(tier._kv, data, f"checkpoint of step {step!r}", "output")
        new_info = info.model_copy(
            update={
                "head_seq": seq,
                "head_checkpoint_id": ckpt.checkpoint_id,
                "last_checkpoint_at": now,
                "updated_at": now,
            }
        )
        new_head = encode(new_info)
        space = keys.run_space(tier.tenant, self.run_id)
        ckpt_key = keys.checkpoint_key(seq)
        index_key = keys.idempotency_key(key)
        entry = IdempotencyEntry(seq=seq, checkpoint_id=ckpt.checkpoint_id, input_hash=digest)
        try:
            tier._kv.commit(
                [
                    Put(space, ckpt_key, data),
                    Put(space, index_key, encode(entry)),
                    Put(tier._runs, self.run_id, new_head),
                ],
                [
                    Check(space, ckpt_key, None),
                    Check(space, index_key, None),
                    Check(tier._runs, self.run_id, head),
                ],
            )
        except ConflictError as exc:
            raise self._conflict(step) from exc
        self._info, self._head = new_info, new_head
        return ckpt

    def _finish(self, status: RunStatus, update: dict[str, Any]) -> RunInfo:
        tier = self._tier
        info, head = self._fresh_head()
        new_info = info.model_copy(update={"status": status, "updated_at": utcnow(), **update})
        new_head = encode(new_info)
        _check_fits(tier._kv, new_head, f"run {self.run_id!r} with its result", "result")
        try:
            tier._kv.commit(
                [Put(tier._runs, self.run_id, new_head)], [Check(tier._runs, self.run_id, head)]
            )
        except ConflictError as exc:
            raise self._conflict(None) from exc
        self._info, self._head = new_info, new_head
        return new_info
