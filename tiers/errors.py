"""Errors raised by the data layer.

Every error of ``tiers`` derives from :class:`TierError`; driver exceptions
(sqlite3, redis, chromadb) are translated at the backend boundary with
``raise ... from exc`` so callers never need to import a driver.

Hierarchy::

    TierError
    ├── InvalidInputError            bad input from the caller; nothing was written
    │   ├── ValueTooLargeError       a value over the store's size limit
    │   └── InputMismatchError       a replayed step / reused idempotency key got another input
    ├── NotFoundError                the thing asked for does not exist
    │   ├── RunNotFoundError
    │   ├── CheckpointNotFoundError
    │   ├── EffectNotFoundError
    │   ├── SessionNotFoundError
    │   └── FactNotFoundError
    ├── ConflictError                a concurrent writer won; re-read and retry
    │   ├── StaleWriterError         this writer was fenced out by a newer one
    │   ├── ThreadConflictError      a graph thread moved on since this writer read it
    │   ├── LeaseHeldError           another live worker holds the run's lease
    │   └── PlanMismatchError        an approval names another plan than the one requested
    ├── RunStateError                the run's status forbids the operation
    │   ├── RunCancelledError        the run was cancelled; stop at this step boundary
    │   ├── RunPausedError           the run is paused
    │   │   └── ApprovalPendingError     it waits for a human approval of a plan
    │   ├── EffectOutcomeUnknownError    an effect was invoked but never recorded
    │   ├── BudgetExceededError      the run spent its token / cost budget
    │   └── CompensationError        a compensation is missing or failed; escalate
    ├── CorruptRecordError           a stored record failed validation
    │   └── UndecryptableValueError  a value of an encrypted store is not this store's ciphertext
    └── BackendUnavailableError      the store could not be reached
        ├── StoreClosedError         the store was closed in this process: final, not transient
        ├── EmbedderError            the embedding model is missing, corrupt or failed
        ├── DataDirLockedError       another process (or instance) has the embedded data dir open
        ├── VolatileStoreError       the KV store would acknowledge commits it may lose
        └── EncryptionKeyError       the master key is missing, or not the one the store was encrypted with
"""

from __future__ import annotations


class TierError(Exception):
    """Root of every error raised by ``tiers``."""


class InvalidInputError(TierError):
    """The caller passed a value the data layer refuses; nothing was stored.

    Attributes:
        field: Name of the offending field, when there is one.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ValueTooLargeError(InvalidInputError):
    """A value is over the store's configured size limit."""


class InputMismatchError(InvalidInputError):
    """A step was replayed, or an idempotency key reused, with a different input.

    The checkpoint committed under the key stays as it was. Either the caller's
    input is not deterministic, or a changed step needs a new step name or
    idempotency key.

    Attributes:
        step: The step name of the call.
        idempotency_key: The key whose recorded input differs.
    """

    def __init__(self, message: str, *, step: str, idempotency_key: str) -> None:
        super().__init__(message, field="input")
        self.step = step
        self.idempotency_key = idempotency_key


class NotFoundError(TierError):
    """The requested record does not exist."""


class RunNotFoundError(NotFoundError):
    """No run with that id exists (for this tenant)."""

    @classmethod
    def absent(cls, run_id: str, tenant: str) -> RunNotFoundError:
        """The error for a run id that names no run: one wording wherever a run is looked up.

        Every route under ``/v1/runs/{run_id}`` answers an absent run (and a
        user-bound key another user's run) with this message word for word.
        """
        return cls(f"no run {run_id!r} in tenant {tenant!r}")


class CheckpointNotFoundError(NotFoundError):
    """No checkpoint with that id exists in the run."""


class EffectNotFoundError(NotFoundError):
    """The run's effect ledger has no effect with that idempotency key."""


class SessionNotFoundError(NotFoundError):
    """No session summary with that id exists for the user."""


class FactNotFoundError(NotFoundError):
    """The user has no fact with that key."""


class ConflictError(TierError):
    """An optimistic check failed: another writer changed the data first."""


class StaleWriterError(ConflictError):
    """The writer's lease epoch is older than the run's; it must stop writing."""


class ThreadConflictError(ConflictError):
    """A graph thread moved on since this writer read it: another writer appended first.

    Nothing was written. Writing anyway would fork the thread (two children of
    one checkpoint, one of them unreachable from the newest). Re-invoke to
    continue from the thread's newest checkpoint, or address the older
    checkpoint explicitly to branch from it on purpose.

    Attributes:
        thread_id: The thread.
        checkpoint_ns: The namespace within the thread ("" for the root graph).
        parent_id: The checkpoint the writer built on.
        head_id: The thread's newest checkpoint now.
    """

    def __init__(
        self,
        message: str,
        *,
        thread_id: str,
        checkpoint_ns: str,
        parent_id: str | None,
        head_id: str | None,
    ) -> None:
        super().__init__(message)
        self.thread_id = thread_id
        self.checkpoint_ns = checkpoint_ns
        self.parent_id = parent_id
        self.head_id = head_id


class RunStateError(TierError):
    """The run's status does not allow this operation (e.g. appending to a completed run)."""


class CorruptRecordError(TierError):
    """A stored record could not be decoded or validated."""


class UndecryptableValueError(CorruptRecordError):
    """A value read from an encrypted store is not an encryption made by this store.

    It was written without encryption (a store that was plaintext before:
    ``tiermem encrypt`` encrypts it in place), changed on disk, copied from
    another key, tenant or store, or written by a newer tiermem. Never
    returned as garbage: the read fails.
    """


class BackendUnavailableError(TierError):
    """The storage backend could not be reached or failed; retry later."""


class StoreClosedError(BackendUnavailableError):
    """The store (KV store or vector index) was closed in this process; every use after is refused.

    Unlike the other unavailable errors this one is final: retrying cannot
    succeed, so a background worker that meets it stops. Open a new store.
    """


class EmbedderError(BackendUnavailableError):
    """The embedding model could not be loaded or run (missing, corrupt or failing).

    The message names the fix, e.g. reinstalling the model's wheel.
    """


class LeaseHeldError(ConflictError):
    """Another caller holds a live lease on the run.

    Every caller that takes a lease without naming a ``worker_id`` is a holder
    of its own, so this also protects a run from another thread of the same
    process and from another HTTP request. Wait for the lease to expire (the
    holder stopped heartbeating), pass ``steal=True`` to take it over and fence
    the holder out, or, to retake a lease of your own, pass the worker id you
    took it with (``RunHandle.worker_id``).

    Attributes:
        run_id: The run whose lease is held.
        owner: The worker holding the lease.
        expires_at: When the lease expires unless renewed (ISO 8601 text).
    """

    def __init__(self, message: str, *, owner: str, expires_at: str, run_id: str = "") -> None:
        super().__init__(message)
        self.run_id = run_id
        self.owner = owner
        self.expires_at = expires_at


class PlanMismatchError(ConflictError):
    """An approval decision names a plan hash other than the one the run waits on."""


class RunCancelledError(RunStateError):
    """The run was cancelled; a worker raises it at its next step boundary."""


class RunPausedError(RunStateError):
    """The run is paused; nothing may be appended until it is resumed."""


class ApprovalPendingError(RunPausedError):
    """The run is paused at a human-approval gate.

    Not a failure: the worker should stop; ``TaskTier.approve`` or ``reject``
    makes the run resumable, and the resumed run passes the gate.

    Attributes:
        run_id: The paused run.
        plan_hash: SHA-256 of the frozen plan awaiting approval.
        approval_key: Key of the gate.
    """

    def __init__(self, message: str, *, run_id: str, plan_hash: str, approval_key: str) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.plan_hash = plan_hash
        self.approval_key = approval_key


class EffectOutcomeUnknownError(RunStateError):
    """An effect was invoked but its result was never recorded (the worker died in between).

    The run cannot continue past it automatically (nor be compensated): pass a
    ``reconcile`` callback to the effect (it probes the external system by
    idempotency key), or decide with ``TaskTier.resolve_effect``.

    Attributes:
        run_id: The run.
        effect_key: The effect's idempotency key (the first one, when several are unknown).
        effect_name: The effect's name.
        effect_keys: Every unknown effect's key the operation was refused for.
    """

    def __init__(
        self,
        message: str,
        *,
        run_id: str,
        effect_key: str,
        effect_name: str,
        effect_keys: list[str] | None = None,
    ) -> None:
        super().__init__(message)
        self.run_id = run_id
        self.effect_key = effect_key
        self.effect_name = effect_name
        self.effect_keys = [effect_key] if effect_keys is None else list(effect_keys)


class BudgetExceededError(RunStateError):
    """The run has spent its token or cost budget; no further step may start."""


class CompensationError(RunStateError):
    """A compensation could not run (none registered, or it raised): a human must take over."""


class DataDirLockedError(BackendUnavailableError):
    """Another process, or another open instance in this one, has the embedded data dir open.

    One process per embedded data dir: two would each keep their own embedded
    index state and diverge. Stop the other process (or close the other
    instance), or go through the service that has the dir open.

    Attributes:
        data_dir: The data dir.
        pid: The holder's process id, when it could be read (else ``None``).
    """

    def __init__(self, message: str, *, data_dir: str, pid: int | None) -> None:
        super().__init__(message)
        self.data_dir = data_dir
        self.pid = pid


class VolatileStoreError(BackendUnavailableError):
    """The KV store would acknowledge commits that a crash or power cut can lose.

    E.g. Redis without ``appendonly yes`` and ``appendfsync always``, or SQLite
    with ``durable=false``. Make the store durable, or opt in explicitly with
    the ``allow_volatile`` setting (``TIERMEM_ALLOW_VOLATILE=true``).

    Attributes:
        reason: What makes the store volatile.
    """

    def __init__(self, message: str, *, reason: str) -> None:
        super().__init__(message)
        self.reason = reason


class EncryptionKeyError(BackendUnavailableError):
    """The store cannot be opened with the encryption settings given.

    The master key is not the one the store's data keys are wrapped with
    (the message gives both key ids), none is configured for a store that is
    encrypted, or one is configured for a store that holds data written
    without encryption (``tiermem encrypt`` first). Nothing is read or written.
    """
