"""The service's routes against the declaration of operations (memory/operations.py).

Every declared route is served, every ``/v1`` route of the service is declared,
and the routers reach the tiers only through ``Memory``'s operations.
"""

from __future__ import annotations

import ast
from pathlib import Path

from api.app import create_app
from memory.operations import OPERATIONS, RUN_OPERATIONS, SERVICE_ROUTES, Route
from memory.settings import Settings

API = Path(__file__).resolve().parents[2] / "api"
# Modules that serve requests: the REST routers and the console's pages.
REQUEST_MODULES = [*sorted((API / "routers").glob("*.py")), *sorted((API / "ui").glob("*.py"))]
TIERS = {"tasks", "sessions", "users", "items", "threads"}
MEMORY_TYPES = {"Memory", "ReadMemory", "WriteMemory", "MemoryDep"}


def served_routes(tmp_path: Path) -> set[Route]:
    # The OpenAPI schema lists every route the app serves; building it opens no store.
    app = create_app(Settings(data_dir=tmp_path / "data"))
    return {
        Route(method.upper(), path)
        for path, methods in app.openapi()["paths"].items()
        for method in methods
    }


def test_every_declared_route_is_served_and_every_v1_route_is_declared(tmp_path: Path) -> None:
    declared = {op.route for op in (*OPERATIONS, *RUN_OPERATIONS) if op.route is not None}
    declared |= set(SERVICE_ROUTES)
    served = served_routes(tmp_path)
    assert declared - served == set()
    assert {r for r in served if r.path.startswith("/v1/")} - declared == set()
    assert not (tmp_path / "data").exists()


def tier_reads(source: str) -> list[str]:
    """``memory.<tier>`` reads in a router module: on a Memory parameter or a ``.memory``."""
    tree = ast.parse(source)
    memories: set[str] = {"memory"}
    for node in ast.walk(tree):
        if isinstance(node, ast.arg) and node.annotation is not None:
            annotation = ast.unparse(node.annotation)
            if any(name in annotation for name in MEMORY_TYPES):
                memories.add(node.arg)
    found = []
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Attribute) and node.attr in TIERS):
            continue
        owner = node.value
        if (isinstance(owner, ast.Name) and owner.id in memories) or (
            isinstance(owner, ast.Attribute) and owner.attr == "memory"
        ):
            found.append(f"line {node.lineno}: {ast.unparse(node)}")
    return found


def test_routers_reach_the_tiers_only_through_memory_operations() -> None:
    offenders = {
        str(path.relative_to(API)): reads
        for path in REQUEST_MODULES
        if (reads := tier_reads(path.read_text()))
    }
    assert offenders == {}


def test_the_tier_read_check_sees_a_violation() -> None:
    bad = (
        "def route(run_id: str, mem: WriteMemory, service: ServiceDep) -> None:\n"
        "    mem.tasks.attach(run_id, 1)\n"
        "    service.memory.users.delete_user('u')\n"
        "    memory.sessions.transcript_header('u', 's')\n"
        "    checks.items()\n"
    )
    assert tier_reads(bad) == [
        "line 2: mem.tasks",
        "line 3: service.memory.users",
        "line 4: memory.sessions",
    ]
