"""Probes and metrics: ``/healthz``, ``/readyz``, ``/metrics`` (no API key needed)."""

from __future__ import annotations

import logging

from fastapi import APIRouter, Request, Response

from api.deps import ServiceDep
from api.errors import problem_response, problem_responses, request_id_of
from api.responses import json_response
from api.schemas.health import Health, Readiness
from api.schemas.problems import Problem

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
    for 30 seconds, so probes do not each pay for a request).
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
    if all(v == "ok" for v in checks.values()):
        return json_response(Readiness(status="ok", checks=checks))
    failed = sorted(k for k, v in checks.items() if v != "ok")
    problem = Problem(
        type="urn:tiermem:problem:not-ready",
        title="Not ready",
        status=503,
        detail=f"not ready: {', '.join(failed)} failed; see 'checks'",
        instance=request.url.path,
        request_id=request_id_of(request),
        checks=checks,
    )
    return problem_response(problem, headers={"Retry-After": "1"})


@router.get("/metrics", name="metrics", include_in_schema=False)
def metrics(service: ServiceDep) -> Response:
    """Prometheus exposition of this app's metrics."""
    body, content_type = service.metrics.render()
    return Response(body, media_type=content_type)
