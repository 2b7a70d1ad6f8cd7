"""LangGraph's long-term memory store (``BaseStore``) on tiermem, sync and async.

Install with ``pip install 'tiermem[langgraph]'``::

    from memory import Memory
    from memory.integrations.langgraph import TiermemStore

    memory = Memory.open(".tiermem")
    store = TiermemStore(memory, user_namespace=("memories", "{user_id}"))
    graph = builder.compile(store=store)  # nodes and tools get it injected

    store.put(("memories", "alice"), "food", {"content": "I like pizza"})
    store.search(("memories", "alice"), query="favourite food")  # pizza first

Items live in the memory's :class:`~tiers.items.ItemStore` (any KV backend:
SQLite, Redis, PostgreSQL; vectors in the memory's vector index), under the memory's
tenant: ``TiermemStore(memory.for_tenant("acme"))`` never sees another
tenant's items.

**Semantic search** is on by default: every put embeds the whole value (JSON
text, field ``"$"``) with the memory's own embedder (the bundled offline
MiniLM unless configured otherwise), and ``search(..., query=...)`` ranks by
cosine similarity. Pass ``index={"fields": [...]}`` to embed chosen fields
(LangGraph's path syntax: ``"text"``, ``"a.b"``, ``"tags[*]"``), ``index={"dims":
..., "embed": ...}`` for your own embedding function or LangChain
``Embeddings`` (sync or async; its vectors must have the memory's embedder's
dimension, the vector index's), or ``index=False`` for none. Without an index
(or an empty query) a search lists items by ``updated_at``, newest first.
Filters (``$eq $ne $gt $gte $lt $lte``, nested fields by ``a.b``) apply to the
stored values.

**TTL** (``supports_ttl``): ``put(..., ttl=minutes)`` or ``ttl={"default_ttl":
...}``; reads restart an item's TTL unless ``refresh_ttl=False`` (or the config's
``refresh_on_read`` is ``False``). An expired item is absent from every read at
once (as with LangGraph's ``omit_expired``); :meth:`TiermemStore.sweep_ttl` (or
the thread :meth:`TiermemStore.start_ttl_sweeper` starts) deletes it with its vectors.

**Over the user tier.** With ``user_namespace`` (a namespace template holding
``"{user_id}"`` once, e.g. ``("memories", "{user_id}")``, LangMem's layout), an
item whose namespace starts with the template belongs to that user:
``Memory.forget_user`` deletes it, and ``Memory.build_continuation_context``
shows it among the user's facts. Such a label must then be a valid tiermem
user id.

**Differences from LangGraph's reference stores**, all deliberate: ops of one
``batch`` run in order (a get after a put in the same batch sees it); expired
items are never returned; a semantic search returns only items that have
vectors; a namespace holds at most 32 labels of 256 characters, a key at most
1024 characters, and an item at most the KV store's per-value limit
(``ValueTooLargeError`` naming ``value``). Errors are tiermem's typed errors
(``InvalidInputError`` naming the field), except LangGraph's own
``InvalidNamespaceError`` for labels it forbids (empty, ``.``, NUL).
"""

from __future__ import annotations

import concurrent.futures
import logging
import threading
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from datetime import datetime
from typing import Literal, cast

import anyio.to_thread

from memory.integrations import require

require("langgraph.store.base", "langgraph")

from langchain_core.embeddings import Embeddings  # noqa: E402
from langgraph.store.base import (  # noqa: E402
    BaseStore,
    GetOp,
    IndexConfig,
    Item,
    ListNamespacesOp,
    Op,
    PutOp,
    Result,
    SearchItem,
    SearchOp,
    TTLConfig,
    ensure_embeddings,
    get_text_at_path,
    tokenize_path,
    validate_op_namespace,
)

from memory.facade import AsyncMemory, Memory  # noqa: E402
from tiers.errors import InvalidInputError, StoreClosedError  # noqa: E402
from tiers.ids import ID_PATTERN, ID_RULE  # noqa: E402
from tiers.items import ItemStore, ItemWrite, StoredItem, check_value  # noqa: E402

__all__ = ["TiermemStore"]

logger = logging.getLogger(__name__)

USER_LABEL = "{user_id}"
_DEFAULT_SWEEP_MINUTES = 5.0


@dataclass(slots=True)
class _Vectors:
    """Embeddings computed for one batch, by op position."""

    puts: dict[int, list[list[float]]] = field(default_factory=dict)
    queries: dict[int, list[float]] = field(default_factory=dict)


class TiermemStore(BaseStore):
    """LangGraph ``BaseStore`` over a :class:`~memory.Memory`'s item store (see the module docs).

    Thread-safe; one instance serves every graph of a process. ``batch`` runs
    in the calling thread, ``abatch`` in a worker thread (embedding with an
    async embedding function on the event loop).

    Args:
        memory: The memory (or its async twin) whose tenant and stores hold the items.
        index: ``None`` (default): embed whole values with the memory's
            embedder. An :class:`IndexConfig` for other ``fields`` and/or
            your own ``embed`` (with ``dims`` equal to the memory embedder's
            dimension). ``False``: no semantic search.
        ttl: LangGraph's :class:`TTLConfig` (``default_ttl`` minutes,
            ``refresh_on_read``, ``sweep_interval_minutes``).
        user_namespace: Namespace template with ``"{user_id}"`` once; items
            under it belong to that user (see the module docs). ``None``: no
            item belongs to a user.
        embedding_name: Name stored with the vectors of a custom ``embed`` (a
            search only compares vectors of one name): keep it stable across
            processes. Default ``"langgraph-<dims>"``.
        clock: Current UTC time, for tests of expiry; default the real clock.

    Raises:
        InvalidInputError: A bad ``index``, ``ttl`` or ``user_namespace`` (``field`` names it).
    """

    supports_ttl: bool = True

    def __init__(
        self,
        memory: Memory | AsyncMemory,
        *,
        index: IndexConfig | Literal[False] | None = None,
        ttl: TTLConfig | None = None,
        user_namespace: Sequence[str] | None = None,
        embedding_name: str | None = None,
        clock: Callable[[], datetime] | None = None,
    ) -> None:
        sync = memory.sync if isinstance(memory, AsyncMemory) else memory
        if not isinstance(sync, Memory):
            raise InvalidInputError(
                f"memory must be a Memory or AsyncMemory, got {type(memory).__name__}",
                field="memory",
            )
        items = sync.items
        self._items: ItemStore = items if clock is None else items.with_clock(clock)
        self.ttl_config: TTLConfig | None = _check_ttl_config(ttl)
        self._template = _check_template(user_namespace)
        self.index_config: IndexConfig | None = None
        self._embeddings: Embeddings | None = None
        self._model = items.embedder.name
        self._fields: list[tuple[str, str | list[str]]] = []
        if index is not False:
            self._configure_index(index or {}, embedding_name)
        self._sweeper: threading.Thread | None = None
        self._stop_sweeper = threading.Event()

    # -- BaseStore primitives ------------------------------------------------------------------

    def batch(self, ops: Iterable[Op]) -> list[Result]:
        """Run ``ops`` in order; one result per op (see LangGraph's ``BaseStore.batch``).

        Raises:
            InvalidNamespaceError: A namespace label LangGraph forbids.
            InvalidInputError: A bad op (``field`` names the part); the ops
                before it were applied, none after it.
        """
        listed = self._check_ops(ops)
        return self._execute(listed, self._embed(listed))

    async def abatch(self, ops: Iterable[Op]) -> list[Result]:
        """Async :meth:`batch`: the store work runs in a worker thread."""
        listed = self._check_ops(ops)
        if self._embeddings is not None:
            vectors = await self._aembed(listed)
            return await anyio.to_thread.run_sync(self._execute, listed, vectors)
        return await anyio.to_thread.run_sync(lambda: self._execute(listed, self._embed(listed)))

    # -- TTL -----------------------------------------------------------------------------------

    def sweep_ttl(self) -> int:
        """Delete every item whose TTL ran out, with its vectors; returns how many."""
        return self._items.sweep()

    async def asweep_ttl(self) -> int:
        """Async :meth:`sweep_ttl`."""
        return await anyio.to_thread.run_sync(self.sweep_ttl)

    def start_ttl_sweeper(
        self, sweep_interval_minutes: float | None = None
    ) -> concurrent.futures.Future[None]:
        """Run :meth:`sweep_ttl` every ``sweep_interval_minutes`` in a daemon thread.

        The interval defaults to the TTL config's ``sweep_interval_minutes``,
        else 5. A failed sweep is logged and tried again next time.

        Returns:
            A future that completes when the sweeper stops; cancelling it stops the sweeper.
        """
        interval = (
            sweep_interval_minutes
            or (self.ttl_config or {}).get("sweep_interval_minutes")
            or _DEFAULT_SWEEP_MINUTES
        )
        if isinstance(interval, bool) or not isinstance(interval, int | float) or interval <= 0:
            raise InvalidInputError(
                f"sweep_interval_minutes must be a positive number, got {interval!r}",
                field="sweep_interval_minutes",
            )
        future: concurrent.futures.Future[None] = concurrent.futures.Future()
        future.add_done_callback(lambda f: self._stop_sweeper.set() if f.cancelled() else None)
        if self._sweeper is not None and self._sweeper.is_alive():
            return future
        self._stop_sweeper.clear()
        seconds = float(interval) * 60

        def loop() -> None:
            while not self._stop_sweeper.wait(seconds):
                try:
                    swept = self.sweep_ttl()
                except StoreClosedError as exc:  # final, unlike an outage: no sweep can succeed
                    logger.warning("item TTL sweeper stops: %s", exc)
                    break
                except Exception:
                    # A sweep fails with the store (an outage): the next one retries it.
                    logger.exception("item TTL sweep failed")
                    continue
                if swept:
                    logger.info("swept %d expired items", swept)
            if not future.done():
                future.set_result(None)

        self._sweeper = threading.Thread(target=loop, name="tiermem-item-sweeper", daemon=True)
        self._sweeper.start()
        return future

    def stop_ttl_sweeper(self, timeout: float | None = None) -> bool:
        """Stop the sweeper thread; returns whether it stopped within ``timeout`` seconds."""
        sweeper = self._sweeper
        if sweeper is None or not sweeper.is_alive():
            return True
        self._stop_sweeper.set()
        sweeper.join(timeout)
        if sweeper.is_alive():
            return False
        self._sweeper = None
        return True

    # -- internals -----------------------------------------------------------------------------

    def _configure_index(self, config: IndexConfig, embedding_name: str | None) -> None:
        if not isinstance(config, dict):
            raise InvalidInputError(
                f"index must be an IndexConfig dict, None or False, got {type(config).__name__}",
                field="index",
            )
        dims = config.get("dims", self._items.dimension)
        if dims != self._items.dimension:
            raise InvalidInputError(
                f"index dims {dims!r} differ from the vector index's {self._items.dimension} "
                f"(embedder {self._items.embedder.name!r}): use an embedding of that dimension, "
                "or open the Memory with the embedding model you want (TIERMEM_EMBEDDING_MODEL)",
                field="index.dims",
            )
        embed = config.get("embed")
        if embed is not None:
            try:
                self._embeddings = ensure_embeddings(embed)
            except (ValueError, ImportError) as exc:
                raise InvalidInputError(
                    f"index embed {embed!r} cannot be used: {exc}", field="index.embed"
                ) from exc
            self._model = embedding_name or f"langgraph-{dims}"
        fields = config.get("fields") or ["$"]
        if not isinstance(fields, list) or not all(isinstance(f, str) for f in fields):
            raise InvalidInputError(
                f"index fields must be a list of paths, got {fields!r}", field="index.fields"
            )
        self._fields = [_tokenized(path, "index.fields") for path in fields]
        self.index_config = IndexConfig(dims=dims, fields=list(fields))
        if embed is not None:
            self.index_config["embed"] = embed

    def _check_ops(self, ops: Iterable[Op]) -> list[Op]:
        listed = list(ops)
        for op in listed:
            if not isinstance(op, GetOp | PutOp | SearchOp | ListNamespacesOp):
                raise InvalidInputError(f"unknown store operation {type(op).__name__}", field="ops")
            validate_op_namespace(op)
            if isinstance(op, PutOp) and op.value is not None:
                # Before anything is embedded: the embedder would choke on it first.
                check_value(op.value)
        return listed

    def _texts(self, ops: Sequence[Op]) -> tuple[dict[int, list[str]], dict[int, str]]:
        """What each put embeds and each search queries, by op position."""
        puts: dict[int, list[str]] = {}
        queries: dict[int, str] = {}
        if self.index_config is None:
            return puts, queries
        for position, op in enumerate(ops):
            if isinstance(op, PutOp) and op.value is not None and op.index is not False:
                paths = (
                    self._fields
                    if op.index is None
                    else [_tokenized(path, "index") for path in op.index]
                )
                # Embedded as stored: redacted (the vectors must not encode a secret either).
                value = self._items.redactor.redact_json(op.value)
                texts = [text for _, tokens in paths for text in get_text_at_path(value, tokens)]
                if texts:
                    puts[position] = texts
            elif isinstance(op, SearchOp) and op.query:
                queries[position] = op.query
        return puts, queries

    def _embed(self, ops: Sequence[Op]) -> _Vectors:
        puts, queries = self._texts(ops)
        out = _Vectors()
        flat = [text for texts in puts.values() for text in texts]
        if self._embeddings is None:
            vectors = self._items.embed([*flat, *queries.values()])
            documents, asked = vectors[: len(flat)], vectors[len(flat) :]
        else:
            documents = self._embeddings.embed_documents(flat) if flat else []
            asked = [self._embeddings.embed_query(q) for q in queries.values()]
        _spread(puts, documents, out.puts)
        out.queries = dict(zip(queries, asked, strict=True))
        return out

    async def _aembed(self, ops: Sequence[Op]) -> _Vectors:
        assert self._embeddings is not None
        puts, queries = self._texts(ops)
        out = _Vectors()
        flat = [text for texts in puts.values() for text in texts]
        documents = await self._embeddings.aembed_documents(flat) if flat else []
        asked = [await self._embeddings.aembed_query(q) for q in queries.values()]
        _spread(puts, documents, out.puts)
        out.queries = dict(zip(queries, asked, strict=True))
        return out

    def _execute(self, ops: list[Op], vectors: _Vectors) -> list[Result]:
        results: list[Result] = []
        pending: list[ItemWrite] = []
        for position, op in enumerate(ops):
            if isinstance(op, PutOp):
                pending.append(self._write(op, vectors.puts.get(position, [])))
                results.append(None)
                continue
            if pending:
                self._items.write(pending)
                pending = []
            if isinstance(op, GetOp):
                found = self._items.get(op.namespace, op.key, refresh_ttl=op.refresh_ttl)
                results.append(None if found is None else _to_item(found))
            elif isinstance(op, SearchOp):
                results.append(self._search(op, vectors.queries.get(position)))
            else:
                results.append(self._list_namespaces(op))
        if pending:
            self._items.write(pending)
        return results

    def _write(self, op: PutOp, vectors: list[list[float]]) -> ItemWrite:
        return ItemWrite(
            namespace=op.namespace,
            key=op.key,
            value=op.value,
            vectors=vectors,
            model=self._model if vectors else None,
            ttl_minutes=op.ttl if op.value is not None else None,
            user_id=self._owner(op.namespace) if op.value is not None else None,
        )

    def _search(self, op: SearchOp, query: list[float] | None) -> list[SearchItem]:
        if query is None:
            found = self._items.list_items(
                op.namespace_prefix,
                filter=op.filter,
                limit=op.limit,
                offset=op.offset,
                refresh_ttl=op.refresh_ttl,
            )
        else:
            found = self._items.search(
                op.namespace_prefix,
                query,
                model=self._model,
                filter=op.filter,
                limit=op.limit,
                offset=op.offset,
                refresh_ttl=op.refresh_ttl,
            )
        return [_to_search_item(item) for item in found]

    def _list_namespaces(self, op: ListNamespacesOp) -> list[tuple[str, ...]]:
        prefixes: list[tuple[str | None, ...]] = []
        suffixes: list[tuple[str | None, ...]] = []
        for condition in op.match_conditions or ():
            pattern = tuple(None if label == "*" else label for label in condition.path)
            if not pattern:
                continue  # an empty path constrains nothing
            if condition.match_type == "prefix":
                prefixes.append(pattern)
            elif condition.match_type == "suffix":
                suffixes.append(pattern)
            else:
                raise InvalidInputError(
                    f"unknown namespace match type {condition.match_type!r}: use prefix or suffix",
                    field="match_conditions",
                )
        return self._items.namespaces(
            prefixes=prefixes,
            suffixes=suffixes,
            max_depth=op.max_depth,
            limit=op.limit,
            offset=op.offset,
        )

    def _owner(self, namespace: tuple[str, ...]) -> str | None:
        """The user an item in ``namespace`` belongs to under the ``user_namespace`` template."""
        template = self._template
        if template is None or len(namespace) < len(template):
            return None
        user: str | None = None
        for expected, label in zip(template, namespace, strict=False):
            if expected == USER_LABEL:
                user = label
            elif expected != label:
                return None
        if user is None or ID_PATTERN.fullmatch(user) is None:
            raise InvalidInputError(
                f"namespace {namespace!r} files the item under user {user!r} "
                f"(user_namespace {template!r}), which is not a valid user id: use {ID_RULE}",
                field="namespace",
            )
        return user


def _spread(
    texts: dict[int, list[str]], vectors: list[list[float]], out: dict[int, list[list[float]]]
) -> None:
    """Hand each put its share of the flat ``vectors`` (in the order of ``texts``)."""
    if len(vectors) != sum(len(t) for t in texts.values()):
        raise InvalidInputError(
            f"the embedding function returned {len(vectors)} vectors for "
            f"{sum(len(t) for t in texts.values())} texts",
            field="index.embed",
        )
    start = 0
    for position, group in texts.items():
        out[position] = [list(v) for v in vectors[start : start + len(group)]]
        start += len(group)


def _tokenized(path: object, field: str) -> tuple[str, str | list[str]]:
    if not isinstance(path, str) or not path:
        raise InvalidInputError(
            f"{field} paths must be non-empty strings, got {path!r}", field=field
        )
    if path == "$":
        return path, path
    try:
        return path, tokenize_path(path)
    except (ValueError, IndexError) as exc:
        raise InvalidInputError(f"{field} path {path!r} is malformed: {exc}", field=field) from exc


def _check_ttl_config(ttl: object) -> TTLConfig | None:
    if ttl is None:
        return None
    if not isinstance(ttl, dict):
        raise InvalidInputError(
            f"ttl must be a TTLConfig dict or None, got {type(ttl).__name__}", field="ttl"
        )
    default = ttl.get("default_ttl")
    if default is not None and (
        isinstance(default, bool) or not isinstance(default, int | float) or default <= 0
    ):
        raise InvalidInputError(
            f"ttl default_ttl must be a positive number of minutes or None, got {default!r}",
            field="ttl.default_ttl",
        )
    return cast(TTLConfig, dict(ttl))


def _check_template(template: object) -> tuple[str, ...] | None:
    if template is None:
        return None
    if isinstance(template, str) or not isinstance(template, Sequence):
        raise InvalidInputError(
            f"user_namespace must be a tuple of labels, got {type(template).__name__}",
            field="user_namespace",
        )
    labels = tuple(template)
    if not all(isinstance(label, str) and label for label in labels) or (
        labels.count(USER_LABEL) != 1
    ):
        raise InvalidInputError(
            f"user_namespace must be non-empty labels with {USER_LABEL!r} exactly once, "
            f"e.g. ('memories', {USER_LABEL!r}); got {template!r}",
            field="user_namespace",
        )
    return labels


def _to_item(found: StoredItem) -> Item:
    return Item(
        value=found.value,
        key=found.key,
        namespace=found.namespace,
        created_at=found.created_at,
        updated_at=found.updated_at,
    )


def _to_search_item(found: StoredItem) -> SearchItem:
    return SearchItem(
        namespace=found.namespace,
        key=found.key,
        value=found.value,
        created_at=found.created_at,
        updated_at=found.updated_at,
        score=found.score,
    )
