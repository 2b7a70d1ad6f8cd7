"""A Python client of the tiermem HTTP service, with the method names of :class:`~memory.Memory`.

::

    from memory.client import MemoryClient

    with MemoryClient("http://127.0.0.1:8080", api_key="tmk_...") as memory:
        memory.set_fact("alice", "language", "fr")
        print(memory.build_continuation_context("alice", "where were we?"))

Methods return the library's own records (:class:`~tiers.models.UserFact`,
:class:`~tiers.models.SessionSummary`, ...) and raise the library's typed
errors, rebuilt from the server's problem details (a 404 for a missing fact
raises :class:`~tiers.errors.FactNotFoundError`, a fenced-out run write raises
:class:`~tiers.errors.StaleWriterError`, ...) through the table both ends of
the wire share (:mod:`memory.problems`). Failures that only exist over HTTP
have their own classes::

    ClientError                     root of errors only the client raises
    ├── AuthenticationError         401: the API key is missing, unknown or revoked
    ├── PermissionDeniedError       403: the key lacks the scope, or is bound to another user
    ├── ServiceOverloadedError      429: too much queued work; ``retry_after`` seconds
    └── ServiceError                any other unexpected answer (``status``, ``problem``)

An unreachable server raises :class:`~tiers.errors.BackendUnavailableError`,
like an unreachable store does in the library. The operations it offers are
those :mod:`memory.operations` declares remote.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from datetime import datetime
from types import TracebackType
from typing import Any, Self
from urllib.parse import quote

import httpx
from pydantic import JsonValue

from memory.context import ContextSection, ContinuationContext
from memory.problems import (
    AuthenticationError,
    ClientError,
    PermissionDeniedError,
    ServiceError,
    ServiceOverloadedError,
    error_from_problem,
)
from memory.remote_run import RemoteRun
from memory.resume_plan import ResumePlan
from memory.transport import ServiceConnection
from tiers.errors import BackendUnavailableError, CheckpointNotFoundError
from tiers.ids import check_id
from tiers.models import Checkpoint, Message, RunInfo, RunStatus, SessionSummary, UserFact
from tiers.session import RecalledSession
from tiers.task import UNSET, Approval, EffectRecord, Event
from tiers.values import check_datetime

__all__ = [
    "AuthenticationError",
    "ClientError",
    "MemoryClient",
    "PermissionDeniedError",
    "RemoteRun",
    "ServiceError",
    "ServiceOverloadedError",
    "error_from_problem",
]

_SUMMARY_FIELDS = (
    "task_description",
    "decisions_made",
    "work_completed",
    "open_questions",
    "next_recommended_steps",
)


# -- records ----------------------------------------------------------------------------------


def _id(value: object, field: str) -> str:
    # Checked here so a bad id raises the library's InvalidInputError, not a 404 for a wrong path.
    return check_id(value, field)


def _instant(value: datetime | None, field: str) -> str | None:
    # Checked here so a bad value raises the library's InvalidInputError before any request.
    return None if value is None else check_datetime(value, field).isoformat()


def _fact(data: Mapping[str, Any]) -> UserFact:
    return UserFact.model_validate(data)


def _summary(data: Mapping[str, Any]) -> SessionSummary:
    return SessionSummary.model_validate(data)


def _run(data: Mapping[str, Any]) -> RunInfo:
    return RunInfo.model_validate(data)


def _checkpoint(data: Mapping[str, Any]) -> Checkpoint:
    return Checkpoint.model_validate(data)


def _effect(data: Mapping[str, Any]) -> EffectRecord:
    return EffectRecord.model_validate(data)


class MemoryClient:
    """The tiermem HTTP API with :class:`~memory.Memory`'s method names. Thread-safe.

    Args:
        base_url: Where the service listens, e.g. ``http://127.0.0.1:8080``.
        api_key: The key from ``tiermem keys create`` (``None`` if the server runs ``--no-auth``).
        timeout: Seconds per HTTP request.
        summarize_timeout: Seconds :meth:`end_session` waits for a background summary.
        transport: Another httpx transport (e.g. ``httpx.ASGITransport``), for tests or proxies.
    """

    def __init__(
        self,
        base_url: str,
        api_key: str | None = None,
        *,
        timeout: float = 30.0,
        summarize_timeout: float = 300.0,
        transport: httpx.BaseTransport | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self.summarize_timeout = summarize_timeout
        self._connection = ServiceConnection(
            self.base_url, api_key, timeout=timeout, transport=transport
        )
        # The connection's methods, under the names this class and scripts (bench/soak.py) use.
        self._request = self._connection.request
        self._json = self._connection.json
        self._deleted = self._connection.deleted

    # -- user tier --------------------------------------------------------------------------

    def set_fact(
        self,
        user_id: str,
        key: str,
        value: JsonValue,
        *,
        source: str = "api",
        confidence: float = 1.0,
        evidence: str = "",
    ) -> UserFact:
        """See :meth:`memory.Memory.set_fact`."""
        return _fact(
            self._json(
                "PUT",
                f"/v1/users/{_id(user_id, 'user_id')}/facts/{_id(key, 'key')}",
                json={
                    "value": value,
                    "source": source,
                    "confidence": confidence,
                    "evidence": evidence,
                },
            )
        )

    def set_facts(
        self, user_id: str, facts: dict[str, JsonValue], *, source: str = "api"
    ) -> list[UserFact]:
        """See :meth:`memory.Memory.set_facts`."""
        data = self._json(
            "PUT",
            f"/v1/users/{_id(user_id, 'user_id')}/facts",
            json={"facts": facts, "source": source},
        )
        return [_fact(f) for f in data["facts"]]

    def get_fact(self, user_id: str, key: str) -> UserFact:
        """See :meth:`memory.Memory.get_fact`."""
        return _fact(
            self._json("GET", f"/v1/users/{_id(user_id, 'user_id')}/facts/{_id(key, 'key')}")
        )

    def get_facts(self, user_id: str) -> list[UserFact]:
        """See :meth:`memory.Memory.get_facts`."""
        return [
            _fact(f)
            for f in self._json("GET", f"/v1/users/{_id(user_id, 'user_id')}/facts")["facts"]
        ]

    def fact_history(self, user_id: str, key: str) -> list[UserFact]:
        """See :meth:`memory.Memory.fact_history`."""
        return [
            _fact(f)
            for f in self._json(
                "GET", f"/v1/users/{_id(user_id, 'user_id')}/facts/{_id(key, 'key')}/history"
            )["facts"]
        ]

    def delete_fact(self, user_id: str, key: str) -> bool:
        """See :meth:`memory.Memory.delete_fact`."""
        return self._deleted(f"/v1/users/{_id(user_id, 'user_id')}/facts/{_id(key, 'key')}")

    def delete_facts(self, user_id: str) -> None:
        """See :meth:`memory.Memory.delete_facts`."""
        self._request("DELETE", f"/v1/users/{_id(user_id, 'user_id')}/facts")

    def forget_user(self, user_id: str) -> None:
        """See :meth:`memory.Memory.forget_user`."""
        self._request("DELETE", f"/v1/users/{_id(user_id, 'user_id')}")

    # -- session tier -----------------------------------------------------------------------

    def save_session(self, summary: SessionSummary | Mapping[str, Any]) -> SessionSummary:
        """See :meth:`memory.Memory.save_session`."""
        data = (
            summary.model_dump(mode="json")
            if isinstance(summary, SessionSummary)
            else dict(summary)
        )
        body: dict[str, Any] = {
            "session_id": data.get("session_id"),
            "summary": {k: data[k] for k in _SUMMARY_FIELDS if k in data},
        }
        if data.get("created_at") is not None:
            created = data["created_at"]
            body["created_at"] = created.isoformat() if isinstance(created, datetime) else created
        return _summary(
            self._json(
                "POST", f"/v1/users/{_id(data.get('user_id'), 'user_id')}/sessions", json=body
            )
        )

    def end_session(
        self,
        user_id: str,
        session_id: str,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        created_at: datetime | None = None,
    ) -> SessionSummary:
        """See :meth:`memory.Memory.end_session`.

        The server stores the transcript with a durable job and summarizes it
        in the background; this polls the job (up to ``summarize_timeout``
        seconds) and returns the saved summary. Any replica of the service
        answers the poll, and a replica that went away meanwhile is polled past
        (its job is run by another).

        Raises:
            TimeoutError: The job did not finish in time (it may still finish).
        """
        # Messages go in their stored JSON form, which the server's parser reads back unchanged
        # (tool calls, item types and attachments included); anything else goes as given, for
        # the server to accept or refuse exactly as Memory.end_session would.
        messages = [
            m.model_dump(mode="json", exclude_defaults=True)
            if isinstance(m, Message)
            else dict(m)
            if isinstance(m, Mapping)
            else m
            for m in transcript
        ]
        body: dict[str, Any] = {"session_id": session_id, "transcript": messages}
        if created_at is not None:
            body["created_at"] = created_at.isoformat()
        response = self._request("POST", f"/v1/users/{_id(user_id, 'user_id')}/sessions", json=body)
        return self._saved(response, session_id)

    def resummarize(self, user_id: str, session_id: str) -> SessionSummary:
        """See :meth:`memory.Memory.resummarize`; waits for the server's job like :meth:`end_session`."""
        response = self._request(
            "POST",
            f"/v1/users/{_id(user_id, 'user_id')}/sessions/{_id(session_id, 'session_id')}"
            ":resummarize",
        )
        return self._saved(response, session_id)

    def pending_summaries(self, user_id: str) -> list[str]:
        """See :meth:`memory.Memory.pending_summaries`."""
        data = self._json("GET", f"/v1/users/{_id(user_id, 'user_id')}/sessions:pending")
        return [str(sid) for sid in data["session_ids"]]

    def _saved(self, response: httpx.Response, session_id: str) -> SessionSummary:
        """The summary a summarizing request saved: at once (201), or once its job is done (202)."""
        data = response.json()
        if response.status_code != 202:
            return _summary(data)
        deadline = time.monotonic() + self.summarize_timeout
        delay = 0.02
        status_url = data["status_url"]
        while data["status"] in ("pending", "running"):
            if time.monotonic() > deadline:
                raise TimeoutError(
                    f"session {session_id!r} is still being summarized after {self.summarize_timeout} s "
                    f"(job {data['job_id']}); poll {status_url} or raise summarize_timeout"
                )
            time.sleep(delay)
            delay = min(delay * 2, 1.0)
            try:
                data = self._json("GET", status_url)
            except (BackendUnavailableError, ServiceOverloadedError):
                # The job is kept in the server's store and run by any replica: one going away
                # (or a busy moment) is not the job's failure. Ask again, maybe another replica.
                continue
        if data["status"] == "failed":
            problem = data.get("error") or {}
            raise error_from_problem(int(problem.get("status", 500)), problem)
        if data.get("session") is None:  # deleted since it was summarized
            return self.get_session(str(data["user_id"]), session_id)
        return _summary(data["session"])

    def get_session(self, user_id: str, session_id: str) -> SessionSummary:
        """See :meth:`memory.Memory.get_session`."""
        return _summary(
            self._json(
                "GET",
                f"/v1/users/{_id(user_id, 'user_id')}/sessions/{_id(session_id, 'session_id')}",
            )
        )

    def list_sessions(self, user_id: str, *, limit: int | None = None) -> list[SessionSummary]:
        """See :meth:`memory.Memory.list_sessions`."""
        data = self._json(
            "GET", f"/v1/users/{_id(user_id, 'user_id')}/sessions", params={"limit": limit}
        )
        return [_summary(s) for s in data["sessions"]]

    def delete_session(self, user_id: str, session_id: str) -> bool:
        """See :meth:`memory.Memory.delete_session`."""
        return self._deleted(
            f"/v1/users/{_id(user_id, 'user_id')}/sessions/{_id(session_id, 'session_id')}"
        )

    def recall_relevant(
        self, user_id: str, query: str, top_k: int = 5, *, now: datetime | None = None
    ) -> list[RecalledSession]:
        """See :meth:`memory.Memory.recall_relevant`."""
        data = self._json(
            "POST",
            f"/v1/users/{_id(user_id, 'user_id')}/sessions:recall",
            json={"query": query, "top_k": top_k, "now": _instant(now, "now")},
        )
        return [
            RecalledSession(summary=_summary(r["session"]), score=r["score"])
            for r in data["results"]
        ]

    def continuation_context(
        self,
        user_id: str,
        query: str = "",
        max_tokens: int | None = None,
        *,
        top_k: int = 5,
        now: datetime | None = None,
    ) -> ContinuationContext:
        """See :meth:`memory.Memory.continuation_context`."""
        body = {
            "query": query,
            "max_tokens": max_tokens,
            "top_k": top_k,
            "now": _instant(now, "now"),
        }
        data = self._json("POST", f"/v1/users/{_id(user_id, 'user_id')}/context", json=body)
        data["sections"] = [ContextSection.model_validate(s) for s in data["sections"]]
        return ContinuationContext.model_validate(data)

    def build_continuation_context(
        self,
        user_id: str,
        query: str = "",
        max_tokens: int | None = None,
        *,
        now: datetime | None = None,
    ) -> str:
        """See :meth:`memory.Memory.build_continuation_context`."""
        return self.continuation_context(user_id, query, max_tokens, now=now).text

    # -- task tier --------------------------------------------------------------------------

    def start_run(
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
    ) -> RemoteRun:
        """See :meth:`memory.Memory.start_run`; the returned handle writes over HTTP."""
        body = {
            "user_id": user_id,
            "run_id": run_id,
            "resume": resume,
            "worker_id": worker_id,
            "lease_ttl": lease_ttl,
            "steal": steal,
            "budget_tokens": budget_tokens,
            "budget_cost": budget_cost,
            "external_id": external_id,
        }
        data = self._json("POST", "/v1/runs", json=body)
        return RemoteRun(
            self._connection,
            _run(data["run"]),
            int(data["lease_epoch"]),
            worker_id=data.get("worker_id"),
        )

    def get_run(self, run_id: str) -> RunInfo:
        """See :meth:`memory.Memory.get_run`."""
        return _run(self._json("GET", f"/v1/runs/{_id(run_id, 'run_id')}"))

    def plan_resume(self, run_id: str) -> ResumePlan:
        """See :meth:`memory.Memory.plan_resume`."""
        data = self._json("GET", f"/v1/runs/{_id(run_id, 'run_id')}:resume-plan")
        return ResumePlan.model_validate(data)

    def delete_run(self, run_id: str) -> bool:
        """See :meth:`memory.Memory.delete_run`."""
        return self._deleted(f"/v1/runs/{_id(run_id, 'run_id')}")

    def run_history(
        self,
        run_id: str,
        *,
        newest_first: bool = False,
        limit: int | None = None,
        after_seq: int | None = None,
        before_seq: int | None = None,
    ) -> list[Checkpoint]:
        """See :meth:`memory.Memory.run_history`."""
        params = {
            "newest_first": "true" if newest_first else None,
            "limit": limit,
            "after_seq": after_seq,
            "before_seq": before_seq,
        }
        data = self._json("GET", f"/v1/runs/{_id(run_id, 'run_id')}/checkpoints", params=params)
        return [_checkpoint(c) for c in data["checkpoints"]]

    def get_checkpoint(self, run_id: str, checkpoint_id: str) -> Checkpoint:
        """See :meth:`memory.Memory.get_checkpoint`."""
        return _checkpoint(
            self._json(
                "GET",
                f"/v1/runs/{_id(run_id, 'run_id')}/checkpoints/{quote(checkpoint_id, safe='')}",
            )
        )

    def checkpoint_for_key(self, run_id: str, idempotency_key: str) -> Checkpoint | None:
        """See :meth:`memory.Memory.checkpoint_for_key`."""
        path = f"/v1/runs/{_id(run_id, 'run_id')}/checkpoints:by-key"
        try:
            data = self._json("GET", path, params={"idempotency_key": idempotency_key})
        except CheckpointNotFoundError:
            return None
        return _checkpoint(data)

    def list_runs(
        self,
        *,
        user_id: str | None = None,
        status: RunStatus | None = None,
        limit: int | None = None,
        after: str | None = None,
    ) -> list[RunInfo]:
        """See :meth:`memory.Memory.list_runs`."""
        params = {
            "user_id": user_id,
            "status": None if status is None else RunStatus(status).value,
            "limit": limit,
            "after": after,
        }
        return [_run(r) for r in self._json("GET", "/v1/runs", params=params)["runs"]]

    def cancel_run(self, run_id: str) -> RunInfo:
        """Cancel a run: every worker's next write is refused."""
        return _run(self._json("POST", f"/v1/runs/{_id(run_id, 'run_id')}:cancel"))

    def set_budget(
        self,
        run_id: str,
        *,
        tokens: int | None = UNSET,
        cost: float | None = UNSET,
        by: str = "operator",
    ) -> RunInfo:
        """See :meth:`memory.Memory.set_budget`."""
        body: dict[str, Any] = {"by": by}
        if tokens is not UNSET:
            body["budget_tokens"] = tokens
        if cost is not UNSET:
            body["budget_cost"] = cost
        return _run(self._json("POST", f"/v1/runs/{_id(run_id, 'run_id')}:set-budget", json=body))

    def approve_run(
        self, run_id: str, plan_hash: str, *, by: str, note: str | None = None
    ) -> Approval:
        """See :meth:`memory.Memory.approve_run`."""
        body = {"plan_hash": plan_hash, "by": by, "note": note}
        data = self._json("POST", f"/v1/runs/{_id(run_id, 'run_id')}:approve", json=body)
        return Approval.model_validate(data)

    def reject_run(
        self, run_id: str, plan_hash: str, *, by: str, note: str | None = None
    ) -> Approval:
        """See :meth:`memory.Memory.reject_run`."""
        body = {"plan_hash": plan_hash, "by": by, "note": note}
        data = self._json("POST", f"/v1/runs/{_id(run_id, 'run_id')}:reject", json=body)
        return Approval.model_validate(data)

    def fork_run(self, run_id: str, checkpoint_id: str, new_run_id: str | None = None) -> RunInfo:
        """See :meth:`memory.Memory.fork_run`."""
        body = {"checkpoint_id": checkpoint_id, "new_run_id": new_run_id}
        return _run(self._json("POST", f"/v1/runs/{_id(run_id, 'run_id')}:fork", json=body))

    def list_resumable_runs(
        self, *, limit: int | None = None, after: str | None = None
    ) -> list[RunInfo]:
        """See :meth:`memory.Memory.list_resumable_runs`."""
        params = {"limit": limit, "after": after}
        return [_run(r) for r in self._json("GET", "/v1/runs:resumable", params=params)["runs"]]

    def run_state_at(self, run_id: str, checkpoint_id: str) -> dict[str, JsonValue]:
        """See :meth:`memory.Memory.run_state_at`."""
        data = self._json(
            "GET",
            f"/v1/runs/{_id(run_id, 'run_id')}/checkpoints/{quote(checkpoint_id, safe='')}/state",
        )
        values: dict[str, JsonValue] = data["values"]
        return values

    def update_run_state(
        self, run_id: str, checkpoint_id: str, values: dict[str, Any], *, by: str = "operator"
    ) -> Checkpoint:
        """See :meth:`memory.Memory.update_run_state`."""
        body = {"checkpoint_id": checkpoint_id, "values": values, "by": by}
        return _checkpoint(
            self._json("POST", f"/v1/runs/{_id(run_id, 'run_id')}:update-state", json=body)
        )

    def run_events(
        self, run_id: str, *, after_seq: int | None = None, limit: int | None = None
    ) -> list[Event]:
        """See :meth:`memory.Memory.run_events`."""
        params = {
            name: value
            for name, value in (("after_seq", after_seq), ("limit", limit))
            if value is not None
        }
        data = self._json("GET", f"/v1/runs/{_id(run_id, 'run_id')}/events", params=params)
        return [Event.model_validate(e) for e in data["events"]]

    def run_effects(
        self, run_id: str, *, after_key: str | None = None, limit: int | None = None
    ) -> list[EffectRecord]:
        """See :meth:`memory.Memory.run_effects`."""
        params = {
            name: value
            for name, value in (("after_key", after_key), ("limit", limit))
            if value is not None
        }
        data = self._json("GET", f"/v1/runs/{_id(run_id, 'run_id')}/effects", params=params)
        return [_effect(e) for e in data["effects"]]

    def resolve_effect(
        self,
        run_id: str,
        key: str,
        *,
        output: object = UNSET,
        rerun: bool = False,
        by: str = "operator",
    ) -> EffectRecord:
        """See :meth:`memory.Memory.resolve_effect`."""
        body: dict[str, Any] = {"idempotency_key": key, "rerun": rerun, "by": by}
        if output is not UNSET:
            body["output"] = output
        return _effect(
            self._json("POST", f"/v1/runs/{_id(run_id, 'run_id')}/effects:resolve", json=body)
        )

    # -- lifecycle --------------------------------------------------------------------------

    def ping(self) -> None:
        """Raise ``BackendUnavailableError`` unless the service and its stores are ready."""
        self._request("GET", "/readyz")

    def close(self) -> None:
        """Close the HTTP connections. Idempotent."""
        self._connection.close()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.close()
