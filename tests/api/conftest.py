"""Fixtures of the API tests: the real app, lifespan included, over real stores."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path

import pytest
from fastapi.testclient import TestClient

from api import create_app
from api.state import ServiceState
from memory.facade import Memory
from memory.settings import Settings
from tests.conftest import RedisServer


@pytest.fixture(scope="session", params=["embedded", "redis"])
def memory(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> Iterator[Memory]:
    """One memory per backend for all API tests; tests keep apart by using fresh tenants.

    On Redis it has a server of its own: the shared one is flushed before each test that asks
    for ``redis_url``, and may hold what such a test left (an encrypted store, say).
    """
    kv_url = None
    server: RedisServer | None = None
    if request.param == "redis":
        server = RedisServer(tmp_path_factory.mktemp("api-redis-server"))
        kv_url = server.url
    data = tmp_path_factory.mktemp(f"api-{request.param}")
    try:
        mem = Memory.from_settings(
            Settings(data_dir=data, kv_url=kv_url, durable=False, allow_volatile=True)
        )
        yield mem
        mem.close()
    finally:
        if server is not None:
            server.stop()


@dataclass
class Api:
    """A running app and helpers to call it as some tenant."""

    client: TestClient
    service: ServiceState

    def key(self, tenant: str, *, read_only: bool = False) -> dict[str, str]:
        """Headers carrying a new API key of ``tenant``."""
        key, _ = self.service.keys.create(tenant, read_only=read_only, name="test")
        return {"Authorization": f"Bearer {key}"}


def new_tenant() -> str:
    """A tenant no other test uses."""
    return f"t-{uuid.uuid4().hex[:10]}"


@contextmanager
def start_app(settings: Settings, memory: Memory | None = None) -> Iterator[Api]:
    """Run ``create_app`` under a TestClient, lifespan included."""
    app = create_app(settings, memory=memory)
    with TestClient(app) as client:
        yield Api(client, app.state.tiermem)


@pytest.fixture
def api(memory: Memory, tmp_path: Path) -> Iterator[Api]:
    """The app serving the module's memory, with auth on."""
    with start_app(Settings(data_dir=tmp_path, auth_cache_seconds=0), memory) as running:
        yield running


@pytest.fixture
def headers(api: Api) -> dict[str, str]:
    """A read-write key of a fresh tenant."""
    return api.key(new_tenant())
