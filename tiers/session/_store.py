"""The store core every part of the session tier shares: stores, key spaces, outbox, views.

:class:`SessionStore` holds what the tier's parts (:mod:`tiers.session._writes`,
:mod:`tiers.session._reads`, :mod:`tiers.session._retention`,
:mod:`tiers.session._reindex`) have in common: the KV store (the truth), the
vector index and embedder, the index worker (:mod:`tiers.session._index`)
and the per-user view cache (:mod:`tiers.session._view`). It also writes the
two records every change commits beside its own: an outbox entry per
session whose vectors may be stale, and a new revision token for the user
(see :mod:`tiers.session._tier` for why).
"""

from __future__ import annotations

import uuid
from collections.abc import Callable, Iterable

from tiers import keys
from tiers.backends.base import Embedder, KVStore, Put, VectorIndex, Write
from tiers.errors import InvalidInputError
from tiers.ids import check_id
from tiers.redaction import OFF, Redactor
from tiers.session._index import Ref, SessionIndexer
from tiers.session._view import UserView, ViewCache, build_view

__all__ = ["SessionStore"]


class SessionStore:
    """The session tier's stores, index worker and view cache, shared by its parts.

    Args:
        kv: The authoritative store.
        index: The vector index.
        embedder: Makes the vectors; its dimension must match the index's.
        tenant: Namespace of every key and vector.
        background: Index in a worker thread (see :class:`~tiers.session.SessionTier`).
        cache_users: At most this many users' views are cached.
        cache_bytes: And about this much memory.
        on_transcript_removed: Called with ``(user_id, session_id)`` after a
            commit that removed a session's transcript.
        redactor: Redacts what is stored; ``None``: nothing is.

    Attributes:
        kv: The authoritative store.
        index: The vector index.
        embedder: The embedder.
        tenant: The tenant.
        redactor: The redactor (:data:`~tiers.redaction.OFF` when none was given).
        revisions: The KV space of each user's revision token.
        views: Per-user views for recall and listing.
        indexer: Brings the index in line with the KV store.

    Raises:
        InvalidInputError: A bad tenant, or an embedder that does not match the index.
    """

    def __init__(
        self,
        kv: KVStore,
        index: VectorIndex,
        embedder: Embedder,
        *,
        tenant: str,
        background: bool,
        cache_users: int,
        cache_bytes: int,
        on_transcript_removed: Callable[[str, str], None] | None,
        redactor: Redactor | None,
    ) -> None:
        self.kv = kv
        self.redactor = redactor if redactor is not None else OFF
        self._on_transcript_removed = on_transcript_removed
        self.index = index
        self.embedder = embedder
        self.tenant = check_id(tenant, "tenant")
        index_dimension = getattr(index, "dimension", None)
        if isinstance(index_dimension, int) and index_dimension != embedder.dimension:
            raise InvalidInputError(
                f"the vector index holds {index_dimension}-dimensional vectors but embedder "
                f"{embedder.name!r} makes {embedder.dimension}: open the index with this embedder",
                field="embedder",
            )
        self._outbox = keys.session_outbox_space(self.tenant)
        self.revisions = keys.session_revisions_space(self.tenant)
        self.views = ViewCache(cache_users, cache_bytes)
        self.indexer = SessionIndexer(
            kv,
            index,
            embedder,
            tenant=self.tenant,
            on_indexed=self.views.outdate,
            background=background,
        )

    def sessions_space(self, user_id: str) -> str:
        """The KV space of the user's summaries (key: session id)."""
        return keys.sessions_space(self.tenant, user_id)

    def transcripts_space(self, user_id: str) -> str:
        """The KV space of the user's transcripts (headers and pages)."""
        return keys.transcripts_space(self.tenant, user_id)

    def vectors_space(self, user_id: str) -> str:
        """The KV space bounding how many window vectors each session of the user has."""
        return keys.session_vectors_space(self.tenant, user_id)

    def terms_space(self, user_id: str) -> str:
        """The KV space of the user's per-session term counts (:mod:`tiers.session._terms`)."""
        return keys.session_terms_space(self.tenant, user_id)

    def user_ids(self) -> list[str]:
        """Every user of the tenant with anything stored (sessions or facts), sorted."""
        return [key for key, _ in self.kv.scan(keys.users_space(self.tenant))]

    @staticmethod
    def new_token() -> bytes:
        """A fresh token for one commit's outbox entries and revisions."""
        return uuid.uuid4().hex.encode()

    def mark_stale(self, user_id: str, session_id: str, token: bytes) -> Put:
        """The outbox entry saying the session's vectors may be stale (part of the change)."""
        return Put(self._outbox, keys.session_outbox_key(user_id, session_id), token)

    def new_revision(self, user_id: str, token: bytes) -> Put:
        """The write giving the user a new revision, so every cached view of it is rebuilt."""
        return Put(self.revisions, user_id, token)

    def touch_users(self, user_ids: Iterable[str], token: bytes) -> list[Write]:
        """Writes listing each user as one with data, with a new revision."""
        writes: list[Write] = []
        for user_id in dict.fromkeys(user_ids):
            writes.append(Put(keys.users_space(self.tenant), user_id, b"1"))
            writes.append(self.new_revision(user_id, token))
        return writes

    def index_later(self, refs: list[Ref]) -> None:
        """After a commit: outdate the sessions' views and bring the sessions' vectors in line."""
        self.views.changed(refs)
        self.indexer.submit(refs)

    def transcript_removed(self, user_id: str, session_id: str) -> None:
        """After a commit that removed a session's transcript: drop the vectors kept of embedded
        texts (the transcript's windows among them), tell ``on_transcript_removed``."""
        self.indexer.forget_embedded()
        if self._on_transcript_removed is not None:
            self._on_transcript_removed(user_id, session_id)

    def view(self, user_id: str, *, settle: bool = False) -> UserView:
        """The user's current view; with ``settle``, queued index work of the user is done first."""
        (revision,) = self.kv.get_many(self.revisions, [user_id])
        if settle:
            # After the revision read: work committed before it shows up here (same commit).
            queued = self.indexer.queued(user_id)
            if queued:
                self.indexer.sync(queued)
                if self.indexer.queued(user_id):
                    # Not settled (an outage or a busy writer): answer from a fresh, uncached view.
                    basis = self.views.basis(user_id)
                    return build_view(self.kv, self.tenant, user_id, revision, basis)
        view, generation = self.views.get(user_id, revision)
        if view is None:
            # Incremental: what the previous view counted for unchanged sessions is reused.
            basis = self.views.basis(user_id)
            view = build_view(self.kv, self.tenant, user_id, revision, basis)
            self.views.put(user_id, view, generation)
        return view
