"""The installed ``tiermem`` script: the library's commands plus ``serve`` and ``mcp``.

It lives at the top layer because ``serve`` needs :mod:`api`; the commands
below it come from :func:`memory.cli.build_app`, which never imports ``api``.
"""

from __future__ import annotations

from enum import StrEnum
from typing import Annotated

import typer

from memory.cli import build_app
from memory.cli_support import settings_from_env


def serve(
    host: Annotated[
        str | None, typer.Option(help="Interface to bind (default: TIERMEM_API_HOST or 127.0.0.1).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to bind (default: TIERMEM_API_PORT or 8080).")
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth", help="Accept requests without an API key (local development only)."
        ),
    ] = False,
) -> None:
    """Run the HTTP service (settings from TIERMEM_* environment variables)."""
    # Imported here: uvicorn and the app cost a second of start-up the other commands skip.
    from api.server import serve as serve_app
    from tiers.errors import TierError

    settings = settings_from_env()
    if no_auth:
        settings = settings.model_copy(update={"auth_enabled": False})
    try:
        serve_app(settings, host=host, port=port)
    except TierError as exc:  # a held data dir, a volatile store: refused before binding
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


class McpTransport(StrEnum):
    """How ``tiermem mcp`` talks to its clients."""

    STDIO = "stdio"
    HTTP = "http"


def mcp(
    transport: Annotated[
        McpTransport,
        typer.Option(
            help="stdio: one local client that started this process (e.g. Claude Desktop), "
            "acting in TIERMEM_TENANT. http: streamable HTTP at /mcp beside the REST API, "
            "each request acting in the tenant of its API key."
        ),
    ] = McpTransport.STDIO,
    host: Annotated[
        str | None,
        typer.Option(help="http: interface to bind (default: TIERMEM_API_HOST or 127.0.0.1)."),
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="http: port to bind (default: TIERMEM_API_PORT or 8080).")
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth", help="http: accept requests without an API key (local development only)."
        ),
    ] = False,
) -> None:
    """Run the MCP server: memory tools for MCP clients (settings from TIERMEM_* variables)."""
    from memory.integrations import MissingExtraError
    from tiers.errors import TierError

    settings = settings_from_env()
    try:
        if transport is McpTransport.STDIO:
            if host is not None or port is not None or no_auth:
                raise typer.BadParameter("--host, --port and --no-auth are for --transport http")
            from memory.integrations.mcp import run_stdio

            run_stdio(settings)
        else:
            from api.mcp_http import serve_mcp

            if no_auth:
                settings = settings.model_copy(update={"auth_enabled": False})
            serve_mcp(settings, host=host, port=port)
    except (MissingExtraError, TierError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


app = build_app()
app.command()(serve)
app.command()(mcp)

if __name__ == "__main__":
    app()
