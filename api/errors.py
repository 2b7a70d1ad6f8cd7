"""Every failure of the API as one RFC 9457 problem+json body, mapped in one place.

:data:`ERROR_MAP` maps each typed error of ``tiers``, ``summarizer``, ``memory``
and this package to a status, a problem type and a title. An error is looked
up along its class's MRO, so a subclass without its own entry gets its
parent's. Nothing else in ``api`` chooses a status for an error, and no
response ever carries a stack trace.

Errors of the API layer itself::

    ApiError                         root of errors raised by ``api``
    ├── AuthenticationRequiredError  no API key was sent (401)
    ├── ForbiddenError               the key lacks the scope the route needs (403)
    ├── RequestTooLargeError         the request body is over max_request_bytes (413)
    ├── OverloadedError              too much queued work; retry after a while (429)
    ├── JobNotFoundError             no background job with that id for this tenant (404)
    └── JobAbandonedError            a job's worker stopped on every attempt (500, in its status)
"""

from __future__ import annotations

import logging
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.schemas.problems import FieldError, Problem
from memory.apikeys import ApiKeyError, ApiKeyNotFoundError, InvalidApiKeyError
from memory.errors import (
    InvalidScopeInputError,
    InvalidScopeSnapshotError,
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

logger = logging.getLogger("tiermem.api")

PROBLEM_TYPE_PREFIX = "urn:tiermem:problem:"
PROBLEM_MEDIA_TYPE = "application/problem+json"


class ApiError(Exception):
    """Root of the errors the API layer raises itself."""


class AuthenticationRequiredError(ApiError):
    """No API key was sent: use ``Authorization: Bearer <key>`` or ``X-API-Key: <key>``."""


class ForbiddenError(ApiError):
    """The API key is valid but lacks the scope this route needs (e.g. a read-only key writing)."""


class RequestTooLargeError(ApiError):
    """The request body is over the server's ``max_request_bytes``."""


class OverloadedError(ApiError):
    """The server has too much queued work; retry after ``retry_after`` seconds.

    Attributes:
        retry_after: Seconds the client should wait.
    """

    def __init__(self, message: str, *, retry_after: float) -> None:
        super().__init__(message)
        self.retry_after = retry_after


class JobNotFoundError(ApiError):
    """No background job has that id for this tenant (finished jobs are kept for a while only)."""


class JobAbandonedError(ApiError):
    """A background job's worker stopped (crashed, or was shut down) on each of its attempts.

    Reported in the job's status, never as a request's answer: resummarize the session.
    """


@dataclass(frozen=True, slots=True)
class ProblemSpec:
    """How one error class is reported.

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


ERROR_MAP: Mapping[type[BaseException], ProblemSpec] = {
    # tiers
    TierError: ProblemSpec(500, "internal", "Internal error", public_detail=False),
    InvalidInputError: ProblemSpec(422, "invalid-input", "Invalid input"),
    ValueTooLargeError: ProblemSpec(413, "value-too-large", "Value too large"),
    InputMismatchError: ProblemSpec(
        409, "input-mismatch", "Input does not match the recorded step"
    ),
    NotFoundError: ProblemSpec(404, "not-found", "Not found"),
    RunNotFoundError: ProblemSpec(404, "run-not-found", "Run not found"),
    CheckpointNotFoundError: ProblemSpec(404, "checkpoint-not-found", "Checkpoint not found"),
    EffectNotFoundError: ProblemSpec(404, "effect-not-found", "Effect not found"),
    SessionNotFoundError: ProblemSpec(404, "session-not-found", "Session not found"),
    FactNotFoundError: ProblemSpec(404, "fact-not-found", "Fact not found"),
    ConflictError: ProblemSpec(409, "conflict", "Conflicting concurrent change"),
    StaleWriterError: ProblemSpec(409, "stale-lease", "Stale lease"),
    RunStateError: ProblemSpec(409, "run-state", "Run state forbids this"),
    LeaseHeldError: ProblemSpec(409, "lease-held", "Another worker holds the lease"),
    PlanMismatchError: ProblemSpec(409, "plan-mismatch", "Plan hash mismatch"),
    RunCancelledError: ProblemSpec(409, "run-cancelled", "Run cancelled"),
    RunPausedError: ProblemSpec(409, "run-paused", "Run paused"),
    ApprovalPendingError: ProblemSpec(409, "approval-pending", "Run waits for an approval"),
    EffectOutcomeUnknownError: ProblemSpec(409, "effect-outcome-unknown", "Effect outcome unknown"),
    BudgetExceededError: ProblemSpec(409, "budget-exceeded", "Run budget exceeded"),
    CompensationError: ProblemSpec(409, "compensation-failed", "Compensation missing or failed"),
    CorruptRecordError: ProblemSpec(
        500, "corrupt-record", "Corrupt stored record", public_detail=False
    ),
    # A backend's failure names its host, port or file: the operator reads it in the log.
    BackendUnavailableError: ProblemSpec(
        503, "backend-unavailable", "Storage unavailable", retry_after=1, public_detail=False
    ),
    EmbedderError: ProblemSpec(
        503,
        "embedder-unavailable",
        "Embedding model unavailable",
        retry_after=5,
        public_detail=False,
    ),
    # summarizer
    SummarizerError: ProblemSpec(500, "summarizer-error", "Summarizer error", public_detail=False),
    InvalidTranscriptError: ProblemSpec(422, "invalid-transcript", "Invalid transcript"),
    # The model's errors may name its endpoint or echo its output: details go to the log.
    SummaryGenerationError: ProblemSpec(
        502, "summary-generation-failed", "Summary generation failed", public_detail=False
    ),
    SummarizerUnavailableError: ProblemSpec(
        503, "summarizer-unavailable", "Summarizer unavailable", retry_after=5, public_detail=False
    ),
    SummarizerTimeoutError: ProblemSpec(
        503, "summarizer-timeout", "Summarizer timed out", retry_after=5, public_detail=False
    ),
    SummarizerRateLimitError: ProblemSpec(
        429,
        "summarizer-rate-limited",
        "Summarizer rate limited",
        retry_after=10,
        public_detail=False,
    ),
    # memory
    ScopeError: ProblemSpec(422, "scope-error", "Scope error"),
    InvalidScopeInputError: ProblemSpec(422, "invalid-scope-input", "Invalid scope input"),
    ReadOnlyScopeError: ProblemSpec(409, "read-only-scope", "System context is read-only"),
    TokenBudgetExceededError: ProblemSpec(422, "token-budget-exceeded", "Token budget exceeded"),
    PromptBudgetTooSmallError: ProblemSpec(
        422, "prompt-budget-too-small", "Token budget too small"
    ),
    InvalidScopeSnapshotError: ProblemSpec(422, "invalid-scope-snapshot", "Invalid scope snapshot"),
    ApiKeyError: ProblemSpec(401, "unauthorized", "Unauthorized"),
    InvalidApiKeyError: ProblemSpec(401, "unauthorized", "Unauthorized"),
    ApiKeyNotFoundError: ProblemSpec(404, "api-key-not-found", "API key not found"),
    # api
    ApiError: ProblemSpec(500, "internal", "Internal error", public_detail=False),
    AuthenticationRequiredError: ProblemSpec(401, "unauthorized", "Unauthorized"),
    ForbiddenError: ProblemSpec(403, "forbidden", "Forbidden"),
    RequestTooLargeError: ProblemSpec(413, "request-too-large", "Request too large"),
    OverloadedError: ProblemSpec(429, "overloaded", "Too many requests", retry_after=1),
    JobNotFoundError: ProblemSpec(404, "job-not-found", "Job not found"),
    JobAbandonedError: ProblemSpec(500, "job-abandoned", "Summary job abandoned"),
}
"""Error class -> how it is reported. Looked up along the MRO: the most specific entry wins."""

INTERNAL = ProblemSpec(500, "internal", "Internal error", public_detail=False)

# Statuses of the framework's own errors (no route, wrong method, unreadable body).
_HTTP_SPECS: Mapping[int, ProblemSpec] = {
    400: ProblemSpec(400, "bad-request", "Bad request"),
    404: ProblemSpec(404, "not-found", "Not found"),
    405: ProblemSpec(405, "method-not-allowed", "Method not allowed"),
    413: ProblemSpec(413, "request-too-large", "Request too large"),
}
_VALIDATION = ProblemSpec(422, "validation-error", "Request validation failed")
_MALFORMED = ProblemSpec(400, "malformed-request", "Malformed request body")


def spec_for(exc: BaseException) -> ProblemSpec:
    """The :class:`ProblemSpec` of an error: its class's, or its nearest mapped ancestor's."""
    for cls in type(exc).__mro__:
        spec = ERROR_MAP.get(cls)
        if spec is not None:
            return spec
    return INTERNAL


def _extras(exc: BaseException) -> dict[str, Any]:
    """Extra problem members that let a client rebuild the typed error."""
    extras: dict[str, Any] = {}
    field = getattr(exc, "field", None)
    if isinstance(field, str):
        extras["field"] = field
    if isinstance(exc, InputMismatchError):
        extras.update(step=exc.step, idempotency_key=exc.idempotency_key)
    if isinstance(exc, SummarizerUnavailableError):
        extras.update(reason=exc.reason, attempts=exc.attempts)
    if isinstance(exc, TokenBudgetExceededError):
        extras.update(needed=exc.needed, remaining=exc.remaining, budget=exc.budget)
    if isinstance(exc, LeaseHeldError):
        extras.update(run_id=exc.run_id, owner=exc.owner, expires_at=exc.expires_at)
    if isinstance(exc, ApprovalPendingError):
        extras.update(run_id=exc.run_id, plan_hash=exc.plan_hash, approval_key=exc.approval_key)
    if isinstance(exc, EffectOutcomeUnknownError):
        extras.update(
            run_id=exc.run_id,
            effect_key=exc.effect_key,
            effect_name=exc.effect_name,
            effect_keys=exc.effect_keys,
        )
    return extras


def _retry_after(exc: BaseException, spec: ProblemSpec) -> float | None:
    asked = getattr(exc, "retry_after", None)
    if isinstance(asked, int | float) and asked > 0:
        return float(asked)
    return spec.retry_after


# The library's errors name the fix in Python terms; over HTTP the fix is a route or a body
# member. Each entry rewrites one such phrase ({run_id} is filled from the error when it
# names its run); tests/api/test_error_hygiene.py checks no Python advice is left in answers.
_HTTP_ADVICE: tuple[tuple[re.Pattern[str], str], ...] = tuple(
    (re.compile(pattern), replacement)
    for pattern, replacement in (
        (r"\bpass steal=True\b", 'send "steal": true to POST /v1/runs'),
        (r"\bpass resume=True\b", 'send "resume": true to POST /v1/runs'),
        (r"\bpass the worker_id you took it with\b", 'send the "worker_id" you took it with'),
        (
            r"Pass reconcile= to probe the external system by this idempotency key, mark it "
            r"safe_to_retry if it is idempotent, or decide with ",
            "Probe the external system by this idempotency key (or begin the effect with "
            '"safe_to_retry": true if it is idempotent) and decide with ',
        ),
        (
            r"TaskTier\.resolve_effect\(run_id, key, output=\.\.\. \| rerun=True\)",
            'POST /v1/runs/{run_id}/effects:resolve with the key and "output" (it happened) '
            'or "rerun": true (it did not)',
        ),
        (
            r"output=\.\.\. \(the effect happened\) or rerun=True \(it did not\)",
            '"output" (the effect happened) or "rerun": true (it did not)',
        ),
        (r"TaskTier\.approve/reject", "POST /v1/runs/{run_id}:approve or :reject"),
        (
            r"raise the budget with TaskTier\.set_budget, or finish the run",
            "finish the run (POST /v1/runs/{run_id}:complete) and start another with a larger "
            "budget",
        ),
        (
            r", or acquire it with for_compensation=True to undo its effects",
            " (a worker using the Python library can acquire it to compensate its effects)",
        ),
    )
)


_RUN_PATH = re.compile(r"^/v1/runs/([^/:]+)")


def http_detail(exc: BaseException, instance: str | None = None) -> str:
    """The error's message with the library's advice replaced by the HTTP route's.

    Args:
        exc: The error.
        instance: The request's path, where the run id is when the error does not name it.
    """
    text = str(exc)
    run_id = getattr(exc, "run_id", None)
    if not (isinstance(run_id, str) and run_id) and instance is not None:
        found = _RUN_PATH.match(instance)
        run_id = found.group(1) if found else None
    for pattern, replacement in _HTTP_ADVICE:
        if pattern.search(text):
            fix = (
                replacement.replace("{run_id}", run_id) if isinstance(run_id, str) else replacement
            )
            text = pattern.sub(fix.replace("\\", "\\\\"), text)
    return text


def problem_for(
    exc: BaseException, *, instance: str | None = None, request_id: str | None = None
) -> Problem:
    """The problem body of an error (also used for failed background jobs).

    A server-side fault's message (a backend's host, port or file, a model's
    endpoint) is not shown: the body says where to look, the log has it.
    """
    spec = spec_for(exc)
    if spec.public_detail and str(exc):
        detail = http_detail(exc, instance)
    else:
        detail = _hidden_detail(spec, request_id)
    return Problem(
        type=spec.type,
        title=spec.title,
        status=spec.status,
        detail=detail,
        instance=instance,
        request_id=request_id,
        **_extras(exc),
    )


def _hidden_detail(spec: ProblemSpec, request_id: str | None) -> str:
    where = f" (request id {request_id})" if request_id else ""
    retry = "; retry later" if spec.retry_after is not None else ""
    return (
        f"{spec.title.lower()} on the server{where}{retry}; the details are in the "
        "server's log for the operator"
    )


def problem_response(problem: Problem, *, headers: Mapping[str, str] | None = None) -> Response:
    """Render a problem as an ``application/problem+json`` response."""
    return Response(
        content=problem.model_dump_json(exclude_none=True),
        status_code=problem.status,
        media_type=PROBLEM_MEDIA_TYPE,
        headers=dict(headers or {}),
    )


def request_id_of(request: Request) -> str | None:
    """The id the middleware gave this request."""
    value = request.scope.get("state", {}).get("request_id")
    return value if isinstance(value, str) else None


def _headers_for(status: int, retry_after: float | None) -> dict[str, str]:
    headers: dict[str, str] = {}
    if retry_after is not None:
        headers["Retry-After"] = str(max(1, math.ceil(retry_after)))
    if status == 401:
        headers["WWW-Authenticate"] = 'Bearer realm="tiermem"'
    return headers


async def _typed_error(request: Request, exc: Exception) -> Response:
    spec = spec_for(exc)
    request_id = request_id_of(request)
    if spec.status >= 500 or not spec.public_detail:
        logger.error("%s: %s", type(exc).__name__, exc, exc_info=spec is INTERNAL)
    problem = problem_for(exc, instance=request.url.path, request_id=request_id)
    return problem_response(problem, headers=_headers_for(spec.status, _retry_after(exc, spec)))


async def _unexpected_error(request: Request, exc: Exception) -> Response:
    logger.error("unhandled %s", type(exc).__name__, exc_info=exc)
    request_id = request_id_of(request)
    problem = Problem(
        type=INTERNAL.type,
        title=INTERNAL.title,
        status=500,
        detail=_hidden_detail(INTERNAL, request_id),
        instance=request.url.path,
        request_id=request_id,
    )
    return problem_response(problem)


def _unreadable_body(cause: BaseException) -> str:
    """What made a request body unreadable as JSON (FastAPI answers a bare 400 for these)."""
    if isinstance(cause, UnicodeDecodeError):
        return f"the body is not UTF-8 (invalid byte at offset {cause.start}): send JSON in UTF-8"
    if isinstance(cause, RecursionError):
        return "the body's JSON is nested too deeply to be read"
    if isinstance(cause, ValueError):  # e.g. an integer of more digits than Python reads
        return f"the body's JSON cannot be read: {str(cause)[:200]}"
    return "the body could not be read as JSON"


async def _http_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, StarletteHTTPException)
    if exc.status_code == 400 and exc.__cause__ is not None:
        # FastAPI's "error parsing the body": name what was wrong with it, and where.
        message = _unreadable_body(exc.__cause__)
        problem = Problem(
            type=_MALFORMED.type,
            title=_MALFORMED.title,
            status=400,
            detail=message,
            instance=request.url.path,
            request_id=request_id_of(request),
            field="body",
            errors=[
                FieldError(field="body", location="body", message=message, type="json_invalid")
            ],
        )
        return problem_response(problem)
    spec = _HTTP_SPECS.get(exc.status_code) or ProblemSpec(
        exc.status_code, "http-error", "HTTP error"
    )
    detail = exc.detail if isinstance(exc.detail, str) and exc.detail else spec.title
    problem = Problem(
        type=spec.type,
        title=spec.title,
        status=exc.status_code,
        detail=detail,
        instance=request.url.path,
        request_id=request_id_of(request),
    )
    headers = dict(exc.headers or {})
    return problem_response(problem, headers=headers)


def field_errors(errors: Sequence[Mapping[str, Any]]) -> list[FieldError]:
    """Pydantic/FastAPI validation errors as :class:`FieldError` items (never echoing the input)."""
    out = []
    for error in errors:
        loc = [str(part) for part in error.get("loc", ())]
        location = (
            loc[0] if loc and loc[0] in ("body", "path", "query", "header", "cookie") else "body"
        )
        path = loc[1:] if loc and loc[0] == location else loc
        if error.get("type") == "json_invalid":
            path = []  # the location is a character offset, not a field
        out.append(
            FieldError(
                field=".".join(path) or location,
                location=location,
                message=str(error.get("msg", "invalid")),
                type=str(error.get("type", "value_error")),
            )
        )
    return out


async def _validation_error(request: Request, exc: Exception) -> Response:
    assert isinstance(exc, RequestValidationError)
    raw = list(exc.errors())
    items = field_errors(raw)
    malformed = any(e.get("type") == "json_invalid" for e in raw)
    spec = _MALFORMED if malformed else _VALIDATION
    first = (
        items[0]
        if items
        else FieldError(field="body", location="body", message="invalid", type="value_error")
    )
    more = f" (and {len(items) - 1} more)" if len(items) > 1 else ""
    problem = Problem(
        type=spec.type,
        title=spec.title,
        status=spec.status,
        detail=f"{first.location} field {first.field!r}: {first.message}{more}",
        instance=request.url.path,
        request_id=request_id_of(request),
        field=first.field,
        errors=items,
    )
    return problem_response(problem)


def install_error_handlers(app: FastAPI) -> None:
    """Route every error the app can raise to a problem+json response."""
    app.add_exception_handler(RequestValidationError, _validation_error)
    app.add_exception_handler(StarletteHTTPException, _http_error)
    for root in (TierError, SummarizerError, ScopeError, ApiKeyError, ApiError):
        app.add_exception_handler(root, _typed_error)
    app.add_exception_handler(Exception, _unexpected_error)


def problem_responses(*statuses: int) -> dict[int | str, dict[str, Any]]:
    """OpenAPI ``responses`` entries documenting problem+json bodies for ``statuses``."""
    descriptions = {
        400: "Malformed request",
        401: "Missing, invalid or revoked API key",
        403: "The API key lacks the scope this route needs",
        404: "Not found",
        409: "Conflict (stale lease, concurrent change, input mismatch, run state)",
        413: "Request or value too large",
        422: "Validation failed (the body names the field)",
        429: "Too many requests; see Retry-After",
        500: "Internal error",
        502: "The summarization model failed",
        503: "A backend is unavailable; see Retry-After",
    }
    responses: dict[int | str, dict[str, Any]] = {}
    for status in statuses:
        entry: dict[str, Any] = {
            "model": Problem,
            "description": descriptions.get(status, "Error"),
            "content": {PROBLEM_MEDIA_TYPE: {"schema": {"$ref": "#/components/schemas/Problem"}}},
        }
        if status in _PROBLEM_HEADERS:
            entry["headers"] = _PROBLEM_HEADERS[status]
        responses[status] = entry
    return responses


_RETRY_AFTER = {
    "Retry-After": {
        "description": "Seconds to wait before retrying.",
        "schema": {"type": "integer", "minimum": 1},
    }
}
# Headers that problem_response sets for these statuses.
_PROBLEM_HEADERS: dict[int, dict[str, Any]] = {
    401: {
        "WWW-Authenticate": {
            "description": "The authentication scheme: `Bearer`.",
            "schema": {"type": "string"},
        }
    },
    429: _RETRY_AFTER,
    503: _RETRY_AFTER,
}
