"""What every transcript item shares: roles, checked text, the item wrapper and content parts."""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from typing import Any, Literal

from pydantic import ValidationError

from summarizer.errors import InvalidTranscriptError
from tiers.models import MAX_MESSAGE_NAME, MAX_MESSAGE_TEXT, MAX_TOOL_CALLS, Message

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
