"""An in-memory, per-user view of the session tier: the inputs of recall and listing.

A view holds what ranking one user's sessions needs: each session's creation
time, a BM25 index over its summary and transcript text, and its vectors
(fetched from the index by id, which is fast, rather than with a metadata
filter, which scans). It only reads and caches them; how they are scored is
:mod:`tiers.session._recall`.

Views are only a cache. Each is stamped with the user's *revision*: a token
the session tier replaces in the same KV commit as any change of the user's
sessions or transcripts. A view whose stamp differs from the stored token is
rebuilt, so every process (also one that did not make the change) sees new
data on its next call. Parts are built lazily: listing needs no vectors.

Term counts come from the cheapest current source. A rebuild is incremental:
the counts of a session whose summary record and transcript header are byte
for byte those the previous view of the user read (the header holds the
transcript's checksum) are taken over from it. Otherwise, as on a user's
first query after a restart, they are read from the session's stored
term-count record (:mod:`tiers.session._terms`, written by the index pass;
all of the user's in one batched read) when its fingerprint matches those
bytes. Only sessions with neither (stored by an older release, or not
indexed yet) are read and tokenised. Vectors are always fetched again (one call by
id), so vectors that arrived since, in one pass or two, are never missed.

Deleting means gone, from memory too: the new view lists only sessions the KV
store holds now, and what it keeps of the previous one (its basis) is the term
counts of sessions unchanged since, nothing else (:meth:`UserView.without`). A
change made through this process strips the changed sessions from the kept view
at once (:meth:`ViewCache.changed`); one made by another process, at this
process's next view of that user, when the view is evicted, or by the process's
cache sweeper once the view is older than the max age (:mod:`tiers.cache_ages`).
"""

from __future__ import annotations

import json
import logging
import threading
from collections import OrderedDict
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import numpy as np
import numpy.typing as npt

from tiers import keys
from tiers.backends.base import KVStore, VectorIndex
from tiers.cache_ages import SWEEPER, Stamps
from tiers.errors import CorruptRecordError
from tiers.models import Message
from tiers.session._recall import BM25Index
from tiers.session._terms import (
    count_terms,
    read_terms,
    summary_digest,
    summary_fields,
    terms_fingerprint,
)
from tiers.session._transcripts import TranscriptHeader, page_key

__all__ = ["SessionVectors", "UserView", "ViewCache", "build_view"]

logger = logging.getLogger(__name__)

# Rough cost of one dict or list entry with its small key, for the cache's memory bound.
_ENTRY_BYTES = 100


def _transcripts(
    kv: KVStore, space: str, headers: dict[str, bytes]
) -> dict[str, list[Message] | None]:
    """The messages of the sessions whose raw transcript headers are given; None: unreadable."""
    parsed: dict[str, TranscriptHeader] = {}
    out: dict[str, list[Message] | None] = {}
    for session_id, raw in headers.items():
        try:
            parsed[session_id] = TranscriptHeader.model_validate_json(raw)
        except ValueError:
            logger.error("skipping an unreadable transcript header at %s/%s", space, session_id)
            out[session_id] = None
    wanted = [
        (session_id, page_key(session_id, n))
        for session_id, header in parsed.items()
        for n in range(header.pages)
    ]
    pages: dict[str, list[bytes | None]] = {session_id: [] for session_id in parsed}
    values = kv.get_many(space, [key for _, key in wanted]) if wanted else []
    for (session_id, _), value in zip(wanted, values, strict=True):
        pages[session_id].append(value)
    for session_id, header in parsed.items():
        found = [page for page in pages[session_id] if page is not None]
        blob = b"".join(found)
        try:
            if len(found) != header.pages or len(blob) != header.size:
                raise CorruptRecordError("page count or size differs from the header")
            # The checksum was verified when it was indexed; trust the header here (read path).
            out[session_id] = [Message.model_construct(**item) for item in json.loads(blob)]
        except (ValueError, TypeError, CorruptRecordError) as exc:
            logger.error("skipping an unreadable transcript %s/%s: %s", space, session_id, exc)
            out[session_id] = None
    return out


@dataclass(frozen=True, slots=True)
class _Terms:
    """One session's keyword term counts and what they were made from.

    Attributes:
        fingerprint: :func:`~tiers.session._terms.terms_fingerprint` of the
            summary record and raw transcript header counted ("" when the
            transcript was unreadable: such counts are never taken over).
        counts: Token counts of the summary text and transcript.
    """

    fingerprint: str
    counts: Mapping[str, int]


@dataclass
class SessionVectors:
    """The user's session vectors: one row per vector, ``owner`` = the row's session position.

    Attributes:
        matrix: One stored vector per row.
        owner: Per row, the position of its session in :attr:`UserView.session_ids`.
    """

    matrix: npt.NDArray[np.float32]
    owner: npt.NDArray[np.intp]


@dataclass
class UserView:
    """What ranking one user's sessions needs, as of one revision of the user's data.

    Attributes:
        revision: The user's revision token this view reflects.
        session_ids: Every stored session (also unreadable ones, so reading
            them reports the corruption), sorted by id.
        created_at: POSIX creation time per session (0 when unreadable).
        texts: Summary content text per session ("" when unreadable).
        nbytes: Rough memory held, grown as lazy parts are built (for the cache's bound).
        digests: Per session, a digest of its stored summary record (empty when unknown).
        basis: An earlier view of the same user whose term counts may be taken
            over (see the module docstring); dropped once the keywords are built.
    """

    revision: bytes | None
    session_ids: list[str]
    created_at: npt.NDArray[np.float64]
    texts: list[str]
    nbytes: int = 0
    digests: list[bytes] = field(default_factory=list, repr=False)
    basis: UserView | None = field(default=None, repr=False)
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _bm25: BM25Index | None = field(default=None, repr=False)
    _terms: dict[str, _Terms] = field(default_factory=dict, repr=False)
    _vectors: SessionVectors | None = field(default=None, repr=False)

    def newest_first(self) -> list[str]:
        """Session ids, newest first (ties: larger id first, like the full listing)."""
        order = sorted(
            range(len(self.session_ids)),
            key=lambda i: (self.created_at[i], self.session_ids[i]),
            reverse=True,
        )
        return [self.session_ids[i] for i in order]

    def without(self, session_ids: set[str]) -> UserView:
        """A basis for the user's next view: the term counts of every session but these.

        Nothing else is kept (no text, vectors or keyword index), and nothing
        of ``session_ids`` (changed or gone), so a deleted or replaced session
        leaves nothing of itself in memory. Never served, only taken over from.
        """
        # The counts of a view that never built its keywords are its own basis's.
        terms = self._terms or (self.basis._terms if self.basis is not None else {})
        kept = [
            (sid, digest)
            for sid, digest in zip(self.session_ids, self.digests, strict=False)
            if sid not in session_ids and sid in terms
        ]
        counts = {sid: terms[sid] for sid, _ in kept}
        return UserView(
            revision=self.revision,
            session_ids=[sid for sid, _ in kept],
            created_at=np.zeros(len(kept), dtype=np.float64),
            texts=[""] * len(kept),
            nbytes=sum(_ENTRY_BYTES * (len(t.counts) + 1) for t in counts.values()),
            digests=[digest for _, digest in kept],
            _terms=counts,
        )

    def needs_reads(self) -> bool:
        """Whether its vectors or keywords are still to be read (a cold or rebuilt view)."""
        return self._bm25 is None or self._vectors is None

    def keywords(self, kv: KVStore, tenant: str, user_id: str) -> BM25Index:
        """BM25 over each session's summary and transcript text (built on first use)."""
        with self._lock:
            if self._bm25 is None:
                self._terms = self._term_counts(kv, tenant, user_id)
                self.basis = None
                self._bm25 = BM25Index.from_counts(
                    (sid, self._terms[sid].counts) for sid in self.session_ids
                )
                self.nbytes += _ENTRY_BYTES * self._bm25.entries()
            return self._bm25

    def _term_counts(self, kv: KVStore, tenant: str, user_id: str) -> dict[str, _Terms]:
        """Term counts per session: from the basis or the stored records where current, else counted.

        One batched read of transcript headers (they fingerprint the
        transcripts), one of the stored term-count records of the sessions
        the basis does not cover; only sessions with neither are read and
        tokenised (and those with an unreadable transcript, without it).
        """
        space = keys.transcripts_space(tenant, user_id)
        # Without digests (a view made by hand) nothing can be compared: count everything.
        basis = self.basis._terms if self.basis is not None and self.digests else {}
        raw_headers = kv.get_many(space, self.session_ids)
        fingerprints = (
            {
                sid: terms_fingerprint(digest, raw)
                for sid, digest, raw in zip(
                    self.session_ids, self.digests, raw_headers, strict=True
                )
            }
            if self.digests
            else dict.fromkeys(self.session_ids, "")
        )
        terms: dict[str, _Terms] = {}
        for sid in self.session_ids:
            known = basis.get(sid)
            if known is not None and known.fingerprint == fingerprints[sid]:
                terms[sid] = known
        unknown = [sid for sid in self.session_ids if sid not in terms and fingerprints[sid]]
        terms_space = keys.session_terms_space(tenant, user_id)
        for sid, raw in zip(
            unknown, kv.get_many(terms_space, unknown) if unknown else [], strict=True
        ):
            counts = read_terms(raw, fingerprints[sid], where=f"{terms_space}/{sid}")
            if counts is not None:
                terms[sid] = _Terms(fingerprints[sid], counts)
        changed = {
            sid: raw
            for sid, raw in zip(self.session_ids, raw_headers, strict=True)
            if sid not in terms and raw is not None
        }
        transcripts = _transcripts(kv, space, changed)
        for sid, text in zip(self.session_ids, self.texts, strict=True):
            if sid not in terms:
                messages = transcripts.get(sid)
                # An unreadable transcript is counted without it, and never taken over.
                readable = sid not in transcripts or messages is not None
                terms[sid] = _Terms(
                    fingerprints[sid] if readable else "", count_terms(text, messages)
                )
        return terms

    def vectors(self, kv: KVStore, index: VectorIndex, tenant: str, user_id: str) -> SessionVectors:
        """Every indexed vector of the user's sessions (fetched on first use)."""
        with self._lock:
            if self._vectors is None:
                self._vectors = self._fetch_vectors(kv, index, tenant, user_id)
                self.nbytes += self._vectors.matrix.nbytes + self._vectors.owner.nbytes
            return self._vectors

    def _fetch_vectors(
        self, kv: KVStore, index: VectorIndex, tenant: str, user_id: str
    ) -> SessionVectors:
        counts = dict(kv.scan(keys.session_vectors_space(tenant, user_id)))
        position = {sid: n for n, sid in enumerate(self.session_ids)}
        wanted: dict[str, int] = {}
        for sid, n in position.items():
            wanted[keys.session_vector_id(tenant, user_id, sid)] = n
            raw = counts.get(sid, b"0")
            for chunk in range(1, int(raw) + 1 if raw.isdigit() else 1):
                wanted[keys.session_chunk_vector_id(tenant, user_id, sid, chunk)] = n
        found, matrix = index.get_embeddings(list(wanted))
        owner = np.fromiter((wanted[vid] for vid in found), dtype=np.intp, count=len(found))
        return SessionVectors(matrix=np.ascontiguousarray(matrix, dtype=np.float32), owner=owner)


def build_view(
    kv: KVStore,
    tenant: str,
    user_id: str,
    revision: bytes | None,
    basis: UserView | None = None,
) -> UserView:
    """Read the user's summaries into a new view stamped with ``revision``.

    Args:
        kv: The KV store.
        tenant: The tenant.
        user_id: The user.
        revision: The user's revision token, read before the summaries.
        basis: An earlier view of the user whose unchanged sessions' term counts
            are taken over; ignored when a session of it is no longer stored.
    """
    ids: list[str] = []
    created: list[float] = []
    texts: list[str] = []
    digests: list[bytes] = []
    for session_id, data in kv.scan(keys.sessions_space(tenant, user_id)):
        fields = summary_fields(data)
        ids.append(session_id)
        texts.append(fields[0] if fields else "")
        created.append(fields[1] if fields else 0.0)
        digests.append(summary_digest(data))
    if basis is not None:
        # Only counts of sessions stored now with the same summary record are kept: nothing
        # of a deleted or replaced session stays in memory (no chains are kept either).
        now = dict(zip(ids, digests, strict=True))
        basis = basis.without(
            {
                sid
                for sid, digest in zip(basis.session_ids, basis.digests, strict=False)
                if now.get(sid) != digest
            }
        )
    return UserView(
        revision=revision,
        session_ids=ids,
        created_at=np.asarray(created, dtype=np.float64),
        texts=texts,
        nbytes=sum(len(text) + _ENTRY_BYTES for text in texts),
        digests=digests,
        basis=basis,
    )


class ViewCache:
    """Least-recently-used views of at most ``max_users`` users and about ``max_bytes``. Thread-safe.

    ``invalidate``, ``changed`` and ``outdate`` bump a per-user generation, so
    a view built while the index was changing underneath it is never stored.
    An outdated view is no longer served but kept as the basis of the user's
    next view (see the module docstring); a changed one is kept only as the
    term counts of its unchanged sessions; an invalidated one is forgotten. Views grow
    as their lazy parts are built: call :meth:`trim` afterwards to keep the bound.
    """

    def __init__(self, max_users: int, max_bytes: int) -> None:
        self._max_users = max(0, max_users)
        self._max_bytes = max(0, max_bytes)
        self._views: OrderedDict[str, UserView] = OrderedDict()
        self._outdated: set[str] = set()
        self._generations: dict[str, int] = {}
        # When each view was stored: the sweeper drops it past the max age, outdated or not.
        self._stamps: Stamps[str] = Stamps()
        self._lock = threading.Lock()
        SWEEPER.track(self)

    def get(self, user_id: str, revision: bytes | None) -> tuple[UserView | None, int]:
        """The cached view if it has this revision, and the user's generation (for :meth:`put`)."""
        with self._lock:
            generation = self._generations.get(user_id, 0)
            view = self._views.get(user_id)
            if view is None or view.revision != revision or user_id in self._outdated:
                return None, generation
            self._views.move_to_end(user_id)
            return view, generation

    def basis(self, user_id: str) -> UserView | None:
        """The user's cached view, current or not: what a rebuild may take over."""
        with self._lock:
            return self._views.get(user_id)

    def put(self, user_id: str, view: UserView, generation: int) -> None:
        """Cache ``view`` unless the user was invalidated since ``generation`` was read."""
        with self._lock:
            if (
                self._max_users == 0
                or not SWEEPER.keeping
                or self._generations.get(user_id, 0) != generation
            ):
                return
            self._views[user_id] = view
            self._views.move_to_end(user_id)
            self._stamps.stamp(user_id)
            self._outdated.discard(user_id)
            self._evict()

    def trim(self) -> None:
        """Evict least recently used views until the bounds hold again."""
        with self._lock:
            self._evict()

    def _evict(self) -> None:
        total = sum(view.nbytes for view in self._views.values())
        # The newest view always stays: evicting what was just built would only rebuild it.
        while len(self._views) > 1 and (
            len(self._views) > self._max_users or total > self._max_bytes
        ):
            user_id, view = self._views.popitem(last=False)
            self._outdated.discard(user_id)
            self._stamps.discard(user_id)
            total -= view.nbytes

    def outdate(self, user_ids: Sequence[str]) -> None:
        """Stop serving these users' views; keep them as the basis of their next ones."""
        with self._lock:
            for user_id in user_ids:
                if user_id in self._views:
                    self._outdated.add(user_id)
                self._generations[user_id] = self._generations.get(user_id, 0) + 1

    def changed(self, refs: Sequence[tuple[str, str]]) -> None:
        """These ``(user, session)`` changed or went: stop serving the users' views, and keep
        as each one's basis only the term counts of its other sessions (see
        :meth:`UserView.without`)."""
        by_user: dict[str, set[str]] = {}
        for user_id, session_id in refs:
            by_user.setdefault(user_id, set()).add(session_id)
        with self._lock:
            for user_id, session_ids in by_user.items():
                view = self._views.get(user_id)
                if view is not None:
                    self._views[user_id] = view.without(session_ids)
                    self._outdated.add(user_id)
                self._generations[user_id] = self._generations.get(user_id, 0) + 1

    def invalidate(self, user_ids: Sequence[str]) -> None:
        """Forget the views of these users."""
        with self._lock:
            for user_id in user_ids:
                self._views.pop(user_id, None)
                self._outdated.discard(user_id)
                self._stamps.discard(user_id)
                self._generations[user_id] = self._generations.get(user_id, 0) + 1

    def clear(self) -> None:
        """Forget every view."""
        with self._lock:
            for user_id in list(self._views):
                self._generations[user_id] = self._generations.get(user_id, 0) + 1
            self._views.clear()
            self._outdated.clear()
            self._stamps.clear()

    def sweep(self, cutoff: float) -> None:
        """Forget the views stored at ``cutoff`` (``time.monotonic``) or before."""
        with self._lock:
            for user_id in self._stamps.expired(cutoff):
                self._views.pop(user_id, None)
                self._outdated.discard(user_id)
