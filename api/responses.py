"""Responses serialized where the route runs.

A sync route that returns a pydantic model makes FastAPI validate it again in
a second thread hop; the schemas here are built by pydantic already, so routes
serialize them directly (the decorator's ``response_model`` keeps the OpenAPI
document exact).
"""

from __future__ import annotations

from collections.abc import Mapping

from fastapi.responses import Response
from pydantic import BaseModel


def json_response(
    model: BaseModel, *, status_code: int = 200, headers: Mapping[str, str] | None = None
) -> Response:
    """``model`` as an ``application/json`` response."""
    return Response(
        content=model.model_dump_json(),
        status_code=status_code,
        media_type="application/json",
        headers=dict(headers) if headers else None,
    )
