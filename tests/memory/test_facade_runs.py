"""The run primitives of the facade and its async twin, on an embedded Memory."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from memory import AsyncMemory, Memory, RunNotFoundError, run_id_for
from tiers import keys


def test_memory_run_primitives(tmp_path: Path) -> None:
    with Memory.open(tmp_path / "data") as memory:
        run = memory.start_run("u1", external_id="session:abc/1")
        assert run.run_id == run_id_for("session:abc/1")
        assert memory.get_run(run.run_id).external_id == "session:abc/1"
        made = [run.append_checkpoint("s", n, idempotency_key=f"k{n}") for n in range(4)]
        assert memory.get_checkpoint(run.run_id, made[2].checkpoint_id) == made[2]
        assert memory.checkpoint_for_key(run.run_id, "k1") == made[1]
        assert memory.checkpoint_for_key(run.run_id, "k7") is None
        assert memory.run_history(run.run_id) == made
        assert memory.run_history(run.run_id, newest_first=True, limit=2) == made[:1:-1]
        assert memory.run_history(run.run_id, newest_first=True, before_seq=2) == [made[0]]
        assert memory.run_history(run.run_id, after_seq=3) == [made[3]]

        assert memory.delete_run(run.run_id) is True
        assert memory.kv.scan(keys.run_space(memory.tenant, run.run_id)) == []
        assert memory.delete_run(run.run_id) is False
        with pytest.raises(RunNotFoundError):
            memory.run_history(run.run_id, newest_first=True, limit=1)
        with pytest.raises(RunNotFoundError):
            run.append_checkpoint("late", 1)


def test_async_memory_run_primitives(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncMemory.open(tmp_path / "data") as memory:
            run = await memory.start_run("u1", external_id="thread 9")
            ckpt = run.append_checkpoint("s", "out", idempotency_key="k")
            assert await memory.get_checkpoint(run.run_id, ckpt.checkpoint_id) == ckpt
            assert await memory.checkpoint_for_key(run.run_id, "k") == ckpt
            assert await memory.run_history(run.run_id, newest_first=True, limit=1) == [ckpt]
            assert await memory.delete_run(run.run_id) is True
            assert await memory.delete_run(run.run_id) is False

    anyio.run(scenario)
