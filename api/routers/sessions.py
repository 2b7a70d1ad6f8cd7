"""Session summaries: ``/v1/users/{user_id}/sessions``, recall, and background summarization jobs."""

from __future__ import annotations

import time
from functools import partial
from typing import Annotated, Any

from fastapi import APIRouter, Path, Query, Request, Response, status

from api.deps import ReadAccess, ReadMemory, ServiceDep, WriteMemory
from api.errors import problem_responses
from api.jobs import Job
from api.responses import json_response
from api.schemas.common import SessionIdPath, UserIdPath
from api.schemas.sessions import (
    JobOut,
    PendingSessions,
    RecalledOut,
    RecallRequest,
    RecallResponse,
    SessionCreate,
    SessionList,
    SessionOut,
)
from summarizer import parse_transcript
from tiers.errors import SessionNotFoundError
from tiers.models import SessionSummary

router = APIRouter(
    tags=["sessions"], responses=problem_responses(400, 401, 403, 409, 413, 422, 500, 503)
)

_USER = "/v1/users/{user_id}"


def session_out(summary: SessionSummary) -> SessionOut:
    """The API form of a stored summary."""
    return SessionOut.model_validate(summary, from_attributes=True)


def job_out(request: Request, job: Job) -> JobOut:
    """The API form of a job, with the URLs to poll it and to read its session."""
    return JobOut(
        job_id=job.job_id,
        status=job.status,
        user_id=job.user_id,
        session_id=job.session_id,
        status_url=request.app.url_path_for("get_job", job_id=job.job_id),
        session_url=request.app.url_path_for(
            "get_session", user_id=job.user_id, session_id=job.session_id
        ),
        created_at=job.created_at,
        finished_at=job.finished_at,
        attempts=job.attempts,
        max_attempts=job.max_attempts,
        session=session_out(job.result) if job.result is not None else None,
        error=job.error,
    )


@router.post(
    f"{_USER}/sessions",
    name="save_session",
    status_code=status.HTTP_201_CREATED,
    response_model=SessionOut,
    responses={
        202: {"model": JobOut, "description": "Transcript accepted; poll the job at Location."},
        429: problem_responses(429)[429],
        502: problem_responses(502)[502],
    },
)
def save_session(
    user_id: UserIdPath,
    body: SessionCreate,
    request: Request,
    service: ServiceDep,
    memory: WriteMemory,
    wait: Annotated[
        bool,
        Query(
            description="Summarize a transcript before answering (201) instead of in the background (202)."
        ),
    ] = False,
) -> Response:
    """Save a finished session: a structured summary as given, or a transcript summarized.

    Saving the same ``session_id`` again replaces the session. User facts the
    summarizer finds in a transcript are stored with the session as source.
    A transcript may hold chat-completions messages (tool calls included) and
    Responses-API items (what the OpenAI Agents SDK produces), read exactly as
    ``Memory.end_session`` reads them; an item it cannot read is a 422
    ``invalid-transcript`` problem whose ``field`` names it.
    """
    if body.summary is not None:
        data = body.summary.model_dump()
        data.update(user_id=user_id, session_id=body.session_id)
        if body.created_at is not None:
            data["created_at"] = body.created_at
        return json_response(
            session_out(memory.save_session(data)), status_code=status.HTTP_201_CREATED
        )
    assert body.transcript is not None  # the schema requires exactly one of the two
    # The items as sent (the schema skips validating them): the library's parser reads them,
    # so the service accepts and refuses exactly what Memory.end_session does.
    transcript: list[Any] = list(body.transcript)
    if wait:
        # Durable before the summarizer is called: if summarizing fails, the session is
        # listed as pending and can be summarized again.
        memory.save_transcript(user_id, body.session_id, transcript, created_at=body.created_at)
        return _summarize(request, service, memory, user_id, body.session_id, wait=True)
    # The transcript and its job in one commit (or a 429 before anything is stored): a 202
    # means both are durable, and any replica runs the job, after a crash too.
    job = service.jobs.submit(
        memory,
        user_id=user_id,
        session_id=body.session_id,
        messages=parse_transcript(transcript),
        created_at=body.created_at,
    )
    return _accepted(request, job)


@router.post(
    f"{_USER}/sessions/{{session_id}}:resummarize",
    name="resummarize_session",
    status_code=status.HTTP_201_CREATED,
    response_model=SessionOut,
    responses={
        202: {"model": JobOut, "description": "Accepted; poll the job at Location."},
        404: problem_responses(404)[404],
        429: problem_responses(429)[429],
        502: problem_responses(502)[502],
    },
)
def resummarize_session(
    user_id: UserIdPath,
    session_id: SessionIdPath,
    request: Request,
    service: ServiceDep,
    memory: WriteMemory,
    wait: Annotated[
        bool,
        Query(description="Summarize before answering (201) instead of in the background (202)."),
    ] = False,
) -> Response:
    """Summarize a session again from its stored transcript (after a failure, or with a new model)."""
    memory.require_transcript(user_id, session_id)  # 404 now, not in the job
    return _summarize(request, service, memory, user_id, session_id, wait=wait)


@router.get(f"{_USER}/sessions:pending", name="pending_summaries", response_model=PendingSessions)
def pending_summaries(user_id: UserIdPath, memory: ReadMemory) -> Response:
    """Sessions with a stored transcript but no summary yet: queued, or summarizing failed."""
    return json_response(PendingSessions(session_ids=memory.pending_summaries(user_id)))


def _summarize(
    request: Request,
    service: ServiceDep,
    memory: WriteMemory,
    user_id: str,
    session_id: str,
    *,
    wait: bool,
) -> Response:
    if wait:
        saved = service.resummarize(memory, user_id, session_id)
        return json_response(session_out(saved), status_code=status.HTTP_201_CREATED)
    return _accepted(request, service.jobs.submit(memory, user_id=user_id, session_id=session_id))


def _accepted(request: Request, job: Job) -> Response:
    out = job_out(request, job)
    return json_response(
        out, status_code=status.HTTP_202_ACCEPTED, headers={"Location": out.status_url}
    )


@router.get(f"{_USER}/sessions", name="list_sessions", response_model=SessionList)
def list_sessions(
    user_id: UserIdPath,
    memory: ReadMemory,
    limit: Annotated[int | None, Query(ge=0, le=10_000, description="At most this many.")] = None,
) -> Response:
    """The user's session summaries, newest first."""
    return json_response(
        SessionList(sessions=[session_out(s) for s in memory.list_sessions(user_id, limit=limit)])
    )


@router.get(
    f"{_USER}/sessions/{{session_id}}",
    name="get_session",
    response_model=SessionOut,
    responses=problem_responses(404),
)
def get_session(user_id: UserIdPath, session_id: SessionIdPath, memory: ReadMemory) -> Response:
    """One stored session summary."""
    return json_response(session_out(memory.get_session(user_id, session_id)))


@router.delete(
    f"{_USER}/sessions/{{session_id}}",
    name="delete_session",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=problem_responses(404),
)
def delete_session(
    user_id: UserIdPath, session_id: SessionIdPath, memory: WriteMemory, service: ServiceDep
) -> None:
    """Delete a session from the store and the index, with the facts learned from it; 404 if
    there was none. A summary of it still being made is not saved."""
    existed = memory.delete_session(user_id, session_id)  # its jobs too
    if not existed:
        raise SessionNotFoundError(f"user {user_id!r} has no session {session_id!r}")


@router.post(f"{_USER}/sessions:recall", name="recall_relevant", response_model=RecallResponse)
def recall_relevant(
    user_id: UserIdPath, body: RecallRequest, service: ServiceDep, memory: ReadMemory
) -> Response:
    """The user's earlier sessions most relevant to ``query``, best first."""
    start = time.perf_counter()
    hits = memory.recall_relevant(user_id, body.query, body.top_k, now=body.now)
    if memory.metrics is None:  # else the library timed it, into these same metrics
        service.metrics.recall.observe(time.perf_counter() - start)
    return json_response(
        RecallResponse(
            results=[RecalledOut(session=session_out(h.summary), score=h.score) for h in hits]
        )
    )


@router.get(
    "/v1/jobs/{job_id}", name="get_job", response_model=JobOut, responses=problem_responses(404)
)
async def get_job(
    job_id: Annotated[str, Path(min_length=1, max_length=128)],
    request: Request,
    service: ServiceDep,
    principal: ReadAccess,
) -> Response:
    """A background summarization job of the caller's tenant (poll it until it is finished).

    Any replica answers: jobs are kept in the store. A key bound to one user
    gets 404 for a job of another user, as for no job.
    """
    get = partial(service.jobs.get, principal.tenant, job_id, user_id=principal.user_id)
    if service.cached_view(principal.tenant) is None:
        job = await service.reads.run(get)  # opening the tenant's view may do I/O
    else:
        job = await service.read(get)
    return json_response(job_out(request, job))
