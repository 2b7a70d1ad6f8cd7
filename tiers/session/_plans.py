"""What the vector index should hold for sessions: read from the KV store (see :mod:`._index`).

A plan holds every text of a session (summary windows first, then transcript
windows) and says which of them one pass of the indexer embeds: all of them,
or only the first, the session's base vector (the first pass of incremental
indexing, which makes the session searchable; the rest follows in a second pass).
Also here: the embed cache and the per-user work queues the index worker takes
batches from (callers hold their own lock).
"""

from __future__ import annotations

import hashlib
import logging
import threading
from collections import OrderedDict
from collections.abc import Callable, Iterable
from dataclasses import dataclass

from tiers import keys
from tiers.backends.base import Delete, Embedder, KVStore, Put, VectorItem, Write
from tiers.cache_ages import SWEEPER, Stamps
from tiers.codec import decode
from tiers.errors import CorruptRecordError
from tiers.models import Message, SessionSummary
from tiers.session._chunking import session_windows
from tiers.session._terms import (
    count_terms,
    encode_terms,
    summary_digest,
    summary_fields,
    terms_fingerprint,
    terms_write,
)
from tiers.session._transcripts import decode_transcript, header_key, page_key, read_header

__all__ = [
    "FINGERPRINT_KEY",
    "CachedEmbedder",
    "Plan",
    "Ref",
    "enqueue",
    "read_plans",
    "requeue_first",
    "scan_refs",
    "take",
    "users_of",
    "vector_changes",
]

logger = logging.getLogger(__name__)

Ref = tuple[str, str]  # (user_id, session_id)

_EMBED_CACHE = 4096  # recently embedded texts kept, so re-indexing unchanged windows is free

FINGERPRINT_KEY = "rev"
"""Metadata key of a session vector holding its :func:`~tiers.session._index.session_fingerprint`."""


@dataclass(slots=True)
class Plan:
    """What the index should hold for one session after one pass of the indexer."""

    ref: Ref
    summary: SessionSummary | None  # None: the session is gone (or unreadable): remove it
    texts: list[str]  # every text of the session: [summary windows..., transcript windows...]
    old_count: int  # extra windows the index may hold now (upper bound)
    fingerprint: str = ""  # session_fingerprint of the records read (with a summary)
    with_windows: bool = True  # False: this pass embeds the base vector's text only
    terms: bytes | None = None  # the session's term-count record (._terms); None: none to keep

    def terms_write(self, tenant: str) -> Write:
        """The write keeping the session's term-count record in line: put, or delete if none.

        Part of the commit that clears the session's outbox entry under a check
        of the token read: a session changed or deleted since gets no record back.
        """
        return terms_write(tenant, *self.ref, self.terms)

    def clear_writes(
        self, tenant: str, source: str, key: str, token: bytes, *, first_pass: bool
    ) -> list[Write]:
        """The writes clearing the session's ``source`` outbox entry after a pass.

        They lower the session's vector count to what is now indexed; clearing
        a first-pass entry queues the session's windows for the second pass
        under the same ``token`` (or drops such an entry when nothing is left
        for it) and keeps the term counts in line. Committed under a check of
        the token, so a newer writer's higher count is never lowered.
        """
        user_id, session_id = self.ref
        counts = keys.session_vectors_space(tenant, user_id)
        writes: list[Write] = [Delete(source, key)]
        if self.summary is None or self.new_count == 0 < self.old_count:
            writes.append(Delete(counts, session_id))
        elif self.new_count < self.old_count:
            writes.append(Put(counts, session_id, str(self.new_count).encode()))
        if first_pass:
            windows = keys.session_windows_outbox_space(tenant)
            writes.append(Put(windows, key, token) if self.deferred else Delete(windows, key))
            writes.append(self.terms_write(tenant))  # token-checked: never resurrected
        return writes

    @property
    def indexed(self) -> list[str]:
        """The texts this pass embeds (vector ``n`` of the session is ``indexed[n]``)."""
        if self.summary is None:
            return []
        return self.texts if self.with_windows else self.texts[:1]

    @property
    def new_count(self) -> int:
        """Extra windows (past the base vector) the index holds of the session after this pass."""
        return max(0, len(self.indexed) - 1)

    @property
    def deferred(self) -> bool:
        """Whether windows of the session are left for the second pass."""
        return self.summary is not None and len(self.indexed) < len(self.texts)


def read_plans(
    kv: KVStore,
    tenant: str,
    refs: list[Ref],
    *,
    fingerprint: Callable[[bytes, bytes | None], str],
    with_windows: bool,
    with_terms: bool = True,
) -> list[Plan]:
    """Plans for ``refs`` (in their order) from the KV store's summaries, transcripts and counts.

    Args:
        kv: The authoritative store.
        tenant: The tenant of the sessions.
        refs: The sessions, each once.
        fingerprint: Gives the fingerprint of a stored summary and transcript header.
        with_windows: Whether the pass embeds every window (or only the base vector's text).
        with_terms: Whether to count the sessions' terms (only the first pass stores them).
    """
    by_user: dict[str, list[str]] = {}
    for user_id, session_id in refs:
        by_user.setdefault(user_id, []).append(session_id)
    plans: dict[Ref, Plan] = {}
    for user_id, session_ids in by_user.items():
        space = keys.sessions_space(tenant, user_id)
        records = kv.get_many(space, session_ids)
        counts = kv.get_many(keys.session_vectors_space(tenant, user_id), session_ids)
        transcripts, raw_headers = _read_transcripts(
            kv,
            tenant,
            user_id,
            [sid for sid, data in zip(session_ids, records, strict=True) if data],
        )
        for session_id, data, count in zip(session_ids, records, counts, strict=True):
            summary = None
            if data is not None:
                try:
                    summary = decode(SessionSummary, data, where=f"{space}/{session_id}")
                except CorruptRecordError as exc:
                    # Unindexable; reading it still raises. A re-save indexes it again.
                    logger.error("not indexing a corrupt session record: %s", exc)
            plans[(user_id, session_id)] = Plan(
                ref=(user_id, session_id),
                summary=summary,
                texts=(
                    session_windows(summary, transcripts.get(session_id))
                    if summary is not None
                    else []
                ),
                old_count=int(count) if count is not None and count.isdigit() else 0,
                fingerprint=(
                    fingerprint(data, raw_headers.get(session_id)) if data is not None else ""
                ),
                with_windows=with_windows,
                terms=_terms_record(data, raw_headers.get(session_id), transcripts, session_id)
                if with_terms and summary is not None and data is not None
                else None,
            )
    return [plans[ref] for ref in refs]


def vector_changes(
    tenant: str, plans: list[Plan], vectors: list[list[float]], *, first: int
) -> tuple[list[VectorItem], list[str]]:
    """The vectors to upsert and the ids to delete for one pass over ``plans``.

    Args:
        tenant: The tenant of the sessions.
        plans: The sessions' plans.
        vectors: One per text the pass embeds: ``plan.indexed[first:]`` of each plan, in order.
        first: The first window the pass writes (1: the second pass, the base vector is in).
    """
    rows = iter(vectors)
    items: list[VectorItem] = []
    removals: list[str] = []
    for plan in plans:
        user_id, session_id = plan.ref
        base = keys.session_vector_id(tenant, user_id, session_id)
        if plan.summary is None:
            removals.append(base)
        else:
            metadata: dict[str, str | int | float | bool] = {
                "tenant": tenant,
                "user_id": user_id,
                "session_id": session_id,
                "created_at": plan.summary.created_at.timestamp(),
                "created_at_iso": plan.summary.created_at.isoformat(),
                FINGERPRINT_KEY: plan.fingerprint,
            }
            for n in range(first, len(plan.indexed)):
                chunk_id = keys.session_chunk_vector_id(tenant, user_id, session_id, n)
                items.append(
                    VectorItem(
                        id=base if n == 0 else chunk_id,
                        embedding=next(rows),
                        # No text in the index: recall reads summaries from the KV store,
                        # and a vector index's own log (embedded Chroma's queue table, a
                        # server's WAL) would keep a deleted user's words out of reach.
                        document="",
                        metadata={**metadata, "window": n},
                    )
                )
        removals.extend(
            keys.session_chunk_vector_id(tenant, user_id, session_id, n)
            for n in range(plan.new_count + 1, plan.old_count + 1)
        )
    return items, removals


def _terms_record(
    data: bytes, raw_header: bytes | None, transcripts: dict[str, list[Message]], session_id: str
) -> bytes | None:
    """The session's term-count record, or None when its transcript is unreadable (not stored)."""
    messages = transcripts.get(session_id)
    fields = summary_fields(data)
    if fields is None or (raw_header is not None and messages is None):
        return None
    return encode_terms(
        terms_fingerprint(summary_digest(data), raw_header), count_terms(fields[0], messages)
    )


def _read_transcripts(
    kv: KVStore, tenant: str, user_id: str, session_ids: list[str]
) -> tuple[dict[str, list[Message]], dict[str, bytes]]:
    """The sessions' transcripts (those readable) and their raw stored headers."""
    if not session_ids:
        return {}, {}
    space = keys.transcripts_space(tenant, user_id)
    raw_headers = kv.get_many(space, [header_key(sid) for sid in session_ids])
    raw_of = {
        sid: raw for sid, raw in zip(session_ids, raw_headers, strict=True) if raw is not None
    }
    headers = {
        sid: header
        for sid, raw in zip(session_ids, raw_headers, strict=True)
        if (header := read_header(raw, where=f"{space}/{sid}")) is not None
    }
    page_keys = [page_key(sid, n) for sid, h in headers.items() for n in range(h.pages)]
    pages = dict(zip(page_keys, kv.get_many(space, page_keys), strict=True))
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


class CachedEmbedder:
    """An embedder with a small cache: re-indexing an unchanged transcript costs nothing.

    Read or not, a vector goes past the process's cache max age (:mod:`tiers.cache_ages`).

    Kept by each text's digest; the vectors are derived from the text, so
    :meth:`forget` drops them all when a session is deleted through this
    process (a delete by another process: they go as the least recently used).
    A pass takes :meth:`mark` before it reads the texts from the store: what
    it embeds after a forget since is not kept (the texts may be deleted).
    Thread-safe (the embedder is called outside the cache's lock).

    Args:
        embedder: Makes the vectors the cache does not hold.
    """

    def __init__(self, embedder: Embedder) -> None:
        self._embedder = embedder
        self._lock = threading.Lock()
        self._embedded: OrderedDict[str, list[float]] = OrderedDict()
        # Bumped by forget: vectors of texts read before it are not kept.
        self._generation = 0
        self._stamps: Stamps[str] = Stamps()
        SWEEPER.track(self)

    def mark(self) -> int:
        """Take it before reading the texts to embed from the store; pass it as ``read_at``."""
        return self._generation

    def embed(
        self, texts: list[str], *, read_at: int, using: Embedder | None = None
    ) -> list[list[float]]:
        """The vectors of ``texts``, in order; only texts not cached reach the embedder.

        Args:
            texts: The texts.
            read_at: What :meth:`mark` gave before they were read: if a forget
                came since, their vectors are not kept.
            using: Another lane of the same model to embed them on (fewer threads,
                see :func:`tiers.session._windows.background_lane`); cached alike.
        """
        digests = [hashlib.blake2b(text.encode(), digest_size=16).hexdigest() for text in texts]
        found: dict[str, list[float]] = {}
        with self._lock:
            for digest in digests:
                cached = self._embedded.get(digest)
                if cached is not None:
                    found[digest] = cached
        missing = list(dict.fromkeys(d for d in digests if d not in found))
        if missing:
            text_of = dict(zip(digests, texts, strict=True))
            fresh = (using or self._embedder).embed([text_of[digest] for digest in missing])
            with self._lock:
                for digest, vector in zip(missing, fresh, strict=True):
                    found[digest] = vector
                    if read_at == self._generation:
                        self._embedded[digest] = vector
                        self._stamps.stamp(digest)
                while len(self._embedded) > _EMBED_CACHE:
                    self._stamps.discard(self._embedded.popitem(last=False)[0])
                if not SWEEPER.keeping:  # a max age of 0: no vector outlives the call
                    self._embedded.clear()
                    self._stamps.clear()
        return [found[digest] for digest in digests]

    def forget(self) -> None:
        """Drop every kept vector (a session was deleted: vectors of its texts must not stay)."""
        with self._lock:
            self._embedded.clear()
            self._stamps.clear()
            self._generation += 1

    def sweep(self, cutoff: float) -> None:
        """Drop the vectors kept at ``cutoff`` (``time.monotonic``) or before."""
        with self._lock:
            for digest in self._stamps.expired(cutoff):
                self._embedded.pop(digest, None)


def enqueue(queue: OrderedDict[str, dict[str, None]], refs: Iterable[Ref]) -> None:
    """Add ``refs`` to a per-user work queue (an ordered set of session ids per user)."""
    for user_id, session_id in refs:
        queue.setdefault(user_id, {})[session_id] = None


def take(queue: OrderedDict[str, dict[str, None]], limit: int) -> list[Ref]:
    """Take up to ``limit`` refs from a per-user work queue, one per user in turn."""
    taken: list[Ref] = []
    while queue and len(taken) < limit:
        user_id, sessions = next(iter(queue.items()))
        session_id = next(iter(sessions))
        del sessions[session_id]
        taken.append((user_id, session_id))
        del queue[user_id]
        if sessions:
            queue[user_id] = sessions  # to the back of the line
    return taken


def scan_refs(kv: KVStore, space: str) -> list[Ref]:
    """The sessions with an entry in an outbox ``space`` (keys ``<user>/<session>``)."""
    refs: list[Ref] = []
    for key, _ in kv.scan(space):
        user_id, _, session_id = key.partition("/")
        if user_id and session_id:
            refs.append((user_id, session_id))
    return refs


def users_of(refs: Iterable[Ref]) -> list[str]:
    """Distinct user ids of ``refs``, in first-seen order."""
    return list(dict.fromkeys(user for user, _ in refs))


def requeue_first(queue: OrderedDict[str, dict[str, None]], refs: Iterable[Ref]) -> None:
    """Put refs taken from a per-user work queue back at its head (taken, not done)."""
    for user_id, session_id in reversed(list(refs)):
        queue[user_id] = {session_id: None, **queue.get(user_id, {})}
        queue.move_to_end(user_id, last=False)
