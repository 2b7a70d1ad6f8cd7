"""Every operation an app calls, declared once: its method, its HTTP route, and who offers it.

:data:`OPERATIONS` lists the methods of :class:`~memory.Memory` (and, the same
methods as coroutines, of :class:`~memory.AsyncMemory`), which of them the HTTP
client (:class:`~memory.client.MemoryClient`) offers, and the route of the
service (``api/routers``) that serves each one that has a route.
:data:`RUN_OPERATIONS` does the same for a run's lease handle: the library's
:class:`~tiers.task.RunHandle` and the client's :class:`~memory.remote_run.RemoteRun`.
:data:`SERVICE_ROUTES` holds the service's routes that are no operation of the
library. The tests check every class and the service's routes against these
tables, so a method or route added in one place and not the others fails them.
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Route:
    """An HTTP route of the service.

    Attributes:
        method: The HTTP method, upper case.
        path: The path template, as the service declares it.
    """

    method: str
    path: str


@dataclass(frozen=True, slots=True)
class Operation:
    """One operation an app calls.

    Attributes:
        name: The method's name (the same in every class that offers it).
        remote: Whether the HTTP client offers it, with the library's parameters.
        route: The service's route that serves it, if any.
        local_params: Parameters the client does not take: the service fills
            them from the request (``by_key``, the authenticated key's id), or
            they cannot cross the wire (callbacks).
        awaitable: Whether ``AsyncMemory`` offers it as a coroutine (``False``
            for what builds an instance: opening one, a tenant's view).
    """

    name: str
    remote: bool = False
    route: Route | None = None
    local_params: tuple[str, ...] = ()
    awaitable: bool = True


def _get(path: str) -> Route:
    return Route("GET", path)


def _post(path: str) -> Route:
    return Route("POST", path)


def _put(path: str) -> Route:
    return Route("PUT", path)


def _delete(path: str) -> Route:
    return Route("DELETE", path)


_USER = "/v1/users/{user_id}"
_FACT = f"{_USER}/facts/{{key}}"
_SESSIONS = f"{_USER}/sessions"
_SESSION = f"{_SESSIONS}/{{session_id}}"
_RUN = "/v1/runs/{run_id}"
_CHECKPOINT = f"{_RUN}/checkpoints/{{checkpoint_id}}"
_BY_KEY = ("by_key",)

OPERATIONS: tuple[Operation, ...] = (
    # opening
    Operation("open", awaitable=False),
    Operation("from_settings", awaitable=False),
    Operation("for_tenant", awaitable=False),
    # user facts
    Operation("set_fact", remote=True, route=_put(_FACT)),
    Operation("set_facts", remote=True, route=_put(f"{_USER}/facts")),
    Operation("get_fact", remote=True, route=_get(_FACT)),
    Operation("get_facts", remote=True, route=_get(f"{_USER}/facts")),
    Operation("fact_history", remote=True, route=_get(f"{_FACT}/history")),
    Operation("delete_fact", remote=True, route=_delete(_FACT)),
    Operation("delete_facts", remote=True, route=_delete(f"{_USER}/facts")),
    Operation("forget_user", remote=True, route=_delete(_USER)),
    # sessions
    Operation("save_session", remote=True, route=_post(_SESSIONS)),
    Operation("end_session", remote=True, route=_post(_SESSIONS)),
    Operation("save_transcript"),
    Operation("resummarize", remote=True, route=_post(f"{_SESSION}:resummarize")),
    Operation("require_transcript"),
    Operation("pending_summaries", remote=True, route=_get(f"{_SESSIONS}:pending")),
    Operation("get_session", remote=True, route=_get(_SESSION)),
    Operation("list_sessions", remote=True, route=_get(_SESSIONS)),
    Operation("delete_session", remote=True, route=_delete(_SESSION)),
    Operation("recall_relevant", remote=True, route=_post(f"{_SESSIONS}:recall")),
    Operation("continuation_context", remote=True, route=_post(f"{_USER}/context")),
    Operation("build_continuation_context", remote=True, route=_post(f"{_USER}/context")),
    # runs
    Operation("start_run", remote=True, route=_post("/v1/runs")),
    Operation("attach_run"),
    Operation("list_runs", remote=True, route=_get("/v1/runs")),
    Operation("list_resumable_runs", remote=True, route=_get("/v1/runs:resumable")),
    Operation("get_run", remote=True, route=_get(_RUN)),
    Operation("plan_resume", remote=True, route=_get(f"{_RUN}:resume-plan")),
    Operation("delete_run", remote=True, route=_delete(_RUN)),
    Operation("run_history", remote=True, route=_get(f"{_RUN}/checkpoints")),
    Operation("checkpoint_for_key", remote=True, route=_get(f"{_RUN}/checkpoints:by-key")),
    Operation("get_checkpoint", remote=True, route=_get(_CHECKPOINT)),
    Operation("run_state_at", remote=True, route=_get(f"{_CHECKPOINT}/state")),
    Operation(
        "update_run_state",
        remote=True,
        route=_post(f"{_RUN}:update-state"),
        local_params=_BY_KEY,
    ),
    Operation("run_events", remote=True, route=_get(f"{_RUN}/events")),
    Operation("run_effects", remote=True, route=_get(f"{_RUN}/effects")),
    Operation("count_run_effects"),
    Operation("get_effect"),
    Operation("run_approval"),
    Operation(
        "resolve_effect",
        remote=True,
        route=_post(f"{_RUN}/effects:resolve"),
        local_params=_BY_KEY,
    ),
    Operation("cancel_run", remote=True, route=_post(f"{_RUN}:cancel")),
    Operation("set_budget", remote=True, route=_post(f"{_RUN}:set-budget"), local_params=_BY_KEY),
    Operation("approve_run", remote=True, route=_post(f"{_RUN}:approve"), local_params=_BY_KEY),
    Operation("reject_run", remote=True, route=_post(f"{_RUN}:reject"), local_params=_BY_KEY),
    Operation("fork_run", remote=True, route=_post(f"{_RUN}:fork")),
    Operation("sweep_runs"),
    # retention and index upkeep
    Operation("retention"),
    Operation("set_retention"),
    Operation("sweep"),
    Operation("check_index"),
    Operation("repair_index"),
    Operation("tenants"),
    # lifecycle
    Operation("ping", remote=True, route=_get("/readyz")),
    Operation("force_flush"),
    Operation("flush"),
    Operation("close", remote=True),
)
"""The operations of ``Memory``, ``AsyncMemory`` and (``remote``) ``MemoryClient``."""

RUN_OPERATIONS: tuple[Operation, ...] = (
    Operation("append_checkpoint", remote=True, route=_post(f"{_RUN}/checkpoints")),
    Operation("begin_effect", remote=True, route=_post(f"{_RUN}/effects:begin")),
    Operation("record_effect", remote=True, route=_post(f"{_RUN}/effects:record")),
    Operation("effect", remote=True, local_params=("reconcile", "compensation")),
    Operation("await_approval", remote=True, route=_post(f"{_RUN}/approvals")),
    Operation("heartbeat", remote=True, route=_post(f"{_RUN}:heartbeat")),
    Operation("complete", remote=True, route=_post(f"{_RUN}:complete")),
    Operation("fail", remote=True, route=_post(f"{_RUN}:fail")),
)
"""The lease handle's operations: ``RunHandle`` and (``remote``) ``RemoteRun``."""

SERVICE_ROUTES: tuple[Route, ...] = (
    # The status of a background summary job (what end_session and resummarize poll).
    _get("/v1/jobs/{job_id}"),
)
"""The service's ``/v1`` routes that serve no operation of the library."""
