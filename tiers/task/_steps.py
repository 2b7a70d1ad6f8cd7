"""A handle's steps: whether one may run (or replays), decided on a fresh head, and its commit.

:class:`Steps` does the work of :meth:`RunHandle.step <tiers.task.RunHandle.step>`
(call a function once and commit its output) and
:meth:`RunHandle.append_checkpoint <tiers.task.RunHandle.append_checkpoint>` (commit
a step the caller ran itself). Both decide on the head the handle holds while it
is fresh (``head_fresh_ms``, :mod:`tiers.task._fresh`) instead of reading it
first, and decide again at the commit when the run changed meanwhile; both
commit through the handle's :class:`~tiers.task._writer.RunWriter`.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import Any

from pydantic import JsonValue

from tiers.errors import RunStateError, StaleWriterError
from tiers.models import Checkpoint, RunInfo
from tiers.task._fresh import AlreadyCommittedError
from tiers.task._observer import NULL_OBSERVER
from tiers.task._records import check_key, check_name, input_hash, to_json, to_json_dict
from tiers.task._txn import Txn, unpack_step_output
from tiers.task._writer import OPEN_STATUSES, ActiveStep, RunWriter

__all__ = ["Steps"]

# The most step names a handle keeps checked (names made per call fall back to the check).
_NAMES_HELD = 256

# What a write is decided to be on a head: the checkpoint that committed its key (a
# replay; None: a new write) and the index entry its commit checks.
Decision = tuple[Checkpoint | None, bytes | None]


class Steps:
    """The steps of one handle, written through its writer.

    Args:
        writer: The handle's lease and commit path.
    """

    def __init__(self, writer: RunWriter) -> None:
        self._writer = writer
        self._store = writer.store
        # Step names this handle checked, to the name check_name made of each: a worker
        # calls a few names over and over (one lookup instead of the check and its regex).
        self._names: dict[str, str] = {}

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
        plain = type(name) is str  # not a subclass: its hash and equality are str's
        step = self._names.get(name) if plain else None
        if step is None:
            step = check_name(name)
            if plain and len(self._names) < _NAMES_HELD:
                self._names[name] = step
        self._writer.refuse_nesting(step)
        occurrence = self._writer.occurrences.get(step, 0)
        key = (
            f"{self._writer.run_id}/{step}/{occurrence}"
            if idempotency_key is None
            else check_key(idempotency_key)
        )
        digest = input_hash(input, step=step)
        scope_value = None if scope is None or callable(scope) else _scope_json(scope, step)
        (existing, entry), trusted = self._decide(lambda info: self._admit(key, info))
        if existing is not None:
            self._writer.verify_replay(existing, step, digest, key)
            self._writer.occurrences[step] = occurrence + 1
            return existing.output
        active = ActiveStep(step, key, self._store.clock())
        self._writer.active = active
        try:
            raw = fn()
        finally:
            self._writer.active = None
        output, text, tokens, cost, delta = unpack_step_output(raw, step)
        if callable(scope):
            scope_value = _scope_json(scope(), step)
        made: list[Checkpoint] = []

        def build() -> Txn:
            # A plain step's checkpoint carries started_at; a StepStarted event is
            # written durably only with a step's first effect (one commit per step).
            made.clear()
            txn = self._writer.txn()
            if tokens or cost:
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
                    text,
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
        ckpt = made[0]
        observer = self._store.observer
        if observer is not NULL_OBSERVER:
            observer.step_committed(
                self._writer.run_id,
                step,
                ckpt.seq,
                ckpt.checkpoint_id,
                key,
                (ckpt.created_at - ckpt.started_at).total_seconds(),
            )
        self._writer.occurrences[step] = occurrence + 1
        return ckpt.output

    def _decide(self, admit: Callable[[RunInfo], Decision]) -> tuple[Decision, bool]:
        """Decide a write with ``admit`` on the held head while it is fresh, else on one read now.

        Returns:
            What ``admit`` decided, and whether it decided on a trusted (unread)
            head: then the commit must decide again on a changed head.

        Raises:
            Whatever ``admit`` raises on a head just read.
        """
        with self._writer.lock:
            # A head this handle read or wrote within head_fresh_ms decides without a read:
            # the commit checks its exact bytes, and decides again on a changed head.
            trusted = self._writer.head_is_fresh()
            info = self._writer.info if trusted else self._writer.read_fresh()
        try:
            return admit(info), trusted
        except (StaleWriterError, RunStateError):
            if not trusted:
                raise
            # A trusted head may be stale in the run's favour too (a budget raised, a run
            # resumed elsewhere): a refusal is only ever decided on a head just read.
            with self._writer.lock:
                info = self._writer.read_fresh()
            return admit(info), False

    def _admit(self, key: str, info: RunInfo) -> Decision:
        """Decide a step on head ``info``: its committed checkpoint (replay), or may it run.

        Returns:
            The checkpoint that committed ``key`` (``None``: not committed, and the
            run takes a new step) and the index entry the commit checks.

        Raises:
            StaleWriterError, RunCancelledError, RunStateError, RunPausedError,
            ApprovalPendingError, BudgetExceededError: as :meth:`step` documents.
        """
        writer = self._writer
        known = writer.known_keys
        if (
            known is not None
            and key not in known
            and info.lease_epoch == writer.epoch
            and info.status in OPEN_STATUSES
            and not writer.compensation_only
            and info.budget_tokens is None
            and info.budget_cost is None
        ):
            # What the checks below decide for a new key on a running run of this lease
            # without a budget (every step of a plain loop), without their five calls.
            return None, None
        # Replaying a committed step writes nothing, so it is allowed while paused.
        writer.check_writable(info, allow_paused=True)
        existing, entry = writer.lookup(key, info)
        if existing is None:
            writer.check_writable(info)
            writer.check_budget(info)
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

        Whether the checkpoint may be committed (or its key replays) is decided
        on the run's head as :meth:`step` decides it: on the head this handle's
        last commit or read returned while that is less than ``head_fresh_ms``
        old and no write through this handle's ``TaskTier`` changed the run
        since (one round trip in a tight loop: the commit), else on a head read
        first. A refusal is only decided on a head just read, and the commit
        checks the head's exact bytes: when another writer changed the run
        meanwhile, the call is decided again on the fresh head, refused with
        the error below (nothing written), answered with the checkpoint that
        committed its key meanwhile, or committed. The caller ran the step
        already, so the window changes what is stored in no case; the one
        difference: a key this handle already committed is answered from the
        trusted head, even if another writer cancelled the run inside the window
        (nothing is written either way).

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
            RunNotFoundError: The run was deleted; nothing was written.
            ConflictError: This lease was used concurrently; nothing was written.
        """
        name = check_name(step)
        self._writer.refuse_nesting(name)
        key = None if idempotency_key is None else check_key(idempotency_key)
        digest = input_hash(input, step=name)
        value = to_json(output, field="output", step=name)
        scope_value = None if scope is None else to_json_dict(scope, field="scope", step=name)
        delta = None if state is None else to_json_dict(state, field="state", step=name)

        def admit(info: RunInfo) -> Decision:
            # Unlike a step's replay, a committed key is not returned while the run is paused.
            self._writer.check_writable(info)
            return (None, None) if key is None else self._writer.lookup(key, info)

        (existing, entry), trusted = self._decide(admit)
        if existing is not None:
            self._writer.verify_replay(existing, name, digest, existing.idempotency_key)
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

        def decide_again(fresh: RunInfo) -> None:
            # The run changed after the head this call trusted: refuse or replay exactly as a
            # read first would have.
            nonlocal entry
            committed, entry = admit(fresh)
            if committed is not None:
                raise AlreadyCommittedError(committed)

        try:
            self._writer.commit(build, name, decide_again if trusted else None)
        except AlreadyCommittedError as replayed:
            ckpt = replayed.checkpoint
            self._writer.verify_replay(ckpt, name, digest, ckpt.idempotency_key)
            return ckpt
        return made[0]


def _scope_json(scope: object, step: str) -> dict[str, JsonValue]:
    return to_json_dict(
        dict(scope) if isinstance(scope, Mapping) else scope, field="scope", step=step
    )
