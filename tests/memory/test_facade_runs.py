"""The run primitives of the facade and its async twin, on an embedded Memory."""

from __future__ import annotations

from pathlib import Path

import anyio
import pytest

from memory import (
    AsyncMemory,
    BudgetExceededError,
    Charged,
    InvalidInputError,
    Memory,
    RunNotFoundError,
    run_id_for,
)
from tiers import keys
from tiers.task import EventKind


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


def test_a_spent_budget_is_raised_with_memory_set_budget(tmp_path: Path) -> None:
    with Memory.open(tmp_path / "data") as memory:
        run = memory.start_run("u1", "r1", budget_tokens=10, budget_cost=1.0)
        run.step("llm", lambda: Charged("a", tokens=10))
        with pytest.raises(BudgetExceededError, match=r"Memory\.set_budget") as spent:
            run.step("more", lambda: "b")
        assert "10 of 10 tokens" in str(spent.value)
        # Only the limit given changes; the other stays.
        info = memory.set_budget("r1", tokens=100, by="ops")
        assert (info.budget_tokens, info.budget_cost) == (100, 1.0)
        assert run.step("more", lambda: "b") == "b"
        # None removes a limit.
        info = memory.set_budget("r1", cost=None)
        assert (info.budget_tokens, info.budget_cost) == (100, None)
        changes = [e.data for e in memory.run_events("r1") if e.kind is EventKind.BUDGET_SET]
        assert changes == [
            {"budget_tokens": 100, "by": "ops", "by_key": None},
            {"budget_cost": None, "by": "operator", "by_key": None},
        ]

        before = memory.get_run("r1")
        for bad in ({}, {"tokens": -1}, {"tokens": True}, {"tokens": 1.5}, {"cost": float("nan")}):
            with pytest.raises(InvalidInputError) as refused:
                memory.set_budget("r1", **bad)  # type: ignore[arg-type]
            assert refused.value.field in ("budget_tokens", "budget_cost"), bad
        assert memory.get_run("r1") == before
        with pytest.raises(RunNotFoundError):
            memory.set_budget("nope", tokens=5)


def test_async_memory_sets_a_budget(tmp_path: Path) -> None:
    async def scenario() -> None:
        async with AsyncMemory.open(tmp_path / "data") as memory:
            run = await memory.start_run("u1", "r1", budget_cost=0.5)
            run.step("llm", lambda: Charged("a", cost=0.5))
            with pytest.raises(BudgetExceededError):
                run.step("more", lambda: "b")
            info = await memory.set_budget("r1", cost=2.0, by="ops", by_key="key-1")
            assert (info.budget_tokens, info.budget_cost) == (None, 2.0)
            assert run.step("more", lambda: "b") == "b"
            (change,) = [e for e in await memory.run_events("r1") if e.kind is EventKind.BUDGET_SET]
            assert change.data == {"budget_cost": 2.0, "by": "ops", "by_key": "key-1"}

    anyio.run(scenario)
