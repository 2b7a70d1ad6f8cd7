"""Erasure through the service: after ``DELETE /v1/users/{id}`` no route gives back anything of
the user, a background summary in flight included (it writes nothing back), and the user's
jobs, in flight or finished, are gone too (404)."""

from __future__ import annotations

from typing import Any

from tests.api.conftest import Api, new_tenant
from tests.api.test_routes import wait_job
from tests.memory.test_erasure import BlockingSummarizer
from tests.waiting import wait_until

FACT = "quokkafactzanzibar"
SESSION = "marmosetsessionlagos"
IN_FLIGHT = "pangolininflightquito"
RUN = "okapirunvaduz"
EVERY = (FACT, SESSION, IN_FLIGHT, RUN)
OTHER = "wombatotheruserbamako"


def post_transcript(api: Api, headers: dict[str, str], user: str, sid: str, text: str) -> Any:
    r = api.client.post(
        f"/v1/users/{user}/sessions",
        json={"session_id": sid, "transcript": [{"role": "user", "content": text}]},
        headers=headers,
    )
    assert r.status_code == 202, r.text
    return r.json()


def everything_said_about(api: Api, headers: dict[str, str], user: str, jobs: list[str]) -> str:
    """The bodies of every route that reads a user's data, concatenated."""
    c = api.client
    bodies = [
        c.get(f"/v1/users/{user}/facts", headers=headers),
        c.get(f"/v1/users/{user}/facts/nickname", headers=headers),
        c.get(f"/v1/users/{user}/facts/nickname/history", headers=headers),
        c.get(f"/v1/users/{user}/sessions", headers=headers),
        c.get(f"/v1/users/{user}/sessions/s1", headers=headers),
        c.get(f"/v1/users/{user}/sessions/late", headers=headers),
        c.get(f"/v1/users/{user}/sessions:pending", headers=headers),
        c.post(
            f"/v1/users/{user}/sessions:recall",
            json={"query": " ".join((*EVERY, OTHER))},
            headers=headers,
        ),
        c.post(
            f"/v1/users/{user}/context", json={"query": " ".join((*EVERY, OTHER))}, headers=headers
        ),
        c.get("/v1/runs", params={"user_id": user}, headers=headers),
        c.get(f"/v1/runs/run-{user}", headers=headers),
        c.get(f"/v1/runs/run-{user}/checkpoints", headers=headers),
        c.get(f"/v1/runs/run-{user}/events", headers=headers),
        *(c.get(url, headers=headers) for url in jobs),
    ]
    return "\n".join(r.text for r in bodies)


def test_forgetting_a_user_over_http_leaves_no_route_with_their_data(api: Api) -> None:
    c = api.client
    tenant = new_tenant()
    headers = api.key(tenant)
    tenant_memory = api.service.view(tenant)
    jobs: list[str] = []
    for user, fact, said, step in (("alice", FACT, SESSION, RUN), ("bob", OTHER, OTHER, OTHER)):
        r = c.put(f"/v1/users/{user}/facts/nickname", json={"value": fact}, headers=headers)
        assert r.status_code == 200, r.text
        job = post_transcript(api, headers, user, "s1", f"I prefer {said} tea.")
        assert wait_job(api, headers, job["status_url"])["status"] == "succeeded"
        jobs.append(job["status_url"])
        r = c.post("/v1/runs", json={"user_id": user, "run_id": f"run-{user}"}, headers=headers)
        assert r.status_code == 201, r.text
        r = c.post(
            f"/v1/runs/run-{user}/checkpoints",
            json={"lease_epoch": r.json()["lease_epoch"], "step": "note", "output": {"n": step}},
            headers=headers,
        )
        assert r.status_code == 201, r.text
    before = everything_said_about(api, headers, "alice", jobs[:1])
    assert [word for word in (FACT, SESSION, RUN) if word not in before] == []

    summarizer = BlockingSummarizer()
    tenant_memory.summarizer = summarizer
    late = post_transcript(api, headers, "alice", "late", f"I prefer {IN_FLIGHT} sandwiches.")
    assert summarizer.entered.wait(30)
    assert c.delete("/v1/users/alice", headers=headers).status_code == 204
    # The user's jobs went with the user: the one in flight, and the one finished before.
    assert c.get(late["status_url"], headers=headers).status_code == 404
    assert c.get(jobs[0], headers=headers).status_code == 404
    summarizer.release.set()
    # Its worker, finishing, found its job gone and wrote nothing back.
    lost = 'tiermem_summary_job_attempts_total{outcome="lost"} 1.0'
    wait_until(
        lambda: lost in c.get("/metrics").text, what="the job in flight to end", every_s=0.05
    )
    assert c.get(late["status_url"], headers=headers).status_code == 404
    jobs.append(late["status_url"])

    said = everything_said_about(api, headers, "alice", jobs)
    assert [word for word in EVERY if word in said] == []
    # The search works, and the other user keeps everything.
    assert OTHER in everything_said_about(api, headers, "bob", jobs[1:2])
