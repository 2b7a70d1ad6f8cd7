"""What one running app holds: memory, tenant views, key registry, jobs, read threads."""

from __future__ import annotations

import asyncio
import hashlib
import logging
import threading
import time
from collections.abc import Callable
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any, TypeVar

from api.jobs import JobRegistry
from api.metrics import Metrics
from api.offload import Offloader
from memory.apikeys import ApiKeyRegistry, Scope
from memory.facade import Memory
from memory.settings import Settings
from tiers import keys
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import StoreClosedError
from tiers.index_check import IndexReport
from tiers.models import SessionSummary

T = TypeVar("T")

logger = logging.getLogger("tiermem.api")

_KEY_CACHE_MAX = 10_000
# A hosted embedder that answered counts as ready for this long: probes come every few
# seconds, and each answer is a paid request.
_EMBEDDER_PROBE_TTL_S = 30.0
# While a periodic pass fails (the store is down), its wait doubles up to this long (or its
# period, if longer): an outage logs a warning now and then, not one per short period.
_MAX_OUTAGE_WAIT_S = 60.0


@dataclass(frozen=True, slots=True)
class Principal:
    """Who is calling: the tenant every request acts in and what it may do.

    Attributes:
        tenant: The tenant of the caller's API key (or the server's tenant with auth off).
        scopes: ``read`` and/or ``write``.
        key_id: The API key's public id; ``None`` with auth off.
        user_id: The one user the key may act for (see :mod:`memory.binding`),
            or ``None`` for every user of the tenant.
    """

    tenant: str
    scopes: frozenset[Scope]
    key_id: str | None
    user_id: str | None = None


class ServiceState:
    """Shared state of one app; every method is thread-safe.

    Args:
        settings: The service's settings.
        memory: The memory it serves; closed by :meth:`close` only if ``owns_memory``.
        metrics: Where to count.
        owns_memory: Whether the app opened ``memory`` (and so must close it).
    """

    def __init__(
        self, settings: Settings, memory: Memory, metrics: Metrics, *, owns_memory: bool
    ) -> None:
        self.settings = settings
        self.memory = memory
        self.metrics = metrics
        self.keys = ApiKeyRegistry(memory.kv)
        # Durable in the KV store and shared by every replica; its workers start with jobs.start().
        self.jobs = JobRegistry(
            kv=memory.kv,
            views=self.view,
            run=self.resummarize,
            workers=settings.summarize_workers,
            max_pending=settings.max_pending_jobs,
            retention_seconds=settings.job_retention_seconds,
            lease_seconds=settings.job_lease_seconds,
            max_attempts=settings.job_max_attempts,
            on_outcome=metrics.job_outcome,
        )
        self.reads = Offloader(threads=2, name="tiermem-reads")
        # A read of the embedded SQLite store takes tens of microseconds and never waits for
        # a writer (WAL mode, a connection per thread), so hot reads run on the event loop:
        # measured 1.4x the fact reads per second of any thread hop, whose GIL hand-offs cost
        # more than the read. Reads of a network store (Redis) go to the read threads. An
        # encrypted store (EncryptedKVStore) adds microseconds of decryption: judged by its inner.
        self.inline_reads = isinstance(getattr(memory.kv, "inner", memory.kv), SqliteKVStore)
        self._owns_memory = owns_memory
        self._views: dict[str, Memory] = {memory.tenant: memory}
        self._views_lock = threading.Lock()
        self._key_cache: dict[str, tuple[float, Principal]] = {}
        self._key_cache_lock = threading.Lock()
        # Bumped by each revocation: a verification that read the registry before it is not kept.
        self._key_generation = 0
        # Verifications in flight, by key digest, with the key generation they began in.
        self._verifying: dict[str, tuple[int, asyncio.Future[Principal]]] = {}
        self._embedder_ok_at: float | None = None
        self._stop_sweeping = threading.Event()
        self._sweeper: threading.Thread | None = None
        self._index_reports: dict[str, IndexReport] = {}
        self._index_lock = threading.Lock()
        self._stop_checking = threading.Event()
        self._index_checker: threading.Thread | None = None
        metrics.watch(jobs_pending=self.jobs_backlog, outbox_backlog=self.outbox_backlog)

    # -- tenants -------------------------------------------------------------------------------

    def cached_view(self, tenant: str) -> Memory | None:
        """The tenant's memory view if it was opened before (never blocks on I/O)."""
        return self._views.get(tenant)

    def view(self, tenant: str) -> Memory:
        """The tenant's memory view; the first call per tenant may do I/O (index repair)."""
        view = self._views.get(tenant)
        if view is None:
            view = self.memory.for_tenant(tenant)
            with self._views_lock:
                self._views[tenant] = view
        return view

    def outbox_backlog(self) -> float:
        """Session index updates still queued, over the tenants served so far."""
        with self._views_lock:
            tenants = list(self._views)
        try:
            return float(
                sum(len(self.memory.kv.scan(keys.session_outbox_space(t))) for t in tenants)
            )
        except Exception:  # a scrape must not fail because the store is down
            return float("nan")

    def jobs_backlog(self) -> float:
        """Summary jobs not finished yet, every tenant's (the same on every replica)."""
        try:
            return float(self.jobs.pending)
        except Exception:  # a scrape must not fail because the store is down
            return float("nan")

    # -- auth ----------------------------------------------------------------------------------

    def cached_principal(self, key: str) -> Principal | None:
        """The principal of a key verified less than ``auth_cache_seconds`` ago, else ``None``."""
        ttl = self.settings.auth_cache_seconds
        if ttl <= 0:
            return None
        digest = hashlib.sha256(key.encode()).hexdigest()
        hit = self._key_cache.get(digest)
        if hit is None or hit[0] < time.monotonic():
            return None
        return hit[1]

    def authenticate(self, key: str) -> Principal:
        """Verify a key against the registry (may do I/O).

        Raises:
            InvalidApiKeyError: The key is malformed, unknown or revoked.
        """
        generation = self._key_generation
        info = self.keys.verify(key)
        principal = Principal(
            tenant=info.tenant,
            scopes=frozenset(info.scopes),
            key_id=info.key_id,
            user_id=info.user_id,
        )
        ttl = self.settings.auth_cache_seconds
        if ttl > 0:
            digest = hashlib.sha256(key.encode()).hexdigest()
            with self._key_cache_lock:
                if generation != self._key_generation:
                    return principal  # revoked meanwhile, maybe this key: not trusted for ttl
                if len(self._key_cache) >= _KEY_CACHE_MAX:
                    self._key_cache.clear()
                self._key_cache[digest] = (time.monotonic() + ttl, principal)
        return principal

    async def read(self, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, a short store read: on the event loop for a local store, else offloaded.

        Call from the event loop only.
        """
        if self.inline_reads:
            return fn(*args)
        return await self.reads.run(fn, *args)

    async def verify(self, key: str) -> Principal:
        """Verify a key (see :meth:`read`); concurrent calls for one key share one verification.

        When a cached verification expires under load, every request in flight
        with that key would otherwise read the registry at once; they wait for
        the first one instead, unless a key was revoked here since it began (it
        may have read the registry before): then they read it again. Call from
        the event loop only.

        Raises:
            InvalidApiKeyError: The key is malformed, unknown or revoked.
        """
        digest = hashlib.sha256(key.encode()).hexdigest()
        generation = self._key_generation
        began, pending = self._verifying.get(digest, (None, None))
        if pending is None or began != generation:
            pending = asyncio.ensure_future(self.read(self.authenticate, key))
            self._verifying[digest] = (generation, pending)
            pending.add_done_callback(lambda done: self._verified(digest, done))
        # Shielded: a caller that goes away must not cancel the others' verification.
        return await asyncio.shield(pending)

    def _verified(self, digest: str, done: asyncio.Future[Principal]) -> None:
        if self._verifying.get(digest, (None, None))[1] is done:  # not a later one of the key
            del self._verifying[digest]
        if not done.cancelled():
            done.exception()  # marks it retrieved, should every waiter have gone away

    def revoke_key(self, key_id: str) -> None:
        """Revoke a key and forget every cached verification at once (in this process)."""
        self.keys.revoke(key_id)
        with self._key_cache_lock:
            self._key_generation += 1
            self._key_cache.clear()

    # -- work ----------------------------------------------------------------------------------

    def resummarize(self, memory: Memory, user_id: str, session_id: str) -> SessionSummary:
        """Summarize a stored transcript and save the summary, counting the outcome and tokens."""
        try:
            # A memory with metrics (these: the service shares them) times its summarizer itself.
            timer = (
                self.metrics.library.summarizer.time() if memory.metrics is None else nullcontext()
            )
            with timer:
                saved = memory.resummarize(user_id, session_id)
        except Exception as exc:
            self.metrics.summarizer_failed(exc)
            raise
        self.metrics.summarized(saved.usage)
        return saved

    def warm_up(self) -> None:
        """Load the embedding model now, so the first recall does not pay for it."""
        load = getattr(self.memory.embedder, "load", None)
        if callable(load):
            load()

    def check_embedder(self) -> None:
        """Raise unless the embedder can embed: a local model loads, a hosted one answers.

        A hosted model's answer is trusted for ``_EMBEDDER_PROBE_TTL_S`` seconds.

        Raises:
            EmbedderError: The model cannot be loaded or did not answer.
        """
        embedder = self.memory.embedder
        if callable(getattr(embedder, "load", None)):
            self.warm_up()
            return
        now = time.monotonic()
        last = self._embedder_ok_at
        if last is not None and now - last < _EMBEDDER_PROBE_TTL_S:
            return
        embedder.embed(["readiness probe"])
        self._embedder_ok_at = now

    # -- retention -----------------------------------------------------------------------------

    def sweep(self) -> int:
        """Sweep every tenant this service knows (:meth:`memory.Memory.sweep`), counting what went.

        Those are the service's own tenant and every tenant with an API key;
        each is swept with its own retention. A tenant whose sweep fails is
        logged and the others are still swept.

        Returns:
            How many records were deleted.

        Raises:
            StoreClosedError: The store was closed (final: no tenant can be swept).
        """
        tenants = {self.memory.tenant, *(key.tenant for key in self.keys.list_keys())}
        deleted = 0
        for tenant in sorted(tenants):
            try:
                report = self.view(tenant).sweep()
                self.jobs.purge(self.view(tenant))  # finished jobs past job_retention_seconds
            except StoreClosedError:
                raise  # final, unlike an outage: no other tenant can be swept either
            except Exception as exc:  # a store outage, a damaged record: the next period retries
                logger.warning("retention sweep of tenant %s failed: %s", tenant, exc)
                continue
            self.metrics.swept(report)
            deleted += report.deleted
        return deleted

    def start_sweeping(self) -> None:
        """Sweep every ``run_sweep_interval_seconds`` in a daemon thread (0: never)."""
        interval = self.settings.run_sweep_interval_seconds
        if interval <= 0 or self._sweeper is not None:
            return
        self._sweeper = threading.Thread(
            target=self._sweep_loop, args=(interval,), name="tiermem-sweep", daemon=True
        )
        self._sweeper.start()

    def _sweep_loop(self, interval: float) -> None:
        _every(interval, self._stop_sweeping, self.sweep, "retention sweep", at_once=False)

    # -- vector index consistency ---------------------------------------------------------------

    def check_indexes(self, *, repair: bool | None = None) -> dict[str, IndexReport]:
        """Check every tenant's vector index against the KV store, repairing a batch where damaged.

        The tenants are :meth:`memory.Memory.tenants` (every one opened, every
        one with an API key). With ``repair`` (default: ``index_repair_batch`` >
        0) a damaged tenant gets up to ``index_repair_batch`` sessions and items
        re-indexed (:meth:`memory.Memory.repair_index`) and is checked again. The
        last report of each tenant is kept for ``/readyz`` and shown in
        ``/metrics``; a tenant whose check fails (a store outage) is logged and
        keeps its last report.

        Returns:
            The latest report of every tenant checked so far.

        Raises:
            StoreClosedError: The store was closed (final: no tenant can be checked).
        """
        batch = self.settings.index_repair_batch
        repair = batch > 0 if repair is None else repair
        for tenant in self.memory.tenants():
            if self._stop_checking.is_set():
                break
            try:
                view = self.view(tenant)
                if repair:
                    repaired = view.repair_index(limit=batch or None)
                    self.metrics.index_repaired_tenant(repaired)
                    report = repaired.after
                else:
                    report = view.check_index()
            except StoreClosedError:
                raise  # final, unlike an outage: no other tenant can be checked either
            except Exception as exc:  # an outage: /readyz shows the store; the next period retries
                logger.warning("index check of tenant %s failed: %s", tenant, exc)
                continue
            self.metrics.index_checked_tenant(report)
            with self._index_lock:
                self._index_reports[tenant] = report
        self.metrics.index_checked.set(time.time())
        with self._index_lock:
            return dict(self._index_reports)

    def index_reports(self) -> list[IndexReport] | None:
        """The last index check of every tenant; ``None`` before the first check finished."""
        with self._index_lock:
            if not self._index_reports:
                return None
            return list(self._index_reports.values())

    def start_index_checks(self) -> None:
        """Check (and repair) every tenant's index now and every ``index_check_interval_seconds``.

        In a daemon thread, so startup does not wait for it (0: never).
        """
        interval = self.settings.index_check_interval_seconds
        if interval <= 0 or self._index_checker is not None:
            return
        self._index_checker = threading.Thread(
            target=self._index_check_loop, args=(interval,), name="tiermem-index-check", daemon=True
        )
        self._index_checker.start()

    def _index_check_loop(self, interval: float) -> None:
        _every(interval, self._stop_checking, self.check_indexes, "index check", at_once=True)

    def close(self) -> None:
        """Stop sweeping, finish running jobs and reads, then close the stores if this app opened them.

        Running summary jobs get ``shutdown_timeout_seconds`` to finish; the
        rest are given back to the store, for any replica to run.
        """
        self._stop_sweeping.set()
        self._stop_checking.set()
        if self._sweeper is not None:
            self._sweeper.join()
        if self._index_checker is not None:
            # A check stops between tenants; a repair batch in flight gets the shutdown bound.
            self._index_checker.join(self.settings.shutdown_timeout_seconds)
        self.jobs.close(timeout=self.settings.shutdown_timeout_seconds)
        self.reads.close()
        if self._owns_memory:
            self.memory.close()


def _every(
    interval: float, stop: threading.Event, work: Callable[[], object], what: str, *, at_once: bool
) -> None:
    """Run ``work`` every ``interval`` seconds until ``stop`` is set or its store is closed.

    A closed store (:class:`~tiers.errors.StoreClosedError`) ends the loop:
    unlike an outage it is final, and retrying would only log the same error
    every period. Any other error (the store is down, say) is logged and the
    pass retried, the wait doubling while it fails, up to ``_MAX_OUTAGE_WAIT_S``
    or ``interval``, whichever is longer.

    Args:
        interval: Seconds between passes.
        stop: Set to end the loop.
        work: One pass.
        what: What a pass is called in the log.
        at_once: Run the first pass now instead of after ``interval``.
    """
    wait = 0.0 if at_once else interval
    while not stop.wait(wait):
        try:
            work()
        except StoreClosedError as exc:
            logger.info("%s stops, its store is closed: %s", what, exc)
            return
        except Exception as exc:  # an outage, a damaged record: the next pass retries
            logger.warning("%s failed: %s", what, exc)
            wait = min(max(wait, interval) * 2, max(interval, _MAX_OUTAGE_WAIT_S))
            continue
        wait = interval
