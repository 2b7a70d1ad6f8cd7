"""Responses API items (messages, tool calls and their outputs, reasoning) read as messages."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence

from summarizer._chat_format import _chat_message
from summarizer._transcript_parts import (
    Role,
    _checked,
    _content,
    _fail,
    _Item,
    _json_text,
    _message,
    _type_name,
)
from tiers.models import MAX_MESSAGE_TEXT, Message, ToolCall

_Reader = Callable[[_Item], list[Message]]


def _call(item: _Item, tool: str, arguments: str, *, call_id: str | None) -> Message:
    return _message(
        item.where,
        role="assistant",
        content="",
        tool_calls=(ToolCall(id=call_id, name=tool, arguments=arguments),),
        item_type=item.data["type"],
    )


def _result(
    item: _Item,
    call_id: str | None,
    text: str,
    attachments: Sequence[str] = (),
    *,
    name: str | None = None,
    role: Role = "tool",
) -> Message:
    return _message(
        item.where,
        role=role,
        content=text,
        name=name,
        tool_call_id=call_id,
        item_type=item.data["type"],
        attachments=tuple(attachments),
    )


def _note(
    item: _Item, text: str, *, role: Role = "system", attachments: Sequence[str] = ()
) -> list[Message]:
    return [
        _message(
            item.where,
            role=role,
            content=text,
            item_type=item.data["type"],
            attachments=tuple(attachments),
        )
    ]


def _encrypted(item: _Item) -> list[str]:
    return ["encrypted"] if item.get("encrypted_content") else []


def _names(item: _Item, key: str) -> str:
    """Names of the tools listed under ``key`` (tool definitions or MCP tool listings)."""
    names = []
    for tool in item.items(key):
        if isinstance(tool, Mapping):
            label = tool.get("name") or tool.get("server_label") or tool.get("type")
            if isinstance(label, str) and label:
                names.append(label)
    return _checked(", ".join(names), item.at(key), MAX_MESSAGE_TEXT)


def _read_message_item(item: _Item) -> list[Message]:
    return [_chat_message(item)]


def _read_function_call(item: _Item) -> list[Message]:
    name = item.qualified(item.required_name("name"), "namespace")
    return [_call(item, name, item.json("arguments"), call_id=item.name("call_id"))]


def _read_custom_tool_call(item: _Item) -> list[Message]:
    name = item.qualified(item.required_name("name"), "namespace")
    return [_call(item, name, item.text("input"), call_id=item.name("call_id"))]


def _read_output(item: _Item) -> list[Message]:
    """``function_call_output`` and ``custom_tool_call_output``: a string or content parts."""
    if "output" not in item.data:
        raise _fail(item.at("output"), "is missing: the tool's result, a string or content parts")
    text, attachments = _content(item.get("output"), item.at("output"))
    return [_result(item, item.name("call_id"), text, attachments, name=item.name("name"))]


def _builtin_call(tool: str, *keys: str, id_key: str = "call_id") -> _Reader:
    """A built-in tool's call item: its arguments are the JSON of ``keys`` (one key: its value)."""

    def read(item: _Item) -> list[Message]:
        if len(keys) == 1:
            arguments = item.json(keys[0])
        else:
            present = {key: item.get(key) for key in keys if item.get(key) is not None}
            arguments = _json_text(present, item.where) if present else ""
        return [_call(item, tool, arguments, call_id=item.name(id_key))]

    return read


def _read_web_search(item: _Item) -> list[Message]:
    return [_call(item, "web_search", item.json("action"), call_id=item.name("id"))]


def _read_file_search(item: _Item) -> list[Message]:
    call_id = item.name("id")
    out = [_call(item, "file_search", item.json("queries"), call_id=call_id)]
    if item.get("results") is not None:
        lines = []
        for index, hit in enumerate(item.items("results")):
            if not isinstance(hit, Mapping):
                raise _fail(f"{item.at('results')}[{index}]", "must be an object")
            found = _Item(hit, f"{item.at('results')}[{index}]")
            lines.append(": ".join(p for p in (found.text("filename"), found.text("text")) if p))
        out.append(
            _result(item, call_id, _checked("\n".join(lines), item.at("results"), MAX_MESSAGE_TEXT))
        )
    return out


def _read_code_interpreter(item: _Item) -> list[Message]:
    call_id = item.name("id")
    out = [_call(item, "code_interpreter", item.text("code"), call_id=call_id)]
    if item.get("outputs") is not None:
        logs: list[str] = []
        images: list[str] = []
        for index, entry in enumerate(item.items("outputs")):
            where = f"{item.at('outputs')}[{index}]"
            kind = entry.get("type") if isinstance(entry, Mapping) else None
            if kind == "logs":
                logs.append(_checked(entry.get("logs"), f"{where}.logs", MAX_MESSAGE_TEXT))
            elif kind == "image":
                images.append("image")
            else:
                raise _fail(f"{where}.type", "is not a known output type: use logs or image")
        text = _checked("\n".join(logs), item.at("outputs"), MAX_MESSAGE_TEXT)
        out.append(_result(item, call_id, text, images))
    return out


def _read_image_generation(item: _Item) -> list[Message]:
    call_id = item.name("id")
    # The image itself (base64 in ``result``) is never stored: only that there was one.
    out = [_call(item, "image_generation", item.text("revised_prompt"), call_id=call_id)]
    if item.get("result"):
        out.append(_result(item, call_id, "", ["image"]))
    return out


def _read_mcp_call(item: _Item) -> list[Message]:
    call_id = item.name("id")
    name = item.qualified(item.required_name("name"), "server_label")
    out = [_call(item, name, item.json("arguments"), call_id=call_id)]
    error = item.get("error")
    if item.get("output") is not None or error is not None:
        text = item.text("output") or (
            f"error: {_json_text(error, item.at('error'))}" if error is not None else ""
        )
        out.append(_result(item, call_id, _checked(text, item.at("output"), MAX_MESSAGE_TEXT)))
    return out


def _read_mcp_approval_request(item: _Item) -> list[Message]:
    name = item.qualified(item.required_name("name"), "server_label")
    text = f"asks approval to call {name}({item.json('arguments')})"
    return _note(item, _checked(text, item.at("arguments"), MAX_MESSAGE_TEXT), role="assistant")


def _read_mcp_approval_response(item: _Item) -> list[Message]:
    approve = item.get("approve")
    if not isinstance(approve, bool):
        raise _fail(item.at("approve"), f"must be true or false, got {_type_name(approve)}")
    request = item.required_name("approval_request_id")
    reason = item.text("reason")
    text = f"{'approved' if approve else 'denied'} {request}" + (f": {reason}" if reason else "")
    return _note(item, _checked(text, item.at("reason"), MAX_MESSAGE_TEXT), role="user")


def _read_shell_output(item: _Item) -> list[Message]:
    texts: list[str] = []
    for index, entry in enumerate(item.items("output", required=True)):
        if not isinstance(entry, Mapping):
            raise _fail(f"{item.at('output')}[{index}]", "must be an object with stdout and stderr")
        part = _Item(entry, f"{item.at('output')}[{index}]")
        texts.extend(text for text in (part.text("stdout"), part.text("stderr")) if text)
    text = _checked("\n".join(texts), item.at("output"), MAX_MESSAGE_TEXT)
    return [_result(item, item.name("call_id"), text)]


def _read_computer_output(item: _Item) -> list[Message]:
    item.mapping("output", required=True)
    return [_result(item, item.name("call_id"), "", ["image"])]


def _read_text_output(id_key: str, key: str, *, fallback: str | None = None) -> _Reader:
    def read(item: _Item) -> list[Message]:
        text = item.text(key) or (item.text(fallback) if fallback else "")
        return [_result(item, item.name(id_key), text)]

    return read


def _read_reasoning(item: _Item) -> list[Message]:
    texts = []
    for key, part_type in (("summary", "summary_text"), ("content", "reasoning_text")):
        for index, part in enumerate(item.items(key)):
            where = f"{item.at(key)}[{index}]"
            if not isinstance(part, Mapping) or part.get("type", part_type) != part_type:
                raise _fail(f"{where}.type", f"is not a known {key} part: use {part_type}")
            texts.append(_checked(part.get("text"), f"{where}.text", MAX_MESSAGE_TEXT))
    text = _checked("\n".join(texts), item.at("summary"), MAX_MESSAGE_TEXT)
    return _note(item, text, role="assistant", attachments=_encrypted(item))


ITEM_READERS: Mapping[str, _Reader] = {
    "message": _read_message_item,
    "function_call": _read_function_call,
    "function_call_output": _read_output,
    "custom_tool_call": _read_custom_tool_call,
    "custom_tool_call_output": _read_output,
    "web_search_call": _read_web_search,
    "file_search_call": _read_file_search,
    "computer_call": _builtin_call("computer", "action", "actions"),
    "computer_call_output": _read_computer_output,
    "code_interpreter_call": _read_code_interpreter,
    "image_generation_call": _read_image_generation,
    "local_shell_call": _builtin_call("local_shell", "action"),
    "local_shell_call_output": _read_text_output("id", "output"),
    "shell_call": _builtin_call("shell", "action"),
    "shell_call_output": _read_shell_output,
    "apply_patch_call": _builtin_call("apply_patch", "operation"),
    "apply_patch_call_output": _read_text_output("call_id", "output", fallback="status"),
    "tool_search_call": _builtin_call("tool_search", "arguments"),
    "tool_search_output": lambda item: [_result(item, item.name("call_id"), _names(item, "tools"))],
    "program": _builtin_call("program", "code"),
    "program_output": _read_text_output("call_id", "result"),
    "mcp_call": _read_mcp_call,
    "mcp_list_tools": lambda item: _note(
        item, f"{item.name('server_label') or 'mcp'}: {_names(item, 'tools')}", role="tool"
    ),
    "mcp_approval_request": _read_mcp_approval_request,
    "mcp_approval_response": _read_mcp_approval_response,
    "reasoning": _read_reasoning,
    "item_reference": lambda item: _note(item, item.required_name("id")),
    "compaction": lambda item: _note(item, "", attachments=_encrypted(item)),
    "compaction_trigger": lambda item: _note(item, ""),
    "configuration_update": lambda item: _note(
        item,
        _json_text({k: v for k, v in item.data.items() if k in ("reasoning", "text")}, item.where),
    ),
    "additional_tools": lambda item: _note(item, _names(item, "tools")),
}

ITEM_TYPES: tuple[str, ...] = tuple(ITEM_READERS)
"""Responses-API item types accepted (the ``type`` of an item)."""

SILENT_ITEM_TYPES: frozenset[str] = frozenset(
    {
        "reasoning",
        "item_reference",
        "compaction",
        "compaction_trigger",
        "configuration_update",
        "additional_tools",
        "mcp_list_tools",
    }
)
"""Item types stored with the transcript but not shown to a summarizer: the
model's reasoning and bookkeeping, not what happened in the session."""
