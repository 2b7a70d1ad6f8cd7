"""User facts and preferences: ``/v1/users/{user_id}/facts``, and forgetting a user."""

from __future__ import annotations

from fastapi import APIRouter, Request, Response, status
from pydantic import TypeAdapter

from api.deps import ReadMemory, WriteMemory
from api.errors import problem_responses
from api.responses import json_response
from api.schemas.common import FactKeyPath, UserIdPath
from api.schemas.facts import FactList, FactOut, FactPut, FactsPut
from api.state import ServiceState
from tiers.errors import FactNotFoundError
from tiers.models import UserFact

router = APIRouter(
    prefix="/v1/users/{user_id}",
    tags=["facts"],
    responses=problem_responses(400, 401, 403, 409, 413, 422, 500, 503),
)

_NOT_FOUND = problem_responses(404)


_FACTS = TypeAdapter(list[UserFact])
_FACT_OUT_FIELDS = {"__all__": set(FactOut.model_fields)}


def _out(fact: UserFact) -> FactOut:
    return FactOut.model_validate(fact, from_attributes=True)


def _list(facts: list[UserFact]) -> Response:
    """``FactList`` JSON, serialized straight from the validated records.

    Byte for byte what ``FactList(facts=[_out(f) ...]).model_dump_json()`` gives
    (a test pins it), without building and validating a second model per fact.
    """
    body = b'{"facts":' + _FACTS.dump_json(facts, include=_FACT_OUT_FIELDS) + b"}"
    return Response(content=body, media_type="application/json")


@router.get("/facts", name="get_facts", response_model=FactList)
async def get_facts(user_id: UserIdPath, memory: ReadMemory, request: Request) -> Response:
    """Every current fact of the user, sorted by key (empty for an unknown user)."""
    # The hottest read: an async route, so no hop through anyio's thread pool; the read
    # itself runs where ServiceState.read decides. The service comes from the request:
    # one dependency less to solve.
    service: ServiceState = request.app.state.tiermem
    return _list(await service.read(memory.get_facts, user_id))


@router.put("/facts", name="set_facts", response_model=FactList)
def set_facts(user_id: UserIdPath, body: FactsPut, memory: WriteMemory) -> Response:
    """Set several facts; each keeps its old value in its history. Returns them in request order.

    All or nothing: every fact is validated (JSON value, size limit) before
    any is written, so one bad or too large fact changes nothing (the
    problem's ``field`` is ``facts.<key>``).
    """
    return _list(memory.set_facts(user_id, body.facts, source=body.source))


@router.delete(
    "/facts", name="delete_facts", status_code=status.HTTP_204_NO_CONTENT, response_class=Response
)
def delete_facts(user_id: UserIdPath, memory: WriteMemory) -> None:
    """Forget every fact of the user, history included (sessions stay)."""
    memory.delete_facts(user_id)


@router.get("/facts/{key}", name="get_fact", response_model=FactOut, responses=_NOT_FOUND)
def get_fact(user_id: UserIdPath, key: FactKeyPath, memory: ReadMemory) -> Response:
    """One current fact."""
    return json_response(_out(memory.get_fact(user_id, key)))


@router.put("/facts/{key}", name="set_fact", response_model=FactOut)
def set_fact(user_id: UserIdPath, key: FactKeyPath, body: FactPut, memory: WriteMemory) -> Response:
    """Set one fact; the value it replaces goes to its history."""
    fact = memory.set_fact(
        user_id,
        key,
        body.value,
        source=body.source,
        confidence=body.confidence,
        evidence=body.evidence,
    )
    return json_response(_out(fact))


@router.delete(
    "/facts/{key}",
    name="delete_fact",
    status_code=status.HTTP_204_NO_CONTENT,
    response_class=Response,
    responses=_NOT_FOUND,
)
def delete_fact(user_id: UserIdPath, key: FactKeyPath, memory: WriteMemory) -> None:
    """Delete one fact (its history keeps a tombstone); 404 if there was none."""
    if not memory.delete_fact(user_id, key):
        raise FactNotFoundError(f"user {user_id!r} has no fact {key!r}")


@router.get("/facts/{key}/history", name="fact_history", response_model=FactList)
def fact_history(user_id: UserIdPath, key: FactKeyPath, memory: ReadMemory) -> Response:
    """Every version of the fact, oldest first (deletions have source 'deleted', value null)."""
    return _list(memory.fact_history(user_id, key))


@router.delete(
    "", name="forget_user", status_code=status.HTTP_204_NO_CONTENT, response_class=Response
)
def forget_user(user_id: UserIdPath, memory: WriteMemory) -> None:
    """Delete everything stored about the user: facts and their history, sessions, owned items,
    runs and summary jobs. A summary still being made for the user is not saved."""
    memory.forget_user(user_id)
