"""Continuation context: ``POST /v1/users/{user_id}/context``."""

from __future__ import annotations

import time

from fastapi import APIRouter, Response

from api.deps import ReadMemory, ServiceDep
from api.errors import problem_responses
from api.responses import json_response
from api.schemas.common import UserIdPath
from api.schemas.context import ContextOut, ContextRequest

router = APIRouter(tags=["context"], responses=problem_responses(400, 401, 403, 413, 422, 500, 503))


@router.post("/v1/users/{user_id}/context", name="continuation_context", response_model=ContextOut)
def continuation_context(
    user_id: UserIdPath, body: ContextRequest, service: ServiceDep, memory: ReadMemory
) -> Response:
    """Prompt-ready context for a new session: the user's facts and relevant earlier sessions.

    The most recent session is always included when it fits; whole summaries
    are left out, least relevant first, to stay within ``max_tokens``. The
    answer lists each section with its token count, and what was left out.
    """
    start = time.perf_counter()
    context = memory.continuation_context(
        user_id, body.query, body.max_tokens, top_k=body.top_k, now=body.now
    )
    if memory.metrics is None:  # else the library timed it, into these same metrics
        service.metrics.context.observe(time.perf_counter() - start)
    return json_response(ContextOut.model_validate(context, from_attributes=True))
