"""The maintenance commands: ``tiermem reindex``, ``resummarize``, ``sweep`` and ``retention``."""

from __future__ import annotations

import shutil
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memory import Memory, SessionSummary
from memory.cli import app as cli

TRANSCRIPT = [
    {"role": "user", "content": "Can you plan the Kubernetes upgrade for the staging cluster?"},
    {"role": "assistant", "content": "We decided to upgrade the control plane first."},
    {"role": "assistant", "content": "Next step: drain the old node pool on Monday."},
]


@pytest.fixture
def data_dir(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("TIERMEM_DATA_DIR", str(tmp_path))
    monkeypatch.delenv("TIERMEM_KV_URL", raising=False)
    monkeypatch.delenv("TIERMEM_VECTOR_URL", raising=False)
    return tmp_path


def test_reindex_rebuilds_a_lost_index_from_the_kv_store(data_dir: Path) -> None:
    with Memory.open(data_dir) as memory:
        for n, topic in enumerate(["billing database migration", "kubernetes upgrade plan"]):
            memory.save_session(
                SessionSummary(session_id=f"s{n}", user_id="u1", task_description=topic)
            )
        memory.set_fact("u2", "language", "en")  # a user with no sessions is no trouble
    chroma = [p for p in data_dir.iterdir() if p.is_dir()]
    assert chroma, "the embedded index should live in the data dir"
    for folder in chroma:
        shutil.rmtree(folder)

    result = CliRunner().invoke(cli, ["reindex"])
    assert result.exit_code == 0, result.output
    assert "reindexed 2 sessions of tenant default" in result.stdout

    with Memory.open(data_dir) as memory:
        assert memory.index.count() == 2
        hits = memory.recall_relevant("u1", "kubernetes", top_k=1)
        assert hits[0].summary.session_id == "s1"


def test_resummarize_summarizes_every_pending_transcript(data_dir: Path) -> None:
    with Memory.open(data_dir) as memory:
        memory.save_transcript("u1", "s1", TRANSCRIPT)
        memory.for_tenant("acme").save_transcript("u9", "s1", TRANSCRIPT)
        assert memory.pending_summaries("u1") == ["s1"]

    result = CliRunner().invoke(cli, ["resummarize"])
    assert result.exit_code == 0, result.output
    assert "summarized 1 of 1 pending sessions" in result.stdout

    with Memory.open(data_dir) as memory:
        assert memory.pending_summaries("u1") == []
        summary = memory.get_session("u1", "s1")
        assert any("control plane" in d for d in summary.decisions_made)
        # Another tenant is only touched when asked for.
        assert memory.for_tenant("acme").pending_summaries("u9") == ["s1"]
    acme = CliRunner().invoke(cli, ["resummarize", "--tenant", "acme", "--user", "u9"])
    assert acme.exit_code == 0, acme.output
    assert "summarized 1 of 1" in acme.stdout


def test_a_bad_tenant_is_a_clear_error(data_dir: Path) -> None:
    result = CliRunner().invoke(cli, ["reindex", "--tenant", "no spaces"])
    assert result.exit_code == 1
    assert "tenant 'no spaces' is invalid" in result.stderr


def test_the_tiermem_script_adds_serve_at_the_top_layer() -> None:
    from api.cli import app as script

    library = CliRunner().invoke(cli, ["--help"])
    full = CliRunner().invoke(script, ["--help"])
    assert library.exit_code == full.exit_code == 0
    for command in ("demo", "info", "keys", "reindex", "resummarize"):
        assert command in library.stdout
        assert command in full.stdout
    assert "serve" not in library.stdout  # the memory package knows nothing of the service
    assert "serve" in full.stdout
    served = CliRunner().invoke(script, ["serve", "--help"])
    assert served.exit_code == 0
    assert "--no-auth" in served.stdout


def test_sweep_deletes_only_runs_finished_past_the_retention(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with Memory.open(data_dir) as memory:
        done = memory.start_run("u1", "done")
        done.step("a", lambda: 1)
        done.complete()
        memory.start_run("u1", "running").step("a", lambda: 1)
        other = memory.for_tenant("acme").start_run("u1", "done")
        other.complete()

    kept = CliRunner().invoke(cli, ["sweep"])  # default retention: 7 days
    assert kept.exit_code == 0, kept.output
    assert "deleted 0 finished runs of tenant default" in kept.stdout

    monkeypatch.setenv("TIERMEM_RUN_RETENTION_DAYS", "0.000000001")
    swept = CliRunner().invoke(cli, ["sweep"])
    assert swept.exit_code == 0, swept.output
    assert "deleted 1 finished runs of tenant default" in swept.stdout
    with Memory.open(data_dir) as memory:
        assert [r.run_id for r in memory.list_runs()] == ["running"]
        assert memory.for_tenant("acme").get_run("done").status.value == "completed"


def test_retention_is_set_per_tenant_and_applied_by_sweep(
    data_dir: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TIERMEM_RETENTION_FACTS_DAYS", "30")  # the deployment's default
    shown = CliRunner().invoke(cli, ["retention", "show", "--tenant", "acme"])
    assert shown.exit_code == 0, shown.output
    assert shown.stdout.splitlines() == [
        "sessions\toff\tdefault",
        "transcripts\toff\tdefault",
        "facts\t30d\tdefault",
        "idle_runs\toff\tdefault",
    ]
    changed = CliRunner().invoke(
        cli, ["retention", "set", "--tenant", "acme", "--sessions", "90d", "--facts", "off"]
    )
    assert changed.exit_code == 0, changed.output
    assert "sessions\t90d\ttenant" in changed.stdout
    assert "facts\toff\ttenant" in changed.stdout
    bad = CliRunner().invoke(cli, ["retention", "set", "--tenant", "acme", "--sessions", "soon"])
    assert bad.exit_code == 1
    assert "sessions must be a duration" in bad.stderr
    assert CliRunner().invoke(cli, ["retention", "set", "--tenant", "acme"]).exit_code == 2

    old = datetime.now(UTC) - timedelta(days=100)
    with Memory.open(data_dir) as memory:
        memory.for_tenant("acme").end_session("u1", "old", TRANSCRIPT, created_at=old)
        memory.for_tenant("acme").users.set_fact("u1", "k", "v", updated_at=old)
        memory.users.set_fact("u1", "k", "v", updated_at=old)

    acme = CliRunner().invoke(cli, ["sweep", "--tenant", "acme"])
    assert acme.exit_code == 0, acme.output
    assert "retention: deleted 0 idle runs, 1 sessions, 0 transcripts, 0 fact versions" in (
        acme.stdout
    )
    default = CliRunner().invoke(cli, ["sweep"])
    assert "retention: deleted 0 idle runs, 0 sessions, 0 transcripts, 1 fact versions" in (
        default.stdout
    )
    with Memory.open(data_dir) as memory:
        assert memory.for_tenant("acme").list_sessions("u1") == []
        assert memory.for_tenant("acme").get_fact("u1", "k").value == "v"  # facts off in acme
        assert memory.get_facts("u1") == []


def test_reindex_and_resummarize_reach_every_tenant(data_dir: Path) -> None:
    """Issue 13, defect 6: a lost index is checked and repaired for every tenant in one command."""
    with Memory.open(data_dir) as memory:
        for tenant in ("default", "acme", "globex"):
            view = memory.for_tenant(tenant)
            view.save_session(
                SessionSummary(session_id="s1", user_id="u1", task_description="kubernetes upgrade")
            )
            view.save_transcript("u2", "s2", TRANSCRIPT)
    for folder in (p for p in data_dir.iterdir() if p.is_dir()):
        shutil.rmtree(folder)  # the index is lost while nothing runs

    check = CliRunner().invoke(cli, ["reindex", "--all-tenants", "--check"])
    assert check.exit_code == 1, check.output
    for tenant in ("acme", "default", "globex"):
        assert f"tenant {tenant}: index DAMAGED: 1 vectors expected, 1 missing" in check.stdout

    repaired = CliRunner().invoke(cli, ["reindex", "--all-tenants"])
    assert repaired.exit_code == 0, repaired.output
    for tenant in ("acme", "default", "globex"):
        assert f"reindexed 1 sessions of tenant {tenant}" in repaired.stdout
        assert f"tenant {tenant}: index consistent" in repaired.stdout
    assert CliRunner().invoke(cli, ["reindex", "--all-tenants", "--check"]).exit_code == 0

    summarized = CliRunner().invoke(cli, ["resummarize", "--all-tenants"])
    assert summarized.exit_code == 0, summarized.output
    for tenant in ("acme", "default", "globex"):
        assert f"summarized 1 of 1 pending sessions of tenant {tenant}" in summarized.stdout
    with Memory.open(data_dir) as memory:
        for tenant in ("default", "acme", "globex"):
            view = memory.for_tenant(tenant)
            assert view.pending_summaries("u2") == []
            assert view.recall_relevant("u1", "kubernetes", top_k=1)[0].similarity is not None

    both = CliRunner().invoke(cli, ["reindex", "--all-tenants", "--user", "u1"])
    assert both.exit_code == 2
    assert "not with --all-tenants" in both.output
