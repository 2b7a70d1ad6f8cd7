"""LangGraph on tiermem: a checkpointer, exactly-once effects inside nodes, and a store.

Install with ``pip install 'tiermem[langgraph]'``::

    from memory import Memory
    from memory.integrations.langgraph import TiermemSaver

    memory = Memory.open(".tiermem")
    graph = builder.compile(checkpointer=TiermemSaver(memory))
    graph.invoke({"messages": [...]}, {"configurable": {"thread_id": "user:42/chat"}})

**Storage.** :class:`TiermemSaver` stores threads in the memory's
:class:`~tiers.threads.ThreadTier` (any KV backend: SQLite, Redis, PostgreSQL): any string
is a thread id or namespace; a channel's value is stored once per version,
never again while it is unchanged; ``get_tuple`` (latest or by id) reads one
checkpoint, its values and writes, never the whole thread; ``list`` pages newest
first; values of any size are chunked transparently. A list channel that grew
by appending (a chat's messages) is stored as its new tail, relative to the
version before it, with a full copy at least every ``delta_every`` versions, so
a long thread costs each step its change, not its length. An append is
recognised by comparing the stored elements' attribute values with the new
list's (identity first, then equality); an element whose attribute was
reassigned in place makes the list stored whole. A change deeper inside an
element's attribute (appending to a list inside a message) is not seen, as
with LangGraph's own ``DeltaChannel``: return updates from nodes instead, or
pass ``delta=False``.

**Concurrent writers (no forks).** Every put is checked against the head of
its thread namespace (a compare-and-set in the store's commit). When two
processes invoke one thread at once, both read the same checkpoint; the first
to write appends, and the second's write would fork the thread (LangGraph issue
#8796): it fails fast with :class:`~tiers.errors.ThreadConflictError` and writes
nothing; the caller re-invokes from the new head. A put whose parent is not
the head is accepted as a deliberate branch when the parent was addressed by
id through this saver (time travel: ``invoke``/``update_state`` with a
``checkpoint_id``), or when this saver never told anyone that parent was the
newest (direct use of the checkpointer API).

**Effects.** :func:`effect` runs an external side effect from inside a node at
most once per task, across crashes and retries, keyed by thread, namespace,
the task (whose id LangGraph derives from the checkpoint) and the effect's name.
"""

from __future__ import annotations

import hashlib
import json
import random
import threading
from collections.abc import AsyncIterator, Callable, Iterator, Sequence
from typing import Any, TypeVar, cast

import anyio.to_thread

from memory.integrations import require

require("langgraph.checkpoint.base", "langgraph")

from langchain_core.runnables import RunnableConfig  # noqa: E402
from langgraph.checkpoint.base import (  # noqa: E402
    WRITES_IDX_MAP,
    BaseCheckpointSaver,
    ChannelVersions,
    Checkpoint,
    CheckpointMetadata,
    CheckpointTuple,
    get_checkpoint_id,
    get_serializable_checkpoint_metadata,
)
from langgraph.checkpoint.serde.base import SerializerProtocol  # noqa: E402

from memory.facade import AsyncMemory, Memory  # noqa: E402
from memory.integrations._langgraph_channels import ChannelCodec, dumps, loads  # noqa: E402
from memory.integrations._langgraph_views import WriterViews  # noqa: E402
from memory.integrations.langgraph_store import TiermemStore  # noqa: E402
from tiers.errors import (  # noqa: E402
    ConflictError,
    EffectOutcomeUnknownError,
    InvalidInputError,
    ThreadConflictError,
)
from tiers.task import NOT_DONE, NotDone  # noqa: E402
from tiers.threads import EffectEntry, NewCheckpoint, StoredCheckpoint  # noqa: E402

__all__ = ["NOT_DONE", "TiermemSaver", "TiermemStore", "effect"]

T = TypeVar("T")

_ATTEMPTS = 4


def _conf(config: RunnableConfig) -> dict[str, Any]:
    conf = config.get("configurable")
    if not isinstance(conf, dict) or conf.get("thread_id") in (None, ""):
        raise InvalidInputError(
            "config['configurable']['thread_id'] is required: the checkpointer stores a thread",
            field="thread_id",
        )
    return conf


class TiermemSaver(BaseCheckpointSaver[str]):
    """A LangGraph checkpointer on tiermem (see the module docstring).

    Args:
        memory: The :class:`~memory.Memory` (or :class:`~memory.AsyncMemory`)
            whose store and tenant the threads live in.
        serde: LangGraph serializer for channel values and writes (default:
            LangGraph's ``JsonPlusSerializer``; an ``EncryptedSerializer`` works too).
        delta: Store a list channel that grew by appending as its new tail.
        delta_every: Store a list whole at least every this many versions
            (bounds what a read assembles).
        cache_items: How many list elements the saver keeps in memory, over
            all threads: the newest version of each list channel it stored or
            read, so the next step stores its tail, and a read of that version
            (the next invoke's ``get_tuple``) needs no decoding. ``0`` keeps
            none (every list is then stored whole).
    """

    def __init__(
        self,
        memory: Memory | AsyncMemory,
        *,
        serde: SerializerProtocol | None = None,
        delta: bool = True,
        delta_every: int = 32,
        cache_items: int = 200_000,
    ) -> None:
        super().__init__(serde=serde)
        core = memory.sync if isinstance(memory, AsyncMemory) else memory
        if not isinstance(core, Memory):
            raise InvalidInputError(
                f"memory must be a Memory or AsyncMemory, got {type(memory).__name__}",
                field="memory",
            )
        if isinstance(delta_every, bool) or not isinstance(delta_every, int) or delta_every < 1:
            raise InvalidInputError("delta_every must be an integer >= 1", field="delta_every")
        if isinstance(cache_items, bool) or not isinstance(cache_items, int) or cache_items < 0:
            raise InvalidInputError("cache_items must be an integer >= 0", field="cache_items")
        self.memory = core
        self._threads = core.threads
        # One lock for the writer views and the list cache, so a put updates both at once.
        self._lock = threading.Lock()
        self._views = WriterViews(self._lock)
        self._channels = ChannelCodec(
            delta=delta,
            delta_every=delta_every,
            cache_items=cache_items,
            lock=self._lock,
        )

    # -- reads ----------------------------------------------------------------

    def get_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """The checkpoint ``config`` names (``checkpoint_id``), or its namespace's newest."""
        conf = _conf(config)
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        checkpoint_id = get_checkpoint_id(config)
        if checkpoint_id:
            stored = self._threads.get(thread_id, ns, checkpoint_id)
            if stored is not None:
                self._views.read_by_id(thread_id, ns, checkpoint_id)
        else:
            stored = self._threads.latest(thread_id, ns)
            self._views.read_latest(thread_id, ns, None if stored is None else stored.checkpoint_id)
        if stored is None:
            return None
        return self._tuple(thread_id, stored, cache=True)

    def list(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> Iterator[CheckpointTuple]:
        """Checkpoints newest first, filtered by metadata, before a checkpoint, at most ``limit``.

        ``config`` without ``checkpoint_ns`` lists every namespace of the thread;
        ``None`` lists every thread of the memory's tenant.
        """
        wanted = dict(filter or {})

        def matches(ckpt: StoredCheckpoint) -> bool:
            md = ckpt.metadata
            return all(k in md and md[k] == v for k, v in wanted.items())

        before_id = get_checkpoint_id(before) if before else None
        threads = self._threads.threads()
        ns: str | None = None
        exact: str | None = None
        if config is not None:
            conf = _conf(config)
            threads = [str(conf["thread_id"])]
            if "checkpoint_ns" in conf:
                ns = str(conf["checkpoint_ns"])
            exact = get_checkpoint_id(config)

        def keep(ckpt: StoredCheckpoint) -> bool:
            return (exact is None or ckpt.checkpoint_id == exact) and matches(ckpt)

        count = 0
        for thread_id in threads:
            left = None if limit is None else limit - count
            stream = self._threads.history(
                thread_id,
                ns,
                before=before_id,
                limit=left,
                where=keep if wanted or exact is not None else None,
            )
            for stored in stream:
                yield self._tuple(thread_id, stored, cache=False)
                count += 1
                if limit is not None and count >= limit:
                    return

    def _tuple(self, thread_id: str, stored: StoredCheckpoint, *, cache: bool) -> CheckpointTuple:
        ns, checkpoint_id = stored.ns, stored.checkpoint_id
        rest = loads(self.serde, stored.payload)
        values: dict[str, Any] = {}
        wanted: dict[str, str | int | float] = {}
        for channel, version in stored.channel_versions.items():
            hit = self._channels.cached(thread_id, ns, channel, str(version))
            if hit is None:
                wanted[channel] = version
            else:
                values[channel] = hit
        for channel, chain in self._threads.blobs(thread_id, ns, wanted).items():
            values[channel] = self._channels.assemble(
                self.serde, thread_id, ns, channel, chain, cache=cache
            )
        checkpoint = cast(
            Checkpoint,
            {
                **rest,
                "id": checkpoint_id,
                "channel_values": values,
                "channel_versions": dict(stored.channel_versions),
            },
        )
        writes = [
            (w.task_id, w.channel, loads(self.serde, w.payload))
            for w in self._threads.writes(thread_id, ns, checkpoint_id)
        ]
        parent = None
        if stored.parent_id is not None:
            parent = _config(thread_id, ns, stored.parent_id)
        return CheckpointTuple(
            config=_config(thread_id, ns, checkpoint_id),
            checkpoint=checkpoint,
            metadata=cast(CheckpointMetadata, stored.metadata),
            parent_config=parent,
            pending_writes=writes,
        )

    # -- writes ---------------------------------------------------------------

    def put(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """Store a checkpoint and the channel values that changed (``new_versions``) in one commit.

        Raises:
            ThreadConflictError: Another writer appended to the thread after
                this one read the checkpoint it builds on; nothing was written.
        """
        conf = _conf(config)
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        parent = conf.get("checkpoint_id") or None
        checkpoint_id = checkpoint["id"]
        md = dict(get_serializable_checkpoint_metadata(config, metadata))
        rest = {
            k: v
            for k, v in checkpoint.items()
            if k not in ("channel_values", "channel_versions", "id")
        }
        record = NewCheckpoint(
            checkpoint_id=checkpoint_id,
            parent_id=parent,
            metadata=md,
            channel_versions=dict(checkpoint["channel_versions"]),
            payload=dumps(self.serde, rest),
        )
        run_id = md.get("run_id")
        values = checkpoint["channel_values"]
        run = str(run_id) if run_id else None
        # Fast path: the writer built on the head, as a writer almost always does. The commit
        # checks exactly that (a head rewritten by maintenance carries a token and fails it).
        blobs, states = self._channels.encode(
            self.serde, thread_id, ns, values, new_versions, self._channels.delta
        )
        try:
            self._threads.put(
                thread_id,
                ns,
                record,
                blobs,
                expected_head=None if parent is None else parent.encode(),
                run_id=run,
            )
        except ConflictError:
            # The head is elsewhere: decide on the head as read now, and store values whole
            # (maintenance may have removed a value a tail would build on).
            blobs, states = self._channels.encode(
                self.serde, thread_id, ns, values, new_versions, False
            )
            for _ in range(_ATTEMPTS):
                head_id, head = self._threads.head(thread_id, ns)
                self._views.check_branch(thread_id, ns, parent, head_id)
                try:
                    self._threads.put(thread_id, ns, record, blobs, expected_head=head, run_id=run)
                except ConflictError:
                    continue
                break
            else:
                raise ThreadConflictError(
                    f"thread {thread_id!r} (namespace {ns!r}) kept changing while checkpoint "
                    f"{checkpoint_id!r} was written; nothing was written: re-invoke",
                    thread_id=thread_id,
                    checkpoint_ns=ns,
                    parent_id=parent,
                    head_id=None,
                )
        with self._lock:
            self._views.wrote(thread_id, ns, checkpoint_id, parent)
            self._channels.remember(thread_id, ns, states)
        return _config(thread_id, ns, checkpoint_id)

    def put_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """Record a task's writes against the checkpoint ``config`` names (first attempt wins,
        except for special channels such as errors and interrupts, whose newest value counts)."""
        conf = _conf(config)
        thread_id, ns = str(conf["thread_id"]), str(conf.get("checkpoint_ns", ""))
        checkpoint_id = conf.get("checkpoint_id")
        if not checkpoint_id:
            raise InvalidInputError(
                "put_writes needs config['configurable']['checkpoint_id']", field="checkpoint_id"
            )
        items = [
            (WRITES_IDX_MAP.get(channel, idx), channel, dumps(self.serde, value))
            for idx, (channel, value) in enumerate(writes)
        ]
        self._threads.put_writes(
            thread_id,
            ns,
            str(checkpoint_id),
            str(task_id),
            items,
            task_path=task_path,
            replace=all(channel in WRITES_IDX_MAP for channel, _ in writes),
        )

    # -- maintenance ----------------------------------------------------------

    def delete_thread(self, thread_id: str) -> None:
        """Delete a thread whole: every namespace, checkpoint, value, write and effect."""
        self._threads.delete_thread(str(thread_id))
        self._forget(lambda key: key[0] == str(thread_id))

    def delete_for_runs(self, run_ids: Sequence[str]) -> None:
        """Delete the checkpoints (and their writes) that these LangGraph runs wrote, in every thread."""
        self._threads.delete_runs([str(r) for r in run_ids])
        self._forget(lambda key: True)

    def copy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """Copy every checkpoint, value, write and effect of a thread into another thread."""
        self._threads.copy_thread(str(source_thread_id), str(target_thread_id))

    def prune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """``"keep_latest"``: keep each namespace's newest checkpoint; ``"delete"``: delete the threads."""
        if strategy not in ("keep_latest", "delete"):
            raise InvalidInputError(
                f"unknown prune strategy {strategy!r}: use 'keep_latest' or 'delete'",
                field="strategy",
            )
        ids = [str(t) for t in thread_ids]
        self._threads.prune(ids, keep_latest=strategy == "keep_latest")
        self._forget(lambda key: key[0] in ids)

    def _forget(self, match: Callable[[tuple[str, ...]], bool]) -> None:
        with self._lock:
            self._views.forget(match)
            self._channels.forget(match)

    def get_next_version(self, current: str | None, channel: None) -> str:
        """A new, unique, increasing version: the counter, then a random part (branches never collide)."""
        if current is None:
            number = 0
        elif isinstance(current, int):
            number = current
        else:
            number = int(str(current).split(".")[0])
        return f"{number + 1:032}.{random.random():016}"  # uniqueness, not secrecy

    # -- effects inside nodes ---------------------------------------------------

    def run_effect(
        self,
        thread_id: str,
        key: str,
        name: str,
        fn: Callable[[str], T],
        reconcile: Callable[[str], T | NotDone] | None = None,
    ) -> T:
        """Run ``fn(key)`` at most once for ``key`` in this thread (see :func:`effect`)."""
        entry, raw = self._threads.effect(thread_id, key)
        if entry is not None and entry.status == "recorded":
            return cast(T, loads(self.serde, entry.payload))
        if entry is not None and entry.status == "invoked":
            if reconcile is None:
                raise EffectOutcomeUnknownError(
                    f"effect {name!r} (key {key}) of thread {thread_id!r} was invoked but its "
                    "result was never recorded (the worker stopped mid-call): pass reconcile= "
                    "to ask the external system by idempotency key, or delete the thread",
                    run_id=thread_id,
                    effect_key=key,
                    effect_name=name,
                )
            outcome = reconcile(key)
            if not isinstance(outcome, NotDone):
                self._record(thread_id, key, name, outcome, raw)
                return outcome
        else:
            raw = self._threads.set_effect(
                thread_id, EffectEntry(key, name, "invoked"), expected=raw
            )
            self.memory.force_flush()  # never run ahead of a durable "invoked"
        try:
            result = fn(key)
        except BaseException:
            self._threads.set_effect(thread_id, EffectEntry(key, name, "not_done"), expected=raw)
            raise
        self._record(thread_id, key, name, result, raw)
        return result

    def _record(
        self, thread_id: str, key: str, name: str, result: object, raw: bytes | None
    ) -> None:
        payload = dumps(self.serde, result)
        self._threads.set_effect(
            thread_id, EffectEntry(key, name, "recorded", payload), expected=raw
        )

    # -- async twins: the sync core in a worker thread ----------------------------

    async def aget_tuple(self, config: RunnableConfig) -> CheckpointTuple | None:
        """See :meth:`get_tuple`."""
        return await anyio.to_thread.run_sync(self.get_tuple, config)

    async def alist(
        self,
        config: RunnableConfig | None,
        *,
        filter: dict[str, Any] | None = None,
        before: RunnableConfig | None = None,
        limit: int | None = None,
    ) -> AsyncIterator[CheckpointTuple]:
        """See :meth:`list` (each page is read in a worker thread)."""
        found = await anyio.to_thread.run_sync(
            lambda: list(self.list(config, filter=filter, before=before, limit=limit))
        )
        for item in found:
            yield item

    async def aput(
        self,
        config: RunnableConfig,
        checkpoint: Checkpoint,
        metadata: CheckpointMetadata,
        new_versions: ChannelVersions,
    ) -> RunnableConfig:
        """See :meth:`put`."""
        return await anyio.to_thread.run_sync(self.put, config, checkpoint, metadata, new_versions)

    async def aput_writes(
        self,
        config: RunnableConfig,
        writes: Sequence[tuple[str, Any]],
        task_id: str,
        task_path: str = "",
    ) -> None:
        """See :meth:`put_writes`."""
        await anyio.to_thread.run_sync(self.put_writes, config, writes, task_id, task_path)

    async def adelete_thread(self, thread_id: str) -> None:
        """See :meth:`delete_thread`."""
        await anyio.to_thread.run_sync(self.delete_thread, thread_id)

    async def adelete_for_runs(self, run_ids: Sequence[str]) -> None:
        """See :meth:`delete_for_runs`."""
        await anyio.to_thread.run_sync(self.delete_for_runs, run_ids)

    async def acopy_thread(self, source_thread_id: str, target_thread_id: str) -> None:
        """See :meth:`copy_thread`."""
        await anyio.to_thread.run_sync(self.copy_thread, source_thread_id, target_thread_id)

    async def aprune(self, thread_ids: Sequence[str], *, strategy: str = "keep_latest") -> None:
        """See :meth:`prune`."""
        await anyio.to_thread.run_sync(lambda: self.prune(thread_ids, strategy=strategy))


def _config(thread_id: str, ns: str, checkpoint_id: str) -> RunnableConfig:
    return {
        "configurable": {
            "thread_id": thread_id,
            "checkpoint_ns": ns,
            "checkpoint_id": checkpoint_id,
        }
    }


def effect(
    name: str,
    fn: Callable[[str], T],
    *,
    reconcile: Callable[[str], T | NotDone] | None = None,
    key: str | None = None,
    config: RunnableConfig | None = None,
) -> T:
    """Run an external side effect from inside a LangGraph node at most once, across crashes.

    By default the effect's idempotency key is derived from the thread, the
    namespace, the running task (its super-step and path in the graph) and
    ``name``, so a task that runs again (its process died before its writes
    were saved, an interrupted node resumed, or a retry policy repeats it)
    finds the effect's recorded result and returns it instead of calling
    ``fn`` again. A replay from an earlier checkpoint (time travel) is a new
    branch: LangGraph runs its tasks at later super-steps, so their effects run
    again, as its nodes do. Pass ``key`` for an effect that must happen once
    per thread whatever the branch (a refund of one order: ``key=f"refund:{order_id}"``):
    the key alone then identifies it within the thread. ``fn`` receives the
    stored key: pass it to the external system as its idempotency key.

    Before ``fn`` runs, "invoked" is stored durably; after, its result. A task
    that finds "invoked" without a result (the worker died mid-call) asks
    ``reconcile(key)`` whether the effect happened: its result if so, or
    ``NOT_DONE`` to call ``fn`` again; without ``reconcile`` it raises
    :class:`~tiers.errors.EffectOutcomeUnknownError`. If ``fn`` raises, the
    effect is recorded as not done and may run again.

    Use a different ``name`` for each effect of one task. The graph must be
    compiled with a :class:`TiermemSaver`.

    Args:
        name: The effect's name, unique within the task.
        fn: The side effect; called with the idempotency key.
        reconcile: Asks the external system whether the effect with this key happened.
        key: The effect's identity within the thread, instead of the task's position
            (default: derived from the task, as above). Any non-empty string.
        config: The node's config (default: the running node's, from LangGraph).

    Raises:
        InvalidInputError: Not called inside a node of a graph checkpointed by a TiermemSaver.
        EffectOutcomeUnknownError: The outcome of an earlier attempt is unknown and
            there is no ``reconcile``.
    """
    if key is not None and (not isinstance(key, str) or not key):
        raise InvalidInputError("key must be a non-empty string or None", field="key")
    if config is None:
        from langgraph.config import get_config

        config = get_config()
    conf = config.get("configurable", {})
    saver = conf.get("__pregel_checkpointer")
    if not isinstance(saver, TiermemSaver) or not conf.get("__pregel_task_id"):
        raise InvalidInputError(
            "effect() runs inside a node of a graph compiled with checkpointer=TiermemSaver(...)",
            field="config",
        )
    thread_id = str(conf["thread_id"])
    # Inside a node the namespace ends with the task's own "node:<task id>". The key uses the
    # graph's namespace and the task's step and path, not the task id: LangGraph derives task
    # ids from the checkpoint the task runs from, which (durability="async") may not be stored
    # yet when a worker dies mid-task; the re-run then has a new task id but the same step and
    # path. (In a subgraph the enclosing tasks' ids stay part of the namespace.)
    where: list[object]
    if key is None:
        graph_ns = str(conf.get("checkpoint_ns", "")).rpartition("|")[0]
        md = config.get("metadata", {})
        where = [graph_ns, md.get("langgraph_step"), list(md.get("langgraph_path", ())), name]
    else:
        where = ["key", key]  # never equal to a derived list of four
    digest = hashlib.sha256(json.dumps(where, ensure_ascii=False, default=str).encode())
    return saver.run_effect(thread_id, digest.hexdigest(), name, fn, reconcile)
