"""The summarizer contract: what goes in (a transcript), what comes out (a :class:`Summarization`).

A transcript is an OpenAI-style list of ``{"role", "content"}`` messages (or
:class:`~tiers.models.Message` objects). :func:`parse_transcript` is the one
place that validates it, so every summarizer rejects bad input the same way,
with an error naming the exact item.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any, Protocol, runtime_checkable

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from summarizer.errors import InvalidTranscriptError
from tiers.models import FactCandidate, Message, SessionSummary, SummaryUsage

# Roles of other chat APIs folded into the four a Message knows.
_ROLE_ALIASES = {"developer": "system", "function": "tool"}


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
            transcript: The session's messages, oldest first, as
                ``{"role", "content"}`` mappings or :class:`Message` objects.
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


def parse_transcript(raw: object) -> list[Message]:
    """Validate an OpenAI-style transcript into :class:`Message` objects.

    Content may be a string, ``None`` (an assistant turn that only called
    tools; read as ``""``) or a list of content parts, whose ``"text"`` parts
    are joined with newlines and other parts (images, audio) skipped. The
    roles ``developer`` and ``function`` of other chat APIs are read as
    ``system`` and ``tool``. Keys other than role, content and name are ignored.

    Args:
        raw: A list (or other non-string sequence) of mappings or Messages.

    Returns:
        The messages, in order.

    Raises:
        InvalidTranscriptError: ``raw`` is not a non-empty sequence of valid
            messages; ``field`` names the first bad item, e.g. ``transcript[3].role``.
    """
    if isinstance(raw, str | bytes | bytearray | Mapping) or not isinstance(raw, Sequence):
        raise InvalidTranscriptError(
            f"transcript must be a list of {{'role', 'content'}} messages, got {type(raw).__name__}",
            field="transcript",
        )
    if not raw:
        raise InvalidTranscriptError(
            "transcript is empty: pass at least one message", field="transcript"
        )
    return [_parse_message(item, f"transcript[{index}]") for index, item in enumerate(raw)]


def _parse_message(item: object, where: str) -> Message:
    if isinstance(item, Message):
        return item
    if not isinstance(item, Mapping):
        raise InvalidTranscriptError(
            f"{where} must be a mapping with 'role' and 'content', got {type(item).__name__}",
            field=where,
        )
    if "role" not in item:
        raise InvalidTranscriptError(
            f"{where}.role is missing: every message needs a role", field=f"{where}.role"
        )
    role = item["role"]
    if isinstance(role, str):
        role = _ROLE_ALIASES.get(role, role)
    data: dict[str, Any] = {"role": role, "content": _content_text(item, where)}
    if item.get("name") is not None:
        data["name"] = item["name"]
    try:
        return Message.model_validate(data)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = ".".join(str(part) for part in error["loc"])
        field = f"{where}.{loc}" if loc else where
        hint = (
            ": use one of system, user, assistant, tool" if loc == "role" else f": {error['msg']}"
        )
        raise InvalidTranscriptError(
            f"{field} is invalid ({error['input']!r:.80}){hint}", field=field
        ) from exc


def _content_text(item: Mapping[str, Any], where: str) -> str:
    if "content" not in item:
        raise InvalidTranscriptError(
            f"{where}.content is missing: use a string, a list of content parts or null",
            field=f"{where}.content",
        )
    content = item["content"]
    if content is None:
        return ""
    if isinstance(content, str):
        return content
    if isinstance(content, Sequence) and not isinstance(content, bytes | bytearray):
        texts: list[str] = []
        for index, part in enumerate(content):
            part_where = f"{where}.content[{index}]"
            if isinstance(part, str):
                texts.append(part)
            elif isinstance(part, Mapping):
                if part.get("type", "text") != "text":
                    continue  # images, audio, files: nothing to summarize as text
                text = part.get("text")
                if not isinstance(text, str):
                    raise InvalidTranscriptError(
                        f"{part_where}.text must be a string, got {type(text).__name__}",
                        field=f"{part_where}.text",
                    )
                texts.append(text)
            else:
                raise InvalidTranscriptError(
                    f"{part_where} must be a content part like {{'type': 'text', 'text': ...}}, "
                    f"got {type(part).__name__}",
                    field=part_where,
                )
        return "\n".join(texts)
    raise InvalidTranscriptError(
        f"{where}.content must be a string or a list of content parts, got {type(content).__name__}",
        field=f"{where}.content",
    )
