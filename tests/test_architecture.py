"""The layering rules of ARCHITECTURE.md, checked on the source."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

import memory

ROOT = Path(__file__).resolve().parents[1]
LAYERS = ["tiers", "summarizer", "memory", "api"]  # lowest first
DRIVERS: dict[str, str | tuple[str, ...]] = {
    "redis": "tiers/backends",
    "psycopg": "tiers/backends",
    "chromadb": "tiers/backends",
    "sqlite3": "tiers/backends",
    "onnxruntime": "tiers/backends",
    "litellm": "summarizer",
    "fastapi": "api",
    "starlette": "api",
    "uvicorn": "api",
    # Metrics and traces: the library's own modules and the service; never the tiers, which
    # report through tiers.task.TaskObserver.
    "prometheus_client": ("memory/metrics.py", "api/"),
    "opentelemetry": ("memory/telemetry.py", "api/"),
}


_DYNAMIC_IMPORTS = {"import_module", "__import__"}


def imports_of(path: Path) -> set[str]:
    """Modules a file imports: import statements, and ``importlib.import_module`` /
    ``__import__`` calls with a literal name (an import by name is still an import)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    names: set[str] = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names.add(node.module)
        elif isinstance(node, ast.Call) and node.args:
            func = node.func
            called = func.attr if isinstance(func, ast.Attribute) else getattr(func, "id", None)
            first = node.args[0]
            if (
                called in _DYNAMIC_IMPORTS
                and isinstance(first, ast.Constant)
                and isinstance(first.value, str)
            ):
                names.add(first.value)
    return names


def package_files(package: str) -> list[Path]:
    return sorted((ROOT / package).rglob("*.py"))


@pytest.mark.parametrize("package", LAYERS)
def test_imports_point_down_only(package: str) -> None:
    above = set(LAYERS[LAYERS.index(package) + 1 :])
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in package_files(package)
        for name in imports_of(path)
        if name.split(".")[0] in above
    ]
    assert offenders == []


@pytest.mark.parametrize("driver", sorted(DRIVERS))
def test_drivers_stay_in_their_room(driver: str) -> None:
    room = DRIVERS[driver]
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for package in LAYERS
        for path in package_files(package)
        for name in imports_of(path)
        if name.split(".")[0] == driver and not str(path.relative_to(ROOT)).startswith(room)
    ]
    assert offenders == []


def private_module_of(name: str) -> str | None:
    """The package whose private module ``name`` is (``tiers.task._tier`` -> ``tiers.task``)."""
    parts = name.split(".")
    for i, part in enumerate(parts):
        if part.startswith("_") and not part.startswith("__"):
            return ".".join(parts[:i])
    return None


def package_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts[:-1])


@pytest.mark.parametrize("package", LAYERS)
def test_no_imports_of_another_packages_private_modules(package: str) -> None:
    # A package's private modules (a leading underscore) are its own: others import its public face.
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in package_files(package)
        for name in imports_of(path)
        if (owner := private_module_of(name)) is not None
        and owner.split(".")[0] in LAYERS
        and not package_of(path).startswith(owner)
    ]
    assert offenders == []


def private_names_imported(path: Path) -> set[str]:
    """``module.name`` for every underscore name a file imports from a module (``from m import _x``)."""
    tree = ast.parse(path.read_text(), filename=str(path))
    return {
        f"{node.module}.{alias.name}"
        for node in ast.walk(tree)
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0
        for alias in node.names
        if alias.name.startswith("_") and not alias.name.startswith("__")
    }


def owner_of(name: str) -> str:
    """The package a name imported from a module belongs to (``api.app._x`` -> ``api``)."""
    module = name.rsplit(".", 1)[0]
    if (ROOT / module.replace(".", "/")).is_dir():
        return module
    return module.rsplit(".", 1)[0]


@pytest.mark.parametrize("package", LAYERS)
def test_no_private_names_imported_from_another_package(package: str) -> None:
    offenders = [
        f"{path.relative_to(ROOT)} imports {name}"
        for path in package_files(package)
        for name in private_names_imported(path)
        if name.split(".")[0] in LAYERS and not package_of(path).startswith(owner_of(name))
    ]
    assert offenders == []


def test_private_import_check_sees_a_violation() -> None:
    assert private_module_of("tiers.task._tier") == "tiers.task"
    assert private_module_of("tiers.task") is None
    assert private_module_of("tiers.__init__") is None
    assert package_of(ROOT / "tiers" / "task" / "_tier.py") == "tiers.task"
    assert package_of(ROOT / "memory" / "facade.py") == "memory"


def test_private_name_check_sees_a_violation(tmp_path: Path) -> None:
    bad = tmp_path / "bad.py"
    bad.write_text("from tiers.items import Item, _box\nfrom tiers.task import __version__\n")
    assert private_names_imported(bad) == {"tiers.items._box"}
    assert owner_of("tiers.items._box") == "tiers.items"
    assert owner_of("api.app._tune_embedder") == "api"
    assert owner_of("tiers.redaction._rules._DIGIT_RUN") == "tiers.redaction"


def test_layer_check_sees_a_violation(tmp_path: Path) -> None:
    # The checker itself must be able to fail.
    bad = tmp_path / "bad.py"
    bad.write_text(
        "import api.app\nfrom memory.facade import Memory\n"
        "import importlib\nfrom importlib import import_module\n"
        "def later():\n"
        "    importlib.import_module('api.server')\n"
        "    import_module('api.deps')\n"
        "    __import__('api.errors')\n"
    )
    assert imports_of(bad) == {
        "api.app",
        "memory.facade",
        "importlib",
        "api.server",
        "api.deps",
        "api.errors",
    }


def test_public_surface_is_pinned() -> None:
    assert sorted(memory.__all__) == [
        "ApiKeyError",
        "ApiKeyNotFoundError",
        "Approval",
        "ApprovalPendingError",
        "ApprovalRecord",
        "AsyncMemory",
        "AuthenticationError",
        "BackendUnavailableError",
        "BudgetExceededError",
        "Charged",
        "Checkpoint",
        "CheckpointNotFoundError",
        "ClientError",
        "CompensationError",
        "ConflictError",
        "ContextSection",
        "ContinuationContext",
        "CorruptRecordError",
        "DataDirLockedError",
        "EffectNotFoundError",
        "EffectOutcomeUnknownError",
        "EffectRecord",
        "EmbedderError",
        "EncryptionKeyError",
        "Event",
        "ExtractiveSummarizer",
        "FactCandidate",
        "FactNotFoundError",
        "IndexRepair",
        "IndexReport",
        "InputMismatchError",
        "InvalidApiKeyError",
        "InvalidInputError",
        "InvalidScopeInputError",
        "InvalidScopeSnapshotError",
        "InvalidSummarizerConfigError",
        "InvalidTranscriptError",
        "LeaseHeldError",
        "LiteLLMSummarizer",
        "Memory",
        "MemoryLayerError",
        "Message",
        "NOT_DONE",
        "NotFoundError",
        "PendingApproval",
        "PermissionDeniedError",
        "PlanMismatchError",
        "PromptBudgetTooSmallError",
        "PromptContext",
        "ReadOnlyScopeError",
        "RecalledSession",
        "Redactor",
        "RetentionPolicy",
        "RunCancelledError",
        "RunHandle",
        "RunInfo",
        "RunNotFoundError",
        "RunPausedError",
        "RunStateError",
        "RunStatus",
        "ScopeError",
        "ScopeManager",
        "ServiceError",
        "ServiceOverloadedError",
        "SessionNotFoundError",
        "SessionSummary",
        "Settings",
        "StaleWriterError",
        "StoreClosedError",
        "Summarization",
        "Summarizer",
        "SummarizerError",
        "SummarizerRateLimitError",
        "SummarizerTimeoutError",
        "SummarizerUnavailableError",
        "SummaryGenerationError",
        "SummaryJob",
        "SummaryUsage",
        "SweepReport",
        "SystemContext",
        "ThreadConflictError",
        "TierError",
        "TokenBudgetExceededError",
        "ToolCall",
        "Trace",
        "TraceEntry",
        "UndecryptableValueError",
        "UserFact",
        "ValueTooLargeError",
        "VolatileStoreError",
        "WorkingMemory",
        "run_id_for",
    ]
    for name in memory.__all__:
        value = getattr(memory, name)
        module = getattr(value, "__module__", None) or type(value).__module__
        assert module.split(".")[0] in LAYERS, name
