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
    │   ├── SessionNotFoundError
    │   └── FactNotFoundError
    ├── ConflictError                a concurrent writer won; re-read and retry
    │   └── StaleWriterError         this writer was fenced out by a newer one
    ├── RunStateError                the run's status forbids the operation
    ├── CorruptRecordError           a stored record failed validation
    └── BackendUnavailableError      the store could not be reached
        └── EmbedderError            the embedding model is missing, corrupt or failed
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


class CheckpointNotFoundError(NotFoundError):
    """No checkpoint with that id exists in the run."""


class SessionNotFoundError(NotFoundError):
    """No session summary with that id exists for the user."""


class FactNotFoundError(NotFoundError):
    """The user has no fact with that key."""


class ConflictError(TierError):
    """An optimistic check failed: another writer changed the data first."""


class StaleWriterError(ConflictError):
    """The writer's lease epoch is older than the run's; it must stop writing."""


class RunStateError(TierError):
    """The run's status does not allow this operation (e.g. appending to a completed run)."""


class CorruptRecordError(TierError):
    """A stored record could not be decoded or validated."""


class BackendUnavailableError(TierError):
    """The storage backend could not be reached or failed; retry later."""


class EmbedderError(BackendUnavailableError):
    """The embedding model could not be loaded or run (missing, corrupt or failing).

    The message names the fix, e.g. reinstalling the model's wheel.
    """
