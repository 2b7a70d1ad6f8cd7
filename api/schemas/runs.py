"""Request and response bodies of the task-run routes."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from pydantic import Field, JsonValue

from api.schemas.common import NO_CONTROL_NON_BLANK, NON_BLANK, Id, RequestModel, ResponseModel
from tiers.models import MAX_TEXT, RunStatus

LeaseEpoch = Annotated[
    int,
    Field(
        ge=1, le=2**62, description="The lease epoch returned when the run was started or resumed."
    ),
]


class RunCreate(RequestModel):
    """Start a run, or resume it (taking its lease) if it exists."""

    user_id: Id
    run_id: Id | None = Field(default=None, description="Default: a new id.")
    resume: bool = Field(default=True, description="Whether an existing run may be resumed.")
    worker_id: (
        Annotated[str, Field(min_length=1, max_length=256, pattern=NO_CONTROL_NON_BLANK)] | None
    ) = Field(default=None, description="Who holds the lease (shown to other workers).")
    lease_ttl: Annotated[float, Field(gt=0, le=86_400)] | None = Field(
        default=None,
        description="Seconds the lease lasts unless renewed with :heartbeat; default: no expiry.",
    )
    steal: bool = Field(default=False, description="Take a live lease from another worker.")
    budget_tokens: Annotated[int, Field(ge=0, le=2**62)] | None = None
    budget_cost: Annotated[float, Field(ge=0, le=1e12)] | None = None


class PendingApprovalOut(ResponseModel):
    """The approval gate a paused run waits at."""

    key: str
    plan_hash: str = Field(description="SHA-256 of the plan to approve or reject.")
    requested_at: datetime


class RunOut(ResponseModel):
    """Status and head of a run."""

    run_id: str
    user_id: str
    status: RunStatus
    head_seq: int
    head_checkpoint_id: str | None
    lease_epoch: int
    error: str | None
    result: JsonValue
    created_at: datetime
    updated_at: datetime
    last_checkpoint_at: datetime | None
    lease_owner: str | None = None
    lease_expires_at: datetime | None = None
    pending_approval: PendingApprovalOut | None = Field(
        default=None, description="Set while the run is paused at an approval gate."
    )
    parent_run_id: str | None = Field(default=None, description="The run this one was forked from.")
    parent_checkpoint_id: str | None = None


class RunLease(ResponseModel):
    """A started or resumed run and the lease epoch every later write must send."""

    run: RunOut
    lease_epoch: int


class RunList(ResponseModel):
    """Runs, oldest first."""

    runs: list[RunOut]


class CheckpointCreate(RequestModel):
    """The checkpoint of a step the caller executed."""

    lease_epoch: LeaseEpoch
    step: Annotated[str, Field(min_length=1, max_length=256, pattern=NO_CONTROL_NON_BLANK)]
    output: JsonValue = None
    input: JsonValue = Field(
        default=None, description="The step's input; only its SHA-256 is kept."
    )
    idempotency_key: (
        Annotated[str, Field(min_length=1, max_length=512, pattern=NO_CONTROL_NON_BLANK)] | None
    ) = Field(
        default=None,
        description="Makes retries safe: a committed key returns its checkpoint (200).",
    )
    scope: dict[str, JsonValue] | None = Field(
        default=None, description="A JSON snapshot stored with the checkpoint."
    )


class CheckpointOut(ResponseModel):
    """One committed step of a run."""

    checkpoint_id: str
    run_id: str
    seq: int
    parent_id: str | None
    step: str
    input_hash: str
    output: JsonValue
    idempotency_key: str
    status: str
    scope: dict[str, JsonValue] | None
    started_at: datetime
    created_at: datetime


class CheckpointList(ResponseModel):
    """Checkpoints in sequence order."""

    checkpoints: list[CheckpointOut]


class RunComplete(RequestModel):
    """Mark a run completed."""

    lease_epoch: LeaseEpoch
    result: JsonValue = None


class RunFail(RequestModel):
    """Mark a run failed."""

    lease_epoch: LeaseEpoch
    error: Annotated[str, Field(max_length=MAX_TEXT)]


class ApprovalDecision(RequestModel):
    """Approve or reject the plan a paused run waits on."""

    plan_hash: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] = Field(
        description="The plan hash the run reports in pending_approval (guards against "
        "deciding on a plan that changed)."
    )
    by: Annotated[str, Field(min_length=1, max_length=256, pattern=NON_BLANK)] | None = Field(
        default=None, description="Who decides; default: the API key's id."
    )
    note: Annotated[str, Field(max_length=MAX_TEXT)] | None = None


class ApprovalOut(ResponseModel):
    """A recorded decision on a plan."""

    approved: bool
    plan_hash: str
    by: str | None
    at: datetime | None
    note: str | None


class RunFork(RequestModel):
    """Start a new run from a checkpoint of this one (time travel)."""

    checkpoint_id: Annotated[str, Field(min_length=1, max_length=64)]
    new_run_id: Id | None = Field(default=None, description="Default: a new id.")


class LeaseRef(RequestModel):
    """The lease a write is made under."""

    lease_epoch: LeaseEpoch


class HeartbeatOut(ResponseModel):
    """A renewed lease."""

    run_id: str
    lease_epoch: int
    lease_expires_at: datetime | None = Field(description="None: the lease has no expiry.")
