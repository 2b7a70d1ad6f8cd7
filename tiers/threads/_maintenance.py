"""Storage maintenance of graph threads: deleting the checkpoints of framework runs, and
rewriting a namespace to keep only some checkpoints (with the values they need)."""

from __future__ import annotations

import secrets
from collections.abc import Callable, Sequence

from tiers import keys
from tiers.backends.base import Delete, KVStore, Put
from tiers.threads._format import (
    ChunkedValues,
    Commit,
    check_name,
    decode_checkpoint,
    unframe,
    unpart,
)


class ThreadRewriter:
    """Deletes checkpoints from threads, keeping every value a kept checkpoint needs.

    Args:
        kv: The authoritative store.
        tenant: The tenant whose threads these are.
        values: Reads and deletes values of any size.
    """

    def __init__(self, kv: KVStore, tenant: str, values: ChunkedValues) -> None:
        self._kv = kv
        self._tenant = tenant
        self._runs = keys.thread_runs_space(tenant)
        self._values = values

    def delete_runs(self, run_ids: Sequence[str]) -> int:
        """See :meth:`ThreadTier.delete_runs`."""
        deleted = 0
        for run_id in run_ids:
            check_name(run_id, "run_id", empty=False)
            run_part = keys.key_part(run_id)
            for index_key, _ in self._kv.scan(self._runs, prefix=f"{run_part}:"):
                tkey = index_key[len(run_part) + 1 :]
                space = keys.thread_space(self._tenant, tkey)
                marks = self._kv.scan(space, prefix=f"{keys.THREAD_RUN_PREFIX}{run_part}:")
                doomed: dict[str, set[str]] = {}
                for mark, _ in marks:
                    _, _, ns_part, cid_part = mark.split(":", 3)
                    doomed.setdefault(unpart(ns_part), set()).add(unpart(cid_part))
                commit = Commit()
                for ns, ids in doomed.items():
                    deleted += self.rewrite_ns(commit, space, ns, not_in(ids))
                commit.writes += [Delete(space, mark) for mark, _ in marks]
                commit.writes.append(Delete(self._runs, index_key))
                self._kv.commit(commit.writes)
        return deleted

    def rewrite_ns(self, commit: Commit, space: str, ns: str, keep: Callable[[str], bool]) -> int:
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
        for (key, stored), (_, data) in zip(raw, self._values.load(space, raw), strict=True):
            ckpt = decode_checkpoint(data, f"{space}/{key}")
            if keep(ckpt.checkpoint_id):
                newest_kept = newest_kept or ckpt.checkpoint_id
                kept_versions |= {(ch, str(v)) for ch, v in ckpt.channel_versions.items()}
                continue
            dropped += 1
            self._values.drop(commit, space, key, stored)
            for wkey, wdata in self._kv.scan(
                space, prefix=keys.thread_writes_prefix(ns, ckpt.checkpoint_id)
            ):
                self._values.drop(commit, space, wkey, wdata)
        if not dropped:
            return 0
        blob_prefix = f"{keys.THREAD_BLOB_PREFIX}{keys.key_part(ns)}:"
        blobs = self._kv.scan(space, prefix=blob_prefix)
        needed = set(kept_versions)
        by_version: dict[tuple[str, str], tuple[str, bytes]] = {}
        for key, data in blobs:
            ch_part, v_part = key[len(blob_prefix) :].split(":", 1)
            by_version[(unpart(ch_part), unpart(v_part))] = (key, data)
        for ch, version in list(kept_versions):
            found = by_version.get((ch, version))
            if found is None:
                continue
            ((_, data),) = self._values.load(space, [found])
            header, _ = unframe(data, f"{space}/{found[0]}")
            needed |= {(ch, d) for d in header.get("d", ())}
        for version_key, (key, data) in by_version.items():
            if version_key not in needed:
                self._values.drop(commit, space, key, data)
        head_key = keys.thread_head_key(ns)
        if newest_kept is None:
            commit.writes.append(Delete(space, head_key))
        else:
            # A fresh token: writers that read the head before this see it changed.
            token = secrets.token_hex(8)
            commit.writes.append(Put(space, head_key, f"{newest_kept}\n{token}".encode()))
        return dropped


def not_in(ids: set[str]) -> Callable[[str], bool]:
    """Keeps the checkpoints whose id is not in ``ids``."""
    return lambda checkpoint_id: checkpoint_id not in ids


def keep_only(kept: str | None) -> Callable[[str], bool]:
    """Keeps only the checkpoint ``kept`` (none when ``None``)."""
    return lambda checkpoint_id: checkpoint_id == kept
