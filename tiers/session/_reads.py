"""The session tier's read paths: stored summaries and transcripts, listing, and recall.

:class:`SessionReader` reads the KV store (the truth) and, for listing and
recall, the user's cached view (:mod:`tiers.session._view`). Recall checks
its input, settles the user's queued index work, embeds the query (while a
long-lived worker reads what a cold view still lacks, :class:`_ViewWorkers`: the
reader's own, or past the process's cap an idle one of another reader's), and
hands the view's inputs to :func:`tiers.session._recall.rank`, which decides
the order; it then reads the best records in small rounds. The contracts are
documented on :class:`~tiers.session.SessionTier`.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
import weakref
from collections.abc import Callable
from datetime import datetime
from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field

from tiers import keys
from tiers.codec import decode
from tiers.errors import InvalidInputError, SessionNotFoundError
from tiers.ids import check_id
from tiers.models import MAX_TEXT, Message, SessionSummary, utcnow
from tiers.session._lending import Lenders, Loan, OnLoan
from tiers.session._recall import FusionWeights, Ranked, rank
from tiers.session._store import SessionStore
from tiers.session._transcripts import (
    TranscriptHeader,
    decode_header,
    decode_transcript,
    header_key,
    is_header_key,
    page_key,
)
from tiers.session._view import UserView
from tiers.values import check_datetime

__all__ = ["MAX_TOP_K", "RecalledSession", "SessionReader", "check_top_k"]

logger = logging.getLogger(__name__)

MAX_TOP_K = 100


def check_top_k(top_k: object) -> int:
    """``top_k`` if it is an integer from 1 to :data:`MAX_TOP_K` (not a bool).

    Raises:
        InvalidInputError: Anything else; ``field`` is ``top_k``.
    """
    if not isinstance(top_k, int) or isinstance(top_k, bool) or not 1 <= top_k <= MAX_TOP_K:
        raise InvalidInputError(
            f"top_k must be an integer from 1 to {MAX_TOP_K}, got {top_k!r}", field="top_k"
        )
    return top_k


class RecalledSession(BaseModel):
    """A session returned by :meth:`SessionTier.recall_relevant`.

    Attributes:
        summary: The stored summary, read from the KV store.
        score: Fused relevance in [0, 1] (dense similarity, keyword match and
            recency, see :mod:`tiers.session._recall`); higher is more relevant.
        similarity: Best cosine similarity between the query and the
            session's vectors (summary or a transcript window), or ``None``
            when the session is not indexed yet.
        keyword: The session's BM25 score relative to the query's best
            keyword match, in [0, 1].
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    summary: SessionSummary
    score: Annotated[float, Field(ge=-1.0, le=1.0)]
    similarity: Annotated[float, Field(ge=-1.0, le=1.0)] | None = None
    keyword: Annotated[float, Field(ge=0.0, le=1.0)] = 0.0


# Long-lived threads that read cold views: at most this many per reader; a caller that
# finds none free reads its view itself. Measured in session 26 (bench/README.md,
# session_scale section), 4 callers on 2 cores: two workers served as many cold recalls
# per second as a new thread per recall, one fewer, four no more than two.
READ_WORKERS = 2
# A worker without a job for this long ends (the next cold recall starts one again): a
# service keeps a tier per tenant, and a tenant nobody asks should not hold threads and
# SQLite readers until the process ends. Steady traffic keeps its workers.
IDLE_S = 30.0
# Every reader's workers together, in one process: a service keeps a tier per tenant, each
# with its own crew, so without a cap thousands of tenants asked within IDLE_S would hold
# thousands of threads (and SQLite readers). Past the cap a cold recall borrows an idle
# worker of another reader's crew (tiers/session/_lending.py), so the cap's threads serve
# every tenant, not only the first ones asked; it reads its view itself if none is idle.
MAX_PROCESS_READ_WORKERS = 16
_process_workers = threading.BoundedSemaphore(MAX_PROCESS_READ_WORKERS)
_WORKER_NAME = "tiermem-recall-view"


class _ViewReads:
    """A cold view's vectors and keywords, read by a worker while the query is embedded.

    The two are independent: the model runs in onnxruntime without the GIL
    while the reads wait on SQLite and Chroma, so a cold recall costs about
    the longer of the two instead of their sum. An error of the reads is
    raised by :meth:`wait`, as if they had run in the caller (after the
    query's own embedding, as before). One not handed to a worker (a warm
    view, no worker free, the reader closed) is done already: the caller's
    own reads of the view do whatever is left, after the embedding.
    """

    def __init__(self, store: SessionStore, view: UserView, user_id: str) -> None:
        self._store = store
        self._view = view
        self._user_id = user_id
        self._error: Exception | None = None
        self._done = threading.Event()

    @classmethod
    def nothing(cls, store: SessionStore, view: UserView, user_id: str) -> _ViewReads:
        """Reads left to the caller: :meth:`wait` returns at once."""
        reads = cls(store, view, user_id)
        reads.finish()
        return reads

    def read(self) -> None:
        """Read the view's vectors and keywords (in a worker); keep their error for :meth:`wait`."""
        store, view = self._store, self._view
        try:
            view.vectors(store.kv, store.index, store.tenant, self._user_id)
            view.keywords(store.kv, store.tenant, self._user_id)
        except Exception as exc:  # raised in the caller's thread by wait()
            self._error = exc

    def finish(self) -> None:
        """Let :meth:`join` and :meth:`wait` return."""
        self._done.set()

    def join(self) -> None:
        """Wait for the reads to end, whatever came of them."""
        self._done.wait()

    def wait(self) -> None:
        """Wait for the reads; raise their error, if any."""
        self.join()
        if self._error is not None:
            raise self._error


class _Crew:
    """The worker threads, their job queue and who is free: what the threads hold on to.

    Kept apart from :class:`_ViewWorkers` so an idle thread does not keep its
    owner alive: an owner dropped without ``close`` stops its crew when collected.
    A free worker also serves other crews' jobs lent to it (:meth:`lend`).
    """

    def __init__(self, size: int) -> None:
        self._size = size
        # Only a job a free worker was counted for is queued: none waits behind another's.
        self._jobs: queue.SimpleQueue[_ViewReads | Loan | None] = queue.SimpleQueue()
        self._lock = threading.Lock()
        self._free = 0
        self._threads: list[threading.Thread] = []
        self._closed = False
        # What the first worker runs before any job (start_warm); taken from here, not from
        # the thread's arguments, which would keep it (and the store it holds) to the end.
        self._warm: Callable[[], None] | None = None
        # While the warm-up runs its worker counts free but is not lent: another tenant's
        # recall would wait for the loading, which its own reads need not.
        self._warming = False
        self.on_loan = OnLoan()  # this crew's jobs run by other crews' workers
        _crews.add(self)

    def forget_threads(self) -> None:
        """In a child of ``fork``: the parent's workers are not here, so none is counted.

        Otherwise a worker counted free (the warm-up's, or one idle for less
        than :data:`IDLE_S`) would be handed the child's first cold recall,
        which then waited for it for good; and a lock held by a parent's thread
        at the fork would never be released.
        """
        self._lock = threading.Lock()
        self._jobs = queue.SimpleQueue()
        self._free = 0
        self._threads = []
        self._warm = None
        self._warming = False
        self.on_loan = OnLoan()

    def hand_over(self, job: _ViewReads) -> bool:
        """Queue ``job`` for a free worker (starting one if fewer than ``size`` run); False if none.

        When no thread may start (the process cap, or none to be had), a free
        worker of another crew takes it (:meth:`Lenders.borrow`); False if none
        is free either: the caller reads, as when all its own workers are busy.
        """
        with self._lock:
            if self._closed:
                return False
            if self._free > 0:
                self._free -= 1
                self._jobs.put(job)
                return True
            if len(self._threads) >= self._size:
                return False
            if self._start_worker():
                self._jobs.put(job)
                return True
        return _lenders.borrow(job, self, self.on_loan)  # outside _lock: it takes a lender's

    def lend(self, loan: Loan) -> bool:
        """Queue another crew's job for a free worker of this one; False if none is free."""
        with self._lock:
            if self._closed or self._warming or self._free == 0:
                return False
            self._free -= 1
            self._jobs.put(loan)
        return True

    def start_warm(self, warm: Callable[[], None]) -> bool:
        """Start the first worker, which runs ``warm`` before any job; False if none may start.

        False when closed, when workers run already, or when no thread can be
        had. The worker counts as free from the start: a cold recall meanwhile
        queues its reads behind ``warm`` (which loads what those reads would
        wait for anyway) rather than starting another thread. ``warm`` must not
        raise: it would end the worker while it is counted free.
        """
        with self._lock:
            if self._closed or self._threads:
                return False
            self._warm = warm
            if not self._start_worker():
                self._warm = None
                return False
            self._free += 1
            self._warming = True
        return True

    def _start_worker(self) -> bool:
        """Start one more worker (``_lock`` held); False at the process cap or without a thread."""
        cap = _process_workers
        if not cap.acquire(blocking=False):
            return False
        thread = threading.Thread(target=self._serve, args=(cap,), name=_WORKER_NAME, daemon=True)
        try:
            thread.start()  # listed only once started: close() joins what is listed
        except RuntimeError:
            # No thread to be had (the process's or container's limit, or the
            # interpreter shutting down): the caller reads its view itself.
            cap.release()
            return False
        if not self._threads:
            _lenders.add(self)
        self._threads.append(thread)
        return True

    def _next_job(self) -> _ViewReads | Loan | None:
        """The next job, or ``None`` to end: stopped, or idle for :data:`IDLE_S`."""
        while True:
            try:
                return self._jobs.get(timeout=IDLE_S)
            except queue.Empty:
                with self._lock:
                    # Jobs are queued under this lock: none queued means none is meant for
                    # this worker, which is counted free, so it may go.
                    if self._jobs.empty():
                        self._free -= 1
                        return None

    def _serve(self, cap: threading.BoundedSemaphore) -> None:
        """Serve jobs until stopped or idle; then give back the place taken in ``cap``.

        The first worker runs the warm-up of :meth:`start_warm` before its first job.
        """
        try:
            with self._lock:
                warm, self._warm = self._warm, None
            if warm is not None:
                warm()
                del warm  # an idle worker must not keep the store alive
                with self._lock:
                    self._warming = False
            while (job := self._next_job()) is not None:
                try:
                    job.read()
                    # Free before the caller goes on: its next cold recall finds this worker.
                    with self._lock:
                        self._free += 1
                finally:
                    job.finish()
                # An idle worker must not keep the last user's view (and store) alive.
                del job
        finally:
            with self._lock:
                self._threads.remove(threading.current_thread())
                if not self._threads:
                    _lenders.discard(self)
            cap.release()

    def stop(self) -> list[threading.Thread]:
        """Refuse new jobs; each worker ends after the jobs queued before. Its threads.

        This crew's jobs lent to other crews' workers and not begun are not run.
        """
        with self._lock:
            if not self._closed:
                self._closed = True
                self.on_loan.stop()
                for _ in self._threads:
                    self._jobs.put(None)
            return list(self._threads)


# Every crew of the process, for a child of fork to forget the parent's threads in.
_crews: weakref.WeakSet[_Crew] = weakref.WeakSet()
# The crews with a worker running: where a recall that may start no thread borrows one.
_lenders = Lenders()


def _forget_threads_after_fork() -> None:
    """In a child of ``fork``: no worker of the parent's runs, so no place in the cap is taken."""
    global _process_workers, _lenders  # they count the parent's threads, gone here
    _process_workers = threading.BoundedSemaphore(MAX_PROCESS_READ_WORKERS)
    _lenders = Lenders()
    for crew in list(_crews):
        crew.forget_threads()


os.register_at_fork(after_in_child=_forget_threads_after_fork)


class _ViewWorkers:
    """Up to :data:`READ_WORKERS` long-lived threads reading cold views, started on demand.

    A thread keeps its SQLite reader connection (per thread, see
    :mod:`tiers.backends._sqlite_connections`) and Chroma's per-thread state
    for its lifetime, instead of each cold recall opening them in a new thread;
    it ends after :data:`IDLE_S` without work, or when the reader is closed.
    Past the process's cap a cold recall borrows a free worker of another
    reader's (:mod:`tiers.session._lending`). A recall that finds no worker
    free reads its view itself: it never waits for another user's reads.
    """

    def __init__(self, size: int) -> None:
        self._crew = _Crew(size)
        # A reader dropped without close() stops its workers when it is collected.
        weakref.finalize(self, self._crew.stop)

    def start(self, store: SessionStore, view: UserView, user_id: str) -> _ViewReads:
        """Begin reading what the cold ``view`` lacks; nothing to do when it is warm."""
        if view.needs_reads():
            reads = _ViewReads(store, view, user_id)
            if self._crew.hand_over(reads):
                return reads
        return _ViewReads.nothing(store, view, user_id)

    def warm(self, store: SessionStore) -> bool:
        """Start a worker that loads the vector index now (see :meth:`SessionReader.warm`)."""
        return self._crew.start_warm(lambda: _load_index(store))

    def close(self, timeout: float | None) -> None:
        """Stop the workers after the reads handed to them; wait up to ``timeout`` in all.

        Also for this reader's reads that other readers' workers have begun.
        """
        deadline = None if timeout is None else time.monotonic() + timeout

        def left() -> float | None:
            return None if deadline is None else max(0.0, deadline - time.monotonic())

        for thread in self._crew.stop():
            thread.join(left())
        self._crew.on_loan.wait(left())


def _load_index(store: SessionStore) -> None:
    """Read one vector id, so the index loads what every later read needs (errors only logged).

    Embedded Chroma loads a collection's HNSW segment, and applies the part of
    its write-ahead log not yet persisted in it (up to ``hnsw:sync_threshold``
    = 1,000 writes), on the first read after it is opened: 0.3-0.4 s at
    100,000 vectors (bench/README.md, session_scale section, session 27).
    Whether the id exists does not matter.
    """
    try:
        store.index.get_embeddings([keys.session_vector_id(store.tenant, "warm-up", "probe")])
    except Exception as exc:  # a recall meets the same failure and reports it
        logger.info("loading the session index ahead of the first recall failed: %r", exc)


class SessionReader:
    """Reads of a tenant's sessions (see :class:`~tiers.session.SessionTier`).

    Args:
        store: The store core it reads through.
        weights: How recall fuses its signals.
    """

    def __init__(self, store: SessionStore, weights: FusionWeights) -> None:
        self._store = store
        self._weights = weights
        self._workers = _ViewWorkers(READ_WORKERS)

    def get_session(self, user_id: str, session_id: str) -> SessionSummary:
        """Read one stored summary."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        space = self._store.sessions_space(user_id)
        (data,) = self._store.kv.get_many(space, [session_id])
        if data is None:
            raise SessionNotFoundError(f"user {user_id!r} has no session {session_id!r}")
        return decode(SessionSummary, data, where=f"{space}/{session_id}")

    def transcript_header(self, user_id: str, session_id: str) -> TranscriptHeader:
        """Describe a session's stored transcript."""
        check_id(user_id, "user_id")
        check_id(session_id, "session_id")
        space = self._store.transcripts_space(user_id)
        (raw,) = self._store.kv.get_many(space, [header_key(session_id)])
        if raw is None:
            raise SessionNotFoundError(
                f"user {user_id!r} has no transcript stored for session {session_id!r}"
            )
        return decode_header(raw, where=f"{space}/{session_id}")

    def get_transcript(self, user_id: str, session_id: str) -> list[Message]:
        """Read a session's stored transcript."""
        header = self.transcript_header(user_id, session_id)
        space = self._store.transcripts_space(user_id)
        pages = self._store.kv.get_many(
            space, [page_key(session_id, n) for n in range(header.pages)]
        )
        return decode_transcript(header, pages, where=f"{space}/{session_id}")

    def unsummarized_sessions(self, user_id: str) -> list[str]:
        """Sessions of the user with a stored transcript but no summary."""
        check_id(user_id, "user_id")
        space = self._store.transcripts_space(user_id)
        with_transcript = [key for key, _ in self._store.kv.scan(space) if is_header_key(key)]
        if not with_transcript:
            return []
        summaries = self._store.kv.get_many(self._store.sessions_space(user_id), with_transcript)
        return [sid for sid, data in zip(with_transcript, summaries, strict=True) if data is None]

    def list_sessions(self, user_id: str, limit: int | None = None) -> list[SessionSummary]:
        """A user's summaries, newest first by ``created_at``."""
        check_id(user_id, "user_id")
        if limit is not None and (
            not isinstance(limit, int) or isinstance(limit, bool) or limit < 0
        ):
            raise InvalidInputError("limit must be a non-negative integer or None", field="limit")
        space = self._store.sessions_space(user_id)
        if limit is not None:
            # The newest few by the cached order, then read for real: cheap for a long history.
            chosen = self._store.view(user_id).newest_first()[:limit]
            records = self._store.kv.get_many(space, chosen)
            if all(data is not None for data in records):
                return [
                    decode(SessionSummary, data, where=f"{space}/{sid}")
                    for sid, data in zip(chosen, records, strict=True)
                    if data is not None
                ]
            # A record vanished without a revision change (written around this tier): read all.
        summaries = [
            decode(SessionSummary, data, where=f"{space}/{key}")
            for key, data in self._store.kv.scan(space)
        ]
        summaries.sort(key=lambda s: (s.created_at, s.session_id), reverse=True)
        return summaries if limit is None else summaries[:limit]

    def recall(
        self, user_id: str, query: str, top_k: int, now: datetime | None = None
    ) -> list[RecalledSession]:
        """The user's sessions most relevant to ``query``, best first (see :func:`.rank`)."""
        check_id(user_id, "user_id")
        asked_at = utcnow() if now is None else check_datetime(now, "now")
        if not isinstance(query, str) or not query.strip():
            raise InvalidInputError("query must be a non-empty string", field="query")
        if len(query) > MAX_TEXT:
            raise InvalidInputError(
                f"query is {len(query)} characters, over the limit of {MAX_TEXT}", field="query"
            )
        check_top_k(top_k)
        store = self._store
        store.indexer.repair_if_needed()
        view = store.view(user_id, settle=True)
        if not view.session_ids:
            return []
        reading = self._workers.start(store, view, user_id)
        try:
            (query_vector,) = store.embedder.embed([query])
        except BaseException:
            reading.join()  # the embedding's error is the one raised, as before
            raise
        reading.wait()
        vectors = view.vectors(store.kv, store.index, store.tenant, user_id)
        keywords = view.keywords(store.kv, store.tenant, user_id)
        store.views.trim()
        ranked = rank(
            view.session_ids,
            created_at=view.created_at,
            vectors=vectors.matrix,
            owner=vectors.owner,
            query_vector=query_vector,
            keywords=keywords,
            query=query,
            weights=self._weights,
            now=asked_at,
        )
        return self._read_best(user_id, ranked, top_k)

    def warm(self) -> bool:
        """Load the vector index in a view-reading worker, ahead of the first recall.

        Without this the first cold recall after the store is opened waits for
        the index to load (see :func:`_load_index`). The worker then serves
        recalls like any other (a recall arriving meanwhile queues its reads
        behind the loading, which they would wait for anyway); it ends after
        :data:`IDLE_S` without work, the loaded index stays loaded. Returns
        False, and loads nothing, when no worker may start (the reader is
        closed, has workers already, or the process cap is reached).
        """
        return self._workers.warm(self._store)

    def close(self, timeout: float | None = None) -> None:
        """Stop the view-reading workers, waiting up to ``timeout``; later recalls read alone.

        Idempotent. Does not close the stores.
        """
        self._workers.close(timeout)

    def _read_best(self, user_id: str, ranked: list[Ranked], top_k: int) -> list[RecalledSession]:
        """The first ``top_k`` ranked sessions whose summary is still stored, read and decoded."""
        space = self._store.sessions_space(user_id)
        results: list[RecalledSession] = []
        position = 0
        # Read in small rounds: a hit whose record is gone (deleted around this tier) is skipped.
        while position < len(ranked) and len(results) < top_k:
            batch = ranked[position : position + top_k - len(results) + 2]
            position += len(batch)
            records = self._store.kv.get_many(space, [hit.session_id for hit in batch])
            for hit, data in zip(batch, records, strict=True):
                if data is None:
                    continue
                summary = decode(SessionSummary, data, where=f"{space}/{hit.session_id}")
                results.append(
                    RecalledSession(
                        summary=summary,
                        score=hit.score,
                        similarity=hit.similarity,
                        keyword=hit.keyword,
                    )
                )
                if len(results) == top_k:
                    break
        return results
