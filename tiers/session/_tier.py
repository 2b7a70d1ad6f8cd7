"""The session tier: a structured summary (and the raw transcript) per finished session.

**Storage.** The KV store is the truth: per user, the summaries
(``sessions_space``) and the raw transcripts (``transcripts_space``, see
:mod:`tiers.session._transcripts`). A transcript is saved on its own, before the
summary exists, so a failed summarization never loses it.

**Index.** A session is indexed as several vectors (:mod:`tiers.session._chunking`):
one for its summary, and one per overlapping window of its transcript, ids
``<tenant>/<user>/<session>`` and ``...#1``, ``...#2``. How many window
vectors a session may have in the index is kept in the KV store
(``session_vectors_space``) as an upper bound, raised *before* vectors are
added and lowered only after the extra ones are deleted, so deletion can
always find every vector: no orphans.

**Convergence.** Every change commits, in ONE KV commit, the records (or their
deletion), an *outbox* entry saying "this session's vectors may be stale", and
a new *revision* token for the user. The index is then brought in line with
the KV records and the outbox entry is removed, but only if it still holds the
token this writer put there (a newer writer's entry stays until that writer
is done). A crash anywhere leaves the entry behind, and :meth:`SessionTier.repair`
(also run when the tier is constructed) replays it, so an acknowledged summary
always ends up recallable and a deleted one never lingers in the index. With
``background=True`` the index work runs in a worker thread, batched, and a
save returns once the KV commit is durable.

**Recall.** :meth:`SessionTier.recall_relevant` ranks every session of the user
by dense similarity (best vector), BM25 over summary + transcript, and a mild
recency prior (:mod:`tiers.session._recall`). Work still queued for the user is done
first, so a caller always recalls its own acknowledged writes. What ranking
needs is cached per user and revalidated against the revision token on every
call (:mod:`tiers.session._view`).

Within one process index updates are serialised, so a slower writer can never
overwrite a newer vector with an older one.

**Parts.** :class:`SessionTier` is the public face and holds every contract
in its docstrings; it composes small objects around one store core
(:class:`~tiers.session._store.SessionStore`: stores, outbox, revisions,
views, index worker) and delegates to them:

- :mod:`tiers.session._writes`: save, replace and delete (summaries, transcripts);
- :mod:`tiers.session._reads`: stored records, listing, and recall's read path;
- :mod:`tiers.session._retention`: :meth:`SessionTier.expire`;
- :mod:`tiers.session._reindex`: :meth:`SessionTier.reindex` (:meth:`SessionTier.repair`
  is the index worker's, :mod:`tiers.session._index`).
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from datetime import datetime

from tiers.backends.base import Check, Embedder, KVStore, VectorIndex, Write
from tiers.errors import BackendUnavailableError
from tiers.models import Message, SessionSummary
from tiers.redaction import Redactor
from tiers.session._index import BATCH
from tiers.session._reads import RecalledSession, SessionReader
from tiers.session._recall import FusionWeights
from tiers.session._reindex import ReindexProgress, SessionReindexer
from tiers.session._retention import SessionExpiry
from tiers.session._store import SessionStore
from tiers.session._transcripts import TranscriptHeader
from tiers.session._windows import QUERIES
from tiers.session._writes import SessionWriter

__all__ = ["SessionTier"]


class SessionTier:
    """Session summaries and transcripts of a tenant's users, with a vector index beside them.

    Thread-safe. Construction replays index work a crash left behind
    (:meth:`repair`); if the index is unreachable then, the work stays queued
    and is retried by the next call. With ``background=True`` both run in
    threads: the replay in the index worker, and the vector index's loading
    (embedded Chroma reads its HNSW files on first use) in a recall worker, so
    the first recall after opening a large store does not pay for all of it.

    Args:
        kv: The authoritative store.
        index: The vector index; rebuilt from ``kv`` whenever they disagree.
        embedder: Turns summaries, transcript windows and queries into
            vectors. Its dimension must match the index's.
        tenant: Namespace of every key and vector this tier writes.
        background: Index in a worker thread: saves return once the KV
            commit is durable and many saves share one embedding batch. Call
            :meth:`flush` to wait for the index, :meth:`close` to stop.
        cache_users: At most this many users' recall data are kept in memory.
        cache_bytes: And about this much memory (vectors, term counts, texts).
        weights: How dense, keyword and recency signals are fused.
        on_transcript_removed: Called with ``(user_id, session_id)`` after a
            commit that deleted or replaced a session's stored transcript
            (or deleted the session), so what was derived from the content
            elsewhere (facts learned from it) can go too.
        redactor: Redacts transcripts (message text, tool-call arguments) and
            summaries before they are stored, so neither the stores, the index
            nor a summarizer reading the stored transcript ever sees what it
            removes; ``None``: nothing is redacted.

    Raises:
        InvalidInputError: A bad tenant, or an embedder that does not match the index.
    """

    def __init__(
        self,
        kv: KVStore,
        index: VectorIndex,
        embedder: Embedder,
        *,
        tenant: str = "default",
        background: bool = False,
        cache_users: int = 256,
        cache_bytes: int = 128 << 20,
        weights: FusionWeights | None = None,
        on_transcript_removed: Callable[[str, str], None] | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        self._store = SessionStore(
            kv,
            index,
            embedder,
            tenant=tenant,
            background=background,
            cache_users=cache_users,
            cache_bytes=cache_bytes,
            on_transcript_removed=on_transcript_removed,
            redactor=redactor,
        )
        self._writer = SessionWriter(self._store)
        self._reader = SessionReader(self._store, weights or FusionWeights())
        self._expiry = SessionExpiry(self._store, self._writer)
        self._reindexer = SessionReindexer(self._store)
        if background:
            # The index worker replays the outbox first; construction does not wait for it.
            # Nor for the vector index's loading, which a view-reading worker starts now so
            # the first recall need not wait for all of it (SessionReader.warm).
            self._reader.warm()
            return
        try:
            self.repair()
        except BackendUnavailableError as exc:
            self._store.indexer.postpone(exc)

    @property
    def tenant(self) -> str:
        """The tenant this tier reads and writes."""
        return self._store.tenant

    # -- writes -----------------------------------------------------------------------------------

    def save_session(
        self, summary: SessionSummary, *, transcript: TranscriptHeader | None = None
    ) -> SessionSummary:
        """Save a summary; saving the same (user, session) again replaces it.

        Replacing a summary (with a different one, no ``transcript`` given)
        replaces the session: its stored transcript, which the new summary
        does not describe, is deleted in the same commit, so neither recall
        nor resummarizing can bring the replaced content back. A session with
        a stored transcript and no summary yet keeps the transcript (the
        summary is taken as its summary).

        The summary is durable in the KV store when this returns. Its vectors
        (summary and, if a transcript is stored, transcript windows) are
        written right after, or by the worker with ``background=True``; if the
        index or embedder is down, that work stays queued and :meth:`repair`
        (run automatically later) finishes it.

        Args:
            summary: The summary.
            transcript: The header of the stored transcript the summary was
                made from (:meth:`transcript_header`). Given, the summary is
                saved only if that transcript is still the session's, in the
                same atomic commit: a summary is never stored beside a
                transcript it does not describe.

        Returns:
            The summary as stored.

        Raises:
            InvalidInputError: ``summary`` is not a :class:`SessionSummary`,
                or has another ``schema_version``.
            ValueTooLargeError: The summary is over the KV store's value limit.
            ConflictError: ``transcript`` was given and the session's
                transcript was replaced or deleted meanwhile: summarize it again.
            BackendUnavailableError: The KV store failed; nothing was saved.
        """
        return self._writer.save_session(summary, transcript=transcript)

    def transcript_checks(self, transcript: TranscriptHeader) -> list[Check]:
        """Checks that hold while ``transcript`` is still its session's stored transcript.

        For writes derived from a transcript (its summary, the facts found in
        it): committed with them, the write fails if the transcript was
        replaced or deleted meanwhile, so erasing or replacing a session
        always wins over a summary still in flight.

        Raises:
            ConflictError: The transcript was replaced or deleted already:
                summarize the session again (if it still exists).
            BackendUnavailableError: The KV store failed.
        """
        return self._writer.transcript_checks(transcript)

    def save_sessions(self, summaries: Iterable[SessionSummary]) -> list[SessionSummary]:
        """Save many summaries: embedded in batches, one index upsert per batch.

        Each summary is saved atomically; batches are committed in order, so a
        failure part-way leaves the earlier batches saved (and all of them
        valid). Within one call, a later summary for the same (user, session)
        replaces an earlier one. A summary replacing a different stored one
        deletes the session's transcript with it (see :meth:`save_session`).

        Returns:
            The summaries as stored, in input order.

        Raises:
            InvalidInputError: An item is not a :class:`SessionSummary`, or has a
                ``schema_version`` other than :data:`~tiers.models.SCHEMA_VERSION`;
                nothing was saved.
            ValueTooLargeError: A summary is over the KV store's value limit; nothing was saved.
            ConflictError: Other writers kept changing these sessions; retry.
            BackendUnavailableError: The KV store failed.
        """
        return self._writer.save_sessions(summaries)

    def save_transcript(
        self,
        user_id: str,
        session_id: str,
        messages: Sequence[Message | Mapping[str, object]],
        *,
        created_at: datetime | None = None,
        also: Sequence[Write] = (),
    ) -> TranscriptHeader:
        """Store a session's raw transcript (replacing any earlier one), before it is summarized.

        Saved on its own, so a summarizer failure never loses it: summarize
        later from :meth:`get_transcript`. Once the session also has a
        summary, its transcript is indexed (windows of it are embedded and
        its words count for keyword search).

        A summary describes one transcript: storing a different one (other
        messages or another ``created_at``) removes the session's summary in
        the same commit, so the session is pending
        (:meth:`unsummarized_sessions`) until it is summarized again, and
        neither reads nor recall ever serve a summary of a transcript that is
        gone. Storing the very same transcript again keeps the summary.

        Args:
            user_id: The user.
            session_id: The session.
            messages: OpenAI-style ``{"role", "content"}`` messages (or
                :class:`~tiers.models.Message`), oldest first.
            created_at: When the session ended; default now (a naive
                datetime is taken as UTC). Kept in the header, for summarizing
                later with the right date.
            also: More writes committed atomically with the transcript (a
                summary job, :mod:`tiers.session._jobs`): both are stored, or neither.

        Returns:
            The stored transcript's header (size, pages, checksum).

        Raises:
            InvalidInputError: A bad id, or messages that are not a non-empty
                list of valid messages; nothing was written.
            ConflictError: Other writers kept changing the session; retry.
            BackendUnavailableError: The KV store failed.
        """
        return self._writer.save_transcript(
            user_id, session_id, messages, created_at=created_at, also=also
        )

    def delete_session(self, user_id: str, session_id: str) -> bool:
        """Delete one session (summary, transcript and vectors) from the KV store and the index.

        Returns:
            Whether the session had a summary or a transcript.

        Raises:
            InvalidInputError: A bad id.
            ConflictError: Other writers kept changing the session; retry.
            BackendUnavailableError: The KV store failed; nothing was deleted.
        """
        return self._writer.delete_session(user_id, session_id)

    def delete_user_sessions(self, user_id: str) -> int:
        """Delete every session (summaries, transcripts, vectors) of a user.

        Any vector of the user the index still holds without a KV record is
        removed too.

        Returns:
            How many summaries the KV store held.

        Raises:
            InvalidInputError: A bad id.
            BackendUnavailableError: The KV store failed; nothing was deleted.
        """
        return self._writer.delete_user_sessions(user_id)

    # -- retention --------------------------------------------------------------------------------

    def expire(
        self,
        user_id: str,
        *,
        sessions_before: datetime | None,
        transcripts_before: datetime | None,
        page: int = BATCH,
    ) -> tuple[int, int]:
        """Delete the user's sessions, or only their transcripts, that ended before a cutoff.

        A session ended at its summary's ``created_at`` (a session with no
        summary yet: its transcript's). One that ended before
        ``sessions_before`` is deleted like :meth:`delete_session` (summary,
        transcript, vectors, and what it taught via ``on_transcript_removed``).
        Of one that ended before ``transcripts_before``, the stored transcript
        is deleted and the summary kept (its transcript windows leave the
        vector index and keyword search); a session without a summary is
        deleted whole, its transcript being all it holds. Summaries and
        transcripts are read ``page`` records at a time. Each deletion is
        checked against the records it was decided on: a session saved again
        meanwhile is left alone.

        Args:
            user_id: The user.
            sessions_before: Cutoff of whole sessions; ``None``: none expire.
            transcripts_before: Cutoff of transcripts; ``None``: none expire.
            page: Records read at a time.

        Returns:
            How many sessions were deleted, and how many transcripts were
            deleted from sessions that kept their summary.

        Raises:
            InvalidInputError: A bad id.
            BackendUnavailableError: The KV store failed; what was deleted so far stays deleted.
        """
        return self._expiry.expire(
            user_id,
            sessions_before=sessions_before,
            transcripts_before=transcripts_before,
            page=page,
        )

    # The retention race tests drive the two checked deletions below directly.

    def _delete_session(
        self,
        user_id: str,
        session_id: str,
        *,
        expected: tuple[bytes | None, bytes | None] | None = None,
    ) -> bool:
        """:meth:`delete_session`, only while the session holds ``expected`` (summary, header)."""
        return self._writer.delete(user_id, session_id, expected=expected)

    def _drop_transcript(
        self, user_id: str, header: TranscriptHeader, raw_header: bytes, summary: bytes
    ) -> bool:
        """Drop a session's transcript and keep its summary, if both are still as read."""
        return self._expiry.drop_transcript(user_id, header, raw_header, summary)

    # -- index maintenance ------------------------------------------------------------------------

    def repair(self) -> int:
        """Bring the index in line with the KV store for every session with queued work.

        Safe to run at any time, from any number of processes.

        Returns:
            How many queued sessions were processed.

        Raises:
            BackendUnavailableError: The KV store, index or embedder failed;
                the work stays queued.
        """
        return self._store.indexer.repair()

    def reindex(
        self,
        user_ids: Iterable[str] | None = None,
        *,
        progress: Callable[[ReindexProgress], None] | None = None,
        batch_size: int = BATCH,
    ) -> int:
        """Rebuild the index from the KV store: re-embed every session, drop what has no record.

        For a changed chunking or a damaged index; the KV store is not
        changed. Recall keeps working meanwhile (each session's vectors are
        replaced in place).

        Args:
            user_ids: Users to rebuild; ``None`` for every user of the tenant.
            progress: Called after each batch with the sessions done and the total.
            batch_size: Sessions per embedding batch.

        Returns:
            How many sessions were processed.

        Raises:
            InvalidInputError: A bad user id or batch size.
            BackendUnavailableError: The KV store, index or embedder failed;
                sessions not yet processed are unchanged (run it again).
        """
        return self._reindexer.reindex(user_ids, progress=progress, batch_size=batch_size)

    def flush(self, timeout: float | None = None, *, windows: bool = True) -> bool:
        """Wait until every index update queued so far is done.

        Args:
            timeout: Seconds to wait at most; ``None``: no limit.
            windows: Wait until every window is indexed too; ``False``: until
                every session is searchable by its base vector (the summary's
                first window) and keywords (background indexing does the other
                windows in a second pass).

        Returns:
            True when nothing is left queued; False on timeout, or when work is
            left for a later repair (e.g. the index is down).
        """
        return self._store.indexer.flush(timeout, windows=windows)

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the background worker after it finishes what is queued (up to ``timeout``).

        Work not done by then stays in the KV outbox and is replayed by the
        next tier opened on this store. The threads reading cold recalls'
        views stop too (later recalls read in the caller). Does not close the
        stores. Idempotent.
        """
        started = time.monotonic()
        self._reader.close(timeout)
        left = None if timeout is None else max(0.0, timeout - (time.monotonic() - started))
        self._store.indexer.close(left)

    # -- reads ------------------------------------------------------------------------------------

    def get_session(self, user_id: str, session_id: str) -> SessionSummary:
        """Read one stored summary.

        Raises:
            InvalidInputError: A bad id.
            SessionNotFoundError: The user has no such session.
            CorruptRecordError: The stored record is not a valid summary.
        """
        return self._reader.get_session(user_id, session_id)

    def transcript_header(self, user_id: str, session_id: str) -> TranscriptHeader:
        """Describe a session's stored transcript (size, messages, checksum, ``created_at``).

        Raises:
            InvalidInputError: A bad id.
            SessionNotFoundError: No transcript is stored for the session.
            CorruptRecordError: The stored header is damaged.
        """
        return self._reader.transcript_header(user_id, session_id)

    def get_transcript(self, user_id: str, session_id: str) -> list[Message]:
        """Read a session's stored transcript.

        Raises:
            InvalidInputError: A bad id.
            SessionNotFoundError: No transcript is stored for the session.
            CorruptRecordError: The stored transcript is damaged.
        """
        return self._reader.get_transcript(user_id, session_id)

    def user_ids(self) -> list[str]:
        """Every user of the tenant with anything stored (sessions or facts), sorted."""
        return self._store.user_ids()

    def unsummarized_sessions(self, user_id: str) -> list[str]:
        """Sessions of the user with a stored transcript but no summary (e.g. summarizing failed).

        Raises:
            InvalidInputError: A bad id.
        """
        return self._reader.unsummarized_sessions(user_id)

    def list_sessions(self, user_id: str, limit: int | None = None) -> list[SessionSummary]:
        """A user's summaries, newest first by ``created_at``.

        Args:
            user_id: The user.
            limit: At most this many; ``None`` for all.

        Raises:
            InvalidInputError: A bad id or a negative limit.
            CorruptRecordError: A stored record (among those returned) is not a valid summary.
        """
        return self._reader.list_sessions(user_id, limit)

    def recall_relevant(
        self, user_id: str, query: str, top_k: int = 5, *, now: datetime | None = None
    ) -> list[RecalledSession]:
        """The user's sessions most relevant to ``query``, best first.

        Every session of this tenant's user (and nobody else's) is scored by
        dense similarity, BM25 keyword match over summary and transcript, and
        recency (see :mod:`tiers.session._recall`); a query naming a time ("last
        March", "two weeks ago") favours the sessions of that time
        (:mod:`tiers.session._temporal`). Index work still queued for the
        user is finished first, so acknowledged saves are always recalled.

        Args:
            user_id: The user.
            query: What to look for, in natural language.
            top_k: How many sessions to return at most, 1..100.
            now: When the query is asked, for dates relative to it ("yesterday");
                default: the current time.

        Raises:
            InvalidInputError: A bad id, an empty or over-long query, top_k out of
                range, or ``now`` not a datetime.
            CorruptRecordError: A matching stored record is not a valid summary.
            BackendUnavailableError: The KV store, index or embedder failed.
        """
        with QUERIES.query():  # the transcript-windows pass gives way meanwhile (._windows)
            return self._reader.recall(user_id, query, top_k, now)
