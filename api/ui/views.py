"""What each console page shows, read through the :class:`~memory.facade.Memory` facade.

Each function here is a plain, blocking read of one tenant's memory view for
one page; :mod:`api.ui.router` runs it off the event loop and renders the
result. A caller bound to one user (``bound_user``) sees that user's runs
only: another user's run is reported as absent, as the REST routes do.
"""

from __future__ import annotations

import json
from collections.abc import Mapping
from dataclasses import dataclass, field
from datetime import datetime
from typing import Any, Generic, TypeVar
from urllib.parse import urlencode

from api.ui.forkgraph import ForkGraph, layout
from memory.binding import owned_run, user_filter
from memory.context import ContinuationContext
from memory.facade import Memory
from tiers.errors import InvalidInputError, RunNotFoundError, TierError
from tiers.models import Checkpoint, RunInfo, RunStatus, SessionSummary, UserFact
from tiers.task import EffectRecord, Event, EventKind

T = TypeVar("T")

PAGE_SIZE = 25
"""Runs per page of the runs table."""

TIMELINE_LIMIT = 500
"""A run's first events searched for approval gates to show (beside those of the events page)."""

RUN_PAGE_SIZE = 100
"""Checkpoints, events and effects shown per page of one run's page."""

SESSIONS_SHOWN = 20
"""A user's most recent sessions shown on their memory page."""

BLOCKED = "blocked"
"""The runs filter for runs blocked on an effect of unknown outcome (not a stored status)."""

STATUS_FILTERS: tuple[str, ...] = (
    RunStatus.RUNNING.value,
    RunStatus.PAUSED.value,
    RunStatus.RESUMABLE.value,
    BLOCKED,
    RunStatus.FAILED.value,
    RunStatus.COMPLETED.value,
    RunStatus.CANCELLED.value,
)


def as_json(value: object) -> str:
    """A stored value as indented JSON text, for a ``<pre>`` block."""
    return json.dumps(value, indent=2, sort_keys=True, ensure_ascii=False, default=str)


def json_size(value: object) -> int:
    """Bytes of a value as compact UTF-8 JSON: the size a checkpoint's output takes."""
    return len(json.dumps(value, separators=(",", ":"), ensure_ascii=False).encode())


def page_query(current: Mapping[str, object], **changes: object) -> str:
    """The query string of a link that keeps ``current``'s parameters but for ``changes``.

    A parameter set to ``None`` (in either) is left out, so a link can go back to the
    first page of one listing while the others stay where they are.
    """
    merged = {**current, **changes}
    return urlencode({name: value for name, value in merged.items() if value is not None})


@dataclass(frozen=True)
class Gate:
    """One approval gate of a run: the frozen plan (as stored, redacted) and the decision, if any."""

    key: str
    plan_hash: str
    plan: Any
    status: str
    requested_at: datetime
    decided_by: str | None
    decided_at: datetime | None
    note: str | None


def _gate(memory: Memory, run_id: str, key: str) -> Gate | None:
    """A run's gate ``key``, or ``None`` if never requested."""
    record = memory.run_approval(run_id, key)
    if record is None:
        return None
    return Gate(
        key=record.key,
        plan_hash=record.plan_hash,
        plan=record.plan,
        status=record.status,
        requested_at=record.requested_at,
        decided_by=record.decided_by,
        decided_at=record.decided_at,
        note=record.note,
    )


@dataclass(frozen=True)
class RunsPage:
    """One page of the runs table."""

    runs: list[RunInfo]
    status: str | None
    page: int
    pages: int
    total: int


def runs_page(
    memory: Memory, bound_user: str | None, user_id: str | None, status: str | None, page: int
) -> RunsPage:
    """Runs of the tenant (of ``bound_user`` only for a bound caller), newest first, one page.

    ``status`` is one of :data:`STATUS_FILTERS` or ``None`` for every run.
    """
    user = user_filter(bound_user, user_id)
    if status == BLOCKED:
        runs = [run for run in memory.list_runs(user_id=user) if run.blocked]
    elif status is not None:
        runs = memory.list_runs(user_id=user, status=RunStatus(status))
    else:
        runs = memory.list_runs(user_id=user)
    runs.reverse()  # list_runs is oldest first
    pages = max(1, -(-len(runs) // PAGE_SIZE))
    page = min(max(page, 1), pages)
    start = (page - 1) * PAGE_SIZE
    return RunsPage(runs[start : start + PAGE_SIZE], status, page, pages, len(runs))


@dataclass
class ForkNode:
    """A run in a fork graph: where it was forked from and the runs forked from it."""

    run: RunInfo
    children: list[ForkNode] = field(default_factory=list)


@dataclass(frozen=True)
class ScopeAt:
    """A run as of one of its checkpoints: that checkpoint's scope snapshot and the run state."""

    checkpoint: Checkpoint
    scope: dict[str, Any] | None
    state: dict[str, Any]


@dataclass(frozen=True)
class Slice(Generic[T]):
    """One page of a run's checkpoints, events or effects, and where the next pages start.

    Attributes:
        items: What this page shows.
        total: How many there are in all.
        first: The number (from 1, in the page's order) of the first item shown.
        older: The cursor of the next page (``None``: this is the last one).
        newer: Whether there is an earlier page (the first page needs no cursor).
    """

    items: list[T]
    total: int
    first: int
    older: int | str | None
    newer: bool


@dataclass(frozen=True)
class RunPage:
    """Everything one run's page shows.

    ``checkpoints`` and ``events`` are pages newest first (cursor: the seq to show
    the ones before); ``effects`` a page in key order (cursor: the key to show the ones after).
    """

    run: RunInfo
    checkpoints: Slice[Checkpoint]
    effects: Slice[EffectRecord]
    approvals: list[Gate]
    events: Slice[Event]
    forks: ForkNode
    fork_graph: ForkGraph
    scope_at: ScopeAt | None


def visible_run(memory: Memory, run_id: str, bound_user: str | None) -> RunInfo:
    """A run's head; for a bound caller, another user's run is not found.

    Raises:
        RunNotFoundError: No such run (or not the bound user's).
    """
    if bound_user is not None:
        return owned_run(memory, run_id, bound_user)
    return memory.get_run(run_id)


def _fork_graph(memory: Memory, run: RunInfo) -> ForkNode:
    """The fork tree ``run`` is in, from its oldest reachable ancestor down.

    Forks keep their user, so the user's runs hold every relative; an
    ancestor deleted since stops the walk up.
    """
    relatives = {r.run_id: r for r in memory.list_runs(user_id=run.user_id)}
    relatives[run.run_id] = run
    root = run
    seen = {run.run_id}
    while root.parent_run_id is not None and root.parent_run_id not in seen:
        parent = relatives.get(root.parent_run_id)
        if parent is None:
            break
        seen.add(parent.run_id)
        root = parent
    children: dict[str, list[RunInfo]] = {}
    for relative in relatives.values():
        if relative.parent_run_id is not None:
            children.setdefault(relative.parent_run_id, []).append(relative)

    placed: set[str] = set()

    def grow(info: RunInfo) -> ForkNode:
        placed.add(info.run_id)
        kids = sorted(children.get(info.run_id, []), key=lambda r: r.created_at)
        return ForkNode(info, [grow(kid) for kid in kids if kid.run_id not in placed])

    return grow(root)


def _checkpoints_before(memory: Memory, run: RunInfo, before: int | None) -> Slice[Checkpoint]:
    """A page of the run's checkpoints, newest first, those with a seq below ``before``."""
    page = memory.run_history(run.run_id, newest_first=True, limit=RUN_PAGE_SIZE, before_seq=before)
    # Seqs are gap-free from 1, so the head's seq is the count and the position follows.
    top = run.head_seq if before is None else min(before - 1, run.head_seq)
    older = page[-1].seq if page and page[-1].seq > 1 else None
    return Slice(page, run.head_seq, run.head_seq - top + 1, older, top < run.head_seq)


def _events_before(memory: Memory, run: RunInfo, before: int | None) -> Slice[Event]:
    """A page of the run's events, newest first, those with a seq below ``before``.

    Event seqs are gap-free after ``compacted_through``, so the page is the range
    just below ``before``, read oldest first with the log's own paging and turned.
    """
    total = run.event_seq - run.compacted_through
    top = run.event_seq if before is None else min(before - 1, run.event_seq)
    low = max(top - RUN_PAGE_SIZE, run.compacted_through)
    events = []
    if top > low:
        events = memory.run_events(run.run_id, after_seq=low, limit=top - low)
        events.reverse()
    older = low + 1 if low > run.compacted_through else None
    return Slice(events, total, run.event_seq - top + 1, older, top < run.event_seq)


def _effects_after(memory: Memory, run_id: str, after: str | None) -> Slice[EffectRecord]:
    """A page of the run's effect ledger in key order, the effects whose key sorts after ``after``.

    Only the page's records are decoded; the total and where the page starts
    are counted from the stored records, never decoded.
    """
    total = memory.count_run_effects(run_id)
    remaining = total if after is None else memory.count_run_effects(run_id, after_key=after)
    page = memory.run_effects(run_id, after_key=after, limit=RUN_PAGE_SIZE)
    older = page[-1].key if remaining > len(page) else None
    return Slice(page, total, total - remaining + 1, older, after is not None)


def _forked_at(memory: Memory, run: RunInfo) -> int | None:
    """The seq of the checkpoint ``run`` was forked from (``None``: not a fork, or it is gone)."""
    if run.parent_run_id is None or run.parent_checkpoint_id is None:
        return None
    try:
        return memory.get_checkpoint(run.parent_run_id, run.parent_checkpoint_id).seq
    except TierError:  # the parent was deleted or compacted since: draw the fork without it
        return None


def run_page(
    memory: Memory,
    run_id: str,
    bound_user: str | None,
    checkpoint_id: str | None,
    before: int | None = None,
    events_before: int | None = None,
    effects_after: str | None = None,
) -> RunPage:
    """One run's timeline, effects, approval gates, events, fork graph and a scope snapshot.

    Args:
        memory: The tenant's memory.
        run_id: The run.
        bound_user: The caller's user, if its key is bound to one.
        checkpoint_id: The checkpoint whose scope and state to show, if any.
        before: Show the checkpoints with a seq below this (``None``: the newest).
        events_before: Show the events with a seq below this (``None``: the newest).
        effects_after: Show the effects whose key sorts after this (``None``: the first).

    Raises:
        RunNotFoundError: No such run (or not the bound user's).
        CheckpointNotFoundError: ``checkpoint_id`` is not one of the run's.
        InvalidInputError: A negative ``before`` or ``events_before``.
    """
    run = visible_run(memory, run_id, bound_user)
    for name, cursor in (("before", before), ("events_before", events_before)):
        if cursor is not None and cursor < 1:
            raise InvalidInputError(f"{name} must be a seq >= 1, got {cursor}", field=name)
    events = _events_before(memory, run, events_before)
    # Gates are found through their request events: the run's first ones and this page's.
    scanned = memory.run_events(run_id, limit=TIMELINE_LIMIT) + events.items
    gate_keys = [
        str(e.data["key"])
        for e in scanned
        if e.kind is EventKind.APPROVAL_REQUESTED and isinstance(e.data.get("key"), str)
    ]
    if run.pending_approval is not None and run.pending_approval.key not in gate_keys:
        gate_keys.append(run.pending_approval.key)
    approvals = [
        record
        for record in (_gate(memory, run_id, key) for key in dict.fromkeys(gate_keys))
        if record is not None
    ]
    scope_at = None
    if checkpoint_id:
        checkpoint = memory.get_checkpoint(run_id, checkpoint_id)
        scope_at = ScopeAt(
            checkpoint, checkpoint.scope, memory.run_state_at(run_id, checkpoint.checkpoint_id)
        )
    forks = _fork_graph(memory, run)
    return RunPage(
        run=run,
        checkpoints=_checkpoints_before(memory, run, before),
        effects=_effects_after(memory, run_id, effects_after),
        approvals=approvals,
        events=events,
        forks=forks,
        fork_graph=layout(forks, run.run_id, lambda info: _forked_at(memory, info)),
        scope_at=scope_at,
    )


@dataclass(frozen=True)
class PendingGate:
    """A run waiting at an approval gate, with the frozen plan (as stored, redacted)."""

    run: RunInfo
    record: Gate


def pending_approvals(memory: Memory, bound_user: str | None) -> list[PendingGate]:
    """Every run paused at an approval gate (the bound user's only), oldest request first."""
    gates = []
    for run in memory.list_runs(user_id=bound_user, status=RunStatus.PAUSED):
        pending = run.pending_approval
        if pending is None:
            continue
        try:
            record = _gate(memory, run.run_id, pending.key)
        except RunNotFoundError:  # deleted since it was listed
            continue
        if record is not None and record.status == "requested":
            gates.append(PendingGate(run, record))
    gates.sort(key=lambda gate: gate.record.requested_at)
    return gates


@dataclass(frozen=True)
class FactView:
    """A user's fact with its earlier values, newest first."""

    fact: UserFact
    history: list[UserFact]


@dataclass(frozen=True)
class UserPage:
    """What the agent will remember about a user."""

    user_id: str
    facts: list[FactView]
    sessions: list[SessionSummary]
    context: ContinuationContext
    query: str


def user_page(memory: Memory, user_id: str, query: str, max_tokens: int | None) -> UserPage:
    """A user's facts with history and provenance, recent sessions, and a context preview.

    Raises:
        InvalidInputError: A bad ``user_id``, ``query`` or ``max_tokens``.
    """
    context = memory.continuation_context(user_id, query, max_tokens)
    facts = [
        FactView(fact, memory.fact_history(user_id, fact.key))
        for fact in sorted(memory.get_facts(user_id), key=lambda f: f.key)
    ]
    sessions = memory.list_sessions(user_id, limit=SESSIONS_SHOWN)
    return UserPage(user_id, facts, sessions, context, query)
