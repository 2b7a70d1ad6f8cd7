"""Counting the scopes' refusals: where a :class:`ScopeManager` reports each one, by kind.

A scope refuses with a :class:`~memory.errors.ScopeError`; with ``metrics=`` given,
the manager, its working memory, trace and system context report each refusal once
to ``metrics.scope_violation(kind)`` (:class:`~memory.metrics.TiermemMetrics` counts
them in ``tiermem_memory_scope_violations_total{kind}``) and raise it unchanged.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Concatenate, ParamSpec, Protocol, TypeVar

from memory.errors import (
    InvalidScopeInputError,
    InvalidScopeSnapshotError,
    PromptBudgetTooSmallError,
    ReadOnlyScopeError,
    ScopeError,
    TokenBudgetExceededError,
)

P = ParamSpec("P")
R = TypeVar("R")

# Most specific first: PromptBudgetTooSmallError is a TokenBudgetExceededError.
_KINDS: tuple[tuple[type[ScopeError], str], ...] = (
    (ReadOnlyScopeError, "read_only"),
    (PromptBudgetTooSmallError, "prompt_budget"),
    (TokenBudgetExceededError, "token_budget"),
    (InvalidScopeSnapshotError, "invalid_snapshot"),
    (InvalidScopeInputError, "invalid_input"),
)
# Set on an error once reported: a refusal raised through two reporting layers
# (a manager's record() and its trace's append()) counts once.
_REPORTED = "_tiermem_scope_violation_reported"


class ScopeViolations(Protocol):
    """Where scope refusals go (:class:`~memory.metrics.TiermemMetrics` is one)."""

    def scope_violation(self, kind: str) -> None:
        """Count one refusal of ``kind`` (``read_only``, ``token_budget``, ...)."""


class _Reporting(Protocol):
    _violations: ScopeViolations | None


S = TypeVar("S", bound=_Reporting)


def violation_kind(error: ScopeError) -> str:
    """The label of a refusal: ``read_only``, ``prompt_budget``, ``token_budget``,
    ``invalid_snapshot``, ``invalid_input`` (``other`` for any other scope error)."""
    return next((kind for cls, kind in _KINDS if isinstance(error, cls)), "other")


def report(violations: ScopeViolations | None, error: ScopeError) -> None:
    """Report ``error`` to ``violations`` unless it was reported already (or nobody listens)."""
    if violations is None or getattr(error, _REPORTED, False):
        return
    setattr(error, _REPORTED, True)
    violations.scope_violation(violation_kind(error))


def reported(method: Callable[Concatenate[S, P], R]) -> Callable[Concatenate[S, P], R]:
    """Make ``method`` report the scope errors it raises to its object's ``_violations``."""

    @functools.wraps(method)
    def reporting(self: S, /, *args: P.args, **kwargs: P.kwargs) -> R:
        try:
            return method(self, *args, **kwargs)
        except ScopeError as error:
            report(getattr(self, "_violations", None), error)
            raise

    return reporting
