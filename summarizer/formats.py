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
"""

from __future__ import annotations

import json
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Literal

from pydantic import ValidationError

from summarizer.errors import InvalidTranscriptError
from tiers.models import (
    MAX_MESSAGE_NAME,
    MAX_MESSAGE_TEXT,
    MAX_TOOL_CALLS,
    Message,
    ToolCall,
)

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

Role = Literal["system", "user", "assistant", "tool"]

CHAT_ROLES: Mapping[str, Role] = {
    "system": "system",
    "developer": "system",
    "user": "user",
    "assistant": "assistant",
    "tool": "tool",
    "function": "tool",
}
"""Roles a message may have, and the role each is stored as."""

_TEXT_PARTS = {"text": "text", "input_text": "text", "output_text": "text", "refusal": "refusal"}
_MEDIA_PARTS = {
    "image_url": "image",
    "input_image": "image",
    "image": "image",
    "input_audio": "audio",
    "audio": "audio",
    "file": "file",
    "input_file": "file",
}
CONTENT_PART_TYPES: tuple[str, ...] = (*_TEXT_PARTS, *_MEDIA_PARTS)
"""Content part types accepted: the text ones are kept, the others noted as attachments."""


def _fail(field: str, problem: str) -> InvalidTranscriptError:
    return InvalidTranscriptError(f"{field} {problem}", field=field)


def _type_name(value: object) -> str:
    return "null" if value is None else type(value).__name__


def _checked(value: object, field: str, limit: int) -> str:
    """``value`` if it is a string within ``limit`` characters that can be stored as UTF-8."""
    if not isinstance(value, str):
        raise _fail(field, f"must be a string, got {_type_name(value)}")
    if len(value) > limit:
        raise _fail(field, f"is too long: {len(value)} characters, at most {limit}")
    try:
        value.encode("utf-8")
    except UnicodeEncodeError as exc:
        raise _fail(field, "is not valid Unicode (a lone surrogate?)") from exc
    return value


def _json_text(value: object, field: str) -> str:
    """Arguments as text: a string as written, anything else as compact JSON."""
    if isinstance(value, str):
        return _checked(value, field, MAX_MESSAGE_TEXT)
    try:
        text = json.dumps(value, ensure_ascii=False, separators=(",", ":"), allow_nan=False)
    except (TypeError, ValueError, RecursionError) as exc:
        raise _fail(field, f"must be a string or JSON, got {_type_name(value)}") from exc
    return _checked(text, field, MAX_MESSAGE_TEXT)


class _Item:
    """One transcript item being read, and where it is (every error names its field)."""

    def __init__(self, data: Mapping[str, Any], where: str) -> None:
        self.data = data
        self.where = where

    def at(self, key: str) -> str:
        return f"{self.where}.{key}"

    def get(self, key: str) -> Any:
        """The value, ``None`` when absent (frameworks write absent fields as null)."""
        return self.data.get(key)

    def required(self, key: str) -> Any:
        value = self.data.get(key)
        if value is None:
            raise _fail(self.at(key), "is missing")
        return value

    def text(self, key: str, *, required: bool = False, limit: int = MAX_MESSAGE_TEXT) -> str:
        value = self.required(key) if required else self.get(key)
        return "" if value is None else _checked(value, self.at(key), limit)

    def name(self, key: str) -> str | None:
        """An optional name or id: a non-empty string of at most MAX_MESSAGE_NAME characters."""
        value = self.get(key)
        if value is None:
            return None
        text = _checked(value, self.at(key), MAX_MESSAGE_NAME)
        if not text:
            raise _fail(self.at(key), "must not be empty")
        return text

    def required_name(self, key: str) -> str:
        self.required(key)
        return self.name(key) or ""

    def json(self, key: str, *, required: bool = False) -> str:
        value = self.required(key) if required else self.get(key)
        return "" if value is None else _json_text(value, self.at(key))

    def mapping(self, key: str, *, required: bool = False) -> Mapping[str, Any] | None:
        value = self.required(key) if required else self.get(key)
        if value is None or isinstance(value, Mapping):
            return value
        raise _fail(self.at(key), f"must be an object, got {_type_name(value)}")

    def items(self, key: str, *, required: bool = False) -> list[Any]:
        value = self.required(key) if required else self.get(key)
        if value is None:
            return []
        if isinstance(value, str | bytes | bytearray | Mapping) or not isinstance(value, Sequence):
            raise _fail(self.at(key), f"must be a list, got {_type_name(value)}")
        return list(value)

    def qualified(self, name: str, namespace_key: str, key: str = "name") -> str:
        """``namespace.name`` when the item has a namespace (or MCP server label)."""
        namespace = self.name(namespace_key)
        full = f"{namespace}.{name}" if namespace else name
        if len(full) > MAX_MESSAGE_NAME:
            raise _fail(self.at(key), f"with its {namespace_key} is over {MAX_MESSAGE_NAME} chars")
        return full


def _message(where: str, **fields: Any) -> Message:
    """Build a Message from fields already checked; a remaining violation names the item."""
    try:
        return Message(**fields)
    except ValidationError as exc:
        error = exc.errors()[0]
        loc = ".".join(str(part) for part in error["loc"])
        field = f"{where}.{loc}" if loc else where
        raise _fail(field, f"is invalid: {error['msg']}") from exc


# --------------------------------------------------------------------------- content parts


def _content(value: object, field: str) -> tuple[str, list[str]]:
    """Text and attachment labels of a ``content`` (or tool ``output``) value."""
    if value is None:
        return "", []
    if isinstance(value, str):
        return _checked(value, field, MAX_MESSAGE_TEXT), []
    if isinstance(value, bytes | bytearray | Mapping) or not isinstance(value, Sequence):
        raise _fail(
            field, f"must be a string, a list of content parts or null, got {_type_name(value)}"
        )
    texts: list[str] = []
    attachments: list[str] = []
    for index, part in enumerate(value):
        where = f"{field}[{index}]"
        if isinstance(part, str):
            texts.append(_checked(part, where, MAX_MESSAGE_TEXT))
            continue
        if not isinstance(part, Mapping):
            raise _fail(
                where,
                f"must be a content part like {{'type': 'text', 'text': ...}}, got {_type_name(part)}",
            )
        kind = part.get("type", "text")
        if not isinstance(kind, str):
            raise _fail(f"{where}.type", f"must be a string, got {_type_name(kind)}")
        if kind in _TEXT_PARTS:
            key = _TEXT_PARTS[kind]
            texts.append(_checked(part.get(key), f"{where}.{key}", MAX_MESSAGE_TEXT))
        elif kind in _MEDIA_PARTS:
            attachments.append(_attachment(_MEDIA_PARTS[kind], part))
        else:
            raise _fail(
                f"{where}.type",
                f"is not a known content part type ({kind!r:.40}): use one of "
                + ", ".join(CONTENT_PART_TYPES),
            )
    text = "\n".join(texts)
    if len(text) > MAX_MESSAGE_TEXT:
        raise _fail(field, f"is too long: {len(text)} characters, at most {MAX_MESSAGE_TEXT}")
    if len(attachments) > MAX_TOOL_CALLS:
        raise _fail(field, f"has {len(attachments)} non-text parts, at most {MAX_TOOL_CALLS}")
    return text, attachments


def _attachment(kind: str, part: Mapping[str, Any]) -> str:
    """``image``/``audio``/``file``, with the file's name when the part gives one."""
    inner = part.get("file")
    filename = part.get("filename") or (
        inner.get("filename") if isinstance(inner, Mapping) else None
    )
    if kind == "file" and isinstance(filename, str) and filename.strip():
        label = f"file:{filename.strip()}"[:MAX_MESSAGE_NAME]
        if label.encode("utf-8", "replace").decode() == label:  # no lone surrogate in it
            return label
    return kind


def _attachments(item: _Item) -> list[str]:
    """tiermem's own ``attachments`` field (a list of labels)."""
    out = []
    for index, label in enumerate(item.items("attachments")):
        text = _checked(label, f"{item.at('attachments')}[{index}]", MAX_MESSAGE_NAME)
        if text:
            out.append(text)
    if len(out) > MAX_TOOL_CALLS:
        raise _fail(item.at("attachments"), f"has {len(out)} entries, at most {MAX_TOOL_CALLS}")
    return out


# --------------------------------------------------------------------------- chat messages


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


# --------------------------------------------------------------------------- Responses items

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


# --------------------------------------------------------------------------- the reader


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
