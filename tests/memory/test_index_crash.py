"""Background indexing (the Memory default) survives a SIGKILL between KV commit and index write.

A real process saves sessions through ``Memory.open`` (background indexing:
a save returns once its KV commit is durable, the vectors are written later
by a worker thread) and is killed with SIGKILL at a random point. The next
instance opened on the folder must replay the outbox on its own: the backlog
drains to zero and every acknowledged session is in the index, checked
without calling recall (recall finishes a user's queued work itself, which
would hide a replay that never happens).
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from memory import Memory
from tests.waiting import wait_until
from tiers import keys
from tiers.backends import open_kv_store

_WORKER = """
import sys
from memory import Memory, SessionSummary

data_dir, first = sys.argv[1], int(sys.argv[2])
memory = Memory.open(data_dir)  # background indexing: the default
assert memory.background_indexing
i = first
while True:
    user, session = f"u{i % 3}", f"s{i}"
    if i % 5 == 0:
        memory.end_session(user, session, [
            {"role": "user", "content": f"Calibrate telescope mirror m{i} before the eclipse."},
            {"role": "assistant", "content": f"We decided to recoat mirror m{i} first."},
        ])
    else:
        memory.save_session(SessionSummary(
            session_id=session, user_id=user,
            task_description=f"calibrate telescope mirror m{i} for the observatory",
        ))
    print(user, session, flush=True)  # acknowledged: the save returned
    i += 1
"""

TENANT = "default"


def _run_and_kill(data_dir: Path, first: int, rng: random.Random) -> list[tuple[str, str]]:
    """Start a worker, let it acknowledge some saves, SIGKILL it; return what it acknowledged."""
    worker = subprocess.Popen(
        [sys.executable, "-c", _WORKER, str(data_dir), str(first)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env={**os.environ, "LITELLM_LOCAL_MODEL_COST_MAP": "True"},
    )
    assert worker.stdout is not None
    acknowledged: list[tuple[str, str]] = []
    try:
        wanted = rng.randint(20, 120)
        for line in worker.stdout:
            user, session = line.split()
            acknowledged.append((user, session))
            if len(acknowledged) >= wanted:
                break
        assert acknowledged, worker.stderr.read() if worker.stderr else "the worker died"
        os.kill(worker.pid, signal.SIGKILL)
        worker.wait(30)
        # Lines it printed before the kill landed were acknowledged too.
        acknowledged += [tuple(line.split()) for line in worker.stdout.read().splitlines()]  # type: ignore[misc]
    finally:
        if worker.poll() is None:
            worker.kill()
            worker.wait()
        worker.stdout.close()
        if worker.stderr is not None:
            worker.stderr.close()
    assert worker.returncode == -signal.SIGKILL
    return acknowledged


def _outbox(memory: Memory) -> list[tuple[str, bytes]]:
    return memory.kv.scan(keys.session_outbox_space(TENANT))


@pytest.mark.slow
def test_a_killed_background_indexer_is_replayed_by_the_next_instance(tmp_path: Path) -> None:
    data_dir = tmp_path / "data"
    rng = random.Random(20260301)
    acknowledged: list[tuple[str, str]] = []
    rounds_with_backlog = 0
    for round_number in range(3):
        acknowledged += _run_and_kill(data_dir, round_number * 10_000, rng)
        # What the kill left queued, read before an instance (and its worker) starts.
        kv = open_kv_store(str(data_dir / "tiermem.sqlite3"))
        try:
            backlog = len(kv.scan(keys.session_outbox_space(TENANT)))
        finally:
            kv.close()
        rounds_with_backlog += backlog > 0
        with Memory.open(data_dir) as memory:
            assert memory.background_indexing
            # The new instance's worker replays the outbox by itself: no recall, no flush.
            wait_until(
                lambda: _outbox(memory) == [],
                120,
                what="the outbox left by the killed process to drain",
                every_s=0.05,
            )
            # Every acknowledged session is in the KV store and indexed: its summary vector.
            for user in ("u0", "u1", "u2"):
                saved = {sid for u, sid in acknowledged if u == user}
                stored = {key for key, _ in memory.kv.scan(keys.sessions_space(TENANT, user))}
                assert saved <= stored, user
                indexed = set(memory.index.ids(where={"tenant": TENANT, "user_id": user}))
                summary_ids = {vid for vid in indexed if "#" not in vid}
                assert summary_ids == {
                    keys.session_vector_id(TENANT, user, sid) for sid in stored
                }, user
            # And recallable (nothing is queued now, so recall settles nothing itself).
            user, session = acknowledged[-1]
            number = session.removeprefix("s")
            hits = memory.recall_relevant(user, f"telescope mirror m{number}", top_k=3)
            assert session in {hit.summary.session_id for hit in hits}
    # The kills must have left index work behind at least once, or this proved nothing.
    assert rounds_with_backlog >= 1
    print(f"rounds with a backlog: {rounds_with_backlog} of 3")
