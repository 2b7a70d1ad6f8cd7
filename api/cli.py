"""The installed ``tiermem`` script: the library's commands plus ``serve``, the HTTP service.

It lives at the top layer because ``serve`` needs :mod:`api`; the commands
below it come from :func:`memory.cli.build_app`, which never imports ``api``.
"""

from __future__ import annotations

from typing import Annotated

import typer

from memory.cli import build_app, settings_from_env


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

    settings = settings_from_env()
    if no_auth:
        settings = settings.model_copy(update={"auth_enabled": False})
    serve_app(settings, host=host, port=port)


app = build_app()
app.command()(serve)

if __name__ == "__main__":
    app()
