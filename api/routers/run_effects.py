"""Routes of a run's effect ledger: read it, and the two-phase effects of stateless workers
(begin, record) and an operator's resolution of an effect of unknown outcome."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from api.deps import Caller, ReadMemory, WriteMemory
from api.errors import problem_responses
from api.responses import json_response
from api.routers.runs import decided_by, effect_out
from api.schemas.common import NO_CONTROL_NON_BLANK, RunIdPath
from api.schemas.runs import (
    EffectBegin,
    EffectBeginOut,
    EffectList,
    EffectOut,
    EffectRecordCreate,
    EffectResolve,
)
from tiers.task import UNSET, Charged

router = APIRouter(
    prefix="/v1/runs",
    tags=["runs"],
    responses=problem_responses(400, 401, 403, 413, 422, 500, 503),
)

_NOT_FOUND = problem_responses(404)
_WRITE_ERRORS = problem_responses(404, 409)


@router.get(
    "/{run_id}/effects", name="run_effects", response_model=EffectList, responses=_NOT_FOUND
)
def run_effects(
    run_id: RunIdPath,
    memory: ReadMemory,
    after_key: Annotated[
        str | None,
        Query(
            min_length=1,
            max_length=512,
            pattern=NO_CONTROL_NON_BLANK,
            description="Only effects whose idempotency key sorts after this one.",
        ),
    ] = None,
    limit: Annotated[int | None, Query(ge=0, le=10_000, description="At most this many.")] = None,
) -> Response:
    """The run's effect ledger in idempotency-key order: every external effect, its status and
    recorded output (page with ``limit`` and ``after_key``, the last key of the previous page)."""
    effects = memory.run_effects(run_id, after_key=after_key, limit=limit)
    return json_response(EffectList(effects=[effect_out(r) for r in effects]))


@router.post(
    "/{run_id}/effects:begin",
    name="begin_effect",
    response_model=EffectBeginOut,
    responses=_WRITE_ERRORS,
)
def begin_effect(run_id: RunIdPath, body: EffectBegin, memory: WriteMemory) -> Response:
    """Begin an effect the caller performs itself: ``invoke`` says whether to perform it.

    ``invoke: true``: ``EffectInvoked`` is durable; perform the effect (pass
    ``idempotency_key`` to the external system), then ``effects:record``.
    ``invoke: false``: already recorded; use ``output`` and do not perform it.
    409 ``effect-outcome-unknown`` (naming ``effect_key``) when it was begun
    before and never recorded: it may or may not have happened; reconcile it
    with ``effects:resolve``. An effect is a checkpointed step of its own.
    """
    start = memory.attach_run(run_id, body.lease_epoch, incarnation=body.incarnation).begin_effect(
        body.name,
        idempotency_key=body.idempotency_key,
        input=body.input,
        safe_to_retry=body.safe_to_retry,
    )
    return json_response(
        EffectBeginOut(idempotency_key=start.key, invoke=start.invoke, output=start.output)
    )


@router.post(
    "/{run_id}/effects:record",
    name="record_effect",
    response_model=EffectOut,
    responses=_WRITE_ERRORS,
)
def record_effect(run_id: RunIdPath, body: EffectRecordCreate, memory: WriteMemory) -> Response:
    """Record the result of an effect begun with ``effects:begin``, with its checkpoint.

    Recording the same output again (a retried request) changes nothing. If
    the run was cancelled while the effect ran, the result is still recorded
    (the call happened), then 409 ``run-cancelled`` tells the worker to stop.
    """
    handle = memory.attach_run(
        run_id, body.lease_epoch, incarnation=body.incarnation, finished_ok=True
    )
    handle.record_effect(
        body.idempotency_key,
        Charged(body.output, tokens=body.tokens, cost=body.cost, state=body.state),
    )
    return json_response(effect_out(memory.get_effect(run_id, body.idempotency_key)))


@router.post(
    "/{run_id}/effects:resolve",
    name="resolve_effect",
    response_model=EffectOut,
    responses=_WRITE_ERRORS,
)
def resolve_effect(
    run_id: RunIdPath, body: EffectResolve, memory: WriteMemory, caller: Caller
) -> Response:
    """An operator's decision on an effect of unknown outcome; it unblocks the run.

    Give ``output`` (it happened: the run gets this output without performing
    it) or ``rerun: true`` (it did not: the run performs it again), not both.
    409 ``run-state`` if the effect's outcome is not unknown.
    """
    output = body.output if "output" in body.model_fields_set else UNSET
    rec = memory.resolve_effect(
        run_id,
        body.idempotency_key,
        output=output,
        rerun=body.rerun,
        by=decided_by(body.by, caller),
        by_key=caller.key_id,
    )
    return json_response(effect_out(rec))
