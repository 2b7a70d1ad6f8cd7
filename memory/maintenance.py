"""Tenant maintenance of :class:`~memory.Memory`: retention sweeps and vector index repair.

:class:`Maintenance` is composed into ``Memory``; its retention, sweep and
index methods delegate to the methods of the same name here, which hold their
contract. ``tiermem sweep``, ``tiermem reindex`` and the HTTP service's
periodic tasks run them.
"""

from __future__ import annotations

import logging
from datetime import datetime, timedelta

from memory.apikeys import ApiKeyRegistry
from memory.tenant import TenantTiers
from tiers.erasure import scrub
from tiers.errors import InvalidInputError
from tiers.index_check import (
    IndexRepair,
    IndexReport,
    bump_revisions,
    check_index,
    queue_repair,
    registered_tenants,
)
from tiers.models import utcnow
from tiers.retention import (
    RetentionPolicy,
    SweepReport,
    effective_policy,
    read_overrides,
    set_overrides,
    sweep_expired,
)
from tiers.session import users_of
from tiers.values import check_datetime

logger = logging.getLogger("tiermem.memory")


class Maintenance:
    """Retention and index upkeep of one tenant's stores.

    Args:
        tiers: The tenant's tiers.
        default: The deployment's default retention (the tenant may override it).
    """

    def __init__(self, tiers: TenantTiers, *, default: RetentionPolicy) -> None:
        self._kv = tiers.kv
        self._index = tiers.index
        self._tenant = tiers.tenant
        self._default = default
        self._tasks = tiers.tasks
        self._sessions = tiers.sessions
        self._users = tiers.users
        self._items = tiers.items
        self._scrub_deleted = tiers.scrub_deleted

    def retention(self) -> RetentionPolicy:
        """The retention in effect for this tenant: the default with the tenant's own overrides.

        ``tenant_set`` names the kinds the tenant set itself; a TTL of ``None``
        means that kind is kept forever.
        """
        return effective_policy(self._default, read_overrides(self._kv, self._tenant))

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
        set_overrides(self._kv, self._tenant, ttls)
        return self.retention()

    def sweep(self, *, now: datetime | None = None) -> SweepReport:
        """Delete what this tenant's retention says is expired, and finished runs past ``run_retention``.

        Sessions, transcripts, facts and idle runs past their TTL
        (:meth:`retention`) are deleted through the same paths as
        :meth:`~memory.Memory.delete_session` and
        :meth:`~memory.Memory.delete_run`: vectors and keyword search included, facts learned from a deleted session withdrawn, a
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
            kv=self._kv,
            tasks=self._tasks,
            sessions=self._sessions,
            users=self._users,
            policy=self.retention(),
            now=at,
        )
        if report.deleted:
            logger.info("retention sweep %s", report.describe())
            if self._scrub_deleted:
                scrub(self._kv)
        return report

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
        return check_index(self._kv, self._index, self._tenant)

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
        queued = queue_repair(self._kv, self._index, before, limit=limit)
        self._sessions.repair()
        self._items.repair()
        bump_revisions(self._kv, self._tenant, users_of(queued.sessions))
        after = self.check_index()
        logger.info(
            "index repair of tenant %s: %d sessions and %d items re-indexed, %d stray vectors "
            "deleted; now %s",
            self._tenant,
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
        found = {self._tenant, *registered_tenants(self._kv)}
        found.update(key.tenant for key in ApiKeyRegistry(self._kv).list_keys())
        return sorted(found)
