"""Recall and context read the times a query names relative to the request's ``now`` (issue 19)."""

from __future__ import annotations

from tests.api.conftest import Api, new_tenant

TOPICS = [
    "Planning a vegetable garden: which seeds to order",
    "A cover letter for a junior data analyst position",
    "A segmentation fault when a C program frees a list",
    "Running shoes for a first half marathon",
    "A three-day itinerary for a city break in Vienna",
    "A sourdough starter that smells like nail polish remover",
]


def test_a_month_in_the_query_is_read_relative_to_the_requests_now(api: Api) -> None:
    headers = api.key(new_tenant())
    c = api.client
    for month, topic in enumerate(TOPICS, start=1):
        body = {
            "session_id": f"m{month:02d}",
            "summary": {"task_description": topic},
            "created_at": f"2024-{month:02d}-12T18:00:00Z",
        }
        assert c.post("/v1/users/u1/sessions", json=body, headers=headers).status_code == 201
    query = {"query": "What did I say last March?", "top_k": 1}
    recall = c.post(
        "/v1/users/u1/sessions:recall",
        json={**query, "now": "2024-11-30T09:00:00+01:00"},
        headers=headers,
    )
    assert recall.status_code == 200
    assert [hit["session"]["session_id"] for hit in recall.json()["results"]] == ["m03"]
    context = c.post(
        "/v1/users/u1/context", json={**query, "now": "2024-11-30T08:00:00"}, headers=headers
    ).json()
    # The most recent session, and the one ranked first for the query.
    assert context["sections"][-1]["items"] == ["m06", "m03"]


def test_a_now_that_is_not_a_time_is_422_naming_it(api: Api) -> None:
    headers = api.key(new_tenant())
    for path in ("/v1/users/u1/sessions:recall", "/v1/users/u1/context"):
        r = api.client.post(path, json={"query": "x", "now": "last week"}, headers=headers)
        assert r.status_code == 422
        assert "now" in r.text
