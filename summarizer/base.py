"""The summarizer contract: what goes in (a transcript), what comes out (a :class:`Summarization`).

A transcript is a list of chat-completions messages, Responses-API items (what
agent frameworks such as the OpenAI Agents SDK produce) or
:class:`~tiers.models.Message` objects. :func:`parse_transcript` (in
:mod:`summarizer.formats`, which lists the formats) is the one place that
validates it, so every summarizer, the library and the HTTP service reject bad
input the same way, with an error naming the exact item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field

from summarizer.formats import parse_transcript
from tiers.models import FactCandidate, Message, SessionSummary, SummaryUsage

__all__ = ["Summarization", "Summarizer", "parse_transcript"]


class Summarization(BaseModel):
    """The result of summarizing one session.

    Attributes:
        summary: The structured session summary, ready for the session tier.
        facts: User facts/preferences proposed for the user tier (not stored).
        usage: Tokens and cost of the model calls, ``None`` for summarizers
            that call no model.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    summary: SessionSummary
    facts: list[FactCandidate] = Field(default_factory=list)
    usage: SummaryUsage | None = None


@runtime_checkable
class Summarizer(Protocol):
    """Turns a finished session's transcript into a :class:`Summarization`.

    Implementations must be safe to call from several threads at once.
    """

    name: str
    """Short identifier of the implementation and model, for provenance."""

    def summarize(
        self,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        user_id: str,
        session_id: str,
        created_at: datetime | None = None,
    ) -> Summarization:
        """Summarize one session.

        Args:
            transcript: The session's messages, oldest first, in any format
                :func:`parse_transcript` accepts, or :class:`Message` objects.
            user_id: Owner of the session (a valid id, see :mod:`tiers.ids`).
            session_id: The session (a valid id).
            created_at: Timestamp of the summary; defaults to now (UTC).

        Returns:
            The summary and any fact candidates.

        Raises:
            InvalidTranscriptError: The transcript is empty or malformed.
            tiers.errors.InvalidInputError: ``user_id`` or ``session_id`` is not a valid id.
            SummaryGenerationError: A model-backed summarizer failed.
        """
        ...
