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
"""

from __future__ import annotations

import json
import logging
import threading
from collections import Counter, OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass, field
from datetime import datetime

import numpy as np
import numpy.typing as npt

from tiers import keys
from tiers.backends.base import KVStore, VectorIndex
from tiers.errors import CorruptRecordError
from tiers.models import Message
from tiers.session._chunking import keyword_text
from tiers.session._keyword import tokenize
from tiers.session._recall import BM25Index
from tiers.session._transcripts import TranscriptHeader, is_header_key

__all__ = ["SessionVectors", "UserView", "ViewCache", "build_view"]

logger = logging.getLogger(__name__)

# Rough cost of one dict or list entry with its small key, for the cache's memory bound.
_ENTRY_BYTES = 100

_TEXT_FIELDS = (
    "decisions_made",
    "work_completed",
    "open_questions",
    "next_recommended_steps",
)


def _summary_fields(data: bytes) -> tuple[str, float] | None:
    """Content text and creation timestamp of a stored summary, or None if it is unreadable.

    Plain JSON parsing: about ten times cheaper than validating the record,
    which only the sessions actually returned need.
    """
    try:
        raw = json.loads(data)
        parts = [raw.get("task_description") or ""]
        for name in _TEXT_FIELDS:
            parts.extend(item for item in raw.get(name) or [] if isinstance(item, str))
        created = datetime.fromisoformat(raw["created_at"]).timestamp()
    except (ValueError, TypeError, KeyError, AttributeError):
        return None
    return "\n".join(part for part in parts if isinstance(part, str) and part), created


def _transcripts(pairs: Sequence[tuple[str, bytes]], where: str) -> dict[str, list[Message]]:
    """Group a scanned transcripts space into messages per session; skip unreadable ones."""
    headers: dict[str, TranscriptHeader] = {}
    pages: dict[str, list[bytes]] = {}
    for key, data in pairs:
        if is_header_key(key):
            try:
                headers[key] = TranscriptHeader.model_validate_json(data)
            except ValueError:
                logger.error("skipping an unreadable transcript header at %s/%s", where, key)
        else:
            pages.setdefault(key.partition("/")[0], []).append(data)
    out: dict[str, list[Message]] = {}
    for session_id, header in headers.items():
        blob = b"".join(pages.get(session_id, []))
        try:
            if len(pages.get(session_id, [])) != header.pages or len(blob) != header.size:
                raise CorruptRecordError("page count or size differs from the header")
            # The checksum was verified when it was indexed; trust the header here (read path).
            out[session_id] = [Message.model_construct(**item) for item in json.loads(blob)]
        except (ValueError, TypeError, CorruptRecordError) as exc:
            logger.error("skipping an unreadable transcript %s/%s: %s", where, session_id, exc)
    return out


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
    """

    revision: bytes | None
    session_ids: list[str]
    created_at: npt.NDArray[np.float64]
    texts: list[str]
    nbytes: int = 0
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)
    _bm25: BM25Index | None = field(default=None, repr=False)
    _vectors: SessionVectors | None = field(default=None, repr=False)

    def newest_first(self) -> list[str]:
        """Session ids, newest first (ties: larger id first, like the full listing)."""
        order = sorted(
            range(len(self.session_ids)),
            key=lambda i: (self.created_at[i], self.session_ids[i]),
            reverse=True,
        )
        return [self.session_ids[i] for i in order]

    def keywords(self, kv: KVStore, tenant: str, user_id: str) -> BM25Index:
        """BM25 over each session's summary and transcript text (built on first use)."""
        with self._lock:
            if self._bm25 is None:
                space = keys.transcripts_space(tenant, user_id)
                transcripts = _transcripts(kv.scan(space), space)
                self._bm25 = BM25Index.from_counts(
                    (sid, Counter(tokenize(keyword_text(text, transcripts.get(sid)))))
                    for sid, text in zip(self.session_ids, self.texts, strict=True)
                )
                self.nbytes += _ENTRY_BYTES * self._bm25.entries()
            return self._bm25

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


def build_view(kv: KVStore, tenant: str, user_id: str, revision: bytes | None) -> UserView:
    """Read the user's summaries into a new view stamped with ``revision``."""
    ids: list[str] = []
    created: list[float] = []
    texts: list[str] = []
    for session_id, data in kv.scan(keys.sessions_space(tenant, user_id)):
        fields = _summary_fields(data)
        ids.append(session_id)
        texts.append(fields[0] if fields else "")
        created.append(fields[1] if fields else 0.0)
    return UserView(
        revision=revision,
        session_ids=ids,
        created_at=np.asarray(created, dtype=np.float64),
        texts=texts,
        nbytes=sum(len(text) + _ENTRY_BYTES for text in texts),
    )


class ViewCache:
    """Least-recently-used views of at most ``max_users`` users and about ``max_bytes``. Thread-safe.

    ``invalidate`` bumps a per-user generation, so a view built while the
    index was changing underneath it is never stored. Views grow as their
    lazy parts are built: call :meth:`trim` afterwards to keep the bound.
    """

    def __init__(self, max_users: int, max_bytes: int) -> None:
        self._max_users = max(0, max_users)
        self._max_bytes = max(0, max_bytes)
        self._views: OrderedDict[str, UserView] = OrderedDict()
        self._generations: dict[str, int] = {}
        self._lock = threading.Lock()

    def get(self, user_id: str, revision: bytes | None) -> tuple[UserView | None, int]:
        """The cached view if it has this revision, and the user's generation (for :meth:`put`)."""
        with self._lock:
            generation = self._generations.get(user_id, 0)
            view = self._views.get(user_id)
            if view is None or view.revision != revision:
                return None, generation
            self._views.move_to_end(user_id)
            return view, generation

    def put(self, user_id: str, view: UserView, generation: int) -> None:
        """Cache ``view`` unless the user was invalidated since ``generation`` was read."""
        with self._lock:
            if self._max_users == 0 or self._generations.get(user_id, 0) != generation:
                return
            self._views[user_id] = view
            self._views.move_to_end(user_id)
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
            _, view = self._views.popitem(last=False)
            total -= view.nbytes

    def invalidate(self, user_ids: Sequence[str]) -> None:
        """Forget the views of these users."""
        with self._lock:
            for user_id in user_ids:
                self._views.pop(user_id, None)
                self._generations[user_id] = self._generations.get(user_id, 0) + 1

    def clear(self) -> None:
        """Forget every view."""
        with self._lock:
            for user_id in list(self._views):
                self._generations[user_id] = self._generations.get(user_id, 0) + 1
            self._views.clear()
