"""The session tier: one structured summary per finished session, recallable by meaning.

The KV store is the truth; the vector index is derived from it and converges
to it. Every change commits, in ONE KV commit, the summary record (or its
deletion) together with an *outbox* entry saying "this session's vector may be
stale". The index is then brought in line with the KV record and the outbox
entry is removed, but only if it still holds the token this writer put there
(a newer writer's entry stays until that writer is done). A crash anywhere
leaves the entry behind, and :meth:`SessionTier.repair` (also run when the tier
is constructed) replays it, so an acknowledged summary always ends up
recallable and a deleted one never lingers in the index.

Within one process index updates are serialised, so a slower writer can never
overwrite a newer vector with an older one.
"""

from __future__ import annotations

import logging
import threading
import uuid
from collections.abc import Iterable, Sequence
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from tiers import keys
from tiers.backends.base import (
    Check,
    Delete,
    DeleteSpace,
    Embedder,
    KVStore,
    Put,
    VectorIndex,
    VectorItem,
    Write,
)
from tiers.codec import decode, encode
from tiers.errors import (
    BackendUnavailableError,
    ConflictError,
    CorruptRecordError,
    InvalidInputError,
    SessionNotFoundError,
    ValueTooLargeError,
)
from tiers.ids import check_id
from tiers.models import MAX_TEXT, SessionSummary

__all__ = ["RecalledSession", "SessionSummary", "SessionTier"]

logger = logging.getLogger(__name__)

MAX_TOP_K = 100
_CHUNK = 256  # summaries per KV commit / index upsert in batch saves
_SYNC_ATTEMPTS = 5
_OVERFETCH = 10  # extra index hits asked for, in case some KV records are gone

Ref = tuple[str, str]  # (user_id, session_id)


class RecalledSession(BaseModel):
    """A session returned by :meth:`SessionTier.recall_relevant`.

    Attributes:
        summary: The stored summary, read from the KV store.
        score: Cosine similarity between the query and the summary, in
            [-1, 1]; higher is more relevant.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    summary: SessionSummary
    score: Annotated[float, Field(ge=-1.0, le=1.0)]


class SessionTier:
    """Session summaries of a tenant's users, in a KV store with a vector index beside it.

    Thread-safe. Construction replays index work a crash left behind
    (:meth:`repair`); if the index is unreachable then, the work stays queued
    and is retried by the next call.

    Args:
        kv: The authoritative store.
        index: The vector index; rebuilt from ``kv`` whenever they disagree.
        embedder: Turns summaries and queries into vectors. Its dimension must
            match the index's.
        tenant: Namespace of every key and vector this tier writes.

    Raises:
        InvalidInputError: A bad tenant, or an embedder that does not match the index.
    """

    def __init__(
        self, kv: KVStore, index: VectorIndex, embedder: Embedder, *, tenant: str = "default"
    ) -> None:
        self._kv = kv
        self._index = index
        self._embedder = embedder
        self._tenant = check_id(tenant, "tenant")
        index_dimension = getattr(index, "dimension", None)
        if isinstance(index_dimension, int) and index_dimension != embedder.dimension:
            raise InvalidInputError(
                f"the vector index holds {index_dimension}-dimensional vectors but embedder "
                f"{embedder.name!r} makes {embedder.dimension}: open the index with this embedder",
                field="embedder",
            )
        self._outbox = keys.session_outbox_space(self._tenant)
        self._sync_lock = threading.Lock()
        self._needs_repair = threading.Event()
        try:
            self.repair()
        except BackendUnavailableError as exc:
            logger.warning("session index repair postponed: %s", exc)
            self._needs_repair.set()

    @property
    def tenant(self) -> str:
        """The tenant this tier reads and writes."""
        return self._tenant

    # -- writes -------------------------------------------------------------------------------

    def save_session(self, summary: SessionSummary) -> SessionSummary:
        """Save a summary; saving the same (user, session) again replaces it.

        The summary is durable in the KV store when this returns. Its vector
        is written right after; if the index or embedder is down, that work
        stays queued and :meth:`repair` (run automatically later) finishes it.

        Returns:
            The summary as stored.

        Raises:
            InvalidInputError: ``summary`` is not a :class:`SessionSummary`.
            ValueTooLargeError: The summary is over the KV store's value limit.
            BackendUnavailableError: The KV store failed; nothing was saved.
        """
        return self.save_sessions([summary])[0]

    def save_sessions(self, summaries: Iterable[SessionSummary]) -> list[SessionSummary]:
        """Save many summaries: embedded in batches, one index upsert per batch.

        Each summary is saved atomically; batches are committed in order, so a
        failure part-way leaves the earlier batches saved (and all of them
        valid). Within one call, a later summary for the same (user, session)
        replaces an earlier one.

        Returns:
            The summaries as stored, in input order.

        Raises:
            InvalidInputError: An item is not a :class:`SessionSummary`; nothing was saved.
            ValueTooLargeError: A summary is over the KV store's value limit; nothing was saved.
            BackendUnavailableError: The KV store failed.
        """
        items = list(summaries)
        encoded: list[bytes] = []
        for position, summary in enumerate(items):
            if not isinstance(summary, SessionSummary):
                raise InvalidInputError(
                    f"summaries[{position}] must be a SessionSummary, got {type(summary).__name__}",
                    field="summary",
                )
            check_id(summary.user_id, "user_id")
            check_id(summary.session_id, "session_id")
            data = encode(summary)
            if len(data) > self._kv.max_value_bytes:
                raise ValueTooLargeError(
                    f"session {summary.session_id!r} of user {summary.user_id!r} is {len(data)} "
                    f"bytes, over the store's limit of {self._kv.max_value_bytes}: shorten it",
                    field="summary",
                )
            encoded.append(data)
        self._repair_if_needed()
        latest: dict[Ref, tuple[SessionSummary, bytes]] = {}
        for summary, data in zip(items, encoded, strict=True):
            latest[(summary.user_id, summary.session_id)] = (summary, data)
        pending = list(latest.items())
        for start in range(0, len(pending), _CHUNK):
            self._save_chunk(dict(pending[start : start + _CHUNK]))
        return items

    def _save_chunk(self, chunk: dict[Ref, tuple[SessionSummary, bytes]]) -> None:
        token = self._token()
        writes: list[Write] = []
        for (user_id, session_id), (_, data) in chunk.items():
            writes.append(Put(keys.sessions_space(self._tenant, user_id), session_id, data))
            writes.append(Put(self._outbox, keys.session_outbox_key(user_id, session_id), token))
        for user_id in dict.fromkeys(user for user, _ in chunk):
            writes.append(Put(keys.users_space(self._tenant), user_id, b"1"))
        self._kv.commit(writes)
        # Acknowledged from here on: everything below only brings the index in line.
        try:
            vectors = self._embedder.embed([summary.render() for summary, _ in chunk.values()])
        except BackendUnavailableError as exc:
            self._postpone(exc)
            return
        prepared = {
            ref: (data, vector)
            for (ref, (_, data)), vector in zip(chunk.items(), vectors, strict=True)
        }
        self._settle(list(chunk), prepared)

    def delete_session(self, user_id: str, session_id: str) -> bool:
        """Delete one session summary from the KV store and the index.

        Returns:
            Whether the summary existed.

        Raises:
            InvalidInputError: A bad id.
            BackendUnavailableError: The KV store failed; nothing was deleted.
        """
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        space = keys.sessions_space(self._tenant, user_id)
        (existing,) = self._kv.get_many(space, [session_id])
        self._kv.commit(
            [
                Delete(space, session_id),
                Put(self._outbox, keys.session_outbox_key(user_id, session_id), self._token()),
            ]
        )
        self._settle([(user_id, session_id)], {})
        return existing is not None

    def delete_user_sessions(self, user_id: str) -> int:
        """Delete every session summary of a user, from the KV store and the index.

        Any vector of the user the index still holds without a KV record is
        removed too.

        Returns:
            How many summaries the KV store held.

        Raises:
            InvalidInputError: A bad id.
            BackendUnavailableError: The KV store failed; nothing was deleted.
        """
        check_id(user_id, "user_id")
        space = keys.sessions_space(self._tenant, user_id)
        session_ids = [key for key, _ in self._kv.scan(space)]
        token = self._token()
        writes: list[Write] = [DeleteSpace(space)]
        writes.extend(
            Put(self._outbox, keys.session_outbox_key(user_id, sid), token) for sid in session_ids
        )
        self._kv.commit(writes)
        refs: list[Ref] = [(user_id, sid) for sid in session_ids]
        try:
            refs.extend(self._indexed_refs(user_id))
        except BackendUnavailableError as exc:
            self._postpone(exc)
            return len(session_ids)
        self._settle(refs, {})
        return len(session_ids)

    def repair(self) -> int:
        """Bring the index in line with the KV store for every session with queued work.

        Safe to run at any time, from any number of processes.

        Returns:
            How many queued sessions were processed.

        Raises:
            BackendUnavailableError: The KV store, index or embedder failed;
                the work stays queued.
        """
        entries = self._kv.scan(self._outbox)
        refs: list[Ref] = []
        for key, _ in entries:
            user_id, _, session_id = key.partition("/")
            if user_id and session_id:
                refs.append((user_id, session_id))
        for start in range(0, len(refs), _CHUNK):
            self._sync(refs[start : start + _CHUNK], {})
        self._needs_repair.clear()
        if refs:
            logger.info("session index repair processed %d queued session(s)", len(refs))
        return len(refs)

    # -- reads --------------------------------------------------------------------------------

    def get_session(self, user_id: str, session_id: str) -> SessionSummary:
        """Read one stored summary.

        Raises:
            InvalidInputError: A bad id.
            SessionNotFoundError: The user has no such session.
            CorruptRecordError: The stored record is not a valid summary.
        """
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        space = keys.sessions_space(self._tenant, user_id)
        (data,) = self._kv.get_many(space, [session_id])
        if data is None:
            raise SessionNotFoundError(f"user {user_id!r} has no session {session_id!r}")
        return decode(SessionSummary, data, where=f"{space}/{session_id}")

    def list_sessions(self, user_id: str, limit: int | None = None) -> list[SessionSummary]:
        """A user's summaries, newest first by ``created_at``.

        Args:
            user_id: The user.
            limit: At most this many; ``None`` for all.

        Raises:
            InvalidInputError: A bad id or a negative limit.
            CorruptRecordError: A stored record is not a valid summary.
        """
        check_id(user_id, "user_id")
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 0
        ):
            raise InvalidInputError("limit must be a non-negative integer or None", field="limit")
        space = keys.sessions_space(self._tenant, user_id)
        summaries = [
            decode(SessionSummary, data, where=f"{space}/{key}")
            for key, data in self._kv.scan(space)
        ]
        summaries.sort(key=lambda s: (s.created_at, s.session_id), reverse=True)
        return summaries if limit is None else summaries[:limit]

    def recall_relevant(self, user_id: str, query: str, top_k: int = 5) -> list[RecalledSession]:
        """The user's sessions most relevant to ``query``, best first.

        Only this tenant's and this user's sessions are searched. Hits whose
        KV record is gone (a delete not yet reflected in the index) are skipped.

        Args:
            user_id: The user.
            query: What to look for, in natural language.
            top_k: How many sessions to return at most, 1..100.

        Raises:
            InvalidInputError: A bad id, an empty or over-long query, or top_k out of range.
            CorruptRecordError: A matching stored record is not a valid summary.
            BackendUnavailableError: The KV store, index or embedder failed.
        """
        check_id(user_id, "user_id")
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError("query must be a non-empty string", field="query")
        if len(query) > MAX_TEXT:
            raise InvalidInputError(
                f"query is {len(query)} characters, over the limit of {MAX_TEXT}", field="query"
            )
        if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= MAX_TOP_K:
            raise InvalidInputError(
                f"top_k must be an integer from 1 to {MAX_TOP_K}", field="top_k"
            )
        self._repair_if_needed()
        (vector,) = self._embedder.embed([query])
        hits = self._index.query(vector, where=self._user_filter(user_id), top_k=top_k + _OVERFETCH)
        wanted: dict[str, float] = {}
        for hit in hits:
            # The filter already restricts to this user; checking again costs nothing.
            if hit.metadata.get("tenant") != self._tenant or hit.metadata.get("user_id") != user_id:
                continue
            session_id = hit.metadata.get("session_id")
            if isinstance(session_id, str) and session_id not in wanted:
                wanted[session_id] = max(-1.0, min(1.0, 1.0 - hit.distance))
        space = keys.sessions_space(self._tenant, user_id)
        session_ids = list(wanted)
        results: list[RecalledSession] = []
        for session_id, data in zip(
            session_ids, self._kv.get_many(space, session_ids), strict=True
        ):
            if data is None:
                continue
            summary = decode(SessionSummary, data, where=f"{space}/{session_id}")
            results.append(RecalledSession(summary=summary, score=wanted[session_id]))
            if len(results) == top_k:
                break
        return results

    # -- index synchronisation ----------------------------------------------------------------

    def _user_filter(self, user_id: str) -> dict[str, str]:
        return {"tenant": self._tenant, "user_id": user_id}

    def _indexed_refs(self, user_id: str) -> list[Ref]:
        prefix = keys.session_vector_id(self._tenant, user_id, "")
        return [
            (user_id, vector_id[len(prefix) :])
            for vector_id in self._index.ids(where=self._user_filter(user_id))
            if vector_id.startswith(prefix) and len(vector_id) > len(prefix)
        ]

    @staticmethod
    def _token() -> bytes:
        return uuid.uuid4().hex.encode()

    def _postpone(self, exc: BaseException) -> None:
        logger.warning("session index update postponed, queued for repair: %s", exc)
        self._needs_repair.set()

    def _repair_if_needed(self) -> None:
        if not self._needs_repair.is_set():
            return
        try:
            self.repair()
        except BackendUnavailableError as exc:
            logger.warning("session index repair failed again, will retry: %s", exc)

    def _settle(self, refs: list[Ref], prepared: dict[Ref, tuple[bytes, list[float]]]) -> None:
        """Sync after a committed write; an index outage leaves the work queued, not an error."""
        try:
            self._sync(refs, prepared)
        except BackendUnavailableError as exc:
            self._postpone(exc)

    def _sync(self, refs: Sequence[Ref], prepared: dict[Ref, tuple[bytes, list[float]]]) -> None:
        """Make the index match the KV store for ``refs``, then clear their outbox entries."""
        pending = list(dict.fromkeys(refs))
        with self._sync_lock:
            for _ in range(_SYNC_ATTEMPTS):
                if not pending:
                    return
                pending = self._sync_once(pending, prepared)
        if pending:
            # Other writers kept re-queueing these; their own sync (or repair) finishes them.
            logger.info("%d session(s) left queued for the next repair", len(pending))

    def _sync_once(
        self, refs: list[Ref], prepared: dict[Ref, tuple[bytes, list[float]]]
    ) -> list[Ref]:
        outbox_keys = [keys.session_outbox_key(user, sid) for user, sid in refs]
        # Tokens are read before records: a record read later is at least as new as its token.
        tokens = self._kv.get_many(self._outbox, outbox_keys)
        records = self._read_records(refs)
        upserts: list[tuple[Ref, SessionSummary, bytes]] = []
        removals: list[str] = []
        for ref in refs:
            user_id, session_id = ref
            data = records[ref]
            summary = None
            if data is not None:
                space = keys.sessions_space(self._tenant, user_id)
                try:
                    summary = decode(SessionSummary, data, where=f"{space}/{session_id}")
                except CorruptRecordError as exc:
                    # Unindexable; reading it still raises. A re-save indexes it again.
                    logger.error("not indexing a corrupt session record: %s", exc)
            if summary is None or data is None:
                removals.append(keys.session_vector_id(self._tenant, user_id, session_id))
            else:
                upserts.append((ref, summary, data))
        self._index_records(upserts, prepared)
        if removals:
            self._index.delete(removals)
        return self._clear(refs, outbox_keys, tokens)

    def _read_records(self, refs: list[Ref]) -> dict[Ref, bytes | None]:
        by_user: dict[str, list[str]] = {}
        for user_id, session_id in refs:
            by_user.setdefault(user_id, []).append(session_id)
        records: dict[Ref, bytes | None] = {}
        for user_id, session_ids in by_user.items():
            values = self._kv.get_many(keys.sessions_space(self._tenant, user_id), session_ids)
            for session_id, value in zip(session_ids, values, strict=True):
                records[(user_id, session_id)] = value
        return records

    def _index_records(
        self,
        upserts: list[tuple[Ref, SessionSummary, bytes]],
        prepared: dict[Ref, tuple[bytes, list[float]]],
    ) -> None:
        if not upserts:
            return
        vectors: dict[int, list[float]] = {}
        missing: list[int] = []
        for position, (ref, _, data) in enumerate(upserts):
            ready = prepared.get(ref)
            # A vector computed before this read is only reusable for the very same record.
            if ready is not None and ready[0] == data:
                vectors[position] = ready[1]
            else:
                missing.append(position)
        if missing:
            fresh = self._embedder.embed([upserts[i][1].render() for i in missing])
            vectors.update(zip(missing, fresh, strict=True))
        items = [
            VectorItem(
                id=keys.session_vector_id(self._tenant, user_id, session_id),
                embedding=vectors[position],
                document=summary.render(),
                metadata={
                    "tenant": self._tenant,
                    "user_id": user_id,
                    "session_id": session_id,
                    "created_at": summary.created_at.timestamp(),
                    "created_at_iso": summary.created_at.isoformat(),
                },
            )
            for position, ((user_id, session_id), summary, _) in enumerate(upserts)
        ]
        self._index.upsert(items)

    def _clear(
        self, refs: list[Ref], outbox_keys: list[str], tokens: list[bytes | None]
    ) -> list[Ref]:
        """Remove the outbox entries still holding the tokens read; return refs re-queued since."""
        held = [
            (ref, key, token)
            for ref, key, token in zip(refs, outbox_keys, tokens, strict=True)
            if token is not None
        ]
        if not held:
            return []
        try:
            self._kv.commit(
                [Delete(self._outbox, key) for _, key, _ in held],
                [Check(self._outbox, key, token) for _, key, token in held],
            )
            return []
        except ConflictError:
            pass
        # Someone re-queued some of them meanwhile: clear the rest one by one, redo those.
        requeued: list[Ref] = []
        for ref, key, token in held:
            try:
                self._kv.commit([Delete(self._outbox, key)], [Check(self._outbox, key, token)])
            except ConflictError:
                requeued.append(ref)
        return requeued
