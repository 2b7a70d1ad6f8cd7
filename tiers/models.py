"""Records that cross the storage boundary.

Each is a pydantic model stored as JSON (``model_dump_json``) with a
``schema_version``, never pickled. Timestamps are timezone-aware UTC.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime
from enum import StrEnum
from typing import Annotated, Any, Literal

from pydantic import (
    AfterValidator,
    BaseModel,
    ConfigDict,
    Field,
    JsonValue,
    StringConstraints,
    field_validator,
)

from tiers.ids import MAX_EXTERNAL_ID, Id

SCHEMA_VERSION = 1

_SHA256_HEX = re.compile(r"[0-9a-f]{64}")

MAX_TEXT = 20_000
MAX_ITEMS = 200


def utcnow() -> datetime:
    """Current time, UTC, timezone-aware."""
    return datetime.now(UTC)


def _as_utc(value: datetime) -> datetime:
    if value.tzinfo is None:
        # Naive datetimes are taken as UTC rather than local time: servers disagree on local time.
        return value.replace(tzinfo=UTC)
    return value.astimezone(UTC)


UtcDatetime = Annotated[datetime, AfterValidator(_as_utc)]

# Prose is stripped; nothing else is: an output or fact value must read back exactly as written.
Text = Annotated[str, StringConstraints(strip_whitespace=True, max_length=MAX_TEXT)]
Item = Annotated[str, StringConstraints(strip_whitespace=True, min_length=1, max_length=MAX_TEXT)]


class Record(BaseModel):
    """Base of stored records: strict about unknown fields, immutable once built."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: int = SCHEMA_VERSION


class SummaryUsage(BaseModel):
    """What producing a summary cost (litellm's own token and price accounting).

    Attributes:
        model: The model that was called.
        prompt_tokens: Input tokens over every call made (retries included).
        completion_tokens: Output tokens over every call made.
        cost_usd: Price in US dollars, or ``None`` when litellm does not know
            the model's price (e.g. a self-hosted model).
        calls: How many completion calls were made.
    """

    model_config = ConfigDict(extra="forbid", frozen=True)

    model: Annotated[str, Field(max_length=256)]
    prompt_tokens: int = Field(default=0, ge=0)
    completion_tokens: int = Field(default=0, ge=0)
    cost_usd: float | None = Field(default=None, ge=0.0)
    calls: int = Field(default=1, ge=0)


class SessionSummary(Record):
    """The structured summary of one finished session of one user.

    ``usage`` is set when a model wrote the summary: what it cost. It is not
    part of the rendered text.
    """

    session_id: Id
    user_id: Id
    task_description: Text = ""
    decisions_made: list[Item] = Field(default_factory=list, max_length=MAX_ITEMS)
    work_completed: list[Item] = Field(default_factory=list, max_length=MAX_ITEMS)
    open_questions: list[Item] = Field(default_factory=list, max_length=MAX_ITEMS)
    next_recommended_steps: list[Item] = Field(default_factory=list, max_length=MAX_ITEMS)
    created_at: UtcDatetime = Field(default_factory=utcnow)
    usage: SummaryUsage | None = None

    def render(self) -> str:
        """Plain-text rendering used for embedding, keyword search and prompts."""
        lines = [f"Session {self.session_id} ({self.created_at:%Y-%m-%d %H:%M} UTC)"]
        if self.task_description:
            lines.append(f"Task: {self.task_description}")
        for title, items in (
            ("Decisions made", self.decisions_made),
            ("Work completed", self.work_completed),
            ("Open questions", self.open_questions),
            ("Next recommended steps", self.next_recommended_steps),
        ):
            if items:
                lines.append(f"{title}:")
                lines.extend(f"- {item}" for item in items)
        return "\n".join(lines)


class FactCandidate(BaseModel):
    """A user fact or preference proposed by a summarizer, not yet stored."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    key: Id
    value: JsonValue
    confidence: float = Field(default=0.5, ge=0.0, le=1.0)
    evidence: Text = ""


class UserFact(Record):
    """A standing fact or preference of a user, with its provenance.

    ``evidence`` is what the source based it on, e.g. the user's words in the
    session a summarizer found it in.
    """

    user_id: Id
    key: Id
    value: JsonValue
    source: Annotated[str, Field(max_length=256)] = "api"
    confidence: float = Field(default=1.0, ge=0.0, le=1.0)
    evidence: Text = ""
    updated_at: UtcDatetime = Field(default_factory=utcnow)


class RunStatus(StrEnum):
    """Lifecycle status of a task run."""

    RUNNING = "running"
    PAUSED = "paused"
    COMPLETED = "completed"
    FAILED = "failed"
    CANCELLED = "cancelled"
    RESUMABLE = "resumable"

    @property
    def finished(self) -> bool:
        """True for terminal statuses: no more checkpoints may be appended."""
        return self in (RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED)


class CheckpointStatus(StrEnum):
    """Status of one checkpoint."""

    COMMITTED = "committed"
    FAILED = "failed"


class Checkpoint(Record):
    """One append-only step record of a run. Never changed once committed."""

    checkpoint_id: str
    run_id: Id
    seq: int = Field(ge=1)
    parent_id: str | None
    step: Annotated[str, Field(min_length=1, max_length=256)]
    input_hash: str
    output: JsonValue = None
    idempotency_key: Annotated[str, Field(min_length=1, max_length=512)]
    status: CheckpointStatus = CheckpointStatus.COMMITTED
    scope: dict[str, Any] | None = None
    started_at: UtcDatetime
    created_at: UtcDatetime = Field(default_factory=utcnow)
    # What made the checkpoint: "step", "effect" (a top-level effect), "update"
    # (a human edit of the state, see TaskTier.update_state), "compensation", "fork".
    kind: Annotated[str, Field(min_length=1, max_length=32)] = "step"
    # Keys this checkpoint set in the run's state (a shallow merge); only the change is stored.
    state_delta: dict[str, JsonValue] | None = None
    # Seq of the event (tiers.task._records.Event) that committed this checkpoint.
    event_seq: int | None = Field(default=None, ge=1)

    @field_validator("input_hash")
    @classmethod
    def _hex_digest(cls, value: str) -> str:
        if _SHA256_HEX.fullmatch(value) is None:
            raise ValueError("input_hash must be a lowercase hex SHA-256 digest")
        return value


class PendingApproval(Record):
    """The approval gate a paused run waits at (see ``RunHandle.await_approval``)."""

    key: Annotated[str, Field(min_length=1, max_length=512)]
    plan_hash: str
    requested_at: UtcDatetime


class RunInfo(Record):
    """The head record of a run: who owns it, where it is, what state it is in."""

    run_id: Id
    user_id: Id
    status: RunStatus = RunStatus.RUNNING
    head_seq: int = Field(default=0, ge=0)
    head_checkpoint_id: str | None = None
    lease_epoch: int = Field(default=0, ge=0)
    error: Annotated[str, Field(max_length=MAX_TEXT)] | None = None
    result: JsonValue = None
    created_at: UtcDatetime = Field(default_factory=utcnow)
    updated_at: UtcDatetime = Field(default_factory=utcnow)
    last_checkpoint_at: UtcDatetime | None = None
    # Seq of the run's last event; events are gap-free 1..event_seq.
    event_seq: int = Field(default=0, ge=0)
    # Event seq of the latest state snapshot (0: none yet).
    snapshot_event_seq: int = Field(default=0, ge=0)
    # Events up to this seq were compacted away (their effect is in a snapshot).
    compacted_through: int = Field(default=0, ge=0)
    # The lease: who holds it and until when (None: no expiry, a takeover needs no wait).
    lease_owner: Annotated[str, Field(max_length=256)] | None = None
    lease_expires_at: UtcDatetime | None = None
    lease_ttl_s: float | None = Field(default=None, gt=0)
    # A run forked from another keeps a link to where it came from.
    parent_run_id: Id | None = None
    parent_checkpoint_id: str | None = None
    # The approval gate the run waits at, while status is paused.
    pending_approval: PendingApproval | None = None
    # Token / cost budgets (None: unlimited) and what was spent, debited atomically.
    budget_tokens: int | None = Field(default=None, ge=0)
    budget_cost: float | None = Field(default=None, ge=0)
    spent_tokens: int = Field(default=0, ge=0)
    spent_cost: float = Field(default=0.0, ge=0)
    # Checkpoint seq ranges [first, last] left behind by update_state (another branch).
    superseded: list[tuple[int, int]] = Field(default_factory=list)
    finished_at: UtcDatetime | None = None
    # Keys of effects found invoked but never recorded, with no way to settle them
    # automatically: the run is blocked on them until they are reconciled or an
    # operator resolves them (TaskTier.resolve_effect). Set and cleared in the same
    # commit as the effect ledger change (EffectOutcomeUnknown / EffectRecorded /
    # EffectNotDone / a new EffectInvoked).
    unknown_effects: list[str] = Field(default_factory=list)
    # The id the run has in another system (an Agents SDK session id, a LangGraph
    # thread id), when run_id was derived from it with tiers.ids.run_id_for.
    external_id: Annotated[str, Field(min_length=1, max_length=MAX_EXTERNAL_ID)] | None = None
    # Random token of this run's creation. A run deleted and started again under the
    # same id gets another one (its lease epochs restart at 1), so a handle of the
    # deleted run is refused instead of writing into the new one. None: stored before.
    incarnation: Annotated[str, Field(min_length=1, max_length=64)] | None = None

    @property
    def blocked(self) -> bool:
        """Whether the run waits for a decision on an effect of unknown outcome (``unknown_effects``)."""
        return bool(self.unknown_effects)

    def lease_live(self, now: datetime) -> bool:
        """Whether a worker holds an unexpired lease at ``now`` (only leases with a TTL expire).

        Finished runs hold no lease, except one taken to compensate a cancelled
        or failed run (``TaskTier.acquire(..., for_compensation=True)``).
        """
        return (
            self.lease_owner is not None
            and self.lease_expires_at is not None
            and self.lease_expires_at > now
        )

    def in_lineage(self, seq: int) -> bool:
        """Whether checkpoint ``seq`` is on the run's current branch (not superseded)."""
        return 1 <= seq <= self.head_seq and not any(a <= seq <= b for a, b in self.superseded)


MAX_MESSAGE_TEXT = 200_000
"""Characters of one message's content, or of one tool call's arguments."""
MAX_MESSAGE_NAME = 256
"""Characters of a message's name, a tool's name, a call id or an attachment label."""
MAX_TOOL_CALLS = 128
"""Tool calls of one message; also the most attachments one message may have."""


class ToolCall(BaseModel):
    """One tool call an assistant turn made.

    Attributes:
        id: The call's id (chat ``tool_calls[].id``, Responses ``call_id``),
            which the tool result's :attr:`Message.tool_call_id` repeats;
            ``None`` when the format had none (a legacy ``function_call``).
        name: The tool: a function's name (``namespace.name`` when namespaced),
            ``server.tool`` for an MCP call, or the built-in tool
            (``web_search``, ``file_search``, ``computer``, ``shell``...).
        arguments: What it was called with, as the model wrote it (usually
            JSON text; the code of a code-interpreter call).
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    id: Annotated[str, Field(min_length=1, max_length=MAX_MESSAGE_NAME)] | None = None
    name: Annotated[str, Field(min_length=1, max_length=MAX_MESSAGE_NAME)]
    arguments: Annotated[str, Field(max_length=MAX_MESSAGE_TEXT)] = ""


class Message(BaseModel):
    """One transcript message, in an OpenAI-chat-like form every accepted format is read into.

    ``role`` and ``content`` are all a plain message has; the other fields
    default to empty and are left out of the stored JSON when empty, so
    transcripts stored before they existed read back unchanged (and a plain
    transcript encodes to the same bytes as before).

    Attributes:
        role: ``system``, ``user``, ``assistant`` or ``tool``.
        content: The text (content parts joined by newlines; ``""`` for a turn
            that only called tools).
        name: The speaker's or tool's name, if given.
        tool_calls: Tools an assistant turn called, in order.
        tool_call_id: On a tool result: the id of the call it answers.
        item_type: The Responses-API item type it was read from when that is
            not a plain message (``function_call``, ``function_call_output``,
            ``reasoning``, ``web_search_call``, ``mcp_call``...); ``None`` for
            chat messages and ``message`` items.
        attachments: Non-text parts that were there but are not stored
            (``image``, ``audio``, ``file``, ``file:report.pdf``): noted, so
            nothing disappears silently.
    """

    model_config = ConfigDict(extra="ignore", frozen=True)

    role: Literal["system", "user", "assistant", "tool"]
    content: Annotated[str, Field(max_length=MAX_MESSAGE_TEXT)]
    name: Annotated[str, Field(max_length=MAX_MESSAGE_NAME)] | None = None
    tool_calls: tuple[ToolCall, ...] = Field(default=(), max_length=MAX_TOOL_CALLS)
    tool_call_id: Annotated[str, Field(min_length=1, max_length=MAX_MESSAGE_NAME)] | None = None
    item_type: Annotated[str, Field(pattern=r"^[a-z][a-z0-9_]{0,63}$")] | None = None
    attachments: tuple[Annotated[str, Field(min_length=1, max_length=MAX_MESSAGE_NAME)], ...] = (
        Field(default=(), max_length=MAX_TOOL_CALLS)
    )

    @property
    def plain(self) -> bool:
        """Whether this is a plain ``{"role", "content"[, "name"]}`` message (no tool or item data)."""
        return not (self.tool_calls or self.tool_call_id or self.item_type or self.attachments)
