"""The service's per-request shortcuts keep their contracts: exact bodies, fresh auth, unique ids."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path

import pytest

from api.schemas.facts import FactList, FactOut
from memory.apikeys import ApiKeyRegistry, InvalidApiKeyError
from memory.facade import Memory
from memory.settings import Settings
from tests.api.conftest import Api, new_tenant, start_app
from tiers.backends.sqlite_kv import SqliteKVStore

FACTS = "/v1/users/u1/facts"


def test_fact_list_body_is_byte_for_byte_the_schema_model(api: Api) -> None:
    tenant = new_tenant()
    headers = api.key(tenant)
    facts = {
        "language": "fr",
        "stack": {"db": "postgres", "langs": ["python", "go"]},
        "budget": 12.5,
        "ok": True,
        "none": None,
        "greeting": 'héllo \u2014 \U0001f600 "quoted"',
    }
    assert api.client.put(FACTS, json={"facts": facts}, headers=headers).status_code == 200
    r = api.client.get(FACTS, headers=headers)
    assert r.status_code == 200
    assert r.headers["content-type"] == "application/json"
    stored = api.service.view(tenant).get_facts("u1")
    expected = FactList(facts=[FactOut.model_validate(f, from_attributes=True) for f in stored])
    assert r.content == expected.model_dump_json().encode()
    assert {f["key"]: f["value"] for f in r.json()["facts"]} == facts
    # An unknown user is an empty list, in the same shape.
    assert api.client.get("/v1/users/nobody/facts", headers=headers).json() == {"facts": []}


def test_store_reads_run_on_the_loop_only_for_the_embedded_store(api: Api) -> None:
    embedded = isinstance(api.service.memory.kv, SqliteKVStore)
    assert api.service.inline_reads is embedded
    # Either way a read gives the store's current answer.
    tenant = new_tenant()
    headers = api.key(tenant)
    api.client.put(f"{FACTS}/tone", json={"value": "short"}, headers=headers)
    assert api.client.get(FACTS, headers=headers).json()["facts"][0]["value"] == "short"
    api.service.view(tenant).set_fact("u1", "tone", "detailed")  # written around the service
    assert api.client.get(FACTS, headers=headers).json()["facts"][0]["value"] == "detailed"


def test_concurrent_verifications_of_one_key_share_one_read(api: Api) -> None:
    key = api.key(new_tenant())["Authorization"].removeprefix("Bearer ")

    async def verify_many(presented: str) -> list[object]:
        return await asyncio.gather(
            *(api.service.verify(presented) for _ in range(20)), return_exceptions=True
        )

    principals = asyncio.run(verify_many(key))
    # One verification answered all twenty: they got the very same object.
    assert all(p is principals[0] for p in principals)
    assert principals[0] == api.service.authenticate(key)
    forged = key[:-4] + ("AAAA" if not key.endswith("AAAA") else "BBBB")
    errors = asyncio.run(verify_many(forged))
    assert all(isinstance(e, InvalidApiKeyError) for e in errors)
    assert all(e is errors[0] for e in errors)
    assert api.service._verifying == {}  # nothing left pending once answered


def test_a_key_revoked_elsewhere_is_refused_once_its_cached_check_expires(
    memory: Memory, tmp_path: Path
) -> None:
    ttl = 0.5
    with start_app(Settings(data_dir=tmp_path, auth_cache_seconds=ttl), memory) as api:
        headers = api.key(new_tenant())
        assert api.client.get(FACTS, headers=headers).status_code == 200
        key_id = headers["Authorization"].split("_")[1]
        # Revoked through a registry of its own, as `tiermem keys revoke` in another process
        # would: this server cannot clear its cache, so the TTL bounds the delay.
        ApiKeyRegistry(api.service.memory.kv).revoke(key_id)
        time.sleep(ttl + 0.1)
        r = api.client.get(FACTS, headers=headers)
        assert r.status_code == 401
        assert "revoked" in r.json()["detail"]


@pytest.mark.parametrize("count", [300])
def test_request_ids_made_here_are_unique_32_hex_digits(api: Api, count: int) -> None:
    ids = {api.client.get("/healthz").headers["x-request-id"] for _ in range(count)}
    assert len(ids) == count
    assert all(re.fullmatch(r"[0-9a-f]{32}", i) for i in ids)
