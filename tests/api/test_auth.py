"""API keys: required by default, hashed at rest, revocable, scoped; and the `tiermem keys` CLI."""

from __future__ import annotations

import asyncio
import hashlib
import threading
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memory.apikeys import ApiKeyRegistry, InvalidApiKeyError
from memory.cli import app as cli
from memory.facade import Memory
from memory.settings import Settings
from tests.api.conftest import Api, new_tenant, start_app
from tiers import keys as key_formats

FACTS = "/v1/users/u1/facts"


def assert_unauthorized(r: object) -> None:
    assert r.status_code == 401  # type: ignore[attr-defined]
    assert r.headers["www-authenticate"].startswith("Bearer")  # type: ignore[attr-defined]
    assert r.headers["content-type"] == "application/problem+json"  # type: ignore[attr-defined]
    assert r.json()["type"] == "urn:tiermem:problem:unauthorized"  # type: ignore[attr-defined]


def test_missing_malformed_and_unknown_keys_are_refused(api: Api) -> None:
    assert_unauthorized(api.client.get(FACTS))
    assert_unauthorized(api.client.get(FACTS, headers={"Authorization": "Bearer not-a-key"}))
    assert_unauthorized(api.client.get(FACTS, headers={"Authorization": "Basic dXNlcjpwYXNz"}))
    real = api.key(new_tenant())["Authorization"]
    forged = real[:-4] + ("AAAA" if not real.endswith("AAAA") else "BBBB")  # right id, wrong secret
    assert_unauthorized(api.client.get(FACTS, headers={"Authorization": forged}))
    assert "no API key" in api.client.get(FACTS).json()["detail"]


def test_bearer_and_x_api_key_headers_both_work(api: Api) -> None:
    key = api.key(new_tenant())["Authorization"].removeprefix("Bearer ")
    assert api.client.get(FACTS, headers={"Authorization": f"bearer {key}"}).status_code == 200
    assert api.client.get(FACTS, headers={"X-API-Key": key}).status_code == 200


def test_revoked_key_is_refused(api: Api) -> None:
    headers = api.key(new_tenant())
    assert api.client.get(FACTS, headers=headers).status_code == 200
    key_id = headers["Authorization"].split("_")[1]
    # Revoked through a registry of its own, as `tiermem keys revoke` in another process would.
    ApiKeyRegistry(api.service.memory.kv).revoke(key_id)
    r = api.client.get(FACTS, headers=headers)
    assert_unauthorized(r)
    assert "revoked" in r.json()["detail"]


def test_verified_keys_are_cached_until_revoked_here(memory: Memory, tmp_path: Path) -> None:
    with start_app(Settings(data_dir=tmp_path, auth_cache_seconds=300), memory) as api:
        headers = api.key(new_tenant())
        key = headers["Authorization"].removeprefix("Bearer ")
        assert api.client.get(FACTS, headers=headers).status_code == 200
        assert api.service.cached_principal(key) is not None
        api.service.revoke_key(key.split("_")[1])
        assert api.service.cached_principal(key) is None
        assert_unauthorized(api.client.get(FACTS, headers=headers))


def test_a_key_revoked_while_it_is_verified_is_not_cached(
    memory: Memory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with start_app(Settings(data_dir=tmp_path, auth_cache_seconds=300), memory) as api:
        headers = api.key(new_tenant())
        key = headers["Authorization"].removeprefix("Bearer ")
        verify = api.service.keys.verify

        def revoked_once_read(raw: str) -> object:
            # The revocation lands between the registry read and the cache store.
            info = verify(raw)
            monkeypatch.setattr(api.service.keys, "verify", verify)
            api.service.revoke_key(key.split("_")[1])
            return info

        monkeypatch.setattr(api.service.keys, "verify", revoked_once_read)
        assert api.client.get(FACTS, headers=headers).status_code == 200  # verified before
        assert api.service.cached_principal(key) is None
        assert_unauthorized(api.client.get(FACTS, headers=headers))


def test_a_request_after_a_revocation_does_not_share_a_verification_begun_before_it(
    memory: Memory, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Requests with one key share one verification in flight; one that arrives after the key was
    # revoked must read the registry itself, not take the answer of a read made before.
    with start_app(Settings(data_dir=tmp_path, auth_cache_seconds=0), memory) as api:
        service = api.service
        service.inline_reads = False  # offloaded, as for a network store: verifications overlap
        key = api.key(new_tenant())["Authorization"].removeprefix("Bearer ")
        key_id = key.split("_")[1]
        verify = service.keys.verify
        was_read, go_on = threading.Event(), threading.Event()

        def held_after_reading(raw: str) -> object:
            info = verify(raw)
            was_read.set()
            assert go_on.wait(30)
            return info

        async def main() -> None:
            monkeypatch.setattr(service.keys, "verify", held_after_reading)
            first = asyncio.ensure_future(service.verify(key))
            assert await asyncio.to_thread(was_read.wait, 30)
            monkeypatch.setattr(service.keys, "verify", verify)
            await asyncio.to_thread(service.revoke_key, key_id)
            second = asyncio.ensure_future(service.verify(key))
            await asyncio.sleep(0.05)  # it has joined the first one, or begun its own
            go_on.set()
            assert (await first).key_id == key_id  # read before the revocation
            with pytest.raises(InvalidApiKeyError):
                await second

        asyncio.run(main())


def test_read_only_key_reads_but_cannot_write(api: Api) -> None:
    tenant = new_tenant()
    writer = api.key(tenant)
    reader = api.key(tenant, read_only=True)
    c = api.client
    c.put("/v1/users/u1/facts/lang", json={"value": "fr"}, headers=writer)
    c.post(
        "/v1/users/u1/sessions",
        json={"session_id": "s1", "summary": {"task_description": "x"}},
        headers=writer,
    )

    assert c.get("/v1/users/u1/facts/lang", headers=reader).json()["value"] == "fr"
    assert (
        c.post("/v1/users/u1/sessions:recall", json={"query": "x"}, headers=reader).status_code
        == 200
    )
    assert c.post("/v1/users/u1/context", json={}, headers=reader).status_code == 200
    assert c.get("/v1/runs", headers=reader).status_code == 200

    refused = [
        c.put("/v1/users/u1/facts/lang", json={"value": "de"}, headers=reader),
        c.put("/v1/users/u1/facts", json={"facts": {"a": 1}}, headers=reader),
        c.delete("/v1/users/u1/facts/lang", headers=reader),
        c.delete("/v1/users/u1", headers=reader),
        c.post("/v1/users/u1/sessions", json={"session_id": "s2", "summary": {}}, headers=reader),
        c.delete("/v1/users/u1/sessions/s1", headers=reader),
        c.post("/v1/runs", json={"user_id": "u1"}, headers=reader),
        c.post("/v1/runs/r1:cancel", headers=reader),
    ]
    for r in refused:
        assert r.status_code == 403, r.request.url
        assert r.json()["type"] == "urn:tiermem:problem:forbidden"
        assert "--read-only" in r.json()["detail"]
    assert c.get("/v1/users/u1/facts/lang", headers=reader).json()["value"] == "fr"
    assert c.get("/v1/users/u1/sessions/s1", headers=reader).status_code == 200


def test_keys_are_stored_only_as_hashes(api: Api) -> None:
    key, info = api.service.keys.create(new_tenant(), name="ci")
    stored = b"".join(v for _, v in api.service.memory.kv.scan(key_formats.api_keys_space()))
    assert key.encode() not in stored
    assert key.split("_", 2)[2].encode() not in stored
    assert hashlib.sha256(key.encode()).hexdigest().encode() in stored
    assert api.service.keys.verify(key) == info


def test_registry_refuses_bad_input(api: Api) -> None:
    with pytest.raises(InvalidApiKeyError):
        api.service.keys.verify("tmk_000000000000_" + "A" * 43)
    with pytest.raises(Exception, match="tenant"):
        api.service.keys.create("no spaces allowed")


def test_auth_can_be_turned_off_for_local_development(memory: Memory, tmp_path: Path) -> None:
    # Without auth every request acts in the tenant of the memory served.
    with start_app(
        Settings(data_dir=tmp_path, auth_enabled=False), memory.for_tenant("devtenant")
    ) as api:
        r = api.client.put("/v1/users/u1/facts/k", json={"value": "dev"})
        assert r.status_code == 200
        assert memory.for_tenant("devtenant").get_fact("u1", "k").value == "dev"
        assert "securitySchemes" not in api.client.get("/openapi.json").json().get("components", {})


def test_probes_and_docs_need_no_key(api: Api) -> None:
    for path in ("/healthz", "/readyz", "/metrics", "/openapi.json"):
        assert api.client.get(path).status_code == 200, path
    spec = api.client.get("/openapi.json").json()
    assert set(spec["components"]["securitySchemes"]) == {"bearer", "apiKey"}
    assert spec["paths"]["/v1/runs"]["post"]["security"] == [{"bearer": []}, {"apiKey": []}]
    assert "security" not in spec["paths"]["/healthz"]["get"]


# -- the CLI -----------------------------------------------------------------------------------


@pytest.fixture
def cli_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERMEM_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("TIERMEM_KV_URL", raising=False)
    return tmp_path


def test_cli_creates_lists_and_revokes_keys(cli_env: Path) -> None:
    runner = CliRunner()
    created = runner.invoke(
        cli, ["keys", "create", "--tenant", "acme", "--read-only", "--name", "crm"]
    )
    assert created.exit_code == 0, created.output
    key = created.stdout.strip()
    assert key.startswith("tmk_")
    key_id = key.split("_")[1]

    listed = runner.invoke(cli, ["keys", "list", "--tenant", "acme"])
    assert listed.exit_code == 0
    (line,) = listed.stdout.strip().splitlines()
    assert line.split("\t")[:4] == [key_id, "acme", "read", "active"]
    assert key.split("_", 2)[2] not in listed.stdout

    assert runner.invoke(cli, ["keys", "revoke", key_id]).exit_code == 0
    assert "revoked" in runner.invoke(cli, ["keys", "list"]).stdout
    unknown = runner.invoke(cli, ["keys", "revoke", "0123456789ab"])
    assert unknown.exit_code == 1
    assert "no API key" in unknown.stderr

    with Memory.open(cli_env) as memory:
        registry = ApiKeyRegistry(memory.kv)
        with pytest.raises(InvalidApiKeyError, match="revoked"):
            registry.verify(key)


def test_cli_refuses_a_bad_tenant(cli_env: Path) -> None:
    result = CliRunner().invoke(cli, ["keys", "create", "--tenant", "bad tenant"])
    assert result.exit_code == 1
    assert "tenant" in result.stderr
