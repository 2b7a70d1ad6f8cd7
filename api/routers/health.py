"""Probes and metrics: ``/healthz``, ``/readyz``, ``/metrics`` (no API key needed)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request, Response

from api.deps import ServiceDep
from api.errors import problem_response, problem_responses, request_id_of
from api.responses import json_response
from api.schemas.health import Health, IndexDamage, Readiness
from api.schemas.problems import Problem
from api.state import ServiceState
from tiers.backends import kv_volatility

router = APIRouter(tags=["operations"])
logger = logging.getLogger("tiermem.api")


@router.get("/healthz", name="healthz")
async def healthz() -> Health:
    """Liveness: the process is up and serving."""
    return Health(status="ok")


@router.get("/readyz", name="readyz", response_model=Readiness, responses=problem_responses(503))
def readyz(request: Request, service: ServiceDep) -> Response:
    """Readiness: the KV store and the vector index answer, and the embedder can embed.

    A local embedding model must load; a hosted one must answer (an answer counts
    for 30 seconds, so probes do not each pay for a request). The KV store must
    be durable (asked on every probe: Redis may have been restarted with another
    configuration); one that may lose acknowledged writes is ready only if the
    operator allowed it (``allow_volatile``), and then ``status`` is ``degraded``
    with ``volatile: true`` and the reason. A vector index the last periodic
    check found out of line with the KV store (``index_check_interval_seconds``)
    makes ``status`` ``degraded`` too, with ``index_reason`` and the counts
    summed over tenants in ``index_damage`` (200: the service serves, recall
    ranks the sessions concerned by keywords until the repair).
    """
    memory = service.memory
    checks: dict[str, str] = {}
    probes = {"kv": memory.kv.ping, "index": memory.index.ping, "embedder": service.check_embedder}
    for name, probe in probes.items():
        try:
            probe()
        except Exception as exc:
            logger.warning("readiness check %s failed: %s", name, exc)
            checks[name] = type(exc).__name__  # details go to the log, not to anonymous callers
        else:
            checks[name] = "ok"
    reason: str | None = None
    allowed = service.settings.allow_volatile or memory.allow_volatile
    if checks["kv"] == "ok":
        try:
            reason = kv_volatility(memory.kv)
        except Exception as exc:
            logger.warning("readiness check durability failed: %s", exc)
            checks["durability"] = type(exc).__name__
        else:
            if reason is None:
                checks["durability"] = "ok"
            elif allowed:
                checks["durability"] = "volatile (allowed)"
            else:
                logger.error("the KV store may lose acknowledged writes: %s", reason)
                checks["durability"] = "volatile"
    failed = sorted(k for k, v in checks.items() if v not in ("ok", "volatile (allowed)"))
    damage = _index_damage(service)
    if not failed:
        status = "ok" if reason is None and damage is None else "degraded"
        readiness = Readiness(
            status=status,
            checks=checks,
            volatile=reason is not None,
            volatile_reason=reason,
            index_reason=_index_reason(damage),
            index_damage=damage,
        )
        return json_response(readiness)
    problem = Problem(
        type="urn:tiermem:problem:not-ready",
        title="Not ready",
        status=503,
        detail=f"not ready: {', '.join(failed)} failed; see 'checks'",
        instance=request.url.path,
        request_id=request_id_of(request),
        checks=checks,
        volatile=reason is not None,
        volatile_reason=reason,
    )
    return problem_response(problem, headers={"Retry-After": "1"})


def _index_damage(service: ServiceState) -> IndexDamage | None:
    """What the last index check of every tenant found, summed; ``None`` when nothing."""
    damaged = [report for report in service.index_reports() or () if not report.consistent]
    if not damaged:
        return None
    return IndexDamage(
        tenants=len(damaged),
        missing=sum(report.missing for report in damaged),
        stale=sum(report.stale for report in damaged),
        orphans=sum(report.orphans for report in damaged),
    )


def _index_reason(damage: IndexDamage | None) -> str | None:
    if damage is None:
        return None
    return (
        f"the vector index is out of line with the KV store in {damage.tenants} tenant(s): "
        f"{damage.missing} vectors missing, {damage.stale} stale, {damage.orphans} orphaned; "
        "recall ranks those sessions by keywords until repaired (the service repairs "
        "index_repair_batch per check; `tiermem reindex --all-tenants` repairs all; "
        "tiermem_index_* metrics name the tenants)"
    )


@router.get("/metrics", name="metrics", include_in_schema=False)
def metrics(service: ServiceDep) -> Response:
    """Prometheus exposition of this app's metrics."""
    body, content_type = service.metrics.render()
    return Response(body, media_type=content_type)
