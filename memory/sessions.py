"""The session operations of :class:`~memory.Memory`: transcripts, summaries, recall and context.

:class:`SessionOperations` is composed into ``Memory`` around its session tier;
every ``Memory`` session method delegates to the method of the same name here,
which holds its contract.

Each operation is traced (``tiermem.session.*`` spans, :func:`memory.telemetry.operation_span`:
ids and counts, never the query, transcript or summary), and recall, context assembly and
summarizing are timed in the memory's :class:`~memory.metrics.TiermemMetrics`, if it has any.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from pydantic import ValidationError

from memory.context import ContinuationContext, assemble_context, check_budget
from memory.metrics import TiermemMetrics
from memory.telemetry import SpanAttributes, operation_span
from memory.tenant import TenantTiers, session_source
from summarizer import Summarizer, parse_transcript
from tiers.erasure import scrub
from tiers.errors import InvalidInputError
from tiers.ids import ID_PATTERN, check_id
from tiers.models import Message, SessionSummary, utcnow
from tiers.session import RecalledSession, check_top_k
from tiers.values import check_datetime

DEFAULT_TOP_K = 5


class SessionOperations:
    """A tenant's sessions, as :class:`~memory.Memory` offers them.

    Args:
        tiers: The tenant's tiers.
        summarizer: The summarizer to use now (``Memory.summarizer``, which may be replaced).
        context_max_tokens: Default budget of :meth:`build_continuation_context`.
        metrics: Where recall, context and summarizer latencies go; default: nowhere.
    """

    def __init__(
        self,
        tiers: TenantTiers,
        summarizer: Callable[[], Summarizer],
        *,
        context_max_tokens: int,
        metrics: TiermemMetrics | None = None,
    ) -> None:
        self._tenant = tiers.tenant
        self._kv = tiers.kv
        self._sessions = tiers.sessions
        self._users = tiers.users
        self._items = tiers.items
        self._jobs = tiers.jobs
        self._scrub_deleted = tiers.scrub_deleted
        self._summarizer = summarizer
        self._context_max_tokens = context_max_tokens
        self._metrics = metrics

    def _span_of(
        self, user_id: object, session_id: object = None, **numbers: object
    ) -> SpanAttributes:
        """A session span's first attributes: the tenant, and of the call's arguments the
        ids that are valid ids (anything else may be content) and the numbers that are ints."""
        attributes: SpanAttributes = {"tiermem.tenant": self._tenant}
        for name, value in (("user_id", user_id), ("session_id", session_id)):
            if isinstance(value, str) and ID_PATTERN.fullmatch(value):
                attributes[f"tiermem.{name}"] = value
        for name, value in numbers.items():
            if isinstance(value, int) and not isinstance(value, bool):
                attributes[f"tiermem.{name}"] = value
        return attributes

    def save_session(self, summary: SessionSummary | Mapping[str, Any]) -> SessionSummary:
        """Store a structured session summary (KV record + vector document).

        Idempotent by ``(user_id, session_id)``: saving again replaces it.
        ``created_at`` may be given to backfill past sessions (a naive
        datetime is taken as UTC). ``schema_version`` may be left out; if
        given it must be this version's (:data:`tiers.models.SCHEMA_VERSION`):
        a record of another version is refused rather than stored mislabelled.

        Raises:
            InvalidInputError: ``summary`` is not a summary or a mapping, or
                it is malformed (``field`` names the field); nothing was written.
        """
        with operation_span("tiermem.session.save", self._span_of(None)) as span:
            if not isinstance(summary, SessionSummary):
                if not isinstance(summary, Mapping):
                    raise InvalidInputError(
                        "summary must be a SessionSummary or a mapping of its fields, got "
                        f"{type(summary).__name__}",
                        field="summary",
                    )
                summary = _validate_summary(summary)
            span.update(self._span_of(summary.user_id, summary.session_id))
            return self._sessions.save_session(summary)

    def end_session(
        self,
        user_id: str,
        session_id: str,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        created_at: datetime | None = None,
    ) -> SessionSummary:
        """Store a finished session's transcript, then summarize it and save the summary.

        The transcript is durable before the summarizer is called, so a
        summarizer failure (timeout, rate limit, invalid output) loses
        nothing: the error is raised, the session is listed by
        :meth:`pending_summaries`, and :meth:`resummarize` tries again. User
        facts the summarizer proposes are stored with the session as their
        source; an older fact never overwrites a newer one.

        Args:
            user_id: The user.
            session_id: The session; ending the same id again replaces it.
            transcript: The session, oldest first: chat-completions messages
                (tool calls and results included), Responses-API items (what
                the OpenAI Agents SDK's ``to_input_list()`` gives), or
                :class:`~tiers.models.Message` objects; see
                :mod:`summarizer.formats` for what is kept of each.
            created_at: When the session ended; default now. A naive
                datetime is taken as UTC; anything but a datetime is refused.
                Facts learned from the session are dated no later than now.

        Raises:
            InvalidTranscriptError: The transcript is malformed (``field``
                names the item); nothing was written.
            InvalidInputError: A bad id or ``created_at``; nothing was written.
            SummarizerError: Summarizing failed; the transcript is stored.
        """
        with operation_span("tiermem.session.end", self._span_of(user_id, session_id)):
            self.save_transcript(user_id, session_id, transcript, created_at=created_at)
            return self.resummarize(user_id, session_id)

    def save_transcript(
        self,
        user_id: str,
        session_id: str,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        created_at: datetime | None = None,
    ) -> None:
        """Store a session's raw transcript without summarizing it (see :meth:`resummarize`).

        Its words also count for recall once the session has a summary. The
        transcript is read like :meth:`end_session`'s.

        Raises:
            InvalidTranscriptError: The transcript is malformed, or has an item,
                role or content part of a type not known (``field`` names it);
                nothing was written.
            InvalidInputError: A bad id or ``created_at`` (see :meth:`end_session`);
                nothing was written.
        """
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        when = utcnow() if created_at is None else check_datetime(created_at, "created_at")
        messages = parse_transcript(transcript)
        self._sessions.save_transcript(user_id, session_id, messages, created_at=when)

    def resummarize(self, user_id: str, session_id: str) -> SessionSummary:
        """Summarize a session from its stored transcript and save the summary (replacing any).

        For a session whose summarizing failed, or to redo summaries with a
        better model. Facts are written before the summary: the summary marks
        the session done, so a crash in between leaves it pending, to be
        summarized again, rather than done without its facts. Facts are dated
        when the session ended, but never later than now (they cannot have
        been learned in the future, and must not outrank a later explicit
        :meth:`~memory.Memory.set_fact`).

        The facts and the summary are saved only if the transcript they were
        made from is still the session's, checked in their own commits: one
        replaced or deleted meanwhile (a concurrent :meth:`end_session`,
        :meth:`delete_session` or :meth:`~memory.Memory.forget_user`) raises
        ``ConflictError`` and nothing derived from it is stored.

        Raises:
            SessionNotFoundError: No transcript is stored for the session.
            SummarizerError: Summarizing failed; nothing changed.
            ConflictError: The transcript was replaced while it was summarized.
        """
        attributes = self._span_of(user_id, session_id)
        with operation_span("tiermem.session.summarize", attributes) as span:
            return self._summarize(user_id, session_id, span)

    def _summarize(self, user_id: str, session_id: str, span: SpanAttributes) -> SessionSummary:
        """:meth:`resummarize`'s work, noting counts (never content) on its span."""
        header = self._sessions.transcript_header(user_id, session_id)
        messages = self._sessions.get_transcript(user_id, session_id)
        span["tiermem.messages"] = len(messages)
        started = time.perf_counter()
        try:
            result = self._summarizer().summarize(
                messages, user_id=user_id, session_id=session_id, created_at=header.created_at
            )
        finally:  # a failed summarization took its time too
            if self._metrics is not None:
                self._metrics.summarizer.observe(time.perf_counter() - started)
        summary = result.summary
        if summary.usage is None and result.usage is not None:
            summary = summary.model_copy(update={"usage": result.usage})
        span["tiermem.facts"] = len(result.facts)
        if summary.usage is not None:  # the GenAI conventions' names for what a model used
            span["gen_ai.request.model"] = summary.usage.model
            span["gen_ai.usage.input_tokens"] = summary.usage.prompt_tokens
            span["gen_ai.usage.output_tokens"] = summary.usage.completion_tokens
        # Written only while the transcript is still the one summarized, checked in the
        # facts' own commit: a delete or replacement meanwhile (forget_user, delete_session,
        # end_session again) wins, and nothing of the old content comes back.
        self._users.set_learned_facts(
            user_id,
            result.facts,
            source=session_source(session_id),
            updated_at=summary.created_at,  # clamped to now by the user tier
            guard=lambda: self._sessions.transcript_checks(header),
        )
        return self._sessions.save_session(summary, transcript=header)

    def pending_summaries(self, user_id: str) -> list[str]:
        """Sessions of the user with a stored transcript but no summary yet (summarizing failed)."""
        return self._sessions.unsummarized_sessions(user_id)

    def require_transcript(self, user_id: str, session_id: str) -> None:
        """Check that a session has a stored transcript, as :meth:`resummarize` needs.

        Raises:
            InvalidInputError: A bad id.
            SessionNotFoundError: No transcript is stored for the session.
        """
        self._sessions.transcript_header(user_id, session_id)

    def get_session(self, user_id: str, session_id: str) -> SessionSummary:
        """The stored summary of one session (``SessionNotFoundError`` if none)."""
        return self._sessions.get_session(user_id, session_id)

    def list_sessions(self, user_id: str, *, limit: int | None = None) -> list[SessionSummary]:
        """The user's session summaries, newest first."""
        return self._sessions.list_sessions(user_id, limit=limit)

    def delete_session(self, user_id: str, session_id: str) -> bool:
        """Delete one session from the KV store and the vector index, and what it taught.

        Facts learned from the session (source ``session:<id>``) are withdrawn,
        history included; a summary of it still in flight is never saved, and
        the session's summary jobs (:attr:`jobs`) are deleted. With
        ``scrub_deleted`` the KV store then drops the deleted data from its files.
        Returns whether the session had a summary or a transcript.
        """
        existed = self._sessions.delete_session(user_id, session_id)
        self._jobs.delete_session(user_id, session_id)
        if self._scrub_deleted:
            scrub(self._kv)
        return existed

    def recall_relevant(
        self,
        user_id: str,
        query: str,
        top_k: int = DEFAULT_TOP_K,
        *,
        now: datetime | None = None,
    ) -> list[RecalledSession]:
        """The user's earlier sessions most relevant to ``query``, best first.

        ``now`` is when the query is asked, for the dates it names relative to it
        ("last March", "two weeks ago"); default: the current time.
        """
        with operation_span("tiermem.session.recall", self._span_of(user_id, top_k=top_k)) as span:
            started = time.perf_counter()
            hits = self._sessions.recall_relevant(user_id, query, top_k=top_k, now=now)
            if self._metrics is not None:
                self._metrics.recall.observe(time.perf_counter() - started)
            span["tiermem.results"] = len(hits)
            return hits

    def continuation_context(
        self,
        user_id: str,
        query: str = "",
        max_tokens: int | None = None,
        *,
        top_k: int = DEFAULT_TOP_K,
        now: datetime | None = None,
    ) -> ContinuationContext:
        """Like :meth:`build_continuation_context`, with the sections and token counts used.

        Args:
            user_id: The user.
            query: What the new session is about; empty: the most recent sessions.
            max_tokens: Budget of the whole text, a positive integer; default
                ``context_max_tokens``.
            top_k: How many sessions to consider besides the most recent, 1..100.
            now: When the new session starts, for dates the query names relative to
                it; default: the current time.

        Raises:
            InvalidInputError: A bad id, query, ``max_tokens`` or ``top_k``
                (``field`` names it).
        """
        attributes = self._span_of(user_id, top_k=top_k, max_tokens=max_tokens)
        with operation_span("tiermem.session.context", attributes) as span:
            started = time.perf_counter()
            context = self._context(user_id, query, max_tokens, top_k, now)
            if self._metrics is not None:
                self._metrics.context.observe(time.perf_counter() - started)
            span["tiermem.tokens"] = context.tokens
            span["tiermem.max_tokens"] = context.max_tokens
            for section in context.sections:
                span[f"tiermem.context.{section.name}"] = len(section.items)
            span["tiermem.omitted_sessions"] = len(context.omitted_session_ids)
            span["tiermem.omitted_facts"] = len(context.omitted_fact_keys)
            return context

    def _context(
        self, user_id: str, query: str, max_tokens: int | None, top_k: int, now: datetime | None
    ) -> ContinuationContext:
        """:meth:`continuation_context`'s work: check the arguments, rank, assemble."""
        check_id(user_id, "user_id")
        if not isinstance(query, str):
            raise InvalidInputError(
                f"query must be a string, got {type(query).__name__}", field="query"
            )
        check_top_k(top_k)  # also bounds list_sessions below, when the query is empty
        budget = self._context_max_tokens if max_tokens is None else check_budget(max_tokens)
        latest = self._sessions.list_sessions(user_id, limit=1)
        ranked: list[SessionSummary]
        if query.strip():
            ranked = [
                hit.summary
                for hit in self._sessions.recall_relevant(user_id, query, top_k=top_k, now=now)
            ]
        else:
            ranked = self._sessions.list_sessions(user_id, limit=top_k)
        return assemble_context(
            user_id,
            # Items a store (e.g. LangGraph's) filed under the user count as the user's facts.
            facts=[*self._users.get_facts(user_id), *self._items.user_facts(user_id)],
            ranked_sessions=ranked,
            most_recent=latest[0] if latest else None,
            max_tokens=budget,
        )

    def build_continuation_context(
        self,
        user_id: str,
        query: str = "",
        max_tokens: int | None = None,
        *,
        now: datetime | None = None,
    ) -> str:
        """Prompt-ready context for a new session: the user's facts and relevant earlier sessions.

        The most recent session is always included when it fits; whole
        summaries are left out, least relevant first, to stay within
        ``max_tokens`` (default ``context_max_tokens``); see
        :func:`memory.context.assemble_context` for the exact rule.

        Raises:
            InvalidInputError: A bad id, query or ``max_tokens`` (``field`` names it).
        """
        return self.continuation_context(user_id, query, max_tokens, now=now).text


def _validate_summary(data: Mapping[str, Any]) -> SessionSummary:
    try:
        return SessionSummary.model_validate(dict(data))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "summary"
        raise InvalidInputError(
            f"invalid session summary: {field}: {first['msg']}", field=field
        ) from exc
