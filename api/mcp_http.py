"""The MCP server over streamable HTTP, inside the tiermem service: ``POST/GET/DELETE /mcp``.

:func:`create_mcp_app` is :func:`api.app.create_app` with one more route,
``/mcp``, serving :func:`memory.integrations.mcp.build_server`'s tools through
the MCP SDK's streamable HTTP session manager. Living inside the service
rather than beside it gives MCP everything the REST routes have, by
construction:

- **the same authentication**: :func:`api.deps.authenticate` (``Authorization:
  Bearer <key>`` or ``X-API-Key``, the key cache, ``--no-auth``); a missing or
  bad key is a 401 problem+json before the MCP SDK sees the request;
- **per-request tenancy**: every tool call acts in the tenant of the key on
  the HTTP request that carries it, a read-only key's calls of writing
  tools are refused, and a key bound to one user is held to it (another
  ``user_id`` refused, another user's run not found); an MCP session is also
  bound to the key that opened it (the SDK answers 404 to any other key), so
  one key cannot use, watch or close another's session;
- request ids, the body size limit, metrics, the access log, graceful
  shutdown and run retention sweeps of :class:`api.middleware.ServiceMiddleware`
  and :class:`api.state.ServiceState`;
- and one process per data directory: embedded Chroma allows one writer
  process, so REST and MCP on an embedded store must share a process.
"""

from __future__ import annotations

import logging.config
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import uvicorn
from fastapi import FastAPI
from starlette.requests import Request
from starlette.routing import Route
from starlette.types import ASGIApp, Receive, Scope, Send

from api.app import create_app
from api.deps import authenticate
from api.errors import ApiError, jsonrpc_problem_response
from api.logs import logging_config
from api.server import open_memory, uvicorn_options
from api.state import Principal, ServiceState
from memory.apikeys import ApiKeyError
from memory.facade import Memory
from memory.integrations import require
from memory.integrations.mcp import CallerResolver, McpCaller, build_server
from memory.settings import Settings

require("mcp", "mcp")

from mcp.server.auth.middleware.bearer_auth import AuthenticatedUser  # noqa: E402
from mcp.server.auth.provider import AccessToken  # noqa: E402

__all__ = ["MCP_PATH", "create_mcp_app", "serve_mcp"]

MCP_PATH = "/mcp"
"""Where the MCP endpoint is served."""

_CALLER = "tiermem.mcp.principal"


class _McpAuth:
    """ASGI gate in front of the MCP session manager: authenticate, then hand the request on.

    A refusal of :func:`authenticate` is answered here, as a problem that is
    also a JSON-RPC error (:func:`api.errors.jsonrpc_problem_response`); its
    other errors (a store that is down) propagate to the app's error handlers.
    The principal is kept in the request's scope, where the tools'
    :func:`_caller` reads it back for each tool call.
    """

    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        self.route: Route | None = None

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        # FastAPI's router records only its own routes; metrics and the access log need this one.
        scope["route"] = self.route
        request = Request(scope, receive)
        try:
            principal = await authenticate(request)
        except (ApiError, ApiKeyError) as exc:
            await jsonrpc_problem_response(request, exc)(scope, receive, send)
            return
        scope.setdefault("state", {})[_CALLER] = principal
        if principal.key_id is not None:
            # The SDK binds a new MCP session to this user and refuses it to any other.
            token = AccessToken(
                token=principal.key_id,
                client_id=f"api-key:{principal.key_id}",
                scopes=sorted(principal.scopes),
                subject=principal.tenant,
            )
            scope["user"] = AuthenticatedUser(token)
        await self.app(scope, receive, send)


def _resolver(app: FastAPI) -> CallerResolver:
    def caller(request: Any) -> McpCaller:
        """The caller of one tool call, from the principal its HTTP request was authenticated as."""
        if not isinstance(request, Request):
            raise RuntimeError("an MCP tool call over HTTP came without its HTTP request")
        principal: Principal = request.scope["state"][_CALLER]
        service: ServiceState = app.state.tiermem
        return McpCaller(
            memory=service.view(principal.tenant),
            principal=None if principal.key_id is None else f"api-key:{principal.key_id}",
            can_write="write" in principal.scopes,
            user_id=principal.user_id,
        )

    return caller


def create_mcp_app(
    settings: Settings | None = None,
    *,
    memory: Memory | None = None,
    host: str = "127.0.0.1",
    freeze_gc: bool = False,
) -> FastAPI:
    """The tiermem service (:func:`api.app.create_app`) with the MCP endpoint at :data:`MCP_PATH`.

    Args:
        settings: As for :func:`~api.app.create_app`.
        memory: As for :func:`~api.app.create_app`.
        host: The interface the server binds: on loopback the SDK also refuses
            requests whose ``Host``/``Origin`` is not loopback (DNS rebinding).
        freeze_gc: As for :func:`~api.app.create_app`.
    """
    settings = settings or Settings()
    app = create_app(settings, memory=memory, freeze_gc=freeze_gc)
    server = build_server(resolve=_resolver(app), log_level=settings.log_level)
    # Building the SDK's app makes its session manager (with the SDK's transport-security
    # defaults for ``host``); the manager is what is served, under this app's own middleware.
    server.streamable_http_app(streamable_http_path=MCP_PATH, host=host)
    manager = server.session_manager
    gate = _McpAuth(manager.handle_request)
    gate.route = Route(MCP_PATH, endpoint=gate)
    app.router.routes.append(gate.route)
    service_lifespan = app.router.lifespan_context

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[Any]:
        # The stores open first and close last: MCP sessions end before the memory closes.
        async with service_lifespan(app) as state, manager.run():
            yield state

    app.router.lifespan_context = lifespan
    return app


def serve_mcp(
    settings: Settings | None = None, *, host: str | None = None, port: int | None = None
) -> None:
    """Run the service with its MCP endpoint until SIGINT/SIGTERM (see :func:`api.server.serve`).

    Args:
        settings: Default: from ``TIERMEM_*`` environment variables.
        host: Interface to bind; default ``settings.api_host``.
        port: Port to bind; default ``settings.api_port``.
    """
    settings = settings or Settings()
    config = logging_config(settings.log_level)
    logging.config.dictConfig(config)
    host = host or settings.api_host
    # Opened before the port is bound: a held data dir or a volatile store stops the command.
    with open_memory(settings) as memory:
        uvicorn.run(
            create_mcp_app(settings, memory=memory, host=host, freeze_gc=True),
            host=host,
            port=settings.api_port if port is None else port,
            log_config=config,
            **uvicorn_options(settings),
        )
