"""Bodies of the health probes."""

from __future__ import annotations

from typing import Literal

from api.schemas.common import ResponseModel


class Health(ResponseModel):
    """Liveness: the process answers."""

    status: Literal["ok"]


class Readiness(ResponseModel):
    """Readiness: every dependency answered (each check is 'ok' or what failed)."""

    status: Literal["ok"]
    checks: dict[str, str]
