"""The sync core of the facade: :class:`Memory`, the one object an agent or app backend talks to."""

from __future__ import annotations

import logging
import math
import os
import threading
from collections.abc import Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Self

from pydantic import JsonValue

from memory.context import ContinuationContext
from memory.core_runs import RunMethods
from memory.lifecycle import close_stores, flush_sessions
from memory.maintenance import Maintenance
from memory.metrics import TiermemMetrics
from memory.opening import open_stores, settings_for_dir
from memory.runs import RunOperations
from memory.sessions import DEFAULT_TOP_K, SessionOperations
from memory.settings import Settings
from memory.tenant import build_tenant_tiers, optional_instance
from memory.users import UserOperations
from summarizer import ExtractiveSummarizer, Summarizer
from tiers.backends.base import Embedder, KVStore, VectorIndex
from tiers.backends.dirlock import DataDirLock
from tiers.cache_ages import DEFAULT_MAX_AGE_SECONDS, SWEEPER
from tiers.errors import InvalidInputError
from tiers.ids import check_id
from tiers.index_check import IndexRepair, IndexReport, register_tenant
from tiers.models import Message, SessionSummary, UserFact
from tiers.redaction import Redactor
from tiers.retention import RetentionPolicy, SweepReport
from tiers.session import RecalledSession
from tiers.task import (
    DEFAULT_HEAD_FRESH_MS,
    DEFAULT_RETENTION,
    DEFAULT_SNAPSHOT_EVERY,
)

logger = logging.getLogger("tiermem.memory")


class Memory(RunMethods):
    """Three-tier memory for LLM agents: task runs, session summaries, user facts.

    Thread-safe: one instance is meant to be shared by every thread of a process.
    The methods delegate to composed groups that hold their full contracts:
    :class:`~memory.sessions.SessionOperations`, :class:`~memory.users.UserOperations`,
    :class:`~memory.runs.RunOperations`, :class:`~memory.maintenance.Maintenance`.
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
        run_retention: How long finished runs are kept before :meth:`sweep_runs` deletes them.
        snapshot_every: The task tier snapshots a run's state every this many
            events, which bounds the cost of resuming a long run.
        head_fresh_ms: How long (milliseconds) a run handle's step or appended
            checkpoint trusts the run head its last commit or read returned
            instead of reading it first (see ``TaskTier``); ``0``: read it every time.
        scrub_deleted: After :meth:`forget_user` and :meth:`delete_session`, have
            the KV store drop the deleted data from its files too (SQLite:
            truncate the WAL; Redis: rewrite the AOF), not only from every read.
        retention: The deployment's default retention of sessions, transcripts,
            facts and idle runs (default: everything kept); each tenant may
            override it (:meth:`set_retention`), and :meth:`sweep` applies it.
        redactor: What is removed before anything is stored (transcripts, so
            the summarizer never sees it either, summaries, facts, run data);
            default ``Redactor("secrets")`` (API keys, tokens, passwords, card
            numbers, private keys), ``Redactor("off")`` stores everything verbatim.
        metrics: Prometheus families the task tier feeds (:mod:`memory.metrics`); default none.
        cache_max_age_seconds: The most seconds the process's caches keep anything of a
            user's data, read or not (:mod:`tiers.cache_ages`): data deleted by another
            process leaves this one's memory within it. Process-wide: the smallest of the
            open instances' applies, until :meth:`close`.
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
        head_fresh_ms: float = DEFAULT_HEAD_FRESH_MS,
        scrub_deleted: bool = True,
        retention: RetentionPolicy | None = None,
        redactor: Redactor | None = None,
        metrics: TiermemMetrics | None = None,
        cache_max_age_seconds: float = DEFAULT_MAX_AGE_SECONDS,
    ) -> None:
        age = cache_max_age_seconds
        if isinstance(age, bool) or not isinstance(age, int | float) or not 0 <= age < math.inf:
            raise InvalidInputError(
                "cache_max_age_seconds must be a number of seconds >= 0",
                field="cache_max_age_seconds",
            )
        self.metrics = metrics
        self.redactor = optional_instance(redactor, Redactor, "redactor") or Redactor()
        self.retention_default = (
            optional_instance(retention, RetentionPolicy, "retention") or RetentionPolicy()
        )
        self.kv = kv
        self.index = index
        self.embedder = embedder
        # Replaceable (e.g. by a better model); session operations use the one set now.
        self.summarizer: Summarizer = summarizer or ExtractiveSummarizer()
        self.tenant = check_id(tenant, "tenant")
        self.context_max_tokens = context_max_tokens
        self.background_indexing = background_indexing
        self.scrub_deleted = scrub_deleted
        tiers = build_tenant_tiers(
            kv,
            index,
            embedder,
            tenant=self.tenant,
            redactor=self.redactor,
            run_retention=run_retention,
            snapshot_every=snapshot_every,
            head_fresh_ms=head_fresh_ms,
            background_indexing=background_indexing,
            scrub_deleted=scrub_deleted,
            observer=metrics,
        )
        self.tasks, self.sessions, self.users = tiers.tasks, tiers.sessions, tiers.users
        self.jobs, self.threads, self.items = tiers.jobs, tiers.threads, tiers.items
        self._owns_stores = True
        self._tenants: dict[str, Memory] = {}
        self._tenants_lock = threading.Lock()
        # Set by from_settings: the operator accepted a KV store that may lose acknowledged
        # writes (/readyz reports it); the data dir's lock, when an embedded store lives there.
        self.allow_volatile = False
        self._dir_lock: DataDirLock | None = None
        self._sessions_ops = SessionOperations(
            tiers, lambda: self.summarizer, context_max_tokens=context_max_tokens, metrics=metrics
        )
        self._users_ops = UserOperations(tiers)
        self._runs = RunOperations(self.tasks)
        self._maintenance = Maintenance(tiers, default=self.retention_default)
        # So a check or repair of every tenant (tenants()) finds this one.
        register_tenant(kv, self.tenant)
        self.cache_max_age_seconds = float(cache_max_age_seconds)
        # Last: a constructor that raised leaves no hold (and no sweeper thread) behind.
        self._release_cache_hold = SWEEPER.hold(self.cache_max_age_seconds)

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
                    head_fresh_ms=self.tasks.head_fresh_ms,
                    scrub_deleted=self.scrub_deleted,
                    retention=self.retention_default,
                    redactor=self.redactor,
                    metrics=self.metrics,
                    cache_max_age_seconds=self.cache_max_age_seconds,
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
        return cls.from_settings(settings_for_dir(data_dir, overrides))

    @classmethod
    def from_settings(
        cls, settings: Settings | None = None, *, metrics: TiermemMetrics | None = None
    ) -> Memory:
        """Open the stores and models that ``settings`` (default: from the environment) name.

        When an embedded store lives in ``data_dir`` (the default SQLite file or
        the embedded Chroma index), the dir is locked until :meth:`close`: one
        process per embedded data dir (the OS drops the lock if the process dies).
        A KV store that may lose acknowledged writes is refused unless
        ``settings.allow_volatile`` (then a warning is logged). ``metrics``: as for :class:`Memory`.

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
        opened = open_stores(settings)
        try:
            memory = cls(**opened.arguments, metrics=metrics)
        except BaseException:
            opened.close()
            raise
        memory.allow_volatile = opened.allow_volatile
        memory._dir_lock = opened.lock
        return memory

    # -- session tier -------------------------------------------------------

    def save_session(self, summary: SessionSummary | Mapping[str, Any]) -> SessionSummary:
        """Store a structured session summary (KV record + vector document)."""
        return self._sessions_ops.save_session(summary)

    def end_session(
        self,
        user_id: str,
        session_id: str,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        created_at: datetime | None = None,
    ) -> SessionSummary:
        """Store a finished session's transcript, then summarize it and save the summary."""
        return self._sessions_ops.end_session(
            user_id, session_id, transcript, created_at=created_at
        )

    def save_transcript(
        self,
        user_id: str,
        session_id: str,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        created_at: datetime | None = None,
    ) -> None:
        """Store a session's raw transcript without summarizing it (see :meth:`resummarize`)."""
        self._sessions_ops.save_transcript(user_id, session_id, transcript, created_at=created_at)

    def resummarize(self, user_id: str, session_id: str) -> SessionSummary:
        """Summarize a session from its stored transcript and save the summary (replacing any)."""
        return self._sessions_ops.resummarize(user_id, session_id)

    def pending_summaries(self, user_id: str) -> list[str]:
        """Sessions of the user with a stored transcript but no summary yet (summarizing failed)."""
        return self._sessions_ops.pending_summaries(user_id)

    def require_transcript(self, user_id: str, session_id: str) -> None:
        """Check that a session has a stored transcript (``SessionNotFoundError`` if not)."""
        self._sessions_ops.require_transcript(user_id, session_id)

    def get_session(self, user_id: str, session_id: str) -> SessionSummary:
        """The stored summary of one session (``SessionNotFoundError`` if none)."""
        return self._sessions_ops.get_session(user_id, session_id)

    def list_sessions(self, user_id: str, *, limit: int | None = None) -> list[SessionSummary]:
        """The user's session summaries, newest first."""
        return self._sessions_ops.list_sessions(user_id, limit=limit)

    def delete_session(self, user_id: str, session_id: str) -> bool:
        """Delete one session from the KV store and the vector index, and what it taught."""
        return self._sessions_ops.delete_session(user_id, session_id)

    def recall_relevant(
        self,
        user_id: str,
        query: str,
        top_k: int = DEFAULT_TOP_K,
        *,
        now: datetime | None = None,
    ) -> list[RecalledSession]:
        """The user's earlier sessions most relevant to ``query``, best first.

        A time the query names ("last March") is read relative to ``now`` (default: the
        current time).
        """
        return self._sessions_ops.recall_relevant(user_id, query, top_k, now=now)

    def continuation_context(
        self,
        user_id: str,
        query: str = "",
        max_tokens: int | None = None,
        *,
        top_k: int = DEFAULT_TOP_K,
        now: datetime | None = None,
    ) -> ContinuationContext:
        """Like :meth:`build_continuation_context`, with the sections and token counts used."""
        return self._sessions_ops.continuation_context(
            user_id, query, max_tokens, top_k=top_k, now=now
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

        ``now``: when the new session starts, for times its query names; default the current time.
        """
        return self._sessions_ops.build_continuation_context(user_id, query, max_tokens, now=now)

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
        """Set a user fact or preference; the old value goes to its history."""
        return self._users_ops.set_fact(
            user_id, key, value, source=source, confidence=confidence, evidence=evidence
        )

    def set_facts(
        self, user_id: str, facts: Mapping[str, JsonValue], *, source: str = "api"
    ) -> list[UserFact]:
        """Set several user facts in one atomic commit (all or nothing)."""
        return self._users_ops.set_facts(user_id, facts, source=source)

    def get_fact(self, user_id: str, key: str) -> UserFact:
        """One user fact (``FactNotFoundError`` if none)."""
        return self._users_ops.get_fact(user_id, key)

    def get_facts(self, user_id: str) -> list[UserFact]:
        """Every current fact of a user, sorted by key."""
        return self._users_ops.get_facts(user_id)

    def fact_history(self, user_id: str, key: str) -> list[UserFact]:
        """Every version of a fact, oldest first."""
        return self._users_ops.fact_history(user_id, key)

    def delete_fact(self, user_id: str, key: str) -> bool:
        """Delete a fact (its history keeps a tombstone). Returns whether it existed."""
        return self._users_ops.delete_fact(user_id, key)

    def delete_facts(self, user_id: str) -> None:
        """Forget every fact of the user, history included; sessions, runs and items stay."""
        self._users_ops.delete_facts(user_id)

    def forget_user(self, user_id: str) -> None:
        """Delete everything stored about a user, and keep work in flight from bringing it back."""
        self._users_ops.forget_user(user_id)

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
        return flush_sessions(self._with_views(), timeout)

    # -- retention and vector index upkeep ---------------------------------

    def retention(self) -> RetentionPolicy:
        """The retention in effect for this tenant: the default with the tenant's own overrides."""
        return self._maintenance.retention()

    def set_retention(self, **ttls: timedelta | str | None) -> RetentionPolicy:
        """Set this tenant's retention of some kinds (stored in the KV store; the others are unchanged)."""
        return self._maintenance.set_retention(**ttls)

    def sweep(self, *, now: datetime | None = None) -> SweepReport:
        """Delete what this tenant's retention says is expired, and finished runs past ``run_retention``."""
        return self._maintenance.sweep(now=now)

    def check_index(self) -> IndexReport:
        """Compare this tenant's vector index with the KV store (the truth)."""
        return self._maintenance.check_index()

    def repair_index(self, *, limit: int | None = None) -> IndexRepair:
        """Check the index (:meth:`check_index`) and repair what is wrong, without a restart."""
        return self._maintenance.repair_index(limit=limit)

    def tenants(self) -> list[str]:
        """Every tenant of these stores, sorted: those a ``Memory`` was opened for or with an API key."""
        return self._maintenance.tenants()

    def close(self) -> None:
        """Finish queued index work, then close the stores (unless this is a tenant view).

        Index work not finished in time stays queued in the KV store and is
        replayed by the next instance opened on it. Idempotent.
        """
        if self._owns_stores:
            views = self._with_views()
            try:
                close_stores(views, self.index, self.kv, self._dir_lock)
            finally:
                for view in views:  # a tenant view's hold ends with its stores
                    view._release_cache_hold()

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
