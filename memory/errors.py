"""Errors raised by ``memory`` itself (the errors of the layers below are ``TierError`` and
``SummarizerError``, re-exported by :mod:`memory`).

Every error ``memory`` defines derives from :class:`MemoryLayerError`. A scope
operation that raises leaves the scopes exactly as they were.

Hierarchy::

    MemoryLayerError                     root of every error ``memory`` defines
    ├── ScopeError                       the scope manager (:mod:`memory.scope`)
    │   ├── InvalidScopeInputError       a bad argument (key, kind, phase, value, budget)
    │   ├── ReadOnlyScopeError           an attempt to change the read-only system context
    │   ├── TokenBudgetExceededError     content does not fit a token budget; nothing changed
    │   │   └── PromptBudgetTooSmallError    max_tokens cannot hold even the system context
    │   └── InvalidScopeSnapshotError    a snapshot failed validation; nothing was restored
    ├── ApiKeyError                      API keys of the service (:mod:`memory.apikeys`)
    │   ├── InvalidApiKeyError           the key is malformed, unknown or revoked
    │   └── ApiKeyNotFoundError          no key has that key id
    └── ClientError                      answers of the HTTP service (:mod:`memory.client`)
        ├── AuthenticationError          401: the API key is missing or refused
        ├── PermissionDeniedError        403: the key may not do this
        ├── ServiceOverloadedError       429: too much queued work; retry_after says when
        └── ServiceError                 any other failure answer (e.g. 500)
"""

from __future__ import annotations


class MemoryLayerError(Exception):
    """Root of every error defined by ``memory`` (scope manager, API keys, HTTP client).

    Named for the layer, not ``MemoryError``: that would shadow the builtin.
    """


class ScopeError(MemoryLayerError):
    """Root of every error raised by the scope manager."""


class InvalidScopeInputError(ScopeError):
    """An argument was refused; the scopes were not changed.

    Attributes:
        field: Name of the offending argument, when there is one.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field


class ReadOnlyScopeError(ScopeError):
    """The system context is read-only for the whole run.

    Build a new :class:`~memory.scope.ScopeManager` with a different system
    context instead of changing it in place.
    """


class TokenBudgetExceededError(ScopeError):
    """Content would exceed a token budget, so it was refused (never truncated).

    Attributes:
        needed: Tokens the refused content needs.
        remaining: Tokens still free in the budget.
        budget: The whole budget, in tokens.
    """

    def __init__(self, message: str, *, needed: int, remaining: int, budget: int) -> None:
        super().__init__(message)
        self.needed = needed
        self.remaining = remaining
        self.budget = budget


class PromptBudgetTooSmallError(TokenBudgetExceededError):
    """``max_tokens`` of a prompt context cannot hold the whole system context.

    The system context is never cut, so the caller must allow more tokens or
    shorten the system context.
    """


class InvalidScopeSnapshotError(ScopeError):
    """A scope snapshot is malformed, from an unknown schema version, or inconsistent.

    Attributes:
        field: Path of the offending field (e.g. ``trace[3].seq``), when known.
    """

    def __init__(self, message: str, *, field: str | None = None) -> None:
        super().__init__(message)
        self.field = field
