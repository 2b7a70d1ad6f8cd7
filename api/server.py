"""``tiermem serve``: the app under uvicorn, with JSON logs and graceful shutdown."""

from __future__ import annotations

import logging.config

import uvicorn

from api.app import create_app
from api.logs import logging_config
from memory.settings import Settings


def serve(
    settings: Settings | None = None, *, host: str | None = None, port: int | None = None
) -> None:
    """Run the service until SIGINT/SIGTERM.

    On a signal, uvicorn stops accepting connections, lets in-flight requests
    finish (up to ``shutdown_timeout_seconds``), then the app's lifespan
    finishes queued background jobs and closes the stores.

    Args:
        settings: Default: from ``TIERMEM_*`` environment variables.
        host: Interface to bind; default ``settings.api_host``.
        port: Port to bind; default ``settings.api_port``.
    """
    settings = settings or Settings()
    config = logging_config(settings.log_level)
    logging.config.dictConfig(config)
    uvicorn.run(
        create_app(settings, freeze_gc=True),
        host=host or settings.api_host,
        port=settings.api_port if port is None else port,
        log_config=config,
        access_log=False,  # tiermem.access logs each request, with its id and route
        server_header=False,
        proxy_headers=False,  # no X-Forwarded-* rewriting: one middleware less per request
        timeout_graceful_shutdown=int(settings.shutdown_timeout_seconds),
    )
