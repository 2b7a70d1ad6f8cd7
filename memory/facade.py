"""The Memory facade: the one object an agent or app backend talks to."""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from pathlib import Path
from types import TracebackType
from typing import Any, Self, TypeVar

import anyio.to_thread
from pydantic import JsonValue, ValidationError

from memory.apikeys import ApiKeyRegistry
from memory.context import ContinuationContext, assemble_context, check_budget
from memory.settings import Settings
from summarizer import ExtractiveSummarizer, LiteLLMSummarizer, Summarizer, parse_transcript
from summarizer.embeddings import LiteLLMEmbedder
from tiers.backends import open_kv_store, require_durable
from tiers.backends.base import Embedder, KVStore, VectorIndex
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.dirlock import DataDirLock
from tiers.backends.embedders import MiniLMEmbedder
from tiers.erasure import scrub
from tiers.errors import InvalidInputError
from tiers.ids import check_id
from tiers.index_check import (
    IndexRepair,
    IndexReport,
    bump_revisions,
    check_index,
    queue_repair,
    register_tenant,
    registered_tenants,
)
from tiers.items import ItemStore
from tiers.models import (
    Checkpoint,
    Message,
    RunInfo,
    RunStatus,
    SessionSummary,
    UserFact,
    utcnow,
)
from tiers.redaction import Redactor
from tiers.retention import (
    RetentionPolicy,
    SweepReport,
    effective_policy,
    read_overrides,
    set_overrides,
    sweep_expired,
)
from tiers.session import RecalledSession, SessionTier, SummaryJobs, check_top_k, users_of
from tiers.task import (
    DEFAULT_RETENTION,
    DEFAULT_SNAPSHOT_EVERY,
    UNSET,
    Approval,
    EffectRecord,
    Event,
    RunHandle,
    TaskTier,
)
from tiers.threads import ThreadTier
from tiers.user import UserTier
from tiers.values import check_datetime

T = TypeVar("T")

DEFAULT_TOP_K = 5

logger = logging.getLogger("tiermem.memory")


class Memory:
    """Three-tier memory for LLM agents: task runs, session summaries, user facts.

    Thread-safe: one instance is meant to be shared by every thread of a process.
    Open it with :meth:`open` (embedded default in a folder) or
    :meth:`from_settings` (``TIERMEM_*`` environment), or pass the parts.

    Args:
        kv: The authoritative KV store of all three tiers.
        index: The vector index of session summaries.
        embedder: Embeds summaries and queries.
        summarizer: Turns transcripts into summaries; default offline extractive.
        tenant: Namespace of every key this instance touches.
        context_max_tokens: Default budget of :meth:`build_continuation_context`.
        background_indexing: Embed saved sessions in a worker thread, many
            per batch: a save returns once its KV commit is durable, and
            recall still sees it (it finishes the user's queued work first).
            ``False`` indexes before each save returns.
        run_retention: How long finished runs are kept before :meth:`sweep_runs`
            deletes them.
        snapshot_every: The task tier snapshots a run's state every this many
            events, which bounds the cost of resuming a long run.
        scrub_deleted: After :meth:`forget_user` and :meth:`delete_session`, have
            the KV store drop the deleted data from its files too (SQLite:
            truncate the WAL; Redis: rewrite the AOF), not only from every read.
        retention: The deployment's default retention of sessions, transcripts,
            facts and idle runs (default: everything kept); each tenant may
            override it (:meth:`set_retention`), and :meth:`sweep` applies it.
        redactor: What is removed before anything is stored: transcripts (so
            the summarizer never sees it either), summaries, fact values and
            evidence, step outputs, run state, scope snapshots, run results,
            effect outputs and approval plans. Default ``Redactor("secrets")``
            (API keys, tokens, passwords, card numbers, private keys);
            ``Redactor("off")`` stores everything verbatim. Custom kinds:
            ``Redactor(patterns={"employee_id": r"EMP-\\d{6}"})``.
    """

    def __init__(
        self,
        *,
        kv: KVStore,
        index: VectorIndex,
        embedder: Embedder,
        summarizer: Summarizer | None = None,
        tenant: str = "default",
        context_max_tokens: int = 2000,
        background_indexing: bool = True,
        run_retention: timedelta = DEFAULT_RETENTION,
        snapshot_every: int = DEFAULT_SNAPSHOT_EVERY,
        scrub_deleted: bool = True,
        retention: RetentionPolicy | None = None,
        redactor: Redactor | None = None,
    ) -> None:
        if redactor is not None and not isinstance(redactor, Redactor):
            raise InvalidInputError(
                f"redactor must be a Redactor, got {type(redactor).__name__}", field="redactor"
            )
        self.redactor = redactor if redactor is not None else Redactor()
        if retention is not None and not isinstance(retention, RetentionPolicy):
            raise InvalidInputError(
                f"retention must be a RetentionPolicy, got {type(retention).__name__}",
                field="retention",
            )
        self.retention_default = retention or RetentionPolicy()
        self.kv = kv
        self.index = index
        self.embedder = embedder
        self.summarizer: Summarizer = summarizer or ExtractiveSummarizer()
        self.tenant = check_id(tenant, "tenant")
        self.context_max_tokens = context_max_tokens
        self.tasks = TaskTier(
            kv,
            tenant=self.tenant,
            retention=run_retention,
            snapshot_every=snapshot_every,
            redactor=self.redactor,
        )
        self.background_indexing = background_indexing
        self.scrub_deleted = scrub_deleted
        self.sessions = SessionTier(
            kv,
            index,
            embedder,
            tenant=self.tenant,
            background=background_indexing,
            # What a session taught goes with its transcript (deleted or replaced).
            on_transcript_removed=self._withdraw_session_facts,
            redactor=self.redactor,
        )
        self.users = UserTier(kv, tenant=self.tenant, redactor=self.redactor)
        # Durable summary jobs (the service's background summaries), run by any replica.
        self.jobs = SummaryJobs(kv, self.sessions, tenant=self.tenant)
        # Checkpoint DAGs of graph frameworks (the LangGraph checkpointer's storage).
        self.threads = ThreadTier(kv, tenant=self.tenant)
        # Namespaced JSON items (what framework stores such as LangGraph's BaseStore hold).
        self.items = ItemStore(kv, index, embedder, tenant=self.tenant, redactor=self.redactor)
        self._owns_stores = True
        self._tenants: dict[str, Memory] = {}
        self._tenants_lock = threading.Lock()
        # Whether the operator accepted a KV store that may lose acknowledged writes
        # (from_settings' allow_volatile); the service's /readyz reports such a store.
        self.allow_volatile = False
        # The data dir's lock (from_settings, when an embedded store lives there).
        self._dir_lock: DataDirLock | None = None
        # So a check or repair of every tenant (tenants()) finds this one.
        register_tenant(kv, self.tenant)

    def for_tenant(self, tenant: str) -> Memory:
        """A view of the same stores under another tenant's namespace.

        Views are cached and share connections; closing a view does nothing,
        closing the instance it came from closes the stores.
        """
        check_id(tenant, "tenant")
        if tenant == self.tenant:
            return self
        with self._tenants_lock:
            view = self._tenants.get(tenant)
            if view is None:
                view = Memory(
                    kv=self.kv,
                    index=self.index,
                    embedder=self.embedder,
                    summarizer=self.summarizer,
                    tenant=tenant,
                    context_max_tokens=self.context_max_tokens,
                    background_indexing=self.background_indexing,
                    run_retention=self.tasks.retention,
                    snapshot_every=self.tasks.snapshot_every,
                    scrub_deleted=self.scrub_deleted,
                    retention=self.retention_default,
                    redactor=self.redactor,
                )
                view._owns_stores = False
                view.allow_volatile = self.allow_volatile
                self._tenants[tenant] = view
            return view

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str] = ".tiermem", **overrides: Any) -> Memory:
        """Open the embedded default (SQLite + embedded Chroma + local embedder) in ``data_dir``.

        One process per data dir: see :meth:`from_settings`.

        Args:
            data_dir: Folder of the stores; created if missing.
            **overrides: Any other :class:`Settings` field. ``durable=False`` passed
                here is itself the explicit choice of bounded durability, so it
                implies ``allow_volatile=True`` (unless that is passed too); the
                environment's ``TIERMEM_DURABLE=false`` still needs
                ``TIERMEM_ALLOW_VOLATILE``.
        """
        if not isinstance(data_dir, str | os.PathLike):
            raise InvalidInputError(
                f"data_dir must be a path, got {type(data_dir).__name__}", field="data_dir"
            )
        if overrides.get("durable") is False:
            overrides.setdefault("allow_volatile", True)
        return cls.from_settings(_settings(data_dir=Path(data_dir), **overrides))

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> Memory:
        """Open the stores and models that ``settings`` (default: from the environment) name.

        When an embedded store lives in ``data_dir`` (the default SQLite file or
        the embedded Chroma index), the dir is locked until :meth:`close`: one
        process per embedded data dir (the OS drops the lock if the process dies).
        A KV store that may lose acknowledged writes is refused unless
        ``settings.allow_volatile`` (then a warning is logged).

        Raises:
            InvalidInputError: A setting (from the environment when ``settings``
                is ``None``) is invalid; ``field`` names it.
            DataDirLockedError: Another process (or an open instance in this
                one) has the data dir open; the error names it and the pid.
            VolatileStoreError: The KV store is volatile (Redis without
                ``appendonly yes`` + ``appendfsync always``, SQLite with
                ``durable=false``) and ``allow_volatile`` is not set.
            EncryptionKeyError: The master key is not the store's (the message
                names both key ids), the store is encrypted and no key is set,
                or it holds unencrypted data and a key is set (``tiermem encrypt``).
        """
        if settings is None:
            settings = _settings()
        elif not isinstance(settings, Settings):
            raise InvalidInputError(
                f"settings must be a Settings, got {type(settings).__name__}", field="settings"
            )
        embedded = settings.kv_url is None or settings.vector_url is None
        lock = DataDirLock(settings.data_dir) if embedded else None
        try:
            memory = cls._open_stores(settings)
        except BaseException:
            if lock is not None:
                lock.release()
            raise
        memory._dir_lock = lock
        return memory

    @classmethod
    def _open_stores(cls, settings: Settings) -> Memory:
        kv_url = settings.kv_url or str(settings.data_dir / "tiermem.sqlite3")
        kv = open_kv_store(
            kv_url,
            max_value_bytes=settings.max_value_bytes,
            durable=settings.durable,
            flush_interval=settings.flush_interval,
            master_key=settings.encryption_key(),
        )
        try:
            reason = require_durable(kv, allow_volatile=settings.allow_volatile)
            memory = cls._with_kv(settings, kv)
        except BaseException:
            kv.close()
            raise
        if reason is not None:
            logger.warning(
                "KV store may lose acknowledged writes (allow_volatile is on): %s", reason
            )
        memory.allow_volatile = settings.allow_volatile
        return memory

    @classmethod
    def _with_kv(cls, settings: Settings, kv: KVStore) -> Memory:
        embedder: Embedder
        if settings.embedding_model:
            embedder = LiteLLMEmbedder(settings.embedding_model)
        else:
            embedder = MiniLMEmbedder()
        index = ChromaVectorIndex(
            settings.vector_url or settings.data_dir / "chroma", embedder=embedder
        )
        summarizer: Summarizer | None = None
        if settings.summarizer_model:
            api_key = settings.summarizer_api_key
            summarizer = LiteLLMSummarizer(
                settings.summarizer_model,
                api_base=settings.summarizer_api_base,
                api_key=api_key.get_secret_value() if api_key else None,
                max_input_tokens=settings.summarizer_max_input_tokens,
                timeout=settings.summarizer_timeout,
                max_retries=settings.summarizer_max_retries,
                max_transient_retries=settings.summarizer_max_transient_retries,
            )
        return cls(
            kv=kv,
            index=index,
            embedder=embedder,
            summarizer=summarizer,
            tenant=settings.tenant,
            context_max_tokens=settings.context_max_tokens,
            background_indexing=settings.background_indexing,
            run_retention=timedelta(days=settings.run_retention_days),
            snapshot_every=settings.snapshot_every,
            scrub_deleted=settings.scrub_deleted,
            retention=settings.retention_policy(),
            redactor=Redactor(
                settings.redact,
                patterns=settings.redact_patterns,
                placeholder=settings.redact_placeholder,
            ),
        )

    # -- session tier -------------------------------------------------------

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
        if not isinstance(summary, SessionSummary):
            if not isinstance(summary, Mapping):
                raise InvalidInputError(
                    "summary must be a SessionSummary or a mapping of its fields, got "
                    f"{type(summary).__name__}",
                    field="summary",
                )
            summary = _validate_summary(summary)
        return self.sessions.save_session(summary)

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
        self.sessions.save_transcript(user_id, session_id, messages, created_at=when)

    def resummarize(self, user_id: str, session_id: str) -> SessionSummary:
        """Summarize a session from its stored transcript and save the summary (replacing any).

        For a session whose summarizing failed, or to redo summaries with a
        better model. Facts are written before the summary: the summary marks
        the session done, so a crash in between leaves it pending, to be
        summarized again, rather than done without its facts. Facts are dated
        when the session ended, but never later than now (they cannot have
        been learned in the future, and must not outrank a later explicit
        :meth:`set_fact`).

        The facts and the summary are saved only if the transcript they were
        made from is still the session's, checked in their own commits: one
        replaced or deleted meanwhile (a concurrent :meth:`end_session`,
        :meth:`delete_session` or :meth:`forget_user`) raises ``ConflictError``
        and nothing derived from it is stored.

        Raises:
            SessionNotFoundError: No transcript is stored for the session.
            SummarizerError: Summarizing failed; nothing changed.
            ConflictError: The transcript was replaced while it was summarized.
        """
        header = self.sessions.transcript_header(user_id, session_id)
        messages = self.sessions.get_transcript(user_id, session_id)
        result = self.summarizer.summarize(
            messages, user_id=user_id, session_id=session_id, created_at=header.created_at
        )
        summary = result.summary
        if summary.usage is None and result.usage is not None:
            summary = summary.model_copy(update={"usage": result.usage})
        # Written only while the transcript is still the one summarized, checked in the
        # facts' own commit: a delete or replacement meanwhile (forget_user, delete_session,
        # end_session again) wins, and nothing of the old content comes back.
        self.users.set_learned_facts(
            user_id,
            result.facts,
            source=_session_source(session_id),
            updated_at=summary.created_at,  # clamped to now by the user tier
            guard=lambda: self.sessions.transcript_checks(header),
        )
        return self.sessions.save_session(summary, transcript=header)

    def pending_summaries(self, user_id: str) -> list[str]:
        """Sessions of the user with a stored transcript but no summary yet (summarizing failed)."""
        return self.sessions.unsummarized_sessions(user_id)

    def get_session(self, user_id: str, session_id: str) -> SessionSummary:
        """The stored summary of one session (``SessionNotFoundError`` if none)."""
        return self.sessions.get_session(user_id, session_id)

    def list_sessions(self, user_id: str, *, limit: int | None = None) -> list[SessionSummary]:
        """The user's session summaries, newest first."""
        return self.sessions.list_sessions(user_id, limit=limit)

    def delete_session(self, user_id: str, session_id: str) -> bool:
        """Delete one session from the KV store and the vector index, and what it taught.

        Facts learned from the session (source ``session:<id>``) are withdrawn,
        history included; a summary of it still in flight is never saved, and
        the session's summary jobs (:attr:`jobs`) are deleted. With
        ``scrub_deleted`` the KV store then drops the deleted data from its files.
        Returns whether the session had a summary or a transcript.
        """
        existed = self.sessions.delete_session(user_id, session_id)
        self.jobs.delete_session(user_id, session_id)
        if self.scrub_deleted:
            scrub(self.kv)
        return existed

    def recall_relevant(
        self, user_id: str, query: str, top_k: int = DEFAULT_TOP_K
    ) -> list[RecalledSession]:
        """The user's earlier sessions most relevant to ``query``, best first."""
        return self.sessions.recall_relevant(user_id, query, top_k=top_k)

    def continuation_context(
        self,
        user_id: str,
        query: str = "",
        max_tokens: int | None = None,
        *,
        top_k: int = DEFAULT_TOP_K,
    ) -> ContinuationContext:
        """Like :meth:`build_continuation_context`, with the sections and token counts used.

        Args:
            user_id: The user.
            query: What the new session is about; empty: the most recent sessions.
            max_tokens: Budget of the whole text, a positive integer; default
                ``context_max_tokens``.
            top_k: How many sessions to consider besides the most recent, 1..100.

        Raises:
            InvalidInputError: A bad id, query, ``max_tokens`` or ``top_k``
                (``field`` names it).
        """
        check_id(user_id, "user_id")
        if not isinstance(query, str):
            raise InvalidInputError(
                f"query must be a string, got {type(query).__name__}", field="query"
            )
        check_top_k(top_k)  # also bounds list_sessions below, when the query is empty
        budget = self.context_max_tokens if max_tokens is None else check_budget(max_tokens)
        latest = self.sessions.list_sessions(user_id, limit=1)
        ranked: list[SessionSummary]
        if query.strip():
            ranked = [
                hit.summary for hit in self.sessions.recall_relevant(user_id, query, top_k=top_k)
            ]
        else:
            ranked = self.sessions.list_sessions(user_id, limit=top_k)
        return assemble_context(
            user_id,
            # Items a store (e.g. LangGraph's) filed under the user count as the user's facts.
            facts=[*self.users.get_facts(user_id), *self.items.user_facts(user_id)],
            ranked_sessions=ranked,
            most_recent=latest[0] if latest else None,
            max_tokens=budget,
        )

    def build_continuation_context(
        self, user_id: str, query: str = "", max_tokens: int | None = None
    ) -> str:
        """Prompt-ready context for a new session: the user's facts and relevant earlier sessions.

        The most recent session is always included when it fits; whole
        summaries are left out, least relevant first, to stay within
        ``max_tokens`` (default ``context_max_tokens``); see
        :func:`memory.context.assemble_context` for the exact rule.

        Raises:
            InvalidInputError: A bad id, query or ``max_tokens`` (``field`` names it).
        """
        return self.continuation_context(user_id, query, max_tokens).text

    # -- user tier ----------------------------------------------------------

    def set_fact(
        self,
        user_id: str,
        key: str,
        value: JsonValue,
        *,
        source: str = "api",
        confidence: float = 1.0,
        evidence: str = "",
    ) -> UserFact:
        """Set a user fact or preference; the old value goes to its history.

        Raises:
            InvalidInputError: A bad id, or a value JSON cannot hold (NaN,
                infinity, a lone surrogate), source or confidence; ``field``
                names it and nothing was written.
            ValueTooLargeError: The fact is over the store's size limit.
        """
        return self.users.set_fact(
            user_id, key, value, source=source, confidence=confidence, evidence=evidence
        )

    def set_facts(
        self, user_id: str, facts: Mapping[str, JsonValue], *, source: str = "api"
    ) -> list[UserFact]:
        """Set several user facts in one atomic commit (all or nothing).

        Raises:
            InvalidInputError: ``facts`` is not a mapping, or a key or value is
                invalid (``field`` is ``facts.<key>``); nothing was written.
            ValueTooLargeError: A fact is over the store's size limit; nothing was written.
        """
        return self.users.set_facts(user_id, facts, source=source)

    def get_fact(self, user_id: str, key: str) -> UserFact:
        """One user fact (``FactNotFoundError`` if none)."""
        return self.users.get_fact(user_id, key)

    def get_facts(self, user_id: str) -> list[UserFact]:
        """Every current fact of a user, sorted by key."""
        return self.users.get_facts(user_id)

    def fact_history(self, user_id: str, key: str) -> list[UserFact]:
        """Every version of a fact, oldest first."""
        return self.users.fact_history(user_id, key)

    def delete_fact(self, user_id: str, key: str) -> bool:
        """Delete a fact (its history keeps a tombstone). Returns whether it existed."""
        return self.users.delete_fact(user_id, key)

    def forget_user(self, user_id: str) -> None:
        """Delete everything stored about a user, and keep work in flight from bringing it back.

        Gone when this returns: sessions (summaries, transcripts, vectors),
        facts with their history, items the user owns (e.g. under a LangGraph
        store's ``user_namespace``), the user's runs (checkpoints, events,
        effect ledgers, approvals), the user's summary jobs (queued, running
        or finished) and the user's entry in the tenant's user
        index. Transcripts go first: a summary still being made from one
        can then store neither its summary nor its facts (both are committed
        only while their transcript is stored), and a worker still running
        one of the runs gets ``RunNotFoundError`` on its next write. With
        ``scrub_deleted`` the KV store then drops the deleted data from its
        files (see the README for what each backend guarantees). Graph
        threads (``memory.threads``) are not owned by users: delete them by
        thread id.

        Raises:
            InvalidInputError: A bad id.
        """
        check_id(user_id, "user_id")
        self.sessions.delete_user_sessions(user_id)
        self.jobs.delete_user(user_id)
        self.users.delete_user(user_id)
        self.items.delete_user(user_id)
        for run in self.tasks.list_runs(user_id=user_id):
            self.tasks.delete_run(run.run_id)
        self.users.unlist_user(user_id)
        if self.scrub_deleted:
            scrub(self.kv)

    def _withdraw_session_facts(self, user_id: str, session_id: str) -> None:
        """The session's transcript was deleted or replaced: so is what was learned from it."""
        self.users.forget_source(user_id, _session_source(session_id))

    # -- task tier ----------------------------------------------------------

    def start_run(
        self,
        user_id: str,
        run_id: str | None = None,
        *,
        resume: bool = True,
        worker_id: str | None = None,
        lease_ttl: float | None = None,
        steal: bool = False,
        budget_tokens: int | None = None,
        budget_cost: float | None = None,
        external_id: str | None = None,
    ) -> RunHandle:
        """Start a run, or resume it (taking its lease) if it exists.

        With ``lease_ttl`` the lease expires unless the handle heartbeats, and
        another worker gets ``LeaseHeldError`` while it is live (unless ``steal``).
        A caller that names no ``worker_id`` is a worker of its own for this call
        (another thread or call of the same process included); to retake its own
        live lease it passes ``worker_id=handle.worker_id``.
        ``external_id`` is the run's id in another system (a framework's session
        or thread id, any string): it is kept in ``RunInfo.external_id``, and
        without ``run_id`` the run's id is ``run_id_for(external_id)``.
        """
        return self.tasks.start_run(
            user_id,
            run_id,
            resume=resume,
            worker_id=worker_id,
            lease_ttl=lease_ttl,
            steal=steal,
            budget_tokens=budget_tokens,
            budget_cost=budget_cost,
            external_id=external_id,
        )

    def cancel_run(self, run_id: str) -> RunInfo:
        """Cancel a run; its worker stops at its next step boundary."""
        return self.tasks.cancel(run_id)

    def approve_run(
        self, run_id: str, plan_hash: str, *, by: str, note: str | None = None
    ) -> Approval:
        """Approve the plan a run is waiting on (``PlanMismatchError`` for another plan)."""
        return self.tasks.approve(run_id, plan_hash, by=by, note=note)

    def reject_run(
        self, run_id: str, plan_hash: str, *, by: str, note: str | None = None
    ) -> Approval:
        """Reject the plan a run is waiting on."""
        return self.tasks.reject(run_id, plan_hash, by=by, note=note)

    def fork_run(self, run_id: str, checkpoint_id: str, new_run_id: str | None = None) -> RunInfo:
        """Start a new run from a checkpoint of another (time travel); the parent link is kept."""
        return self.tasks.fork(run_id, checkpoint_id, new_run_id)

    def list_resumable_runs(self) -> list[RunInfo]:
        """Unfinished runs whose lease has expired: work for a worker pool after a deploy.

        Runs blocked on an effect of unknown outcome (``RunInfo.unknown_effects``)
        are left out until :meth:`resolve_effect` settles it.
        """
        return self.tasks.list_resumable()

    def sweep_runs(self, *, now: datetime | None = None) -> list[str]:
        """Delete this tenant's runs that finished (completed, failed, cancelled) over ``run_retention`` ago.

        Deletes each run whole (head, events, checkpoints, effect ledger) in one
        commit; a run that changes meanwhile is left for the next sweep.
        ``tiermem sweep`` and the HTTP service (every
        ``run_sweep_interval_seconds``) call this.

        Args:
            now: The time to measure ages from (default: now).

        Returns:
            The ids of the deleted runs.
        """
        if now is not None:
            now = check_datetime(now, "now")
        return self.tasks.sweep(now=now)

    # -- retention ----------------------------------------------------------

    def retention(self) -> RetentionPolicy:
        """The retention in effect for this tenant: the default with the tenant's own overrides.

        ``tenant_set`` names the kinds the tenant set itself; a TTL of ``None``
        means that kind is kept forever.
        """
        return effective_policy(self.retention_default, read_overrides(self.kv, self.tenant))

    def set_retention(self, **ttls: timedelta | str | None) -> RetentionPolicy:
        """Set this tenant's retention of some kinds (stored in the KV store; the others are unchanged).

        Applied by the next :meth:`sweep` (the service sweeps every
        ``run_sweep_interval_seconds``). A TTL shortened later applies to
        everything stored already.

        Args:
            **ttls: ``sessions``, ``transcripts``, ``facts`` and/or
                ``idle_runs``, each a :class:`~datetime.timedelta` or text
                such as ``"90d"``, ``"12h"``, ``"2w"``; ``None`` or ``"off"``
                to keep that kind forever whatever the default; ``"default"``
                to follow the deployment's default again.

        Returns:
            The retention now in effect for this tenant.

        Raises:
            InvalidInputError: An unknown kind or a bad TTL (``field`` names it);
                nothing was changed.
        """
        set_overrides(self.kv, self.tenant, ttls)
        return self.retention()

    def sweep(self, *, now: datetime | None = None) -> SweepReport:
        """Delete what this tenant's retention says is expired, and finished runs past ``run_retention``.

        Sessions, transcripts, facts and idle runs past their TTL
        (:meth:`retention`) are deleted through the same paths as
        :meth:`delete_session` and :meth:`delete_run`: vectors and keyword
        search included, facts learned from a deleted session withdrawn, a
        worker of a deleted run refused on its next write. Users, sessions
        and runs are read a page at a time; anything written or touched
        while the sweep runs is left for the next one. With ``scrub_deleted``
        the KV store then drops the deleted data from its files. One log line
        (logger ``tiermem.memory``) says what was deleted. ``tiermem sweep``
        and the HTTP service (every ``run_sweep_interval_seconds``) call this.

        Args:
            now: The time to measure ages from (default: now).

        Returns:
            How many of each kind were deleted.

        Raises:
            InvalidInputError: ``now`` is not a datetime.
        """
        at = utcnow() if now is None else check_datetime(now, "now")
        report = sweep_expired(
            kv=self.kv,
            tasks=self.tasks,
            sessions=self.sessions,
            users=self.users,
            policy=self.retention(),
            now=at,
        )
        if report.deleted:
            logger.info("retention sweep %s", report.describe())
            if self.scrub_deleted:
                scrub(self.kv)
        return report

    def run_state_at(self, run_id: str, checkpoint_id: str) -> dict[str, JsonValue]:
        """A run's state values as of one of its checkpoints (time travel; see ``TaskTier.state_at``)."""
        return self.tasks.state_at(run_id, checkpoint_id)

    def update_run_state(
        self, run_id: str, checkpoint_id: str, values: dict[str, Any], *, by: str = "operator"
    ) -> Checkpoint:
        """Edit a run's state as of a checkpoint: a new branch from there (see ``TaskTier.update_state``)."""
        return self.tasks.update_state(run_id, checkpoint_id, values, by=by)

    def run_effects(self, run_id: str) -> list[EffectRecord]:
        """A run's effect ledger: every external effect, its status and recorded output."""
        return self.tasks.effects(run_id)

    def resolve_effect(
        self,
        run_id: str,
        key: str,
        *,
        output: object = UNSET,
        rerun: bool = False,
        by: str = "operator",
    ) -> EffectRecord:
        """Decide an effect of unknown outcome: it happened (``output=``) or not (``rerun=True``).

        See ``TaskTier.resolve_effect``; this unblocks the run.
        """
        return self.tasks.resolve_effect(run_id, key, output=output, rerun=rerun, by=by)

    def get_run(self, run_id: str) -> RunInfo:
        """Status and head of a run (``RunNotFoundError`` if none)."""
        return self.tasks.get_run(run_id)

    def delete_run(self, run_id: str) -> bool:
        """Delete a run whole, whatever its status: head, checkpoints, events, effect ledger.

        One atomic commit. A worker still holding the run's lease writes
        nothing more: its next write raises ``RunNotFoundError`` and cannot
        bring the run back; ``start_run`` with the same id later starts a new run.

        Returns:
            ``True`` if the run was deleted, ``False`` if there was none.

        Raises:
            InvalidInputError: Bad ``run_id``.
        """
        return self.tasks.delete_run(run_id)

    def get_checkpoint(self, run_id: str, checkpoint_id: str) -> Checkpoint:
        """One checkpoint of a run by its id (any branch), in one point read.

        Raises:
            RunNotFoundError: No such run.
            CheckpointNotFoundError: The run has no checkpoint with that id.
        """
        return self.tasks.get_checkpoint(run_id, checkpoint_id)

    def checkpoint_for_key(self, run_id: str, idempotency_key: str) -> Checkpoint | None:
        """The checkpoint that committed an idempotency key on the run's current branch.

        What a step replayed with that key returns; point reads only.

        Returns:
            The checkpoint, or ``None`` if no step on the current branch committed the key.

        Raises:
            RunNotFoundError: No such run.
            InvalidInputError: Bad ``idempotency_key``.
        """
        return self.tasks.checkpoint_for_key(run_id, idempotency_key)

    def run_history(
        self,
        run_id: str,
        *,
        newest_first: bool = False,
        limit: int | None = None,
        after_seq: int | None = None,
        before_seq: int | None = None,
    ) -> list[Checkpoint]:
        """A run's checkpoints: all of them in sequence order by default, or one page.

        A page costs its own size, however long the run. The cursor of the next
        page is the last checkpoint's seq: ``before_seq=page[-1].seq`` newest
        first, ``after_seq=page[-1].seq`` oldest first.

        Args:
            run_id: The run.
            newest_first: Descending seq order: the latest ``limit`` checkpoints first.
            limit: At most this many (``None``: every one in range).
            after_seq: Only checkpoints with a larger seq.
            before_seq: Only checkpoints with a smaller seq.

        Raises:
            RunNotFoundError: No such run.
            InvalidInputError: Negative ``limit``, ``after_seq`` or ``before_seq``.
        """
        return self.tasks.history(
            run_id,
            newest_first=newest_first,
            limit=limit,
            after_seq=after_seq,
            before_seq=before_seq,
        )

    def run_events(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """A run's append-only event log, the audit trail of the run, in sequence order.

        Args:
            run_id: The run.
            after_seq: Only events after this seq (for paging).
            limit: At most this many.

        Raises:
            RunNotFoundError: No such run.
            InvalidInputError: Negative ``after_seq`` or ``limit``.
        """
        return self.tasks.events(run_id, after_seq=after_seq, limit=limit)

    def list_runs(
        self, *, user_id: str | None = None, status: RunStatus | None = None
    ) -> list[RunInfo]:
        """Runs of this tenant, optionally filtered."""
        return self.tasks.list_runs(user_id=user_id, status=status)

    # -- lifecycle ----------------------------------------------------------

    def ping(self) -> None:
        """Raise ``BackendUnavailableError`` unless the KV store and vector index answer."""
        self.kv.ping()
        self.index.ping()

    def force_flush(self) -> None:
        """Make every commit acknowledged so far durable (bounded-durability mode; else a no-op).

        Run effects call it themselves before invoking an external effect;
        call it before anything else irreversible that depends on stored state.
        """
        self.tasks.force_flush()

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until the vector index holds every session saved so far (all tenant views).

        Recall does not need this (it reads its own writes); benchmarks and
        backups do. Returns whether everything was indexed within ``timeout``.
        """
        deadline = None if timeout is None else time.monotonic() + timeout
        for memory in self._with_views():
            left = None if deadline is None else max(0.0, deadline - time.monotonic())
            if not memory.sessions.flush(left):
                return False
        return True

    # -- vector index consistency -------------------------------------------

    def check_index(self) -> IndexReport:
        """Compare this tenant's vector index with the KV store (the truth).

        Finds vectors the index lacks (a lost collection, a Chroma server
        restarted empty), vectors made from content since replaced (stale)
        and vectors with no record behind them (orphans); sessions and items
        with index work still queued are left to their outbox. Without this
        a damaged index is silent: recall falls back to keyword order. The
        HTTP service runs it for every tenant every
        ``index_check_interval_seconds`` and reports it in ``/readyz`` and
        ``/metrics``.

        Raises:
            BackendUnavailableError: The KV store or the index failed.
        """
        return check_index(self.kv, self.index, self.tenant)

    def repair_index(self, *, limit: int | None = None) -> IndexRepair:
        """Check the index (:meth:`check_index`) and repair what is wrong, without a restart.

        Missing and stale vectors are re-embedded from the KV store, orphans
        deleted, through the same outbox and compare-and-set guards as a save
        (a session saved meanwhile keeps its newer vectors). Every process
        sharing the stores drops what it cached of the users repaired.
        ``tiermem reindex --all-tenants --damaged`` and the service's periodic
        check (``index_repair_batch`` per interval) call this.

        Args:
            limit: At most this many sessions and items repaired in this call
                (a bounded batch); ``None`` for all.

        Returns:
            The check before, a check after, and what was repaired.

        Raises:
            InvalidInputError: ``limit`` is not a positive integer.
            BackendUnavailableError: The KV store, the index or the embedder
                failed; what was not repaired stays queued or is found again.
        """
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 1
        ):
            raise InvalidInputError("limit must be a positive integer or None", field="limit")
        before = self.check_index()
        if before.consistent:
            return IndexRepair(before=before, after=before)
        queued = queue_repair(self.kv, self.index, before, limit=limit)
        self.sessions.repair()
        self.items.repair()
        bump_revisions(self.kv, self.tenant, users_of(queued.sessions))
        after = self.check_index()
        logger.info(
            "index repair of tenant %s: %d sessions and %d items re-indexed, %d stray vectors "
            "deleted; now %s",
            self.tenant,
            len(queued.sessions),
            queued.items,
            queued.deleted,
            after.describe(),
        )
        return IndexRepair(
            before=before,
            after=after,
            sessions=len(queued.sessions),
            items=queued.items,
            deleted=queued.deleted,
        )

    def tenants(self) -> list[str]:
        """Every tenant of these stores, sorted: those a ``Memory`` was opened for or with an API key.

        What a check or repair of every tenant goes through.

        Raises:
            BackendUnavailableError: The KV store failed.
        """
        found = {self.tenant, *registered_tenants(self.kv)}
        found.update(key.tenant for key in ApiKeyRegistry(self.kv).list_keys())
        return sorted(found)

    def close(self) -> None:
        """Finish queued index work, then close the stores (unless this is a tenant view).

        Index work not finished in time stays queued in the KV store and is
        replayed by the next instance opened on it. Idempotent.
        """
        if not self._owns_stores:
            return
        try:
            for memory in self._with_views():
                memory.sessions.close()
            self.index.close()
            self.kv.close()
        finally:
            if self._dir_lock is not None:
                self._dir_lock.release()

    def _with_views(self) -> list[Memory]:
        with self._tenants_lock:
            return [self, *self._tenants.values()]

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()


def _session_source(session_id: str) -> str:
    """The ``source`` of facts learned from a session."""
    return f"session:{session_id}"


def _settings(**values: Any) -> Settings:
    """Settings from ``values`` and the environment; a bad one is an error naming the setting."""
    try:
        return Settings(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "settings"
        raise InvalidInputError(f"invalid setting {field}: {first['msg']}", field=field) from exc


def _validate_summary(data: Mapping[str, Any]) -> SessionSummary:
    try:
        return SessionSummary.model_validate(dict(data))
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "summary"
        raise InvalidInputError(
            f"invalid session summary: {field}: {first['msg']}", field=field
        ) from exc


class AsyncMemory:
    """Async twin of :class:`Memory`: the same methods, run in a worker thread.

    Holds no logic of its own; every method delegates to the sync core.
    """

    def __init__(self, memory: Memory) -> None:
        self.sync = memory

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str] = ".tiermem", **overrides: Any) -> AsyncMemory:
        """See :meth:`Memory.open`."""
        return cls(Memory.open(data_dir, **overrides))

    @classmethod
    def from_settings(cls, settings: Settings | None = None) -> AsyncMemory:
        """See :meth:`Memory.from_settings`."""
        return cls(Memory.from_settings(settings))

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    def for_tenant(self, tenant: str) -> AsyncMemory:
        """See :meth:`Memory.for_tenant`."""
        return AsyncMemory(self.sync.for_tenant(tenant))

    async def save_session(self, summary: SessionSummary | Mapping[str, Any]) -> SessionSummary:
        """See :meth:`Memory.save_session`."""
        return await self._call(self.sync.save_session, summary)

    async def end_session(
        self,
        user_id: str,
        session_id: str,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        created_at: datetime | None = None,
    ) -> SessionSummary:
        """See :meth:`Memory.end_session`."""
        return await self._call(
            self.sync.end_session, user_id, session_id, transcript, created_at=created_at
        )

    async def save_transcript(
        self,
        user_id: str,
        session_id: str,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        created_at: datetime | None = None,
    ) -> None:
        """See :meth:`Memory.save_transcript`."""
        await self._call(
            self.sync.save_transcript, user_id, session_id, transcript, created_at=created_at
        )

    async def resummarize(self, user_id: str, session_id: str) -> SessionSummary:
        """See :meth:`Memory.resummarize`."""
        return await self._call(self.sync.resummarize, user_id, session_id)

    async def pending_summaries(self, user_id: str) -> list[str]:
        """See :meth:`Memory.pending_summaries`."""
        return await self._call(self.sync.pending_summaries, user_id)

    async def get_session(self, user_id: str, session_id: str) -> SessionSummary:
        """See :meth:`Memory.get_session`."""
        return await self._call(self.sync.get_session, user_id, session_id)

    async def list_sessions(
        self, user_id: str, *, limit: int | None = None
    ) -> list[SessionSummary]:
        """See :meth:`Memory.list_sessions`."""
        return await self._call(self.sync.list_sessions, user_id, limit=limit)

    async def delete_session(self, user_id: str, session_id: str) -> bool:
        """See :meth:`Memory.delete_session`."""
        return await self._call(self.sync.delete_session, user_id, session_id)

    async def recall_relevant(
        self, user_id: str, query: str, top_k: int = DEFAULT_TOP_K
    ) -> list[RecalledSession]:
        """See :meth:`Memory.recall_relevant`."""
        return await self._call(self.sync.recall_relevant, user_id, query, top_k)

    async def continuation_context(
        self,
        user_id: str,
        query: str = "",
        max_tokens: int | None = None,
        *,
        top_k: int = DEFAULT_TOP_K,
    ) -> ContinuationContext:
        """See :meth:`Memory.continuation_context`."""
        return await self._call(
            self.sync.continuation_context, user_id, query, max_tokens, top_k=top_k
        )

    async def build_continuation_context(
        self, user_id: str, query: str = "", max_tokens: int | None = None
    ) -> str:
        """See :meth:`Memory.build_continuation_context`."""
        return await self._call(self.sync.build_continuation_context, user_id, query, max_tokens)

    async def set_fact(
        self,
        user_id: str,
        key: str,
        value: JsonValue,
        *,
        source: str = "api",
        confidence: float = 1.0,
        evidence: str = "",
    ) -> UserFact:
        """See :meth:`Memory.set_fact`."""
        return await self._call(
            self.sync.set_fact,
            user_id,
            key,
            value,
            source=source,
            confidence=confidence,
            evidence=evidence,
        )

    async def set_facts(
        self, user_id: str, facts: Mapping[str, JsonValue], *, source: str = "api"
    ) -> list[UserFact]:
        """See :meth:`Memory.set_facts`."""
        return await self._call(self.sync.set_facts, user_id, facts, source=source)

    async def get_fact(self, user_id: str, key: str) -> UserFact:
        """See :meth:`Memory.get_fact`."""
        return await self._call(self.sync.get_fact, user_id, key)

    async def get_facts(self, user_id: str) -> list[UserFact]:
        """See :meth:`Memory.get_facts`."""
        return await self._call(self.sync.get_facts, user_id)

    async def fact_history(self, user_id: str, key: str) -> list[UserFact]:
        """See :meth:`Memory.fact_history`."""
        return await self._call(self.sync.fact_history, user_id, key)

    async def delete_fact(self, user_id: str, key: str) -> bool:
        """See :meth:`Memory.delete_fact`."""
        return await self._call(self.sync.delete_fact, user_id, key)

    async def forget_user(self, user_id: str) -> None:
        """See :meth:`Memory.forget_user`."""
        await self._call(self.sync.forget_user, user_id)

    async def start_run(
        self,
        user_id: str,
        run_id: str | None = None,
        *,
        resume: bool = True,
        worker_id: str | None = None,
        lease_ttl: float | None = None,
        steal: bool = False,
        budget_tokens: int | None = None,
        budget_cost: float | None = None,
        external_id: str | None = None,
    ) -> RunHandle:
        """See :meth:`Memory.start_run`. The handle's methods are synchronous (``aeffect`` aside)."""
        return await self._call(
            self.sync.start_run,
            user_id,
            run_id,
            resume=resume,
            worker_id=worker_id,
            lease_ttl=lease_ttl,
            steal=steal,
            budget_tokens=budget_tokens,
            budget_cost=budget_cost,
            external_id=external_id,
        )

    async def cancel_run(self, run_id: str) -> RunInfo:
        """See :meth:`Memory.cancel_run`."""
        return await self._call(self.sync.cancel_run, run_id)

    async def approve_run(
        self, run_id: str, plan_hash: str, *, by: str, note: str | None = None
    ) -> Approval:
        """See :meth:`Memory.approve_run`."""
        return await self._call(self.sync.approve_run, run_id, plan_hash, by=by, note=note)

    async def reject_run(
        self, run_id: str, plan_hash: str, *, by: str, note: str | None = None
    ) -> Approval:
        """See :meth:`Memory.reject_run`."""
        return await self._call(self.sync.reject_run, run_id, plan_hash, by=by, note=note)

    async def fork_run(
        self, run_id: str, checkpoint_id: str, new_run_id: str | None = None
    ) -> RunInfo:
        """See :meth:`Memory.fork_run`."""
        return await self._call(self.sync.fork_run, run_id, checkpoint_id, new_run_id)

    async def list_resumable_runs(self) -> list[RunInfo]:
        """See :meth:`Memory.list_resumable_runs`."""
        return await self._call(self.sync.list_resumable_runs)

    async def sweep_runs(self, *, now: datetime | None = None) -> list[str]:
        """See :meth:`Memory.sweep_runs`."""
        return await self._call(self.sync.sweep_runs, now=now)

    async def retention(self) -> RetentionPolicy:
        """See :meth:`Memory.retention`."""
        return await self._call(self.sync.retention)

    async def set_retention(self, **ttls: timedelta | str | None) -> RetentionPolicy:
        """See :meth:`Memory.set_retention`."""
        return await self._call(self.sync.set_retention, **ttls)

    async def sweep(self, *, now: datetime | None = None) -> SweepReport:
        """See :meth:`Memory.sweep`."""
        return await self._call(self.sync.sweep, now=now)

    async def run_state_at(self, run_id: str, checkpoint_id: str) -> dict[str, JsonValue]:
        """See :meth:`Memory.run_state_at`."""
        return await self._call(self.sync.run_state_at, run_id, checkpoint_id)

    async def update_run_state(
        self, run_id: str, checkpoint_id: str, values: dict[str, Any], *, by: str = "operator"
    ) -> Checkpoint:
        """See :meth:`Memory.update_run_state`."""
        return await self._call(self.sync.update_run_state, run_id, checkpoint_id, values, by=by)

    async def run_effects(self, run_id: str) -> list[EffectRecord]:
        """See :meth:`Memory.run_effects`."""
        return await self._call(self.sync.run_effects, run_id)

    async def resolve_effect(
        self,
        run_id: str,
        key: str,
        *,
        output: object = UNSET,
        rerun: bool = False,
        by: str = "operator",
    ) -> EffectRecord:
        """See :meth:`Memory.resolve_effect`."""
        return await self._call(
            self.sync.resolve_effect, run_id, key, output=output, rerun=rerun, by=by
        )

    async def get_run(self, run_id: str) -> RunInfo:
        """See :meth:`Memory.get_run`."""
        return await self._call(self.sync.get_run, run_id)

    async def delete_run(self, run_id: str) -> bool:
        """See :meth:`Memory.delete_run`."""
        return await self._call(self.sync.delete_run, run_id)

    async def get_checkpoint(self, run_id: str, checkpoint_id: str) -> Checkpoint:
        """See :meth:`Memory.get_checkpoint`."""
        return await self._call(self.sync.get_checkpoint, run_id, checkpoint_id)

    async def checkpoint_for_key(self, run_id: str, idempotency_key: str) -> Checkpoint | None:
        """See :meth:`Memory.checkpoint_for_key`."""
        return await self._call(self.sync.checkpoint_for_key, run_id, idempotency_key)

    async def run_history(
        self,
        run_id: str,
        *,
        newest_first: bool = False,
        limit: int | None = None,
        after_seq: int | None = None,
        before_seq: int | None = None,
    ) -> list[Checkpoint]:
        """See :meth:`Memory.run_history`."""
        return await self._call(
            self.sync.run_history,
            run_id,
            newest_first=newest_first,
            limit=limit,
            after_seq=after_seq,
            before_seq=before_seq,
        )

    async def run_events(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """See :meth:`Memory.run_events`."""
        return await self._call(self.sync.run_events, run_id, after_seq=after_seq, limit=limit)

    async def list_runs(
        self, *, user_id: str | None = None, status: RunStatus | None = None
    ) -> list[RunInfo]:
        """See :meth:`Memory.list_runs`."""
        return await self._call(self.sync.list_runs, user_id=user_id, status=status)

    async def ping(self) -> None:
        """See :meth:`Memory.ping`."""
        await self._call(self.sync.ping)

    async def force_flush(self) -> None:
        """See :meth:`Memory.force_flush`."""
        await self._call(self.sync.force_flush)

    async def flush(self, timeout: float | None = None) -> bool:
        """See :meth:`Memory.flush`."""
        return await self._call(self.sync.flush, timeout)

    async def check_index(self) -> IndexReport:
        """See :meth:`Memory.check_index`."""
        return await self._call(self.sync.check_index)

    async def repair_index(self, *, limit: int | None = None) -> IndexRepair:
        """See :meth:`Memory.repair_index`."""
        return await self._call(self.sync.repair_index, limit=limit)

    async def tenants(self) -> list[str]:
        """See :meth:`Memory.tenants`."""
        return await self._call(self.sync.tenants)

    async def close(self) -> None:
        """See :meth:`Memory.close`."""
        await self._call(self.sync.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
