"""Task runs: ``/v1/runs``, their checkpoints, effects, approval gates and completion.

A stateless HTTP caller keeps the ``lease_epoch`` it got from ``POST /v1/runs``
and sends it with every write; when another worker resumes the run, the old
epoch is fenced out (409 ``stale-lease``) and nothing is written.

External effects follow a two-phase protocol (``RunHandle.begin_effect`` /
``record_effect``): ``effects:begin`` makes ``EffectInvoked`` durable before
the caller performs the effect (or returns the recorded output of a replay),
``effects:record`` stores the result before the run goes on, and an effect
begun but never recorded answers 409 ``effect-outcome-unknown`` until it is
decided with ``effects:resolve``.
"""

from __future__ import annotations

import secrets
import time
from typing import Annotated

from fastapi import APIRouter, Query, Response, status

from api.deps import Caller, ReadMemory, ServiceDep, WriteMemory, require_user
from api.errors import problem_responses
from api.responses import json_response
from api.schemas.common import NO_CONTROL_NON_BLANK, CheckpointIdPath, Id, RunIdPath
from api.schemas.runs import (
    ApprovalDecision,
    ApprovalOut,
    ApprovalPendingOut,
    ApprovalRequest,
    BudgetUpdate,
    CheckpointCreate,
    CheckpointList,
    CheckpointOut,
    EffectOut,
    EventList,
    EventOut,
    HeartbeatOut,
    LeaseRef,
    ResumePlanOut,
    RunComplete,
    RunCreate,
    RunFail,
    RunFork,
    RunLease,
    RunList,
    RunOut,
    StateOut,
    StateUpdate,
)
from api.state import Principal
from memory.binding import user_filter
from tiers.errors import ApprovalPendingError, CheckpointNotFoundError, RunNotFoundError
from tiers.models import Checkpoint, RunInfo, RunStatus
from tiers.task import UNSET, EffectRecord

router = APIRouter(
    prefix="/v1/runs",
    tags=["runs"],
    responses=problem_responses(400, 401, 403, 413, 422, 500, 503),
)

_NOT_FOUND = problem_responses(404)
_WRITE_ERRORS = problem_responses(404, 409)


def run_out(info: RunInfo) -> RunOut:
    """The API form of a run head."""
    return RunOut.model_validate(info, from_attributes=True)


def checkpoint_out(ckpt: Checkpoint) -> CheckpointOut:
    """The API form of a checkpoint."""
    return CheckpointOut.model_validate(ckpt, from_attributes=True)


def effect_out(rec: EffectRecord) -> EffectOut:
    """The API form of an effect ledger entry."""
    return EffectOut.model_validate(rec, from_attributes=True)


@router.post(
    "",
    name="start_run",
    status_code=status.HTTP_201_CREATED,
    response_model=RunLease,
    responses={
        200: {"model": RunLease, "description": "An existing run was resumed."},
        **problem_responses(409),
    },
)
def start_run(body: RunCreate, memory: WriteMemory, caller: Caller) -> Response:
    """Create a run (201), or resume an existing one (200), taking its lease.

    Resuming increments the lease epoch: writes with an older epoch are
    refused from then on. A live lease (``lease_ttl``) is the holder's alone:
    the holder is the ``worker_id`` with the caller's API key, and a request
    without ``worker_id`` is a holder of its own, so any other request gets 409
    ``lease-held`` (naming the run, the owner and ``expires_at``) unless it
    sends ``steal: true``. To retake its own live lease (e.g. after a client
    restart) a caller sends the ``worker_id`` the lease answered with.

    A key bound to one user may start runs of that user only (403 otherwise);
    a ``run_id`` already taken by a run of another user is 409 ``conflict``.
    """
    require_user(caller, body.user_id)
    worker = body.worker_id if body.worker_id is not None else f"http-{secrets.token_hex(8)}"
    handle = memory.start_run(
        body.user_id,
        body.run_id,
        resume=body.resume,
        worker_id=_holder(worker, caller),
        lease_ttl=body.lease_ttl,
        steal=body.steal,
        budget_tokens=body.budget_tokens,
        budget_cost=body.budget_cost,
        external_id=body.external_id,
    )
    code = status.HTTP_200_OK if handle.resumed else status.HTTP_201_CREATED
    return json_response(
        RunLease(run=run_out(handle.info), lease_epoch=handle.epoch, worker_id=worker),
        status_code=code,
    )


def _holder(worker_id: str, caller: Principal) -> str:
    """Who holds a lease: the worker id, qualified by the caller's API key.

    The same worker id sent with another key is another holder, so a lease
    cannot be retaken by claiming its holder's name.
    """
    return worker_id if caller.key_id is None else f"{worker_id} (api-key:{caller.key_id})"


_RunsLimit = Annotated[
    int | None,
    Query(
        ge=0,
        le=10_000,
        description="At most this many runs; paged, the runs come in run-id order.",
    ),
]
_RunsAfter = Annotated[
    Id | None,
    Query(
        description="Only runs whose id sorts after this one (the last run id of the previous "
        "page); paged, the runs come in run-id order.",
    ),
]


@router.get("", name="list_runs", response_model=RunList)
def list_runs(
    memory: ReadMemory,
    caller: Caller,
    user_id: Annotated[Id | None, Query(description="Only this user's runs.")] = None,
    status_: Annotated[
        RunStatus | None, Query(alias="status", description="Only runs in this status.")
    ] = None,
    limit: _RunsLimit = None,
    after: _RunsAfter = None,
) -> Response:
    """Runs of the caller's tenant: all of them oldest first, or one page in run-id order.

    Page with ``limit`` and ``after`` (the last run id of the previous page);
    a page shorter than ``limit`` is the last. A key bound to one user lists
    that user's runs only (``user_id`` of another user: 403).
    """
    require_user(caller, user_id)
    user = user_filter(caller.user_id, user_id)
    runs = memory.list_runs(user_id=user, status=status_, limit=limit, after=after)
    return json_response(RunList(runs=[run_out(r) for r in runs]))


@router.get(":resumable", name="list_resumable_runs", response_model=RunList)
def list_resumable_runs(
    memory: ReadMemory, caller: Caller, limit: _RunsLimit = None, after: _RunsAfter = None
) -> Response:
    """Runs a worker pool should pick up: not finished, paused or blocked, and no live lease.

    Oldest last checkpoint first, or one page in run-id order (``limit`` and
    ``after``, as ``GET /v1/runs`` pages). A run blocked on an effect of
    unknown outcome (``unknown_effects`` not empty) is left out until each
    such effect is resolved: resuming it would only stop at the same effect
    again. A key bound to one user gets that user's runs only.
    """
    if caller.user_id is None:
        runs = memory.list_resumable_runs(limit=limit, after=after)
    elif limit is None and after is None:
        runs = [r for r in memory.list_resumable_runs() if r.user_id == caller.user_id]
    else:
        runs = _users_resumable_page(memory, caller.user_id, limit, after)
    return json_response(RunList(runs=[run_out(r) for r in runs]))


def _users_resumable_page(
    memory: ReadMemory, user_id: str, limit: int | None, after: str | None
) -> list[RunInfo]:
    """A page of one user's resumable runs: the tenant's pages, filtered, until it is full.

    Filtering one tenant page would give a short page before the last one.
    """
    page: list[RunInfo] = []
    while limit is None or len(page) < limit:
        want = None if limit is None else limit - len(page)
        tenant_page = memory.list_resumable_runs(limit=want, after=after)
        page += [r for r in tenant_page if r.user_id == user_id]
        if want is None or len(tenant_page) < want:
            break
        after = tenant_page[-1].run_id
    return page


@router.get(
    "/{run_id}:resume-plan",
    name="plan_resume",
    response_model=ResumePlanOut,
    responses=_NOT_FOUND,
)
def plan_resume(run_id: RunIdPath, memory: ReadMemory) -> Response:
    """Dry-run replay: what resuming the run would do now; nothing is written.

    The last committed checkpoint, the checkpoints a resume replays from the
    ledger, effects of unknown outcome and how each would be reconciled, the
    approval gate that blocks, the lease (live, whose, until when), the budget left.
    """
    plan = memory.plan_resume(run_id)
    return json_response(ResumePlanOut.model_validate(plan.model_dump()))


@router.get("/{run_id}", name="get_run", response_model=RunOut, responses=_NOT_FOUND)
def get_run(run_id: RunIdPath, memory: ReadMemory) -> Response:
    """Status and head of a run (with its last checkpoint time)."""
    return json_response(run_out(memory.get_run(run_id)))


@router.delete(
    "/{run_id}",
    name="delete_run",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=_WRITE_ERRORS,
)
def delete_run(run_id: RunIdPath, memory: WriteMemory) -> None:
    """Delete a run whole, whatever its status: head, checkpoints, events, effects (204).

    404 ``run-not-found`` if there is no such run (a repeated delete included).
    Deleting means gone: a worker still holding the run's lease gets 404
    ``run-not-found`` on its next write and cannot bring the run back; ``POST
    /v1/runs`` with the same id later starts a new run.
    """
    if not memory.delete_run(run_id):
        raise RunNotFoundError.absent(run_id, memory.tenant)


@router.post(
    "/{run_id}/checkpoints",
    name="append_checkpoint",
    status_code=status.HTTP_201_CREATED,
    response_model=CheckpointOut,
    responses={
        200: {
            "model": CheckpointOut,
            "description": "Already committed under this idempotency key.",
        },
        **_WRITE_ERRORS,
    },
)
def append_checkpoint(
    run_id: RunIdPath, body: CheckpointCreate, service: ServiceDep, memory: WriteMemory
) -> Response:
    """Commit the checkpoint of a step the caller executed (201).

    With an ``idempotency_key`` that is already committed (same step and
    input), the existing checkpoint is returned with 200 and nothing is written.
    """
    start = time.perf_counter()
    handle = memory.attach_run(run_id, body.lease_epoch, incarnation=body.incarnation)
    head_before = handle.info.head_seq
    ckpt = handle.append_checkpoint(
        body.step,
        body.output,
        input=body.input,
        idempotency_key=body.idempotency_key,
        scope=body.scope,
        state=body.state,
    )
    service.metrics.checkpoint_commit.observe(time.perf_counter() - start)
    code = status.HTTP_200_OK if ckpt.seq <= head_before else status.HTTP_201_CREATED
    return json_response(checkpoint_out(ckpt), status_code=code)


@router.get(
    "/{run_id}/checkpoints", name="run_history", response_model=CheckpointList, responses=_NOT_FOUND
)
def run_history(
    run_id: RunIdPath,
    memory: ReadMemory,
    after_seq: Annotated[
        int | None, Query(ge=0, le=2**62, description="Only checkpoints after this seq.")
    ] = None,
    before_seq: Annotated[
        int | None, Query(ge=0, le=2**62, description="Only checkpoints before this seq.")
    ] = None,
    newest_first: Annotated[
        bool, Query(description="Descending seq order: the latest checkpoints first.")
    ] = False,
    limit: Annotated[int | None, Query(ge=0, le=10_000, description="At most this many.")] = None,
) -> Response:
    """Checkpoints of a run, oldest first (page with ``after_seq``) or newest first (``before_seq``).

    The cursor of the next page is the last checkpoint's ``seq``. A page costs
    its own size, however long the run.
    """
    checkpoints = memory.run_history(
        run_id, newest_first=newest_first, limit=limit, after_seq=after_seq, before_seq=before_seq
    )
    return json_response(CheckpointList(checkpoints=[checkpoint_out(c) for c in checkpoints]))


@router.get(
    "/{run_id}/checkpoints:by-key",
    name="checkpoint_for_key",
    response_model=CheckpointOut,
    responses=_NOT_FOUND,
)
def checkpoint_for_key(
    run_id: RunIdPath,
    memory: ReadMemory,
    idempotency_key: Annotated[
        str,
        Query(
            min_length=1,
            max_length=512,
            pattern=NO_CONTROL_NON_BLANK,
            description="The idempotency key a step committed.",
        ),
    ],
) -> Response:
    """The checkpoint that committed an idempotency key on the run's current branch.

    404 ``checkpoint-not-found`` if no step on the current branch committed it
    (404 ``run-not-found`` if there is no such run).
    """
    ckpt = memory.checkpoint_for_key(run_id, idempotency_key)
    if ckpt is None:
        raise CheckpointNotFoundError(
            f"run {run_id!r} has no checkpoint for idempotency key {idempotency_key!r} on its "
            "current branch"
        )
    return json_response(checkpoint_out(ckpt))


@router.get("/{run_id}/events", name="run_events", response_model=EventList, responses=_NOT_FOUND)
def run_events(
    run_id: RunIdPath,
    memory: ReadMemory,
    after_seq: Annotated[
        int | None, Query(ge=0, le=2**62, description="Only events after this seq.")
    ] = None,
    limit: Annotated[int | None, Query(ge=0, le=10_000, description="At most this many.")] = None,
) -> Response:
    """The run's append-only event log in sequence order (page with ``after_seq``).

    The audit trail of the run: steps, effects invoked and recorded, outcomes
    unknown, budget debits, approvals, compensations (``CompensationEscalated``
    when a human must take over), status changes.
    """
    events = memory.run_events(run_id, after_seq=after_seq, limit=limit)
    return json_response(
        EventList(events=[EventOut.model_validate(e, from_attributes=True) for e in events])
    )


@router.get(
    "/{run_id}/checkpoints/{checkpoint_id}",
    name="get_checkpoint",
    response_model=CheckpointOut,
    responses=_NOT_FOUND,
)
def get_checkpoint(
    run_id: RunIdPath,
    checkpoint_id: CheckpointIdPath,
    memory: ReadMemory,
) -> Response:
    """One checkpoint of a run by its id."""
    return json_response(checkpoint_out(memory.get_checkpoint(run_id, checkpoint_id)))


@router.get(
    "/{run_id}/checkpoints/{checkpoint_id}/state",
    name="run_state_at",
    response_model=StateOut,
    responses=_NOT_FOUND,
)
def run_state_at(
    run_id: RunIdPath,
    checkpoint_id: CheckpointIdPath,
    memory: ReadMemory,
) -> Response:
    """The run's state values as of a checkpoint (every state delta up to it, along its branch)."""
    values = memory.run_state_at(run_id, checkpoint_id)
    return json_response(StateOut(run_id=run_id, checkpoint_id=checkpoint_id, values=values))


@router.post(
    "/{run_id}:update-state",
    name="update_run_state",
    status_code=status.HTTP_201_CREATED,
    response_model=CheckpointOut,
    responses=_WRITE_ERRORS,
)
def update_run_state(
    run_id: RunIdPath, body: StateUpdate, memory: WriteMemory, caller: Caller
) -> Response:
    """Append a human-edited checkpoint: the state at ``checkpoint_id`` with ``values`` set.

    The checkpoints after it leave the run's lineage (their steps run again on
    resume, their recorded effects are not repeated); the running worker's
    lease is revoked. 409 ``run-state`` for a finished run (fork it instead).
    """
    ckpt = memory.update_run_state(
        run_id,
        body.checkpoint_id,
        body.values,
        by=decided_by(body.by, caller),
        by_key=caller.key_id,
    )
    return json_response(checkpoint_out(ckpt), status_code=status.HTTP_201_CREATED)


@router.post(
    "/{run_id}/approvals",
    name="request_approval",
    response_model=ApprovalOut,
    responses={
        202: {
            "model": ApprovalPendingOut,
            "description": "The plan is frozen and the run paused until someone approves or "
            "rejects it.",
        },
        **_WRITE_ERRORS,
    },
)
def request_approval(run_id: RunIdPath, body: ApprovalRequest, memory: WriteMemory) -> Response:
    """Stop at a human-approval gate for a plan: 202 while pending, 200 with the decision.

    The first request freezes the plan (its SHA-256) and pauses the run (202);
    ``:approve`` / ``:reject`` decide; the same request (same ``key`` and plan)
    then returns the decision (200). 409 ``plan-mismatch`` for another plan
    under the same key.
    """
    handle = memory.attach_run(run_id, body.lease_epoch, incarnation=body.incarnation)
    try:
        approval = handle.await_approval(body.plan, key=body.key)
    except ApprovalPendingError as pending:
        out = ApprovalPendingOut(
            run_id=run_id, approval_key=pending.approval_key, plan_hash=pending.plan_hash
        )
        return json_response(out, status_code=status.HTTP_202_ACCEPTED)
    return json_response(ApprovalOut.model_validate(approval, from_attributes=True))


@router.post(
    "/{run_id}:complete", name="complete_run", response_model=RunOut, responses=_WRITE_ERRORS
)
def complete_run(run_id: RunIdPath, body: RunComplete, memory: WriteMemory) -> Response:
    """Mark the run completed with an optional result (needs the current lease epoch)."""
    return json_response(
        run_out(
            memory.attach_run(run_id, body.lease_epoch, incarnation=body.incarnation).complete(
                body.result
            )
        )
    )


@router.post("/{run_id}:fail", name="fail_run", response_model=RunOut, responses=_WRITE_ERRORS)
def fail_run(run_id: RunIdPath, body: RunFail, memory: WriteMemory) -> Response:
    """Mark the run failed with an error message (needs the current lease epoch)."""
    return json_response(
        run_out(
            memory.attach_run(run_id, body.lease_epoch, incarnation=body.incarnation).fail(
                body.error
            )
        )
    )


@router.post("/{run_id}:cancel", name="cancel_run", response_model=RunOut, responses=_WRITE_ERRORS)
def cancel_run(run_id: RunIdPath, memory: WriteMemory) -> Response:
    """Cancel the run: its worker stops at its next step boundary. Cancelling twice does nothing."""
    return json_response(run_out(memory.cancel_run(run_id)))


def decided_by(by: str | None, caller: Principal) -> str:
    """Who decides, as the caller names them; else the caller's API key.

    The name is a claim: every decision also records ``by_key``, the id of the
    key the request was authenticated with (``None`` with auth off).
    """
    if by is not None:
        return by
    return f"api-key:{caller.key_id}" if caller.key_id else "api"


@router.post(
    "/{run_id}:set-budget", name="set_budget", response_model=RunOut, responses=_WRITE_ERRORS
)
def set_budget(
    run_id: RunIdPath, body: BudgetUpdate, memory: WriteMemory, caller: Caller
) -> Response:
    """Change the run's token and/or cost budget: how a run that spent its budget goes on.

    A member left out keeps its limit; null removes it. The run's worker may
    step again at once (its refused step is retried as usual). 422 for a body
    with neither member or a bad value (negative, not finite, not a number, a
    fractional or boolean token budget). The ``BudgetSet`` event records the
    new limits with ``by`` and ``by_key``.
    """
    given = body.model_fields_set
    info = memory.set_budget(
        run_id,
        tokens=body.budget_tokens if "budget_tokens" in given else UNSET,
        cost=body.budget_cost if "budget_cost" in given else UNSET,
        by=decided_by(body.by, caller),
        by_key=caller.key_id,
    )
    return json_response(run_out(info))


@router.post(
    "/{run_id}:approve", name="approve_run", response_model=ApprovalOut, responses=_WRITE_ERRORS
)
def approve_run(
    run_id: RunIdPath, body: ApprovalDecision, memory: WriteMemory, caller: Caller
) -> Response:
    """Approve the plan a paused run waits on; the run becomes resumable and passes its gate.

    409 ``plan-mismatch`` if ``plan_hash`` is not the plan the run waits on.
    """
    approval = memory.approve_run(
        run_id, body.plan_hash, by=decided_by(body.by, caller), note=body.note, by_key=caller.key_id
    )
    return json_response(ApprovalOut.model_validate(approval, from_attributes=True))


@router.post(
    "/{run_id}:reject", name="reject_run", response_model=ApprovalOut, responses=_WRITE_ERRORS
)
def reject_run(
    run_id: RunIdPath, body: ApprovalDecision, memory: WriteMemory, caller: Caller
) -> Response:
    """Reject the plan a paused run waits on; its worker sees the rejection at the gate."""
    approval = memory.reject_run(
        run_id, body.plan_hash, by=decided_by(body.by, caller), note=body.note, by_key=caller.key_id
    )
    return json_response(ApprovalOut.model_validate(approval, from_attributes=True))


@router.post(
    "/{run_id}:fork",
    name="fork_run",
    status_code=status.HTTP_201_CREATED,
    response_model=RunOut,
    responses=_WRITE_ERRORS,
)
def fork_run(run_id: RunIdPath, body: RunFork, memory: WriteMemory) -> Response:
    """Start a new run from one of this run's checkpoints; the new run links back to it."""
    info = memory.fork_run(run_id, body.checkpoint_id, body.new_run_id)
    return json_response(run_out(info), status_code=status.HTTP_201_CREATED)


@router.post(
    "/{run_id}:heartbeat",
    name="heartbeat_run",
    response_model=HeartbeatOut,
    responses=_WRITE_ERRORS,
)
def heartbeat_run(run_id: RunIdPath, body: LeaseRef, memory: WriteMemory) -> Response:
    """Renew a lease taken with ``lease_ttl``; 409 ``stale-lease`` once another worker took it."""
    expires = memory.attach_run(run_id, body.lease_epoch, incarnation=body.incarnation).heartbeat()
    return json_response(
        HeartbeatOut(run_id=run_id, lease_epoch=body.lease_epoch, lease_expires_at=expires)
    )
