"""The tiers of one tenant over shared stores: what ``Memory`` and its operation groups compose.

:func:`build_tenant_tiers` builds every tier of a tenant around the same KV
store, vector index and embedder; :class:`TenantTiers` hands them to the
operation groups (:mod:`memory.sessions`, :mod:`memory.users`,
:mod:`memory.maintenance`), each of which uses the ones it needs. Facts
learned from a session carry its :func:`session_source`, and go when the
session's transcript goes.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TypeVar

from tiers.backends.base import Embedder, KVStore, VectorIndex
from tiers.errors import InvalidInputError
from tiers.items import ItemStore
from tiers.redaction import Redactor
from tiers.session import SessionTier, SummaryJobs
from tiers.task import TaskObserver, TaskTier
from tiers.threads import ThreadTier
from tiers.user import UserTier

T = TypeVar("T")


def session_source(session_id: str) -> str:
    """The ``source`` of facts learned from a session."""
    return f"session:{session_id}"


@dataclass(frozen=True, slots=True)
class TenantTiers:
    """Every tier of one tenant, over the same stores.

    Attributes:
        kv: The authoritative KV store.
        index: The vector index of sessions and items.
        tenant: The tenant.
        tasks: Task runs.
        sessions: Session summaries and transcripts.
        users: User facts.
        jobs: Durable summary jobs (the service's background summaries), run by any replica.
        threads: Checkpoint DAGs of graph frameworks (the LangGraph checkpointer's storage).
        items: Namespaced JSON items (what framework stores such as LangGraph's BaseStore hold).
        scrub_deleted: Whether a delete also drops the data from the KV store's files.
    """

    kv: KVStore
    index: VectorIndex
    tenant: str
    tasks: TaskTier
    sessions: SessionTier
    users: UserTier
    jobs: SummaryJobs
    threads: ThreadTier
    items: ItemStore
    scrub_deleted: bool


def optional_instance(value: object, cls: type[T], field: str) -> T | None:
    """``value`` if it is a ``cls``, ``None`` if it is ``None``.

    Raises:
        InvalidInputError: Anything else (``field`` names the argument).
    """
    if value is None or isinstance(value, cls):
        return value
    raise InvalidInputError(
        f"{field} must be a {cls.__name__}, got {type(value).__name__}", field=field
    )


def build_tenant_tiers(
    kv: KVStore,
    index: VectorIndex,
    embedder: Embedder,
    *,
    tenant: str,
    redactor: Redactor,
    run_retention: timedelta,
    snapshot_every: int,
    head_fresh_ms: float,
    background_indexing: bool,
    scrub_deleted: bool,
    observer: TaskObserver | None = None,
) -> TenantTiers:
    """Build the tiers of ``tenant`` (see :class:`~memory.Memory` for the arguments).

    Args:
        kv: The KV store.
        index: The vector index.
        embedder: Embeds summaries, items and queries.
        tenant: The tenant (a checked id).
        redactor: What every tier removes before storing.
        run_retention: How long finished runs are kept.
        snapshot_every: Events between snapshots of a run's state.
        head_fresh_ms: How long a run handle trusts the head it last read or wrote.
        background_indexing: Embed saved sessions in a worker thread.
        scrub_deleted: Whether deletes also drop data from the KV store's files.
        observer: What the task tier reports to (metrics); default: nobody.
    """
    # First: it checks its options before any tier below starts a worker thread.
    tasks = TaskTier(
        kv,
        tenant=tenant,
        retention=run_retention,
        snapshot_every=snapshot_every,
        head_fresh_ms=head_fresh_ms,
        redactor=redactor,
        observer=observer,
    )
    users = UserTier(kv, tenant=tenant, redactor=redactor)

    def withdraw_session_facts(user_id: str, session_id: str) -> None:
        users.forget_source(user_id, session_source(session_id))

    sessions = SessionTier(
        kv,
        index,
        embedder,
        tenant=tenant,
        background=background_indexing,
        # What a session taught goes with its transcript (deleted or replaced).
        on_transcript_removed=withdraw_session_facts,
        redactor=redactor,
    )
    return TenantTiers(
        kv=kv,
        index=index,
        tenant=tenant,
        tasks=tasks,
        sessions=sessions,
        users=users,
        jobs=SummaryJobs(kv, sessions, tenant=tenant),
        threads=ThreadTier(kv, tenant=tenant),
        items=ItemStore(kv, index, embedder, tenant=tenant, redactor=redactor),
        scrub_deleted=scrub_deleted,
    )
