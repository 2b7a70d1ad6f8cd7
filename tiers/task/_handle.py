"""A worker's handle on one run: steps, exactly-once effects, approval gates, leases.

See :mod:`tiers.task` for the storage layout and the guarantees. :class:`RunHandle`
composes a :class:`~tiers.task._writer.RunWriter` (the lease it holds and the one
commit path, where a step is committed), :class:`~tiers.task._steps.Steps`,
:class:`~tiers.task._effects.Effects`, :class:`~tiers.task._compensation.Compensation`
and :class:`~tiers.task._approvals.ApprovalGate`; heartbeats and the run's end are
written here.
"""

from __future__ import annotations

from collections.abc import Awaitable, Callable, Mapping
from datetime import datetime, timedelta
from typing import Any

from pydantic import JsonValue

from tiers import cas
from tiers.backends.base import Check, Put
from tiers.codec import encode
from tiers.errors import (
    ConflictError,
    InvalidInputError,
)
from tiers.models import MAX_TEXT, Checkpoint, RunInfo
from tiers.task._approvals import ApprovalGate
from tiers.task._compensation import Compensation
from tiers.task._effects import Effects, Reconcile
from tiers.task._fresh import check_head_fresh_ms
from tiers.task._ledger import EffectLedger
from tiers.task._records import Approval, EffectStart, EventKind, to_json
from tiers.task._steps import Steps
from tiers.task._store import RunStore
from tiers.task._txn import Txn, doc_from
from tiers.task._writer import RunWriter

__all__ = ["RunHandle"]


class RunHandle:
    """A worker's lease on one run: the only way to append to it.

    Obtained from :meth:`TaskTier.start_run` (or ``acquire`` / ``attach``).
    Every write is one atomic commit that also checks "the run's head is
    exactly the bytes this handle last read or wrote", so it fails as a whole if
    the run was taken over (:class:`StaleWriterError`), cancelled
    (:class:`RunCancelledError`), paused, finished, or changed by another user
    of the same lease (:class:`ConflictError`).

    One thread drives a handle's steps; :meth:`heartbeat` may be called from
    another thread (a keep-alive loop) at the same time.

    Args:
        store: The tier's storage core.
        info: The run's head as the lease was taken (or attached).
        head: Its exact bytes.
        lease_ttl: Seconds every commit and heartbeat renews the lease by.
        resumed: Whether the run existed before this handle.
        compensation_only: The lease was taken for :meth:`compensate` only.
    """

    def __init__(
        self,
        store: RunStore,
        info: RunInfo,
        head: bytes,
        *,
        lease_ttl: float | None = None,
        resumed: bool = False,
        compensation_only: bool = False,
    ) -> None:
        self._store = store
        self._writer = RunWriter(
            store,
            info,
            head,
            lease_ttl=lease_ttl,
            resumed=resumed,
            compensation_only=compensation_only,
        )
        self._effects = Effects(self._writer, EffectLedger(self._writer))
        self._compensation = Compensation(self._effects)
        self._gate = ApprovalGate(self._writer)
        self._steps = Steps(self._writer)

    @property
    def run_id(self) -> str:
        """The run this handle writes to."""
        return self._writer.run_id

    @property
    def user_id(self) -> str:
        """Owner of the run."""
        return self._writer.info.user_id

    @property
    def epoch(self) -> int:
        """The lease epoch this handle holds (its fencing token)."""
        return self._writer.epoch

    @property
    def worker_id(self) -> str | None:
        """The worker id this handle's lease was taken as (``None`` for a released run attached).

        Pass it as ``worker_id`` to ``start_run``/``acquire`` to retake this
        lease while it is live; any other caller needs ``steal=True``.
        """
        return self._writer.worker_id

    @property
    def info(self) -> RunInfo:
        """The run's head as this handle last read or wrote it."""
        return self._writer.info

    @property
    def head_fresh_ms(self) -> float:
        """How long :meth:`step` and :meth:`append_checkpoint` trust the head this handle last read or wrote.

        Taken from the tier's ``head_fresh_ms``; set it to change this handle's
        window only (``0``: read the head before every step and checkpoint).
        """
        return self._writer.head_fresh_ms

    @head_fresh_ms.setter
    def head_fresh_ms(self, value: float) -> None:
        self._writer.head_fresh_ms = check_head_fresh_ms(value)

    @property
    def resumed(self) -> bool:
        """Whether the run existed before this handle was made (``False``: this handle created it)."""
        return self._writer.resumed

    @property
    def state(self) -> dict[str, JsonValue]:
        """The run's state values at its head (a copy): every ``state`` delta merged in order.

        Loaded on first use from the latest snapshot plus the checkpoints after
        it, so its cost does not grow with the run's length.
        """
        with self._writer.lock:
            return dict(self._writer.load_values())

    def latest_scope(self) -> dict[str, JsonValue] | None:
        """The newest scope snapshot on the run's current branch (see ``TaskTier.latest_scope``).

        A resumed worker restores its scopes from it before replaying:
        ``ScopeManager.restore(run.latest_scope())``. Replayed steps do not
        call their functions, so the scopes stay as the last committed step
        left them.
        """
        return self._store.latest_scope(self.run_id)

    def force_flush(self) -> None:
        """Block until everything this run (and the store) acknowledged is durable.

        See :meth:`TaskTier.force_flush`; :meth:`effect` calls it before
        invoking an effect.

        Raises:
            BackendUnavailableError: The store is closed or the flush failed.
        """
        self._store.force_flush()

    @doc_from(Effects.effect)
    def effect(
        self,
        name: str,
        fn: Callable[[], object] | Callable[[str], object],
        *,
        idempotency_key: str | None = None,
        input: object = None,
        safe_to_retry: bool = False,
        reconcile: Reconcile | None = None,
        compensation: Callable[[JsonValue], object] | None = None,
    ) -> JsonValue:
        return self._effects.effect(
            name,
            fn,
            idempotency_key=idempotency_key,
            input=input,
            safe_to_retry=safe_to_retry,
            reconcile=reconcile,
            compensation=compensation,
        )

    @doc_from(Effects.aeffect)
    async def aeffect(
        self,
        name: str,
        fn: Callable[[], Awaitable[object]] | Callable[[str], Awaitable[object]],
        *,
        idempotency_key: str | None = None,
        input: object = None,
        safe_to_retry: bool = False,
        reconcile: Callable[[str], object] | None = None,
        compensation: Callable[[JsonValue], object] | None = None,
    ) -> JsonValue:
        return await self._effects.aeffect(
            name,
            fn,
            idempotency_key=idempotency_key,
            input=input,
            safe_to_retry=safe_to_retry,
            reconcile=reconcile,
            compensation=compensation,
        )

    @doc_from(Effects.begin_effect)
    def begin_effect(
        self,
        name: str,
        *,
        idempotency_key: str,
        input: object = None,
        safe_to_retry: bool = False,
    ) -> EffectStart:
        return self._effects.begin_effect(
            name, idempotency_key=idempotency_key, input=input, safe_to_retry=safe_to_retry
        )

    @doc_from(Effects.record_effect)
    def record_effect(self, idempotency_key: str, output: object) -> JsonValue:
        return self._effects.record_effect(idempotency_key, output)

    @doc_from(Effects.register_compensation)
    def register_compensation(self, name: str, fn: Callable[[JsonValue], object]) -> None:
        self._effects.register_compensation(name, fn)

    @doc_from(Compensation.compensate)
    def compensate(self) -> list[str]:
        return self._compensation.compensate()

    @doc_from(ApprovalGate.await_approval)
    def await_approval(self, plan: object, *, key: str | None = None) -> Approval:
        return self._gate.await_approval(plan, key=key)

    @doc_from(Steps.step)
    def step(
        self,
        name: str,
        fn: Callable[[], object],
        *,
        input: object = None,
        idempotency_key: str | None = None,
        scope: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    ) -> JsonValue:
        return self._steps.step(name, fn, input=input, idempotency_key=idempotency_key, scope=scope)

    @doc_from(Steps.append_checkpoint)
    def append_checkpoint(
        self,
        step: str,
        output: object,
        *,
        input: object = None,
        idempotency_key: str | None = None,
        scope: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
    ) -> Checkpoint:
        return self._steps.append_checkpoint(
            step, output, input=input, idempotency_key=idempotency_key, scope=scope, state=state
        )

    def heartbeat(self) -> datetime | None:
        """Renew this handle's lease; safe to call from a keep-alive thread.

        Returns:
            The new expiry, or ``None`` for a lease without a TTL (it only checks
            the lease is still held).

        Raises:
            StaleWriterError: Another worker took the lease; stop.
            RunCancelledError: The run was cancelled; stop.
            RunStateError: The run is finished.
        """
        with self._writer.lock:
            for attempt in range(cas.ATTEMPTS):
                info = self._writer.read_fresh()
                self._writer.check_lease(info)
                if info.status.finished:
                    # A finished run holds a lease only while being compensated.
                    self._writer.check_writable(info, compensating=self._writer.compensation_only)
                if self._writer.lease_ttl is None:
                    return None
                now = self._store.clock()
                expires = now + timedelta(seconds=self._writer.lease_ttl)
                new = info.model_copy(update={"lease_expires_at": expires, "updated_at": now})
                data = encode(new)
                try:
                    self._store.kv.commit(
                        [Put(self._store.runs, self._writer.run_id, data)],
                        [Check(self._store.runs, self._writer.run_id, self._writer.head)],
                    )
                except ConflictError:
                    cas.backoff(attempt)
                    continue
                self._store.recent_heads.wrote(self._writer.run_id, data)
                self._writer.held(data, new)
                return expires
        raise ConflictError(
            f"run {self._writer.run_id!r} changes too fast to renew its lease; retry"
        )

    def release(self) -> RunInfo:
        """Give the lease up (graceful shutdown): the run becomes ``resumable`` for another worker.

        A handle acquired for compensation releases the lease of its finished
        run (its status stays as it is).

        Raises:
            StaleWriterError: The lease was already taken over.
            RunStateError: The run is finished.
        """
        compensating = self._writer.compensation_only

        def build() -> Txn:
            txn = self._writer.txn()
            txn.add_event(EventKind.RUN_RELEASED, owner=txn.base.lease_owner)
            txn.update.lease_owner = None
            txn.update.lease_expires_at = None
            return txn

        def recheck(info: RunInfo) -> None:
            self._writer.check_writable(info, allow_paused=True, compensating=compensating)

        with self._writer.lock:
            recheck(self._writer.read_fresh())
            return self._writer.commit(build, None, recheck)

    def complete(self, result: object = None) -> RunInfo:
        """Mark the run completed, with an optional JSON-serialisable result.

        Raises:
            InvalidInputError: ``result`` is not JSON-serialisable.
            ValueTooLargeError: The head with ``result`` exceeds the value limit.
            StaleWriterError: The run was taken over by another handle.
            RunStateError: The run is already finished, cancelled or paused.
        """
        value = self._store.redactor.redact_json(to_json(result, field="result"))
        return self._writer.finish(EventKind.RUN_COMPLETED, result=value)

    def fail(self, error: str) -> RunInfo:
        """Mark the run failed. ``error`` is kept (truncated to 20,000 characters).

        Raises:
            InvalidInputError: ``error`` is not a string.
            StaleWriterError: The run was taken over by another handle.
            RunStateError: The run is already finished.
        """
        if not isinstance(error, str):
            raise InvalidInputError(
                f"error must be a string, got {type(error).__name__}", field="error"
            )
        error = self._store.redactor.redact(error)[:MAX_TEXT]
        return self._writer.finish(EventKind.RUN_FAILED, error=error)
