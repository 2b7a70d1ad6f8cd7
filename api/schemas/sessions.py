"""Request and response bodies of the session routes and their background jobs."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import Field, model_validator

from api.schemas.common import NON_BLANK, Id, RequestModel, ResponseModel, UtcDatetime
from api.schemas.problems import Problem
from tiers.models import MAX_ITEMS, MAX_TEXT
from tiers.session import MAX_TOP_K

MAX_MESSAGES = 5000

Text = Annotated[str, Field(max_length=MAX_TEXT)]
Item = Annotated[str, Field(min_length=1, max_length=MAX_TEXT, pattern=NON_BLANK)]
Items = Annotated[list[Item], Field(max_length=MAX_ITEMS)]


class SummaryIn(RequestModel):
    """A structured summary written by the caller."""

    task_description: Text = ""
    decisions_made: Items = Field(default_factory=list)
    work_completed: Items = Field(default_factory=list)
    open_questions: Items = Field(default_factory=list)
    next_recommended_steps: Items = Field(default_factory=list)


class MessageIn(RequestModel):
    """One OpenAI-style transcript message."""

    role: Literal["system", "user", "assistant", "tool"]
    content: Annotated[str, Field(max_length=200_000)]
    name: Annotated[str, Field(max_length=256)] | None = None


class SessionCreate(RequestModel):
    """A finished session: give exactly one of ``summary`` and ``transcript``.

    A summary is stored as given (201). A transcript is summarized first: in the
    background by default (202 with a job to poll), or before answering with
    ``?wait=true`` (201).
    """

    session_id: Id
    summary: SummaryIn | None = None
    transcript: Annotated[list[MessageIn], Field(min_length=1, max_length=MAX_MESSAGES)] | None = (
        None
    )
    created_at: UtcDatetime | None = Field(
        default=None, description="When the session ended; default now."
    )

    @model_validator(mode="after")
    def _exactly_one(self) -> SessionCreate:
        if (self.summary is None) == (self.transcript is None):
            raise ValueError("give exactly one of 'summary' and 'transcript'")
        return self


class UsageOut(ResponseModel):
    """What a model-written summary cost (litellm's accounting)."""

    model: str
    prompt_tokens: int
    completion_tokens: int
    cost_usd: float | None = Field(description="US dollars; null when the price is unknown.")
    calls: int


class SessionOut(ResponseModel):
    """A stored session summary."""

    session_id: str
    user_id: str
    task_description: str
    decisions_made: list[str]
    work_completed: list[str]
    open_questions: list[str]
    next_recommended_steps: list[str]
    created_at: datetime
    usage: UsageOut | None = Field(
        default=None, description="Tokens and cost, when a model wrote the summary."
    )


class PendingSessions(ResponseModel):
    """Sessions whose transcript is stored but not summarized (summarizing failed or is queued)."""

    session_ids: list[str]


class SessionList(ResponseModel):
    """Session summaries, newest first."""

    sessions: list[SessionOut]


class RecallRequest(RequestModel):
    """What to look for among a user's earlier sessions."""

    query: Annotated[str, Field(min_length=1, max_length=MAX_TEXT, pattern=NON_BLANK)]
    top_k: Annotated[int, Field(ge=1, le=MAX_TOP_K)] = 5


class RecalledOut(ResponseModel):
    """One recalled session and its cosine similarity to the query."""

    session: SessionOut
    score: Annotated[float, Field(ge=-1.0, le=1.0)]


class RecallResponse(ResponseModel):
    """Recalled sessions, best first."""

    results: list[RecalledOut]


class JobStatus(StrEnum):
    """Where a background summarization is."""

    PENDING = "pending"
    RUNNING = "running"
    SUCCEEDED = "succeeded"
    FAILED = "failed"


class JobOut(ResponseModel):
    """A background summarization of a posted transcript."""

    job_id: str
    status: JobStatus
    user_id: str
    session_id: str
    status_url: str = Field(description="Where to poll this job.")
    session_url: str = Field(description="Where the session will be once the job succeeded.")
    created_at: datetime
    finished_at: datetime | None = None
    session: SessionOut | None = Field(
        default=None, description="The saved summary, once succeeded."
    )
    error: Problem | None = Field(default=None, description="Why it failed, once failed.")
