"""The graph-thread tier (see :mod:`tiers.threads`)."""

from __future__ import annotations

import heapq
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from tiers import keys
from tiers.backends.base import Check, Delete, DeleteSpace, KVStore, Put, Write
from tiers.errors import ConflictError, CorruptRecordError, InvalidInputError
from tiers.ids import check_id
from tiers.threads._format import (
    Blob,
    ChunkedValues,
    Commit,
    EffectEntry,
    NewCheckpoint,
    StoredCheckpoint,
    StoredWrite,
    check_name,
    decode_checkpoint,
    frame,
    thread_key,
    unframe,
    unpart,
)
from tiers.threads._maintenance import ThreadRewriter, keep_only

PAGE = 64


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
        self._values = ChunkedValues(kv)
        self._rewriter = ThreadRewriter(kv, self._tenant, self._values)

    @property
    def tenant(self) -> str:
        """The tenant whose threads this tier reads and writes."""
        return self._tenant

    def _space(self, thread_id: str) -> tuple[str, str]:
        tkey = thread_key(check_name(thread_id, "thread_id", empty=False))
        return tkey, keys.thread_space(self._tenant, tkey)

    # -- reads ----------------------------------------------------------------

    def head(self, thread_id: str, ns: str) -> tuple[str | None, bytes | None]:
        """The namespace's head: the id of its newest checkpoint, and the head's stored bytes.

        Pass the bytes to :meth:`put` as ``expected_head``. Storage maintenance
        (:meth:`prune`, :meth:`delete_runs`) rewrites the bytes even when the id
        stays, so a writer that read the head before it re-reads it (and
        re-encodes values it stored relative to ones maintenance may have removed).
        Returns ``(None, None)`` for a namespace without checkpoints.
        """
        check_name(ns, "checkpoint_ns", empty=True)
        _, space = self._space(thread_id)
        (data,) = self._kv.get_many(space, [keys.thread_head_key(ns)])
        if data is None:
            return None, None
        return data.decode().split("\n", 1)[0], data

    def get(self, thread_id: str, ns: str, checkpoint_id: str) -> StoredCheckpoint | None:
        """One checkpoint by id (one point read), or ``None``."""
        check_name(ns, "checkpoint_ns", empty=True)
        check_name(checkpoint_id, "checkpoint_id", empty=False)
        _, space = self._space(thread_id)
        key = keys.thread_checkpoint_key(ns, checkpoint_id)
        (data,) = self._kv.get_many(space, [key])
        if data is None:
            return None
        ((_, data),) = self._values.load(space, [(key, data)])
        return decode_checkpoint(data, f"{space}/{key}")

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
        page = PAGE if limit is None or where is not None else min(limit, PAGE)
        if ns is None:
            streams = [self._scan_ns(space, name, before, page) for name in self._namespaces(space)]
            merged: Iterable[StoredCheckpoint] = heapq.merge(
                *streams, key=lambda c: c.checkpoint_id, reverse=True
            )
        else:
            check_name(ns, "checkpoint_ns", empty=True)
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
            names.append(unpart(key[len(keys.THREAD_HEAD_PREFIX) :]))
        return names

    def _scan_ns(
        self, space: str, ns: str, before: str | None, size: int
    ) -> Iterator[StoredCheckpoint]:
        prefix = keys.thread_checkpoint_prefix(ns)
        start = None if before is None else keys.thread_checkpoint_key(ns, before)
        while True:
            page = self._kv.scan(space, prefix=prefix, start_after=start, reverse=True, limit=size)
            for key, data in self._values.load(space, page):
                yield decode_checkpoint(data, f"{space}/{key}")
            if len(page) < size:
                return
            start = page[-1][0]
            size = PAGE

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
        own = dict(self._values.load(space, present))
        parsed: dict[str, tuple[dict[str, Any], bytes]] = {}
        dep_keys: list[str] = []
        for ch, key in wanted.items():
            if key not in own:
                continue
            header, payload = unframe(own[key], f"{space}/{key}")
            parsed[ch] = (header, payload)
            dep_keys += [keys.thread_blob_key(ns, ch, d) for d in header.get("d", ())]
        deps: dict[str, bytes] = {}
        if dep_keys:
            raw_deps = self._kv.get_many(space, dep_keys)
            missing = [k for k, d in zip(dep_keys, raw_deps, strict=True) if d is None]
            if missing:
                raise CorruptRecordError(f"blob dependencies {missing[:3]} of {space} are missing")
            loaded = self._values.load(
                space, [(k, d) for k, d in zip(dep_keys, raw_deps, strict=True) if d]
            )
            deps = {k: unframe(d, f"{space}/{k}")[1] for k, d in loaded}
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
        for key, data in self._values.load(space, found):
            header, payload = unframe(data, f"{space}/{key}")
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
        check_name(ns, "checkpoint_ns", empty=True)
        cid = check_name(checkpoint.checkpoint_id, "checkpoint_id", empty=False)
        if checkpoint.parent_id is not None:
            check_name(checkpoint.parent_id, "parent_id", empty=False)
        tkey, space = self._space(thread_id)
        try:
            header = {
                "ns": ns,
                "id": cid,
                "p": checkpoint.parent_id,
                "m": dict(checkpoint.metadata),
                "v": dict(checkpoint.channel_versions),
            }
            record = frame(header, checkpoint.payload)
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(
                f"checkpoint {cid!r}: metadata and channel versions must be JSON "
                f"(no NaN, infinity or objects): {exc}",
                field="metadata",
            ) from exc
        commit = Commit()
        self._values.store(commit, space, keys.thread_checkpoint_key(ns, cid), record)
        for (channel, version), blob in blobs.items():
            check_name(channel, "channel", empty=False)
            key = keys.thread_blob_key(ns, channel, str(version))
            self._values.store(
                commit, space, key, frame({"d": list(blob.deps)} if blob.deps else None, blob.data)
            )
        head_key = keys.thread_head_key(ns)
        commit.writes.append(Put(space, head_key, cid.encode()))
        commit.checks.append(Check(space, head_key, expected_head))
        if expected_head is None:
            commit.writes.append(Put(self._index, tkey, thread_id.encode()))
        if run_id:
            check_name(run_id, "run_id", empty=False)
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
        check_name(ns, "checkpoint_ns", empty=True)
        check_name(checkpoint_id, "checkpoint_id", empty=False)
        check_name(task_id, "task_id", empty=False)
        check_name(task_path, "task_path", empty=True)
        _, space = self._space(thread_id)
        rows: dict[str, bytes] = {}
        for idx, channel, payload in writes:
            check_name(channel, "channel", empty=False)
            header = {"t": task_id, "i": idx, "c": channel}
            if task_path:
                header["p"] = task_path
            rows[keys.thread_write_key(ns, checkpoint_id, task_id, idx)] = frame(header, payload)
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
        commit = Commit()
        for key, value in rows.items():
            self._values.store(commit, space, key, value)
            if checks:
                commit.checks.append(Check(space, key, None))
        if commit.writes:
            self._kv.commit(commit.writes, commit.checks)

    # -- effects of nodes -------------------------------------------------------

    def effect(self, thread_id: str, key: str) -> tuple[EffectEntry | None, bytes | None]:
        """The ledger entry of an effect, and its stored bytes (for a checked update), or ``(None, None)``."""
        check_name(key, "effect key", empty=False)
        _, space = self._space(thread_id)
        (data,) = self._kv.get_many(space, [keys.thread_effect_key(key)])
        if data is None:
            return None, None
        header, payload = unframe(data, f"{space}/{keys.thread_effect_key(key)}")
        return EffectEntry(key, header["n"], header["s"], payload), data

    def set_effect(self, thread_id: str, entry: EffectEntry, *, expected: bytes | None) -> bytes:
        """Write an effect ledger entry if the stored bytes are still ``expected`` (``None``: absent).

        Returns the bytes written, for the next checked update.

        Raises:
            ConflictError: Another writer changed the entry first; nothing was written.
        """
        check_name(entry.key, "effect key", empty=False)
        _, space = self._space(thread_id)
        key = keys.thread_effect_key(entry.key)
        data = frame({"n": entry.name, "s": entry.status}, entry.payload)
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
        return self._rewriter.delete_runs(run_ids)

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
            commit = Commit()
            for ns in self._namespaces(space):
                newest = self.latest(thread_id, ns)
                keep = None if newest is None else newest.checkpoint_id
                self._rewriter.rewrite_ns(commit, space, ns, keep_only(keep))
            if commit.writes:
                self._kv.commit(commit.writes)

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
