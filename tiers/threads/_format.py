"""How graph threads are stored: the records, the frame every value is, and values of any size.

Every value is a frame: a tag byte (0 = frame, 1 = manifest), a 4-byte header
length, a JSON header and the payload bytes, so the payload is never
re-encoded. A value over the store's per-value limit is stored as a manifest
plus chunks (:class:`ChunkedValues`).
"""

from __future__ import annotations

import hashlib
import json
import struct
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue

from tiers import keys
from tiers.backends.base import Check, Delete, KVStore, Put, Write
from tiers.backends.common import check_text
from tiers.errors import CorruptRecordError, InvalidInputError
from tiers.ids import ID_PATTERN

MAX_THREAD_ID = 1024
MAX_NAME = 1024
FRAME = 0
MANIFEST = 1
LEN = struct.Struct(">I")


def thread_key(thread_id: str) -> str:
    """The storage key of a thread id: the id itself when it is a valid tiermem id, else a digest.

    A digest key starts with ``~``, which no valid id does, so the two kinds never collide.
    """
    if ID_PATTERN.fullmatch(thread_id):
        return thread_id
    return "~" + hashlib.sha256(thread_id.encode()).hexdigest()[:40]


def check_name(value: object, field: str, *, empty: bool) -> str:
    """``value`` checked as a thread id or name (``field`` says which; ``empty``: may be "")."""
    if not isinstance(value, str):
        raise InvalidInputError(
            f"{field} must be a string, got {type(value).__name__}", field=field
        )
    if not value and not empty:
        raise InvalidInputError(f"{field} must not be empty", field=field)
    limit = MAX_THREAD_ID if field == "thread_id" else MAX_NAME
    if len(value) > limit:
        raise InvalidInputError(f"{field} is longer than {limit} characters", field=field)
    check_text(value, field)
    return value


@dataclass(frozen=True, slots=True)
class Blob:
    """A stored channel value: opaque bytes, and the older versions of its channel it builds on.

    ``deps`` lists the versions (oldest first) whose blobs a reader needs
    before this one, e.g. a list stored as its newest tail; storage
    maintenance (prune, delete by run) keeps them while this blob is kept.
    """

    data: bytes
    deps: tuple[str, ...] = ()


@dataclass(frozen=True, slots=True)
class NewCheckpoint:
    """A checkpoint to store (see :meth:`ThreadTier.put`)."""

    checkpoint_id: str
    parent_id: str | None
    metadata: Mapping[str, Any]
    channel_versions: Mapping[str, str | int | float]
    payload: bytes = b""


@dataclass(frozen=True, slots=True)
class StoredCheckpoint:
    """A checkpoint as stored: where it is, its parent, metadata, channel versions and payload."""

    ns: str
    checkpoint_id: str
    parent_id: str | None
    metadata: dict[str, JsonValue]
    channel_versions: dict[str, str | int | float]
    payload: bytes


@dataclass(frozen=True, slots=True)
class StoredWrite:
    """One pending write of a task, recorded against a checkpoint."""

    task_id: str
    idx: int
    channel: str
    task_path: str
    payload: bytes

    def sort_key(self) -> tuple[str, str, int]:
        """The order a framework applies one super-step's writes in: task path, task, index."""
        return (self.task_path, self.task_id, self.idx)


@dataclass(frozen=True, slots=True)
class EffectEntry:
    """An effect ledger entry: ``invoked`` before the call, ``recorded`` (with its result) after."""

    key: str
    name: str
    status: str
    payload: bytes = b""


def frame(header: Mapping[str, Any] | None, payload: bytes = b"") -> bytes:
    """A frame of ``header`` (none when empty) and ``payload``."""
    head = b"" if not header else dumps(header)
    return b"".join((bytes((FRAME,)), LEN.pack(len(head)), head, payload))


def dumps(value: object) -> bytes:
    """``value`` as compact JSON (no NaN or infinity)."""
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def unframe(data: bytes, where: str) -> tuple[dict[str, Any], bytes]:
    """The header and payload of a frame stored at ``where``."""
    if len(data) < 5 or data[0] != FRAME:
        raise CorruptRecordError(f"stored thread value at {where} is not a frame")
    (length,) = LEN.unpack_from(data, 1)
    end = 5 + length
    try:
        header = json.loads(data[5:end]) if length else {}
    except ValueError as exc:
        raise CorruptRecordError(f"stored thread value at {where} has a bad header") from exc
    return header, data[end:]


def decode_checkpoint(data: bytes, where: str) -> StoredCheckpoint:
    """The checkpoint a frame stored at ``where`` holds."""
    header, payload = unframe(data, where)
    try:
        return StoredCheckpoint(
            ns=header["ns"],
            checkpoint_id=header["id"],
            parent_id=header["p"],
            metadata=header["m"],
            channel_versions=header["v"],
            payload=payload,
        )
    except KeyError as exc:
        raise CorruptRecordError(f"stored checkpoint at {where} lacks {exc}") from exc


def unpart(text: str) -> str:
    """Invert :func:`tiers.keys.key_part`."""
    if "%" not in text:
        return text
    return text.replace("%3A", ":").replace("%25", "%")


@dataclass
class Commit:
    """Writes and checks of one atomic commit, built up by the thread tier's methods."""

    writes: list[Write] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)


class ChunkedValues:
    """Values of any size in one KV store: over its per-value limit, a manifest plus chunks.

    Args:
        kv: The store.
    """

    def __init__(self, kv: KVStore) -> None:
        self._kv = kv

    def store(self, commit: Commit, space: str, key: str, value: bytes) -> None:
        """Put ``value`` at ``key``, as a manifest plus chunks when it is over the per-value limit."""
        limit = self._kv.max_value_bytes
        if len(value) <= limit:
            commit.writes.append(Put(space, key, value))
            return
        chunks = [value[i : i + limit] for i in range(0, len(value), limit)]
        manifest = bytes((MANIFEST,)) + dumps({"n": len(chunks), "size": len(value)})
        commit.writes.append(Put(space, key, manifest))
        commit.writes.extend(
            Put(space, keys.thread_chunk_key(key, n), chunk) for n, chunk in enumerate(chunks)
        )

    def load(self, space: str, items: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        """``items`` with every manifest replaced by the value its chunks hold (one read for all)."""
        wanted: list[str] = []
        manifests: dict[str, int] = {}
        for key, data in items:
            if data[:1] == bytes((MANIFEST,)):
                count = int(json.loads(data[1:])["n"])
                manifests[key] = count
                wanted += [keys.thread_chunk_key(key, n) for n in range(count)]
        if not manifests:
            return list(items)
        found = dict(zip(wanted, self._kv.get_many(space, wanted), strict=True))
        out = []
        for key, data in items:
            if key in manifests:
                parts = [found[keys.thread_chunk_key(key, n)] for n in range(manifests[key])]
                if any(part is None for part in parts):
                    raise CorruptRecordError(f"a chunk of {space}/{key} is missing")
                data = b"".join(p for p in parts if p is not None)
            out.append((key, data))
        return out

    def drop(self, commit: Commit, space: str, key: str, data: bytes) -> None:
        """Delete ``key`` (its stored bytes ``data``) and, for a manifest, its chunks."""
        commit.writes.append(Delete(space, key))
        if data[:1] == bytes((MANIFEST,)):
            count = int(json.loads(data[1:])["n"])
            commit.writes.extend(Delete(space, keys.thread_chunk_key(key, n)) for n in range(count))
