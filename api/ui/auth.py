"""Who is using the console: the API key in a cookie, resolved as the REST routes resolve it.

The login form takes an API key (the same keys as ``/v1``); the key is kept in
an HttpOnly, SameSite=Strict cookie scoped to ``/ui``, and every page verifies
it through :class:`~api.state.ServiceState` exactly as :func:`api.deps.authenticate`
does (same cache, same registry, same tenant, scopes and user binding). A page
without a valid key answers 303 to the login page.

Every POST carries a CSRF token bound to the cookie: an HMAC of a fixed label
keyed by the cookie's value. A page of another site can neither read the
cookie nor compute the token, and the token needs no server-side state, so it
holds across replicas and restarts.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets

from fastapi import Request

from api.state import Principal, ServiceState
from memory.apikeys import InvalidApiKeyError, Scope

COOKIE = "tiermem_console"
"""Name of the cookie holding the API key (or, with auth off, a random session token)."""

COOKIE_PATH = "/ui"
_ALL_SCOPES: frozenset[Scope] = frozenset(("read", "write"))
_CSRF_LABEL = b"tiermem-console-csrf-v1"


class LoginRequired(Exception):  # noqa: N818 (a control-flow signal, not an error)
    """No valid key in the request's cookie: the handler answers 303 to the login page."""


def csrf_token(session: str) -> str:
    """The CSRF token bound to a session cookie's value."""
    return hmac.new(session.encode(), _CSRF_LABEL, hashlib.sha256).hexdigest()


def csrf_valid(session: str, token: str | None) -> bool:
    """Whether ``token`` is the CSRF token of ``session`` (compared in constant time)."""
    return token is not None and hmac.compare_digest(csrf_token(session), token)


def new_session_token() -> str:
    """A random session value, for a console login on a server with auth off."""
    return secrets.token_urlsafe(32)


async def principal_for(service: ServiceState, key: str) -> Principal | None:
    """The principal of a key, or ``None`` if it is malformed, unknown or revoked.

    With auth off any value stands for the server's own tenant with every
    scope, as for the REST routes. Call from the event loop only.
    """
    if not service.settings.auth_enabled:
        return Principal(tenant=service.memory.tenant, scopes=_ALL_SCOPES, key_id=None)
    cached = service.cached_principal(key)
    if cached is not None:
        return cached
    try:
        return await service.verify(key)
    except InvalidApiKeyError:
        return None


async def console_principal(request: Request) -> Principal:
    """The caller of a console page, from its cookie.

    Raises:
        LoginRequired: No cookie, or its key is not (or no longer) valid.
    """
    session = request.cookies.get(COOKIE)
    if not session:
        raise LoginRequired
    service: ServiceState = request.app.state.tiermem
    principal = await principal_for(service, session)
    if principal is None:
        raise LoginRequired
    # For the access log, as api.deps.authenticate does.
    request.scope.setdefault("state", {})["tenant"] = principal.tenant
    return principal
