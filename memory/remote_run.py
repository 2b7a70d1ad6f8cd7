"""A run's lease held over HTTP: :class:`RemoteRun`, the client's :class:`~tiers.task.RunHandle`."""

from __future__ import annotations

from collections.abc import Callable
from datetime import datetime
from typing import Any

from pydantic import JsonValue

from memory.transport import ServiceConnection
from tiers.errors import ApprovalPendingError
from tiers.models import Checkpoint, RunInfo
from tiers.task import Approval, Charged, EffectStart


class RemoteRun:
    """A lease on a run held over HTTP: the client's :class:`~tiers.task.RunHandle`.

    Every write sends the lease epoch; once another worker resumes the run,
    writes raise :class:`~tiers.errors.StaleWriterError` and write nothing.
    """

    def __init__(
        self,
        connection: ServiceConnection,
        info: RunInfo,
        epoch: int,
        *,
        worker_id: str | None = None,
    ) -> None:
        self._connection = connection
        self._info = info
        self._epoch = epoch
        self._worker_id = worker_id

    @property
    def run_id(self) -> str:
        """The run this handle writes to."""
        return self._info.run_id

    @property
    def user_id(self) -> str:
        """Owner of the run."""
        return self._info.user_id

    @property
    def epoch(self) -> int:
        """The lease epoch this handle holds."""
        return self._epoch

    @property
    def worker_id(self) -> str | None:
        """The worker id the lease was taken as (the server's answer).

        Pass it as ``worker_id`` to :meth:`memory.client.MemoryClient.start_run`, with the same
        API key, to retake this lease while it is live (e.g. after a restart).
        """
        return self._worker_id

    @property
    def info(self) -> RunInfo:
        """The run's head as last seen by this handle."""
        return self._info

    def _lease(self) -> dict[str, Any]:
        # The incarnation tells this run from a new one started under its id after a delete.
        return {"lease_epoch": self._epoch, "incarnation": self._info.incarnation}

    def append_checkpoint(
        self,
        step: str,
        output: object,
        *,
        input: object = None,
        idempotency_key: str | None = None,
        scope: dict[str, Any] | None = None,
        state: dict[str, Any] | None = None,
    ) -> Checkpoint:
        """See :meth:`tiers.task.RunHandle.append_checkpoint`."""
        body = {
            **self._lease(),
            "step": step,
            "output": output,
            "input": input,
            "idempotency_key": idempotency_key,
            "scope": scope,
            "state": state,
        }
        return Checkpoint.model_validate(
            self._connection.json("POST", f"/v1/runs/{self.run_id}/checkpoints", json=body)
        )

    def begin_effect(
        self,
        name: str,
        *,
        idempotency_key: str,
        input: object = None,
        safe_to_retry: bool = False,
    ) -> EffectStart:
        """See :meth:`tiers.task.RunHandle.begin_effect`."""
        body = {
            **self._lease(),
            "name": name,
            "idempotency_key": idempotency_key,
            "input": input,
            "safe_to_retry": safe_to_retry,
        }
        data = self._connection.json("POST", f"/v1/runs/{self.run_id}/effects:begin", json=body)
        return EffectStart(
            key=data["idempotency_key"], invoke=data["invoke"], output=data["output"]
        )

    def record_effect(self, idempotency_key: str, output: object) -> JsonValue:
        """See :meth:`tiers.task.RunHandle.record_effect` (``output`` may be a :class:`Charged`)."""
        body: dict[str, Any] = {**self._lease(), "idempotency_key": idempotency_key}
        if isinstance(output, Charged):
            body.update(
                output=output.output, tokens=output.tokens, cost=output.cost, state=output.state
            )
        else:
            body["output"] = output
        data = self._connection.json("POST", f"/v1/runs/{self.run_id}/effects:record", json=body)
        recorded: JsonValue = data["output"]
        return recorded

    def effect(
        self,
        name: str,
        fn: Callable[[str], object],
        *,
        idempotency_key: str,
        input: object = None,
        safe_to_retry: bool = False,
    ) -> JsonValue:
        """Perform an effect exactly once: :meth:`begin_effect`, ``fn(key)``, :meth:`record_effect`.

        ``fn`` is called with the idempotency key only when the effect is not
        recorded yet. If it raises, the effect stays invoked (outcome unknown).
        """
        start = self.begin_effect(
            name, idempotency_key=idempotency_key, input=input, safe_to_retry=safe_to_retry
        )
        if not start.invoke:
            return start.output
        return self.record_effect(start.key, fn(start.key))

    def await_approval(self, plan: object, *, key: str) -> Approval:
        """See :meth:`tiers.task.RunHandle.await_approval` (the gate's ``key`` is required here).

        Raises:
            ApprovalPendingError: No decision yet; the run is paused.
        """
        body = {**self._lease(), "plan": plan, "key": key}
        response = self._connection.request("POST", f"/v1/runs/{self.run_id}/approvals", json=body)
        data = response.json()
        if response.status_code == 202:
            raise ApprovalPendingError(
                f"run {self.run_id!r} is paused awaiting approval of plan "
                f"{data['plan_hash'][:12]}... (gate {data['approval_key']!r}): stop; approve or "
                "reject it, then ask again",
                run_id=self.run_id,
                plan_hash=data["plan_hash"],
                approval_key=data["approval_key"],
            )
        return Approval.model_validate(data)

    def heartbeat(self) -> datetime | None:
        """See :meth:`tiers.task.RunHandle.heartbeat`: renew the lease, return its new expiry."""
        body = {**self._lease()}
        data = self._connection.json("POST", f"/v1/runs/{self.run_id}:heartbeat", json=body)
        expires = data["lease_expires_at"]
        return None if expires is None else datetime.fromisoformat(expires)

    def complete(self, result: object = None) -> RunInfo:
        """See :meth:`tiers.task.RunHandle.complete`."""
        body = {**self._lease(), "result": result}
        self._info = RunInfo.model_validate(
            self._connection.json("POST", f"/v1/runs/{self.run_id}:complete", json=body)
        )
        return self._info

    def fail(self, error: str) -> RunInfo:
        """See :meth:`tiers.task.RunHandle.fail`."""
        body = {**self._lease(), "error": error}
        self._info = RunInfo.model_validate(
            self._connection.json("POST", f"/v1/runs/{self.run_id}:fail", json=body)
        )
        return self._info
