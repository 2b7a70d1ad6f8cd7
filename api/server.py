"""``tiermem serve``: the app under uvicorn, with JSON logs and graceful shutdown.

The memory is opened before uvicorn binds the port, so a data dir another
process holds, or a KV store that may lose acknowledged writes, stops the
command with the typed error (nothing listens, nothing is half started).

Each connection gets a bounded time to send a request's head: uvicorn times
out idle keep-alive connections, but not one that connected and sends its
request line and headers slowly or never finishes them, which would hold a
connection (and its memory) for ever. :func:`head_timeout_protocol` adds that
bound to uvicorn's HTTP protocol.
"""

from __future__ import annotations

import asyncio
import logging.config
import math
from typing import Any, Literal

import uvicorn

from api.app import _tune_embedder, create_app
from api.errors import PROBLEM_MEDIA_TYPE, PROBLEM_TYPE_PREFIX
from api.logs import logging_config
from api.schemas.problems import Problem
from memory.facade import Memory
from memory.settings import Settings

logger = logging.getLogger("tiermem.api")


def serve(
    settings: Settings | None = None, *, host: str | None = None, port: int | None = None
) -> None:
    """Run the service until SIGINT/SIGTERM.

    On a signal, uvicorn stops accepting connections, lets in-flight requests
    finish (up to ``shutdown_timeout_seconds``), then the app's lifespan
    finishes queued background jobs (up to that time again) and the stores close.

    Args:
        settings: Default: from ``TIERMEM_*`` environment variables.
        host: Interface to bind; default ``settings.api_host``.
        port: Port to bind; default ``settings.api_port``.

    Raises:
        DataDirLockedError: Another process has the embedded data dir open.
        VolatileStoreError: The KV store may lose acknowledged writes and
            ``allow_volatile`` is not set.
    """
    settings = settings or Settings()
    config = logging_config(settings.log_level)
    logging.config.dictConfig(config)
    with open_memory(settings) as memory:
        uvicorn.run(
            create_app(settings, memory=memory, freeze_gc=True),
            host=host or settings.api_host,
            port=settings.api_port if port is None else port,
            log_config=config,
            **uvicorn_options(settings),
        )


def open_memory(settings: Settings) -> Memory:
    """The memory a server process serves, opened (and checked) before it binds a port.

    Raises:
        DataDirLockedError: Another process has the embedded data dir open.
        VolatileStoreError: The KV store may lose acknowledged writes and
            ``allow_volatile`` is not set.
    """
    memory = Memory.from_settings(settings)
    _tune_embedder(memory, settings)
    return memory


def uvicorn_options(settings: Settings) -> dict[str, Any]:
    """Options of ``uvicorn.run`` shared by ``tiermem serve`` and ``tiermem mcp --transport http``."""
    return {
        "access_log": False,  # tiermem.access logs each request, with its id and route
        "server_header": False,
        "proxy_headers": False,  # no X-Forwarded-* rewriting: one middleware less per request
        "timeout_graceful_shutdown": math.ceil(settings.shutdown_timeout_seconds),
        "timeout_keep_alive": math.ceil(settings.keep_alive_timeout_seconds),
        "http": head_timeout_protocol(settings.header_timeout_seconds),
    }


def head_timeout_protocol(
    timeout: float, implementation: Literal["auto", "httptools", "h11"] = "auto"
) -> type[asyncio.Protocol]:
    """Uvicorn's HTTP/1.1 protocol, closing a connection whose request head takes over ``timeout`` s.

    The clock starts when the connection is made, and again when the first
    byte of each later request arrives; it stops when the head is complete.
    A connection that sent part of a head gets ``408`` (problem+json) and is
    closed; one that sent nothing is closed.

    Args:
        timeout: Seconds allowed for a request line and its headers.
        implementation: uvicorn's parser: ``auto`` is httptools when installed, else h11.
    """
    if implementation in ("auto", "httptools"):
        try:
            from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol
        except ImportError:
            if implementation == "httptools":
                raise
        else:
            return _httptools_guard(HttpToolsProtocol, timeout)
    from uvicorn.protocols.http.h11_impl import H11Protocol

    return _h11_guard(H11Protocol, timeout)


def _problem_bytes(status: int, reason: str, slug: str, detail: str) -> bytes:
    """A whole HTTP/1.1 problem+json answer that closes the connection (written by the protocol)."""
    problem = Problem(
        type=f"{PROBLEM_TYPE_PREFIX}{slug}", title=reason, status=status, detail=detail
    )
    body = problem.model_dump_json(exclude_none=True).encode()
    head = (
        f"HTTP/1.1 {status} {reason}\r\n"
        f"content-type: {PROBLEM_MEDIA_TYPE}\r\n"
        f"content-length: {len(body)}\r\n"
        "connection: close\r\n\r\n"
    )
    return head.encode("ascii") + body


def _timeout_response(timeout: float) -> bytes:
    return _problem_bytes(
        408,
        "Request Timeout",
        "request-timeout",
        f"the request line and headers did not arrive within {timeout:g} s",
    )


_NOT_HTTP = _problem_bytes(
    400,
    "Bad Request",
    "malformed-request",
    "the request is not valid HTTP/1.1 (its request line or headers cannot be parsed)",
)


class _HeadGuard:
    """The head timeout of one connection; each guarded protocol holds one.

    Both parsers' protocols delegate to it the same three things: arming the
    timer while a request head is awaited, stopping it when the head is
    complete or the connection is lost, and answering an unparsable request.
    Only where a head begins and ends differs between the parsers.
    """

    __slots__ = ("_handle", "_loop", "_started", "_timeout", "_transport")

    def __init__(
        self, loop: asyncio.AbstractEventLoop, transport: asyncio.Transport, timeout: float
    ) -> None:
        self._loop = loop
        self._transport = transport
        self._timeout = timeout
        self._handle: asyncio.TimerHandle | None = None
        self._started = False  # whether a byte of the current head arrived

    def arm(self) -> None:
        """Start the clock, unless it already runs (one timer at a time)."""
        if self._handle is None:
            self._handle = self._loop.call_later(self._timeout, self._expire)

    def head_begins(self) -> None:
        """A byte of a request head arrived: a timeout now answers 408 before closing."""
        self.arm()
        self._started = True

    def stop(self) -> None:
        """The head is complete, or the connection is gone: stop the clock."""
        if self._handle is not None:
            self._handle.cancel()
            self._handle = None
        self._started = False

    def refuse_unparsable(self) -> None:
        """Answer a request the parser cannot read with a 400 problem, and close."""
        self.stop()
        # uvicorn's own answer to a request it cannot parse is text/plain; ours is a problem.
        if not self._transport.is_closing():
            self._transport.write(_NOT_HTTP)
            self._transport.close()

    def _expire(self) -> None:
        self._handle = None
        if self._transport.is_closing():
            return
        if self._started:
            logger.info("closing a connection whose request head took over %g s", self._timeout)
            self._transport.write(_timeout_response(self._timeout))
        self._transport.close()


def _httptools_guard(base: type[Any], timeout: float) -> type[asyncio.Protocol]:
    class HeadTimeoutHttpToolsProtocol(base):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._head = _HeadGuard(self.loop, transport, timeout)
            self._head.arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._head.stop()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            self._head.refuse_unparsable()

        def on_message_begin(self) -> None:
            super().on_message_begin()
            self._head.head_begins()

        def on_headers_complete(self) -> None:
            self._head.stop()
            super().on_headers_complete()

    return HeadTimeoutHttpToolsProtocol


def _h11_guard(base: type[Any], timeout: float) -> type[asyncio.Protocol]:
    import h11

    class HeadTimeoutH11Protocol(base):  # type: ignore[misc]
        def connection_made(self, transport: asyncio.Transport) -> None:
            super().connection_made(transport)
            self._head = _HeadGuard(self.loop, transport, timeout)
            self._head.arm()

        def connection_lost(self, exc: Exception | None) -> None:
            self._head.stop()
            super().connection_lost(exc)

        def send_400_response(self, msg: str) -> None:
            self._head.refuse_unparsable()

        def data_received(self, data: bytes) -> None:
            # h11 has no "message begins" event: a request's head is pending while the
            # peer's state is IDLE (between requests, before its Request event).
            if self.conn.their_state is h11.IDLE:
                self._head.head_begins()
            super().data_received(data)
            if self.conn.their_state is not h11.IDLE:
                self._head.stop()

    return HeadTimeoutH11Protocol
