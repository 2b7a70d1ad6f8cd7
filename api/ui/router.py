"""The console's pages under ``/ui``: login, runs, one run, approvals, a user's memory.

Plain server-rendered HTML (Jinja2 with autoescape on: every stored value is
user content). Each page resolves its caller from the console cookie as the
REST routes resolve an API key (:mod:`api.ui.auth`), reads one tenant's view
through :mod:`api.ui.views` off the event loop, and renders one template. An
error the REST routes would answer with a 4xx problem is shown as an error
page with the same status; a server fault goes to the app's error handlers.
"""

from __future__ import annotations

from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar
from urllib.parse import parse_qs, quote

import anyio.to_thread
import jinja2
from fastapi import APIRouter, Request
from fastapi.responses import HTMLResponse, RedirectResponse, Response

from api.errors import spec_for
from api.state import Principal, ServiceState
from api.ui import views
from api.ui.auth import (
    COOKIE,
    COOKIE_PATH,
    console_principal,
    csrf_token,
    csrf_valid,
    new_session_token,
    principal_for,
)
from memory.binding import allowed, refusal
from memory.facade import Memory

T = TypeVar("T")

LOGIN_COOKIE = "tiermem_console_login"
"""A random value set by the login page; the login form's CSRF token is bound to it."""

_TEMPLATES = jinja2.Environment(
    loader=jinja2.FileSystemLoader(Path(__file__).parent / "templates"),
    autoescape=True,
    undefined=jinja2.StrictUndefined,
)
_TEMPLATES.filters["as_json"] = views.as_json
_TEMPLATES.filters["json_size"] = views.json_size
_TEMPLATES.globals["page_query"] = views.page_query

router = APIRouter(prefix="/ui", include_in_schema=False)


class _PageError(Exception):
    """A refusal shown as an error page (the caller may not, or the input is wrong)."""

    def __init__(self, status: int, message: str) -> None:
        super().__init__(message)
        self.status = status


def _render(
    request: Request,
    template: str,
    principal: Principal | None,
    *,
    status: int = 200,
    **context: Any,
) -> HTMLResponse:
    session = request.cookies.get(COOKIE, "")
    html = _TEMPLATES.get_template(template).render(
        principal=principal,
        csrf=csrf_token(session) if principal is not None else "",
        root=request.scope.get("root_path", "").rstrip("/"),
        **context,
    )
    # Pages show one tenant's data: never kept by a shared cache, never framed.
    headers = {
        "Cache-Control": "no-store",
        "X-Frame-Options": "DENY",
        "Content-Security-Policy": "default-src 'self'; frame-ancestors 'none'; form-action 'self'",
        "Referrer-Policy": "same-origin",
    }
    return HTMLResponse(html, status_code=status, headers=headers)


async def _memory(request: Request, principal: Principal) -> Memory:
    service: ServiceState = request.app.state.tiermem
    view = service.cached_view(principal.tenant)
    if view is None:
        view = await anyio.to_thread.run_sync(service.view, principal.tenant)
    return view


async def _read(fn: Callable[..., T], *args: Any) -> T:
    """``fn(*args)`` in a worker thread; a client error becomes a :class:`_PageError`."""
    try:
        return await anyio.to_thread.run_sync(fn, *args)
    except Exception as exc:
        spec = spec_for(exc)
        if spec.status >= 500 or not spec.public_detail:
            raise
        raise _PageError(spec.status, str(exc)) from exc


def _error_page(request: Request, principal: Principal | None, error: _PageError) -> HTMLResponse:
    return _render(request, "error.html", principal, status=error.status, message=str(error))


async def _form(request: Request) -> dict[str, str]:
    """The urlencoded form of a POST (first value of each field)."""
    fields = parse_qs((await request.body()).decode("utf-8", "replace"), keep_blank_values=True)
    return {name: values[0] for name, values in fields.items()}


def _require_csrf(request: Request, form: dict[str, str]) -> None:
    if not csrf_valid(request.cookies.get(COOKIE, ""), form.get("csrf")):
        raise _PageError(403, "missing or wrong CSRF token: reload the page and try again")


def _require_user(principal: Principal, user_id: str | None) -> None:
    if not allowed(principal.user_id, user_id):
        assert principal.user_id is not None
        raise _PageError(403, refusal(principal.user_id, f"API key {principal.key_id}"))


def _redirect(request: Request, path: str) -> RedirectResponse:
    root = request.scope.get("root_path", "").rstrip("/")
    return RedirectResponse(root + path, status_code=303)


@router.get("")
async def console_home(request: Request) -> Response:
    """The console's start: the runs table."""
    await console_principal(request)
    return _redirect(request, "/ui/runs")


@router.get("/login")
async def login_page(request: Request) -> Response:
    """The login form: paste an API key."""
    service: ServiceState = request.app.state.tiermem
    nonce = new_session_token()
    response = _render(
        request,
        "login.html",
        None,
        login_csrf=csrf_token(nonce),
        auth_enabled=service.settings.auth_enabled,
        error=None,
    )
    response.set_cookie(
        LOGIN_COOKIE, nonce, path=COOKIE_PATH, httponly=True, samesite="strict", max_age=3600
    )
    return response


@router.post("/login")
async def login(request: Request) -> Response:
    """Check the pasted key; on success keep it in the console cookie."""
    service: ServiceState = request.app.state.tiermem
    form = await _form(request)
    if not csrf_valid(request.cookies.get(LOGIN_COOKIE, ""), form.get("csrf")):
        return _error_page(
            request, None, _PageError(403, "missing or wrong CSRF token: reload the login page")
        )
    key = form.get("api_key", "").strip()
    if not service.settings.auth_enabled:
        key = new_session_token()  # any value stands for the server's tenant
    principal = await principal_for(service, key) if key else None
    if principal is None:
        nonce = request.cookies.get(LOGIN_COOKIE, "")
        return _render(
            request,
            "login.html",
            None,
            status=401,
            login_csrf=csrf_token(nonce),
            auth_enabled=True,
            error="That API key is malformed, unknown or revoked.",
        )
    response = _redirect(request, "/ui/runs")
    response.set_cookie(
        COOKIE,
        key,
        path=COOKIE_PATH,
        httponly=True,
        samesite="strict",
        secure=request.url.scheme == "https",
    )
    response.delete_cookie(LOGIN_COOKIE, path=COOKIE_PATH)
    return response


@router.post("/logout")
async def logout(request: Request) -> Response:
    """Forget the console cookie."""
    principal = await console_principal(request)
    try:
        _require_csrf(request, await _form(request))
    except _PageError as error:
        return _error_page(request, principal, error)
    response = _redirect(request, "/ui/login")
    response.delete_cookie(COOKIE, path=COOKIE_PATH, httponly=True, samesite="strict")
    return response


@router.get("/runs")
async def runs_page(
    request: Request,
    status: str | None = None,
    page: int = 1,
    user_id: str | None = None,
) -> Response:
    """The runs table, filtered by status (or ``blocked``) and user, newest first, paged."""
    principal = await console_principal(request)
    try:
        user = user_id or None
        _require_user(principal, user)
        if status and status not in views.STATUS_FILTERS:
            raise _PageError(400, f"unknown status filter {status!r}")
        memory = await _memory(request, principal)
        listing = await _read(
            views.runs_page, memory, principal.user_id, user, status or None, page
        )
    except _PageError as error:
        return _error_page(request, principal, error)
    return _render(
        request,
        "runs.html",
        principal,
        listing=listing,
        filters=views.STATUS_FILTERS,
        user_id=user or "",
    )


@router.get("/runs/{run_id}")
async def run_page(
    request: Request,
    run_id: str,
    checkpoint: str | None = None,
    before: int | None = None,
    events_before: int | None = None,
    effects_after: str | None = None,
) -> Response:
    """One run: timeline, effects, approvals, budget, fork graph, scope at a step.

    The timeline and the events are paged newest first (``before``, ``events_before``:
    the seq to show the ones below), the effects in key order (``effects_after``: the
    idempotency key to show the ones after).
    """
    principal = await console_principal(request)
    try:
        memory = await _memory(request, principal)
        detail = await _read(
            views.run_page,
            memory,
            run_id,
            principal.user_id,
            checkpoint or None,
            before,
            events_before,
            effects_after or None,
        )
    except _PageError as error:
        return _error_page(request, principal, error)
    cursor = {
        "checkpoint": checkpoint or None,
        "before": before,
        "events_before": events_before,
        "effects_after": effects_after or None,
    }
    return _render(request, "run.html", principal, detail=detail, run=detail.run, cursor=cursor)


@router.get("/approvals")
async def approvals_page(request: Request) -> Response:
    """Runs waiting at an approval gate, with the frozen plan and approve / reject buttons."""
    principal = await console_principal(request)
    try:
        memory = await _memory(request, principal)
        gates = await _read(views.pending_approvals, memory, principal.user_id)
    except _PageError as error:
        return _error_page(request, principal, error)
    return _render(request, "approvals.html", principal, gates=gates)


async def _decide(request: Request, run_id: str, *, approve: bool) -> Response:
    principal = await console_principal(request)
    try:
        _require_csrf(request, form := await _form(request))
        if "write" not in principal.scopes:
            raise _PageError(
                403,
                f"this API key (id {principal.key_id}) is read-only: it may not approve or "
                "reject; log in with a key created without --read-only",
            )
        memory = await _memory(request, principal)
        await _read(views.visible_run, memory, run_id, principal.user_id)
        decide = memory.approve_run if approve else memory.reject_run
        by = f"console:api-key:{principal.key_id}" if principal.key_id else "console"
        note = form.get("note", "").strip() or None
        await _read(
            lambda: decide(
                run_id, form.get("plan_hash", ""), by=by, note=note, by_key=principal.key_id
            )
        )
    except _PageError as error:
        return _error_page(request, principal, error)
    return _redirect(request, f"/ui/runs/{quote(run_id, safe='')}")


@router.post("/runs/{run_id}/approve")
async def approve_run(request: Request, run_id: str) -> Response:
    """Approve the plan the run waits on (form: ``plan_hash``, ``note``, ``csrf``)."""
    return await _decide(request, run_id, approve=True)


@router.post("/runs/{run_id}/reject")
async def reject_run(request: Request, run_id: str) -> Response:
    """Reject the plan the run waits on (form: ``plan_hash``, ``note``, ``csrf``)."""
    return await _decide(request, run_id, approve=False)


@router.get("/users")
async def open_user(request: Request, user_id: str | None = None) -> Response:
    """Go to a user's memory page (a bound key: its own user's)."""
    principal = await console_principal(request)
    user = user_id or principal.user_id
    if not user:
        return _redirect(request, "/ui/runs")
    return _redirect(request, f"/ui/users/{quote(user, safe='')}")


@router.get("/users/{user_id}")
async def user_page(request: Request, user_id: str, q: str = "", max_tokens: str = "") -> Response:
    """A user's facts with history and provenance, sessions, and a context preview.

    ``max_tokens`` is the preview's budget; empty (the form left blank) for the default.
    """
    principal = await console_principal(request)
    try:
        _require_user(principal, user_id)
        budget = None
        if max_tokens.strip():
            if not max_tokens.strip().isdecimal():
                raise _PageError(400, f"max_tokens must be a positive integer, got {max_tokens!r}")
            budget = int(max_tokens)
        memory = await _memory(request, principal)
        data = await _read(views.user_page, memory, user_id, q, budget)
    except _PageError as error:
        return _error_page(request, principal, error)
    return _render(request, "user.html", principal, data=data, max_tokens=max_tokens)
