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
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict, deque
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass

from tiers import keys
from tiers.backends.base import (
    Check,
    Delete,
    Embedder,
    KVStore,
    Put,
    VectorIndex,
    VectorItem,
    Write,
)
from tiers.codec import decode
from tiers.errors import BackendUnavailableError, ConflictError, CorruptRecordError
from tiers.models import Message, SessionSummary
from tiers.session._chunking import session_windows
from tiers.session._transcripts import decode_transcript, header_key, page_key, read_header

__all__ = ["FINGERPRINT_KEY", "WORKER_BATCH", "Ref", "SessionIndexer", "session_fingerprint"]

logger = logging.getLogger(__name__)

Ref = tuple[str, str]  # (user_id, session_id)

BATCH = 256  # sessions per index batch
# Sessions per background batch at most: a recall that needs the sync lock waits for at most
# one such batch of other users' work (see SessionIndexer), so it bounds that wait.
WORKER_BATCH = 16
_SYNC_ATTEMPTS = 5
_EMBED_CACHE = 4096  # recently embedded texts kept, so re-indexing unchanged windows is free
_MAX_BACKOFF = 30.0
# Part of every fingerprint: change it when the texts embedded for a session change
# (windowing, what a summary's text holds), and every vector counts as stale.
_SCHEME = b"tiermem-session-vectors/2"  # /2: at most TRANSCRIPT_WINDOWS windows

FINGERPRINT_KEY = "rev"
"""Metadata key of a session vector holding its :func:`session_fingerprint`."""


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


@dataclass(slots=True)
class _Plan:
    """What the index should hold for one session after a sync."""

    ref: Ref
    summary: SessionSummary | None  # None: the session is gone (or unreadable): remove it
    texts: list[str]  # texts to embed: [summary window, *extra windows]
    old_count: int  # extra windows the index may hold now (upper bound)
    fingerprint: str = ""  # session_fingerprint of the records read (with a summary)

    @property
    def new_count(self) -> int:
        return max(0, len(self.texts) - 1) if self.summary is not None else 0


class SessionIndexer:
    """Brings the index in line with the KV store for sessions with queued work. Thread-safe.

    Within one process index updates are serialised (one sync at a time), so
    a slower writer never overwrites a newer vector with an older one.

    Fairness: the background worker queues work per user and takes batches
    round-robin over users (at most ``WORKER_BATCH`` sessions), so one user's
    bulk backlog does not hold back another user's sessions; and it starts no
    new batch while a foreground sync (a recall settling its user's queued
    work) waits for the lock. So a recall waits for at most the one batch in
    flight, whatever the backlog of other users or tenants.

    Args:
        kv: The authoritative store.
        index: The vector index.
        embedder: Embeds summaries and transcript windows.
        tenant: The tenant whose sessions this indexes.
        on_indexed: Called with the user ids whose vectors changed.
        background: Run syncs in a worker thread (see :meth:`submit`).
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
        self._sync_lock = threading.Lock()
        self._needs_repair = threading.Event()
        self._embed_lock = threading.Lock()
        self._embedded: OrderedDict[str, list[float]] = OrderedDict()
        self.background = background
        self._queue: OrderedDict[str, deque[str]] = OrderedDict()  # user -> session ids
        self._foreground = 0  # foreground syncs waiting for or holding the sync lock
        self._cond = threading.Condition()
        self._busy = False
        self._stopping = False
        self._worker: threading.Thread | None = None
        if background:
            self._needs_repair.set()  # the worker replays the outbox first
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
            for user_id, session_id in refs:
                self._queue.setdefault(user_id, deque()).append(session_id)
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

        Raises:
            BackendUnavailableError: A store failed; the work stays queued.
        """
        refs: list[Ref] = []
        for key, _ in self._kv.scan(self._outbox):
            user_id, _, session_id = key.partition("/")
            if user_id and session_id:
                refs.append((user_id, session_id))
        in_worker = threading.current_thread() is self._worker
        # In the worker, repair keeps the fairness bound: small batches, recalls first.
        step = WORKER_BATCH if in_worker else BATCH
        for start in range(0, len(refs), step):
            if in_worker:
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping or not self._foreground)
            self.sync(refs[start : start + step])
        self._needs_repair.clear()
        if refs:
            logger.info("session index repair processed %d queued session(s)", len(refs))
        return len(refs)

    def queued(self, user_id: str) -> list[Ref]:
        """The user's sessions with an outbox entry."""
        prefix = keys.session_outbox_key(user_id, "")
        return [
            (user_id, key[len(prefix) :]) for key, _ in self._kv.scan(self._outbox, prefix=prefix)
        ]

    def flush(self, timeout: float | None = None) -> bool:
        """Wait until all queued work is done; False on timeout or if work is left for repair."""
        if not self.background:
            self.repair_if_needed()
            return not self._needs_repair.is_set()
        with self._cond:
            return self._cond.wait_for(
                lambda: not self._queue and not self._busy and not self._needs_repair.is_set(),
                timeout,
            )

    def close(self, timeout: float | None = 10.0) -> None:
        """Stop the worker after it finishes the queue (up to ``timeout``). Idempotent."""
        worker = self._worker
        if worker is None:
            return
        self.flush(timeout)
        with self._cond:
            self._stopping = True
            self._cond.notify_all()
        worker.join(timeout)
        self._worker = None

    def _work(self) -> None:
        backoff = 0.5
        while True:
            with self._cond:
                self._cond.wait_for(
                    lambda: (
                        self._stopping
                        or (
                            (bool(self._queue) or self._needs_repair.is_set())
                            and not self._foreground
                        )
                    )
                )
                if self._stopping:
                    return
                # What queued meanwhile goes in one batch (that is what makes it fast), taken
                # round-robin over users so that a bulk backlog does not starve the others.
                taken = self._take(WORKER_BATCH)
                self._busy = True
            try:
                if self._needs_repair.is_set():
                    self.repair()
                if taken:
                    self.sync(taken)
                backoff = 0.5
            except BackendUnavailableError as exc:
                self.postpone(exc)
            except Exception:  # the worker must survive anything: the outbox keeps the work
                logger.exception("session index worker failed; the work stays queued")
                self._needs_repair.set()
            finally:
                with self._cond:
                    self._busy = False
                    self._cond.notify_all()
            if self._needs_repair.is_set():
                with self._cond:
                    self._cond.wait_for(lambda: self._stopping, backoff)
                backoff = min(backoff * 2, _MAX_BACKOFF)

    def _take(self, limit: int) -> list[Ref]:
        """Up to ``limit`` queued refs, one per user in turn (call with ``_cond`` held)."""
        taken: list[Ref] = []
        while self._queue and len(taken) < limit:
            user_id, sessions = next(iter(self._queue.items()))
            taken.append((user_id, sessions.popleft()))
            del self._queue[user_id]
            if sessions:
                self._queue[user_id] = sessions  # to the back of the line
        return taken

    def queued_in_worker(self) -> int:
        """Sessions handed to the background worker and not yet taken into a batch."""
        with self._cond:
            return sum(len(sessions) for sessions in self._queue.values())

    # -- syncing ------------------------------------------------------------------------------

    def sync(self, refs: Sequence[Ref]) -> None:
        """Make the index match the KV store for ``refs`` with queued work, then clear it.

        Called from any thread but the worker's, it goes before the worker's next
        batch (see the class docstring).

        Raises:
            BackendUnavailableError: A store or the embedder failed; the work stays queued.
        """
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
                    pending = self._sync_once(pending, force=False)
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
            self._sync_once(list(dict.fromkeys(refs)), force=True)

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

    def _sync_once(self, refs: list[Ref], *, force: bool) -> list[Ref]:
        """One pass; returns the refs re-queued meanwhile. ``force``: also refs with no entry."""
        outbox_keys = [keys.session_outbox_key(user, sid) for user, sid in refs]
        # Tokens are read before records: a record read later is at least as new as its token.
        tokens = self._kv.get_many(self._outbox, outbox_keys)
        work = [
            (ref, key, token)
            for ref, key, token in zip(refs, outbox_keys, tokens, strict=True)
            if token is not None or force
        ]
        if not work:
            return []  # whoever cleared the entries indexed a state at least this new
        plans = self._plan([ref for ref, _, _ in work])
        grown = [
            Put(self._counts(plan.ref[0]), plan.ref[1], str(plan.new_count).encode())
            for plan in plans
            if plan.new_count > plan.old_count
        ]
        if grown:
            # Before any vector is added, so a crash can never leave one unaccounted for.
            self._kv.commit(grown)
        try:
            self._write_vectors(plans)
        finally:
            self._on_indexed(users_of(refs))
        return self._clear(work, plans)

    def _counts(self, user_id: str) -> str:
        return keys.session_vectors_space(self._tenant, user_id)

    def _plan(self, refs: list[Ref]) -> list[_Plan]:
        by_user: dict[str, list[str]] = {}
        for user_id, session_id in refs:
            by_user.setdefault(user_id, []).append(session_id)
        plans: dict[Ref, _Plan] = {}
        for user_id, session_ids in by_user.items():
            space = keys.sessions_space(self._tenant, user_id)
            records = self._kv.get_many(space, session_ids)
            counts = self._kv.get_many(self._counts(user_id), session_ids)
            transcripts, raw_headers = self._read_transcripts(
                user_id, [sid for sid, data in zip(session_ids, records, strict=True) if data]
            )
            for session_id, data, count in zip(session_ids, records, counts, strict=True):
                summary = None
                if data is not None:
                    try:
                        summary = decode(SessionSummary, data, where=f"{space}/{session_id}")
                    except CorruptRecordError as exc:
                        # Unindexable; reading it still raises. A re-save indexes it again.
                        logger.error("not indexing a corrupt session record: %s", exc)
                texts = (
                    session_windows(summary, transcripts.get(session_id))
                    if summary is not None
                    else []
                )
                plans[(user_id, session_id)] = _Plan(
                    ref=(user_id, session_id),
                    summary=summary,
                    texts=texts,
                    old_count=int(count) if count is not None and count.isdigit() else 0,
                    fingerprint=(
                        session_fingerprint(data, raw_headers.get(session_id))
                        if data is not None
                        else ""
                    ),
                )
        return [plans[ref] for ref in refs]

    def _read_transcripts(
        self, user_id: str, session_ids: list[str]
    ) -> tuple[dict[str, list[Message]], dict[str, bytes]]:
        """The sessions' transcripts (those readable) and their raw stored headers."""
        if not session_ids:
            return {}, {}
        space = keys.transcripts_space(self._tenant, user_id)
        raw_headers = self._kv.get_many(space, [header_key(sid) for sid in session_ids])
        raw_of = {
            sid: raw for sid, raw in zip(session_ids, raw_headers, strict=True) if raw is not None
        }
        headers = {
            sid: header
            for sid, raw in zip(session_ids, raw_headers, strict=True)
            if (header := read_header(raw, where=f"{space}/{sid}")) is not None
        }
        page_keys = [page_key(sid, n) for sid, h in headers.items() for n in range(h.pages)]
        pages = dict(zip(page_keys, self._kv.get_many(space, page_keys), strict=True))
        out: dict[str, list[Message]] = {}
        for session_id, header in headers.items():
            try:
                out[session_id] = decode_transcript(
                    header,
                    [pages[page_key(session_id, n)] for n in range(header.pages)],
                    where=f"{space}/{session_id}",
                )
            except CorruptRecordError as exc:
                # The summary is still indexed; the transcript's windows wait for a re-save.
                logger.error("not indexing a damaged transcript: %s", exc)
        return out, raw_of

    def _write_vectors(self, plans: list[_Plan]) -> None:
        vectors = iter(self._embed([text for plan in plans for text in plan.texts]))
        items: list[VectorItem] = []
        removals: list[str] = []
        for plan in plans:
            user_id, session_id = plan.ref
            base = keys.session_vector_id(self._tenant, user_id, session_id)
            if plan.summary is None:
                removals.append(base)
            else:
                metadata: dict[str, str | int | float | bool] = {
                    "tenant": self._tenant,
                    "user_id": user_id,
                    "session_id": session_id,
                    "created_at": plan.summary.created_at.timestamp(),
                    "created_at_iso": plan.summary.created_at.isoformat(),
                    FINGERPRINT_KEY: plan.fingerprint,
                }
                for n in range(len(plan.texts)):
                    chunk_id = keys.session_chunk_vector_id(self._tenant, user_id, session_id, n)
                    items.append(
                        VectorItem(
                            id=base if n == 0 else chunk_id,
                            embedding=next(vectors),
                            # No text in the index: recall reads summaries from the KV store,
                            # and a vector index's own log (embedded Chroma's queue table, a
                            # server's WAL) would keep a deleted user's words out of reach.
                            document="",
                            metadata={**metadata, "window": n},
                        )
                    )
            removals.extend(
                keys.session_chunk_vector_id(self._tenant, user_id, session_id, n)
                for n in range(plan.new_count + 1, plan.old_count + 1)
            )
        if items:
            self._index.upsert(items)
        if removals:
            self._index.delete(removals)

    def _embed(self, texts: list[str]) -> list[list[float]]:
        """Embed with a small cache: re-indexing an unchanged transcript costs nothing."""
        digests = [hashlib.blake2b(text.encode(), digest_size=16).hexdigest() for text in texts]
        found: dict[str, list[float]] = {}
        with self._embed_lock:
            for digest in digests:
                cached = self._embedded.get(digest)
                if cached is not None:
                    found[digest] = cached
        missing = list(dict.fromkeys(d for d in digests if d not in found))
        if missing:
            text_of = dict(zip(digests, texts, strict=True))
            fresh = self._embedder.embed([text_of[digest] for digest in missing])
            with self._embed_lock:
                for digest, vector in zip(missing, fresh, strict=True):
                    found[digest] = vector
                    self._embedded[digest] = vector
                while len(self._embedded) > _EMBED_CACHE:
                    self._embedded.popitem(last=False)
        return [found[digest] for digest in digests]

    def _clear(self, work: list[tuple[Ref, str, bytes | None]], plans: list[_Plan]) -> list[Ref]:
        """Remove the outbox entries still holding the tokens read; return refs re-queued since.

        Each removal also lowers the session's vector count to what is now
        indexed, in the same commit as its token check, so a newer writer's
        higher count is never lowered.
        """
        held: list[tuple[Ref, list[Write], Check]] = []
        for (ref, key, token), plan in zip(work, plans, strict=True):
            if token is None:
                continue
            writes: list[Write] = [Delete(self._outbox, key)]
            if plan.summary is None or plan.new_count == 0 < plan.old_count:
                writes.append(Delete(self._counts(ref[0]), ref[1]))
            elif plan.new_count < plan.old_count:
                writes.append(Put(self._counts(ref[0]), ref[1], str(plan.new_count).encode()))
            held.append((ref, writes, Check(self._outbox, key, token)))
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


def users_of(refs: Iterable[Ref]) -> list[str]:
    """Distinct user ids of ``refs``, in first-seen order."""
    return list(dict.fromkeys(user for user, _ in refs))
