"""The LangGraph checkpointer on real LangGraph graphs and LangGraph's own conformance suite.

Every test runs on SQLite and on a real redis-server.
"""

from __future__ import annotations

import asyncio
import itertools
import json
import operator
import os
import signal
import subprocess
import sys
import textwrap
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Annotated, Any, TypedDict

import pytest
from langchain_core.messages import AIMessage, HumanMessage
from langgraph.checkpoint.conformance import checkpointer_test, validate
from langgraph.checkpoint.conformance.report import CapabilityReport
from langgraph.graph import END, START, StateGraph
from langgraph.graph.message import add_messages

from memory import Memory, Settings, StoreClosedError
from memory.integrations.langgraph import NOT_DONE, TiermemSaver, effect
from tests.waiting import wait_until
from tiers.backends.base import KVStore
from tiers.errors import EffectOutcomeUnknownError, InvalidInputError, ThreadConflictError

ROOT = Path(__file__).resolve().parents[2]
REPORTS: list[CapabilityReport] = []


@pytest.fixture(params=["sqlite", "redis_url", "postgres_url"])
def settings(request: pytest.FixtureRequest, tmp_path: Path) -> Settings:
    # The embedded default, or the URL fixture of a KV server.
    kv_url = None if request.param == "sqlite" else request.getfixturevalue(request.param)
    return Settings(data_dir=tmp_path / "data", kv_url=kv_url)


@pytest.fixture
def memory(settings: Settings) -> Iterator[Memory]:
    mem = Memory.from_settings(settings)
    yield mem
    mem.close()


class Chat(TypedDict):
    messages: Annotated[list[Any], add_messages]
    turns: int


def chat_graph(
    saver: TiermemSaver, delay: float = 0.0, *, meet: Callable[[], None] | None = None
) -> Any:
    """A 3-node chat graph: plan -> answer -> review, each adding a message.

    ``meet``, if given, is called in each plan, after its model call.
    """

    def plan(state: Chat) -> dict[str, Any]:
        time.sleep(delay)  # a model call
        if meet is not None:
            meet()
        return {"messages": [AIMessage(f"plan {state.get('turns', 0)}")]}

    def answer(state: Chat) -> dict[str, Any]:
        return {"messages": [AIMessage(f"answer to {state['messages'][-2].content}")]}

    def review(state: Chat) -> dict[str, Any]:
        return {"messages": [AIMessage("ok")], "turns": state.get("turns", 0) + 1}

    builder = StateGraph(Chat)
    builder.add_node("plan", plan)
    builder.add_node("answer", answer)
    builder.add_node("review", review)
    builder.add_edge(START, "plan")
    builder.add_edge("plan", "answer")
    builder.add_edge("answer", "review")
    builder.add_edge("review", END)
    return builder.compile(checkpointer=saver)


def stored_rows(kv: KVStore, memory: Memory, thread_id: str) -> list[tuple[str, bytes]]:
    from tiers import keys
    from tiers.threads import thread_key

    return kv.scan(keys.thread_space(memory.tenant, thread_key(thread_id)))


# -- LangGraph's own conformance suite -------------------------------------------------


def test_conformance_suite_passes_every_capability(memory: Memory, settings: Settings) -> None:
    backend = settings.kv_url.split(":", 1)[0] if settings.kv_url else "sqlite"

    @checkpointer_test(name=f"TiermemSaver on {backend}")
    async def factory() -> Any:
        yield TiermemSaver(memory)

    report = asyncio.run(validate(factory))
    REPORTS.append(report)
    failures = {name: r.failures for name, r in report.results.items() if r.passed is not True}
    assert failures == {}
    assert report.conformance_level() == "FULL"
    assert set(report.results) == {
        "put",
        "put_writes",
        "get_tuple",
        "list",
        "delete_thread",
        "delete_for_runs",
        "copy_thread",
        "prune",
    }


# -- real graphs -------------------------------------------------------------------------


def test_a_graph_used_after_its_memory_closed_says_how_to_reopen_it(settings: Settings) -> None:
    # As after `with Memory.open(...) as memory:` ends while the compiled graph lives on.
    memory = Memory.from_settings(settings)
    graph = chat_graph(TiermemSaver(memory))
    memory.close()
    with pytest.raises(
        StoreClosedError, match=r"open it again \(Memory\.open, or a new \w+KVStore"
    ):
        graph.invoke({"messages": [HumanMessage("hi")]}, {"configurable": {"thread_id": "t"}})


def test_a_chat_thread_grows_and_reads_back(memory: Memory) -> None:
    graph = chat_graph(TiermemSaver(memory))
    config = {"configurable": {"thread_id": "user:42/chat"}}
    for turn in range(12):
        graph.invoke({"messages": [HumanMessage(f"question {turn}")]}, config)
    # A new saver (nothing cached) reads the same state.
    state = chat_graph(TiermemSaver(memory)).get_state(config)
    contents = [m.content for m in state.values["messages"]]
    assert len(contents) == 48
    assert contents[:4] == ["question 0", "plan 0", "answer to question 0", "ok"]
    assert contents[-4:] == ["question 11", "plan 11", "answer to question 11", "ok"]
    assert state.values["turns"] == 12
    history = list(chat_graph(TiermemSaver(memory)).get_state_history(config))
    assert len(history) == 12 * 5  # per turn: input, start, and one per node
    # Newest first, each the child of the next.
    for newer, older in itertools.pairwise(history):
        assert (
            newer.parent_config["configurable"]["checkpoint_id"]
            == (older.config["configurable"]["checkpoint_id"])
        )


def test_a_growing_list_is_stored_as_tails_and_unchanged_channels_never_again(
    memory: Memory,
) -> None:
    saver = TiermemSaver(memory, delta_every=8)
    graph = chat_graph(saver)
    config = {"configurable": {"thread_id": "t-delta"}}
    for turn in range(10):
        graph.invoke({"messages": [HumanMessage("x" * 2000 + str(turn))]}, config)
    rows = stored_rows(memory.kv, memory, "t-delta")
    message_blobs = [(k, v) for k, v in rows if k.startswith("b::messages:")]
    full = [v for _, v in message_blobs if v[5:6] == b"F" or b"\x00F" in v[:64]]
    # 10 turns x 4 checkpoints change the messages; at most one whole copy per 8 versions.
    assert len(message_blobs) == 40
    whole = [v for _, v in message_blobs if _blob_kind(v) == "F"]
    assert 1 <= len(whole) <= 40 // 8 + 1
    assert full is not None
    # Tails are small: the biggest tail is one message, not the thread.
    tails = [len(v) for _, v in message_blobs if _blob_kind(v) == "T"]
    assert max(tails) < 3000
    # "turns" changes once per turn: stored once per version, 10 versions.
    assert len([k for k, _ in rows if k.startswith("b::turns:")]) == 10
    state = chat_graph(TiermemSaver(memory)).get_state(config)
    assert len(state.values["messages"]) == 40
    assert state.values["messages"][-4].content.endswith("9")


def _blob_kind(stored: bytes) -> str:
    from tiers.threads import _unframe

    _, payload = _unframe(stored, "test")
    return payload[:1].decode()


def test_an_element_changed_in_place_is_stored_whole(memory: Memory) -> None:
    """Reassigning an attribute of a message already stored is noticed (not stored as a tail)."""

    class S(TypedDict):
        messages: Annotated[list[Any], operator.add]

    def edit(state: S) -> dict[str, Any]:
        state["messages"][0].content = "edited in place"
        return {"messages": [AIMessage("after")]}

    builder = StateGraph(S)
    builder.add_node("edit", edit)
    builder.add_edge(START, "edit")
    builder.add_edge("edit", END)
    graph = builder.compile(checkpointer=TiermemSaver(memory))
    config = {"configurable": {"thread_id": "t-inplace"}}
    graph.invoke({"messages": [HumanMessage("original")]}, config)
    state = builder.compile(checkpointer=TiermemSaver(memory)).get_state(config)
    assert [m.content for m in state.values["messages"]] == ["edited in place", "after"]


def test_a_value_read_from_memory_is_what_was_stored(memory: Memory) -> None:
    """The saver serves the newest list it stored without decoding, unless it was changed since."""
    saver = TiermemSaver(memory)
    graph = chat_graph(saver)
    config = {"configurable": {"thread_id": "t-cache"}}
    graph.invoke({"messages": [HumanMessage("stored words")]}, config)
    first = saver.get_tuple(config)
    assert first is not None
    messages = first.checkpoint["channel_values"]["messages"]
    messages[0].content = "changed after reading"  # a caller edits what it read, in place
    messages.append(HumanMessage("appended after reading"))
    again = saver.get_tuple(config)
    assert again is not None
    assert [m.content for m in again.checkpoint["channel_values"]["messages"]][:2] == [
        "stored words",
        "plan 0",
    ]
    assert len(again.checkpoint["channel_values"]["messages"]) == 4


def test_values_over_the_store_limit_are_chunked(settings: Settings) -> None:
    with Memory.from_settings(settings.model_copy(update={"max_value_bytes": 4096})) as memory:
        graph = chat_graph(TiermemSaver(memory, delta=False))
        config = {"configurable": {"thread_id": "big"}}
        big = "y" * 50_000
        graph.invoke({"messages": [HumanMessage(big)]}, config)
        state = chat_graph(TiermemSaver(memory)).get_state(config)
        assert state.values["messages"][0].content == big
        assert all(len(v) <= 4096 for _, v in stored_rows(memory.kv, memory, "big"))


@pytest.mark.parametrize("thread_id", ["user:42/chat", "ünï/cödé%3A:", "a" * 600, "~x", " "])
def test_any_string_is_a_thread_id(memory: Memory, thread_id: str) -> None:
    graph = chat_graph(TiermemSaver(memory))
    config = {"configurable": {"thread_id": thread_id}}
    graph.invoke({"messages": [HumanMessage("hi")]}, config)
    assert chat_graph(TiermemSaver(memory)).get_state(config).values["turns"] == 1
    assert thread_id in memory.threads.threads()


def test_a_missing_thread_id_is_a_typed_error(memory: Memory) -> None:
    with pytest.raises(InvalidInputError) as err:
        TiermemSaver(memory).get_tuple({"configurable": {}})
    assert err.value.field == "thread_id"


def test_get_tuple_reads_one_checkpoint_not_the_thread(memory: Memory) -> None:
    graph = chat_graph(TiermemSaver(memory, delta_every=8))
    config = {"configurable": {"thread_id": "long"}}
    kv = memory.kv
    real_scan, real_get = kv.scan, kv.get_many

    def rows_read_by_reads() -> int:
        rows = [0]

        def scan(space: str, **kwargs: Any) -> Any:
            found = real_scan(space, **kwargs)
            rows[0] += len(found)
            return found

        def get_many(space: str, keys: Any) -> Any:
            rows[0] += len(keys)
            return real_get(space, keys)

        fresh = TiermemSaver(memory, delta_every=8)
        try:
            kv.scan, kv.get_many = scan, get_many  # type: ignore[method-assign]
            latest = fresh.get_tuple(config)
            assert latest is not None
            assert fresh.get_tuple(latest.parent_config) is not None  # type: ignore[arg-type]
            assert len(list(fresh.list(config, limit=3))) == 3
        finally:
            del kv.scan, kv.get_many
        return rows[0]

    for turn in range(16):
        graph.invoke({"messages": [HumanMessage(f"q{turn}")]}, config)
    short = rows_read_by_reads()
    for turn in range(48):
        graph.invoke({"messages": [HumanMessage(f"r{turn}")]}, config)
    long = rows_read_by_reads()
    # 80 then 320 checkpoints are stored: the reads cost the same (a list channel's value is
    # at most 8 rows, a whole copy and the tails after it, wherever the thread is).
    assert long <= short + 8 * 5
    assert long < 120


# -- forks, concurrency, time travel -------------------------------------------------------


def test_a_stale_writer_is_refused_and_nothing_is_written(memory: Memory) -> None:
    one, two = TiermemSaver(memory), TiermemSaver(memory)
    g1, _g2 = chat_graph(one), chat_graph(two)
    config = {"configurable": {"thread_id": "race"}}
    g1.invoke({"messages": [HumanMessage("first")]}, config)
    # Both read the same newest checkpoint...
    assert one.get_tuple(config) is not None
    seen_by_two = two.get_tuple(config)
    assert seen_by_two is not None
    g1.invoke({"messages": [HumanMessage("second")]}, config)
    before = len(list(one.list(config)))
    # ...and the second writer's put, built on what it read, would fork the thread.
    with pytest.raises(ThreadConflictError) as err:
        two.put(
            seen_by_two.config,
            {**seen_by_two.checkpoint, "id": "1ffffff0-0000-6000-8000-000000000000"},
            {"source": "loop", "step": 99, "parents": {}},
            {},
        )
    assert err.value.parent_id == seen_by_two.config["configurable"]["checkpoint_id"]
    assert len(list(one.list(config))) == before


def test_time_travel_branches_on_purpose(memory: Memory) -> None:
    saver = TiermemSaver(memory)
    graph = chat_graph(saver)
    config = {"configurable": {"thread_id": "travel"}}
    graph.invoke({"messages": [HumanMessage("one")]}, config)
    graph.invoke({"messages": [HumanMessage("two")]}, config)
    history = list(graph.get_state_history(config))
    after_first = next(s for s in history if s.values.get("turns") == 1 and not s.next)
    # Re-run from the end of turn one with other input: a deliberate branch.
    graph.invoke({"messages": [HumanMessage("other")]}, after_first.config)
    state = graph.get_state(config)
    contents = [m.content for m in state.values["messages"]]
    assert "two" not in contents
    assert contents[-4:] == ["other", "plan 1", "answer to other", "ok"]
    # update_state on an old checkpoint branches too.
    graph.update_state(after_first.config, {"messages": [HumanMessage("edited")]})
    assert graph.get_state(config).values["messages"][-1].content == "edited"


WORKER = textwrap.dedent(
    """
    import json, os, sys, time
    from langchain_core.messages import HumanMessage
    from memory import Memory, Settings
    from memory.integrations.langgraph import TiermemSaver
    from tiers.errors import ThreadConflictError
    sys.path.insert(0, os.environ["TEST_DIR"])
    from test_langgraph import chat_graph

    settings = Settings.model_validate_json(os.environ["SETTINGS"])
    name, count = sys.argv[1], int(sys.argv[2])
    met = []

    def meet():
        # The first plan of each process waits for the other's: both are inside an invoke at
        # once, so one writes on a head the other moved (a conflict), whatever the scheduler.
        if met:
            return
        met.append(name)
        open(os.environ["READY"] + "inside-" + name, "w").close()
        other = os.environ["READY"] + "inside-" + ("b" if name == "a" else "a")
        deadline = time.monotonic() + 120
        while not os.path.exists(other) and time.monotonic() < deadline:
            time.sleep(0.001)

    memory = Memory.from_settings(settings)
    graph = chat_graph(TiermemSaver(memory), delay=0.02, meet=meet)
    config = {"configurable": {"thread_id": "shared"}}
    conflicts = done = 0
    # Both processes start invoking at the same moment, however long each took to start.
    open(os.environ["READY"] + name, "w").close()
    while not os.path.exists(os.environ["GO"]):
        time.sleep(0.001)
    while done < count:
        try:
            graph.invoke({"messages": [HumanMessage(f"{name}-{done}")]}, config)
            done += 1
        except ThreadConflictError:
            conflicts += 1
    print(json.dumps({"conflicts": conflicts}))
    memory.close()
    """
)


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "redis_url", "postgres_url"])
def test_two_processes_on_one_thread_never_fork_it(
    backend: str, tmp_path: Path, request: pytest.FixtureRequest
) -> None:
    # Two processes share the KV store; each has its own embedded Chroma folder (one
    # process per Chroma folder; the checkpointer does not use it).
    kv_url = str(tmp_path / "kv.db") if backend == "sqlite" else request.getfixturevalue(backend)
    shared = Settings(data_dir=tmp_path / "unused", kv_url=kv_url)
    script = tmp_path / "worker.py"
    script.write_text(WORKER)
    ready, go = tmp_path / "ready-", tmp_path / "go"
    procs = []
    for name in ("a", "b"):
        env = {
            **os.environ,
            "TEST_DIR": str(Path(__file__).parent),
            "READY": str(ready),
            "GO": str(go),
            "PYTHONPATH": str(ROOT),
            "SETTINGS": shared.model_copy(
                update={"data_dir": tmp_path / f"data-{name}"}
            ).model_dump_json(),
        }
        procs.append(
            subprocess.Popen(
                [sys.executable, str(script), name, "15"],
                env=env,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )

    def started() -> bool:
        if all((tmp_path / f"ready-{n}").exists() for n in "ab"):
            return True
        assert all(p.poll() is None for p in procs), procs[0].communicate()[1][-2000:]
        return False

    wait_until(started, 120, what="the workers to start", every_s=0.01)
    go.touch()
    outputs = [p.communicate(timeout=240) for p in procs]
    for proc, (_out, err) in zip(procs, outputs, strict=True):
        assert proc.returncode == 0, err[-2000:]
    conflicts = sum(json.loads(out.strip().splitlines()[-1])["conflicts"] for out, _ in outputs)
    with Memory.from_settings(shared.model_copy(update={"data_dir": tmp_path / "check"})) as m:
        saver = TiermemSaver(m)
        config = {"configurable": {"thread_id": "shared"}}
        history = list(saver.list(config))
        # No fork: every checkpoint but the first has exactly one child, and they chain.
        parents = [t.parent_config["configurable"]["checkpoint_id"] for t in history[:-1]]  # type: ignore[index]
        assert len(parents) == len(set(parents))
        ids = [t.config["configurable"]["checkpoint_id"] for t in history]
        assert parents == ids[1:]
        # No lost write: every acknowledged invoke's message is in the final state.
        final = chat_graph(saver).get_state(config).values["messages"]
        contents = {m.content for m in final}
        assert {f"{n}-{i}" for n in "ab" for i in range(15)} <= contents
    # The race really happened (otherwise this test proves nothing): the processes met inside
    # their first invokes (WORKER's meet), so this holds however they are scheduled.
    assert conflicts > 0


INTERRUPT_SCRIPT = textwrap.dedent(
    """
    import json, os, sys
    from typing import TypedDict
    from langgraph.graph import StateGraph, START, END
    from langgraph.types import interrupt, Command
    from memory import Memory, Settings
    from memory.integrations.langgraph import TiermemSaver, effect

    class S(TypedDict, total=False):
        order: str
        approved: bool
        refund: str

    calls = os.environ["CALLS"]

    def refund(key: str) -> str:
        with open(calls, "a") as f:
            f.write(key + "\\n")
        return "refund-1"

    def propose(state: S) -> S:
        return {"order": "ORD-1"}

    def approve(state: S) -> S:
        decision = interrupt({"question": "refund ORD-1?"})
        return {"approved": decision == "yes"}

    def act(state: S) -> S:
        if not state["approved"]:
            return {"refund": "none"}
        result = effect("refund", refund)
        if os.environ.get("CRASH_AFTER_EFFECT") == "1":
            os.kill(os.getpid(), 9)
        return {"refund": result}

    builder = StateGraph(S)
    builder.add_node("propose", propose)
    builder.add_node("approve", approve)
    builder.add_node("act", act)
    builder.add_edge(START, "propose")
    builder.add_edge("propose", "approve")
    builder.add_edge("approve", "act")
    builder.add_edge("act", END)
    memory = Memory.from_settings(Settings.model_validate_json(os.environ["SETTINGS"]))
    graph = builder.compile(checkpointer=TiermemSaver(memory))
    config = {"configurable": {"thread_id": "refund/ORD-1"}}
    if sys.argv[1] == "start":
        out = graph.invoke({}, config)
    else:
        out = graph.invoke(Command(resume="yes"), config)
    print(json.dumps({k: v for k, v in out.items() if k != "__interrupt__"}
                     | {"interrupted": "__interrupt__" in out}))
    memory.close()
    """
)


@pytest.mark.slow
def test_an_interrupted_graph_resumes_in_a_new_process_and_its_effect_runs_once(
    settings: Settings, tmp_path: Path
) -> None:
    script = tmp_path / "graph.py"
    script.write_text(INTERRUPT_SCRIPT)
    calls = tmp_path / "calls.txt"
    env = {
        **os.environ,
        "PYTHONPATH": str(ROOT),
        "SETTINGS": settings.model_dump_json(),
        "CALLS": str(calls),
    }

    def run(*args: str, **extra: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            [sys.executable, str(script), *args],
            env={**env, **extra},
            capture_output=True,
            text=True,
            timeout=120,
        )

    started = run("start")
    assert started.returncode == 0, started.stderr[-2000:]
    assert json.loads(started.stdout.splitlines()[-1]) == {"order": "ORD-1", "interrupted": True}
    # The approver's process dies right after the refund was issued, before the node's
    # writes are saved: the node runs again on resume, and the refund must not.
    crashed = run("resume", CRASH_AFTER_EFFECT="1")
    assert crashed.returncode == -signal.SIGKILL
    resumed = run("resume")
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    out = json.loads(resumed.stdout.splitlines()[-1])
    assert out == {"order": "ORD-1", "approved": True, "refund": "refund-1", "interrupted": False}
    assert len(calls.read_text().splitlines()) == 1


def test_an_effect_of_unknown_outcome_needs_reconcile(memory: Memory) -> None:
    saver = TiermemSaver(memory)
    attempts: list[str] = []

    class S(TypedDict, total=False):
        result: str

    def flaky(key: str) -> str:
        attempts.append(key)
        return "charged"

    def charge(state: S) -> S:
        return {"result": effect("charge", flaky)}

    builder = StateGraph(S)
    builder.add_node("charge", charge)
    builder.add_edge(START, "charge")
    builder.add_edge("charge", END)
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "unknown"}}
    # Run the node once to learn its key, then rewind the ledger entry to "invoked":
    # what a worker that died inside the call leaves behind.
    graph.invoke({}, config)
    assert attempts
    assert graph.get_state(config).values["result"] == "charged"
    key = attempts[0]
    from tiers.threads import EffectEntry

    entry, raw = memory.threads.effect("unknown", key)
    assert entry is not None
    assert entry.status == "recorded"
    memory.threads.set_effect("unknown", EffectEntry(key, "charge", "invoked"), expected=raw)
    with pytest.raises(EffectOutcomeUnknownError):
        saver.run_effect("unknown", key, "charge", flaky)
    assert saver.run_effect("unknown", key, "charge", flaky, lambda k: NOT_DONE) == "charged"
    assert len(attempts) == 2
    assert saver.run_effect("unknown", key, "charge", flaky) == "charged"
    assert len(attempts) == 2


def test_a_replay_reruns_task_effects_but_not_keyed_ones(memory: Memory) -> None:
    saver = TiermemSaver(memory)
    calls: list[str] = []

    class S(TypedDict, total=False):
        order: str
        notified: str
        refund: str

    def approve(state: S) -> S:
        return {}

    def pay(state: S) -> S:
        def call(name: str) -> Any:
            return lambda key: calls.append(name) or f"{name}-{len(calls)}"

        order = state["order"]
        return {
            "notified": effect("notify", call("notify")),
            "refund": effect("refund", call("refund"), key=f"refund:{order}"),
        }

    builder = StateGraph(S)
    builder.add_node("approve", approve)
    builder.add_node("pay", pay)
    builder.add_edge(START, "approve")
    builder.add_edge("approve", "pay")
    builder.add_edge("pay", END)
    graph = builder.compile(checkpointer=saver)
    config = {"configurable": {"thread_id": "replay"}}
    graph.invoke({"order": "ORD-7"}, config)
    assert calls == ["notify", "refund"]
    before_pay = next(s for s in graph.get_state_history(config) if s.next == ("pay",))
    graph.invoke(None, before_pay.config)  # time travel: a new branch from before "pay"
    # The branch's task runs at a later step: its own effect again; the keyed one, once.
    assert calls == ["notify", "refund", "notify"]
    assert graph.get_state(config).values["refund"] == "refund-2"
    with pytest.raises(InvalidInputError, match="key"):
        effect("x", lambda k: k, key="", config={"configurable": {}})


def test_effect_outside_a_tiermem_graph_is_a_typed_error() -> None:
    with pytest.raises(InvalidInputError):
        effect("x", lambda key: key, config={"configurable": {"thread_id": "t"}})


def test_deleting_a_thread_leaves_no_row(memory: Memory) -> None:
    saver = TiermemSaver(memory)
    graph = chat_graph(saver)
    config = {"configurable": {"thread_id": "gone", "run_id": "r1"}}
    graph.invoke({"messages": [HumanMessage("secret-sauce-42")]}, config)
    assert stored_rows(memory.kv, memory, "gone")
    saver.delete_thread("gone")
    assert stored_rows(memory.kv, memory, "gone") == []
    assert "gone" not in memory.threads.threads()
    assert saver.get_tuple(config) is None


def test_prune_keeps_the_newest_checkpoint_readable(memory: Memory) -> None:
    saver = TiermemSaver(memory, delta_every=4)
    graph = chat_graph(saver)
    config = {"configurable": {"thread_id": "pruned"}}
    for turn in range(6):
        graph.invoke({"messages": [HumanMessage(f"q{turn}")]}, config)
    before = graph.get_state(config).values
    other = TiermemSaver(memory)
    other.prune(["pruned"])
    after = chat_graph(TiermemSaver(memory)).get_state(config).values
    assert [m.content for m in after["messages"]] == [m.content for m in before["messages"]]
    assert len(list(saver.list(config))) == 1
    # The first saver's cached tails may build on values prune removed: its next put still
    # produces a readable thread.
    graph.invoke({"messages": [HumanMessage("after prune")]}, config)
    state = chat_graph(TiermemSaver(memory)).get_state(config).values
    assert state["messages"][-4].content == "after prune"
    assert len(state["messages"]) == 28
