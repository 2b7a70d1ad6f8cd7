"""The operator console under ``/ui`` and the offline API docs under ``/docs``.

:func:`mount_console` adds both to the app: the console's pages
(:mod:`api.ui.router`), its static files (one stylesheet, plus the vendored
Swagger UI bundle with its license), and a docs page that loads that bundle
from the app itself, so it renders with no network. ``/redoc`` redirects to
``/docs``: ReDoc's bundle loads its logo from a CDN.
"""

from __future__ import annotations

from pathlib import Path

from fastapi import FastAPI, Request
from fastapi.openapi.docs import get_swagger_ui_html, get_swagger_ui_oauth2_redirect_html
from fastapi.responses import HTMLResponse, RedirectResponse, Response
from fastapi.staticfiles import StaticFiles

from api.ui.auth import LoginRequired
from api.ui.router import router

__all__ = ["DOCS_URL", "REDOC_URL", "STATIC_URL", "mount_console"]

STATIC_URL = "/ui/static"
DOCS_URL = "/docs"
REDOC_URL = "/redoc"
_OAUTH2_REDIRECT_URL = "/docs/oauth2-redirect"
_STATIC_DIR = Path(__file__).parent / "static"


def _root(request: Request) -> str:
    root: str = request.scope.get("root_path", "")
    return root.rstrip("/")


async def _login_required(request: Request, exc: Exception) -> Response:
    return RedirectResponse(_root(request) + "/ui/login", status_code=303)


def mount_console(app: FastAPI) -> None:
    """Add the console and the offline docs pages to ``app``.

    Create ``app`` with ``docs_url=None`` and ``redoc_url=None``: these routes replace
    FastAPI's, which load their scripts from a CDN.
    """
    app.include_router(router)
    app.mount(STATIC_URL, StaticFiles(directory=_STATIC_DIR), name="ui-static")
    app.add_exception_handler(LoginRequired, _login_required)
    openapi_url = app.openapi_url or "/openapi.json"

    @app.get(DOCS_URL, include_in_schema=False)
    async def swagger_ui(request: Request) -> HTMLResponse:
        root = _root(request)
        return get_swagger_ui_html(
            openapi_url=root + openapi_url,
            title=f"{app.title} - Swagger UI",
            oauth2_redirect_url=root + _OAUTH2_REDIRECT_URL,
            swagger_js_url=f"{root}{STATIC_URL}/swagger-ui/swagger-ui-bundle.js",
            swagger_css_url=f"{root}{STATIC_URL}/swagger-ui/swagger-ui.css",
            swagger_favicon_url=f"{root}{STATIC_URL}/swagger-ui/favicon-32x32.png",
            # The validator badge would fetch from the public validator service.
            swagger_ui_parameters={"validatorUrl": None},
        )

    @app.get(_OAUTH2_REDIRECT_URL, include_in_schema=False)
    async def swagger_ui_redirect() -> HTMLResponse:
        return get_swagger_ui_oauth2_redirect_html()

    @app.get(REDOC_URL, include_in_schema=False)
    async def redoc(request: Request) -> RedirectResponse:
        # Old links keep working, offline: the one docs page is Swagger UI.
        return RedirectResponse(_root(request) + DOCS_URL, status_code=307)
