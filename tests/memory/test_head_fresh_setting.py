"""``TIERMEM_HEAD_FRESH_MS``: the run handles' head window, set for a whole deployment.

It reaches the task tier of every tenant a :class:`Memory` serves and of a
worker, a handle takes it from its tier, and a bad value is an error naming
the setting (the library: ``ValidationError`` on ``head_fresh_ms``; the CLI:
a usage error naming the variable; ``Memory(head_fresh_ms=)``: an
``InvalidInputError`` on the field).
"""

from __future__ import annotations

from pathlib import Path

import pytest
from pydantic import ValidationError
from typer.testing import CliRunner

from memory import Memory, Settings
from memory.cli import app as cli
from memory.workers._worker import task_tier_from_settings
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import InvalidInputError
from tiers.task import DEFAULT_HEAD_FRESH_MS


@pytest.fixture
def env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERMEM_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("TIERMEM_KV_URL", raising=False)
    monkeypatch.delenv("TIERMEM_VECTOR_URL", raising=False)
    monkeypatch.delenv("TIERMEM_HEAD_FRESH_MS", raising=False)
    return tmp_path


def test_the_default_is_the_task_tiers(env: Path) -> None:
    assert Settings().head_fresh_ms == DEFAULT_HEAD_FRESH_MS == 50


def test_the_setting_reaches_every_tenants_runs(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERMEM_HEAD_FRESH_MS", "0")
    with Memory.from_settings() as memory:
        assert memory.tasks.head_fresh_ms == 0
        assert memory.start_run("u1", "r1").head_fresh_ms == 0
        view = memory.for_tenant("acme")
        assert view.tasks.head_fresh_ms == 0
        assert view.start_run("u1", "r1").head_fresh_ms == 0


def test_memory_open_takes_it_as_a_keyword(tmp_path: Path) -> None:
    with Memory.open(tmp_path, head_fresh_ms=12.5) as memory:
        run = memory.start_run("u1", "r1")
        assert run.head_fresh_ms == 12.5
        assert run.append_checkpoint("s", 1).seq == 1


def test_a_workers_task_tier_takes_it_from_the_settings(tmp_path: Path) -> None:
    kv = SqliteKVStore(tmp_path / "kv.sqlite3")
    try:
        settings = Settings(data_dir=tmp_path, head_fresh_ms=7)
        assert task_tier_from_settings(kv, settings, "default").head_fresh_ms == 7
    finally:
        kv.close()


@pytest.mark.parametrize("bad", ["-1", "inf", "nan", "fast"])
def test_a_bad_setting_is_an_error_naming_it(
    env: Path, monkeypatch: pytest.MonkeyPatch, bad: str
) -> None:
    monkeypatch.setenv("TIERMEM_HEAD_FRESH_MS", bad)
    with pytest.raises(ValidationError) as refused:
        Settings()
    assert [e["loc"] for e in refused.value.errors()] == [("head_fresh_ms",)]
    result = CliRunner().invoke(cli, ["info"])
    assert result.exit_code == 2
    assert "TIERMEM_HEAD_FRESH_MS" in result.stderr


def test_tiermem_info_shows_it(env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TIERMEM_HEAD_FRESH_MS", "20")
    result = CliRunner().invoke(cli, ["info"])
    assert result.exit_code == 0
    assert "head_fresh_ms = 20.0" in result.stdout.splitlines()


def test_a_bad_keyword_is_refused_before_anything_starts(tmp_path: Path) -> None:
    kv = SqliteKVStore(tmp_path / "kv.sqlite3")
    embedder = MiniLMEmbedder()
    index = ChromaVectorIndex(tmp_path / "chroma", embedder=embedder)
    try:
        with pytest.raises(InvalidInputError) as refused:
            Memory(kv=kv, index=index, embedder=embedder, head_fresh_ms=-1)
        assert refused.value.field == "head_fresh_ms"
    finally:
        index.close()
        kv.close()
