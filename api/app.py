"""The FastAPI application: :func:`create_app`."""

from __future__ import annotations

import functools
import gc
import logging
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from importlib.metadata import PackageNotFoundError, version
from typing import Any

import anyio.to_thread
from fastapi import FastAPI
from fastapi.routing import APIRoute

from api.errors import install_error_handlers
from api.metrics import Metrics
from api.middleware import ServiceMiddleware
from api.routers import context, facts, health, run_effects, runs, sessions
from api.state import ServiceState
from api.ui import mount_console
from memory.facade import Memory
from memory.settings import Settings

logger = logging.getLogger("tiermem.api")

DESCRIPTION = """\
Three-tier memory for LLM agents over HTTP: user facts and preferences,
session summaries with recall, continuation context, and checkpointed task runs.

Every `/v1` route needs an API key (`Authorization: Bearer <key>` or
`X-API-Key: <key>`); the key decides the tenant, whatever ids a request sends.
A key bound to one user gets 403 for a request naming another user, and 404
for another user's run or job, as for an absent one.
Every error is an RFC 9457 `application/problem+json` body.
"""


def _version() -> str:
    try:
        return version("tiermem")
    except PackageNotFoundError:
        return "0.0.0"


def _operation_id(route: APIRoute) -> str:
    # Operation ids are the route names, which are the Memory method names.
    return route.name


class _TiermemAPI(FastAPI):
    """FastAPI with the API-key security schemes in its OpenAPI document.

    Authentication is one plain dependency (see :mod:`api.deps`), so the
    schemes are declared here rather than through ``fastapi.security`` objects.
    """

    auth_enabled: bool = True

    def openapi(self) -> dict[str, Any]:
        if self.openapi_schema is not None:
            return self.openapi_schema
        schema = super().openapi()
        # The middleware answers every request with its id (taken from the client or made).
        for operations in schema["paths"].values():
            for operation in operations.values():
                for response in operation.get("responses", {}).values():
                    response.setdefault("headers", {})["X-Request-ID"] = _REQUEST_ID_HEADER
        if self.auth_enabled:
            schema.setdefault("components", {})["securitySchemes"] = {
                "bearer": {
                    "type": "http",
                    "scheme": "bearer",
                    "description": "`Authorization: Bearer <API key>` (made with `tiermem keys create`).",
                },
                "apiKey": {"type": "apiKey", "in": "header", "name": "X-API-Key"},
            }
            for path, operations in schema["paths"].items():
                if path.startswith("/v1/"):
                    for operation in operations.values():
                        operation["security"] = [{"bearer": []}, {"apiKey": []}]
        self.openapi_schema = schema
        return schema


_REQUEST_ID_HEADER = {
    "description": "The request's id: the client's X-Request-ID if it sent a valid one.",
    "schema": {"type": "string"},
}


def _tune_embedder(memory: Memory, settings: Settings) -> None:
    """Use ``service_embedder_threads`` threads per call of the local model (read when it loads).

    Concurrent requests already keep every core busy; more threads per call
    only make them contend (measured on 2 cores: about 1.6x the context
    requests per second with one thread per call instead of two).
    """
    if hasattr(memory.embedder, "intra_op_threads"):
        memory.embedder.intra_op_threads = settings.service_embedder_threads


def create_app(
    settings: Settings | None = None, *, memory: Memory | None = None, freeze_gc: bool = False
) -> FastAPI:
    """Build the tiermem HTTP service.

    Args:
        settings: The service's settings; default: from ``TIERMEM_*`` environment variables.
        memory: Serve this memory instead of opening one from ``settings``. The
            app then leaves it open at shutdown (its owner closes it). With
            ``auth_enabled`` off, every request acts in this memory's tenant
            (``settings.tenant`` when the app opens the memory itself).

    Returns:
        The app. Its lifespan opens the stores (unless ``memory`` is given),
        loads the embedding model, starts the summary job workers, and at
        shutdown finishes running jobs (for a bounded time) before closing the stores.
    """
    settings = settings or Settings()
    # The service's families join the library's registry: the memory's own when it has one.
    metrics = Metrics(memory.metrics if memory is not None else None)

    @asynccontextmanager
    async def lifespan(app: FastAPI) -> AsyncIterator[None]:
        owned = memory is None
        mem = (
            memory
            if memory is not None
            else await anyio.to_thread.run_sync(
                functools.partial(Memory.from_settings, settings, metrics=metrics.library)
            )
        )
        if owned:
            _tune_embedder(mem, settings)
        service = ServiceState(settings, mem, metrics, owns_memory=owned)
        try:
            await anyio.to_thread.run_sync(service.warm_up)
            if freeze_gc:
                gc.collect()
                gc.freeze()
            app.state.tiermem = service
            service.start_sweeping()
            service.start_index_checks()
            # Jobs queued before this start (a crash, a replica gone) are run too.
            service.jobs.start()
            logger.info(
                "tiermem ready", extra={"tenant": mem.tenant, "auth": settings.auth_enabled}
            )
            yield
        finally:
            # Uvicorn runs this after in-flight requests are done; queued jobs finish here.
            await anyio.to_thread.run_sync(service.close)
            logger.info("tiermem stopped")

    app = _TiermemAPI(
        title="tiermem",
        version=_version(),
        description=DESCRIPTION,
        lifespan=lifespan,
        generate_unique_id_function=_operation_id,
        # mount_console serves /docs and /redoc from the package (offline), not from a CDN.
        docs_url=None,
        redoc_url=None,
    )
    app.auth_enabled = settings.auth_enabled
    install_error_handlers(app)
    app.add_middleware(
        ServiceMiddleware,
        metrics=metrics,
        max_request_bytes=settings.max_request_bytes,
        access_log=settings.access_log,
    )
    for module in (health, facts, sessions, context, runs, run_effects):
        app.include_router(module.router)
    mount_console(app)
    return app
