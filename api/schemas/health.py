"""Bodies of the health probes."""

from __future__ import annotations

from typing import Literal

from api.schemas.common import ResponseModel


class Health(ResponseModel):
    """Liveness: the process answers."""

    status: Literal["ok"]


class Readiness(ResponseModel):
    """Readiness: every dependency answered (each check is 'ok' or what failed).

    ``degraded`` serves, but without a guarantee users rely on: ``volatile``
    means the KV store may lose acknowledged writes and the operator allowed it
    (``allow_volatile``); ``volatile_reason`` says why.
    """

    status: Literal["ok", "degraded"]
    checks: dict[str, str]
    volatile: bool = False
    volatile_reason: str | None = None
