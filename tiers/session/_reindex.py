"""Rebuilding the session tier's vector index from the KV store.

:class:`SessionReindexer` re-embeds every session of the chosen users and
drops the vectors that have no record, through the index worker
(:mod:`tiers.session._index`), which also owns the other repair: replaying
the outbox a crash left behind. The contract is documented on
:meth:`SessionTier.reindex <tiers.session.SessionTier.reindex>`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tiers.errors import InvalidInputError
from tiers.ids import check_id
from tiers.session._index import Ref
from tiers.session._store import SessionStore

__all__ = ["ReindexProgress", "SessionReindexer"]


@dataclass(frozen=True, slots=True)
class ReindexProgress:
    """Progress of :meth:`SessionTier.reindex`, passed to its callback after each batch.

    Attributes:
        done: Sessions processed so far.
        total: Sessions to process.
        user_id: The user of the last batch.
    """

    done: int
    total: int
    user_id: str


class SessionReindexer:
    """Rebuilds users' vectors from their KV records.

    Args:
        store: The store core it reads and indexes through.
    """

    def __init__(self, store: SessionStore) -> None:
        self._store = store

    def reindex(
        self,
        user_ids: Iterable[str] | None,
        *,
        progress: Callable[[ReindexProgress], None] | None,
        batch_size: int,
    ) -> int:
        """Re-embed every session of the users (``None``: all), a batch at a time; how many."""
        if batch_size < 1:
            raise InvalidInputError("batch_size must be at least 1", field="batch_size")
        if user_ids is None:
            users = self._store.user_ids()
        else:
            users = [check_id(user, "user_id") for user in user_ids]
        work = [(user_id, self._sessions_of(user_id)) for user_id in users]
        total = sum(len(refs) for _, refs in work)
        done = 0
        for user_id, refs in work:
            self._store.indexer.drop_strays(user_id)
            for start in range(0, len(refs), batch_size):
                batch = refs[start : start + batch_size]
                self._store.indexer.rebuild(batch)
                done += len(batch)
                if progress is not None:
                    progress(ReindexProgress(done=done, total=total, user_id=user_id))
        return done

    def _sessions_of(self, user_id: str) -> list[Ref]:
        """Every session of the user with a summary or vectors, sorted by id."""
        kv = self._store.kv
        session_ids = {key for key, _ in kv.scan(self._store.sessions_space(user_id))}
        session_ids.update(key for key, _ in kv.scan(self._store.vectors_space(user_id)))
        return [(user_id, sid) for sid in sorted(session_ids)]
