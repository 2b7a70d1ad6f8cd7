"""Graph threads: the checkpoint DAGs of graph frameworks (LangGraph), addressed by their own ids.

A *thread* (any string id) holds *namespaces* (any string; ``""`` is the root
graph, others are subgraphs). A namespace holds checkpoints, each with the id
the framework gave it, a parent id (or none), JSON metadata, the version of
every channel it has, and an opaque payload; checkpoints form a DAG (forks
and time travel branch it). Channel values are stored once per
``(channel, version)`` and shared by every checkpoint that has that version,
so a step stores only the channels it changed. *Pending writes* are recorded
against a checkpoint per ``(task, index)``. This is the storage model of
LangGraph's savers, kept framework-neutral: values are bytes the adapter
serialises (``memory.integrations.langgraph`` does LangGraph's part).

Storage (key formats in :mod:`tiers.keys`): everything of a thread is one
space, ``thread_space(tenant, thread_key)``, so deleting a thread is one
``DeleteSpace`` and a Redis Cluster keeps a thread on one slot:

- ``h:<ns>`` -> id of the namespace's newest checkpoint, the *head*: a put
  names the head it built on and is refused (:class:`~tiers.errors.ConflictError`)
  if another writer moved it meanwhile. This is the thread's fencing: two
  writers that read the same head cannot both append after it.
- ``c:<ns>:<checkpoint id>`` -> the checkpoint record; ids of one namespace
  sort as the framework's ids do (LangGraph's are time-ordered UUIDs), so the
  newest is one reverse scan and paging newest-first costs the page, not the thread.
- ``b:<ns>:<channel>:<version>`` -> a channel value (a :class:`Blob`); a blob
  may depend on older versions of its channel (the adapter stores a list that
  grew by appending as the new tail only), which it names in ``deps``.
- ``w:<ns>:<checkpoint id>:<task>:<idx>`` -> one pending write.
- ``r:<run>:<ns>:<checkpoint id>`` marks checkpoints written by a framework run
  (with ``thread_runs_space``, the tenant-wide run -> threads index) so
  :meth:`ThreadTier.delete_runs` finds them without reading every thread.
- ``e:<key>`` -> an effect ledger entry of a node (:meth:`ThreadTier.begin_effect`).
- ``x:<key>#<n>`` -> chunk ``n`` of a value over the store's per-value limit:
  values of any size are stored transparently as a manifest plus chunks.

Every value is a frame: a tag byte (0 = frame, 1 = manifest), a 4-byte header
length, a JSON header and the payload bytes, so the payload is never
re-encoded (no base64, no JSON escaping of serialised bytes).

**Threads.** :class:`ThreadTier` is stateless beyond its store: share it.
"""

from __future__ import annotations

import hashlib
import heapq
import json
import secrets
import struct
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from pydantic import JsonValue

from tiers import keys
from tiers.backends.base import Check, Delete, DeleteSpace, KVStore, Put, Write
from tiers.backends.common import check_text
from tiers.errors import ConflictError, CorruptRecordError, InvalidInputError
from tiers.ids import ID_PATTERN, check_id

__all__ = [
    "Blob",
    "EffectEntry",
    "NewCheckpoint",
    "StoredCheckpoint",
    "StoredWrite",
    "ThreadTier",
    "thread_key",
]

MAX_THREAD_ID = 1024
MAX_NAME = 1024
_FRAME = 0
_MANIFEST = 1
_LEN = struct.Struct(">I")
_PAGE = 64


def thread_key(thread_id: str) -> str:
    """The storage key of a thread id: the id itself when it is a valid tiermem id, else a digest.

    A digest key starts with ``~``, which no valid id does, so the two kinds never collide.
    """
    if ID_PATTERN.fullmatch(thread_id):
        return thread_id
    return "~" + hashlib.sha256(thread_id.encode()).hexdigest()[:40]


def _check_name(value: object, field: str, *, empty: bool) -> str:
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


def _frame(header: Mapping[str, Any] | None, payload: bytes = b"") -> bytes:
    head = b"" if not header else _dumps(header)
    return b"".join((bytes((_FRAME,)), _LEN.pack(len(head)), head, payload))


def _dumps(value: object) -> bytes:
    return json.dumps(value, separators=(",", ":"), ensure_ascii=False, allow_nan=False).encode()


def _unframe(data: bytes, where: str) -> tuple[dict[str, Any], bytes]:
    if len(data) < 5 or data[0] != _FRAME:
        raise CorruptRecordError(f"stored thread value at {where} is not a frame")
    (length,) = _LEN.unpack_from(data, 1)
    end = 5 + length
    try:
        header = json.loads(data[5:end]) if length else {}
    except ValueError as exc:
        raise CorruptRecordError(f"stored thread value at {where} has a bad header") from exc
    return header, data[end:]


@dataclass
class _Commit:
    """Writes and checks of one atomic commit, built up by the methods below."""

    writes: list[Write] = field(default_factory=list)
    checks: list[Check] = field(default_factory=list)


class ThreadTier:
    """Graph threads on a :class:`~tiers.backends.base.KVStore` (see the module docstring).

    Args:
        kv: The authoritative store.
        tenant: Namespace of every key this tier writes.
    """

    def __init__(self, kv: KVStore, *, tenant: str = "default") -> None:
        self._kv = kv
        self._tenant = check_id(tenant, "tenant")
        self._index = keys.threads_space(self._tenant)
        self._runs = keys.thread_runs_space(self._tenant)

    @property
    def tenant(self) -> str:
        """The tenant whose threads this tier reads and writes."""
        return self._tenant

    def _space(self, thread_id: str) -> tuple[str, str]:
        tkey = thread_key(_check_name(thread_id, "thread_id", empty=False))
        return tkey, keys.thread_space(self._tenant, tkey)

    # -- values of any size -------------------------------------------------

    def _store(self, commit: _Commit, space: str, key: str, value: bytes) -> None:
        """Put ``value`` at ``key``, as a manifest plus chunks when it is over the per-value limit."""
        limit = self._kv.max_value_bytes
        if len(value) <= limit:
            commit.writes.append(Put(space, key, value))
            return
        chunks = [value[i : i + limit] for i in range(0, len(value), limit)]
        manifest = bytes((_MANIFEST,)) + _dumps({"n": len(chunks), "size": len(value)})
        commit.writes.append(Put(space, key, manifest))
        commit.writes.extend(
            Put(space, keys.thread_chunk_key(key, n), chunk) for n, chunk in enumerate(chunks)
        )

    def _load(self, space: str, items: Sequence[tuple[str, bytes]]) -> list[tuple[str, bytes]]:
        """``items`` with every manifest replaced by the value its chunks hold (one read for all)."""
        wanted: list[str] = []
        manifests: dict[str, int] = {}
        for key, data in items:
            if data[:1] == bytes((_MANIFEST,)):
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

    def _drop(self, commit: _Commit, space: str, key: str, data: bytes) -> None:
        """Delete ``key`` (its stored bytes ``data``) and, for a manifest, its chunks."""
        commit.writes.append(Delete(space, key))
        if data[:1] == bytes((_MANIFEST,)):
            count = int(json.loads(data[1:])["n"])
            commit.writes.extend(Delete(space, keys.thread_chunk_key(key, n)) for n in range(count))

    # -- reads ----------------------------------------------------------------

    def head(self, thread_id: str, ns: str) -> tuple[str | None, bytes | None]:
        """The namespace's head: the id of its newest checkpoint, and the head's stored bytes.

        Pass the bytes to :meth:`put` as ``expected_head``. Storage maintenance
        (:meth:`prune`, :meth:`delete_runs`) rewrites the bytes even when the id
        stays, so a writer that read the head before it re-reads it (and
        re-encodes values it stored relative to ones maintenance may have removed).
        Returns ``(None, None)`` for a namespace without checkpoints.
        """
        _check_name(ns, "checkpoint_ns", empty=True)
        _, space = self._space(thread_id)
        (data,) = self._kv.get_many(space, [keys.thread_head_key(ns)])
        if data is None:
            return None, None
        return data.decode().split("\n", 1)[0], data

    def get(self, thread_id: str, ns: str, checkpoint_id: str) -> StoredCheckpoint | None:
        """One checkpoint by id (one point read), or ``None``."""
        _check_name(ns, "checkpoint_ns", empty=True)
        _check_name(checkpoint_id, "checkpoint_id", empty=False)
        _, space = self._space(thread_id)
        key = keys.thread_checkpoint_key(ns, checkpoint_id)
        (data,) = self._kv.get_many(space, [key])
        if data is None:
            return None
        ((_, data),) = self._load(space, [(key, data)])
        return _decode_checkpoint(data, f"{space}/{key}")

    def latest(self, thread_id: str, ns: str) -> StoredCheckpoint | None:
        """The namespace's checkpoint with the greatest id (one reverse scan), or ``None``."""
        return next(self.history(thread_id, ns, limit=1), None)

    def history(
        self,
        thread_id: str,
        ns: str | None,
        *,
        before: str | None = None,
        limit: int | None = None,
        where: Callable[[StoredCheckpoint], bool] | None = None,
    ) -> Iterator[StoredCheckpoint]:
        """Checkpoints newest first (greatest id first), read a page at a time.

        Args:
            thread_id: The thread.
            ns: One namespace, or ``None`` for every namespace of the thread
                (merged by id).
            before: Only checkpoints whose id sorts before this one.
            limit: At most this many (after ``where``).
            where: Keep only checkpoints it accepts (e.g. a metadata filter).
        """
        if limit is not None and limit <= 0:
            return
        _, space = self._space(thread_id)
        # Without a filter, a small limit needs no more than that many rows per namespace.
        page = _PAGE if limit is None or where is not None else min(limit, _PAGE)
        if ns is None:
            streams = [self._scan_ns(space, name, before, page) for name in self._namespaces(space)]
            merged: Iterable[StoredCheckpoint] = heapq.merge(
                *streams, key=lambda c: c.checkpoint_id, reverse=True
            )
        else:
            _check_name(ns, "checkpoint_ns", empty=True)
            merged = self._scan_ns(space, ns, before, page)
        count = 0
        for ckpt in merged:
            if where is not None and not where(ckpt):
                continue
            yield ckpt
            count += 1
            if limit is not None and count >= limit:
                return

    def _namespaces(self, space: str) -> list[str]:
        names = []
        for key, _ in self._kv.scan(space, prefix=keys.THREAD_HEAD_PREFIX):
            names.append(_unpart(key[len(keys.THREAD_HEAD_PREFIX) :]))
        return names

    def _scan_ns(
        self, space: str, ns: str, before: str | None, size: int
    ) -> Iterator[StoredCheckpoint]:
        prefix = keys.thread_checkpoint_prefix(ns)
        start = None if before is None else keys.thread_checkpoint_key(ns, before)
        while True:
            page = self._kv.scan(space, prefix=prefix, start_after=start, reverse=True, limit=size)
            for key, data in self._load(space, page):
                yield _decode_checkpoint(data, f"{space}/{key}")
            if len(page) < size:
                return
            start = page[-1][0]
            size = _PAGE

    def threads(self) -> list[str]:
        """Ids of this tenant's threads."""
        return [data.decode() for _, data in self._kv.scan(self._index)]

    def blobs(
        self, thread_id: str, ns: str, versions: Mapping[str, str | int | float]
    ) -> dict[str, list[tuple[str, bytes]]]:
        """The stored values of ``channel -> version``: per channel, ``(version, data)`` of its deps then its own.

        A channel with no stored value at that version (an empty channel) is left out.

        Raises:
            CorruptRecordError: A blob names a dependency that is not stored.
        """
        _, space = self._space(thread_id)
        wanted = {ch: keys.thread_blob_key(ns, ch, str(v)) for ch, v in versions.items()}
        raw = self._kv.get_many(space, list(wanted.values()))
        present = [(key, data) for key, data in zip(wanted.values(), raw, strict=True) if data]
        own = dict(self._load(space, present))
        parsed: dict[str, tuple[dict[str, Any], bytes]] = {}
        dep_keys: list[str] = []
        for ch, key in wanted.items():
            if key not in own:
                continue
            header, payload = _unframe(own[key], f"{space}/{key}")
            parsed[ch] = (header, payload)
            dep_keys += [keys.thread_blob_key(ns, ch, d) for d in header.get("d", ())]
        deps: dict[str, bytes] = {}
        if dep_keys:
            raw_deps = self._kv.get_many(space, dep_keys)
            missing = [k for k, d in zip(dep_keys, raw_deps, strict=True) if d is None]
            if missing:
                raise CorruptRecordError(f"blob dependencies {missing[:3]} of {space} are missing")
            loaded = self._load(
                space, [(k, d) for k, d in zip(dep_keys, raw_deps, strict=True) if d]
            )
            deps = {k: _unframe(d, f"{space}/{k}")[1] for k, d in loaded}
        out: dict[str, list[tuple[str, bytes]]] = {}
        for ch, (header, payload) in parsed.items():
            chain = [(d, deps[keys.thread_blob_key(ns, ch, d)]) for d in header.get("d", ())]
            out[ch] = [*chain, (str(versions[ch]), payload)]
        return out

    def writes(self, thread_id: str, ns: str, checkpoint_id: str) -> list[StoredWrite]:
        """The pending writes recorded against a checkpoint, in (task path, task, index) order."""
        _, space = self._space(thread_id)
        found = self._kv.scan(space, prefix=keys.thread_writes_prefix(ns, checkpoint_id))
        out = []
        for key, data in self._load(space, found):
            header, payload = _unframe(data, f"{space}/{key}")
            out.append(
                StoredWrite(
                    task_id=header["t"],
                    idx=int(header["i"]),
                    channel=header["c"],
                    task_path=header.get("p", ""),
                    payload=payload,
                )
            )
        out.sort(key=StoredWrite.sort_key)
        return out

    # -- writes ---------------------------------------------------------------

    def put(
        self,
        thread_id: str,
        ns: str,
        checkpoint: NewCheckpoint,
        blobs: Mapping[tuple[str, str], Blob],
        *,
        expected_head: bytes | None,
        run_id: str | None = None,
    ) -> None:
        """Store a checkpoint and its new channel values in one atomic, durable commit.

        Args:
            thread_id: The thread (any non-empty string).
            ns: The namespace ("" for the root graph).
            checkpoint: The checkpoint; its id becomes the namespace's head.
            blobs: New channel values by ``(channel, version)``; versions
                already stored need not be passed again.
            expected_head: The head's bytes as :meth:`head` returned them when
                the writer read it (``None``: the namespace had no checkpoint).
            run_id: The framework run that wrote it, for :meth:`delete_runs`.

        Raises:
            ConflictError: The head is no longer ``expected_head``; nothing was written.
            InvalidInputError: A bad id, name, or metadata JSON cannot hold; nothing was written.
        """
        _check_name(ns, "checkpoint_ns", empty=True)
        cid = _check_name(checkpoint.checkpoint_id, "checkpoint_id", empty=False)
        if checkpoint.parent_id is not None:
            _check_name(checkpoint.parent_id, "parent_id", empty=False)
        tkey, space = self._space(thread_id)
        try:
            header = {
                "ns": ns,
                "id": cid,
                "p": checkpoint.parent_id,
                "m": dict(checkpoint.metadata),
                "v": dict(checkpoint.channel_versions),
            }
            record = _frame(header, checkpoint.payload)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(
                f"checkpoint {cid!r}: metadata and channel versions must be JSON "
                f"(no NaN, infinity or objects): {exc}",
                field="metadata",
            ) from exc
        commit = _Commit()
        self._store(commit, space, keys.thread_checkpoint_key(ns, cid), record)
        for (channel, version), blob in blobs.items():
            _check_name(channel, "channel", empty=False)
            key = keys.thread_blob_key(ns, channel, str(version))
            self._store(
                commit, space, key, _frame({"d": list(blob.deps)} if blob.deps else None, blob.data)
            )
        head_key = keys.thread_head_key(ns)
        commit.writes.append(Put(space, head_key, cid.encode()))
        commit.checks.append(Check(space, head_key, expected_head))
        if expected_head is None:
            commit.writes.append(Put(self._index, tkey, thread_id.encode()))
        if run_id:
            _check_name(run_id, "run_id", empty=False)
            commit.writes.append(Put(space, keys.thread_run_key(run_id, ns, cid), b""))
            commit.writes.append(Put(self._runs, f"{keys.key_part(run_id)}:{tkey}", b""))
        self._kv.commit(commit.writes, commit.checks)

    def put_writes(
        self,
        thread_id: str,
        ns: str,
        checkpoint_id: str,
        task_id: str,
        writes: Sequence[tuple[int, str, bytes]],
        *,
        task_path: str = "",
        replace: bool = False,
    ) -> None:
        """Record a task's pending writes ``(index, channel, payload)`` against a checkpoint.

        A write already recorded for the same task and index is kept as it was
        (the first attempt's result wins), unless ``replace`` (special channels
        such as errors and interrupts, whose newest value counts).
        """
        _check_name(ns, "checkpoint_ns", empty=True)
        _check_name(checkpoint_id, "checkpoint_id", empty=False)
        _check_name(task_id, "task_id", empty=False)
        _check_name(task_path, "task_path", empty=True)
        _, space = self._space(thread_id)
        rows: dict[str, bytes] = {}
        for idx, channel, payload in writes:
            _check_name(channel, "channel", empty=False)
            header = {"t": task_id, "i": idx, "c": channel}
            if task_path:
                header["p"] = task_path
            rows[keys.thread_write_key(ns, checkpoint_id, task_id, idx)] = _frame(header, payload)
        if replace:
            self._commit_rows(space, rows, checks=False)
            return
        try:  # first attempt wins: usually none of these writes is recorded yet
            self._commit_rows(space, rows, checks=True)
        except ConflictError:
            prefix = f"{keys.thread_writes_prefix(ns, checkpoint_id)}{keys.key_part(task_id)}:"
            for key, _ in self._kv.scan(space, prefix=prefix):
                rows.pop(key, None)
            self._commit_rows(space, rows, checks=False)

    def _commit_rows(self, space: str, rows: Mapping[str, bytes], *, checks: bool) -> None:
        commit = _Commit()
        for key, value in rows.items():
            self._store(commit, space, key, value)
            if checks:
                commit.checks.append(Check(space, key, None))
        if commit.writes:
            self._kv.commit(commit.writes, commit.checks)

    # -- effects of nodes -------------------------------------------------------

    def effect(self, thread_id: str, key: str) -> tuple[EffectEntry | None, bytes | None]:
        """The ledger entry of an effect, and its stored bytes (for a checked update), or ``(None, None)``."""
        _check_name(key, "effect key", empty=False)
        _, space = self._space(thread_id)
        (data,) = self._kv.get_many(space, [keys.thread_effect_key(key)])
        if data is None:
            return None, None
        header, payload = _unframe(data, f"{space}/{keys.thread_effect_key(key)}")
        return EffectEntry(key, header["n"], header["s"], payload), data

    def set_effect(self, thread_id: str, entry: EffectEntry, *, expected: bytes | None) -> bytes:
        """Write an effect ledger entry if the stored bytes are still ``expected`` (``None``: absent).

        Returns the bytes written, for the next checked update.

        Raises:
            ConflictError: Another writer changed the entry first; nothing was written.
        """
        _check_name(entry.key, "effect key", empty=False)
        _, space = self._space(thread_id)
        key = keys.thread_effect_key(entry.key)
        data = _frame({"n": entry.name, "s": entry.status}, entry.payload)
        if len(data) > self._kv.max_value_bytes:
            raise InvalidInputError(
                f"the result of effect {entry.name!r} is {len(data)} bytes, over the store's "
                f"limit of {self._kv.max_value_bytes}: record a reference instead",
                field="output",
            )
        self._kv.commit([Put(space, key, data)], [Check(space, key, expected)])
        return data

    # -- maintenance ----------------------------------------------------------

    def delete_thread(self, thread_id: str) -> bool:
        """Delete a thread whole: checkpoints, values, writes, effects and its index entries.

        Returns whether it had anything stored.
        """
        tkey, space = self._space(thread_id)
        runs = {
            key.split(":", 2)[1] for key, _ in self._kv.scan(space, prefix=keys.THREAD_RUN_PREFIX)
        }
        existed = bool(self._kv.scan(space, limit=1))
        writes: list[Write] = [DeleteSpace(space), Delete(self._index, tkey)]
        writes += [Delete(self._runs, f"{run}:{tkey}") for run in runs]
        self._kv.commit(writes)
        return existed

    def delete_runs(self, run_ids: Sequence[str]) -> int:
        """Delete every checkpoint (with its writes) written by these framework runs, in every thread.

        Values no remaining checkpoint needs are deleted too; a namespace's head
        moves to its newest remaining checkpoint. Each thread changes in one commit.

        Returns:
            How many checkpoints were deleted.
        """
        deleted = 0
        for run_id in run_ids:
            _check_name(run_id, "run_id", empty=False)
            run_part = keys.key_part(run_id)
            for index_key, _ in self._kv.scan(self._runs, prefix=f"{run_part}:"):
                tkey = index_key[len(run_part) + 1 :]
                space = keys.thread_space(self._tenant, tkey)
                marks = self._kv.scan(space, prefix=f"{keys.THREAD_RUN_PREFIX}{run_part}:")
                doomed: dict[str, set[str]] = {}
                for mark, _ in marks:
                    _, _, ns_part, cid_part = mark.split(":", 3)
                    doomed.setdefault(_unpart(ns_part), set()).add(_unpart(cid_part))
                commit = _Commit()
                for ns, ids in doomed.items():
                    deleted += self._rewrite_ns(commit, space, ns, _not_in(ids))
                commit.writes += [Delete(space, mark) for mark, _ in marks]
                commit.writes.append(Delete(self._runs, index_key))
                self._kv.commit(commit.writes)
        return deleted

    def prune(self, thread_ids: Sequence[str], *, keep_latest: bool = True) -> None:
        """Keep only each namespace's newest checkpoint (with its writes and values), or delete all.

        Args:
            thread_ids: The threads to prune; unknown ones are skipped.
            keep_latest: ``False`` deletes the threads whole (:meth:`delete_thread`).
        """
        for thread_id in thread_ids:
            if not keep_latest:
                self.delete_thread(thread_id)
                continue
            _, space = self._space(thread_id)
            commit = _Commit()
            for ns in self._namespaces(space):
                newest = self.latest(thread_id, ns)
                keep = None if newest is None else newest.checkpoint_id
                self._rewrite_ns(commit, space, ns, _equals(keep))
            if commit.writes:
                self._kv.commit(commit.writes)

    def _rewrite_ns(self, commit: _Commit, space: str, ns: str, keep: Callable[[str], bool]) -> int:
        """Add to ``commit`` the deletion of a namespace's checkpoints ``keep`` refuses.

        Their writes and run marks go with them, and so do values that no kept
        checkpoint (or a kept value's dependency) needs; the head moves to the
        newest kept checkpoint. Returns how many checkpoints are deleted.
        """
        prefix = keys.thread_checkpoint_prefix(ns)
        kept_versions: set[tuple[str, str]] = set()
        newest_kept: str | None = None
        dropped = 0
        raw = self._kv.scan(space, prefix=prefix, reverse=True)
        for (key, stored), (_, data) in zip(raw, self._load(space, raw), strict=True):
            ckpt = _decode_checkpoint(data, f"{space}/{key}")
            if keep(ckpt.checkpoint_id):
                newest_kept = newest_kept or ckpt.checkpoint_id
                kept_versions |= {(ch, str(v)) for ch, v in ckpt.channel_versions.items()}
                continue
            dropped += 1
            self._drop(commit, space, key, stored)
            for wkey, wdata in self._kv.scan(
                space, prefix=keys.thread_writes_prefix(ns, ckpt.checkpoint_id)
            ):
                self._drop(commit, space, wkey, wdata)
        if not dropped:
            return 0
        blob_prefix = f"{keys.THREAD_BLOB_PREFIX}{keys.key_part(ns)}:"
        blobs = self._kv.scan(space, prefix=blob_prefix)
        needed = set(kept_versions)
        by_version: dict[tuple[str, str], tuple[str, bytes]] = {}
        for key, data in blobs:
            ch_part, v_part = key[len(blob_prefix) :].split(":", 1)
            by_version[(_unpart(ch_part), _unpart(v_part))] = (key, data)
        for ch, version in list(kept_versions):
            found = by_version.get((ch, version))
            if found is None:
                continue
            ((_, data),) = self._load(space, [found])
            header, _ = _unframe(data, f"{space}/{found[0]}")
            needed |= {(ch, d) for d in header.get("d", ())}
        for version_key, (key, data) in by_version.items():
            if version_key not in needed:
                self._drop(commit, space, key, data)
        head_key = keys.thread_head_key(ns)
        if newest_kept is None:
            commit.writes.append(Delete(space, head_key))
        else:
            # A fresh token: writers that read the head before this see it changed.
            token = secrets.token_hex(8)
            commit.writes.append(Put(space, head_key, f"{newest_kept}\n{token}".encode()))
        return dropped

    def copy_thread(self, source_id: str, target_id: str) -> None:
        """Copy every checkpoint, value, write and effect of one thread into another, in one commit.

        Keys the target already has are overwritten. A missing source copies nothing.
        """
        _, source = self._space(source_id)
        tkey, target = self._space(target_id)
        items = self._kv.scan(source)
        if not items:
            return
        writes: list[Write] = [Put(target, key, data) for key, data in items]
        writes.append(Put(self._index, tkey, target_id.encode()))
        runs = {key.split(":", 2)[1] for key, _ in items if key.startswith(keys.THREAD_RUN_PREFIX)}
        writes += [Put(self._runs, f"{run}:{tkey}", b"") for run in runs]
        self._kv.commit(writes)


def _not_in(ids: set[str]) -> Callable[[str], bool]:
    return lambda checkpoint_id: checkpoint_id not in ids


def _equals(kept: str | None) -> Callable[[str], bool]:
    return lambda checkpoint_id: checkpoint_id == kept


def _unpart(text: str) -> str:
    """Invert :func:`tiers.keys.key_part`."""
    if "%" not in text:
        return text
    return text.replace("%3A", ":").replace("%25", "%")


def _decode_checkpoint(data: bytes, where: str) -> StoredCheckpoint:
    header, payload = _unframe(data, where)
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
