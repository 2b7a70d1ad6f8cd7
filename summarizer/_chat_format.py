"""Chat Completions messages (``role``, ``content``, ``tool_calls``) read as messages."""

from __future__ import annotations

from collections.abc import Mapping

from summarizer._transcript_parts import (
    CHAT_ROLES,
    _attachments,
    _content,
    _fail,
    _Item,
    _message,
    _type_name,
)
from tiers.models import MAX_TOOL_CALLS, Message, ToolCall


def _chat_message(item: _Item) -> Message:
    if "role" not in item.data:
        raise _fail(item.at("role"), "is missing: every message needs a role")
    raw_role = item.data["role"]
    role = CHAT_ROLES.get(raw_role) if isinstance(raw_role, str) else None
    if role is None:
        raise _fail(
            item.at("role"),
            f"is invalid ({raw_role!r:.80}): use one of " + ", ".join(CHAT_ROLES),
        )
    calls = _chat_tool_calls(item)
    if calls and role != "assistant":
        raise _fail(item.at("tool_calls"), f"only an assistant message calls tools, not {raw_role}")
    if "content" not in item.data and not calls:
        raise _fail(item.at("content"), "is missing: use a string, a list of content parts or null")
    text, attachments = _content(item.get("content"), item.at("content"))
    refusal = item.text("refusal")  # chat completions puts a refusal beside a null content
    if refusal and refusal not in text:
        text = f"{text}\n{refusal}" if text else refusal
    if isinstance(item.get("audio"), Mapping):
        attachments.append("audio")
    attachments.extend(_attachments(item))
    item_type = item.name("item_type")
    # Imported here, not at the top: the Responses readers read a message item with this
    # function, so importing their table at module level would be an import cycle.
    from summarizer._responses_format import ITEM_TYPES

    if item_type is not None and (item_type not in ITEM_TYPES or item_type == "message"):
        raise _fail(item.at("item_type"), f"is not a known item type ({item_type!r:.40})")
    return _message(
        item.where,
        role=role,
        content=text,
        name=item.name("name"),
        tool_calls=tuple(calls),
        tool_call_id=item.name("tool_call_id"),
        item_type=item_type,
        attachments=tuple(attachments),
    )


def _chat_tool_calls(item: _Item) -> list[ToolCall]:
    calls = [
        _chat_tool_call(entry, f"{item.at('tool_calls')}[{index}]")
        for index, entry in enumerate(item.items("tool_calls"))
    ]
    legacy = item.mapping("function_call")
    if legacy is not None:
        fn = _Item(legacy, item.at("function_call"))
        calls.append(ToolCall(name=fn.required_name("name"), arguments=fn.json("arguments")))
    if len(calls) > MAX_TOOL_CALLS:
        raise _fail(item.at("tool_calls"), f"has {len(calls)} calls, at most {MAX_TOOL_CALLS}")
    return calls


def _chat_tool_call(entry: object, where: str) -> ToolCall:
    if not isinstance(entry, Mapping):
        raise _fail(where, f"must be a tool call object, got {_type_name(entry)}")
    call = _Item(entry, where)
    kind = entry.get("type")
    call_id = call.name("id")
    if kind == "custom":
        custom = _Item(call.mapping("custom", required=True) or {}, call.at("custom"))
        return ToolCall(
            id=call_id, name=custom.required_name("name"), arguments=custom.text("input")
        )
    if kind not in (None, "function"):
        raise _fail(
            call.at("type"), f"is not a known tool call type ({kind!r:.40}): use function or custom"
        )
    function = call.mapping("function")
    if function is not None:
        fn = _Item(function, call.at("function"))
        return ToolCall(id=call_id, name=fn.required_name("name"), arguments=fn.json("arguments"))
    if kind is None and "name" in entry:  # tiermem's own stored form
        return ToolCall(
            id=call_id, name=call.required_name("name"), arguments=call.json("arguments")
        )
    raise _fail(call.at("function"), "is missing: a tool call needs {'name', 'arguments'}")
