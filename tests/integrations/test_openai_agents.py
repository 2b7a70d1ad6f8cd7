"""TiermemSession against the real OpenAI Agents SDK (0.24), offline.

The SDK's own ``SQLiteSession`` is the reference: random sequences of session
operations run on both and must give the same items. ``Runner.run`` turns use a
scripted model (a subclass of the SDK's ``Model``), never the network.
"""

from __future__ import annotations

import asyncio
import json
import sqlite3
import subprocess
import sys
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import redis
from agents import Runner
from agents.memory import Session, SessionSettings, SQLiteSession
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from memory import AsyncMemory, ConflictError, InvalidInputError, Memory, ValueTooLargeError
from memory.integrations.openai_agents import ITEMS_STEP, POP_STEP, TiermemSession
from memory.settings import Settings
from tests.integrations.agents_worker import ScriptedModel, make_agent
from tests.kv_spies import CountingKV
from tiers import keys
from tiers.backends import open_kv_store
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.ids import run_id_for

ROOT = Path(__file__).resolve().parents[2]


def user_message(text: str) -> dict[str, Any]:
    return {"role": "user", "content": text}


def assistant_message(text: str, n: int = 1) -> dict[str, Any]:
    return {
        "id": f"msg_{n}",
        "type": "message",
        "role": "assistant",
        "status": "completed",
        "content": [{"type": "output_text", "text": text, "annotations": []}],
    }


def function_call(n: int = 1) -> dict[str, Any]:
    return {
        "type": "function_call",
        "id": f"fc_{n}",
        "call_id": f"call_{n}",
        "name": "lookup_order",
        "arguments": json.dumps({"order_id": f"A-{n}"}),
        "status": "completed",
    }


def function_output(text: str, n: int = 1) -> dict[str, Any]:
    return {"type": "function_call_output", "call_id": f"call_{n}", "output": text}


@pytest.fixture
def memory(tmp_path: Path) -> Iterator[Memory]:
    with Memory.open(tmp_path / "data") as mem:
        yield mem


def session_of(memory: Memory, user: str = "u1", **kwargs: Any) -> TiermemSession:
    return TiermemSession(memory, f"chat:{uuid.uuid4().hex[:8]}/x", user_id=user, **kwargs)


# -- the SDK's protocol ---------------------------------------------------------------------


def test_it_is_an_sdk_session_with_the_sdk_defaults(memory: Memory) -> None:
    session = TiermemSession(memory, "user:42/chat", user_id="u1")
    assert isinstance(session, Session)
    assert session.session_id == "user:42/chat"
    assert session.run_id == run_id_for("user:42/chat")
    assert session.session_settings == SessionSettings()
    limited = TiermemSession(memory, "s", user_id="u1", session_settings={"limit": 2})
    assert limited.session_settings == SessionSettings(limit=2)


def test_items_limits_pop_and_clear(memory: Memory) -> None:
    async def scenario() -> None:
        session = session_of(memory)
        assert await session.get_items() == []
        assert await session.pop_item() is None
        items = [
            user_message("hi"),
            function_call(),
            function_output("shipped"),
            assistant_message("ok"),
        ]
        await session.add_items(items[:2])
        await session.add_items([])
        await session.add_items(items[2:])
        assert await session.get_items() == items
        assert await session.get_items(limit=3) == items[1:]  # the latest 3, oldest first
        assert await session.get_items(limit=10) == items
        assert await session.get_items(limit=0) == []
        assert await session.get_items(limit=-1) == items  # as SQLiteSession: no limit
        assert await session.pop_item() == items[3]
        assert await session.get_items(limit=2) == items[1:3]
        await session.add_items([assistant_message("again", 2)])
        assert await session.get_items() == [*items[:3], assistant_message("again", 2)]
        await session.clear_session()
        assert await session.get_items() == []
        assert await session.pop_item() is None
        await session.add_items([user_message("after clear")])
        assert await session.get_items() == [user_message("after clear")]
        with pytest.raises(InvalidInputError) as bad:
            await session.get_items(limit="2")  # type: ignore[arg-type]
        assert bad.value.field == "limit"

    asyncio.run(scenario())


def test_session_settings_limit_is_the_default(memory: Memory) -> None:
    async def scenario() -> None:
        session = session_of(memory, session_settings=SessionSettings(limit=2))
        await session.add_items([user_message(str(n)) for n in range(5)])
        assert await session.get_items() == [user_message("3"), user_message("4")]
        assert await session.get_items(limit=4) == [user_message(str(n)) for n in range(1, 5)]

    asyncio.run(scenario())


OPS = st.lists(
    st.one_of(
        st.tuples(st.sampled_from(["add", "add by other"]), st.integers(min_value=0, max_value=4)),
        st.tuples(st.sampled_from(["pop", "pop by other"]), st.just(0)),
        st.tuples(st.just("clear"), st.just(0)),
        st.tuples(st.just("get"), st.sampled_from([None, -1, 0, 1, 2, 3, 5, 8, 100])),
    ),
    max_size=40,
)


@settings(
    max_examples=60,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture],
)
@given(ops=OPS)
def test_same_items_as_the_sdks_sqlite_session(memory: Memory, ops: list[tuple[str, Any]]) -> None:
    async def scenario() -> None:
        ours = session_of(memory)
        # Another object of the same session (as another process would hold): what it
        # writes must show in what ours reads, whatever ours has cached.
        other = TiermemSession(memory, ours.session_id, user_id="u1")
        reference = SQLiteSession(ours.session_id)
        try:
            counter = 0
            for op, arg in ops:
                writer = other if op.endswith("by other") else ours
                if op.startswith("add"):
                    batch = []
                    for _ in range(arg):
                        counter += 1
                        batch.append(user_message(f"m{counter}"))
                    await writer.add_items(batch)
                    await reference.add_items(batch)  # type: ignore[arg-type]
                elif op.startswith("pop"):
                    assert await writer.pop_item() == await reference.pop_item()
                elif op == "clear":
                    await ours.clear_session()
                    await reference.clear_session()
                else:
                    assert await ours.get_items(arg) == await reference.get_items(arg), arg
            assert await ours.get_items() == await reference.get_items()
        finally:
            reference.close()

    asyncio.run(scenario())


def test_sessions_are_isolated(memory: Memory) -> None:
    async def scenario() -> None:
        a, b = session_of(memory), session_of(memory)
        await a.add_items([user_message("for a")])
        await b.add_items([user_message("for b")])
        assert await b.pop_item() == user_message("for b")
        await b.clear_session()
        assert await a.get_items() == [user_message("for a")]
        # The same session id under another user is refused, never shown.
        intruder = TiermemSession(memory, a.session_id, user_id="u2")
        for attempt in (
            intruder.get_items(),
            intruder.add_items([user_message("x")]),
            intruder.pop_item(),
            intruder.clear_session(),
            intruder.end(),
        ):
            with pytest.raises(ConflictError, match="another user"):
                await attempt
        assert await a.get_items() == [user_message("for a")]

    asyncio.run(scenario())


def test_two_objects_of_one_session_share_it_without_double_pops(memory: Memory) -> None:
    async def scenario() -> None:
        first = session_of(memory)
        second = TiermemSession(memory, first.session_id, user_id="u1")
        await first.add_items([user_message("1"), user_message("2"), user_message("3")])
        assert await second.pop_item() == user_message("3")  # takes the run's lease over
        assert await first.pop_item() == user_message("2")  # fenced out, takes it back
        await second.add_items([user_message("4")])
        await first.add_items([user_message("5")])
        expected = [user_message(n) for n in ("1", "4", "5")]
        assert await first.get_items() == expected
        assert await second.get_items() == expected
        popped = await asyncio.gather(first.pop_item(), second.pop_item(), first.pop_item())
        assert sorted(p["content"] for p in popped if p) == ["1", "4", "5"]
        assert await first.get_items() == []

    asyncio.run(scenario())


def test_async_memory_and_bad_arguments(memory: Memory) -> None:
    async def scenario() -> None:
        session = TiermemSession(AsyncMemory(memory), "s-async", user_id="u1")
        await session.add_items([user_message("x")])
        assert await TiermemSession(memory, "s-async", user_id="u1").get_items() == [
            user_message("x")
        ]
        with pytest.raises(InvalidInputError) as not_json:
            await session.add_items([user_message("ok"), {"content": {1, 2}}])  # type: ignore[list-item]
        assert not_json.value.field == "items[1]"
        with pytest.raises(InvalidInputError) as not_list:
            await session.add_items(user_message("x"))  # type: ignore[arg-type]
        assert not_list.value.field == "items"
        assert await session.get_items() == [user_message("x")]  # nothing of a refused call

    asyncio.run(scenario())
    for bad_memory in (None, "memory", object()):
        with pytest.raises(InvalidInputError):
            TiermemSession(bad_memory, "s", user_id="u1")  # type: ignore[arg-type]
    for bad_id in ("", None):
        with pytest.raises(InvalidInputError):
            TiermemSession(memory, bad_id, user_id="u1")  # type: ignore[arg-type]
    with pytest.raises(InvalidInputError):
        TiermemSession(memory, "s", user_id="not a valid id")


def test_a_batch_over_one_value_is_split_and_one_item_over_it_refused(tmp_path: Path) -> None:
    async def scenario(memory: Memory) -> None:
        session = session_of(memory)
        items = [function_output("x" * 20_000, n) for n in range(10)]  # ~200 KB, limit 64 KiB
        await session.add_items(items)
        assert await session.get_items() == items
        assert await session.get_items(limit=3) == items[-3:]
        steps = [c.step for c in memory.run_history(session.run_id)]
        assert set(steps) == {ITEMS_STEP}
        assert len(steps) > 1
        with pytest.raises(ValueTooLargeError) as huge:
            await session.add_items([user_message("fine"), function_output("y" * 70_000)])
        assert huge.value.field == "items[1]"
        assert await session.get_items() == items

    with Memory.open(tmp_path / "data", max_value_bytes=64 * 1024) as memory:
        asyncio.run(scenario(memory))


def test_get_items_with_a_limit_reads_the_limit_not_the_session(tmp_path: Path) -> None:
    inner = open_kv_store(str(tmp_path / "kv.sqlite3"), durable=False)
    counting = CountingKV(inner)
    embedder = MiniLMEmbedder()
    memory = Memory(
        kv=counting,
        index=ChromaVectorIndex(tmp_path / "chroma", embedder=embedder),
        embedder=embedder,
    )

    async def scenario() -> None:
        session = session_of(memory)
        for n in range(400):
            await session.add_items([user_message(f"q{n}"), assistant_message(f"a{n}", n)])
        counting.rows_scanned = 0
        assert await session.get_items(3) == [
            assistant_message("a398", 398),
            user_message("q399"),
            assistant_message("a399", 399),
        ]
        assert counting.rows_scanned <= 3 + 1  # at most a checkpoint per item, and one spare
        # Nothing written since: served from what the object read (the head read, no scan).
        counting.rows_scanned = 0
        again = await session.get_items(3)
        assert again == [
            assistant_message("a398", 398),
            user_message("q399"),
            assistant_message("a399", 399),
        ]
        assert counting.rows_scanned == 0
        again[2]["content"] = "changed by the caller"  # a copy: the next read is unchanged
        assert (await session.get_items(1))[0] == assistant_message("a399", 399)
        # Another object's write moves the head: read again, with the page size learned
        # (a checkpoint holds 2 items here): 2 checkpoints, and one spare.
        other = TiermemSession(memory, session.session_id, user_id="u1")
        await other.add_items([user_message("q400"), assistant_message("a400", 400)])
        counting.rows_scanned = 0
        assert await session.get_items(3) == [
            assistant_message("a399", 399),
            user_message("q400"),
            assistant_message("a400", 400),
        ]
        assert counting.rows_scanned <= 3
        for _ in range(4):
            await session.pop_item()
        counting.rows_scanned = 0
        assert [i["content"] for i in await session.get_items(2) if i.get("role") == "user"] == [
            "q398"
        ]
        # It needs 7 checkpoints (4 pop markers, the 2 batches they hid, 1 more batch); pages
        # grow by doubling past pops, so at most twice that: nothing near the 404 stored.
        assert counting.rows_scanned <= 2 * 7

    try:
        asyncio.run(scenario())
    finally:
        memory.close()


# -- durability, session end ------------------------------------------------------------------


def worker(data_dir: Path, session_id: str, user_id: str, question: str) -> dict[str, Any]:
    done = subprocess.run(
        [
            sys.executable,
            "-m",
            "tests.integrations.agents_worker",
            str(data_dir),
            session_id,
            user_id,
            question,
        ],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
        env={
            "LITELLM_LOCAL_MODEL_COST_MAP": "True",
            "PATH": "/usr/bin:/bin",
            "HOME": str(data_dir),
        },
    )
    assert done.returncode == 0, done.stderr[-3000:]
    result: dict[str, Any] = json.loads(done.stdout.strip().splitlines()[-1])
    return result


@pytest.mark.slow
def test_a_runner_turn_persists_and_another_process_continues_it(tmp_path: Path) -> None:
    data = tmp_path / "data"
    session_id = "user:7/support chat"

    async def first_turn() -> list[Any]:
        with Memory.open(data) as memory:
            session = TiermemSession(memory, session_id, user_id="u7")
            model = ScriptedModel()
            result = await Runner.run(make_agent(model, session), "Where is A-17?", session=session)
            assert result.final_output == "Your order: order A-17 ships on Tuesday"
            return await session.get_items()

    items = asyncio.run(first_turn())
    assert [i.get("type", "message") for i in items] == [
        "message",
        "function_call",
        "function_call_output",
        "message",
    ]
    assert items[0] == user_message("Where is A-17?")

    second = worker(data, session_id, "u7", "And when does it arrive?")
    assert second["before"] == items  # the other process sees the whole session
    assert second["model_input"][:4] == items  # and the SDK gave the model that history
    assert second["model_input"][4] == user_message("And when does it arrive?")
    assert second["after"][: len(items)] == items
    assert len(second["after"]) == 8

    with Memory.open(data) as memory:
        assert memory.get_run(run_id_for(session_id)).external_id == session_id

        async def read_back() -> list[Any]:
            return await TiermemSession(memory, session_id, user_id="u7").get_items()

        assert asyncio.run(read_back()) == second["after"]


def rows_holding(kv_kind: str, where: str, marker: str) -> list[str]:
    """Where ``marker`` appears in any KV row of the store (every space, every key).

    ``where`` is the SQLite file or the Redis URL.
    """
    needle = marker.encode()
    found: list[str] = []
    if kv_kind == "sqlite":
        with sqlite3.connect(where) as db:
            tables = [t for (t,) in db.execute("SELECT name FROM sqlite_master WHERE type='table'")]
            for table in tables:
                for row in db.execute(f'SELECT * FROM "{table}"'):
                    for cell in row:
                        raw = cell.encode() if isinstance(cell, str) else cell
                        if isinstance(raw, bytes) and needle in raw:
                            found.append(f"{table}: {row[:2]}")
    else:
        client = redis.Redis.from_url(where)
        try:
            for key in client.scan_iter(count=1000):
                kind = client.type(key)
                values: list[bytes] = [key]
                if kind == b"hash":
                    for field, value in client.hgetall(key).items():
                        values += [field, value]
                elif kind == b"zset":
                    values += client.zrange(key, 0, -1)
                elif kind == b"string":
                    values.append(client.get(key) or b"")
                if any(needle in value for value in values):
                    found.append(key.decode())
        finally:
            client.close()
    return found


@pytest.mark.parametrize("kv_kind", ["sqlite", "redis"])
def test_popped_and_cleared_items_are_in_no_row_once_the_session_ends(
    kv_kind: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    data = tmp_path / "data"
    kv_url = request.getfixturevalue("redis_url") if kv_kind == "redis" else None
    cleared, popped, kept = (f"{name}-{uuid.uuid4().hex}" for name in ("cleared", "popped", "kept"))
    where = kv_url or str(data / "tiermem.sqlite3")
    with Memory.from_settings(Settings(data_dir=data, kv_url=kv_url)) as memory:

        async def scenario() -> None:
            session = TiermemSession(memory, "user:5/chat", user_id="u5")
            await session.add_items([user_message(f"Please remember {cleared}")])
            assert rows_holding(kv_kind, where, cleared)  # stored: the probe can see it
            await session.clear_session()
            assert rows_holding(kv_kind, where, cleared) == []  # clearing erases at once
            await session.add_items(
                [
                    user_message(f"My order {kept} is late."),
                    function_call(),
                    function_output(f"order {kept}: shipped"),
                    assistant_message(f"Sorry: {popped}"),
                ]
            )
            assert await session.pop_item() == assistant_message(f"Sorry: {popped}")
            assert popped not in json.dumps(await session.get_items())
            assert rows_holding(kv_kind, where, popped)  # hidden while the session lives
            summary = await session.end()
            assert summary is not None
            assert summary.session_id == session.run_id
            assert kept in summary.task_description
            assert rows_holding(kv_kind, where, popped) == []
            assert rows_holding(kv_kind, where, cleared) == []
            assert rows_holding(kv_kind, where, kept)  # the transcript and summary keep it
            assert memory.kv.scan(keys.run_space(memory.tenant, session.run_id)) == []
            assert await session.get_items() == []
            assert await session.end() is None  # nothing left to end

        asyncio.run(scenario())


def test_the_next_session_starts_from_the_last_ones_summary(memory: Memory) -> None:
    async def scenario() -> None:
        first = TiermemSession(memory, "support-1", user_id="u8")
        model = ScriptedModel()
        await Runner.run(make_agent(model, first), "Where is order A-17?", session=first)
        assert model.calls[0][0] == "Be brief."  # nothing stored yet: the base instructions
        summary = await first.end()
        assert summary is not None
        assert summary.session_id == "support-1"
        assert await first.get_items() == []
        assert memory.list_runs(user_id="u8") == []
        assert POP_STEP != ITEMS_STEP

        second = TiermemSession(memory, "support-2", user_id="u8")
        context = await second.continuation_context("order A-17")
        assert "Session support-1" in context
        assert "A-17" in context
        model = ScriptedModel()
        await Runner.run(make_agent(model, second), "Any news?", session=second)
        instructions = model.calls[0][0]
        assert instructions is not None
        assert instructions.startswith("Be brief.\n\n")
        assert "Session support-1" in instructions
        # Another user's agent gets none of it.
        stranger = TiermemSession(memory, "other", user_id="u9")
        assert await stranger.continuation_context("order A-17") == ""

    asyncio.run(scenario())
