"""One process per embedded data dir: an OS lock held while a Memory has the dir open.

Two processes on one embedded data dir diverge silently (each has its own
embedded Chroma state), so the second opener is refused with an error naming
the dir and the holder's pid; the OS drops the lock when the holder dies, even
by SIGKILL.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from typer.testing import CliRunner

from memory import BackendUnavailableError, Memory
from memory.cli import app as cli

ROOT = Path(__file__).resolve().parents[2]

# Opens the dir, says so, then waits to be killed (optionally after forking a child that
# outlives it, to show a forked child does not keep the lock).
HOLDER = textwrap.dedent(
    """
    import os, sys, time
    from memory import Memory
    memory = Memory.open(sys.argv[1])
    memory.set_fact("u1", "tone", "concise")
    if len(sys.argv) > 2:
        child = os.fork()
        if child == 0:
            time.sleep(600)
            os._exit(0)
        print("child", child, flush=True)
    print("open", flush=True)
    time.sleep(600)
    """
)

OPEN_ONCE = textwrap.dedent(
    """
    import sys
    from memory import Memory
    Memory.open(sys.argv[1]).close()
    print("opened", flush=True)
    """
)


def _env() -> dict[str, str]:
    return {**os.environ, "PYTHONPATH": str(ROOT)}


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """A live process that has ``tmp_path / 'data'`` open."""
    data = tmp_path / "data"
    proc = start_holder(data)
    try:
        yield proc, data
    finally:
        proc.kill()
        proc.wait()


def start_holder(data: Path, *extra: str) -> subprocess.Popen[str]:
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLDER, str(data), *extra],
        env=_env(),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stdout is not None
    line = proc.stdout.readline()
    if line.startswith("child "):
        proc.child_pid = int(line.split()[1])  # type: ignore[attr-defined]
        line = proc.stdout.readline()
    if line.strip() != "open":
        proc.kill()
        pytest.fail(f"the holder did not open the dir: {proc.communicate()[1][-2000:]}")
    return proc


def test_a_second_process_is_refused_naming_the_dir_and_the_holder(
    holder: tuple[subprocess.Popen[str], Path],
) -> None:
    proc, data = holder
    second = subprocess.run(
        [sys.executable, "-c", OPEN_ONCE, str(data)],
        env=_env(),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert second.returncode != 0, second.stdout
    assert "DataDirLockedError" in second.stderr
    assert str(data) in second.stderr
    assert f"pid {proc.pid}" in second.stderr


def test_the_lock_goes_with_a_sigkilled_holder(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = start_holder(data)
    with pytest.raises(BackendUnavailableError, match=f"pid {proc.pid}"):
        Memory.open(data)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    with Memory.open(data) as memory:  # no stale lock to clean up by hand
        assert memory.get_fact("u1", "tone").value == "concise"


def test_a_forked_child_does_not_keep_the_lock(tmp_path: Path) -> None:
    data = tmp_path / "data"
    proc = start_holder(data, "fork")
    child: int = proc.child_pid  # type: ignore[attr-defined]
    try:
        proc.send_signal(signal.SIGKILL)
        proc.wait()
        os.kill(child, 0)  # the child lives on
        with Memory.open(data) as memory:
            assert memory.get_fact("u1", "tone").value == "concise"
    finally:
        os.kill(child, signal.SIGKILL)


def test_the_same_process_opening_twice_gets_an_error_not_a_deadlock(tmp_path: Path) -> None:
    with Memory.open(tmp_path) as first:
        started = time.monotonic()
        with pytest.raises(BackendUnavailableError, match="this process") as refused:
            Memory.open(tmp_path)
        assert time.monotonic() - started < 5
        assert type(refused.value).__name__ == "DataDirLockedError"
        assert str(tmp_path) in str(refused.value)
        # The refused open changed nothing: the first instance works on.
        first.set_fact("u1", "tone", "concise")
        assert first.get_fact("u1", "tone").value == "concise"
    # Closed, the dir opens again (close-then-reopen is how notebooks and tests use it).
    with Memory.open(tmp_path) as again:
        assert again.get_fact("u1", "tone").value == "concise"
    with Memory.open(tmp_path) as again:
        assert again.get_fact("u1", "tone").value == "concise"


def test_redis_beside_the_embedded_index_still_locks_the_dir(
    tmp_path: Path, redis_url: str
) -> None:
    # Redis + a Chroma server would leave the data dir unused; Redis alone still puts the
    # embedded index there, so it is locked.
    with Memory.open(tmp_path, kv_url=redis_url), pytest.raises(BackendUnavailableError):
        Memory.open(tmp_path, kv_url=redis_url)


@pytest.fixture
def cli_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    data = tmp_path / "data"
    monkeypatch.setenv("TIERMEM_DATA_DIR", str(data))
    monkeypatch.delenv("TIERMEM_KV_URL", raising=False)
    monkeypatch.delenv("TIERMEM_VECTOR_URL", raising=False)
    return data


@pytest.mark.parametrize("command", [["reindex"], ["resummarize"], ["sweep"]])
def test_maintenance_commands_beside_a_live_server_are_refused(
    cli_env: Path, command: list[str]
) -> None:
    proc = start_holder(cli_env)
    try:
        result = CliRunner().invoke(cli, command)
    finally:
        proc.kill()
        proc.wait()
    assert result.exit_code == 1, result.output
    assert f"pid {proc.pid}" in result.stderr
    assert str(cli_env) in result.stderr
    assert "stop" in result.stderr  # the advice: stop the server (or use its routes)
    # Once the holder is gone the same command runs.
    again = CliRunner().invoke(cli, command)
    assert again.exit_code == 0, again.output
