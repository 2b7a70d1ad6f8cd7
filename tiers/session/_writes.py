"""The session tier's write paths: save and replace summaries and transcripts, delete sessions.

:class:`SessionWriter` makes every change of the tier's records, each in ONE
KV commit with its outbox entries and the user's new revision
(:class:`~tiers.session._store.SessionStore`), checked against what it was
decided on (compare-and-set, retried with backoff). After the commit it
hands the sessions to the index worker and, where a transcript went, tells
``on_transcript_removed``. Redaction happens here, before anything is stored.
The contracts are documented on :class:`~tiers.session.SessionTier`.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from datetime import datetime

from tiers import cas
from tiers.backends.base import Check, Delete, DeleteSpace, Put, Write
from tiers.codec import encode
from tiers.errors import (
    BackendUnavailableError,
    ConflictError,
    InvalidInputError,
    ValueTooLargeError,
)
from tiers.ids import check_id
from tiers.models import MAX_MESSAGE_TEXT, MAX_TEXT, SCHEMA_VERSION, Message, SessionSummary, utcnow
from tiers.redaction import Redactor
from tiers.session._index import BATCH, Ref
from tiers.session._store import SessionStore
from tiers.session._transcripts import (
    TranscriptHeader,
    delete_writes,
    header_key,
    is_header_key,
    parse_messages,
    read_header,
    transcript_writes,
)
from tiers.values import check_datetime

__all__ = ["SessionWriter"]


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


def _same_transcript(stored: TranscriptHeader | None, other: TranscriptHeader) -> bool:
    """Whether ``stored`` heads the very transcript ``other`` describes (same content and date)."""
    return stored is not None and (stored.sha256, stored.created_at) == (
        other.sha256,
        other.created_at,
    )


def _transcript_deletes(space: str, session_id: str, raw_header: bytes | None) -> list[Write]:
    """The writes deleting a session's stored transcript, if it has one.

    A header too damaged to name its pages is deleted alone: the session then
    reads as having no transcript.
    """
    header = read_header(raw_header, where=f"{space}/{session_id}")
    if header is not None:
        return delete_writes(space, header)
    return [] if raw_header is None else [Delete(space, header_key(session_id))]


class SessionWriter:
    """Every change of a tenant's session records (see :class:`~tiers.session.SessionTier`).

    Args:
        store: The store core it writes through.
    """

    def __init__(self, store: SessionStore) -> None:
        self._store = store

    def save_session(
        self, summary: SessionSummary, *, transcript: TranscriptHeader | None = None
    ) -> SessionSummary:
        """Save one summary; given ``transcript``, only while it is still the session's."""
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
        self._store.indexer.repair_if_needed()
        for attempt in range(cas.ATTEMPTS):
            checks = self.transcript_checks(transcript)
            writes = self._summary_writes([((user_id, session_id), data)])
            try:
                self._store.kv.commit(writes, checks)
            except ConflictError:
                cas.backoff(attempt)
                continue
            self._store.index_later([(user_id, session_id)])
            return summary
        raise ConflictError(f"session {session_id!r} of user {user_id!r} kept changing: retry")

    def transcript_checks(self, transcript: TranscriptHeader) -> list[Check]:
        """Checks that hold while ``transcript`` is still its session's stored transcript.

        Raises:
            ConflictError: The transcript was replaced or deleted already.
        """
        user_id, session_id = transcript.user_id, transcript.session_id
        space = self._store.transcripts_space(user_id)
        (raw,) = self._store.kv.get_many(space, [header_key(session_id)])
        current = read_header(raw, where=f"{space}/{session_id}")
        if not _same_transcript(current, transcript):
            raise ConflictError(
                f"the transcript of session {session_id!r} of user {user_id!r} was replaced "
                "or deleted while it was being summarized: summarize it again"
            )
        return [Check(space, header_key(session_id), raw)]

    def save_sessions(self, summaries: Iterable[SessionSummary]) -> list[SessionSummary]:
        """Save many summaries, ``BATCH`` per commit; returns them as stored, in input order."""
        items = [self._redacted(summary) for summary in summaries]
        encoded = self._encode(items)
        self._store.indexer.repair_if_needed()
        latest: dict[Ref, bytes] = {}
        for summary, data in zip(items, encoded, strict=True):
            latest[(summary.user_id, summary.session_id)] = data
        pending = list(latest.items())
        for start in range(0, len(pending), BATCH):
            chunk = pending[start : start + BATCH]
            replaced = self._commit_summaries(chunk)
            # Acknowledged from here on: everything below only brings the index in line.
            self._store.index_later([ref for ref, _ in chunk])
            for user_id, session_id in replaced:
                self._store.transcript_removed(user_id, session_id)
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
                sessions = self._store.sessions_space(user_id)
                transcripts = self._store.transcripts_space(user_id)
                session_ids = [session_id for session_id, _ in saved]
                stored = self._store.kv.get_many(sessions, session_ids)
                headers = self._store.kv.get_many(transcripts, [header_key(s) for s in session_ids])
                for (session_id, data), old, raw in zip(saved, stored, headers, strict=True):
                    checks.append(Check(sessions, session_id, old))
                    if old is None or old == data or raw is None:
                        continue  # new, unchanged, or no transcript to drop
                    checks.append(Check(transcripts, header_key(session_id), raw))
                    drops.extend(_transcript_deletes(transcripts, session_id, raw))
                    replaced.append((user_id, session_id))
            try:
                self._store.kv.commit([*self._summary_writes(chunk), *drops], checks)
            except ConflictError:
                cas.backoff(attempt)
                continue
            return replaced
        raise ConflictError("the sessions kept changing while being saved: retry")

    def _redacted(self, summary: SessionSummary) -> SessionSummary:
        """``summary`` with its text redacted (a non-summary is left for :meth:`_encode`)."""
        if not self._store.redactor.enabled or not isinstance(summary, SessionSummary):
            return summary
        redact = self._store.redactor.redact
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

    def _encode(self, items: Sequence[object]) -> list[bytes]:
        """The stored bytes of each summary, after checking every one (nothing is written)."""
        max_bytes = self._store.kv.max_value_bytes
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
            if len(data) > max_bytes:
                raise ValueTooLargeError(
                    f"session {summary.session_id!r} of user {summary.user_id!r} is {len(data)} "
                    f"bytes, over the store's limit of {max_bytes}: shorten it",
                    field="summary",
                )
            encoded.append(data)
        return encoded

    def _summary_writes(self, chunk: Sequence[tuple[Ref, bytes]]) -> list[Write]:
        """The writes of one commit saving ``chunk``: records, outbox entries, revisions."""
        token = self._store.new_token()
        writes: list[Write] = []
        for (user_id, session_id), data in chunk:
            writes.append(Put(self._store.sessions_space(user_id), session_id, data))
            writes.append(self._store.mark_stale(user_id, session_id, token))
            # Counts of what it replaces go now; the index pass stores the new ones.
            writes.append(Delete(self._store.terms_space(user_id), session_id))
        writes.extend(self._store.touch_users([user for (user, _), _ in chunk], token))
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
        """Store a session's raw transcript, dropping a summary that describes another one."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        when = utcnow() if created_at is None else check_datetime(created_at, "created_at")
        parsed = _redact_messages(parse_messages(messages), self._store.redactor)
        space = self._store.transcripts_space(user_id)
        sessions = self._store.sessions_space(user_id)
        for attempt in range(cas.ATTEMPTS):
            (old_header,) = self._store.kv.get_many(space, [header_key(session_id)])
            (summary,) = self._store.kv.get_many(sessions, [session_id])
            previous = read_header(old_header, where=f"{space}/{session_id}")
            header, _, writes = transcript_writes(
                space,
                user_id,
                session_id,
                parsed,
                max_value_bytes=self._store.kv.max_value_bytes,
                old_header=previous,
                created_at=when,
            )
            replaced = not _same_transcript(previous, header)
            token = self._store.new_token()
            writes.extend(self._store.touch_users([user_id], token))
            writes.extend(also)
            if summary is not None:
                if replaced:
                    # The summary describes a transcript that is gone: stale from this commit on.
                    writes.append(Delete(sessions, session_id))
                writes.append(self._store.mark_stale(user_id, session_id, token))
                writes.append(Delete(self._store.terms_space(user_id), session_id))
            try:
                # The summary check: if one appears meanwhile, its indexing may have read the
                # old transcript, so this write must queue index work; retry to find out.
                self._store.kv.commit(
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
                self._store.index_later([(user_id, session_id)])
            if old_header is not None and replaced:
                self._store.transcript_removed(user_id, session_id)
            return header
        raise ConflictError(
            f"transcript of session {session_id!r} of user {user_id!r} kept changing while "
            "being saved: retry"
        )

    def delete_session(self, user_id: str, session_id: str) -> bool:
        """Delete one session (summary, transcript, vectors); whether it had anything."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        return self.delete(user_id, session_id)

    def delete(
        self,
        user_id: str,
        session_id: str,
        *,
        expected: tuple[bytes | None, bytes | None] | None = None,
    ) -> bool:
        """:meth:`delete_session` of checked ids.

        Args:
            user_id: The user.
            session_id: The session.
            expected: Summary bytes and transcript header bytes: delete only
                while the session still holds exactly those (else nothing is
                done: ``False``). ``None``: whatever it holds.

        Returns:
            Whether the session had a summary or a transcript.
        """
        space = self._store.sessions_space(user_id)
        transcripts = self._store.transcripts_space(user_id)
        for attempt in range(cas.ATTEMPTS):
            (existing,) = self._store.kv.get_many(space, [session_id])
            (raw_header,) = self._store.kv.get_many(transcripts, [header_key(session_id)])
            if expected is not None and (existing, raw_header) != expected:
                return False  # changed since the caller decided: not what it meant to delete
            token = self._store.new_token()
            writes: list[Write] = [
                Delete(space, session_id),
                Delete(self._store.terms_space(user_id), session_id),
                self._store.mark_stale(user_id, session_id, token),
                self._store.new_revision(user_id, token),
                *_transcript_deletes(transcripts, session_id, raw_header),
            ]
            checks = [Check(transcripts, header_key(session_id), raw_header)]
            if expected is not None:
                checks.append(Check(space, session_id, existing))
            try:
                self._store.kv.commit(writes, checks)
            except ConflictError:
                cas.backoff(attempt)
                continue
            self._store.index_later([(user_id, session_id)])
            # Also when nothing was left: a retry after a crash still withdraws what it taught.
            self._store.transcript_removed(user_id, session_id)
            return existing is not None or raw_header is not None
        raise ConflictError(f"session {session_id!r} of user {user_id!r} kept changing: retry")

    def delete_user_sessions(self, user_id: str) -> int:
        """Delete every session of a user; returns how many summaries the KV store held."""
        check_id(user_id, "user_id")
        space = self._store.sessions_space(user_id)
        transcripts = self._store.transcripts_space(user_id)
        summarized = [key for key, _ in self._store.kv.scan(space)]
        session_ids = set(summarized)
        session_ids.update(key for key, _ in self._store.kv.scan(transcripts) if is_header_key(key))
        vectors_space = self._store.vectors_space(user_id)
        session_ids.update(key for key, _ in self._store.kv.scan(vectors_space))
        token = self._store.new_token()
        writes: list[Write] = [
            DeleteSpace(space),
            DeleteSpace(transcripts),
            DeleteSpace(self._store.terms_space(user_id)),
            # Gone rather than replaced: no record keyed by the user stays (a missing
            # revision still differs from every cached one).
            Delete(self._store.revisions, user_id),
        ]
        writes.extend(self._store.mark_stale(user_id, sid, token) for sid in sorted(session_ids))
        self._store.kv.commit(writes)
        self._store.views.invalidate([user_id])
        self._store.indexer.forget_embedded()
        try:
            self._store.indexer.sync([(user_id, sid) for sid in sorted(session_ids)])
            self._store.indexer.drop_strays(user_id)
        except BackendUnavailableError as exc:
            self._store.indexer.postpone(exc)
        return len(summarized)
