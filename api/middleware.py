"""The one ASGI middleware of the service: request id, body size limit, metrics, access log.

Written as plain ASGI (not ``BaseHTTPMiddleware``) because it wraps every
request: it adds a few microseconds, not a task and a queue per request.
"""

from __future__ import annotations

import itertools
import logging
import re
import secrets
import time
from typing import Any

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from api.errors import PROBLEM_MEDIA_TYPE, RequestTooLargeError, problem_for
from api.logs import request_id_var
from api.metrics import Metrics
from api.schemas.problems import Problem

access_logger = logging.getLogger("tiermem.access")

_REQUEST_ID = re.compile(rb"[A-Za-z0-9._:\-]{1,128}")
_UNMATCHED = "<unmatched>"


class _RequestIds:
    """Request ids made here: 32 hex digits, a random per-process prefix and a counter.

    Unique without a system call per request (``uuid4`` reads the OS random
    source each time); ids need to be unique, not secret.
    """

    def __init__(self) -> None:
        self._prefix = secrets.token_hex(8)
        self._counter = itertools.count()  # next() on a count is atomic under the GIL

    def next(self) -> str:
        return f"{self._prefix}{next(self._counter) & 0xFFFF_FFFF_FFFF_FFFF:016x}"


class _BodyTooLarge(HTTPException):
    """Raised from ``receive`` when a body without Content-Length grows past the limit.

    An ``HTTPException`` because FastAPI turns any other error raised while it
    reads the body into a 400.
    """


class ServiceMiddleware:
    """Wraps every HTTP request.

    - takes the client's ``X-Request-ID`` (if it is 1-128 safe characters) or
      makes one, exposes it to logs and handlers, and returns it;
    - refuses bodies over ``max_request_bytes`` with 413, by Content-Length
      before reading, or while reading a chunked body;
    - observes latency per method, route template and status;
    - writes one JSON access-log line per request.

    Args:
        app: The wrapped ASGI app.
        metrics: Where latencies go.
        max_request_bytes: Largest body accepted.
        access_log: Whether to log each request.
    """

    def __init__(
        self, app: ASGIApp, *, metrics: Metrics, max_request_bytes: int, access_log: bool
    ) -> None:
        self.app = app
        self.metrics = metrics
        self.max_request_bytes = max_request_bytes
        self.access_log = access_log
        self._ids = _RequestIds()

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        start = time.perf_counter()
        request_id: str | None = None
        content_length: int | None = None
        for name, value in scope["headers"]:
            if name == b"x-request-id" and _REQUEST_ID.fullmatch(value):
                request_id = value.decode("ascii")
            elif name == b"content-length" and value.isdigit():
                content_length = int(value)
        if request_id is None:
            request_id = self._ids.next()
        scope.setdefault("state", {})["request_id"] = request_id
        token = request_id_var.set(request_id)
        header = (b"x-request-id", request_id.encode("ascii"))
        status = 500
        started = False

        async def send_with_id(message: Message) -> None:
            nonlocal status, started
            if message["type"] == "http.response.start":
                started = True
                status = message["status"]
                message["headers"] = [*message.get("headers", ()), header]
            await send(message)

        limit = self.max_request_bytes
        received = 0

        async def receive_limited() -> Message:
            nonlocal received
            message = await receive()
            if message["type"] == "http.request":
                received += len(message.get("body", b""))
                if received > limit:
                    raise _BodyTooLarge(413, self._too_large(received))
            return message

        self.metrics.in_flight.inc()
        try:
            if content_length is not None and content_length > limit:
                await self._refuse(scope, send_with_id, content_length)
            else:
                await self.app(
                    scope, receive_limited if content_length is None else receive, send_with_id
                )
        except Exception as exc:
            # Starlette's last-resort handler sits outside this middleware and would answer
            # without the request id; answer here instead (the app's handlers took the rest).
            status = 500
            if started:
                raise
            access_logger.error("unhandled %s", type(exc).__name__, exc_info=exc)
            await self._send_problem(
                scope, send_with_id, problem_for(exc, instance=scope["path"], request_id=request_id)
            )
        finally:
            self.metrics.in_flight.dec()
            elapsed = time.perf_counter() - start
            route = scope.get("route")
            template = getattr(route, "path", None) or _UNMATCHED
            method = scope["method"]
            self.metrics.requests.labels(method, template, str(status)).observe(elapsed)
            if self.access_log and access_logger.isEnabledFor(logging.INFO):
                extra: dict[str, Any] = {
                    "method": method,
                    "path": scope["path"],
                    "route": template,
                    "status": status,
                    "duration_ms": round(elapsed * 1000, 3),
                    "tenant": scope["state"].get("tenant"),
                }
                access_logger.info("%s %s %d", method, scope["path"], status, extra=extra)
            request_id_var.reset(token)

    def _too_large(self, size: int) -> str:
        return (
            f"the request body is {size} bytes or more, over the limit of {self.max_request_bytes} "
            "bytes: send less per request (the server's max_request_bytes setting)"
        )

    async def _refuse(self, scope: Scope, send: Send, size: int) -> None:
        problem = problem_for(
            RequestTooLargeError(self._too_large(size)),
            instance=scope["path"],
            request_id=scope["state"]["request_id"],
        )
        # The unread body stays on the connection: close it rather than parse it as a request.
        await self._send_problem(scope, send, problem, close=True)

    @staticmethod
    async def _send_problem(
        scope: Scope, send: Send, problem: Problem, *, close: bool = False
    ) -> None:
        body = problem.model_dump_json(exclude_none=True).encode()
        headers = [
            (b"content-type", PROBLEM_MEDIA_TYPE.encode()),
            (b"content-length", str(len(body)).encode()),
        ]
        if close:
            headers.append((b"connection", b"close"))
        await send({"type": "http.response.start", "status": problem.status, "headers": headers})
        await send({"type": "http.response.body", "body": body})
