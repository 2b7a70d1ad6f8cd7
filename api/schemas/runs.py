"""Request and response bodies of the task-run routes."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated, Any

from pydantic import Field, JsonValue, StrictInt

from api.schemas.common import NO_CONTROL_NON_BLANK, NON_BLANK, Id, RequestModel, ResponseModel
from memory.resume_plan import ResumePlan
from tiers.ids import MAX_EXTERNAL_ID
from tiers.models import MAX_TEXT, RunStatus
from tiers.task import MAX_NOTE, EffectStatus, EventKind

StepName = Annotated[str, Field(min_length=1, max_length=256, pattern=NO_CONTROL_NON_BLANK)]
IdempotencyKey = Annotated[str, Field(min_length=1, max_length=512, pattern=NO_CONTROL_NON_BLANK)]
Decider = Annotated[str, Field(min_length=1, max_length=256, pattern=NON_BLANK)]

# Strict: a budget of `true` or "5" is a mistake to refuse, not a value to coerce.
BudgetTokens = Annotated[StrictInt, Field(ge=0, le=2**62)]
BudgetCost = Annotated[float, Field(strict=True, ge=0, le=1e12, allow_inf_nan=False)]

LeaseEpoch = Annotated[
    int,
    Field(
        ge=1, le=2**62, description="The lease epoch returned when the run was started or resumed."
    ),
]


Incarnation = Annotated[str, Field(min_length=1, max_length=64, pattern=r"^[0-9a-f]+$")]


def _incarnation() -> Any:
    return Field(
        default=None,
        description="The run's incarnation from the lease (RunOut.incarnation). With it, a write "
        "to a run that was deleted and started again under the same id (its epochs restart at "
        "1) is 404 run-not-found instead of landing in the new run.",
    )


class RunCreate(RequestModel):
    """Start a run, or resume it (taking its lease) if it exists."""

    user_id: Id
    run_id: Id | None = Field(default=None, description="Default: a new id.")
    resume: bool = Field(default=True, description="Whether an existing run may be resumed.")
    worker_id: (
        Annotated[str, Field(min_length=1, max_length=200, pattern=NO_CONTROL_NON_BLANK)] | None
    ) = Field(
        default=None,
        description="Who takes the lease; with the caller's API key it names the holder (shown "
        "to other workers as lease_owner). The same worker id and key may retake a live lease of "
        "its own. Default: a new worker id for this request, so no other request holds the same "
        "lease; the answer's worker_id is the one to send back.",
    )
    lease_ttl: Annotated[float, Field(gt=0, le=86_400)] | None = Field(
        default=None,
        description="Seconds the lease lasts unless renewed with :heartbeat; default: no expiry.",
    )
    steal: bool = Field(
        default=False, description="Take a live lease from another worker (fencing it out)."
    )
    budget_tokens: BudgetTokens | None = None
    budget_cost: BudgetCost | None = None
    external_id: Annotated[str, Field(min_length=1, max_length=MAX_EXTERNAL_ID)] | None = Field(
        default=None,
        description="The run's id in another system (a framework's session or thread id, any "
        "string), kept with the run. Without run_id the run id is derived from it "
        "(tiers.ids.run_id_for: itself when it is a valid id, else a sanitized prefix and a "
        "SHA-256 digest). Resuming with another external id is 409 conflict.",
    )


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
    unknown_effects: list[str] = Field(
        default_factory=list,
        description="Idempotency keys of effects whose outcome is unknown (invoked, never "
        "recorded, and not settled by the worker that found them). While not empty the run is "
        "blocked: not listed by /v1/runs:resumable until each is resolved with "
        "POST /v1/runs/{run_id}/effects:resolve.",
    )
    external_id: str | None = Field(
        default=None, description="The run's id in another system, as given when it was started."
    )
    budget_tokens: int | None = Field(
        default=None,
        description="Token budget (null: unlimited); once spent_tokens reaches it no new effect "
        "or step starts (409 budget-exceeded) until POST /v1/runs/{run_id}:set-budget raises it.",
    )
    budget_cost: float | None = Field(default=None, description="Cost budget (null: unlimited).")
    spent_tokens: int = Field(default=0, description="Tokens debited so far.")
    spent_cost: float = Field(default=0.0, description="Cost debited so far.")
    incarnation: str | None = Field(
        default=None,
        description="Random token of this run's creation; send it with the lease epoch on writes "
        "(null for runs stored before it existed).",
    )


class RunLease(ResponseModel):
    """A started or resumed run and the lease epoch every later write must send."""

    run: RunOut
    lease_epoch: int
    worker_id: str = Field(
        description="The worker id the lease was taken as: send it again (with the same API "
        "key) to retake this lease while it is live, e.g. after a restart. Any other caller "
        "gets 409 lease-held until the lease expires, unless it steals."
    )


class RunList(ResponseModel):
    """Runs, oldest first."""

    runs: list[RunOut]


class CheckpointCreate(RequestModel):
    """The checkpoint of a step the caller executed."""

    lease_epoch: LeaseEpoch
    incarnation: Incarnation | None = _incarnation()
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
    state: dict[str, JsonValue] | None = Field(
        default=None,
        description="Keys of the run's state this step sets (a shallow merge; see "
        "GET /v1/runs/{run_id}/checkpoints/{checkpoint_id}/state).",
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
    incarnation: Incarnation | None = _incarnation()
    result: JsonValue = None


class RunFail(RequestModel):
    """Mark a run failed."""

    lease_epoch: LeaseEpoch
    incarnation: Incarnation | None = _incarnation()
    error: Annotated[str, Field(max_length=MAX_TEXT)]


class ApprovalDecision(RequestModel):
    """Approve or reject the plan a paused run waits on."""

    plan_hash: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")] = Field(
        description="The plan hash the run reports in pending_approval (guards against "
        "deciding on a plan that changed)."
    )
    by: Annotated[str, Field(min_length=1, max_length=256, pattern=NON_BLANK)] | None = Field(
        default=None,
        description="Who decides (a claim; the decision also records the API key's id as "
        "by_key); default: the API key's id.",
    )
    note: Annotated[str, Field(max_length=MAX_NOTE)] | None = None


class BudgetUpdate(RequestModel):
    """A run's new token and/or cost budget: a member left out keeps its limit, null removes it."""

    budget_tokens: BudgetTokens | None = Field(
        default=None,
        description="The run's token budget (tokens spent so far count against it); null: "
        "unlimited. Left out: unchanged.",
    )
    budget_cost: BudgetCost | None = Field(
        default=None,
        description="The run's cost budget; null: unlimited. Left out: unchanged.",
    )
    by: Decider | None = Field(
        default=None,
        description="Who changes it (a claim; the BudgetSet event also records the API key's id "
        "as by_key); default: the API key's id.",
    )


class ApprovalOut(ResponseModel):
    """A recorded decision on a plan."""

    approved: bool
    plan_hash: str
    by: str | None = Field(description="Who decided, as the deciding request named them.")
    by_key: str | None = Field(
        default=None,
        description="Id of the API key the decision was authenticated with, recorded by the "
        "server whatever by claims (null with auth off, or when decided through the library).",
    )
    at: datetime | None
    note: str | None


class RunFork(RequestModel):
    """Start a new run from a checkpoint of this one (time travel)."""

    checkpoint_id: Annotated[str, Field(min_length=1, max_length=64)]
    new_run_id: Id | None = Field(default=None, description="Default: a new id.")


class LeaseRef(RequestModel):
    """The lease a write is made under."""

    lease_epoch: LeaseEpoch
    incarnation: Incarnation | None = _incarnation()


class HeartbeatOut(ResponseModel):
    """A renewed lease."""

    run_id: str
    lease_epoch: int
    lease_expires_at: datetime | None = Field(description="None: the lease has no expiry.")


class StateOut(ResponseModel):
    """A run's state values as of one checkpoint."""

    run_id: str
    checkpoint_id: str
    values: dict[str, JsonValue]


class StateUpdate(RequestModel):
    """Edit the run's state as of a checkpoint: a human-edited checkpoint, a new branch from there.

    The checkpoints after ``checkpoint_id`` leave the run's lineage and their
    steps run again on resume; the lease is revoked (the running worker is
    fenced out) and the run becomes resumable.
    """

    checkpoint_id: Annotated[str, Field(min_length=1, max_length=64)]
    values: dict[str, JsonValue] = Field(description="State keys to set (a shallow merge).")
    by: Decider | None = Field(
        default=None,
        description="Who edits (a claim; the event also records the API key's id as by_key); "
        "default: the API key's id.",
    )


class EffectBegin(RequestModel):
    """Begin an external effect the caller performs itself (first half of the two-phase protocol)."""

    lease_epoch: LeaseEpoch
    incarnation: Incarnation | None = _incarnation()
    name: StepName = Field(description="Effect name (its checkpoint's step name).")
    idempotency_key: IdempotencyKey = Field(
        description="The effect's key: pass it to the external system too, so it can deduplicate."
    )
    input: JsonValue = Field(
        default=None,
        description="The request; only its SHA-256 is kept, and a replay with another request "
        "is refused (409 input-mismatch).",
    )
    safe_to_retry: bool = Field(
        default=False,
        description="The effect is idempotent: begin it again if its outcome is unknown.",
    )


class EffectBeginOut(ResponseModel):
    """What to do with the effect: perform it now, or use its recorded output."""

    idempotency_key: str
    invoke: bool = Field(
        description="true: EffectInvoked is durable; perform the effect now, then POST "
        "effects:record. false: it is recorded already; do not perform it, use output."
    )
    output: JsonValue = Field(description="The recorded output (null when invoke is true).")


class EffectRecordCreate(RequestModel):
    """Record the result of an effect begun with effects:begin (before the run goes on)."""

    lease_epoch: LeaseEpoch
    incarnation: Incarnation | None = _incarnation()
    idempotency_key: IdempotencyKey
    output: JsonValue = None
    tokens: Annotated[int, Field(ge=0, le=2**62)] = Field(
        default=0, description="Tokens the effect spent (debited from the run's budget once)."
    )
    cost: Annotated[float, Field(ge=0, le=1e12)] = Field(
        default=0.0, description="Cost the effect incurred (debited once)."
    )
    state: dict[str, JsonValue] | None = Field(
        default=None, description="State keys the effect sets (top-level effects only)."
    )


class EffectResolve(RequestModel):
    """An operator's decision on an effect of unknown outcome: give exactly one of output / rerun."""

    idempotency_key: IdempotencyKey
    output: JsonValue = Field(
        default=None,
        description="The effect happened, with this output (give the member, even as null); the "
        "resumed run uses it without performing the effect.",
    )
    rerun: bool = Field(
        default=False, description="true: the effect did not happen; the resumed run performs it."
    )
    by: Decider | None = Field(
        default=None,
        description="Who decides (a claim; the ledger also records the API key's id as "
        "resolved_by_key); default: the API key's id.",
    )


class EffectOut(ResponseModel):
    """One entry of a run's effect ledger."""

    key: str = Field(description="The effect's idempotency key.")
    name: str
    step_key: str = Field(description="Key of the step it ran in (its own key at the top level).")
    status: EffectStatus = Field(
        description="invoked (outcome unknown unless in flight), recorded, or not_done."
    )
    attempt: int
    request_hash: str
    safe_to_retry: bool
    level: int = Field(description="0 for the run's effects, 1 for compensations.")
    output: JsonValue
    response_hash: str | None
    source: str | None = Field(description="Who settled it: fn, reconcile or operator.")
    resolved_by: str | None = Field(
        default=None, description="An operator's effects:resolve: who decided, as they claimed."
    )
    resolved_by_key: str | None = Field(
        default=None,
        description="An operator's effects:resolve: id of the API key the decision was "
        "authenticated with (null with auth off, or when resolved through the library).",
    )
    invoked_seq: int
    recorded_seq: int | None
    flagged_unknown: bool
    compensated: bool


class EventOut(ResponseModel):
    """One entry of a run's append-only event log."""

    run_id: str
    seq: int = Field(description="Gap-free, strictly increasing per run.")
    kind: EventKind
    epoch: int = Field(description="Lease epoch of the writer.")
    at: datetime
    data: dict[str, JsonValue]


class EventList(ResponseModel):
    """A run's events in sequence order."""

    events: list[EventOut]


class EffectList(ResponseModel):
    """A run's effect ledger, by idempotency key."""

    effects: list[EffectOut]


class ApprovalRequest(RequestModel):
    """Stop at a human-approval gate for a plan (the worker side of approve/reject)."""

    lease_epoch: LeaseEpoch
    incarnation: Incarnation | None = _incarnation()
    plan: JsonValue = Field(description="The plan to approve; frozen with its SHA-256.")
    key: IdempotencyKey = Field(
        description="The gate's key: the same key and plan return the decision once made."
    )


class ApprovalPendingOut(ResponseModel):
    """The gate waits for a human: the run is paused until :approve or :reject."""

    run_id: str
    approval_key: str
    plan_hash: str = Field(description="SHA-256 of the frozen plan; approve or reject this one.")


class ResumePlanOut(ResumePlan, ResponseModel):
    """What resuming the run would do now, computed without writing anything (dry-run replay).

    The fields are :class:`~memory.resume_plan.ResumePlan`'s: names, keys and ids, never outputs.
    """
