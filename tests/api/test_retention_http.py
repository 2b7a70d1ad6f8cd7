"""The service's periodic sweep applies each tenant's retention and counts what it deleted."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest

from memory import SessionSummary
from memory.settings import Settings
from tests.api.conftest import new_tenant, start_app
from tests.waiting import wait_until


@pytest.mark.parametrize("backend", ["embedded", "redis"])
def test_the_service_sweeps_every_tenant_with_its_own_retention(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    kv_url = request.getfixturevalue("redis_url") if backend == "redis" else None
    settings = Settings(
        data_dir=tmp_path,
        kv_url=kv_url,
        retention_sessions_days=30,  # the default; one tenant turns it off, one adds facts
        run_sweep_interval_seconds=0.05,
    )
    now = datetime.now(UTC)
    with start_app(settings) as api:
        strict, lax = new_tenant(), new_tenant()
        headers = {tenant: api.key(tenant) for tenant in (strict, lax)}
        api.service.view(lax).set_retention(sessions="off")
        api.service.view(strict).set_retention(facts="7d")
        for tenant in (strict, lax):
            view = api.service.view(tenant)
            for session_id, days in (("old", 100), ("recent", 1)):
                view.save_session(
                    SessionSummary(
                        user_id="u1",
                        session_id=session_id,
                        task_description=f"session {session_id}",
                        created_at=now - timedelta(days=days),
                    )
                )
            view.users.set_fact("u1", "k", "v", updated_at=now - timedelta(days=20))

        c = api.client
        url = "/v1/users/u1"
        wait_until(
            lambda: (
                c.get(f"{url}/sessions/old", headers=headers[strict]).status_code == 404
                and c.get(f"{url}/facts/k", headers=headers[strict]).status_code == 404
            ),
            what="the service to sweep the expired data",
            every_s=0.05,
        )
        assert c.get(f"{url}/sessions/recent", headers=headers[strict]).status_code == 200
        listed = c.get(f"{url}/sessions", headers=headers[lax]).json()["sessions"]
        assert {s["session_id"] for s in listed} == {"old", "recent"}  # sessions off in lax
        assert c.get(f"{url}/facts/k", headers=headers[lax]).json()["value"] == "v"
        metrics = c.get("/metrics").text
        assert 'tiermem_retention_deleted_total{kind="sessions"} 1.0' in metrics
        assert 'tiermem_retention_deleted_total{kind="facts"} 1.0' in metrics
