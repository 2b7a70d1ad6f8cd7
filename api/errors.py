"""Every failure of the API as one RFC 9457 problem+json body, mapped in one place.

:data:`ERROR_MAP` maps each typed error of ``tiers``, ``summarizer``, ``memory``
and this package to a status, a problem type and a title: the library's rows
come from the table the client reads too (:mod:`memory.problems`), and this
package adds its own errors with the service's problem types from there. An
error is looked up along its class's MRO, so a subclass without its own entry
gets its parent's. Nothing else in ``api`` chooses a status for an error, and no
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
from typing import Any

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response
from starlette.exceptions import HTTPException as StarletteHTTPException

from api.schemas.problems import FieldError, Problem
from memory.apikeys import ApiKeyError
from memory.errors import ScopeError
from memory.problems import (
    LIBRARY_PROBLEMS,
    PROBLEM_TYPE_PREFIX,
    SERVICE_PROBLEMS,
    ProblemSpec,
    problem_members,
)
from summarizer.errors import SummarizerError
from tiers.errors import NotFoundError, TierError

logger = logging.getLogger("tiermem.api")

__all__ = [
    "ERROR_MAP",
    "INTERNAL",
    "JSONRPC_REFUSED",
    "PROBLEM_MEDIA_TYPE",
    "PROBLEM_TYPE_PREFIX",
    "ApiError",
    "AuthenticationRequiredError",
    "ForbiddenError",
    "JobAbandonedError",
    "JobNotFoundError",
    "OverloadedError",
    "ProblemSpec",
    "RequestTooLargeError",
    "field_errors",
    "http_detail",
    "install_error_handlers",
    "jsonrpc_problem_response",
    "problem_for",
    "problem_response",
    "problem_responses",
    "request_id_of",
    "spec_for",
]

PROBLEM_MEDIA_TYPE = "application/problem+json"
JSONRPC_REFUSED = -32001
"""JSON-RPC error code of a request the server refused before reading it (a server-defined code)."""


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


INTERNAL = ProblemSpec(500, "internal", "Internal error", public_detail=False)

ERROR_MAP: Mapping[type[BaseException], ProblemSpec] = {
    **{row.error: row.spec for row in LIBRARY_PROBLEMS},
    ApiError: INTERNAL,
    AuthenticationRequiredError: SERVICE_PROBLEMS["unauthorized"].spec,
    ForbiddenError: SERVICE_PROBLEMS["forbidden"].spec,
    RequestTooLargeError: SERVICE_PROBLEMS["request-too-large"].spec,
    OverloadedError: SERVICE_PROBLEMS["overloaded"].spec,
    JobNotFoundError: SERVICE_PROBLEMS["job-not-found"].spec,
    JobAbandonedError: SERVICE_PROBLEMS["job-abandoned"].spec,
}
"""Error class -> how it is reported: the library's rows of :data:`memory.problems.LIBRARY_PROBLEMS`
and this package's errors. Looked up along the MRO: the most specific entry wins."""

# Statuses of the framework's own errors (no route, wrong method, unreadable body).
_HTTP_SPECS: Mapping[int, ProblemSpec] = {
    400: SERVICE_PROBLEMS["bad-request"].spec,
    404: ERROR_MAP[NotFoundError],
    405: SERVICE_PROBLEMS["method-not-allowed"].spec,
    413: SERVICE_PROBLEMS["request-too-large"].spec,
}
_VALIDATION = SERVICE_PROBLEMS["validation-error"].spec
_MALFORMED = SERVICE_PROBLEMS["malformed-request"].spec


def spec_for(exc: BaseException) -> ProblemSpec:
    """The :class:`ProblemSpec` of an error: its class's, or its nearest mapped ancestor's."""
    for cls in type(exc).__mro__:
        spec = ERROR_MAP.get(cls)
        if spec is not None:
            return spec
    return INTERNAL


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
        (
            r"Memory\.approve_run/reject_run \(TaskTier\.approve/reject\)",
            "POST /v1/runs/{run_id}:approve or :reject",
        ),
        (
            r"Memory\.set_budget \(TaskTier\.set_budget\)",
            "POST /v1/runs/{run_id}:set-budget",
        ),
        (
            r"tokens=, cost= or both \(None: unlimited\)",
            '"budget_tokens", "budget_cost" or both (null: unlimited)',
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
        **problem_members(exc),
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


def jsonrpc_problem_response(request: Request, exc: ApiError | ApiKeyError) -> Response:
    """A refusal of an MCP request, made before the MCP SDK read it, as problem and JSON-RPC error.

    MCP clients show a non-2xx answer's text only when its ``application/json``
    body is a JSON-RPC error (the MCP SDK's client reports any other body as
    "Server returned an error response"), so the body holds the problem's
    members and ``jsonrpc``, ``id`` (``null``: the request was not read) and an
    ``error`` whose message is the problem's status, title and detail.
    """
    spec = spec_for(exc)
    problem = problem_for(exc, instance=request.url.path, request_id=request_id_of(request))
    body: dict[str, Any] = problem.model_dump(mode="json", exclude_none=True)
    body.update(
        jsonrpc="2.0",
        id=None,
        error={
            "code": JSONRPC_REFUSED,
            "message": f"{problem.status} {problem.title}: {problem.detail}",
            "data": {"type": problem.type, "status": problem.status},
        },
    )
    return JSONResponse(body, status_code=problem.status, headers=_headers_for(spec.status, None))


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
