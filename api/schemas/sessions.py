"""Request and response bodies of the session routes and their background jobs."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, JsonValue, SkipValidation, model_validator

from api.schemas.common import NON_BLANK, Id, RequestModel, ResponseModel, UtcDatetime
from api.schemas.problems import Problem
from summarizer.formats import CHAT_ROLES, CONTENT_PART_TYPES, ITEM_TYPES
from tiers.models import MAX_ITEMS, MAX_MESSAGE_NAME, MAX_MESSAGE_TEXT, MAX_TEXT
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


# The transcript item schemas below document the wire format only. Items are not validated
# by them but passed as sent to summarizer.parse_transcript, the one reader the library uses
# too, so the service and the library accept and refuse the same transcripts; a bad item is
# a 422 invalid-transcript problem whose ``field`` names it, e.g. ``transcript[3].type``.


class _ItemDoc(BaseModel):
    """Base of the documented transcript item shapes: other keys are allowed (and ignored)."""

    model_config = ConfigDict(extra="allow")


class ContentPartIn(_ItemDoc):
    """A content part. Text parts are kept; image, audio and file parts are noted, not stored."""

    type: str = Field(default="text", json_schema_extra={"enum": list(CONTENT_PART_TYPES)})
    text: str | None = Field(default=None, description="Of text, input_text, output_text parts.")
    refusal: str | None = Field(default=None, description="Of a refusal part.")


class FunctionIn(_ItemDoc):
    """The function a chat-completions tool call called."""

    name: Annotated[str, Field(min_length=1, max_length=MAX_MESSAGE_NAME)]
    arguments: str | dict[str, JsonValue] = Field(default="", description="JSON text (or object).")


class ToolCallIn(_ItemDoc):
    """One chat-completions tool call (``custom`` calls carry ``custom: {name, input}``)."""

    id: Annotated[str, Field(max_length=MAX_MESSAGE_NAME)] | None = None
    type: Literal["function", "custom"] = "function"
    function: FunctionIn | None = None


class MessageIn(_ItemDoc):
    """A chat-completions message, or a Responses-API message item (``"type": "message"``)."""

    type: Literal["message"] | None = None
    role: Annotated[str, Field(json_schema_extra={"enum": list(CHAT_ROLES)})]
    content: Annotated[str, Field(max_length=MAX_MESSAGE_TEXT)] | list[ContentPartIn] | None = (
        Field(
            description="Text, content parts, or null (an assistant turn that only called tools)."
        )
    )
    name: Annotated[str, Field(max_length=MAX_MESSAGE_NAME)] | None = None
    tool_calls: list[ToolCallIn] | None = Field(default=None, description="Of an assistant turn.")
    tool_call_id: str | None = Field(default=None, description="Of a tool result.")


class FunctionCallIn(_ItemDoc):
    """A Responses-API function call (also ``custom_tool_call`` with ``input``)."""

    type: Literal["function_call"]
    call_id: str | None = None
    name: Annotated[str, Field(min_length=1, max_length=MAX_MESSAGE_NAME)]
    arguments: Annotated[str, Field(max_length=MAX_MESSAGE_TEXT)] = ""


class FunctionCallOutputIn(_ItemDoc):
    """A Responses-API function call's result (also ``custom_tool_call_output``)."""

    type: Literal["function_call_output"]
    call_id: str | None = None
    output: Annotated[str, Field(max_length=MAX_MESSAGE_TEXT)] | list[ContentPartIn]


class ReasoningIn(_ItemDoc):
    """A reasoning item: its summary text is stored, but not summarized."""

    type: Literal["reasoning"]
    summary: list[dict[str, JsonValue]] = Field(
        default_factory=list, description='[{"type": "summary_text", "text": ...}]'
    )


class ResponseItemIn(_ItemDoc):
    """Any other Responses-API item type (built-in tool calls and outputs, MCP, references)."""

    type: Annotated[
        str,
        Field(
            json_schema_extra={
                "enum": [
                    t
                    for t in ITEM_TYPES
                    if t not in ("message", "function_call", "function_call_output", "reasoning")
                ]
            }
        ),
    ]


TranscriptItemIn = Annotated[
    MessageIn | FunctionCallIn | FunctionCallOutputIn | ReasoningIn | ResponseItemIn,
    SkipValidation,
]
"""One transcript item as documented; validated by ``summarizer.parse_transcript``, not here."""


class SessionCreate(RequestModel):
    """A finished session: give exactly one of ``summary`` and ``transcript``.

    A summary is stored as given (201). A transcript is summarized first: in the
    background by default (202 with a job to poll), or before answering with
    ``?wait=true`` (201). Its items are not validated here (see
    :data:`TranscriptItemIn`): they reach the route as the JSON sent.
    """

    session_id: Id
    summary: SummaryIn | None = None
    transcript: (
        Annotated[
            list[TranscriptItemIn],
            Field(
                # At least one item, but the parser says so: the library's error, not pydantic's.
                json_schema_extra={"minItems": 1},
                max_length=MAX_MESSAGES,
                description="Chat-completions messages and/or Responses-API items (what the "
                "OpenAI Agents SDK's to_input_list() gives), oldest first. Items are read by the "
                "library's own parser: a bad one is a 422 whose 'field' names it.",
            ),
        ]
        | None
    ) = None
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
    now: UtcDatetime | None = Field(
        default=None,
        description=(
            "When the query is asked, for the times it names relative to it ('last March', "
            "'two weeks ago'); default: the server's current time."
        ),
    )


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
    attempts: int = Field(
        default=0, description="Attempts started so far (a failed or interrupted one is retried)."
    )
    max_attempts: int = Field(default=1, description="Attempts at most; then it fails for good.")
    session: SessionOut | None = Field(
        default=None, description="The saved summary, once succeeded (as stored now)."
    )
    error: Problem | None = Field(
        default=None,
        description="Why the last attempt failed: kept while it is retried, final once failed.",
    )
