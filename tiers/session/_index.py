"""Keeping the vector index in line with the session tier's KV records (see :mod:`tiers.session`).

The KV store says what should be indexed; the outbox (``session_outbox_space``)
says which sessions may be out of date. :class:`SessionIndexer` reads both,
embeds, writes the vectors and then clears the outbox entries it handled, with
a check that each still holds the token it read (a newer writer's entry stays).

Vector ids of a session are its base id (the summary) and ``#1`` .. ``#n``
(windows). ``n`` is recorded in ``session_vectors_space`` as an upper bound:
raised *before* vectors are added, lowered only in the commit that clears the
outbox entry, after the surplus vectors were deleted. So whatever crashes
where, every vector a session ever had can be found again: no orphans.

Every vector carries ``rev``, the :func:`session_fingerprint` of the records it
was made from, so a consistency check (:mod:`tiers.index_check`) tells a vector
of a replaced summary from a current one without re-embedding anything.

Incremental indexing (background mode): embedding transcript windows is most of
the cost of a session, so the worker indexes in two passes. The first embeds the
base vector only (the summary's first window: recall then finds the session by it
and by keywords over the full transcript, which come from the KV store), deletes
any window vectors of an earlier state, and in the commit that clears the outbox
entry puts an entry in ``session_windows_outbox_space``. The second pass, run
when no first-pass work is queued and saves pause, embeds the other windows
(summary and transcript) and clears that entry under the same token check; it
gives way to queries and to first-pass work between model calls
(:mod:`tiers.session._windows`). Both entries are in the KV store, so a crash
between the passes loses nothing: the next worker replays both outboxes. In
foreground mode every sync does both passes at once.
"""

from __future__ import annotations

import enum
import hashlib
import logging
import threading
import time
from collections import OrderedDict
from collections.abc import Callable, Sequence

from tiers import keys
from tiers.backends.base import Check, Embedder, KVStore, Put, VectorIndex, Write
from tiers.errors import BackendUnavailableError, ConflictError, StoreClosedError
from tiers.session._plans import (
    FINGERPRINT_KEY,
    CachedEmbedder,
    Plan,
    Ref,
    enqueue,
    read_plans,
    requeue_first,
    scan_refs,
    take,
    users_of,
    vector_changes,
)
from tiers.session._windows import WindowPacer, background_lane

__all__ = [
    "FINGERPRINT_KEY",
    "WINDOW_BATCH",
    "WORKER_BATCH",
    "Ref",
    "SessionIndexer",
    "session_fingerprint",
]

logger = logging.getLogger(__name__)

BATCH = 256  # sessions per index batch
# Sessions per background batch at most: a recall that needs the sync lock waits for at most
# one such batch of other users' work (see SessionIndexer), so it bounds that wait.
WORKER_BATCH = 16
# Sessions per second-pass batch at most: up to TRANSCRIPT_WINDOWS + 1 texts each, embedded
# WINDOW_CHUNK at a time, giving way to queries and first-pass work between model calls.
# Batching more sessions saved little (the model's calls are per text-length group anyway)
# but made sessions saved during a window batch wait for all of it (bench/README.md).
WINDOW_BATCH = 1
# A second-pass batch starts once no session was submitted for this long (a burst of saves is
# made searchable first), or at the latest this long after the last one (windows never starve).
_WINDOW_IDLE = 0.25
_WINDOW_MAX_DELAY = 5.0
_SYNC_ATTEMPTS = 5
_MAX_BACKOFF = 30.0
# Part of every fingerprint: change it when the texts embedded for a session change
# (windowing, what a summary's text holds), and every vector counts as stale.
_SCHEME = b"tiermem-session-vectors/2"  # /2: at most TRANSCRIPT_WINDOWS windows


def session_fingerprint(record: bytes, transcript_header: bytes | None) -> str:
    """What a session's vectors were made from: its stored summary and transcript header bytes.

    Any change of either (a replaced summary, a new or removed transcript)
    gives another fingerprint.
    """
    digest = hashlib.blake2b(_SCHEME, digest_size=16)
    digest.update(len(record).to_bytes(8, "big"))
    digest.update(record)
    digest.update(transcript_header if transcript_header is not None else b"\xff")
    return digest.hexdigest()


class _Pass(enum.Enum):
    """What one sync embeds, and which outbox says what needs it."""

    BASE = "base"  # first pass: the base vector; the other windows are queued for WINDOWS
    FULL = "full"  # every window at once
    WINDOWS = "windows"  # second pass: the other windows of sessions the first pass queued


class SessionIndexer:
    """Brings the index in line with the KV store for sessions with queued work. Thread-safe.

    Within one process index updates are serialised (one sync at a time), so
    a slower writer never overwrites a newer vector with an older one.

    Fairness: the background worker queues work per user and takes batches
    round-robin over users (at most ``WORKER_BATCH`` sessions, or
    ``WINDOW_BATCH`` of second-pass work), so one user's bulk backlog does not
    hold back another user's sessions; second-pass batches are taken only when
    no first-pass work is queued; and it starts no new batch while a foreground
    sync (a recall settling its user's queued work) waits for the lock. So a
    recall waits for at most the one first-pass batch in flight, whatever the
    backlog of other users or tenants. The second pass embeds before it takes
    the lock, ``WINDOW_CHUNK`` windows per model call, and makes none while a
    query of the process is in flight (:mod:`tiers.session._windows`): a query
    shares the cores with at most one such call.

    Args:
        kv: The authoritative store.
        index: The vector index.
        embedder: Embeds summaries and transcript windows.
        tenant: The tenant whose sessions this indexes.
        on_indexed: Called with the user ids whose vectors changed.
        background: Run syncs in a worker thread (see :meth:`submit`), all but
            the base vector in a second pass (see the module docstring).
    """

    def __init__(
        self,
        kv: KVStore,
        index: VectorIndex,
        embedder: Embedder,
        *,
        tenant: str,
        on_indexed: Callable[[list[str]], None],
        background: bool,
    ) -> None:
        self._kv = kv
        self._index = index
        self._embedder = embedder
        self._tenant = tenant
        self._on_indexed = on_indexed
        self._outbox = keys.session_outbox_space(tenant)
        self._windows_outbox = keys.session_windows_outbox_space(tenant)
        self._sync_lock = threading.Lock()
        self._needs_repair = threading.Event()
        self._embed = CachedEmbedder(embedder)
        # The second pass embeds on one thread where it can: nobody waits for it.
        self._lane = background_lane(embedder) if background else embedder
        self._pacer = WindowPacer()
        self.background = background
        # user -> session ids (an ordered set): first-pass work, and second-pass work.
        self._queue: OrderedDict[str, dict[str, None]] = OrderedDict()
        self._windows_queue: OrderedDict[str, dict[str, None]] = OrderedDict()
        self._foreground = 0  # foreground syncs waiting for or holding the sync lock
        self._last_submit = self._last_windows = time.monotonic()
        self._cond = threading.Condition()
        self._busy = False  # the worker runs first-pass work (or a repair)
        self._busy_windows = False  # the worker runs second-pass work
        self._stopping = False
        self._worker: threading.Thread | None = None
        if background:
            self._needs_repair.set()  # the worker replays the outboxes first
            self._worker = threading.Thread(
                target=self._work, name=f"tiermem-session-index-{tenant}", daemon=True
            )
            self._worker.start()

    # -- scheduling ---------------------------------------------------------------------------

    def submit(self, refs: Sequence[Ref]) -> None:
        """Index work for sessions just committed: done now, or handed to the worker.

        An outage is not an error here: the work stays in the outbox and is
        retried (the write it follows is already acknowledged).
        """
        if not self.background:
            try:
                self.sync(refs)
            except BackendUnavailableError as exc:
                self.postpone(exc)
            return
        with self._cond:
            enqueue(self._queue, refs)
            self._last_submit = time.monotonic()
            self._cond.notify_all()

    def postpone(self, exc: BaseException) -> None:
        """Record that index work failed and must be replayed from the outbox."""
        logger.warning("session index update postponed, queued for repair: %s", exc)
        self._needs_repair.set()
        with self._cond:
            self._cond.notify_all()

    def repair_if_needed(self) -> None:
        """Replay the outbox if an earlier update failed (foreground mode only)."""
        if self.background or not self._needs_repair.is_set():
            return
        try:
            self.repair()
        except BackendUnavailableError as exc:
            logger.warning("session index repair failed again, will retry: %s", exc)

    def repair(self) -> int:
        """Sync every session with an outbox entry; returns how many were processed.

        Sessions whose transcript windows are still to be indexed (a second
        pass a crash or an outage cut short) are indexed too: at once in
        foreground mode, by the worker's second pass in background mode.

        Raises:
            BackendUnavailableError: A store failed; the work stays queued.
        """
        refs = scan_refs(self._kv, self._outbox)
        in_worker = threading.current_thread() is self._worker
        # In the worker, repair keeps the fairness bound: small batches, recalls first.
        step = WORKER_BATCH if in_worker else BATCH
        for start in range(0, len(refs), step):
            if in_worker:
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping or not self._foreground)
            self.sync(refs[start : start + step])
        windows = scan_refs(self._kv, self._windows_outbox)
        if self.background:
            with self._cond:
                enqueue(self._windows_queue, windows)
                self._cond.notify_all()
        else:
            for start in range(0, len(windows), BATCH):
                self.sync_windows(windows[start : start + BATCH])
        self._needs_repair.clear()
        if refs:
            logger.info("session index repair processed %d queued session(s)", len(refs))
        return len(refs)

    def forget_embedded(self) -> None:
        """Drop the vectors kept of embedded texts (after a commit deleting sessions)."""
        self._embed.forget()

    def queued(self, user_id: str) -> list[Ref]:
        """The user's sessions with an outbox entry (not yet searchable by their base vector)."""
        prefix = keys.session_outbox_key(user_id, "")
        return [
            (user_id, key[len(prefix) :]) for key, _ in self._kv.scan(self._outbox, prefix=prefix)
        ]

    def flush(self, timeout: float | None = None, *, windows: bool = True) -> bool:
        """Wait until all queued work is done; False on timeout or if work is left for repair.

        Args:
            timeout: Seconds to wait at most; ``None``: no limit.
            windows: Wait for the second pass too (every window indexed);
                ``False``: only until every session is searchable by its base
                vector (and keywords).
        """
        if not self.background:
            self.repair_if_needed()
            return not self._needs_repair.is_set()
        with self._cond:
            # A worker stopped on a closed store never does the rest: no use waiting for it.
            self._cond.wait_for(lambda: self._stopping or self._idle(windows), timeout)
            return self._idle(windows)

    def _idle(self, windows: bool) -> bool:
        """Nothing queued or running for the first pass (and the second if ``windows``); ``_cond`` held."""
        second = windows and bool(self._windows_queue or self._busy_windows)
        return not (self._queue or self._busy or self._needs_repair.is_set() or second)

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the worker after it finishes the queue (up to ``timeout``). Idempotent.

        Second-pass work not done by then stays in the KV store for the next worker.
        """
        worker = self._worker
        if worker is None:
            return
        self.flush(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        worker.join(timeout)
        self._worker = None

    def _windows_wait(self) -> float | None:
        """Seconds until second-pass work may start; ``None``: none queued (``_cond`` held)."""
        if not self._windows_queue:
            return None
        due = min(self._last_submit + _WINDOW_IDLE, self._last_windows + _WINDOW_MAX_DELAY)
        wait = due - time.monotonic()
        return wait if wait > 0 else self._pacer.wait()

    @property
    def windows_held(self) -> int:
        """How many times queries in flight held the second pass back (each hold counted once)."""
        with self._cond:
            return self._pacer.holds

    def _wait_for_work(self) -> bool:
        """Wait until the worker may start a batch; False when it is stopping (``_cond`` held)."""
        while not self._stopping:
            wait = None
            if not self._foreground:
                if self._queue or self._needs_repair.is_set():
                    return True
                wait = self._windows_wait()
                if wait is not None and wait <= 0:
                    return True
            self._cond.wait(wait)
        return False

    def _work(self) -> None:
        backoff = 0.5
        while True:
            with self._cond:
                if not self._wait_for_work():
                    return
                # What queued meanwhile goes in one batch (that is what makes it fast), taken
                # round-robin over users so that a bulk backlog does not starve the others.
                repairing = self._needs_repair.is_set()
                taken = take(self._queue, WORKER_BATCH)
                # Windows only when nothing makes sessions searchable first: the second pass.
                windows = [] if taken or repairing else take(self._windows_queue, WINDOW_BATCH)
                if windows:
                    self._last_windows = time.monotonic()
                self._busy = bool(taken) or repairing
                self._busy_windows = bool(windows)
            failed = False
            try:
                if repairing:
                    self.repair()
                if taken:
                    self.sync(taken)
                if windows:
                    if self._embed_windows(windows):
                        self.sync_windows(windows)
                    else:  # gave way: first-pass work or a stop came first
                        with self._cond:
                            requeue_first(self._windows_queue, windows)
                backoff = 0.5
            except StoreClosedError as exc:  # final, unlike an outage: retrying cannot succeed
                logger.warning("session index worker stops, work stays in the outboxes: %s", exc)
                with self._cond:
                    self._stopping = True  # flush() returns instead of waiting for it,
                    self._needs_repair.set()  # False: work is left (in the outboxes)
                return
            except Exception as exc:  # the worker must survive anything: the outboxes keep the work
                failed = True
                if windows:
                    # Only second-pass work failed: the sessions stay searchable (no repair
                    # needed for that), their windows are retried after the backoff.
                    logger.warning("session window indexing failed, will retry: %r", exc)
                    with self._cond:
                        enqueue(self._windows_queue, windows)
                elif isinstance(exc, BackendUnavailableError):
                    self.postpone(exc)
                else:
                    logger.exception("session index worker failed; the work stays queued")
                    self._needs_repair.set()
            finally:
                with self._cond:
                    self._busy = self._busy_windows = False
                    self._cond.notify_all()
            if failed or self._needs_repair.is_set():
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping, backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)

    def _embed_windows(self, refs: list[Ref]) -> bool:
        """Embed the windows ``refs`` need into the cache, giving way between model calls.

        Without the sync lock: the locked pass then finds them cached. False: it gave way."""
        tokens = self._tokens(refs, _Pass.WINDOWS)
        live = [ref for ref, token in zip(refs, tokens, strict=True) if token is not None]
        read_at = self._embed.mark()
        plans = read_plans(
            self._kv,
            self._tenant,
            live,
            fingerprint=session_fingerprint,
            with_windows=True,
            with_terms=False,
        )
        return self._pacer.run(
            [text for plan in plans for text in plan.indexed[1:]],
            lambda texts: self._embed.embed(texts, read_at=read_at, using=self._lane),
            self._cond,
            give_way=lambda: self._stopping or bool(self._queue) or self._needs_repair.is_set(),
        )

    def queued_in_worker(self) -> int:
        """Sessions handed to the background worker and not yet taken into a batch."""
        with self._cond:
            return sum(len(sessions) for sessions in self._queue.values())

    def windows_queued_in_worker(self) -> int:
        """Sessions searchable by their summary whose transcript windows wait for the worker."""
        with self._cond:
            return sum(len(sessions) for sessions in self._windows_queue.values())

    # -- syncing ------------------------------------------------------------------------------

    def sync(self, refs: Sequence[Ref]) -> None:
        """Make the index match the KV store for ``refs`` with queued work, then clear it.

        In background mode this is the first pass: the sessions become
        searchable, their transcript windows are queued for the second
        (:meth:`sync_windows`). Called from any thread but the worker's, it
        goes before the worker's next batch (see the class docstring).

        Raises:
            BackendUnavailableError: A store or the embedder failed; the work stays queued.
        """
        self._run(refs, _Pass.BASE if self.background else _Pass.FULL)

    def sync_windows(self, refs: Sequence[Ref]) -> None:
        """The second pass: index the transcript windows the first pass left for ``refs``.

        Sessions with first-pass work queued are skipped: that pass redoes them.

        Raises:
            BackendUnavailableError: A store or the embedder failed; the work stays queued.
        """
        self._run(refs, _Pass.WINDOWS)

    def _run(self, refs: Sequence[Ref], kind: _Pass) -> None:
        pending = list(dict.fromkeys(refs))
        foreground = threading.current_thread() is not self._worker
        if foreground:
            with self._cond:
                self._foreground += 1
        try:
            with self._sync_lock:
                for _ in range(_SYNC_ATTEMPTS):
                    if not pending:
                        return
                    pending = self._sync_once(pending, force=False, kind=kind)
        finally:
            if foreground:
                with self._cond:
                    self._foreground -= 1
                    self._cond.notify_all()
        if pending:
            # Other writers kept re-queueing these; their own sync (or repair) finishes them.
            logger.info("%d session(s) left queued for the next repair", len(pending))

    def rebuild(self, refs: Sequence[Ref]) -> None:
        """Re-index ``refs`` whether or not work is queued for them (for a reindex).

        Raises:
            BackendUnavailableError: A store or the embedder failed.
        """
        with self._sync_lock:
            self._sync_once(list(dict.fromkeys(refs)), force=True, kind=_Pass.FULL)

    def drop_strays(self, user_id: str) -> int:
        """Delete the user's vectors whose session has no KV record (found by metadata: slow).

        Such vectors come from older versions or from outside this tier. Runs
        under the sync lock, so a save in this process is either seen in the
        KV store here or indexes its vectors after this delete.

        Returns:
            How many vectors were deleted.
        """
        prefix = keys.session_vector_id(self._tenant, user_id, "")
        with self._sync_lock:
            by_session: dict[str, list[str]] = {}
            where = {"tenant": self._tenant, "user_id": user_id}
            for vector_id in self._index.ids(where=where):
                if vector_id.startswith(prefix):
                    session_id = vector_id[len(prefix) :].partition("#")[0]
                    by_session.setdefault(session_id, []).append(vector_id)
            if not by_session:
                return 0
            session_ids = list(by_session)
            records = self._kv.get_many(keys.sessions_space(self._tenant, user_id), session_ids)
            doomed = [
                vector_id
                for session_id, record in zip(session_ids, records, strict=True)
                if record is None
                for vector_id in by_session[session_id]
            ]
            if doomed:
                self._index.delete(doomed)
        if doomed:
            self._on_indexed([user_id])
        return len(doomed)

    def _sync_once(self, refs: list[Ref], *, force: bool, kind: _Pass) -> list[Ref]:
        """One pass; returns the refs re-queued meanwhile. ``force``: also refs with no entry."""
        source = self._windows_outbox if kind is _Pass.WINDOWS else self._outbox
        entry_keys = [keys.session_outbox_key(user, sid) for user, sid in refs]
        # Tokens are read before records: a record read later is at least as new as its token.
        tokens = self._tokens(refs, kind)
        work = [
            (ref, key, token)
            for ref, key, token in zip(refs, entry_keys, tokens, strict=True)
            if token is not None or force
        ]
        if not work:
            return []  # whoever cleared the entries indexed a state at least this new
        read_at = self._embed.mark()
        plans = read_plans(
            self._kv,
            self._tenant,
            [ref for ref, _, _ in work],
            fingerprint=session_fingerprint,
            with_windows=kind is not _Pass.BASE,
            with_terms=kind is not _Pass.WINDOWS,  # only a first (or full) pass stores them
        )
        counts = keys.session_vectors_space
        grown = [
            Put(counts(self._tenant, plan.ref[0]), plan.ref[1], str(plan.new_count).encode())
            for plan in plans
            if plan.new_count > plan.old_count
        ]
        if grown:
            # Before any vector is added, so a crash can never leave one unaccounted for.
            self._kv.commit(grown)
        try:
            # The second pass adds the windows: the first one wrote the base vector.
            self._write_vectors(plans, read_at, windows_only=kind is _Pass.WINDOWS)
        finally:
            self._on_indexed(users_of(refs))
        requeued = self._clear(work, plans, source)
        deferred = [plan.ref for plan in plans if plan.deferred]
        if deferred:
            with self._cond:
                enqueue(self._windows_queue, deferred)
                self._cond.notify_all()
        return requeued

    def _tokens(self, refs: Sequence[Ref], kind: _Pass) -> list[bytes | None]:
        """The outbox tokens of ``refs`` for a pass of ``kind``; ``None``: no work queued."""
        entry_keys = [keys.session_outbox_key(user, sid) for user, sid in refs]
        if kind is not _Pass.WINDOWS:
            return self._kv.get_many(self._outbox, entry_keys)
        tokens = self._kv.get_many(self._windows_outbox, entry_keys)
        # A session with first-pass work queued is redone by it, windows queued again.
        ahead = self._kv.get_many(self._outbox, entry_keys)
        return [
            token if first is None else None for token, first in zip(tokens, ahead, strict=True)
        ]

    def _write_vectors(self, plans: list[Plan], read_at: int, *, windows_only: bool) -> None:
        first = 1 if windows_only else 0
        texts = [text for plan in plans for text in plan.indexed[first:]]
        vectors = self._embed.embed(texts, read_at=read_at)
        items, removals = vector_changes(self._tenant, plans, vectors, first=first)
        if items:
            self._index.upsert(items)
        if removals:
            self._index.delete(removals)

    def _clear(
        self, work: list[tuple[Ref, str, bytes | None]], plans: list[Plan], source: str
    ) -> list[Ref]:
        """Remove the ``source`` entries still holding the tokens read; return refs re-queued since.

        Each removal also lowers the session's vector count to what is now
        indexed, in the same commit as its token check, so a newer writer's
        higher count is never lowered. Clearing a first-pass entry queues the
        session's windows for the second pass in that commit (or drops such an
        entry when nothing is left for it).
        """
        held: list[tuple[Ref, list[Write], Check]] = []
        for (ref, key, token), plan in zip(work, plans, strict=True):
            if token is None:
                continue
            writes = plan.clear_writes(
                self._tenant, source, key, token, first_pass=source == self._outbox
            )
            held.append((ref, writes, Check(source, key, token)))
        if not held:
            return []
        try:
            self._kv.commit(
                [write for _, writes, _ in held for write in writes],
                [check for _, _, check in held],
            )
            return []
        except ConflictError:
            pass
        # Someone re-queued some of them meanwhile: clear the rest one by one, redo those.
        requeued: list[Ref] = []
        for ref, writes, check in held:
            try:
                self._kv.commit(writes, [check])
            except ConflictError:
                requeued.append(ref)
        return requeued
