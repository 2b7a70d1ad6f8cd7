"""The ``tiermem runs`` commands (list, show, dry-run) and ``sweep --all-tenants``."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memory import Memory
from memory.cli import app as cli


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    data = tmp_path / "data"
    monkeypatch.setenv("TIERMEM_DATA_DIR", str(data))
    monkeypatch.delenv("TIERMEM_KV_URL", raising=False)
    monkeypatch.delenv("TIERMEM_VECTOR_URL", raising=False)
    return data


def test_runs_list_show_and_dry_run(data_dir: Path) -> None:
    with Memory.open(data_dir) as memory:
        run = memory.start_run("alice", "r1")
        run.step("plan", lambda: 1)
        run.step("act", lambda: 2)
        first = memory.run_history("r1")[0]
        memory.update_run_state("r1", first.checkpoint_id, {"edited": True})
        memory.fork_run("r1", first.checkpoint_id, "r1-fork")
        memory.start_run("bob", "r2").complete("done")
        memory.for_tenant("acme").start_run("carol", "r3")

    listed = CliRunner().invoke(cli, ["runs", "list", "--user", "alice"])
    assert listed.exit_code == 0, listed.output
    assert [line.split("\t")[1] for line in listed.output.splitlines()] == ["r1", "r1-fork"]
    done = CliRunner().invoke(cli, ["runs", "list", "--status", "completed"])
    assert [line.split("\t")[1] for line in done.output.splitlines()] == ["r2"]
    every = CliRunner().invoke(cli, ["runs", "list", "--all-tenants"])
    assert {line.split("\t")[1] for line in every.output.splitlines()} >= {"r1", "r2", "r3"}

    shown = CliRunner().invoke(cli, ["runs", "show", "r1"])
    assert shown.exit_code == 0, shown.output
    lines = shown.output.splitlines()
    assert lines[0].startswith("run r1  user alice")
    assert any("#1 plan" in line for line in lines)
    assert any("#2 act" in line and "(superseded)" in line for line in lines)
    assert any("=> fork r1-fork" in line for line in lines)

    planned = CliRunner().invoke(cli, ["runs", "dry-run", "r1"])
    assert planned.exit_code == 0, planned.output
    plan = json.loads(planned.output)
    assert plan["run_id"] == "r1"
    assert "act" not in [r["step"] for r in plan["replays"]]  # superseded: it runs again

    missing = CliRunner().invoke(cli, ["runs", "show", "nope"])
    assert missing.exit_code == 1


def test_sweep_all_tenants_sweeps_each(data_dir: Path) -> None:
    with Memory.open(data_dir) as memory:
        memory.for_tenant("acme")
    swept = CliRunner().invoke(cli, ["sweep", "--all-tenants"])
    assert swept.exit_code == 0, swept.output
    assert "tenant acme" in swept.output
    assert "tenant default" in swept.output
