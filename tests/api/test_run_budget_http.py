"""A run's budget over HTTP: a spent budget is raised with ``:set-budget`` and the run steps again."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api, new_tenant
from tests.api.test_errors import assert_problem
from tests.api.test_runs_http import Worker


def _key_id(headers: dict[str, str]) -> str:
    return headers["Authorization"].removeprefix("Bearer tmk_")[:12]


def _spent(api: Api, headers: dict[str, str], run_id: str) -> Worker:
    """A run of u1 whose 10-token budget one effect spent (its cost budget, 5, is not).

    Its next effect is refused (409 budget-exceeded); a checkpoint of a step the
    caller ran already is still recorded.
    """
    w = Worker(api, headers, run_id, budget_tokens=10, budget_cost=5.0)
    begin = w.post("/effects:begin", name="llm", idempotency_key="k1")
    assert begin.json()["invoke"] is True, begin.text
    record = w.post("/effects:record", idempotency_key="k1", output="a", tokens=10)
    assert record.status_code == 200, record.text
    return w


def test_a_spent_budget_is_raised_over_http_and_the_run_steps_again(api: Api) -> None:
    tenant = new_tenant()
    worker_key, operator = api.key(tenant), api.key(tenant)
    w = _spent(api, worker_key, "spent-1")
    more = {"name": "llm", "idempotency_key": "k2"}
    refused = w.post("/effects:begin", **more)
    body = assert_problem(refused, 409, "budget-exceeded")
    assert "10 of 10 tokens" in body["detail"]
    assert "POST /v1/runs/spent-1:set-budget" in body["detail"]
    assert "Memory." not in body["detail"]
    assert "TaskTier" not in body["detail"]

    raised = api.client.post(
        "/v1/runs/spent-1:set-budget", json={"budget_tokens": 100, "by": "ops"}, headers=operator
    )
    assert raised.status_code == 200, raised.text
    run = raised.json()
    assert (run["budget_tokens"], run["budget_cost"], run["spent_tokens"]) == (100, 5.0, 10)
    assert w.post("/effects:begin", **more).json()["invoke"] is True

    # null removes a limit; a member left out keeps its own.
    unlimited = api.client.post(
        "/v1/runs/spent-1:set-budget", json={"budget_cost": None}, headers=operator
    ).json()
    assert (unlimited["budget_tokens"], unlimited["budget_cost"]) == (100, None)
    assert w.get().json()["budget_cost"] is None

    # The event log keeps who changed it: the claimed name and the authenticated key.
    events = w.get("/events").json()["events"]
    changes = [e["data"] for e in events if e["kind"] == "BudgetSet"]
    op_id = _key_id(operator)
    assert changes == [
        {"budget_tokens": 100, "by": "ops", "by_key": op_id},
        {"budget_cost": None, "by": f"api-key:{op_id}", "by_key": op_id},
    ]


BAD_BODIES = [
    pytest.param("{}", "budget_tokens", id="neither"),
    pytest.param('{"budget_tokens": -1}', "budget_tokens", id="negative"),
    pytest.param('{"budget_tokens": 1.5}', "budget_tokens", id="fraction"),
    pytest.param('{"budget_tokens": 5.0}', "budget_tokens", id="float"),
    pytest.param('{"budget_tokens": true}', "budget_tokens", id="bool"),
    pytest.param('{"budget_tokens": "500"}', "budget_tokens", id="string"),
    pytest.param('{"budget_tokens": 4611686018427387905}', "budget_tokens", id="too-big"),
    pytest.param('{"budget_cost": -0.5}', "budget_cost", id="negative-cost"),
    pytest.param('{"budget_cost": NaN}', "budget_cost", id="nan"),
    pytest.param('{"budget_cost": Infinity}', "budget_cost", id="infinity"),
    pytest.param('{"budget_cost": false}', "budget_cost", id="bool-cost"),
    pytest.param('{"budget_cost": "1.5"}', "budget_cost", id="string-cost"),
    pytest.param('{"budget_cost": [1]}', "budget_cost", id="list-cost"),
    pytest.param('{"budget_tokens": 5, "tokens": 5}', "tokens", id="unknown-member"),
    pytest.param('{"budget_tokens": 5, "by": " "}', "by", id="blank-by"),
]


@pytest.mark.parametrize(("raw", "field"), BAD_BODIES)
def test_a_bad_budget_is_a_422_naming_the_field_and_changes_nothing(
    api: Api, headers: dict[str, str], raw: str, field: str
) -> None:
    w = _spent(api, headers, "bad-budget")
    before = w.get().json()
    r = api.client.post(
        "/v1/runs/bad-budget:set-budget",
        content=raw,
        headers={**headers, "Content-Type": "application/json"},
    )
    body = assert_problem(r, 422)
    assert body["field"] == field, body
    assert w.get().json() == before
    assert "BudgetSet" not in {e["kind"] for e in w.get("/events").json()["events"]}
    if raw == "{}":  # the library's advice, in the body's terms
        assert '"budget_tokens", "budget_cost" or both' in body["detail"], body


def test_who_may_raise_a_budget(api: Api) -> None:
    tenant = new_tenant()
    admin = api.key(tenant)
    _spent(api, admin, "u1-run")
    raise_it = {"budget_tokens": 50}

    reader = api.key(tenant, read_only=True)
    r = api.client.post("/v1/runs/u1-run:set-budget", json=raise_it, headers=reader)
    assert "--read-only" in assert_problem(r, 403, "forbidden")["detail"]

    # A key bound to another user: the run is absent for it, word for word.
    key, _ = api.service.keys.create(tenant, user_id="u2")
    other = {"Authorization": f"Bearer {key}"}
    hidden = api.client.post("/v1/runs/u1-run:set-budget", json=raise_it, headers=other)
    absent = api.client.post("/v1/runs/absent-1:set-budget", json=raise_it, headers=other)
    assert assert_problem(hidden, 404, "run-not-found")["detail"] == assert_problem(
        absent, 404, "run-not-found"
    )["detail"].replace("absent-1", "u1-run")
    assert api.client.get("/v1/runs/u1-run", headers=admin).json()["budget_tokens"] == 10

    # Bound to the run's own user: allowed.
    key, _ = api.service.keys.create(tenant, user_id="u1")
    own = {"Authorization": f"Bearer {key}"}
    r = api.client.post("/v1/runs/u1-run:set-budget", json=raise_it, headers=own)
    assert (r.status_code, r.json()["budget_tokens"]) == (200, 50), r.text
