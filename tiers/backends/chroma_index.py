"""Chroma implementation of :class:`~tiers.backends.base.VectorIndex`.

Embedded (``chromadb.PersistentClient`` on a directory) by default, or a Chroma
server (``chroma run``) through ``chromadb.HttpClient`` when given an
``http(s)://`` URL. Embeddings are always computed by us and passed in, and the
collection is created without an embedding function, so Chroma never loads (or
downloads) its default model, not even when a collection is reopened in a new
process. The collection records which embedder and dimension built it; opening
it with another one is refused rather than silently mixing vector spaces.

One embedded data directory belongs to one process at a time (a second process
writing to it is not seen by the first): deployments with several processes
use the server.

A collection that disappears while open (a Chroma server restarted on an empty
volume, a collection deleted by hand) is created again, empty, on the next call:
the index is derived data, and :mod:`tiers.index_check` finds what it lacks and
re-indexes it from the KV store.

Embedded, the HNSW files Chroma creates hold heap garbage in the capacity no
vector uses yet (possibly text the process handled and freed): those slots are
zeroed when Chroma creates the files and when an index is opened
(:mod:`tiers.backends._chroma_files`), so deleted text cannot live on there.
"""

from __future__ import annotations

import contextlib
import logging
import math
import threading
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any
from urllib.parse import urlsplit

import chromadb
import numpy as np
import numpy.typing as npt
from chromadb.config import Settings
from chromadb.errors import (
    ChromaError,
    DuplicateIDError,
    InvalidArgumentError,
    InvalidDimensionException,
    NotFoundError,
)

from tiers.backends import redact_url
from tiers.backends._chroma_files import hnsw_segments, zero_unused_slots
from tiers.backends.base import Embedder, VectorHit, VectorItem
from tiers.errors import BackendUnavailableError, InvalidInputError, StoreClosedError

logger = logging.getLogger(__name__)

DEFAULT_COLLECTION = "tiermem_sessions"
EMBEDDER_KEY = "tiermem_embedder"
DIMENSION_KEY = "tiermem_dimension"

_DEFAULT_BATCH = 1000
_IDS_PAGE = 5000

# Chroma's own validation errors mean the request was bad, not that the backend failed.
_INPUT_ERRORS = (InvalidArgumentError, InvalidDimensionException, DuplicateIDError)


def _where(where: Mapping[str, str]) -> dict[str, Any] | None:
    for key, value in where.items():
        if not isinstance(key, str) or not key or not isinstance(value, str):
            raise InvalidInputError(
                f"where filters map metadata names to strings, got {key!r}: {value!r}",
                field="where",
            )
    clauses = [{key: value} for key, value in where.items()]
    if not clauses:
        return None
    if len(clauses) == 1:
        return clauses[0]
    return {"$and": clauses}


class ChromaVectorIndex:
    """A :class:`VectorIndex` in one Chroma collection, cosine space.

    Args:
        path_or_url: A data directory for embedded Chroma, or the
            ``http://host:port`` / ``https://host:port`` URL of a Chroma server.
        collection: Collection name (3-512 characters from ``[a-zA-Z0-9._-]``).
        embedder: The embedder producing the vectors: gives ``dimension`` and
            ``embedder_name`` (it is never called by the index).
        dimension: Length of every embedding; checked on each write and query.
        embedder_name: Name of the embedder producing the vectors; stored in
            the collection's metadata and checked when it is reopened.
        headers: HTTP headers for a server (e.g. an auth token); ignored when embedded.
        batch_size: Largest number of items per Chroma write call.

    Raises:
        InvalidInputError: A bad argument, or the collection was built with a
            different embedder or dimension, or not in cosine space.
        BackendUnavailableError: Chroma cannot be opened or reached.
    """

    def __init__(
        self,
        path_or_url: str | Path,
        collection: str = DEFAULT_COLLECTION,
        *,
        embedder: Embedder | None = None,
        dimension: int | None = None,
        embedder_name: str | None = None,
        headers: Mapping[str, str] | None = None,
        batch_size: int = _DEFAULT_BATCH,
    ) -> None:
        if embedder is not None:
            dimension = embedder.dimension if dimension is None else dimension
            embedder_name = embedder.name if embedder_name is None else embedder_name
        if not isinstance(dimension, int) or isinstance(dimension, bool) or dimension < 1:
            raise InvalidInputError(
                "pass embedder=, or dimension= as a positive integer", field="dimension"
            )
        if not embedder_name:
            raise InvalidInputError(
                "pass embedder=, or a non-empty embedder_name=", field="embedder_name"
            )
        if batch_size < 1:
            raise InvalidInputError("batch_size must be at least 1", field="batch_size")
        self.dimension: int = dimension
        self.embedder_name: str = embedder_name
        self.location = str(path_or_url)
        self.recreated = 0  # times the collection was found gone and created again, empty
        self._name = collection
        self._lock = threading.Lock()
        self._closed = False
        # Embedded: the data directory, its HNSW segments zeroed so far, and whether a write
        # may create new ones (then writes run one at a time, each followed by the zeroing).
        self._files: Path | None = None
        self._segments: set[Path] = set()
        self._new_segments_expected = False
        self._files_lock = threading.Lock()
        settings = Settings(anonymized_telemetry=False)
        target = str(path_or_url)
        try:
            if target.startswith(("http://", "https://")):
                parts = urlsplit(target)
                if not parts.hostname:
                    raise InvalidInputError(
                        f"no host in Chroma URL {redact_url(target)!r}", field="path_or_url"
                    )
                ssl = parts.scheme == "https"
                self._client: Any = chromadb.HttpClient(
                    host=parts.hostname,
                    port=parts.port or (443 if ssl else 8000),
                    ssl=ssl,
                    headers=dict(headers or {}),
                    settings=settings,
                )
            else:
                Path(target).mkdir(parents=True, exist_ok=True)
                self._files = Path(target)
                # Before Chroma loads anything: an index written by an earlier version (or by
                # a process that stopped before zeroing) is cleaned up here.
                self._segments = set(hnsw_segments(self._files))
                for segment in self._segments:
                    zero_unused_slots(segment)
                self._new_segments_expected = not self._segments
                self._client = chromadb.PersistentClient(path=target, settings=settings)
        except InvalidInputError:
            raise
        except (ChromaError, ValueError, OSError) as exc:
            # chromadb reports an unreachable server as a bare ValueError.
            raise BackendUnavailableError(
                f"cannot open Chroma at {redact_url(target)}: {exc}"
            ) from exc
        try:
            self._collection = self._open_collection(collection)
            self._max_batch = min(batch_size, int(self._client.get_max_batch_size()))
        except BaseException:
            self._release()
            raise

    def _open_collection(self, name: str) -> Any:
        wanted: dict[str, str | int] = {
            EMBEDDER_KEY: self.embedder_name,
            DIMENSION_KEY: self.dimension,
        }
        with self._translate(f"opening collection {name!r}", field="collection"):
            # embedding_function=None: vectors are always ours; Chroma must never embed.
            collection = self._client.get_or_create_collection(
                name,
                embedding_function=None,
                configuration={"hnsw": {"space": "cosine"}},
                metadata=wanted,
            )
            stored = dict(collection.metadata or {})
            if (
                EMBEDDER_KEY not in stored
                and DIMENSION_KEY not in stored
                and collection.count() == 0
            ):
                # An empty collection made by someone else: adopt it.
                collection.modify(metadata={**stored, **wanted})
                stored.update(wanted)
        built_with = (stored.get(EMBEDDER_KEY), stored.get(DIMENSION_KEY))
        if built_with != (self.embedder_name, self.dimension):
            raise InvalidInputError(
                f"Chroma collection {name!r} at {self.location} holds vectors of embedder "
                f"{built_with[0]!r} (dimension {built_with[1]!r}), not {self.embedder_name!r} "
                f"(dimension {self.dimension}): configure the embedder it was built with, or use "
                f"another collection name and re-index into it",
                field="embedder",
            )
        config = getattr(collection, "configuration_json", None) or {}
        space = (config.get("hnsw") or config.get("spann") or {}).get("space", "cosine")
        if space != "cosine":
            raise InvalidInputError(
                f"Chroma collection {name!r} uses {space!r} distance, tiermem needs 'cosine': "
                f"use another collection name",
                field="collection",
            )
        return collection

    @contextmanager
    def _translate(self, what: str, *, field: str | None = None) -> Iterator[None]:
        try:
            yield
        except (InvalidInputError, BackendUnavailableError):
            raise
        except _INPUT_ERRORS as exc:
            raise InvalidInputError(f"Chroma refused {what}: {exc}", field=field) from exc
        except Exception as exc:
            # Chroma surfaces I/O and server failures through many types (httpx, Rust
            # bindings, ChromaError subclasses): all mean the index did not do the work.
            raise BackendUnavailableError(
                f"Chroma {what} failed ({type(exc).__name__}): {exc}"
            ) from exc

    def _call(self, what: str, method: str, **kwargs: Any) -> Any:
        """``collection.<method>(**kwargs)``, translated; a collection gone is created again, once.

        Chroma answers "does not exist" when the collection was dropped under
        this client (a server restarted on an empty volume, a manual delete).
        The index is derived data: the collection is made again, empty, and
        the KV store stays the truth (the consistency check re-indexes it).
        """
        collection = self._collection
        with self._translate(what):
            try:
                return getattr(collection, method)(**kwargs)
            except NotFoundError:
                pass
        with self._lock:
            if self._collection is collection:
                self._collection = self._open_collection(self._name)
                self.recreated += 1
                self._new_segments_expected = self._files is not None
                logger.warning(
                    "Chroma collection %r at %s was gone; created it again, empty: the index "
                    "consistency check re-indexes it from the KV store",
                    self._name,
                    redact_url(self.location),
                )
        with self._translate(what):
            return getattr(self._collection, method)(**kwargs)

    @contextmanager
    def _writing(self) -> Iterator[None]:
        """Around a write: while it may create the HNSW files, one at a time, then zero them."""
        if not self._new_segments_expected:
            yield
            return
        with self._files_lock:
            try:
                yield
            finally:
                self._zero_new_segments()

    def _zero_new_segments(self) -> None:
        """Zero the unused slots of HNSW segments Chroma created since the last look."""
        assert self._files is not None
        fresh = [s for s in hnsw_segments(self._files) if s not in self._segments]
        for segment in fresh:
            zero_unused_slots(segment)
        self._segments.update(fresh)
        if fresh:
            self._new_segments_expected = False

    def _check_open(self) -> None:
        if self._closed:
            raise StoreClosedError("the Chroma index is closed")

    def _check_vector(self, embedding: Sequence[float], field: str) -> list[float]:
        try:
            vector = [float(x) for x in embedding]
        except (TypeError, ValueError) as exc:
            raise InvalidInputError(f"{field} must be a sequence of numbers", field=field) from exc
        if len(vector) != self.dimension:
            raise InvalidInputError(
                f"{field} has {len(vector)} dimensions, the index expects {self.dimension}",
                field=field,
            )
        if not all(math.isfinite(x) for x in vector):
            raise InvalidInputError(f"{field} contains NaN or infinity", field=field)
        return vector

    def upsert(self, items: Sequence[VectorItem]) -> None:
        """Insert or replace items by id, in as few Chroma calls as its batch limit allows.

        When an id appears twice in ``items`` the later item wins.

        Raises:
            InvalidInputError: An empty id, a wrong-sized or non-finite
                embedding, or a metadata value that is not str/int/float/bool.
            BackendUnavailableError: Chroma failed; some batches may be written.
        """
        self._check_open()
        latest: dict[str, VectorItem] = {}
        for index, item in enumerate(items):
            if not isinstance(item.id, str) or not item.id:
                raise InvalidInputError(f"items[{index}].id must be a non-empty string", field="id")
            for key, value in item.metadata.items():
                if not isinstance(value, str | int | float | bool):
                    raise InvalidInputError(
                        f"metadata {key!r} of {item.id!r} must be str, int, float or bool",
                        field="metadata",
                    )
            latest[item.id] = item
        unique = list(latest.values())
        vectors = [
            self._check_vector(item.embedding, f"embedding of {item.id!r}") for item in unique
        ]
        with self._writing():
            self._upsert(unique, vectors)

    def _upsert(self, unique: list[VectorItem], vectors: list[list[float]]) -> None:
        for start in range(0, len(unique), self._max_batch):
            chunk = unique[start : start + self._max_batch]
            embeddings = vectors[start : start + self._max_batch]
            ids = [item.id for item in chunk]
            stored = self._call("upsert", "get", ids=ids, include=["metadatas"])
            old_keys = {
                vector_id: set(metadata or {})
                for vector_id, metadata in zip(
                    stored.get("ids") or [], stored.get("metadatas") or [], strict=False
                )
            }
            self._call(
                "upsert",
                "upsert",
                ids=ids,
                embeddings=embeddings,
                # Always a string: Chroma's upsert keeps an item's old document when
                # given None, and a replaced or erased text must not stay behind.
                documents=[item.document for item in chunk],
                metadatas=[_replacing(item, old_keys.get(item.id, set())) for item in chunk],
            )

    def query(
        self, embedding: Sequence[float], *, where: Mapping[str, str], top_k: int
    ) -> list[VectorHit]:
        """Return up to ``top_k`` items matching every ``where`` entry, nearest first.

        An empty collection, or a filter that matches nothing, gives an empty
        list; ``top_k`` larger than the number of matches gives all matches.

        Raises:
            InvalidInputError: ``top_k`` < 1, a bad filter or a wrong-sized embedding.
            BackendUnavailableError: Chroma failed.
        """
        self._check_open()
        if not isinstance(top_k, int) or top_k < 1:
            raise InvalidInputError("top_k must be a positive integer", field="top_k")
        vector = self._check_vector(embedding, "embedding")
        result = self._call(
            "query",
            "query",
            query_embeddings=[vector],
            n_results=top_k,
            where=_where(where),
            include=["documents", "metadatas", "distances"],
        )
        ids: list[str] = (result.get("ids") or [[]])[0]
        distances = (result.get("distances") or [[]])[0]
        documents = (result.get("documents") or [[]])[0]
        metadatas = (result.get("metadatas") or [[]])[0]
        hits = [
            VectorHit(
                id=ids[i],
                distance=float(distances[i]),
                document=documents[i] or "",
                metadata=dict(metadatas[i] or {}),
            )
            for i in range(len(ids))
        ]
        if len(hits) < top_k:
            return self._complete(vector, where, top_k, hits)
        return hits

    def _complete(
        self, vector: list[float], where: Mapping[str, str], top_k: int, hits: list[VectorHit]
    ) -> list[VectorHit]:
        """``hits``, or the exact nearest ``top_k`` if the search left out live matches.

        Fewer hits than asked for claims the filter matches no more items.
        Chroma's approximate search can leave out live items after deletes
        and upserts (chroma-core/chroma#7758, seen on 1.5.9: a filtered query
        returned none of a tenant's vectors although ``get`` had them), and
        without (1.5.9, 10,000 vectors: 4-7% of queries for a tenant's 10 got
        fewer), so the claim is checked with a page of ids; when the filter
        matches more, the matches are ranked exactly, a page at a time. A full
        ``top_k`` is not checked (approximate, it may miss a nearer item); a
        delete while the pages are read can leave one out (as in :meth:`ids`).
        """
        flt = _where(where)
        matched = self._call("get", "get", where=flt, include=[], limit=len(hits) + 1)
        if len(matched.get("ids") or []) <= len(hits):
            return hits
        query = np.asarray(vector, dtype=np.float64)
        query /= np.linalg.norm(query) or 1.0
        best: dict[str, VectorHit] = {}  # the nearest rows read so far, nearest first
        offset = 0
        while True:
            page = self._call(
                "get",
                "get",
                where=flt,
                include=["embeddings", "documents", "metadatas"],
                limit=_IDS_PAGE,
                offset=offset,
            )
            page_ids: list[str] = list(page.get("ids") or [])
            if page_ids:
                # Pages list items in the order they were added: an id deleted and added
                # again while they are read comes back on a later page, its current row.
                for vector_id in page_ids:
                    best.pop(vector_id, None)
                rows = np.asarray(page["embeddings"], dtype=np.float64)
                norms = np.linalg.norm(rows, axis=1)
                norms[norms == 0] = 1.0
                distances = 1.0 - (rows @ query) / norms
                documents = page.get("documents") or [None] * len(page_ids)
                metadatas = page.get("metadatas") or [None] * len(page_ids)
                for i in np.argsort(distances, kind="stable")[:top_k]:
                    best[page_ids[i]] = VectorHit(
                        page_ids[i],
                        float(distances[i]),
                        documents[i] or "",
                        dict(metadatas[i] or {}),
                    )
                best = dict(sorted(best.items(), key=lambda b: b[1].distance)[:top_k])
            if len(page_ids) < _IDS_PAGE:
                break
            offset += len(page_ids)
        logger.info(
            "the index's search returned %d of a filter's nearest %d; ranked its matches exactly",
            len(hits),
            len(best),
        )
        return list(best.values())

    def get_embeddings(self, ids: Sequence[str]) -> tuple[list[str], npt.NDArray[np.float32]]:
        """The stored embeddings of the items with these ids; unknown ids are left out.

        A lookup by id needs no metadata filter, which is what makes it fast on
        a large collection (a filtered query scans the filter's matches).

        Returns:
            The ids found (in no particular order) and a matrix whose rows are
            their embeddings, in the same order.

        Raises:
            BackendUnavailableError: Chroma failed.
        """
        self._check_open()
        unique = list(dict.fromkeys(ids))
        found: list[str] = []
        rows: list[npt.NDArray[np.float32]] = []
        for start in range(0, len(unique), self._max_batch):
            chunk = unique[start : start + self._max_batch]
            page = self._call("get", "get", ids=chunk, include=["embeddings"])
            page_ids: list[str] = list(page.get("ids") or [])
            if page_ids:
                found.extend(page_ids)
                rows.append(np.asarray(page["embeddings"], dtype=np.float32))
        if not rows:
            return [], np.zeros((0, self.dimension), dtype=np.float32)
        return found, np.concatenate(rows) if len(rows) > 1 else rows[0]

    def delete(self, ids: Sequence[str]) -> None:
        """Remove items by id; unknown ids are ignored.

        Raises:
            BackendUnavailableError: Chroma failed.
        """
        self._check_open()
        unique = list(dict.fromkeys(ids))
        with self._writing():
            for start in range(0, len(unique), self._max_batch):
                chunk = unique[start : start + self._max_batch]
                self._call("delete", "delete", ids=chunk)

    def ids(self, *, where: Mapping[str, str]) -> list[str]:
        """Ids of every item whose metadata equals every ``where`` entry (all items for ``{}``).

        Raises:
            InvalidInputError: A bad filter.
            BackendUnavailableError: Chroma failed.
        """
        self._check_open()
        flt = _where(where)
        found: list[str] = []
        offset = 0
        while True:
            page = self._call("get", "get", where=flt, include=[], limit=_IDS_PAGE, offset=offset)
            batch: list[str] = list(page.get("ids") or [])
            found.extend(batch)
            if len(batch) < _IDS_PAGE:
                return found
            offset += len(batch)

    def metadata(
        self, *, where: Mapping[str, str], ids: Sequence[str] | None = None
    ) -> dict[str, dict[str, str | int | float | bool]]:
        """Id -> metadata of every item whose metadata equals every ``where`` entry, read in pages.

        With ``ids``, only those items (unknown ids are left out).

        Raises:
            InvalidInputError: A bad filter.
            BackendUnavailableError: Chroma failed.
        """
        self._check_open()
        flt = _where(where)
        found: dict[str, dict[str, str | int | float | bool]] = {}

        def add(page: Any) -> int:
            batch: list[str] = list(page.get("ids") or [])
            metadatas = page.get("metadatas") or [None] * len(batch)
            for vector_id, metadata in zip(batch, metadatas, strict=True):
                found[vector_id] = dict(metadata or {})
            return len(batch)

        if ids is not None:
            unique = list(dict.fromkeys(ids))
            for start in range(0, len(unique), self._max_batch):
                chunk = unique[start : start + self._max_batch]
                add(self._call("get", "get", ids=chunk, where=flt, include=["metadatas"]))
            return found
        offset = 0
        while True:
            got = add(
                self._call(
                    "get", "get", where=flt, include=["metadatas"], limit=_IDS_PAGE, offset=offset
                )
            )
            if got < _IDS_PAGE:
                return found
            offset += got

    def count(self) -> int:
        """Number of items in the collection.

        Raises:
            BackendUnavailableError: Chroma failed.
        """
        self._check_open()
        return int(self._call("count", "count"))

    def ping(self) -> None:
        """Raise :class:`BackendUnavailableError` unless Chroma answers."""
        self._check_open()
        with self._translate("heartbeat"):
            self._client.heartbeat()
        self._call("count", "count")

    def close(self) -> None:
        """Release the client (and, embedded, the data directory). Idempotent."""
        with self._lock:
            if self._closed:
                return
            self._closed = True
        self._release()

    def _release(self) -> None:
        close = getattr(self._client, "close", None)
        if close is not None:
            # Closing is best effort: a failure here must not hide the caller's own error.
            with contextlib.suppress(Exception):
                close()


def _replacing(
    item: VectorItem, old_keys: set[str]
) -> dict[str, str | int | float | bool | None] | None:
    """``item``'s metadata for Chroma's upsert, which merges into the stored metadata: a key
    the item no longer has is sent as None, which deletes it, so the item is replaced whole."""
    metadata: dict[str, str | int | float | bool | None] = dict(item.metadata)
    for key in old_keys - metadata.keys():
        metadata[key] = None
    return metadata or None
