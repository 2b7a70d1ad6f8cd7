"""Dependencies as types: a route says what it needs in its signature.

``memory: ReadMemory`` gives a route the caller's tenant view of the memory and
requires the ``read`` scope; ``WriteMemory`` requires ``write``. There is no
other way for a route to reach the stores, so every route is tenant-scoped by
construction.

A key bound to one user (:mod:`memory.binding`) is held to it here too: a
``{user_id}`` in the path that is not its user is refused (403) when the key is
authenticated, and a ``{run_id}`` in the path of a run of another user is
answered as an absent run (404) before the route runs. Routes that name a user
in the body or query, or address an object by an id of its own (a job), check
with :func:`require_user` and the owner themselves; ``tests/api/test_user_keys.py``
holds every route to a decision.

Each dependency is one ``async`` function of the request, with no
sub-dependencies: FastAPI's dependency solving and a thread hop per sync
dependency cost more than the whole fact lookup. The API-key security schemes
are declared in the OpenAPI document by :func:`api.app.create_app` instead of
through ``fastapi.security`` dependencies.
"""

from __future__ import annotations

from typing import Annotated

import anyio.to_thread
from fastapi import Depends, Request

from api.errors import AuthenticationRequiredError, ForbiddenError
from api.state import Principal, ServiceState
from memory.apikeys import Scope
from memory.binding import allowed, owned_run, refusal
from memory.facade import Memory

_ALL_SCOPES: frozenset[Scope] = frozenset(("read", "write"))
_PRINCIPAL = "tiermem.principal"


async def get_service(request: Request) -> ServiceState:
    """The app's shared state (set by the lifespan)."""
    service: ServiceState = request.app.state.tiermem
    return service


ServiceDep = Annotated[ServiceState, Depends(get_service)]


def _presented_key(request: Request) -> str | None:
    key = request.headers.get("x-api-key")
    if key:
        return key
    scheme, _, credentials = request.headers.get("authorization", "").partition(" ")
    if scheme.lower() == "bearer" and credentials.strip():
        return credentials.strip()
    return None


async def authenticate(request: Request) -> Principal:
    """Who is calling, from the API key (or the server's own tenant when auth is off).

    The answer is kept on the request, so several dependencies of one request
    verify the key once.

    Raises:
        AuthenticationRequiredError: No key was sent.
        InvalidApiKeyError: The key is malformed, unknown or revoked.
        ForbiddenError: The key is bound to a user and the path names another user.
    """
    state = request.scope.setdefault("state", {})
    principal: Principal | None = state.get(_PRINCIPAL)
    if principal is not None:
        return principal
    service: ServiceState = request.app.state.tiermem
    caller: Principal
    if not service.settings.auth_enabled:
        caller = Principal(tenant=service.memory.tenant, scopes=_ALL_SCOPES, key_id=None)
    else:
        key = _presented_key(request)
        if key is None:
            raise AuthenticationRequiredError(
                "no API key: send 'Authorization: Bearer <key>' or 'X-API-Key: <key>' "
                "(create one with `tiermem keys create --tenant <tenant>`)"
            )
        cached = service.cached_principal(key)
        if cached is None:
            cached = await service.verify(key)
        caller = cached
    state[_PRINCIPAL] = caller
    state["tenant"] = caller.tenant  # for the access log
    require_user(caller, request.path_params.get("user_id"))
    return caller


def require_user(principal: Principal, user_id: str | None) -> None:
    """Refuse a key bound to one user that names another user (``None`` names nobody).

    Raises:
        ForbiddenError: The key is bound to another user. The message names the
            key's own user only, the same whether ``user_id`` has data or not.
    """
    if not allowed(principal.user_id, user_id):
        assert principal.user_id is not None
        raise ForbiddenError(refusal(principal.user_id, f"API key {principal.key_id}"))


def _require(principal: Principal, scope: Scope) -> None:
    if scope not in principal.scopes:
        raise ForbiddenError(
            f"this API key (id {principal.key_id}) may not {scope}: it has scopes "
            f"{sorted(principal.scopes)}; use a key created without --read-only"
        )


async def read_principal(request: Request) -> Principal:
    """The caller, who must hold the ``read`` scope."""
    principal = await authenticate(request)
    _require(principal, "read")
    return principal


async def _memory(request: Request, scope: Scope) -> Memory:
    principal = await authenticate(request)
    _require(principal, scope)
    service: ServiceState = request.app.state.tiermem
    view = service.cached_view(principal.tenant)
    if view is None:
        view = await anyio.to_thread.run_sync(service.view, principal.tenant)
    run_id = request.path_params.get("run_id")
    if principal.user_id is not None and run_id is not None:
        # Everything under /v1/runs/{run_id} (checkpoints, events, effects, approvals) is the
        # run owner's: a run of another user is answered as if it did not exist (404).
        await service.read(owned_run, view, run_id, principal.user_id)
    return view


async def read_memory(request: Request) -> Memory:
    """The caller's tenant view of the memory, for reading.

    Raises:
        AuthenticationRequiredError, InvalidApiKeyError, ForbiddenError: See :func:`authenticate`.
        RunNotFoundError: The key is bound to a user and the path's run is another user's.
    """
    return await _memory(request, "read")


async def write_memory(request: Request) -> Memory:
    """The caller's tenant view of the memory, for writing.

    Raises:
        ForbiddenError: The key is read-only (or see :func:`authenticate`).
        AuthenticationRequiredError, InvalidApiKeyError: See :func:`authenticate`.
        RunNotFoundError: The key is bound to a user and the path's run is another user's.
    """
    return await _memory(request, "write")


Caller = Annotated[Principal, Depends(authenticate)]
ReadAccess = Annotated[Principal, Depends(read_principal)]
ReadMemory = Annotated[Memory, Depends(read_memory)]
WriteMemory = Annotated[Memory, Depends(write_memory)]
