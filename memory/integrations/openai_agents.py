"""OpenAI Agents SDK sessions on tiermem: conversation history that survives the process.

Install with ``pip install 'tiermem[openai-agents]'``::

    from agents import Agent, Runner
    from memory import Memory
    from memory.integrations.openai_agents import TiermemSession

    memory = Memory.open(".tiermem")
    session = TiermemSession(memory, "chat-42", user_id="alice")
    agent = Agent(name="helper", instructions=session.instructions("You are helpful."))
    await Runner.run(agent, "Where were we?", session=session)
    ...
    await session.end()  # summary of the session kept; its items deleted

:class:`TiermemSession` implements the SDK's ``Session`` protocol
(``agents.memory.Session``, openai-agents 0.24): ``get_items(limit)``,
``add_items(items)``, ``pop_item()``, ``clear_session()``, with
``session_id`` and ``session_settings`` (its ``limit`` is the default of
``get_items``, as in the SDK's ``SQLiteSession``).

**Storage: one run of the task tier per session.** Its run id is
:func:`~tiers.ids.run_id_for` of ``session_id`` (the session id itself when it
is a valid id), its owner ``user_id``, and ``RunInfo.external_id`` keeps the
session id as given. The run's checkpoints are an append-only log:

- ``add_items(items)`` appends one checkpoint (step ``items``, output
  ``{"items": [...]}``): one durable commit per call. A batch larger than one
  stored value (about 1 MiB) is split over several checkpoints, appended in
  order (one commit each);
- ``pop_item()`` appends a checkpoint (step ``pop``, output ``{"pop": 1}``)
  that hides the newest visible item, after reading that item under the run's
  lease, so two sessions popping at once never return the same item;
- ``clear_session()`` deletes the run (:meth:`Memory.delete_run <memory.Memory.delete_run>`):
  every item is gone from storage at once; the next ``add_items`` starts a new run.

``get_items(limit)`` reads the log newest first, one page of checkpoints at a
time (:meth:`Memory.run_history <memory.Memory.run_history>` with
``newest_first``), counting pop markers down as it meets the items they hid,
and stops once it has ``limit`` items: its cost follows ``limit`` (plus any
pops among them), not the session's length. ``get_items()`` without a limit
reads the whole log oldest first.

**Popped items leave storage when the session ends.** While the session
lives, a popped item is hidden, not erased (checkpoints are never changed).
:meth:`TiermemSession.end` summarizes what the session shows and deletes the
run, so no popped or cleared item stays in any KV row; ``clear_session`` erases
at once.

**Sessions end into the session tier.** :meth:`TiermemSession.end` passes the
items, as the SDK stores them (Responses-API input items: messages,
``function_call``, ``function_call_output``...), to
:meth:`Memory.end_session <memory.Memory.end_session>`, which reads those items
as they are, then deletes the run. The next session of the user gets the
summaries back through :meth:`TiermemSession.continuation_context` or
:meth:`TiermemSession.instructions` (an ``Agent(instructions=...)`` callable).

**Writers.** Each session object takes the run's lease on its first write and
keeps it; a second object (another process) writing the same session takes it
over, and the first one, fenced out, takes it back on its next write and
retries: appends from both land, in commit order. Session ids are unique per
tenant: a session id used by another user raises
:class:`~tiers.errors.ConflictError` rather than show that user's items.

All methods are coroutines; the storage calls run in a worker thread and
finish even if the awaiting task is cancelled.
"""

from __future__ import annotations

import json
import math
import threading
from collections.abc import Awaitable, Callable, Mapping, Sequence
from datetime import datetime
from typing import Any, TypeVar, cast

import anyio.to_thread

from memory.integrations import require

require("agents", "openai-agents")

from agents import Agent, RunContextWrapper  # noqa: E402
from agents.items import TResponseInputItem  # noqa: E402
from agents.memory import SessionSettings  # noqa: E402
from agents.memory.session_settings import (  # noqa: E402
    coerce_session_settings,
    resolve_session_limit,
)

from memory.facade import AsyncMemory, Memory  # noqa: E402
from tiers import cas  # noqa: E402
from tiers.errors import (  # noqa: E402
    ConflictError,
    InvalidInputError,
    RunNotFoundError,
    StaleWriterError,
    ValueTooLargeError,
)
from tiers.ids import check_id, run_id_for  # noqa: E402
from tiers.models import Checkpoint, RunInfo, SessionSummary  # noqa: E402
from tiers.task import RunHandle  # noqa: E402

__all__ = ["TiermemSession"]

T = TypeVar("T")

ITEMS_STEP = "items"
"""Step name of a checkpoint holding appended items: output ``{"items": [...]}``."""
POP_STEP = "pop"
"""Step name of a checkpoint hiding the newest visible item: output ``{"pop": 1}``."""

_WRITE_ATTEMPTS = cas.ATTEMPTS
_FOLD_PAGE = 512
_MAX_PAGE = 1024
# Most items a session object keeps in memory to serve reads while the run head is unchanged.
_TAIL_ITEMS = 2048
# Room left in a stored value for the checkpoint's own fields around the items.
_CHECKPOINT_OVERHEAD = 8 * 1024


class TiermemSession:
    """An OpenAI Agents SDK session stored as a tiermem run (see the module docstring).

    Pass it to ``Runner.run(agent, input, session=...)``. Constructing it does
    no I/O; the run is created by the first write.

    Args:
        memory: The store (a :class:`~memory.Memory` or an :class:`~memory.AsyncMemory`).
        session_id: The SDK's session id: any non-empty string.
        user_id: Who the session belongs to: its run's owner, and whose
            summaries :meth:`end` and :meth:`continuation_context` use.
        session_settings: The SDK's session settings; ``limit`` is the default
            of :meth:`get_items` (``None``: every item).

    Raises:
        InvalidInputError: Bad ``session_id`` or ``user_id``.
    """

    session_settings: SessionSettings | None = None

    def __init__(
        self,
        memory: Memory | AsyncMemory,
        session_id: str,
        *,
        user_id: str,
        session_settings: SessionSettings | Mapping[str, Any] | None = None,
    ) -> None:
        if isinstance(memory, AsyncMemory):
            memory = memory.sync
        if not isinstance(memory, Memory):
            raise InvalidInputError(
                f"memory must be a Memory or an AsyncMemory, got {type(memory).__name__}",
                field="memory",
            )
        self._memory = memory
        self.run_id = run_id_for(session_id)
        self.session_id = session_id
        self.user_id = check_id(user_id, "user_id")
        self.session_settings = (
            SessionSettings()
            if session_settings is None
            else coerce_session_settings(dict(session_settings))
            if isinstance(session_settings, Mapping)
            else coerce_session_settings(session_settings)
        )
        self._handle: RunHandle | None = None
        self._items_per_checkpoint = 1.0
        self._tail: _Tail | None = None
        # Serialises this object's operations, whichever event loop or thread calls them.
        self._lock = threading.Lock()

    # -- the SDK's Session protocol -----------------------------------------------------------

    async def get_items(self, limit: int | None = None) -> list[TResponseInputItem]:
        """The session's items, oldest first: all of them, or the latest ``limit``.

        Args:
            limit: How many of the latest items (``None``: ``session_settings.limit``,
                and every item when that is ``None`` too). As in the SDK's
                ``SQLiteSession``, ``0`` gives none and a negative limit every item.

        Raises:
            InvalidInputError: ``limit`` is not an integer.
            ConflictError: The session id belongs to another user's session.
        """
        if limit is not None and (isinstance(limit, bool) or not isinstance(limit, int)):
            raise InvalidInputError(
                f"limit must be an integer or None, got {type(limit).__name__}", field="limit"
            )
        wanted = resolve_session_limit(limit, self.session_settings)
        items = await self._run(lambda: self._read(wanted))
        return cast(list[TResponseInputItem], items)

    async def add_items(self, items: list[TResponseInputItem]) -> None:
        """Append items (Responses-API input items, JSON objects): one durable commit per call.

        Raises:
            InvalidInputError: ``items`` is not a list, or an item is not JSON.
            ValueTooLargeError: One item alone is larger than a stored value.
            ConflictError: The session id belongs to another user's session.
        """
        if isinstance(items, str | bytes | Mapping) or not isinstance(items, Sequence):
            raise InvalidInputError(
                f"items must be a list of input items, got {type(items).__name__}",
                field="items",
            )
        if not items:
            return
        batches = self._batches(list(items))
        await self._run(lambda: self._append(batches))

    async def pop_item(self) -> TResponseInputItem | None:
        """Remove the newest item and return it (``None`` if the session is empty).

        Raises:
            ConflictError: The session id belongs to another user's session.
        """
        popped = await self._run(self._pop)
        return cast(TResponseInputItem | None, popped)

    async def clear_session(self) -> None:
        """Remove every item: the session's run is deleted, so nothing of it stays stored.

        Raises:
            ConflictError: The session id belongs to another user's session.
        """
        await self._run(self._clear)

    # -- session end and the next session ------------------------------------------------------

    async def end(self, *, created_at: datetime | None = None) -> SessionSummary | None:
        """End the session: summarize its items into the user's sessions, then delete its run.

        The items the session shows (popped ones excluded) go to
        :meth:`Memory.end_session <memory.Memory.end_session>` under the
        session id :attr:`run_id`, then the run is deleted, so no item, popped
        or not, stays in the task tier. The session object stays usable:
        adding items starts the session afresh, and ending it again replaces
        its summary. Stop other writers of the session first: items they add
        while it ends are deleted unsummarized.

        Args:
            created_at: When the session ended (default now).

        Returns:
            The saved summary, or ``None`` if the session had no items (nothing is saved).

        Raises:
            ConflictError: The session id belongs to another user's session.
            InvalidTranscriptError: An item is not one ``end_session`` reads; the run is kept.
            SummarizerError: Summarizing failed; the transcript is stored (see
                ``Memory.pending_summaries``) and the run is kept: call ``end`` again.
        """
        return await self._run(lambda: self._end(created_at))

    async def continuation_context(self, query: str = "", max_tokens: int | None = None) -> str:
        """The user's standing facts and most relevant earlier sessions, ready for a prompt.

        See :meth:`Memory.build_continuation_context <memory.Memory.build_continuation_context>`;
        ``""`` when nothing is stored yet.
        """
        return await anyio.to_thread.run_sync(
            lambda: self._memory.build_continuation_context(self.user_id, query, max_tokens)
        )

    def instructions(
        self, base: str = "", *, query: str = "", max_tokens: int | None = None
    ) -> Callable[[RunContextWrapper[Any], Agent[Any]], Awaitable[str]]:
        """Dynamic instructions for ``Agent(instructions=...)``: ``base`` and the continuation context.

        Each time the agent is run, the returned coroutine function builds
        :meth:`continuation_context` for this session's user and appends it
        to ``base`` (after a blank line; ``base`` alone when the context is
        empty). The SDK calls it once per model call of a run.

        Args:
            base: The agent's own instructions.
            query: What to recall earlier sessions by (``""``: the latest ones).
            max_tokens: Budget of the context (default: the memory's).
        """

        async def build(context: RunContextWrapper[Any], agent: Agent[Any]) -> str:
            text = await self.continuation_context(query, max_tokens)
            return f"{base}\n\n{text}" if base and text else base or text

        return build

    # -- storage, in a worker thread ------------------------------------------------------------

    async def _run(self, fn: Callable[[], T]) -> T:
        def locked() -> T:
            with self._lock:
                return fn()

        # Not abandoned on cancellation: a write the SDK started always finishes.
        return await anyio.to_thread.run_sync(locked)

    def _head(self) -> RunInfo | None:
        """The session's run head, or ``None``; refuses another user's session."""
        try:
            info = self._memory.get_run(self.run_id)
        except RunNotFoundError:
            return None
        self._check_owner(info)
        return info

    def _check_owner(self, info: RunInfo) -> None:
        if info.user_id != self.user_id:
            raise ConflictError(
                f"session {self.session_id!r} belongs to another user: session ids are unique "
                "per tenant; choose another session_id"
            )

    def _read(self, limit: int | None) -> list[Any]:
        if limit == 0:
            return []
        info = self._head()
        if info is None:
            self._tail = None
            return []
        whole = limit is None or limit < 0
        tail = self._tail
        if tail is not None and tail.serves(info, None if whole else limit):
            return tail.items(None if whole else limit)
        try:
            items = self._fold() if whole else self._latest(cast(int, limit))
        except RunNotFoundError:  # cleared or ended meanwhile
            self._tail = None
            return []
        complete = whole or len(items) < cast(int, limit)
        if len(items) <= _TAIL_ITEMS:
            # Read after the head: a write since then makes the next read miss the cache.
            self._tail = _Tail(
                info.incarnation, info.head_seq, [_json(item) for item in items], complete
            )
        return items

    def _latest(self, limit: int) -> list[Any]:
        """The latest ``limit`` visible items, read newest first a page of checkpoints at a time."""
        newest: list[Any] = []
        hidden = 0  # pops met, not yet matched with the items they hid
        before: int | None = None
        # A checkpoint holds every item of one add_items call: size the page by the items
        # per checkpoint seen last time, plus one (a guess too small costs one more page).
        page = min(math.ceil(limit / self._items_per_checkpoint) + 1, _MAX_PAGE)
        seen = read = 0
        while True:
            ckpts = self._memory.run_history(
                self.run_id, newest_first=True, limit=page, before_seq=before
            )
            for ckpt in ckpts:
                read += 1
                if ckpt.step == POP_STEP:
                    hidden += _pops(ckpt)
                    continue
                items = _items(ckpt)
                seen += len(items)
                for item in reversed(items):
                    if hidden:
                        hidden -= 1
                    else:
                        newest.append(item)
                        if len(newest) == limit:
                            self._items_per_checkpoint = max(1.0, seen / read)
                            newest.reverse()
                            return newest
            if len(ckpts) < page:
                newest.reverse()
                return newest
            before = ckpts[-1].seq
            page = min(page * 2, _MAX_PAGE)  # short: pops hid some, or the guess was off

    def _fold(self) -> list[Any]:
        """Every visible item, folding the whole log oldest first."""
        items: list[Any] = []
        after: int | None = None
        while True:
            ckpts = self._memory.run_history(self.run_id, limit=_FOLD_PAGE, after_seq=after)
            for ckpt in ckpts:
                if ckpt.step == POP_STEP:
                    del items[max(0, len(items) - _pops(ckpt)) :]
                else:
                    items.extend(_items(ckpt))
            if len(ckpts) < _FOLD_PAGE:
                return items
            after = ckpts[-1].seq

    def _write(self, fn: Callable[[RunHandle], T]) -> T:
        """Run ``fn`` with this object's lease, taking it (back) when fenced out or the run is gone."""
        for attempt in range(_WRITE_ATTEMPTS):
            handle = self._handle
            if handle is None:
                self._head()  # a clear ConflictError for another user's session
                handle = self._memory.start_run(
                    self.user_id, self.run_id, external_id=self.session_id
                )
                self._handle = handle
            try:
                return fn(handle)
            except (StaleWriterError, RunNotFoundError):
                # Another session object took the run over, or the run was cleared or
                # ended: nothing was written. Take the lease again and redo it all, after a
                # jittered wait so that two writers taking it from each other settle.
                self._handle = None
                if attempt == _WRITE_ATTEMPTS - 1:
                    raise
                cas.backoff(attempt)
        raise AssertionError("unreachable")  # pragma: no cover

    def _append(self, batches: list[list[Any]]) -> None:
        for batch in batches:

            def append(handle: RunHandle, batch: list[Any] = batch) -> None:
                ckpt = handle.append_checkpoint(ITEMS_STEP, {"items": batch})
                # The items as stored (redacted), which is what every other reader gets.
                self._advance(handle.info, [_json(item) for item in _items(ckpt)], popped=0)

            self._write(append)

    def _advance(self, info: RunInfo, added: list[str], popped: int) -> None:
        """Bring the cached tail to ``info`` after this object's own write, or drop it."""
        tail = self._tail
        if tail is None or not tail.follows(info):
            self._tail = None
            return
        tail.head_seq = info.head_seq
        if popped:
            del tail.texts[max(0, len(tail.texts) - popped) :]
        tail.texts += added
        if len(tail.texts) > _TAIL_ITEMS:
            del tail.texts[: len(tail.texts) - _TAIL_ITEMS]
            tail.complete = False

    def _pop(self) -> Any:
        if self._handle is None and self._head() is None:
            return None  # nothing to pop: do not create a run for it

        def pop(handle: RunHandle) -> Any:
            # Read under the lease: any other writer's commit since would fence this one out.
            latest = self._latest(1)
            if not latest:
                return None
            handle.append_checkpoint(POP_STEP, {"pop": 1})
            self._advance(handle.info, [], popped=1)
            return latest[0]

        return self._write(pop)

    def _clear(self) -> None:
        self._handle = None
        self._tail = None
        if self._head() is not None:
            self._memory.delete_run(self.run_id)

    def _end(self, created_at: datetime | None) -> SessionSummary | None:
        self._handle = None
        self._tail = None
        if self._head() is None:
            return None
        items = self._fold()
        summary = None
        if items:
            summary = self._memory.end_session(
                self.user_id, self.run_id, items, created_at=created_at
            )
        self._memory.delete_run(self.run_id)
        return summary

    def _batches(self, items: list[Any]) -> list[list[Any]]:
        """Items in batches that each fit one stored checkpoint (usually one batch)."""
        budget = self._memory.kv.max_value_bytes - _CHECKPOINT_OVERHEAD
        batches: list[list[Any]] = [[]]
        size = 0
        for index, item in enumerate(items):
            try:
                # The checkpoint stores the items as JSON; its size is what must fit.
                length = len(_json(item).encode())
            except (TypeError, ValueError) as exc:
                raise InvalidInputError(
                    f"items[{index}] is not JSON: {exc}", field=f"items[{index}]"
                ) from exc
            if length > budget:
                raise ValueTooLargeError(
                    f"items[{index}] is {length} bytes, over the {budget} a session item may "
                    "have in this store: keep large payloads elsewhere and store a reference",
                    field=f"items[{index}]",
                )
            if batches[-1] and size + length > budget:
                batches.append([])
                size = 0
            batches[-1].append(item)
            size += length + 1
        return batches


class _Tail:
    """The newest items of the session as of one run head, kept by the object that read or wrote them.

    A read that finds the run's head unchanged (same incarnation, same
    ``head_seq``) is served from here: one head read instead of a page of
    checkpoints. Items are kept as JSON and parsed on every read, so callers
    may change what they get without changing what the next read returns.
    """

    def __init__(
        self, incarnation: str | None, head_seq: int, texts: list[str], complete: bool
    ) -> None:
        self.incarnation = incarnation
        self.head_seq = head_seq
        self.texts = texts
        # Whether texts holds every visible item (else only the newest len(texts)).
        self.complete = complete

    def serves(self, info: RunInfo, limit: int | None) -> bool:
        if info.incarnation is None or info.incarnation != self.incarnation:
            return False
        if info.head_seq != self.head_seq:
            return False
        return self.complete or (limit is not None and limit <= len(self.texts))

    def follows(self, info: RunInfo) -> bool:
        """Whether ``info`` is the head one write after this tail's."""
        return (
            info.incarnation is not None
            and info.incarnation == self.incarnation
            and info.head_seq == self.head_seq + 1
        )

    def items(self, limit: int | None) -> list[Any]:
        texts = self.texts if limit is None else self.texts[-limit:]
        return [json.loads(text) for text in texts]


def _json(item: Any) -> str:
    return json.dumps(item, ensure_ascii=False)


def _items(ckpt: Checkpoint) -> list[Any]:
    output = ckpt.output
    if ckpt.step == ITEMS_STEP and isinstance(output, dict):
        items = output.get("items")
        if isinstance(items, list):
            return items
    return []


def _pops(ckpt: Checkpoint) -> int:
    output = ckpt.output
    count = output.get("pop") if isinstance(output, dict) else None
    return count if isinstance(count, int) and count > 0 else 0
