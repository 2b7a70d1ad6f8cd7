"""Transcripts in the formats agent frameworks produce, read into :class:`~tiers.models.Message`.

:func:`parse_transcript` is the one reader: the library (``Memory.end_session``,
``save_transcript``), the HTTP service and every summarizer go through it, so
they accept and refuse exactly the same transcripts. Items of a transcript may
be in any of these forms, mixed:

**Chat Completions messages** ``{"role", "content", ...}``: roles ``system``,
``developer`` (read as system), ``user``, ``assistant``, ``tool`` and the
legacy ``function`` (read as tool). ``content`` is a string, ``null`` or a list
of content parts. Text parts (``text``, ``input_text``, ``output_text``,
``refusal``) are joined by newlines; image, audio and file parts are not text
and are noted in :attr:`~tiers.models.Message.attachments` (``image``,
``audio``, ``file:<name>``) instead of their data. An assistant's
``tool_calls`` (``function`` and ``custom`` calls), its legacy
``function_call`` and ``refusal`` are kept; a tool result keeps its
``tool_call_id`` and ``name``.

**Responses API items** (what the OpenAI Agents SDK's ``to_input_list()``
gives): ``message`` items, with or without ``"type": "message"``;
``function_call`` / ``custom_tool_call`` become an assistant turn with one
:class:`~tiers.models.ToolCall` and their ``*_output`` items a ``tool`` message
answering it by ``call_id``. Built-in tools (``web_search_call``,
``file_search_call``, ``computer_call``, ``code_interpreter_call``,
``image_generation_call``, ``local_shell_call``, ``shell_call``,
``apply_patch_call``, ``tool_search_call``, ``program``, ``mcp_call``) are
tool calls of that tool, their outputs tool messages; an item that carries
its own result (``mcp_call``, ``file_search_call``, ``code_interpreter_call``,
``image_generation_call``) gives two messages, the call and its result.
``reasoning`` items keep their summary (and any plain reasoning text) as an
assistant message of item type ``reasoning``: stored with the transcript, but
no summarizer summarizes it (it is the model thinking, not the session).
Bookkeeping items (``item_reference``, ``compaction``, ``compaction_trigger``,
``configuration_update``, ``additional_tools``, ``mcp_list_tools``) are kept
as compact notes; MCP approval requests and responses as short notes too.
Encrypted content is never stored (noted as the attachment ``encrypted``).
Ids, statuses, annotations and other metadata are not kept.

**tiermem's own form**: what :meth:`~tiers.models.Message.model_dump` gives,
so a transcript read back (``get_transcript``) can be saved again unchanged.

Anything else is refused with :class:`~summarizer.errors.InvalidTranscriptError`
whose ``field`` names the item: an unknown role (``transcript[3].role``), item
type (``transcript[3].type``), content part type
(``transcript[3].content[1].type``) or tool call type, a missing or
mistyped field, or text over a size limit (``transcript[3].content``,
``transcript[3].arguments``).

What is read is private: the parts every item shares (text and content
parts) in :mod:`summarizer._transcript_parts`, Chat Completions messages in
:mod:`summarizer._chat_format`, Responses items in
:mod:`summarizer._responses_format`. The reader and the rendering are here.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from summarizer._chat_format import _chat_message
from summarizer._responses_format import ITEM_READERS, ITEM_TYPES, SILENT_ITEM_TYPES
from summarizer._transcript_parts import CHAT_ROLES, CONTENT_PART_TYPES, _fail, _Item, _type_name
from summarizer.errors import InvalidTranscriptError
from tiers.models import Message, ToolCall

__all__ = [
    "CHAT_ROLES",
    "CONTENT_PART_TYPES",
    "ITEM_TYPES",
    "SILENT_ITEM_TYPES",
    "ToolUse",
    "parse_transcript",
    "render_lines",
    "render_tool_use",
    "tool_uses",
]


def parse_transcript(raw: object) -> list[Message]:
    """Validate a transcript in any accepted format into :class:`~tiers.models.Message` objects.

    See the module docstring for the formats. Messages come out in order;
    an item that carries a tool call and its result gives two.

    Args:
        raw: A list (or other non-string sequence) of mappings or Messages.

    Returns:
        The messages, in order.

    Raises:
        InvalidTranscriptError: ``raw`` is not a non-empty sequence of valid
            items; ``field`` names the first bad one, e.g. ``transcript[3].type``.
    """
    if isinstance(raw, str | bytes | bytearray | Mapping) or not isinstance(raw, Sequence):
        raise InvalidTranscriptError(
            f"transcript must be a list of messages or Responses items, got {_type_name(raw)}",
            field="transcript",
        )
    if not raw:
        raise InvalidTranscriptError(
            "transcript is empty: pass at least one message", field="transcript"
        )
    out: list[Message] = []
    for index, item in enumerate(raw):
        out.extend(_parse_item(item, f"transcript[{index}]"))
    return out


def _parse_item(item: object, where: str) -> list[Message]:
    if isinstance(item, Message):
        return [item]
    if not isinstance(item, Mapping):
        hint = (
            " (dump SDK objects first: item.model_dump(exclude_unset=True))"
            if hasattr(item, "model_dump")
            else ""
        )
        raise _fail(where, f"must be a message or item object, got {_type_name(item)}{hint}")
    kind = item.get("type")
    if kind is None and "role" not in item and "id" in item and "content" not in item:
        kind = "item_reference"  # the Responses API lets an item reference leave out its type
    if kind is None:
        return [_chat_message(_Item(item, where))]
    reader = ITEM_READERS.get(kind) if isinstance(kind, str) else None
    if reader is None:
        raise _fail(
            f"{where}.type",
            f"is not a known item type ({kind!r:.40}): use a chat message (no type) or one of "
            + ", ".join(ITEM_TYPES),
        )
    return reader(_Item({**item, "type": kind}, where))


# --------------------------------------------------------------------------- rendering


@dataclass(frozen=True, slots=True)
class ToolUse:
    """A tool call and the result that answered it, as a summarizer sees them.

    Attributes:
        message: Index of the message holding the call (or, for a result
            whose call is not in the transcript, the result).
        call: The call; ``None`` for a result whose call is not in the transcript.
        result: The result's text (attachments as ``[image]``), ``None`` if no
            result answered the call.
        result_message: Index of the result message, if any.
    """

    message: int
    call: ToolCall | None
    result: str | None
    result_message: int | None


def _text_of(message: Message) -> str:
    """The message's text with its attachments noted as ``[image]``, ``[file:a.pdf]``..."""
    parts = [message.content.strip(), *(f"[{label}]" for label in message.attachments)]
    return " ".join(part for part in parts if part)


def tool_uses(messages: Sequence[Message]) -> list[ToolUse]:
    """Every tool call with its result (matched by call id), in transcript order.

    A tool result whose call is not in the transcript is a use of its own;
    plain ``tool`` messages (no call id, no item type) are not tool uses, so
    transcripts without tool data read as before.
    """
    waiting: dict[str, list[int]] = {}
    for index, message in enumerate(messages):
        if message.role == "tool" and message.tool_call_id is not None:
            waiting.setdefault(message.tool_call_id, []).append(index)
    answered: set[int] = set()
    uses: list[ToolUse] = []
    for index, message in enumerate(messages):
        if message.item_type in SILENT_ITEM_TYPES:
            continue
        for call in message.tool_calls:
            later = [i for i in waiting.get(call.id or "", []) if i > index and i not in answered]
            if call.id is not None and later:
                answered.add(later[0])
                uses.append(ToolUse(index, call, _text_of(messages[later[0]]), later[0]))
            else:
                uses.append(ToolUse(index, call, None, None))
        if message.role == "tool" and not message.plain and index not in answered:
            uses.append(ToolUse(index, None, _text_of(message), index))
    return sorted(uses, key=lambda use: use.message)


def _clip(text: str, limit: int | None) -> str:
    text = " ".join(text.split())
    if limit is None or len(text) <= limit:
        return text
    return text[: max(limit - 1, 0)].rstrip() + "…"


def render_tool_use(
    use: ToolUse,
    *,
    max_arguments: int | None = None,
    max_result: int | None = None,
) -> str:
    """``called tool NAME(ARGUMENTS) -> RESULT`` (or ``tool NAME returned RESULT`` without a call).

    Whitespace is collapsed; the optional limits clip arguments and result.
    """
    result = _clip(use.result, max_result) if use.result else None
    if use.call is None:
        return f"tool returned {result or '(nothing)'}"
    line = f"called tool {use.call.name}({_clip(use.call.arguments, max_arguments)})"
    return f"{line} -> {result}" if result else line


def render_lines(messages: Sequence[Message]) -> list[str]:
    """The transcript as ``who: text`` lines for a model to read, tool calls and results paired.

    A plain message renders as ``role: text`` (``role (name): text`` with a
    name), an empty one not at all. A tool call renders where it was made, as
    ``assistant called tool NAME(ARGUMENTS) -> RESULT``, with the result that
    answered it (which is then not repeated). Reasoning and bookkeeping items
    (:data:`SILENT_ITEM_TYPES`) are left out.
    """
    calls: dict[int, list[ToolUse]] = {}
    shown: set[int] = set()
    for use in tool_uses(messages):
        if use.call is not None:
            calls.setdefault(use.message, []).append(use)
            if use.result_message is not None:
                shown.add(use.result_message)
    lines: list[str] = []
    for index, message in enumerate(messages):
        if message.item_type in SILENT_ITEM_TYPES or index in shown:
            continue
        who = f"{message.role} ({message.name})" if message.name else message.role
        text = _text_of(message)
        if text:
            lines.append(f"{who}: {text}")
        lines.extend(f"{who} {render_tool_use(use)}" for use in calls.get(index, []))
    return lines
