"""The HTTP wire form of every typed error, in one table both ends of the wire read.

Each row of :data:`LIBRARY_PROBLEMS` ties an error class of ``tiers``,
``summarizer`` or ``memory`` to its problem type slug, HTTP status and title,
and says how the client rebuilds the error from the problem's members. The
service (``api/errors.py``) turns an error into a problem with
:func:`problem_members`; the client (:mod:`memory.client`) turns a problem back
into the error with :func:`error_from_problem`. :data:`SERVICE_PROBLEMS` holds
the problem types of the service's own failures (authentication, request
validation, overload), which the client raises as the classes below or as the
library error they amount to.

Failures that only exist over HTTP have their own classes::

    ClientError                     root of errors only the client raises
    ├── AuthenticationError         401: the API key is missing, unknown or revoked
    ├── PermissionDeniedError       403: the key lacks the scope, or is bound to another user
    ├── ServiceOverloadedError      429: too much queued work; ``retry_after`` seconds
    └── ServiceError                any other unexpected answer (``status``, ``problem``)
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from memory.apikeys import ApiKeyError, ApiKeyNotFoundError, InvalidApiKeyError
from memory.errors import (
    InvalidScopeInputError,
    InvalidScopeSnapshotError,
    MemoryLayerError,
    PromptBudgetTooSmallError,
    ReadOnlyScopeError,
    ScopeError,
    TokenBudgetExceededError,
)
from summarizer.errors import (
    InvalidTranscriptError,
    SummarizerError,
    SummarizerRateLimitError,
    SummarizerTimeoutError,
    SummarizerUnavailableError,
    SummaryGenerationError,
)
from tiers.errors import (
    ApprovalPendingError,
    BackendUnavailableError,
    BudgetExceededError,
    CheckpointNotFoundError,
    CompensationError,
    ConflictError,
    CorruptRecordError,
    EffectNotFoundError,
    EffectOutcomeUnknownError,
    EmbedderError,
    FactNotFoundError,
    InputMismatchError,
    InvalidInputError,
    LeaseHeldError,
    NotFoundError,
    PlanMismatchError,
    RunCancelledError,
    RunNotFoundError,
    RunPausedError,
    RunStateError,
    SessionNotFoundError,
    StaleWriterError,
    TierError,
    ValueTooLargeError,
)

PROBLEM_TYPE_PREFIX = "urn:tiermem:problem:"

Rebuild = Callable[[str, Mapping[str, Any]], Exception]
"""How the client rebuilds an error from a problem's ``detail`` and members."""


class ClientError(MemoryLayerError):
    """Root of the errors only the HTTP client raises.

    Attributes:
        status: The HTTP status code.
        problem: The server's problem details.
    """

    def __init__(self, message: str, *, status: int, problem: Mapping[str, Any]) -> None:
        super().__init__(message)
        self.status = status
        self.problem = dict(problem)


class AuthenticationError(ClientError):
    """401: the API key is missing, malformed, unknown or revoked."""


class PermissionDeniedError(ClientError):
    """403: the API key may not do this.

    A read-only key writing, or a key bound to one user (``tiermem keys create
    --user``) naming another user. Such a key gets :class:`~tiers.errors.RunNotFoundError`
    for another user's run, and lists its own user's runs only.
    """


class ServiceOverloadedError(ClientError):
    """429: the server has too much queued work.

    Attributes:
        retry_after: Seconds to wait before retrying.
    """

    def __init__(
        self, message: str, *, status: int, problem: Mapping[str, Any], retry_after: float
    ) -> None:
        super().__init__(message, status=status, problem=problem)
        self.retry_after = retry_after


class ServiceError(ClientError):
    """Any other failure answer of the server (e.g. an internal error, 500)."""


@dataclass(frozen=True, slots=True)
class ProblemSpec:
    """How one kind of error is reported.

    Attributes:
        status: HTTP status code.
        slug: Last part of the problem ``type`` URI.
        title: Short summary of the kind of problem.
        retry_after: Default ``Retry-After`` seconds (for 429/503), if any.
        public_detail: Whether the error's message is shown; ``False`` for
            server-side faults whose message is for the operator only.
    """

    status: int
    slug: str
    title: str
    retry_after: float | None = None
    public_detail: bool = True

    @property
    def type(self) -> str:
        """The problem ``type`` URI."""
        return PROBLEM_TYPE_PREFIX + self.slug


@dataclass(frozen=True, slots=True)
class ProblemRow:
    """One typed error and its problem type, both ways.

    Attributes:
        error: The error class the service reports (its subclasses without a
            row of their own are reported the same way).
        spec: Its status, slug and title.
        rebuild: How the client rebuilds it from the problem; ``None`` when the
            problem stands for more than this error (``internal`` is any
            unexpected failure, ``unauthorized`` any refused key): the client
            then raises what the status says.
    """

    error: type[Exception]
    spec: ProblemSpec
    rebuild: Rebuild | None


# -- problem members -> typed errors --------------------------------------------------------


def _field(p: Mapping[str, Any]) -> str | None:
    value = p.get("field")
    return value if isinstance(value, str) else None


def _plain(cls: Callable[[str], Exception]) -> Rebuild:
    return lambda detail, p: cls(detail)


def _with_field(cls: Callable[..., Exception]) -> Rebuild:
    return lambda detail, p: cls(detail, field=_field(p))


def _retry_after(p: Mapping[str, Any]) -> float | None:
    value = p.get("retry_after")
    return float(value) if isinstance(value, int | float) else None


def _unavailable(cls: type[SummarizerUnavailableError]) -> Rebuild:
    def build(detail: str, p: Mapping[str, Any]) -> Exception:
        reason = p.get("reason")
        return cls(
            detail,
            reason=reason
            if reason in ("timeout", "rate_limit", "connection", "server_error")
            else "connection",
            attempts=int(p.get("attempts") or 0),
            retry_after=_retry_after(p),
        )

    return build


def _budget(cls: type[TokenBudgetExceededError]) -> Rebuild:
    return lambda detail, p: cls(
        detail,
        needed=int(p.get("needed") or 0),
        remaining=int(p.get("remaining") or 0),
        budget=int(p.get("budget") or 0),
    )


def _input_mismatch(detail: str, p: Mapping[str, Any]) -> Exception:
    return InputMismatchError(
        detail, step=str(p.get("step", "")), idempotency_key=str(p.get("idempotency_key", ""))
    )


def _lease_held(detail: str, p: Mapping[str, Any]) -> Exception:
    return LeaseHeldError(
        detail,
        owner=str(p.get("owner", "")),
        expires_at=str(p.get("expires_at", "")),
        run_id=str(p.get("run_id", "")),
    )


def _approval_pending(detail: str, p: Mapping[str, Any]) -> Exception:
    return ApprovalPendingError(
        detail,
        run_id=str(p.get("run_id", "")),
        plan_hash=str(p.get("plan_hash", "")),
        approval_key=str(p.get("approval_key", "")),
    )


def _outcome_unknown(detail: str, p: Mapping[str, Any]) -> Exception:
    return EffectOutcomeUnknownError(
        detail,
        run_id=str(p.get("run_id", "")),
        effect_key=str(p.get("effect_key", "")),
        effect_name=str(p.get("effect_name", "")),
        effect_keys=[str(k) for k in p.get("effect_keys") or [p.get("effect_key", "")]],
    )


def _row(
    error: type[Exception],
    status: int,
    slug: str,
    title: str,
    rebuild: Rebuild | None = None,
    *,
    retry_after: float | None = None,
    public_detail: bool = True,
    rebuilt: bool = True,
) -> ProblemRow:
    return ProblemRow(
        error,
        ProblemSpec(status, slug, title, retry_after=retry_after, public_detail=public_detail),
        (rebuild or _plain(error)) if rebuilt else None,
    )


LIBRARY_PROBLEMS: tuple[ProblemRow, ...] = (
    # tiers
    _row(TierError, 500, "internal", "Internal error", public_detail=False, rebuilt=False),
    _row(InvalidInputError, 422, "invalid-input", "Invalid input", _with_field(InvalidInputError)),
    _row(
        ValueTooLargeError,
        413,
        "value-too-large",
        "Value too large",
        _with_field(ValueTooLargeError),
    ),
    _row(
        InputMismatchError,
        409,
        "input-mismatch",
        "Input does not match the recorded step",
        _input_mismatch,
    ),
    _row(NotFoundError, 404, "not-found", "Not found"),
    _row(RunNotFoundError, 404, "run-not-found", "Run not found"),
    _row(CheckpointNotFoundError, 404, "checkpoint-not-found", "Checkpoint not found"),
    _row(EffectNotFoundError, 404, "effect-not-found", "Effect not found"),
    _row(SessionNotFoundError, 404, "session-not-found", "Session not found"),
    _row(FactNotFoundError, 404, "fact-not-found", "Fact not found"),
    _row(ConflictError, 409, "conflict", "Conflicting concurrent change"),
    _row(StaleWriterError, 409, "stale-lease", "Stale lease"),
    _row(RunStateError, 409, "run-state", "Run state forbids this"),
    _row(LeaseHeldError, 409, "lease-held", "Another worker holds the lease", _lease_held),
    _row(PlanMismatchError, 409, "plan-mismatch", "Plan hash mismatch"),
    _row(RunCancelledError, 409, "run-cancelled", "Run cancelled"),
    _row(RunPausedError, 409, "run-paused", "Run paused"),
    _row(
        ApprovalPendingError,
        409,
        "approval-pending",
        "Run waits for an approval",
        _approval_pending,
    ),
    _row(
        EffectOutcomeUnknownError,
        409,
        "effect-outcome-unknown",
        "Effect outcome unknown",
        _outcome_unknown,
    ),
    _row(BudgetExceededError, 409, "budget-exceeded", "Run budget exceeded"),
    _row(CompensationError, 409, "compensation-failed", "Compensation missing or failed"),
    _row(CorruptRecordError, 500, "corrupt-record", "Corrupt stored record", public_detail=False),
    # A backend's failure names its host, port or file: the operator reads it in the log.
    _row(
        BackendUnavailableError,
        503,
        "backend-unavailable",
        "Storage unavailable",
        retry_after=1,
        public_detail=False,
    ),
    _row(
        EmbedderError,
        503,
        "embedder-unavailable",
        "Embedding model unavailable",
        retry_after=5,
        public_detail=False,
    ),
    # summarizer
    _row(SummarizerError, 500, "summarizer-error", "Summarizer error", public_detail=False),
    _row(
        InvalidTranscriptError,
        422,
        "invalid-transcript",
        "Invalid transcript",
        _with_field(InvalidTranscriptError),
    ),
    # The model's errors may name its endpoint or echo its output: details go to the log.
    _row(
        SummaryGenerationError,
        502,
        "summary-generation-failed",
        "Summary generation failed",
        public_detail=False,
    ),
    _row(
        SummarizerUnavailableError,
        503,
        "summarizer-unavailable",
        "Summarizer unavailable",
        _unavailable(SummarizerUnavailableError),
        retry_after=5,
        public_detail=False,
    ),
    _row(
        SummarizerTimeoutError,
        503,
        "summarizer-timeout",
        "Summarizer timed out",
        _unavailable(SummarizerTimeoutError),
        retry_after=5,
        public_detail=False,
    ),
    _row(
        SummarizerRateLimitError,
        429,
        "summarizer-rate-limited",
        "Summarizer rate limited",
        _unavailable(SummarizerRateLimitError),
        retry_after=10,
        public_detail=False,
    ),
    # memory
    _row(ScopeError, 422, "scope-error", "Scope error"),
    _row(
        InvalidScopeInputError,
        422,
        "invalid-scope-input",
        "Invalid scope input",
        _with_field(InvalidScopeInputError),
    ),
    _row(ReadOnlyScopeError, 409, "read-only-scope", "System context is read-only"),
    _row(
        TokenBudgetExceededError,
        422,
        "token-budget-exceeded",
        "Token budget exceeded",
        _budget(TokenBudgetExceededError),
    ),
    _row(
        PromptBudgetTooSmallError,
        422,
        "prompt-budget-too-small",
        "Token budget too small",
        _budget(PromptBudgetTooSmallError),
    ),
    _row(
        InvalidScopeSnapshotError,
        422,
        "invalid-scope-snapshot",
        "Invalid scope snapshot",
        _with_field(InvalidScopeSnapshotError),
    ),
    # A bad key is the service's 401, whichever way it was bad.
    _row(ApiKeyError, 401, "unauthorized", "Unauthorized", rebuilt=False),
    _row(InvalidApiKeyError, 401, "unauthorized", "Unauthorized", rebuilt=False),
    _row(ApiKeyNotFoundError, 404, "api-key-not-found", "API key not found"),
)
"""Each typed error of the library, its problem type, and how the client rebuilds it."""


@dataclass(frozen=True, slots=True)
class ServiceProblem:
    """A problem type of the service's own failures (no library error behind it).

    Attributes:
        spec: Its status, slug and title.
        rebuild: The error the client raises for it: a :class:`ClientError`
            for what only exists over HTTP, else the library error it amounts to.
    """

    spec: ProblemSpec
    rebuild: Callable[[str, int, Mapping[str, Any], float | None], Exception]


def _client(cls: type[ClientError]) -> Callable[..., Exception]:
    return lambda detail, status, p, retry_after: cls(detail, status=status, problem=p)


def _overloaded(
    detail: str, status: int, p: Mapping[str, Any], retry_after: float | None
) -> Exception:
    return ServiceOverloadedError(detail, status=status, problem=p, retry_after=retry_after or 1.0)


def _as_library(rebuild: Rebuild) -> Callable[..., Exception]:
    return lambda detail, status, p, retry_after: rebuild(detail, p)


SERVICE_PROBLEMS: Mapping[str, ServiceProblem] = {
    spec.slug: ServiceProblem(spec, rebuild)
    for spec, rebuild in (
        (ProblemSpec(401, "unauthorized", "Unauthorized"), _client(AuthenticationError)),
        (ProblemSpec(403, "forbidden", "Forbidden"), _client(PermissionDeniedError)),
        (
            ProblemSpec(413, "request-too-large", "Request too large"),
            _as_library(_with_field(ValueTooLargeError)),
        ),
        (ProblemSpec(429, "overloaded", "Too many requests", retry_after=1), _overloaded),
        (ProblemSpec(404, "job-not-found", "Job not found"), _as_library(_plain(NotFoundError))),
        (ProblemSpec(500, "job-abandoned", "Summary job abandoned"), _client(ServiceError)),
        (
            ProblemSpec(422, "validation-error", "Request validation failed"),
            _as_library(_with_field(InvalidInputError)),
        ),
        (
            ProblemSpec(400, "malformed-request", "Malformed request body"),
            _as_library(_with_field(InvalidInputError)),
        ),
        (ProblemSpec(400, "bad-request", "Bad request"), _client(ServiceError)),
        (ProblemSpec(405, "method-not-allowed", "Method not allowed"), _client(ServiceError)),
    )
}
"""Problem types of the service's own failures, by slug."""

_BY_SLUG: Mapping[str, Rebuild] = {
    row.spec.slug: row.rebuild for row in LIBRARY_PROBLEMS if row.rebuild is not None
}

# A problem of a slug this client does not know (a newer server) still gets its status's error.
_BY_STATUS: Mapping[int, Rebuild] = {
    404: _plain(NotFoundError),
    409: _plain(ConflictError),
    413: _with_field(ValueTooLargeError),
    422: _with_field(InvalidInputError),
    503: _plain(BackendUnavailableError),
}


def problem_members(exc: BaseException) -> dict[str, Any]:
    """Extra problem members that let a client rebuild the typed error (see the rebuilds above)."""
    members: dict[str, Any] = {}
    field = getattr(exc, "field", None)
    if isinstance(field, str):
        members["field"] = field
    if isinstance(exc, InputMismatchError):
        members.update(step=exc.step, idempotency_key=exc.idempotency_key)
    if isinstance(exc, SummarizerUnavailableError):
        members.update(reason=exc.reason, attempts=exc.attempts)
    if isinstance(exc, TokenBudgetExceededError):
        members.update(needed=exc.needed, remaining=exc.remaining, budget=exc.budget)
    if isinstance(exc, LeaseHeldError):
        members.update(run_id=exc.run_id, owner=exc.owner, expires_at=exc.expires_at)
    if isinstance(exc, ApprovalPendingError):
        members.update(run_id=exc.run_id, plan_hash=exc.plan_hash, approval_key=exc.approval_key)
    if isinstance(exc, EffectOutcomeUnknownError):
        members.update(
            run_id=exc.run_id,
            effect_key=exc.effect_key,
            effect_name=exc.effect_name,
            effect_keys=exc.effect_keys,
        )
    return members


def error_from_problem(
    status: int, problem: Mapping[str, Any], retry_after: float | None = None
) -> Exception:
    """The typed error a problem-details answer stands for.

    Args:
        status: The answer's HTTP status.
        problem: Its problem details.
        retry_after: Its ``Retry-After`` seconds, if it had the header.
    """
    detail = str(problem.get("detail") or problem.get("title") or f"HTTP {status}")
    slug = str(problem.get("type", "")).removeprefix(PROBLEM_TYPE_PREFIX)
    if status == 401:
        return AuthenticationError(detail, status=status, problem=problem)
    if status == 403:
        return PermissionDeniedError(detail, status=status, problem=problem)
    service = SERVICE_PROBLEMS.get(slug)
    if service is not None:
        return service.rebuild(detail, status, problem, retry_after)
    build = _BY_SLUG.get(slug)
    if status == 429 and build is None:
        return _overloaded(detail, status, problem, retry_after)
    build = build or _BY_STATUS.get(status)
    if build is None:
        return ServiceError(detail, status=status, problem=problem)
    if retry_after is not None and "retry_after" not in problem:
        problem = {**problem, "retry_after": retry_after}
    return build(detail, problem)
