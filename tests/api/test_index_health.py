"""The service notices a lost vector index, says so, and gets it repaired without a restart.

Issue 13, defect 6: with its index gone, the service kept answering recall in
keyword (here: recency) order while ``/readyz`` said ok. Now a periodic check
compares each tenant's index with the KV store: ``/readyz`` turns ``degraded``
with the damage counted, ``tiermem_index_*`` metrics name the tenants, and the
index is repaired while the service runs, by the service itself (a bounded
batch per check) or by ``tiermem reindex --all-tenants --damaged`` beside it
(Redis and a Chroma server: no data dir to lock). Each recall query shares no
word with the session it should find, which is the user's oldest.
"""

from __future__ import annotations

import re
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import chromadb
import pytest
from chromadb.config import Settings as ChromaSettings
from typer.testing import CliRunner

from memory.cli import app as cli
from memory.settings import Settings
from tests.api.conftest import Api, start_app
from tests.memory.test_index_repair import TOPICS
from tests.servers import ChromaServer, chroma_binary
from tests.waiting import wait_until
from tiers.backends.chroma_index import DEFAULT_COLLECTION

BASE = datetime(2025, 3, 1, tzinfo=UTC)
WAIT_S = 60.0
POLL_S = 0.05  # a poll is an HTTP request (/metrics, /readyz)


def seed(api: Api) -> dict[str, dict[str, str]]:
    """Each tenant's sessions, oldest first, through the API; returns each tenant's headers."""
    headers = {tenant: api.key(tenant) for tenant in TOPICS}
    for tenant, (topics, _) in TOPICS.items():
        for n, topic in enumerate(topics):
            created = api.client.post(
                "/v1/users/u1/sessions",
                json={
                    "session_id": f"s{n}",
                    "summary": {"task_description": topic},
                    "created_at": (BASE + timedelta(days=n)).isoformat(),
                },
                headers=headers[tenant],
            )
            assert created.status_code == 201, created.text
    assert api.service.memory.flush(60)
    return headers


def recalled(api: Api, headers: dict[str, str], query: str) -> list[str]:
    answer = api.client.post(
        "/v1/users/u1/sessions:recall", json={"query": query, "top_k": 3}, headers=headers
    )
    assert answer.status_code == 200, answer.text
    return [hit["session"]["session_id"] for hit in answer.json()["results"]]


def gauge(api: Api, name: str, tenant: str) -> float | None:
    found = re.search(
        rf'^{name}{{tenant="{tenant}"}} (\S+)$', api.client.get("/metrics").text, re.M
    )
    return None if found is None else float(found.group(1))


def counter(api: Api, name: str, kind: str) -> float:
    text = api.client.get("/metrics").text
    found = re.search(rf'^{name}_total{{kind="{kind}"}} (\S+)$', text, re.M)
    return 0.0 if found is None else float(found.group(1))


def checked_clean(api: Api) -> bool:
    return all(gauge(api, "tiermem_index_missing_vectors", t) == 0.0 for t in TOPICS)


def test_the_service_reports_a_dropped_collection_and_repairs_it_in_bounded_batches(
    tmp_path: Path,
) -> None:
    settings = Settings(
        data_dir=tmp_path / "data",
        auth_cache_seconds=0,
        # A check reports what its repair left, so the partly repaired index shows for one
        # interval only: long enough that a loaded machine's polling does not miss it.
        index_check_interval_seconds=3,
        index_repair_batch=2,  # per tenant and check: three rounds for six sessions
    )
    with start_app(settings) as api:
        headers = seed(api)
        wait_until(lambda: checked_clean(api), WAIT_S, what="a clean index check", every_s=POLL_S)
        assert api.client.get("/readyz").json()["status"] == "ok"

        # The collection goes under the running service (as a manual delete would do it).
        client = chromadb.PersistentClient(
            path=str(tmp_path / "data" / "chroma"),
            settings=ChromaSettings(anonymized_telemetry=False),
        )
        client.delete_collection(DEFAULT_COLLECTION)

        seen_damaged: set[str] = set()
        missing_reported: list[int] = []

        def repaired() -> bool:
            ready = api.client.get("/readyz")
            assert ready.status_code == 200, ready.text  # degraded serves: 200
            body = ready.json()
            if body["status"] == "degraded":
                assert body["index_damage"]["stale"] == body["index_damage"]["orphans"] == 0
                assert "out of line with the KV store" in body["index_reason"]
                assert "acme" not in ready.text  # anonymous callers see counts, not tenants
                missing_reported.append(body["index_damage"]["missing"])
            for tenant in TOPICS:
                if (gauge(api, "tiermem_index_missing_vectors", tenant) or 0.0) > 0:
                    seen_damaged.add(tenant)
            return body["status"] == "ok" and bool(missing_reported)

        wait_until(
            repaired,
            WAIT_S,
            what="the service to report, then repair, the lost index",
            every_s=POLL_S,
        )
        assert seen_damaged == set(TOPICS)
        # Bounded: a check left part of the damage for the next one.
        assert any(0 < missing < 6 for missing in missing_reported), missing_reported
        assert counter(api, "tiermem_index_repaired", "sessions") >= 6
        for tenant, (_, query) in TOPICS.items():
            assert recalled(api, headers[tenant], query)[0] == "s0"


@pytest.mark.slow
def test_a_chroma_server_restarted_empty_is_reported_and_repaired_beside_the_live_service(
    tmp_path: Path, redis_url: str, monkeypatch: pytest.MonkeyPatch
) -> None:
    binary = chroma_binary()
    server = ChromaServer(binary, tmp_path / "chroma-1")
    try:
        settings = Settings(
            data_dir=tmp_path / "data",
            kv_url=redis_url,
            vector_url=server.url,
            auth_cache_seconds=0,
            index_check_interval_seconds=0.3,
            index_repair_batch=0,  # report only: the operator repairs
        )
        with start_app(settings) as api:
            headers = seed(api)
            wait_until(
                lambda: checked_clean(api), WAIT_S, what="a clean index check", every_s=POLL_S
            )

            server.stop()
            server = ChromaServer(binary, tmp_path / "chroma-2", port=server.port)

            def degraded() -> dict[str, Any] | None:
                # Tenants are checked one at a time, each report kept as it comes (and one
                # whose check met the restart mid-way keeps its last, clean one until the next
                # pass): wait until the check has seen both tenants' loss.
                body: dict[str, Any] = api.client.get("/readyz").json()
                damage = body.get("index_damage") or {}
                return body if damage.get("tenants") == 2 else None

            body = wait_until(
                degraded,
                WAIT_S,
                what="/readyz to report the lost index of both tenants",
                every_s=POLL_S,
            )
            assert body["status"] == "degraded"
            assert body["index_damage"] == {"tenants": 2, "missing": 6, "stale": 0, "orphans": 0}
            assert body["checks"]["index"] == "ok"  # Chroma answers: it is just empty
            for tenant, (_, query) in TOPICS.items():
                assert gauge(api, "tiermem_index_missing_vectors", tenant) == 3.0
                # What users got, silently, before: recency order, the session asked for last.
                assert recalled(api, headers[tenant], query) == ["s2", "s1", "s0"]

            monkeypatch.setenv("TIERMEM_DATA_DIR", str(tmp_path / "cli"))
            monkeypatch.setenv("TIERMEM_KV_URL", redis_url)
            monkeypatch.setenv("TIERMEM_VECTOR_URL", server.url)
            check = CliRunner().invoke(cli, ["reindex", "--all-tenants", "--check"])
            assert check.exit_code == 1, check.output
            assert "tenant acme: index DAMAGED: 3 vectors expected, 3 missing" in check.stdout
            assert "tenant globex: index DAMAGED" in check.stdout
            repair = CliRunner().invoke(cli, ["reindex", "--all-tenants", "--damaged"])
            assert repair.exit_code == 0, repair.output
            assert "tenant acme: index consistent" in repair.stdout
            assert "tenant globex: index consistent" in repair.stdout

            wait_until(
                lambda: api.client.get("/readyz").json()["status"] == "ok",
                WAIT_S,
                what="/readyz to see the repaired index",
                every_s=POLL_S,
            )
            assert checked_clean(api)
            for tenant, (_, query) in TOPICS.items():
                # The service dropped what it had cached while the index was empty.
                assert recalled(api, headers[tenant], query)[0] == "s0"
    finally:
        server.stop()
