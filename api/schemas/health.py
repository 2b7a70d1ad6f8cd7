"""Bodies of the health probes."""

from __future__ import annotations

from typing import Literal

from api.schemas.common import ResponseModel


class Health(ResponseModel):
    """Liveness: the process answers."""

    status: Literal["ok"]


class IndexDamage(ResponseModel):
    """What the last vector index check found, summed over tenants (no tenant is named here)."""

    tenants: int
    missing: int
    stale: int
    orphans: int


class Readiness(ResponseModel):
    """Readiness: every dependency answered (each check is 'ok' or what failed).

    ``degraded`` serves, but without a guarantee users rely on: ``volatile``
    means the KV store may lose acknowledged writes and the operator allowed it
    (``allow_volatile``); ``volatile_reason`` says why. ``index_damage`` means
    the vector index lacks vectors the KV store holds, or holds stale or
    orphaned ones (recall ranks the sessions concerned by keywords only until
    it is repaired); ``index_reason`` says so, the ``tiermem_index_*`` metrics
    name the tenants.
    """

    status: Literal["ok", "degraded"]
    checks: dict[str, str]
    volatile: bool = False
    volatile_reason: str | None = None
    index_reason: str | None = None
    index_damage: IndexDamage | None = None
