"""The plain model of a task run that tests/tiers/test_task_model.py checks the tier against."""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime

from pydantic import JsonValue

from tiers.models import RunStatus
from tiers.task import RunHandle


class WorkerCrashError(Exception):
    """The worker process "dies" inside an effect: the exception escapes, the handle is dropped."""


class Clock:
    """A UTC clock the machine moves forward to expire leases."""

    def __init__(self) -> None:
        self.now = datetime(2026, 1, 1, tzinfo=UTC)

    def __call__(self) -> datetime:
        return self.now


@dataclass
class RunModel:
    """What one run should hold."""

    run_id: str
    status: RunStatus = RunStatus.RUNNING
    # (step name, idempotency key, output) per checkpoint, in seq order.
    checkpoints: list[tuple[str, str, JsonValue]] = field(default_factory=list)
    # Effect keys without a checkpoint: "invoked" (outcome unknown), "resolved"
    # (an operator recorded its output; the checkpoint comes on the next call) or
    # "not_done" (an operator said it did not happen).
    effects: dict[str, str] = field(default_factory=dict)
    resolved: dict[str, JsonValue] = field(default_factory=dict)
    # Effect keys this run's own ledger recorded (a fork copies checkpoints, not the ledger).
    recorded: set[str] = field(default_factory=set)
    # Effects a worker found invoked and could not settle: they block the run.
    flagged: set[str] = field(default_factory=set)
    # gate -> (plan, "requested" | "granted" | "rejected")
    gates: dict[str, tuple[str, str]] = field(default_factory=dict)
    pending: str | None = None
    handle: RunHandle | None = None
    # Handles whose lease epoch is over: every write of theirs is refused.
    stale: list[RunHandle] = field(default_factory=list)
    # Handles dropped by a crash: fenced once another worker takes the run.
    abandoned: list[RunHandle] = field(default_factory=list)
    lease_live: bool = False

    @property
    def outputs(self) -> dict[str, JsonValue]:
        """Committed idempotency key -> the output a replay returns."""
        return {key: output for _, key, output in self.checkpoints}

    @property
    def writable(self) -> bool:
        """Whether the run's current handle may append (it holds the run, which goes on)."""
        return (
            self.handle is not None
            and not self.status.finished
            and self.status is not RunStatus.PAUSED
        )


def releasable(run: RunModel) -> bool:
    """A run whose worker may release it here (a run resumable by a decision included)."""
    return run.writable


def unsettled(run: RunModel) -> bool:
    """A run going on whose handle may meet an effect that has no checkpoint yet."""
    return run.writable and bool(run.effects)


def endable(run: RunModel) -> bool:
    """A run not finished that did a few things (so that runs live long enough to matter)."""
    return not run.status.finished and len(run.checkpoints) + len(run.effects) + len(run.gates) >= 3


def step_name(key: str) -> str:
    return f"step-{key}"


def effect_name(key: str) -> str:
    return f"pay-{key}"
