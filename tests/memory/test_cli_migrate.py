"""``tiermem migrate``: a store written by the previous release, migrated from the command line."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from memory import Memory
from memory.cli import app as cli
from tests.tiers.v1_store import load_v1_store, v1_rows
from tiers.task import LATEST_LAYOUT, layout_version


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERMEM_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("TIERMEM_KV_URL", raising=False)
    monkeypatch.delenv("TIERMEM_VECTOR_URL", raising=False)
    with Memory.open(tmp_path) as memory:
        load_v1_store(memory.kv)
    return tmp_path


def test_migrate_dry_run_refusal_force_and_rerun(data_dir: Path) -> None:
    dry = CliRunner().invoke(cli, ["migrate", "--dry-run"])
    assert dry.exit_code == 0, dry.output
    assert "acme: layout 1, 1 run(s)" in dry.stdout
    assert "would move layout 1 -> 2 (dry run, nothing written)" in dry.stdout

    refused = CliRunner().invoke(cli, ["migrate"])
    assert refused.exit_code == 1  # default: r-leased holds a live lease
    assert "default: layout 1, 5 run(s), 4 unfinished, 1 with a live lease: refused" in (
        refused.stdout
    )
    assert "acme: layout 1, 1 run(s), 1 unfinished, 0 with a live lease: moved layout 1 -> 2" in (
        refused.stdout
    )

    forced = CliRunner().invoke(cli, ["migrate", "--tenant", "default", "--force"])
    assert forced.exit_code == 0, forced.output
    assert "default: layout 1" in forced.stdout
    assert "moved layout 1 -> 2" in forced.stdout
    again = CliRunner().invoke(cli, ["migrate"])
    assert again.exit_code == 0, again.output
    assert again.stdout.count("already on the newest layout") == 2

    with Memory.open(data_dir) as memory:
        assert layout_version(memory.kv, "default") == LATEST_LAYOUT
        stored = {(s, k): v for s, k, v in v1_rows()}
        # The rows the previous release wrote are all still there, byte for byte.
        for (space, key), value in stored.items():
            assert memory.kv.get_many(space, [key]) == [value]
        run = memory.start_run("alice", "r-mid")
        assert run.step("plan", lambda: "again") == "p"
