"""The console (/ui) and the offline API docs in a real headless Chromium against `tiermem serve`.

The browser tests are marked slow: their module fixture starts a server process and a
browser (about 10 s), and the docs page takes seconds to render. A few checks that need
no browser run in-process against the app.

Playwright for Python drives Debian's chromium (``/usr/bin/chromium``; ``./run test``
installs it); no browser is ever downloaded. The server is a real ``tiermem serve``
process on a loopback port over the embedded default store; the data the pages
show is made through :class:`~memory.client.MemoryClient`, as an agent would.
Every page request the browser makes to anything but the server is aborted and
recorded, so a page that reaches for a CDN fails its test.

Screenshots of the main pages are kept under ``tests/artifacts/console/``
(ignored by git); the path is printed.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import httpx
import pytest
from fastapi.testclient import TestClient
from playwright.sync_api import BrowserContext, Page, Route, expect, sync_playwright

from api.ui import views
from api.ui.auth import COOKIE, csrf_token
from api.ui.forkgraph import MAX_NODES, layout
from api.ui.views import ForkNode
from memory import ApprovalPendingError, RunStatus
from memory.apikeys import ApiKeyRegistry
from memory.client import MemoryClient
from memory.facade import Memory
from memory.settings import Settings
from tests.api.conftest import Api, new_tenant, start_app
from tests.api.test_routes import SUMMARY
from tests.conftest import free_port
from tests.servers import wait_ready
from tiers.backends import open_kv_store
from tiers.models import RunInfo
from tiers.task import EffectRecord

TIERMEM = str(Path(sys.executable).parent / "tiermem")
CHROMIUM = "/usr/bin/chromium"
ARTIFACTS = Path(__file__).resolve().parents[1] / "artifacts" / "console"
TENANT = "console-test"
# How long a browser action or an expect() may wait for its page (generous: CI is loaded).
BROWSER_WAIT_MS = 60_000


@dataclass
class Console:
    """A served tiermem, its keys, and a browser context that may reach only that server."""

    base_url: str
    key: str
    read_only_key: str
    yara_key: str  # bound to user yara
    context: BrowserContext
    blocked: list[str] = field(default_factory=list)  # URLs the pages tried outside the server

    def page(self) -> Page:
        """A fresh page with no console cookie."""
        self.context.clear_cookies()
        return self.context.new_page()


def _start_server(work: Path) -> tuple[subprocess.Popen[bytes], str, dict[str, str]]:
    env = {
        **os.environ,
        "TIERMEM_DATA_DIR": str(work / "data"),
        "TIERMEM_DURABLE": "false",
        "TIERMEM_ALLOW_VOLATILE": "true",
        "LITELLM_LOCAL_MODEL_COST_MAP": "True",
    }
    env.pop("TIERMEM_KV_URL", None)
    (work / "data").mkdir()
    kv = open_kv_store(str(work / "data" / "tiermem.sqlite3"))
    registry = ApiKeyRegistry(kv)
    keys = {
        "key": registry.create(TENANT)[0],
        "read_only": registry.create(TENANT, read_only=True)[0],
        "yara": registry.create(TENANT, user_id="yara")[0],
    }
    kv.close()
    port = free_port()
    log = work / "server.log"
    with log.open("wb") as out:
        process = subprocess.Popen(
            [TIERMEM, "serve", "--port", str(port)], env=env, stdout=out, stderr=out
        )
    base_url = f"http://127.0.0.1:{port}"
    wait_ready(f"{base_url}/readyz", process, log, what="tiermem serve")
    return process, base_url, keys


@pytest.fixture(scope="module")
def console(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Console]:
    if not os.access(CHROMIUM, os.X_OK):
        pytest.fail(f"{CHROMIUM} is missing: `apt-get install chromium` (./run test does)")
    work = tmp_path_factory.mktemp("console")
    process, base_url, keys = _start_server(work)
    try:
        with sync_playwright() as playwright:
            context = playwright.chromium.launch_persistent_context(
                str(work / "profile"),  # a fresh user-data-dir
                executable_path=CHROMIUM,
                headless=True,
                args=[
                    "--headless",
                    "--no-sandbox",
                    "--disable-gpu",
                    "--disable-background-networking",
                    "--disable-component-update",
                    "--disable-sync",
                    "--no-first-run",
                ],
                viewport={"width": 1280, "height": 900},
            )
            served = Console(base_url, keys["key"], keys["read_only"], keys["yara"], context)

            def only_the_server(route: Route) -> None:
                if route.request.url.startswith(base_url + "/"):
                    route.continue_()
                else:
                    served.blocked.append(route.request.url)
                    route.abort()

            context.route("**/*", only_the_server)
            # Playwright's defaults (5 s per expect(), 30 s per action) are a bet on an idle
            # machine: a page that embeds a query or renders the docs on a loaded CI runner
            # can take longer. The waits end as soon as the condition holds.
            context.set_default_timeout(BROWSER_WAIT_MS)
            expect.set_options(timeout=BROWSER_WAIT_MS)
            try:
                yield served
            finally:
                expect.set_options(timeout=None)  # back to Playwright's default
                context.close()
    finally:
        process.kill()
        process.wait()


@pytest.fixture
def client(console: Console) -> Iterator[MemoryClient]:
    with MemoryClient(console.base_url, console.key) as memory_client:
        yield memory_client


def screenshot(page: Page, name: str) -> Path:
    """Keep a full-page PNG of ``page`` as a test artifact and print where."""
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    path = ARTIFACTS / f"{name}.png"
    page.screenshot(path=str(path), full_page=True)
    print(f"screenshot: {path}")
    return path


def log_in(console: Console, key: str) -> Page:
    page = console.page()
    page.goto(f"{console.base_url}/ui/login")
    page.fill("input[name=api_key]", key)
    page.click("button[type=submit]")
    expect(page).to_have_url(re.compile(r"/ui/runs$"))
    return page


@pytest.mark.slow
def test_pages_without_a_login_redirect_to_it_and_a_bad_key_is_refused(console: Console) -> None:
    page = console.page()
    for path in ("/ui", "/ui/runs", "/ui/approvals", "/ui/users/ann", "/ui/runs/any"):
        page.goto(console.base_url + path)
        expect(page).to_have_url(f"{console.base_url}/ui/login")
    page.fill("input[name=api_key]", "tmk_000000000000_" + "A" * 43)
    page.click("button[type=submit]")
    expect(page.get_by_role("alert")).to_contain_text("malformed, unknown or revoked")
    screenshot(page, "login")
    page.goto(f"{console.base_url}/ui/runs")
    expect(page).to_have_url(f"{console.base_url}/ui/login")
    assert console.blocked == []


@pytest.mark.slow
def test_approve_a_gate_in_the_page_then_resume_and_complete(
    console: Console, client: MemoryClient
) -> None:
    run = client.start_run("ann", "refund-7")
    run.append_checkpoint("plan", {"items": 2}, state={"planned": True})
    plan = {"refund": 42, "to": "<script>alert('x')</script>"}
    with pytest.raises(ApprovalPendingError) as pending:
        run.await_approval(plan, key="refund")
    plan_hash = pending.value.plan_hash
    assert client.get_run("refund-7").status is RunStatus.PAUSED

    page = log_in(console, console.key)
    page.click("text=paused")
    expect(page.locator("table")).to_contain_text("refund-7")
    page.goto(f"{console.base_url}/ui/approvals")
    gate = page.locator("section.card", has_text="refund-7")
    expect(gate).to_contain_text(plan_hash)
    expect(gate.locator("pre.plan")).to_contain_text("<script>alert('x')</script>")  # as text
    screenshot(page, "approvals")
    gate.locator("input[name=note]").fill("checked the order")
    gate.get_by_role("button", name="Approve").click()

    expect(page).to_have_url(f"{console.base_url}/ui/runs/refund-7")
    expect(page.locator("#run-status")).to_have_text("resumable")
    expect(page.locator(".gate")).to_contain_text("checked the order")
    info = client.get_run("refund-7")
    assert info.status is RunStatus.RESUMABLE

    resumed = client.start_run("ann", "refund-7")
    assert resumed.await_approval(plan, key="refund").approved
    resumed.complete({"refunded": 42})
    page.reload()
    expect(page.locator("#run-status")).to_have_text("completed")
    expect(page.locator("table").first).to_contain_text("plan")
    page.locator("a", has_text="state").first.click()  # the run as of its first checkpoint
    expect(page.locator("#scope")).to_contain_text("At seq 1")
    expect(page.locator("pre").filter(has_text="planned")).to_have_count(1)
    screenshot(page, "run")
    assert console.blocked == []


@pytest.mark.slow
def test_a_run_page_draws_its_fork_graph_and_pages_a_long_timeline(
    console: Console, client: MemoryClient
) -> None:
    run = client.start_run("fay", "draft")
    marks = [run.append_checkpoint("write", {"draft": i}) for i in range(120)]
    client.fork_run("draft", marks[9].checkpoint_id, "draft-short")
    client.fork_run("draft", marks[59].checkpoint_id, "draft-long")
    short = client.start_run("fay", "draft-short")
    point = short.append_checkpoint("edit", {"cut": True})
    client.fork_run("draft-short", point.checkpoint_id, "draft-short-2")

    page = log_in(console, console.key)
    page.goto(f"{console.base_url}/ui/runs/draft-short")
    graph = page.locator("svg.fork-graph")
    expect(graph).to_be_visible()
    expect(graph.locator("a.fork-node")).to_have_count(4)
    expect(graph.locator("path.fork-edge")).to_have_count(3)
    expect(graph.locator("a.fork-node.current")).to_contain_text("draft-short")
    expect(graph).to_contain_text("forked at seq 10")
    screenshot(page, "run-forks")
    graph.locator("a.fork-node", has_text="draft-long").click()
    expect(page).to_have_url(f"{console.base_url}/ui/runs/draft-long")
    expect(page.locator("table.timeline tbody tr")).to_have_count(60)  # forked at seq 60

    page.goto(f"{console.base_url}/ui/runs/draft")
    rows = page.locator("table.timeline tbody tr")
    expect(rows).to_have_count(100)
    expect(rows.first.locator("td").first).to_have_text("120")
    expect(page.locator("nav.pager").first).to_contain_text("1–100 of 120 checkpoints")
    screenshot(page, "run-paged")
    page.locator("nav.pager a.older").first.click()
    expect(rows).to_have_count(20)
    expect(rows.first.locator("td").first).to_have_text("20")
    assert console.blocked == []


@pytest.mark.slow
def test_a_users_memory_shows_facts_sessions_and_the_context_with_token_counts(
    console: Console, client: MemoryClient
) -> None:
    client.set_fact("bea", "language", "Python", source="session:s-1", confidence=0.8)
    client.set_fact("bea", "language", "Rust <b>not bold</b>", evidence="said so twice")
    client.save_session({**SUMMARY, "session_id": "s-1", "user_id": "bea"})

    page = log_in(console, console.key)
    page.fill("header input[name=user_id]", "bea")
    page.get_by_role("button", name="User memory").click()
    expect(page).to_have_url(f"{console.base_url}/ui/users/bea")
    fact = page.locator("tr.fact", has_text="language")
    expect(fact).to_contain_text("Rust <b>not bold</b>")
    expect(fact).to_contain_text("said so twice")
    fact.locator("summary").click()
    expect(fact.locator("details")).to_contain_text("session:s-1")
    expect(page.locator("section.session")).to_contain_text("logical replication")

    page.fill("input[name=q]", "billing database")
    page.get_by_role("button", name="Preview").click()
    sections = page.locator("tr.section")
    expect(sections.first).to_be_visible()
    for row in sections.all():
        assert int(row.locator("td.num").inner_text()) > 0
    expect(page.locator(".tokens")).to_contain_text("tokens")
    expect(page.locator("pre.context")).to_contain_text("Rust")
    screenshot(page, "user")
    assert console.blocked == []


@pytest.mark.slow
def test_a_user_bound_key_sees_its_own_user_only(console: Console, client: MemoryClient) -> None:
    client.set_fact("zed", "secret", "zed-only-value")
    client.set_fact("yara", "color", "green")
    client.start_run("zed", "zed-run")
    page = log_in(console, console.yara_key)
    response = page.goto(f"{console.base_url}/ui/users/zed")
    assert response is not None
    assert response.status == 403
    expect(page.get_by_role("alert")).to_contain_text("bound to user 'yara'")
    assert "zed-only-value" not in page.content()
    response = page.goto(f"{console.base_url}/ui/runs/zed-run")
    assert response is not None
    assert response.status == 404
    page.goto(f"{console.base_url}/ui/runs")
    assert "zed-run" not in page.content()
    page.goto(f"{console.base_url}/ui/users/yara")
    expect(page.locator("tr.fact")).to_contain_text("green")
    assert console.blocked == []


@pytest.mark.slow
def test_a_post_without_the_csrf_token_is_refused(console: Console, client: MemoryClient) -> None:
    run = client.start_run("cy", "csrf-1")
    with pytest.raises(ApprovalPendingError) as pending:
        run.await_approval({"delete": "everything"}, key="g")
    form = {"plan_hash": pending.value.plan_hash}
    cookie = {"Cookie": f"{COOKIE}={console.key}"}
    url = f"{console.base_url}/ui/runs/csrf-1/approve"
    for bad in ({}, {"csrf": "0" * 64}, {"csrf": csrf_token(console.read_only_key)}):
        refused = httpx.post(url, data={**form, **bad}, headers=cookie)
        assert refused.status_code == 403, refused.text
        assert "CSRF" in refused.text
    assert client.get_run("csrf-1").status is RunStatus.PAUSED
    # A read-only key's valid token still cannot decide.
    read_only = {"Cookie": f"{COOKIE}={console.read_only_key}"}
    token = {"csrf": csrf_token(console.read_only_key)}
    refused = httpx.post(url, data={**form, **token}, headers=read_only)
    assert refused.status_code == 403
    assert "read-only" in refused.text
    assert client.get_run("csrf-1").status is RunStatus.PAUSED
    # Logging out needs the token too.
    assert httpx.post(f"{console.base_url}/ui/logout", headers=cookie).status_code == 403


@pytest.mark.slow
def test_docs_render_offline(console: Console, no_network: None) -> None:
    page = console.page()
    page.goto(f"{console.base_url}/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("tiermem")
    expect(page.locator(".opblock").first).to_be_visible()
    screenshot(page, "docs")
    page.goto(f"{console.base_url}/redoc")  # redirected to the offline Swagger UI
    expect(page).to_have_url(f"{console.base_url}/docs")
    expect(page.locator(".swagger-ui .info .title")).to_contain_text("tiermem")
    assert console.blocked == []


def _csrf(html: str) -> str:
    found = re.search(r'name="csrf" value="([0-9a-f]{64})"', html)
    assert found is not None, html
    return found.group(1)


def test_stored_values_are_escaped_and_pages_are_not_cached(api: Api) -> None:
    tenant = new_tenant()
    key = api.key(tenant)["Authorization"].removeprefix("Bearer ")
    memory = api.service.view(tenant)
    memory.set_fact("u1", "k", "<img src=x onerror=alert(1)>", evidence="<script>x</script>")
    c = api.client
    login = c.get("/ui/login")
    assert login.headers["Cache-Control"] == "no-store"
    signed_in = c.post("/ui/login", data={"api_key": key, "csrf": _csrf(login.text)})
    assert signed_in.url.path == "/ui/runs"
    page = c.get("/ui/users/u1")
    assert page.status_code == 200
    assert "<img src=x" not in page.text
    assert "<script>x</script>" not in page.text
    assert "&lt;img src=x onerror=alert(1)&gt;" in page.text
    assert "frame-ancestors 'none'" in page.headers["Content-Security-Policy"]
    cookie = signed_in.history[0].headers["set-cookie"]
    assert "HttpOnly" in cookie
    assert "SameSite=strict" in cookie
    assert "Path=/ui" in cookie


def test_login_needs_the_login_pages_csrf_token(api: Api) -> None:
    key = api.key(new_tenant())["Authorization"].removeprefix("Bearer ")
    c = api.client
    c.get("/ui/login")
    refused = c.post("/ui/login", data={"api_key": key}, follow_redirects=False)
    assert refused.status_code == 403
    assert COOKIE not in c.cookies


def test_with_auth_off_the_console_acts_in_the_servers_tenant(
    memory: Memory, tmp_path: Path
) -> None:
    settings = Settings(data_dir=tmp_path, auth_enabled=False)
    with start_app(settings, memory) as running:
        c = running.client
        assert c.get("/ui/runs", follow_redirects=False).status_code == 303
        login = c.get("/ui/login")
        assert 'name="api_key"' not in login.text
        runs = c.post("/ui/login", data={"csrf": _csrf(login.text)})
        assert runs.url.path == "/ui/runs"
        assert f"tenant <b>{memory.tenant}</b>" in runs.text


def _signed_in(api: Api) -> tuple[TestClient, Memory]:
    """The app's client logged in to the console as a fresh tenant, and that tenant's memory."""
    tenant = new_tenant()
    key = api.key(tenant)["Authorization"].removeprefix("Bearer ")
    c = api.client
    login = c.get("/ui/login")
    assert c.post("/ui/login", data={"api_key": key, "csrf": _csrf(login.text)}).status_code == 200
    return c, api.service.view(tenant)


def _seqs(html: str, table: str) -> list[int]:
    """The seq column of one of the run page's tables (``timeline`` or ``events``)."""
    body = html.split(f'<table class="{table}">', 1)[1].split("</table>", 1)[0]
    return [int(seq) for seq in re.findall(r"<tr[^>]*>\s*<td>(\d+)</td>", body)]


def _link(html: str, section: str, kind: str) -> str:
    """The href of a pager link (``older`` or ``newest``) of one of the run page's sections."""
    nav = html.split(f'aria-label="{section} pages"', 1)[1].split("</nav>", 1)[0]
    found = re.search(rf'class="{kind}" href="([^"]+)"', nav)
    assert found is not None, nav
    return found.group(1).replace("&amp;", "&")


def test_a_long_runs_page_shows_100_of_each_newest_first_with_links_to_older(api: Api) -> None:
    c, memory = _signed_in(api)
    run = memory.start_run("long", "long-1")
    for i in range(260):
        run.append_checkpoint("step", {"i": i, "pad": "x" * 200})
    for i in range(130):
        run.effect("send", lambda: {"sent": True}, idempotency_key=f"mail-{i:03d}")
    info = memory.get_run("long-1")
    events = info.event_seq - info.compacted_through
    assert info.head_seq == 260 + 130  # an effect's record is a checkpoint too

    first = c.get("/ui/runs/long-1")
    assert first.status_code == 200
    assert len(first.content) < 300_000  # bounded: not the run's whole history
    assert _seqs(first.text, "timeline") == list(range(390, 290, -1))
    assert "1–100 of 390 checkpoints" in first.text
    assert f"1–100 of {events} events" in first.text
    assert "1–100 of 130 effects" in first.text
    assert _seqs(first.text, "events") == list(range(info.event_seq, info.event_seq - 100, -1))
    assert first.text.count("<code>mail-") == 100

    second = c.get(_link(first.text, "checkpoints", "older"))
    assert _seqs(second.text, "timeline") == list(range(290, 190, -1))
    assert _seqs(second.text, "events") == _seqs(first.text, "events")  # other cursors kept
    last = c.get(
        _link(c.get(_link(second.text, "checkpoints", "older")).text, "checkpoints", "older")
    )
    assert _seqs(last.text, "timeline") == list(range(90, 0, -1))
    assert (
        'class="older"'
        not in last.text.split('aria-label="checkpoints pages"')[1].split("</nav>")[0]
    )
    assert _seqs(c.get(_link(last.text, "checkpoints", "newest")).text, "timeline")[0] == 390

    older_events = c.get(_link(first.text, "events", "older"))
    assert _seqs(older_events.text, "events") == list(
        range(info.event_seq - 100, info.event_seq - 200, -1)
    )
    effects = c.get(_link(first.text, "effects", "older"))
    assert "101–130 of 130 effects" in effects.text
    assert effects.text.count("<code>mail-") == 30
    # A scope link keeps the page the timeline is on.
    assert re.search(r"\?checkpoint=[^\"#]+&amp;before=291#scope", second.text)
    refused = c.get("/ui/runs/long-1?before=0")
    assert refused.status_code == 422
    assert "before must be a seq" in refused.text


def test_the_effects_table_pages_by_key_and_decodes_only_its_page(
    api: Api, monkeypatch: pytest.MonkeyPatch
) -> None:
    c, memory = _signed_in(api)
    run = memory.start_run("paged", "ledger-1")
    for i in range(5):
        run.effect("send", lambda: {"sent": True}, idempotency_key=f"fx-{i}")
    monkeypatch.setattr(views, "RUN_PAGE_SIZE", 2)
    decoded: list[tuple[str | None, int | None]] = []
    run_effects = Memory.run_effects

    def spy(self: Memory, run_id: str, **kwargs: Any) -> list[EffectRecord]:
        decoded.append((kwargs.get("after_key"), kwargs.get("limit")))
        return run_effects(self, run_id, **kwargs)

    monkeypatch.setattr(Memory, "run_effects", spy)
    first = c.get("/ui/runs/ledger-1")
    assert "1–2 of 5 effects" in first.text
    second = c.get(_link(first.text, "effects", "older"))
    assert "effects_after=fx-1" in _link(first.text, "effects", "older")
    assert "3–4 of 5 effects" in second.text
    assert re.findall(r"<code>(fx-\d)</code>", second.text) == ["fx-2", "fx-3"]
    last = c.get(_link(second.text, "effects", "older"))
    assert "5–5 of 5 effects" in last.text
    assert (
        'class="older"' not in last.text.split('aria-label="effects pages"')[1].split("</nav>")[0]
    )
    assert "1–2 of 5 effects" in c.get(_link(last.text, "effects", "newest")).text
    assert decoded[:3] == [(None, 2), ("fx-1", 2), ("fx-3", 2)]  # never the whole ledger


def test_the_fork_graph_is_an_svg_with_a_linked_node_per_run_and_an_edge_per_fork(
    api: Api,
) -> None:
    c, memory = _signed_in(api)
    run = memory.start_run("forky", "tree-root")
    marks = [run.append_checkpoint("step", {"i": i}) for i in range(3)]
    memory.fork_run("tree-root", marks[0].checkpoint_id, "tree-a")
    memory.fork_run("tree-root", marks[2].checkpoint_id, "tree-b")
    a = memory.start_run("forky", "tree-a")
    fork_point = a.append_checkpoint("more", {"in": "a"})
    memory.fork_run("tree-a", fork_point.checkpoint_id, "tree-a-1")

    html = c.get("/ui/runs/tree-a").text
    svg = html.split('<svg class="fork-graph"', 1)[1].split("</svg>", 1)[0]
    nodes = re.findall(r'<a class="fork-node( current)?" href="([^"]+)">', svg)
    assert [href for _, href in nodes] == [
        "/ui/runs/tree-root",
        "/ui/runs/tree-a",
        "/ui/runs/tree-a-1",
        "/ui/runs/tree-b",
    ]
    assert [current for current, _ in nodes] == ["", " current", "", ""]
    assert svg.count('class="fork-edge"') == 3
    assert "tree-a · running · forked at seq 1 (this run)</title>" in svg
    assert f"tree-a-1 · resumable · forked at seq {fork_point.seq}</title>" in svg
    assert "forked at seq 3" in svg  # tree-b
    assert "<script" not in html
    assert 'class="fork-list"' in html  # the nested list stays, as text


def test_a_fork_graph_draws_at_most_its_first_runs_and_counts_the_rest() -> None:
    root = ForkNode(RunInfo(run_id="big", user_id="u"))
    root.children = [
        ForkNode(RunInfo(run_id=f"big-{i:03d}", user_id="u", parent_run_id="big"))
        for i in range(250)
    ]
    graph = layout(root, "big-007", lambda info: 1, max_nodes=MAX_NODES)
    assert len(graph.nodes) == MAX_NODES
    assert len(graph.edges) == MAX_NODES - 1
    assert graph.hidden == 251 - MAX_NODES
    assert [node.run.run_id for node in graph.nodes if node.current] == ["big-007"]
    assert graph.height == max(node.y for node in graph.nodes) + graph.nodes[0].height + 4
