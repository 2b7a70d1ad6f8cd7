"""The session tier's retention: sessions, or only their transcripts, expire after a cutoff.

:class:`SessionExpiry` pages through one user's summaries and transcripts and
deletes what ended before the cutoffs, each deletion checked against the
records it was decided on, so a session saved again meanwhile is left alone.
Whole sessions go through :meth:`SessionWriter.delete
<tiers.session._writes.SessionWriter.delete>`; a transcript whose session keeps
its summary is dropped here. The contract is documented on
:meth:`SessionTier.expire <tiers.session.SessionTier.expire>`; the policy that
calls it per user is :mod:`tiers.retention`.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from datetime import datetime

from tiers.backends.base import Check, Delete, Write
from tiers.codec import decode
from tiers.errors import ConflictError, CorruptRecordError
from tiers.ids import check_id
from tiers.models import SessionSummary
from tiers.session._store import SessionStore
from tiers.session._transcripts import (
    TranscriptHeader,
    delete_writes,
    header_key,
    is_header_key,
    read_header,
)
from tiers.session._writes import SessionWriter

__all__ = ["SessionExpiry"]

logger = logging.getLogger(__name__)


class SessionExpiry:
    """Deletes a user's sessions and transcripts that ended before a cutoff.

    Args:
        store: The store core it reads and writes through.
        writer: Deletes whole sessions.
    """

    def __init__(self, store: SessionStore, writer: SessionWriter) -> None:
        self._store = store
        self._writer = writer

    def expire(
        self,
        user_id: str,
        *,
        sessions_before: datetime | None,
        transcripts_before: datetime | None,
        page: int,
    ) -> tuple[int, int]:
        """Sessions deleted, and transcripts deleted from sessions that kept their summary."""
        check_id(user_id, "user_id")
        deleted = 0
        if sessions_before is not None:
            deleted = self._expire_sessions(user_id, sessions_before, page)
        cutoffs = [c for c in (sessions_before, transcripts_before) if c is not None]
        if not cutoffs:
            return deleted, 0
        # A transcript without a summary is its whole session: it goes by the later cutoff.
        alone, dropped = self._expire_transcripts(user_id, max(cutoffs), transcripts_before, page)
        return deleted + alone, dropped

    def _pages(self, space: str, page: int) -> Iterator[list[tuple[str, bytes]]]:
        """The records of ``space`` in key order, ``page`` at a time (each read when asked for)."""
        after: str | None = None
        while True:
            rows = self._store.kv.scan(space, start_after=after, limit=page)
            yield rows
            if len(rows) < page:
                return
            after = rows[-1][0]

    def _expire_sessions(self, user_id: str, before: datetime, page: int) -> int:
        """Delete the sessions whose summary was created before ``before``; how many."""
        sessions = self._store.sessions_space(user_id)
        transcripts = self._store.transcripts_space(user_id)
        deleted = 0
        for rows in self._pages(sessions, page):
            for session_id, data in rows:
                try:
                    ended = decode(SessionSummary, data, where=f"{sessions}/{session_id}")
                except CorruptRecordError as exc:
                    logger.error("retention skips an unreadable session: %s", exc)
                    continue
                if ended.created_at >= before:
                    continue
                (raw_header,) = self._store.kv.get_many(transcripts, [header_key(session_id)])
                if self._writer.delete(user_id, session_id, expected=(data, raw_header)):
                    deleted += 1
        return deleted

    def _expire_transcripts(
        self,
        user_id: str,
        alone_before: datetime,
        transcripts_before: datetime | None,
        page: int,
    ) -> tuple[int, int]:
        """Delete old transcripts: with their session if it has no summary, else on their own.

        Returns:
            Sessions deleted (transcripts alone before ``alone_before``), and
            transcripts dropped from summarized sessions (before ``transcripts_before``).
        """
        sessions = self._store.sessions_space(user_id)
        transcripts = self._store.transcripts_space(user_id)
        deleted = dropped = 0
        for rows in self._pages(transcripts, page):
            headers = [(sid, raw) for sid, raw in rows if is_header_key(sid)]
            summaries = self._store.kv.get_many(sessions, [sid for sid, _ in headers])
            for (session_id, raw), summary in zip(headers, summaries, strict=True):
                header = read_header(raw, where=f"{transcripts}/{session_id}")
                if header is None:
                    continue
                if summary is None:
                    if header.created_at < alone_before and self._writer.delete(
                        user_id, session_id, expected=(None, raw)
                    ):
                        deleted += 1
                elif (
                    transcripts_before is not None
                    and header.created_at < transcripts_before
                    and self.drop_transcript(user_id, header, raw, summary)
                ):
                    dropped += 1
        return deleted, dropped

    def drop_transcript(
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
        sessions = self._store.sessions_space(user_id)
        transcripts = self._store.transcripts_space(user_id)
        token = self._store.new_token()
        writes: list[Write] = [
            *delete_writes(transcripts, header),
            Delete(self._store.terms_space(user_id), session_id),  # they count its words
            self._store.mark_stale(user_id, session_id, token),
            self._store.new_revision(user_id, token),
        ]
        checks = [
            Check(transcripts, header_key(session_id), raw_header),
            Check(sessions, session_id, summary),
        ]
        try:
            self._store.kv.commit(writes, checks)
        except ConflictError:
            return False
        self._store.indexer.forget_embedded()  # vectors of the transcript's windows among them
        self._store.index_later([(user_id, session_id)])
        return True
