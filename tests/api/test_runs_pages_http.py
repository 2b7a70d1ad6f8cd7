"""``GET /v1/runs`` and ``GET /v1/runs:resumable`` in pages (``limit``, ``after``), and their 422s."""

from __future__ import annotations

import pytest

from tests.api.conftest import Api, new_tenant


def _ids(api: Api, path: str, headers: dict[str, str], **params: object) -> list[str]:
    r = api.client.get(path, params=params, headers=headers)
    assert r.status_code == 200, r.json()
    return [run["run_id"] for run in r.json()["runs"]]


def _walk(api: Api, path: str, headers: dict[str, str], limit: int) -> list[str]:
    ids: list[str] = []
    after: str | None = None
    while True:
        params: dict[str, object] = {"limit": limit}
        if after is not None:
            params["after"] = after
        page = _ids(api, path, headers, **params)
        ids += page
        if len(page) < limit:
            return ids
        after = page[-1]


@pytest.fixture
def tenant(api: Api) -> str:
    name = new_tenant()
    memory = api.service.memory.for_tenant(name)
    for i, run_id in enumerate(["r-5", "r-2", "r-8", "r-1", "r-7", "r-3"]):
        memory.start_run("yara" if i % 2 else "zed", run_id).release()
    memory.start_run("yara", "r-4").complete(None)
    return name


def test_run_lists_page_in_run_id_order(api: Api, tenant: str) -> None:
    headers = api.key(tenant)
    whole = _ids(api, "/v1/runs", headers)
    assert whole == ["r-5", "r-2", "r-8", "r-1", "r-7", "r-3", "r-4"]  # oldest first, as before
    for limit in (1, 2, 3, 10):
        assert _walk(api, "/v1/runs", headers, limit) == sorted(whole)
        assert _walk(api, "/v1/runs:resumable", headers, limit) == sorted(set(whole) - {"r-4"})
    assert _ids(api, "/v1/runs", headers, after="r-35", limit=2) == ["r-4", "r-5"]
    assert _ids(api, "/v1/runs", headers, user_id="yara", limit=2) == ["r-1", "r-2"]
    assert _ids(api, "/v1/runs", headers, status="completed", limit=5) == ["r-4"]


def test_a_user_bound_key_pages_its_users_runs(api: Api, tenant: str) -> None:
    key, _ = api.service.keys.create(tenant, user_id="yara")
    yara = {"Authorization": f"Bearer {key}"}
    assert _walk(api, "/v1/runs", yara, 2) == ["r-1", "r-2", "r-3", "r-4"]
    # Full pages of yara's runs although the tenant's pages hold zed's too.
    assert _ids(api, "/v1/runs:resumable", yara, limit=2) == ["r-1", "r-2"]
    assert _walk(api, "/v1/runs:resumable", yara, 1) == ["r-1", "r-2", "r-3"]
    assert _ids(api, "/v1/runs:resumable", yara, after="r-2") == ["r-3"]


@pytest.mark.parametrize("path", ["/v1/runs", "/v1/runs:resumable"])
@pytest.mark.parametrize(
    ("params", "field"),
    [
        ({"limit": -1}, "limit"),
        ({"limit": 10_001}, "limit"),
        ({"limit": "ten"}, "limit"),
        ({"after": "not an id"}, "after"),
        ({"after": ""}, "after"),
    ],
)
def test_a_bad_page_is_a_422_naming_its_field(
    api: Api, headers: dict[str, str], path: str, params: dict[str, object], field: str
) -> None:
    r = api.client.get(path, params=params, headers=headers)
    assert (r.status_code, r.json()["field"]) == (422, field)
