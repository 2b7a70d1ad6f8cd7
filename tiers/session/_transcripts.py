"""Raw session transcripts in the KV store, split into pages of bytes.

A transcript can be far larger than one KV value may be, so it is stored as
its JSON encoding cut into pages: a header record under the session id
(``<session_id>``) says how many pages there are and the SHA-256 of the whole,
and the pages sit under ``<session_id>/<page number>``. Ids cannot contain
``/``, so a header key never collides with a page key. A transcript is always
written, replaced or deleted in one atomic commit with its header.

Each message is stored as :class:`~tiers.models.Message` JSON without its
empty fields: ``{"role", "content"}`` (and ``name``) for a plain message, plus
``tool_calls``, ``tool_call_id``, ``item_type`` or ``attachments`` when it has
them. Those fields are optional with empty defaults, so transcripts stored
before they existed read back unchanged, and a reader that does not know them
ignores them.
"""

from __future__ import annotations

import hashlib
import json
import logging
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Annotated, Any

from pydantic import Field, ValidationError

from tiers.backends.base import Delete, Put, Write
from tiers.codec import decode, encode
from tiers.errors import CorruptRecordError, InvalidInputError
from tiers.ids import Id
from tiers.models import Message, Record, UtcDatetime, utcnow

__all__ = [
    "TranscriptHeader",
    "decode_header",
    "decode_transcript",
    "delete_writes",
    "header_key",
    "is_header_key",
    "page_key",
    "parse_messages",
    "read_header",
    "transcript_writes",
]

logger = logging.getLogger(__name__)

# Room left in each page value for any per-value overhead of a backend.
_PAGE_SLACK = 256


class TranscriptHeader(Record):
    """Describes a stored transcript: its pages and a checksum of their concatenation.

    Attributes:
        session_id: The session.
        user_id: The user.
        pages: How many page values hold the JSON encoding.
        size: Bytes of the JSON encoding.
        messages: Number of messages.
        sha256: Checksum of the JSON encoding.
        created_at: When the session ended (the summary's ``created_at`` when
            it is summarized from this transcript).
    """

    session_id: Id
    user_id: Id
    pages: int = Field(ge=1)
    size: int = Field(ge=0)
    messages: int = Field(ge=0)
    sha256: Annotated[str, Field(min_length=64, max_length=64)]
    created_at: UtcDatetime = Field(default_factory=utcnow)


def header_key(session_id: str) -> str:
    """Key of a transcript's header: the session id itself."""
    return session_id


def page_key(session_id: str, page: int) -> str:
    """Key of one page; zero-padded so key order is page order."""
    return f"{session_id}/{page:06d}"


def is_header_key(key: str) -> bool:
    """Whether a key of a transcripts space is a header (not a page)."""
    return "/" not in key


def parse_messages(messages: object) -> list[Message]:
    """Validate a transcript given as :class:`Message` objects or their JSON form (as stored).

    This is the storage tier's check; the formats agent frameworks produce
    (chat completions, Responses API items) are read by
    ``summarizer.parse_transcript`` before they get here.

    Raises:
        InvalidInputError: Not a non-empty list of valid messages; ``field``
            names the first bad item, e.g. ``messages[2]``.
    """
    if isinstance(messages, str | bytes | Mapping) or not isinstance(messages, Sequence):
        raise InvalidInputError(
            f"messages must be a list of {{'role', 'content'}} messages, got "
            f"{type(messages).__name__}",
            field="messages",
        )
    if not messages:
        raise InvalidInputError("messages is empty: pass at least one message", field="messages")
    out: list[Message] = []
    for index, item in enumerate(messages):
        if isinstance(item, Message):
            out.append(item)
            continue
        try:
            out.append(Message.model_validate(item))
        except ValidationError as exc:
            first = exc.errors()[0]
            where = ".".join(str(part) for part in first["loc"])
            field = f"messages[{index}]" + (f".{where}" if where else "")
            raise InvalidInputError(
                f"{field} is invalid: {first['msg']} (pass OpenAI-style role/content messages)",
                field=field,
            ) from exc
    return out


def _encode_messages(messages: Sequence[Message]) -> bytes:
    # Empty optional fields are left out: a plain transcript encodes to the same bytes (and
    # checksum) as before tool calls were stored, so saving it again keeps its summary.
    return json.dumps(
        [message.model_dump(mode="json", exclude_defaults=True) for message in messages],
        ensure_ascii=False,
        separators=(",", ":"),
    ).encode()


def transcript_writes(
    space: str,
    user_id: str,
    session_id: str,
    messages: Sequence[Message],
    *,
    max_value_bytes: int,
    old_header: TranscriptHeader | None,
    created_at: datetime | None = None,
) -> tuple[TranscriptHeader, bytes, list[Write]]:
    """The writes that store ``messages`` as the session's transcript, replacing ``old_header``'s.

    Returns:
        The new header, its encoded bytes, and the writes (header, pages, and
        deletes of the old transcript's surplus pages).
    """
    data = _encode_messages(messages)
    page_size = max(1, max_value_bytes - _PAGE_SLACK)
    pages = [data[start : start + page_size] for start in range(0, len(data), page_size)] or [b""]
    header = TranscriptHeader(
        session_id=session_id,
        user_id=user_id,
        pages=len(pages),
        size=len(data),
        messages=len(messages),
        sha256=hashlib.sha256(data).hexdigest(),
        created_at=created_at or utcnow(),
    )
    header_bytes = encode(header)
    writes: list[Write] = [Put(space, header_key(session_id), header_bytes)]
    writes.extend(Put(space, page_key(session_id, n), page) for n, page in enumerate(pages))
    if old_header is not None:
        writes.extend(
            Delete(space, page_key(session_id, n)) for n in range(len(pages), old_header.pages)
        )
    return header, header_bytes, writes


def delete_writes(space: str, header: TranscriptHeader) -> list[Write]:
    """The writes that delete a stored transcript (header and every page)."""
    writes: list[Write] = [Delete(space, header_key(header.session_id))]
    writes.extend(Delete(space, page_key(header.session_id, n)) for n in range(header.pages))
    return writes


def decode_header(data: bytes, *, where: str) -> TranscriptHeader:
    """Parse a stored header.

    Raises:
        CorruptRecordError: The bytes are not a valid header.
    """
    return decode(TranscriptHeader, data, where=where)


def read_header(raw: bytes | None, *, where: str) -> TranscriptHeader | None:
    """Parse a stored header if there is one; an unreadable one is logged and read as absent.

    For writers replacing a transcript and for indexing, where a damaged
    header must not block the repair that a new save brings.
    """
    if raw is None:
        return None
    try:
        return decode_header(raw, where=where)
    except CorruptRecordError as exc:
        logger.error("ignoring an unreadable transcript header: %s", exc)
        return None


def decode_transcript(
    header: TranscriptHeader, pages: Sequence[bytes | None], *, where: str
) -> list[Message]:
    """Reassemble and validate a transcript from its pages, in order.

    Raises:
        CorruptRecordError: A page is missing, or the whole does not match the
            header's checksum, or it is not a valid message list.
    """
    if len(pages) != header.pages or any(page is None for page in pages):
        raise CorruptRecordError(f"transcript at {where} is missing pages: save it again")
    data = b"".join(page for page in pages if page is not None)
    if hashlib.sha256(data).hexdigest() != header.sha256:
        raise CorruptRecordError(
            f"transcript at {where} does not match its checksum (a partial write?): save it again"
        )
    try:
        raw: Any = json.loads(data)
        return [Message.model_validate(item) for item in raw]
    except (ValueError, TypeError, ValidationError) as exc:
        raise CorruptRecordError(f"transcript at {where} is not a valid message list") from exc
