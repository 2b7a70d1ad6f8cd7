"""The Memory facade: :class:`Memory`, the one object an agent or app backend talks to, and its async twin.

``Memory`` (the sync core) is written in :mod:`memory.core`; :class:`AsyncMemory`
wraps it with ``anyio.to_thread`` and holds no logic. Both expose exactly the
operations :mod:`memory.operations` declares.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime, timedelta
from types import TracebackType
from typing import Any, Self, TypeVar

import anyio.to_thread
from pydantic import JsonValue

from memory.context import ContinuationContext
from memory.core import Memory
from memory.metrics import TiermemMetrics
from memory.resume_plan import ResumePlan
from memory.sessions import DEFAULT_TOP_K
from memory.settings import Settings
from tiers.index_check import IndexRepair, IndexReport
from tiers.models import Checkpoint, Message, RunInfo, RunStatus, SessionSummary, UserFact
from tiers.retention import RetentionPolicy, SweepReport
from tiers.session import RecalledSession
from tiers.task import UNSET, Approval, ApprovalRecord, EffectRecord, Event, RunHandle

__all__ = ["DEFAULT_TOP_K", "AsyncMemory", "Memory"]

T = TypeVar("T")


class AsyncMemory:
    """Async twin of :class:`Memory`: the same methods, run in a worker thread.

    Holds no logic of its own; every method delegates to the sync core.
    """

    def __init__(self, memory: Memory) -> None:
        self.sync = memory

    @classmethod
    def open(cls, data_dir: str | os.PathLike[str] = ".tiermem", **overrides: Any) -> AsyncMemory:
        """See :meth:`Memory.open`."""
        return cls(Memory.open(data_dir, **overrides))

    @classmethod
    def from_settings(
        cls, settings: Settings | None = None, *, metrics: TiermemMetrics | None = None
    ) -> AsyncMemory:
        """See :meth:`Memory.from_settings`."""
        return cls(Memory.from_settings(settings, metrics=metrics))

    async def _call(self, fn: Callable[..., T], *args: Any, **kwargs: Any) -> T:
        return await anyio.to_thread.run_sync(lambda: fn(*args, **kwargs))

    def for_tenant(self, tenant: str) -> AsyncMemory:
        """See :meth:`Memory.for_tenant`."""
        return AsyncMemory(self.sync.for_tenant(tenant))

    async def save_session(self, summary: SessionSummary | Mapping[str, Any]) -> SessionSummary:
        """See :meth:`Memory.save_session`."""
        return await self._call(self.sync.save_session, summary)

    async def end_session(
        self,
        user_id: str,
        session_id: str,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        created_at: datetime | None = None,
    ) -> SessionSummary:
        """See :meth:`Memory.end_session`."""
        return await self._call(
            self.sync.end_session, user_id, session_id, transcript, created_at=created_at
        )

    async def save_transcript(
        self,
        user_id: str,
        session_id: str,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        created_at: datetime | None = None,
    ) -> None:
        """See :meth:`Memory.save_transcript`."""
        await self._call(
            self.sync.save_transcript, user_id, session_id, transcript, created_at=created_at
        )

    async def resummarize(self, user_id: str, session_id: str) -> SessionSummary:
        """See :meth:`Memory.resummarize`."""
        return await self._call(self.sync.resummarize, user_id, session_id)

    async def pending_summaries(self, user_id: str) -> list[str]:
        """See :meth:`Memory.pending_summaries`."""
        return await self._call(self.sync.pending_summaries, user_id)

    async def require_transcript(self, user_id: str, session_id: str) -> None:
        """See :meth:`Memory.require_transcript`."""
        await self._call(self.sync.require_transcript, user_id, session_id)

    async def get_session(self, user_id: str, session_id: str) -> SessionSummary:
        """See :meth:`Memory.get_session`."""
        return await self._call(self.sync.get_session, user_id, session_id)

    async def list_sessions(
        self, user_id: str, *, limit: int | None = None
    ) -> list[SessionSummary]:
        """See :meth:`Memory.list_sessions`."""
        return await self._call(self.sync.list_sessions, user_id, limit=limit)

    async def delete_session(self, user_id: str, session_id: str) -> bool:
        """See :meth:`Memory.delete_session`."""
        return await self._call(self.sync.delete_session, user_id, session_id)

    async def recall_relevant(
        self,
        user_id: str,
        query: str,
        top_k: int = DEFAULT_TOP_K,
        *,
        now: datetime | None = None,
    ) -> list[RecalledSession]:
        """See :meth:`Memory.recall_relevant`."""
        return await self._call(self.sync.recall_relevant, user_id, query, top_k, now=now)

    async def continuation_context(
        self,
        user_id: str,
        query: str = "",
        max_tokens: int | None = None,
        *,
        top_k: int = DEFAULT_TOP_K,
        now: datetime | None = None,
    ) -> ContinuationContext:
        """See :meth:`Memory.continuation_context`."""
        return await self._call(
            self.sync.continuation_context, user_id, query, max_tokens, top_k=top_k, now=now
        )

    async def build_continuation_context(
        self,
        user_id: str,
        query: str = "",
        max_tokens: int | None = None,
        *,
        now: datetime | None = None,
    ) -> str:
        """See :meth:`Memory.build_continuation_context`."""
        return await self._call(
            self.sync.build_continuation_context, user_id, query, max_tokens, now=now
        )

    async def set_fact(
        self,
        user_id: str,
        key: str,
        value: JsonValue,
        *,
        source: str = "api",
        confidence: float = 1.0,
        evidence: str = "",
    ) -> UserFact:
        """See :meth:`Memory.set_fact`."""
        return await self._call(
            self.sync.set_fact,
            user_id,
            key,
            value,
            source=source,
            confidence=confidence,
            evidence=evidence,
        )

    async def set_facts(
        self, user_id: str, facts: Mapping[str, JsonValue], *, source: str = "api"
    ) -> list[UserFact]:
        """See :meth:`Memory.set_facts`."""
        return await self._call(self.sync.set_facts, user_id, facts, source=source)

    async def get_fact(self, user_id: str, key: str) -> UserFact:
        """See :meth:`Memory.get_fact`."""
        return await self._call(self.sync.get_fact, user_id, key)

    async def get_facts(self, user_id: str) -> list[UserFact]:
        """See :meth:`Memory.get_facts`."""
        return await self._call(self.sync.get_facts, user_id)

    async def fact_history(self, user_id: str, key: str) -> list[UserFact]:
        """See :meth:`Memory.fact_history`."""
        return await self._call(self.sync.fact_history, user_id, key)

    async def delete_fact(self, user_id: str, key: str) -> bool:
        """See :meth:`Memory.delete_fact`."""
        return await self._call(self.sync.delete_fact, user_id, key)

    async def delete_facts(self, user_id: str) -> None:
        """See :meth:`Memory.delete_facts`."""
        await self._call(self.sync.delete_facts, user_id)

    async def forget_user(self, user_id: str) -> None:
        """See :meth:`Memory.forget_user`."""
        await self._call(self.sync.forget_user, user_id)

    async def start_run(
        self,
        user_id: str,
        run_id: str | None = None,
        *,
        resume: bool = True,
        worker_id: str | None = None,
        lease_ttl: float | None = None,
        steal: bool = False,
        budget_tokens: int | None = None,
        budget_cost: float | None = None,
        external_id: str | None = None,
    ) -> RunHandle:
        """See :meth:`Memory.start_run`. The handle's methods are synchronous (``aeffect`` aside)."""
        return await self._call(
            self.sync.start_run,
            user_id,
            run_id,
            resume=resume,
            worker_id=worker_id,
            lease_ttl=lease_ttl,
            steal=steal,
            budget_tokens=budget_tokens,
            budget_cost=budget_cost,
            external_id=external_id,
        )

    async def cancel_run(self, run_id: str) -> RunInfo:
        """See :meth:`Memory.cancel_run`."""
        return await self._call(self.sync.cancel_run, run_id)

    async def set_budget(
        self,
        run_id: str,
        *,
        tokens: int | None = UNSET,
        cost: float | None = UNSET,
        by: str = "operator",
        by_key: str | None = None,
    ) -> RunInfo:
        """See :meth:`Memory.set_budget`."""
        return await self._call(
            self.sync.set_budget, run_id, tokens=tokens, cost=cost, by=by, by_key=by_key
        )

    async def approve_run(
        self,
        run_id: str,
        plan_hash: str,
        *,
        by: str,
        note: str | None = None,
        by_key: str | None = None,
    ) -> Approval:
        """See :meth:`Memory.approve_run`."""
        return await self._call(
            self.sync.approve_run, run_id, plan_hash, by=by, note=note, by_key=by_key
        )

    async def reject_run(
        self,
        run_id: str,
        plan_hash: str,
        *,
        by: str,
        note: str | None = None,
        by_key: str | None = None,
    ) -> Approval:
        """See :meth:`Memory.reject_run`."""
        return await self._call(
            self.sync.reject_run, run_id, plan_hash, by=by, note=note, by_key=by_key
        )

    async def fork_run(
        self, run_id: str, checkpoint_id: str, new_run_id: str | None = None
    ) -> RunInfo:
        """See :meth:`Memory.fork_run`."""
        return await self._call(self.sync.fork_run, run_id, checkpoint_id, new_run_id)

    async def list_resumable_runs(
        self, *, limit: int | None = None, after: str | None = None
    ) -> list[RunInfo]:
        """See :meth:`Memory.list_resumable_runs`."""
        return await self._call(self.sync.list_resumable_runs, limit=limit, after=after)

    async def sweep_runs(self, *, now: datetime | None = None) -> list[str]:
        """See :meth:`Memory.sweep_runs`."""
        return await self._call(self.sync.sweep_runs, now=now)

    async def retention(self) -> RetentionPolicy:
        """See :meth:`Memory.retention`."""
        return await self._call(self.sync.retention)

    async def set_retention(self, **ttls: timedelta | str | None) -> RetentionPolicy:
        """See :meth:`Memory.set_retention`."""
        return await self._call(self.sync.set_retention, **ttls)

    async def sweep(self, *, now: datetime | None = None) -> SweepReport:
        """See :meth:`Memory.sweep`."""
        return await self._call(self.sync.sweep, now=now)

    async def run_state_at(self, run_id: str, checkpoint_id: str) -> dict[str, JsonValue]:
        """See :meth:`Memory.run_state_at`."""
        return await self._call(self.sync.run_state_at, run_id, checkpoint_id)

    async def update_run_state(
        self,
        run_id: str,
        checkpoint_id: str,
        values: dict[str, Any],
        *,
        by: str = "operator",
        by_key: str | None = None,
    ) -> Checkpoint:
        """See :meth:`Memory.update_run_state`."""
        return await self._call(
            self.sync.update_run_state, run_id, checkpoint_id, values, by=by, by_key=by_key
        )

    async def run_effects(
        self, run_id: str, *, after_key: str | None = None, limit: int | None = None
    ) -> list[EffectRecord]:
        """See :meth:`Memory.run_effects`."""
        return await self._call(self.sync.run_effects, run_id, after_key=after_key, limit=limit)

    async def count_run_effects(self, run_id: str, *, after_key: str | None = None) -> int:
        """See :meth:`Memory.count_run_effects`."""
        return await self._call(self.sync.count_run_effects, run_id, after_key=after_key)

    async def resolve_effect(
        self,
        run_id: str,
        key: str,
        *,
        output: object = UNSET,
        rerun: bool = False,
        by: str = "operator",
        by_key: str | None = None,
    ) -> EffectRecord:
        """See :meth:`Memory.resolve_effect`."""
        return await self._call(
            self.sync.resolve_effect, run_id, key, output=output, rerun=rerun, by=by, by_key=by_key
        )

    async def attach_run(
        self,
        run_id: str,
        lease_epoch: int,
        *,
        incarnation: str | None = None,
        finished_ok: bool = False,
    ) -> RunHandle:
        """See :meth:`Memory.attach_run`. The handle's methods are synchronous (``aeffect`` aside)."""
        return await self._call(
            self.sync.attach_run,
            run_id,
            lease_epoch,
            incarnation=incarnation,
            finished_ok=finished_ok,
        )

    async def run_approval(self, run_id: str, key: str) -> ApprovalRecord | None:
        """See :meth:`Memory.run_approval`."""
        return await self._call(self.sync.run_approval, run_id, key)

    async def get_effect(self, run_id: str, key: str) -> EffectRecord:
        """See :meth:`Memory.get_effect`."""
        return await self._call(self.sync.get_effect, run_id, key)

    async def get_run(self, run_id: str) -> RunInfo:
        """See :meth:`Memory.get_run`."""
        return await self._call(self.sync.get_run, run_id)

    async def plan_resume(self, run_id: str) -> ResumePlan:
        """See :meth:`Memory.plan_resume`."""
        return await self._call(self.sync.plan_resume, run_id)

    async def delete_run(self, run_id: str) -> bool:
        """See :meth:`Memory.delete_run`."""
        return await self._call(self.sync.delete_run, run_id)

    async def get_checkpoint(self, run_id: str, checkpoint_id: str) -> Checkpoint:
        """See :meth:`Memory.get_checkpoint`."""
        return await self._call(self.sync.get_checkpoint, run_id, checkpoint_id)

    async def checkpoint_for_key(self, run_id: str, idempotency_key: str) -> Checkpoint | None:
        """See :meth:`Memory.checkpoint_for_key`."""
        return await self._call(self.sync.checkpoint_for_key, run_id, idempotency_key)

    async def run_history(
        self,
        run_id: str,
        *,
        newest_first: bool = False,
        limit: int | None = None,
        after_seq: int | None = None,
        before_seq: int | None = None,
    ) -> list[Checkpoint]:
        """See :meth:`Memory.run_history`."""
        return await self._call(
            self.sync.run_history,
            run_id,
            newest_first=newest_first,
            limit=limit,
            after_seq=after_seq,
            before_seq=before_seq,
        )

    async def run_events(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """See :meth:`Memory.run_events`."""
        return await self._call(self.sync.run_events, run_id, after_seq=after_seq, limit=limit)

    async def list_runs(
        self,
        *,
        user_id: str | None = None,
        status: RunStatus | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[RunInfo]:
        """See :meth:`Memory.list_runs`."""
        return await self._call(
            self.sync.list_runs, user_id=user_id, status=status, limit=limit, after=after
        )

    async def ping(self) -> None:
        """See :meth:`Memory.ping`."""
        await self._call(self.sync.ping)

    async def force_flush(self) -> None:
        """See :meth:`Memory.force_flush`."""
        await self._call(self.sync.force_flush)

    async def flush(self, timeout: float | None = None) -> bool:
        """See :meth:`Memory.flush`."""
        return await self._call(self.sync.flush, timeout)

    async def check_index(self) -> IndexReport:
        """See :meth:`Memory.check_index`."""
        return await self._call(self.sync.check_index)

    async def repair_index(self, *, limit: int | None = None) -> IndexRepair:
        """See :meth:`Memory.repair_index`."""
        return await self._call(self.sync.repair_index, limit=limit)

    async def tenants(self) -> list[str]:
        """See :meth:`Memory.tenants`."""
        return await self._call(self.sync.tenants)

    async def close(self) -> None:
        """See :meth:`Memory.close`."""
        await self._call(self.sync.close)

    async def __aenter__(self) -> Self:
        return self

    async def __aexit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        await self.close()
