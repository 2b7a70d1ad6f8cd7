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
"""

from __future__ import annotations

import logging
import uuid
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from tiers import cas, keys
from tiers.backends.base import (
    Check,
    Delete,
    DeleteSpace,
    Embedder,
    KVStore,
    Put,
    VectorIndex,
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
from tiers.models import (
    MAX_MESSAGE_TEXT,
    MAX_TEXT,
    SCHEMA_VERSION,
    Message,
    SessionSummary,
    utcnow,
)
from tiers.redaction import OFF, Redactor
from tiers.session._index import BATCH, Ref, SessionIndexer, users_of
from tiers.session._recall import FusionWeights, fuse
from tiers.session._transcripts import (
    TranscriptHeader,
    decode_header,
    decode_transcript,
    delete_writes,
    header_key,
    is_header_key,
    page_key,
    parse_messages,
    read_header,
    transcript_writes,
)
from tiers.session._view import UserView, ViewCache, build_view
from tiers.values import check_datetime

__all__ = [
    "MAX_TOP_K",
    "RecalledSession",
    "ReindexProgress",
    "SessionSummary",
    "SessionTier",
    "check_top_k",
]

logger = logging.getLogger(__name__)

MAX_TOP_K = 100


def _redact_messages(messages: list[Message], redactor: Redactor) -> list[Message]:
    """Messages with their text and tool-call arguments redacted (names and ids are kept)."""
    if not redactor.enabled:
        return messages
    out: list[Message] = []
    for message in messages:
        update: dict[str, object] = {}
        if (content := redactor.redact(message.content)) != message.content:
            update["content"] = content[:MAX_MESSAGE_TEXT]
        calls = tuple(
            call.model_copy(update={"arguments": args[:MAX_MESSAGE_TEXT]})
            if (args := redactor.redact(call.arguments)) != call.arguments
            else call
            for call in message.tool_calls
        )
        if any(new is not old for new, old in zip(calls, message.tool_calls, strict=True)):
            update["tool_calls"] = calls
        out.append(message.model_copy(update=update) if update else message)
    return out


def check_top_k(top_k: object) -> int:
    """``top_k`` if it is an integer from 1 to :data:`MAX_TOP_K` (not a bool).

    Raises:
        InvalidInputError: Anything else; ``field`` is ``top_k``.
    """
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= MAX_TOP_K:
        raise InvalidInputError(
            f"top_k must be an integer from 1 to {MAX_TOP_K}, got {top_k!r}", field="top_k"
        )
    return top_k


class RecalledSession(BaseModel):
    """A session returned by :meth:`SessionTier.recall_relevant`.

    Attributes:
        summary: The stored summary, read from the KV store.
        score: Fused relevance in [0, 1] (dense similarity, keyword match and
            recency, see :mod:`tiers.session._recall`); higher is more relevant.
        similarity: Best cosine similarity between the query and the
            session's vectors (summary or a transcript window), or ``None``
            when the session is not indexed yet.
        keyword: The session's BM25 score relative to the query's best
            keyword match, in [0, 1].
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    summary: SessionSummary
    score: Annotated[float, Field(ge=-1.0, le=1.0)]
    similarity: Annotated[float, Field(ge=-1.0, le=1.0)] | None = None
    keyword: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0


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


class SessionTier:
    """Session summaries and transcripts of a tenant's users, with a vector index beside them.

    Thread-safe. Construction replays index work a crash left behind
    (:meth:`repair`); if the index is unreachable then, the work stays queued
    and is retried by the next call.

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
        self._kv = kv
        self._redactor = redactor if redactor is not None else OFF
        self._on_transcript_removed = on_transcript_removed
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
        self._weights = weights or FusionWeights()
        self._outbox = keys.session_outbox_space(self._tenant)
        self._revisions = keys.session_revisions_space(self._tenant)
        self._views = ViewCache(cache_users, cache_bytes)
        self._indexer = SessionIndexer(
            kv,
            index,
            embedder,
            tenant=self._tenant,
            on_indexed=self._views.invalidate,
            background=background,
        )
        if background:
            return  # the worker replays the outbox first; construction does not wait for it
        try:
            self.repair()
        except BackendUnavailableError as exc:
            self._indexer.postpone(exc)

    @property
    def tenant(self) -> str:
        """The tenant this tier reads and writes."""
        return self._tenant

    # -- writes -------------------------------------------------------------------------------

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
        if transcript is None:
            return self.save_sessions([summary])[0]
        summary = self._redacted(summary)
        (data,) = self._encode([summary])
        user_id, session_id = summary.user_id, summary.session_id
        if (transcript.user_id, transcript.session_id) != (user_id, session_id):
            raise InvalidInputError(
                f"the transcript header is of session {transcript.session_id!r} of user "
                f"{transcript.user_id!r}, not of the summary's",
                field="transcript",
            )
        self._indexer.repair_if_needed()
        for attempt in range(cas.ATTEMPTS):
            checks = self.transcript_checks(transcript)
            writes = self._summary_writes([((user_id, session_id), data)])
            try:
                self._kv.commit(writes, checks)
            except ConflictError:
                cas.backoff(attempt)
                continue
            self._index_later([(user_id, session_id)])
            return summary
        raise ConflictError(f"session {session_id!r} of user {user_id!r} kept changing: retry")

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
        user_id, session_id = transcript.user_id, transcript.session_id
        space = keys.transcripts_space(self._tenant, user_id)
        (raw,) = self._kv.get_many(space, [header_key(session_id)])
        current = read_header(raw, where=f"{space}/{session_id}")
        if current is None or (current.sha256, current.created_at) != (
            transcript.sha256,
            transcript.created_at,
        ):
            raise ConflictError(
                f"the transcript of session {session_id!r} of user {user_id!r} was replaced "
                "or deleted while it was being summarized: summarize it again"
            )
        return [Check(space, header_key(session_id), raw)]

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
        items = [self._redacted(summary) for summary in summaries]
        encoded = self._encode(items)
        self._indexer.repair_if_needed()
        latest: dict[Ref, bytes] = {}
        for summary, data in zip(items, encoded, strict=True):
            latest[(summary.user_id, summary.session_id)] = data
        pending = list(latest.items())
        for start in range(0, len(pending), BATCH):
            chunk = pending[start : start + BATCH]
            replaced = self._commit_summaries(chunk)
            # Acknowledged from here on: everything below only brings the index in line.
            self._index_later([ref for ref, _ in chunk])
            for user_id, session_id in replaced:
                self._transcript_removed(user_id, session_id)
        return items

    def _commit_summaries(self, chunk: Sequence[tuple[Ref, bytes]]) -> list[Ref]:
        """Commit one chunk of summaries given without a transcript header.

        A summary saved over a *different* stored summary replaces the session:
        its stored transcript, which the new summary does not describe, is
        deleted in the same commit (else recall would still match the old
        words and :meth:`unsummarized_sessions`/resummarize would bring the
        old content back). A session with a transcript but no summary yet
        keeps it: the summary completes it.

        Returns:
            The sessions whose transcript was deleted.
        """
        by_user: dict[str, list[tuple[str, bytes]]] = {}
        for (user_id, session_id), data in chunk:
            by_user.setdefault(user_id, []).append((session_id, data))
        for attempt in range(cas.ATTEMPTS):
            checks: list[Check] = []
            drops: list[Write] = []
            replaced: list[Ref] = []
            for user_id, saved in by_user.items():
                sessions = keys.sessions_space(self._tenant, user_id)
                transcripts = keys.transcripts_space(self._tenant, user_id)
                session_ids = [session_id for session_id, _ in saved]
                stored = self._kv.get_many(sessions, session_ids)
                headers = self._kv.get_many(transcripts, [header_key(s) for s in session_ids])
                for (session_id, data), old, raw in zip(saved, stored, headers, strict=True):
                    checks.append(Check(sessions, session_id, old))
                    if old is None or old == data or raw is None:
                        continue  # new, unchanged, or no transcript to drop
                    checks.append(Check(transcripts, header_key(session_id), raw))
                    header = read_header(raw, where=f"{transcripts}/{session_id}")
                    if header is not None:
                        drops.extend(delete_writes(transcripts, header))
                    else:
                        drops.append(Delete(transcripts, header_key(session_id)))
                    replaced.append((user_id, session_id))
            try:
                self._kv.commit([*self._summary_writes(chunk), *drops], checks)
            except ConflictError:
                cas.backoff(attempt)
                continue
            return replaced
        raise ConflictError("the sessions kept changing while being saved: retry")

    def _redacted(self, summary: SessionSummary) -> SessionSummary:
        """``summary`` with its text redacted (anything else is left for :meth:`_encode` to refuse)."""
        if not self._redactor.enabled or not isinstance(summary, SessionSummary):
            return summary
        redact = self._redactor.redact
        update: dict[str, object] = {}
        if (text := redact(summary.task_description)) != summary.task_description:
            update["task_description"] = text[:MAX_TEXT]
        for name in (
            "decisions_made",
            "work_completed",
            "open_questions",
            "next_recommended_steps",
        ):
            items: list[str] = getattr(summary, name)
            redacted = [redact(item)[:MAX_TEXT] for item in items]
            if redacted != items:
                update[name] = redacted
        return summary.model_copy(update=update) if update else summary

    def _transcript_removed(self, user_id: str, session_id: str) -> None:
        if self._on_transcript_removed is not None:
            self._on_transcript_removed(user_id, session_id)

    def _encode(self, items: Sequence[object]) -> list[bytes]:
        """The stored bytes of each summary, after checking every one (nothing is written)."""
        encoded: list[bytes] = []
        for position, summary in enumerate(items):
            if not isinstance(summary, SessionSummary):
                raise InvalidInputError(
                    f"summaries[{position}] must be a SessionSummary, got {type(summary).__name__}",
                    field="summary",
                )
            check_id(summary.user_id, "user_id")
            check_id(summary.session_id, "session_id")
            if summary.schema_version != SCHEMA_VERSION:
                # Stored records are always of this version: a record claiming another one
                # would be read back as something it is not.
                raise InvalidInputError(
                    f"summaries[{position}] has schema_version {summary.schema_version}; this "
                    f"version of tiermem writes {SCHEMA_VERSION}: leave schema_version out",
                    field="schema_version",
                )
            data = encode(summary)
            if len(data) > self._kv.max_value_bytes:
                raise ValueTooLargeError(
                    f"session {summary.session_id!r} of user {summary.user_id!r} is {len(data)} "
                    f"bytes, over the store's limit of {self._kv.max_value_bytes}: shorten it",
                    field="summary",
                )
            encoded.append(data)
        return encoded

    def _summary_writes(self, chunk: Sequence[tuple[Ref, bytes]]) -> list[Write]:
        """The writes of one commit saving ``chunk``: records, outbox entries, revisions."""
        token = self._token()
        writes: list[Write] = []
        for (user_id, session_id), data in chunk:
            writes.append(Put(keys.sessions_space(self._tenant, user_id), session_id, data))
            writes.append(Put(self._outbox, keys.session_outbox_key(user_id, session_id), token))
        writes.extend(self._touch_users([user for (user, _), _ in chunk], token))
        return writes

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
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        when = utcnow() if created_at is None else check_datetime(created_at, "created_at")
        parsed = _redact_messages(parse_messages(messages), self._redactor)
        space = keys.transcripts_space(self._tenant, user_id)
        sessions = keys.sessions_space(self._tenant, user_id)
        for attempt in range(cas.ATTEMPTS):
            (old_header,) = self._kv.get_many(space, [header_key(session_id)])
            (summary,) = self._kv.get_many(sessions, [session_id])
            previous = read_header(old_header, where=f"{space}/{session_id}")
            header, _, writes = transcript_writes(
                space,
                user_id,
                session_id,
                parsed,
                max_value_bytes=self._kv.max_value_bytes,
                old_header=previous,
                created_at=when,
            )
            token = self._token()
            writes.extend(self._touch_users([user_id], token))
            writes.extend(also)
            if summary is not None:
                if previous is None or (previous.sha256, previous.created_at) != (
                    header.sha256,
                    header.created_at,
                ):
                    # The summary describes a transcript that is gone: stale from this commit on.
                    writes.append(Delete(sessions, session_id))
                writes.append(
                    Put(self._outbox, keys.session_outbox_key(user_id, session_id), token)
                )
            try:
                # The summary check: if one appears meanwhile, its indexing may have read the
                # old transcript, so this write must queue index work; retry to find out.
                self._kv.commit(
                    writes,
                    [
                        Check(space, header_key(session_id), old_header),
                        Check(sessions, session_id, summary),
                    ],
                )
            except ConflictError:
                cas.backoff(attempt)
                continue
            if summary is not None:
                self._index_later([(user_id, session_id)])
            if old_header is not None and (
                previous is None
                or (previous.sha256, previous.created_at) != (header.sha256, header.created_at)
            ):
                self._transcript_removed(user_id, session_id)
            return header
        raise ConflictError(
            f"transcript of session {session_id!r} of user {user_id!r} kept changing while "
            "being saved: retry"
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
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        return self._delete_session(user_id, session_id)

    def _delete_session(
        self,
        user_id: str,
        session_id: str,
        *,
        expected: tuple[bytes | None, bytes | None] | None = None,
    ) -> bool:
        """:meth:`delete_session`; with ``expected`` (summary bytes, transcript header bytes),
        only while the session still holds exactly those (else nothing is done: ``False``).
        """
        space = keys.sessions_space(self._tenant, user_id)
        transcripts = keys.transcripts_space(self._tenant, user_id)
        for attempt in range(cas.ATTEMPTS):
            (existing,) = self._kv.get_many(space, [session_id])
            (raw_header,) = self._kv.get_many(transcripts, [header_key(session_id)])
            if expected is not None and (existing, raw_header) != expected:
                return False  # changed since the caller decided: not what it meant to delete
            header = read_header(raw_header, where=f"{transcripts}/{session_id}")
            token = self._token()
            writes: list[Write] = [
                Delete(space, session_id),
                Put(self._outbox, keys.session_outbox_key(user_id, session_id), token),
                Put(self._revisions, user_id, token),
            ]
            if header is not None:
                writes.extend(delete_writes(transcripts, header))
            elif raw_header is not None:
                writes.append(Delete(transcripts, header_key(session_id)))
            checks = [Check(transcripts, header_key(session_id), raw_header)]
            if expected is not None:
                checks.append(Check(space, session_id, existing))
            try:
                self._kv.commit(writes, checks)
            except ConflictError:
                cas.backoff(attempt)
                continue
            self._index_later([(user_id, session_id)])
            # Also when nothing was left: a retry after a crash still withdraws what it taught.
            self._transcript_removed(user_id, session_id)
            return existing is not None or raw_header is not None
        raise ConflictError(f"session {session_id!r} of user {user_id!r} kept changing: retry")

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
        check_id(user_id, "user_id")
        sessions = keys.sessions_space(self._tenant, user_id)
        transcripts = keys.transcripts_space(self._tenant, user_id)
        deleted = dropped = 0
        if sessions_before is not None:
            after: str | None = None
            while True:
                rows = self._kv.scan(sessions, start_after=after, limit=page)
                for session_id, data in rows:
                    try:
                        ended = decode(SessionSummary, data, where=f"{sessions}/{session_id}")
                    except CorruptRecordError as exc:
                        logger.error("retention skips an unreadable session: %s", exc)
                        continue
                    if ended.created_at >= sessions_before:
                        continue
                    (raw_header,) = self._kv.get_many(transcripts, [header_key(session_id)])
                    if self._delete_session(user_id, session_id, expected=(data, raw_header)):
                        deleted += 1
                if len(rows) < page:
                    break
                after = rows[-1][0]
        if sessions_before is None and transcripts_before is None:
            return deleted, dropped
        cutoffs = [c for c in (sessions_before, transcripts_before) if c is not None]
        alone_before = max(cutoffs)  # a transcript without a summary is its whole session
        after = None
        while True:
            rows = self._kv.scan(transcripts, start_after=after, limit=page)
            headers = [(sid, raw) for sid, raw in rows if is_header_key(sid)]
            summaries = self._kv.get_many(sessions, [sid for sid, _ in headers])
            for (session_id, raw), summary in zip(headers, summaries, strict=True):
                header = read_header(raw, where=f"{transcripts}/{session_id}")
                if header is None:
                    continue
                if summary is None:
                    if header.created_at < alone_before and self._delete_session(
                        user_id, session_id, expected=(None, raw)
                    ):
                        deleted += 1
                elif (
                    transcripts_before is not None
                    and header.created_at < transcripts_before
                    and self._drop_transcript(user_id, header, raw, summary)
                ):
                    dropped += 1
            if len(rows) < page:
                break
            after = rows[-1][0]
        return deleted, dropped

    def _drop_transcript(
        self, user_id: str, header: TranscriptHeader, raw_header: bytes, summary: bytes
    ) -> bool:
        """Delete a session's transcript and keep its summary, if both are still as read.

        The session's vectors are rebuilt from the summary alone, so the
        transcript's windows leave the index; the user's revision changes,
        so keyword search stops matching its words.

        Returns:
            Whether it was deleted (``False``: the session changed meanwhile).
        """
        session_id = header.session_id
        sessions = keys.sessions_space(self._tenant, user_id)
        transcripts = keys.transcripts_space(self._tenant, user_id)
        token = self._token()
        writes: list[Write] = [
            *delete_writes(transcripts, header),
            Put(self._outbox, keys.session_outbox_key(user_id, session_id), token),
            Put(self._revisions, user_id, token),
        ]
        checks = [
            Check(transcripts, header_key(session_id), raw_header),
            Check(sessions, session_id, summary),
        ]
        try:
            self._kv.commit(writes, checks)
        except ConflictError:
            return False
        self._index_later([(user_id, session_id)])
        return True

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
        check_id(user_id, "user_id")
        space = keys.sessions_space(self._tenant, user_id)
        transcripts = keys.transcripts_space(self._tenant, user_id)
        summarized = [key for key, _ in self._kv.scan(space)]
        session_ids = set(summarized)
        session_ids.update(key for key, _ in self._kv.scan(transcripts) if is_header_key(key))
        vectors_space = keys.session_vectors_space(self._tenant, user_id)
        session_ids.update(key for key, _ in self._kv.scan(vectors_space))
        token = self._token()
        writes: list[Write] = [
            DeleteSpace(space),
            DeleteSpace(transcripts),
            # Gone rather than replaced: no record keyed by the user stays (a missing
            # revision still differs from every cached one).
            Delete(self._revisions, user_id),
        ]
        writes.extend(
            Put(self._outbox, keys.session_outbox_key(user_id, sid), token)
            for sid in sorted(session_ids)
        )
        self._kv.commit(writes)
        self._views.invalidate([user_id])
        try:
            self._indexer.sync([(user_id, sid) for sid in sorted(session_ids)])
            self._indexer.drop_strays(user_id)
        except BackendUnavailableError as exc:
            self._indexer.postpone(exc)
        return len(summarized)

    def repair(self) -> int:
        """Bring the index in line with the KV store for every session with queued work.

        Safe to run at any time, from any number of processes.

        Returns:
            How many queued sessions were processed.

        Raises:
            BackendUnavailableError: The KV store, index or embedder failed;
                the work stays queued.
        """
        return self._indexer.repair()

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
        if batch_size < 1:
            raise InvalidInputError("batch_size must be at least 1", field="batch_size")
        if user_ids is None:
            users = self.user_ids()
        else:
            users = [check_id(user, "user_id") for user in user_ids]
        work: list[tuple[str, list[Ref]]] = []
        for user_id in users:
            sessions = keys.sessions_space(self._tenant, user_id)
            session_ids = {key for key, _ in self._kv.scan(sessions)}
            vectors_space = keys.session_vectors_space(self._tenant, user_id)
            session_ids.update(key for key, _ in self._kv.scan(vectors_space))
            work.append((user_id, [(user_id, sid) for sid in sorted(session_ids)]))
        total = sum(len(refs) for _, refs in work)
        done = 0
        for user_id, refs in work:
            self._indexer.drop_strays(user_id)
            for start in range(0, len(refs), batch_size):
                batch = refs[start : start + batch_size]
                self._indexer.rebuild(batch)
                done += len(batch)
                if progress is not None:
                    progress(ReindexProgress(done=done, total=total, user_id=user_id))
        return done

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until every index update queued so far is done.

        Returns:
            True when nothing is left queued; False on timeout, or when work is
            left for a later repair (e.g. the index is down).
        """
        return self._indexer.flush(timeout)

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the background worker after it finishes what is queued (up to ``timeout``).

        Work not done by then stays in the KV outbox and is replayed by the
        next tier opened on this store. Does not close the stores. Idempotent.
        """
        self._indexer.close(timeout)

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

    def transcript_header(self, user_id: str, session_id: str) -> TranscriptHeader:
        """Describe a session's stored transcript (size, messages, checksum, ``created_at``).

        Raises:
            InvalidInputError: A bad id.
            SessionNotFoundError: No transcript is stored for the session.
            CorruptRecordError: The stored header is damaged.
        """
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        space = keys.transcripts_space(self._tenant, user_id)
        (raw,) = self._kv.get_many(space, [header_key(session_id)])
        if raw is None:
            raise SessionNotFoundError(
                f"user {user_id!r} has no transcript stored for session {session_id!r}"
            )
        return decode_header(raw, where=f"{space}/{session_id}")

    def get_transcript(self, user_id: str, session_id: str) -> list[Message]:
        """Read a session's stored transcript.

        Raises:
            InvalidInputError: A bad id.
            SessionNotFoundError: No transcript is stored for the session.
            CorruptRecordError: The stored transcript is damaged.
        """
        header = self.transcript_header(user_id, session_id)
        space = keys.transcripts_space(self._tenant, user_id)
        pages = self._kv.get_many(space, [page_key(session_id, n) for n in range(header.pages)])
        return decode_transcript(header, pages, where=f"{space}/{session_id}")

    def user_ids(self) -> list[str]:
        """Every user of the tenant with anything stored (sessions or facts), sorted."""
        return [key for key, _ in self._kv.scan(keys.users_space(self._tenant))]

    def unsummarized_sessions(self, user_id: str) -> list[str]:
        """Sessions of the user with a stored transcript but no summary (e.g. summarizing failed).

        Raises:
            InvalidInputError: A bad id.
        """
        check_id(user_id, "user_id")
        space = keys.transcripts_space(self._tenant, user_id)
        with_transcript = [key for key, _ in self._kv.scan(space) if is_header_key(key)]
        if not with_transcript:
            return []
        summaries = self._kv.get_many(keys.sessions_space(self._tenant, user_id), with_transcript)
        return [sid for sid, data in zip(with_transcript, summaries, strict=True) if data is None]

    def list_sessions(self, user_id: str, limit: int | None = None) -> list[SessionSummary]:
        """A user's summaries, newest first by ``created_at``.

        Args:
            user_id: The user.
            limit: At most this many; ``None`` for all.

        Raises:
            InvalidInputError: A bad id or a negative limit.
            CorruptRecordError: A stored record (among those returned) is not a valid summary.
        """
        check_id(user_id, "user_id")
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 0
        ):
            raise InvalidInputError("limit must be a non-negative integer or None", field="limit")
        space = keys.sessions_space(self._tenant, user_id)
        if limit is not None:
            # The newest few by the cached order, then read for real: cheap for a long history.
            chosen = self._view(user_id).newest_first()[:limit]
            records = self._kv.get_many(space, chosen)
            if all(data is not None for data in records):
                return [
                    decode(SessionSummary, data, where=f"{space}/{sid}")
                    for sid, data in zip(chosen, records, strict=True)
                    if data is not None
                ]
            # A record vanished without a revision change (written around this tier): read all.
        summaries = [
            decode(SessionSummary, data, where=f"{space}/{key}")
            for key, data in self._kv.scan(space)
        ]
        summaries.sort(key=lambda s: (s.created_at, s.session_id), reverse=True)
        return summaries if limit is None else summaries[:limit]

    def recall_relevant(self, user_id: str, query: str, top_k: int = 5) -> list[RecalledSession]:
        """The user's sessions most relevant to ``query``, best first.

        Every session of this tenant's user (and nobody else's) is scored by
        dense similarity, BM25 keyword match over summary and transcript, and
        recency (see :mod:`tiers.session._recall`). Index work still queued for the
        user is finished first, so acknowledged saves are always recalled.

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
        check_top_k(top_k)
        self._indexer.repair_if_needed()
        view = self._view(user_id, settle=True)
        if not view.session_ids:
            return []
        (vector,) = self._embedder.embed([query])
        similarity = view.similarities(self._kv, self._index, self._tenant, user_id, vector)
        keyword = view.keyword_scores(self._kv, self._tenant, user_id, query)
        self._views.trim()
        ranked = fuse(
            view.session_ids,
            similarity=similarity,
            keyword=keyword,
            created_at=view.created_at,
            weights=self._weights,
        )
        space = keys.sessions_space(self._tenant, user_id)
        results: list[RecalledSession] = []
        position = 0
        # Read in small rounds: a hit whose record is gone (deleted around this tier) is skipped.
        while position < len(ranked) and len(results) < top_k:
            batch = ranked[position : position + top_k - len(results) + 2]
            position += len(batch)
            records = self._kv.get_many(space, [hit.session_id for hit in batch])
            for hit, data in zip(batch, records, strict=True):
                if data is None:
                    continue
                summary = decode(SessionSummary, data, where=f"{space}/{hit.session_id}")
                results.append(
                    RecalledSession(
                        summary=summary,
                        score=hit.score,
                        similarity=hit.similarity,
                        keyword=hit.keyword,
                    )
                )
                if len(results) == top_k:
                    break
        return results

    # -- per-user views -----------------------------------------------------------------------

    def _view(self, user_id: str, *, settle: bool = False) -> UserView:
        """The user's current view; with ``settle``, queued index work of the user is done first."""
        (revision,) = self._kv.get_many(self._revisions, [user_id])
        if settle:
            # After the revision read: work committed before it shows up here (same commit).
            queued = self._indexer.queued(user_id)
            if queued:
                self._indexer.sync(queued)
                if self._indexer.queued(user_id):
                    # Not settled (an outage or a busy writer): answer from a fresh, uncached view.
                    return build_view(self._kv, self._tenant, user_id, revision)
        view, generation = self._views.get(user_id, revision)
        if view is None:
            view = build_view(self._kv, self._tenant, user_id, revision)
            self._views.put(user_id, view, generation)
        return view

    # -- helpers ------------------------------------------------------------------------------

    def _touch_users(self, user_ids: Iterable[str], token: bytes) -> list[Write]:
        writes: list[Write] = []
        for user_id in dict.fromkeys(user_ids):
            writes.append(Put(keys.users_space(self._tenant), user_id, b"1"))
            writes.append(Put(self._revisions, user_id, token))
        return writes

    def _index_later(self, refs: list[Ref]) -> None:
        self._views.invalidate(users_of(refs))
        self._indexer.submit(refs)

    @staticmethod
    def _token() -> bytes:
        return uuid.uuid4().hex.encode()
