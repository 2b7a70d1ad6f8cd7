"""A worker's handle on one run: steps, exactly-once effects, approval gates, leases.

See :mod:`tiers.task` for the storage layout and the guarantees. :class:`RunHandle`
composes a :class:`~tiers.task._writer.RunWriter` (the lease it holds and the one
commit path, where a step is committed), :class:`~tiers.task._effects.Effects`,
:class:`~tiers.task._compensation.Compensation` and
:class:`~tiers.task._approvals.ApprovalGate`; steps, heartbeats and the run's end
are written here.
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
    RunStateError,
    StaleWriterError,
)
from tiers.models import MAX_TEXT, Checkpoint, RunInfo
from tiers.task._approvals import ApprovalGate
from tiers.task._compensation import Compensation
from tiers.task._effects import Effects, Reconcile
from tiers.task._fresh import AlreadyCommittedError, check_head_fresh_ms
from tiers.task._ledger import EffectLedger
from tiers.task._records import (
    Approval,
    EffectStart,
    EventKind,
    check_key,
    check_name,
    input_hash,
    to_json,
    to_json_dict,
)
from tiers.task._store import RunStore
from tiers.task._txn import Txn, doc_from, unpack_output
from tiers.task._writer import ActiveStep, RunWriter

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
        """How long :meth:`step` trusts the head this handle last read or wrote (``0``: never).

        Taken from the tier's ``head_fresh_ms``; set it to change this handle's
        window only (``0``: read the head before every step).
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

    def step(
        self,
        name: str,
        fn: Callable[[], object],
        *,
        input: object = None,
        idempotency_key: str | None = None,
        scope: Mapping[str, Any] | Callable[[], Mapping[str, Any]] | None = None,
    ) -> JsonValue:
        """Run a step once: replay its recorded output if committed, else call ``fn`` and commit.

        The default idempotency key is ``<run_id>/<step name>/<n>``, where ``n``
        counts this handle's earlier completed calls of the same step name: a
        script re-executed after a crash makes the same calls in the same order,
        so each call finds its own checkpoint. A call that raises does not count,
        so a retry of a failed step reuses its key.

        A step with no effect costs one durable commit (checkpoint, event,
        index and head together). Effects called inside ``fn`` (:meth:`effect`)
        are recorded on their own; a step re-executed after a crash replays
        their recorded outputs instead of repeating them.

        Whether ``fn`` may run (the run is not cancelled, taken over, deleted,
        finished, paused or over budget) is decided on the run's head. While
        the head this handle's last commit or read returned is less than
        :attr:`head_fresh_ms` old, and no write through this handle's
        ``TaskTier`` has changed the run since, the step decides on that head
        without reading it again (one round trip per step in a tight loop);
        otherwise it reads the head first. The commit checks the head's exact
        bytes either way, so what is stored never depends on this. The bound:
        a change by another writer (another process or ``TaskTier``) that lands
        after that last commit or read, when ``fn`` is called less than
        ``head_fresh_ms`` after it, does not stop ``fn``; the commit finds it and
        the step is decided again on the fresh head, exactly as a read before
        ``fn`` would have decided it: refused with the error below (nothing is
        stored, neither its output nor its charge), replayed if its key was
        committed meanwhile, or committed if the run still takes it. So ``fn``
        runs on a run changed that way only if it is called less than
        ``head_fresh_ms`` after the change, and then once. A refusal is never
        decided on an unread head, and effects (:meth:`effect`) read the head
        before they run, whatever the window. With ``head_fresh_ms=0`` the head
        is read before every step.

        Args:
            name: Step name (1-256 characters; surrounding whitespace is dropped).
            fn: Called with no arguments when the step is not committed yet. It
                returns the JSON-serialisable output, or a :class:`Charged` with
                the output, tokens/cost spent and state keys to set.
            input: The step's input, recorded as its SHA-256 (:func:`input_hash`);
                a replay with a different input raises :class:`InputMismatchError`.
            idempotency_key: Explicit key instead of the default one.
            scope: Optional JSON-serialisable snapshot stored with the checkpoint,
                or a function returning one, called after ``fn`` so the checkpoint
                holds the scopes as the step left them: pass
                ``scope=manager.snapshot`` (a ``ScopeManager``'s method, not its
                result) and a resumed worker restores them with
                ``ScopeManager.restore(run.latest_scope())``.

        Returns:
            The step's output after a JSON round trip, identical for the first
            execution and every replay.

        Raises:
            InvalidInputError: Bad name, key, non-JSON input/output/scope, or a step
                called from inside another step or effect of this handle.
            InputMismatchError: The key is committed with another input or step name.
            ValueTooLargeError: The checkpoint would exceed the store's value limit.
            StaleWriterError: The run was taken over by another handle; nothing was written.
            RunCancelledError: The run was cancelled (checked before ``fn`` runs, or
                at the commit within ``head_fresh_ms``, see above).
            ApprovalPendingError: The run waits at an approval gate.
            BudgetExceededError: The run's budget is spent (checked before ``fn`` runs,
                or at the commit within ``head_fresh_ms``, see above).
            RunNotFoundError: The run was deleted; nothing was written.
            RunStateError: The run is finished; nothing was written.
            ConflictError: This lease was used concurrently; nothing was written.
            Exception: Whatever ``fn`` raises, unchanged; nothing was written.
        """
        step = check_name(name)
        self._writer.refuse_nesting(step)
        occurrence = self._writer.occurrences.get(step, 0)
        key = (
            f"{self._writer.run_id}/{step}/{occurrence}"
            if idempotency_key is None
            else check_key(idempotency_key)
        )
        digest = input_hash(input, step=step)
        scope_value = None if scope is None or callable(scope) else _scope_json(scope, step)
        with self._writer.lock:
            # A head this handle read or wrote within head_fresh_ms decides without a read:
            # the commit checks its exact bytes, and decides again on a changed head.
            trusted = self._writer.head_is_fresh()
            info = self._writer.info if trusted else self._writer.read_fresh()
        try:
            existing, entry = self._admit(key, info)
        except (StaleWriterError, RunStateError):
            if not trusted:
                raise
            # A trusted head may be stale in the run's favour too (a budget raised, a run
            # resumed elsewhere): a refusal is only ever decided on a head just read.
            trusted = False
            with self._writer.lock:
                info = self._writer.read_fresh()
            existing, entry = self._admit(key, info)
        if existing is not None:
            self._writer.verify_replay(existing, step, digest, key)
            self._writer.occurrences[step] = occurrence + 1
            return existing.output
        active = ActiveStep(step, key, self._store.now())
        self._writer.active = active
        try:
            raw = fn()
        finally:
            self._writer.active = None
        output, tokens, cost, delta = unpack_output(raw, step)
        if callable(scope):
            scope_value = _scope_json(scope(), step)
        made: list[Checkpoint] = []

        def build() -> Txn:
            # A plain step's checkpoint carries started_at; a StepStarted event is
            # written durably only with a step's first effect (one commit per step).
            made.clear()
            txn = self._writer.txn()
            self._writer.add_debit(txn, tokens, cost, key)
            made.append(
                self._writer.add_checkpoint(
                    txn,
                    step,
                    key,
                    digest,
                    output,
                    scope_value,
                    active.started_at,
                    "step",
                    delta,
                    entry,
                )
            )
            return txn

        def decide_again(fresh: RunInfo) -> None:
            # The run changed after the head this step trusted: refuse or replay exactly as a
            # read before fn would have (fn has run once; its output is then not stored).
            nonlocal entry
            committed, entry = self._admit(key, fresh)
            if committed is not None:
                raise AlreadyCommittedError(committed)

        try:
            self._writer.commit(build, step, decide_again if trusted else None)
        except AlreadyCommittedError as replayed:
            self._writer.verify_replay(replayed.checkpoint, step, digest, key)
            self._writer.occurrences[step] = occurrence + 1
            return replayed.checkpoint.output
        self._store.observer.step_committed(
            self._writer.run_id,
            step,
            made[0].seq,
            made[0].checkpoint_id,
            key,
            (made[0].created_at - made[0].started_at).total_seconds(),
        )
        self._writer.occurrences[step] = occurrence + 1
        return made[0].output

    def _admit(self, key: str, info: RunInfo) -> tuple[Checkpoint | None, bytes | None]:
        """Decide a step on head ``info``: its committed checkpoint (replay), or may it run.

        Returns:
            The checkpoint that committed ``key`` (``None``: not committed, and the
            run takes a new step) and the index entry the commit checks.

        Raises:
            StaleWriterError, RunCancelledError, RunStateError, RunPausedError,
            ApprovalPendingError, BudgetExceededError: as :meth:`step` documents.
        """
        # Replaying a committed step writes nothing, so it is allowed while paused.
        self._writer.check_writable(info, allow_paused=True)
        existing, entry = self._writer.lookup(key, info)
        if existing is None:
            self._writer.check_writable(info)
            self._writer.check_budget(info)
        return existing, entry

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
            state: Keys of the run's state this step sets (stored as the delta).

        Returns:
            The committed (or previously committed) checkpoint.

        Raises:
            InvalidInputError: Bad step, key, or non-JSON input/output/scope/state.
            InputMismatchError: The key is committed with another input or step name.
            ValueTooLargeError: The checkpoint would exceed the store's value limit.
            StaleWriterError: The run was taken over by another handle; nothing was written.
            RunStateError: The run is finished, cancelled or paused; nothing was written.
            ConflictError: This lease was used concurrently; nothing was written.
        """
        name = check_name(step)
        self._writer.refuse_nesting(name)
        key = None if idempotency_key is None else check_key(idempotency_key)
        digest = input_hash(input, step=name)
        value = to_json(output, field="output", step=name)
        scope_value = None if scope is None else to_json_dict(scope, field="scope", step=name)
        delta = None if state is None else to_json_dict(state, field="state", step=name)
        info = self._writer.refresh()
        entry: bytes | None = None
        if key is not None:
            existing, entry = self._writer.lookup(key, info)
            if existing is not None:
                self._writer.verify_replay(existing, name, digest, key)
                return existing
        made: list[Checkpoint] = []

        def build() -> Txn:
            made.clear()
            txn = self._writer.txn()
            ckpt_key = (
                f"{self._writer.run_id}/{name}/@{txn.base.head_seq + 1}" if key is None else key
            )
            made.append(
                self._writer.add_checkpoint(
                    txn, name, ckpt_key, digest, value, scope_value, txn.now, "step", delta, entry
                )
            )
            return txn

        self._writer.commit(build, name)
        return made[0]

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
                now = self._store.now()
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


def _scope_json(scope: object, step: str) -> dict[str, JsonValue]:
    return to_json_dict(
        dict(scope) if isinstance(scope, Mapping) else scope, field="scope", step=step
    )
