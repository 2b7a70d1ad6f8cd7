"""A delete made by another process leaves this process's memory within the cache max age
(tiers.cache_ages): the caches are swept even if nothing here reads the deleted data again.

Two processes on one Redis store: this one reads a user's data, so its caches (decoded facts,
the recall view, the stemmer's memo, a LangGraph saver's list-channel cache) hold it; a child
process deletes it. Nothing here reads that user again, and after the max age no live object
of this process holds the text (tests/live_objects.py).
"""

from __future__ import annotations

import contextlib
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from pydantic import JsonValue

from memory import Memory
from memory.settings import Settings
from memory.workers import WorkflowRun, Workflows
from tests.forking import in_forked_child
from tests.live_objects import holders
from tests.memory.test_workers import Fleet
from tests.tiers.spy_embedders import CountingEmbedder
from tests.waiting import wait_until
from tiers.backends.base import Delete, Put
from tiers.backends.redis_kv import RedisKVStore
from tiers.cache_ages import SWEEPER, Stamps, Sweeper
from tiers.errors import InvalidInputError
from tiers.models import RunStatus, UserFact
from tiers.session._plans import CachedEmbedder
from tiers.session._view import UserView, ViewCache
from tiers.task import TaskTier
from tiers.user._decoded import DecodedFacts

MAX_AGE = 0.5
# What the Memory of a test holds while it fills its caches: long enough that a loaded machine's
# sweep cannot empty them before the test has seen them full. The test then holds MAX_AGE.
FILLING_AGE = 600.0

workflows = Workflows()


@workflows.workflow("sweeper")
def sweeper_workflow(run: WorkflowRun, input: JsonValue) -> JsonValue:
    """What the worker process's sweeper holds, read inside the worker."""
    return {
        "max_age": SWEEPER.max_age,
        "running": any(t.name == "tiermem-cache-sweeper" for t in threading.enumerate()),
    }


_FORGET = """
import sys
from memory import Memory
from memory.settings import Settings
from memory.workers import WorkflowRun, Workflows

with Memory.from_settings(Settings(kv_url=sys.argv[1], data_dir=sys.argv[2])) as memory:
    if sys.argv[3] == "user":
        memory.forget_user(sys.argv[4])
    else:
        memory.threads.delete_thread(sys.argv[4])
"""


def in_other_process(redis_url: str, data_dir: Path, what: str, name: str) -> None:
    """Delete a user (``what="user"``) or a graph thread through a Memory of another process."""
    subprocess.run(
        [sys.executable, "-c", _FORGET, redis_url, str(data_dir), what, name],
        check=True,
        timeout=120,
    )


@contextlib.contextmanager
def swept_at(max_age: float) -> Iterator[None]:
    """The process's caches swept at ``max_age`` from now on (the smallest hold wins)."""
    release = SWEEPER.hold(max_age)
    try:
        yield
    finally:
        release()


def held_after(bound: float, needle: str) -> list[str]:
    """What still holds ``needle`` after ``bound`` seconds of waiting (polled; empty: gone).

    One needle at a time: a container of needles would hold them itself.
    """
    # Only the time slept counts: a look over every live object of a big process (the whole
    # suite in one) can itself take longer than the bound, and the sweeper runs meanwhile.
    slept = 0.0
    while True:
        found = holders(needle)
        if not found or slept >= bound:
            return found
        # The descriptions hold the needle too: the next look must not find them.
        del found
        time.sleep(0.1)
        slept += 0.1


def said(*lines: str) -> list[dict[str, str]]:
    return [
        {"role": "user" if n % 2 == 0 else "assistant", "content": line}
        for n, line in enumerate(lines)
    ]


@pytest.fixture
def memory(tmp_path: Path, redis_url: str) -> Iterator[Memory]:
    mem = Memory.from_settings(
        Settings(kv_url=redis_url, data_dir=tmp_path / "here", cache_max_age_seconds=FILLING_AGE)
    )
    yield mem
    mem.close()


@pytest.fixture
def token() -> str:
    return uuid.uuid4().hex[:12]


@pytest.fixture
def word() -> str:
    """A random word of letters: the stemmer memoises those (never numbers or codes)."""
    return "".join(chr(ord("a") + int(c, 16)) for c in uuid.uuid4().hex[:12])


def test_a_user_forgotten_by_another_process_leaves_this_ones_caches_within_the_max_age(
    memory: Memory, redis_url: str, tmp_path: Path, token: str, word: str
) -> None:
    memory.set_fact("alice", "nickname", f"quokka{token} the brave")
    # A JSON key that may name a credential: the redactor memoises its class by the key name.
    memory.set_fact("alice", "lockers", {f"{word}pin": "gym"})
    memory.end_session(
        "alice",
        "a1",
        said(f"I prefer marmoset{token} tea from the {word}s farm.", "Noted, with honey."),
    )
    assert memory.flush(60)
    memory.recall_relevant("alice", "tea")
    memory.build_continuation_context("alice", "tea")
    memory.get_facts("alice")
    assert holders(f"marmoset{token} tea"), "the search finds nothing at all: it is broken"

    in_other_process(redis_url, tmp_path / "there", "user", "alice")

    # Not read here since: only the sweep can drop what the caches kept (single words too).
    with swept_at(MAX_AGE):
        assert held_after(4 * MAX_AGE, f"quokka{token}") == []
        assert held_after(4 * MAX_AGE, f"marmoset{token}") == []
        assert held_after(4 * MAX_AGE, f"{word}s") == []  # the stemmer's memo had it
        assert held_after(4 * MAX_AGE, f"{word}pin") == []  # the redactor's memo of key names
    assert memory.get_facts("alice") == []
    assert memory.recall_relevant("alice", "tea") == []


def test_a_thread_deleted_by_another_process_leaves_this_savers_list_cache(
    memory: Memory, redis_url: str, tmp_path: Path, token: str
) -> None:
    from langgraph.graph import END, START, MessagesState, StateGraph

    from memory.integrations.langgraph import TiermemSaver

    def reply(state: MessagesState) -> dict[str, Any]:
        return {"messages": [("ai", "Noted.")]}

    builder = StateGraph(MessagesState)
    builder.add_node("reply", reply)
    builder.add_edge(START, "reply")
    builder.add_edge("reply", END)
    graph = builder.compile(checkpointer=TiermemSaver(memory))
    config: Any = {"configurable": {"thread_id": f"t-{token}"}}
    graph.invoke({"messages": [("user", f"my locker code is kinkajou{token} seven")]}, config)
    assert holders(f"kinkajou{token} seven"), "the search finds nothing at all: it is broken"

    in_other_process(redis_url, tmp_path / "there", "thread", f"t-{token}")

    with swept_at(MAX_AGE):
        assert held_after(4 * MAX_AGE, f"kinkajou{token} seven") == []
    assert graph.get_state(config).values == {}


def test_redis_listings_of_keys_another_client_deleted_go_within_the_max_age(
    memory: Memory, redis_kv: RedisKVStore, redis_url: str, token: str
) -> None:
    space = f"space-{token}"
    # Values past the inline size: the scan lists the keys and remembers the listing.
    redis_kv.commit([Put(space, f"key{token}-{n}", b"x" * 40_000) for n in range(3)])
    assert len(redis_kv.scan(space)) == 3
    assert holders(f"key{token}-"), "the search finds nothing at all: it is broken"
    other = RedisKVStore(redis_url)
    try:
        other.commit([Delete(space, f"key{token}-{n}") for n in range(3)])
    finally:
        other.close()

    with swept_at(MAX_AGE):
        assert held_after(4 * MAX_AGE, f"key{token}-") == []
    assert redis_kv.scan(space) == []


def test_the_embedding_cache_drops_vectors_within_the_max_age(memory: Memory) -> None:
    counting = CountingEmbedder(memory.embedder)
    cache = CachedEmbedder(counting)
    text = "the okapi seen at dawn by the river"
    first = cache.embed([text], read_at=cache.mark())
    assert cache.embed([text], read_at=cache.mark()) == first
    assert counting.texts == [text]

    with swept_at(MAX_AGE):
        deadline = time.monotonic() + 4 * MAX_AGE
        while counting.texts == [text] and time.monotonic() < deadline:
            time.sleep(0.1)
            cache.embed([text], read_at=cache.mark())  # a hit does not make the vector younger

    # The vector derived from the text was dropped: the text reached the model again.
    assert counting.texts == [text, text]


def test_the_sweep_runs_in_a_child_of_fork(memory: Memory) -> None:
    fact = UserFact(user_id="carol", key="k", value=1, updated_at=datetime.now(UTC))
    stored = fact.model_dump_json().encode()

    def check() -> int:
        # The parent's sweeper thread does not run here: the child's own must sweep.
        facts = DecodedFacts()
        facts.decode("space", "k", stored, read_at=facts.mark())
        deadline = time.monotonic() + 4 * MAX_AGE
        while len(facts) and time.monotonic() < deadline:
            time.sleep(0.05)
        return len(facts)

    with swept_at(MAX_AGE):  # held at the fork: the child's sweeper holds it too
        assert in_forked_child(check) == 0


def test_the_thread_stops_when_the_last_hold_is_released() -> None:
    sweeper = Sweeper()
    first = sweeper.hold(60)
    second = sweeper.hold(0.2)
    assert sweeper.max_age == 0.2
    thread = sweeper._thread
    assert thread is not None
    assert thread.is_alive()
    second()
    second()  # idempotent
    assert sweeper.max_age == 60
    first()
    thread.join(5)
    assert not thread.is_alive()
    assert sweeper.max_age is None
    assert thread not in threading.enumerate()


class Recorder:
    """A cache that records each sweep: when, and its cutoff."""

    def __init__(self) -> None:
        self.sweeps: list[tuple[float, float]] = []

    def sweep(self, cutoff: float) -> None:
        self.sweeps.append((time.monotonic(), cutoff))


def test_a_released_short_max_age_sweeps_no_more() -> None:
    sweeper = Sweeper()
    recorder = Recorder()
    sweeper.track(recorder)
    release_long = sweeper.hold(60)
    release_short = sweeper.hold(0.2)
    try:
        wait_until(lambda: len(recorder.sweeps) >= 2, 10, what=lambda: "two sweeps")
        release_short()
        released = time.monotonic()
        time.sleep(0.3)  # a few periods of the short age
        # Any sweep since keeps what is younger than the remaining max age (60 s, less a period).
        assert all(now - cutoff >= 45 for now, cutoff in recorder.sweeps if now > released)
    finally:
        release_long()


def test_a_max_age_of_centuries_leaves_the_thread_sweeping_for_a_shorter_one() -> None:
    sweeper = Sweeper()
    recorder = Recorder()
    sweeper.track(recorder)
    release_long = sweeper.hold(1e12)  # "keep for good": its period is past the longest wait
    try:
        time.sleep(0.2)  # the thread waits out its first period
        release_short = sweeper.hold(0.2)
        try:
            wait_until(lambda: recorder.sweeps, 10, what=lambda: "a sweep with the short age")
        finally:
            release_short()
    finally:
        release_long()


class HeldStamps(Stamps[Any]):
    """A cache's stamps whose sweep waits for ``go`` while the sweeper holds the cache's lock."""

    def __init__(self) -> None:
        super().__init__()
        self.entered = threading.Event()
        self.go = threading.Event()

    def expired(self, cutoff: float) -> list[Any]:
        self.entered.set()
        self.go.wait(10)
        return super().expired(cutoff)


def test_a_child_forked_during_a_sweep_can_use_the_swept_cache() -> None:
    fact = UserFact(user_id="carol", key="k", value=1, updated_at=datetime.now(UTC))
    stored = fact.model_dump_json().encode()
    facts = DecodedFacts()
    held = HeldStamps()
    facts._stamps = held  # a spy: the sweep calls through once told to go on
    release = SWEEPER.hold(0.1)
    try:
        assert held.entered.wait(10), "no sweep reached the cache"
        # The pass holds the cache's lock now; it ends a little later, from another thread.
        threading.Timer(0.3, held.go.set).start()

        def check() -> bool:
            done = threading.Event()

            def use() -> None:
                facts.decode("space", "k", stored, read_at=facts.mark())
                done.set()

            threading.Thread(target=use, daemon=True).start()
            return done.wait(10)  # the lock was held when forked: it never comes free

        assert in_forked_child(check) is True
    finally:
        held.go.set()
        release()


def test_close_releases_the_memorys_hold(tmp_path: Path) -> None:
    mem = Memory.open(tmp_path / "data", cache_max_age_seconds=0.123)
    view = mem.for_tenant("other")
    assert view.cache_max_age_seconds == 0.123
    assert SWEEPER.max_age is not None
    assert SWEEPER.max_age <= 0.123
    mem.close()
    assert 0.123 not in SWEEPER._holds.values()


def test_a_max_age_of_0_keeps_nothing_across_calls(tmp_path: Path) -> None:
    mem = Memory.open(tmp_path / "data", cache_max_age_seconds=0)
    try:
        assert not SWEEPER.keeping
        fact = UserFact(user_id="carol", key="k", value=1, updated_at=datetime.now(UTC))
        facts = DecodedFacts()
        assert (
            facts.decode("space", "k", fact.model_dump_json().encode(), read_at=facts.mark())
            == fact
        )
        assert len(facts) == 0
        views = ViewCache(max_users=10, max_bytes=1 << 20)
        view = UserView(revision=b"r", session_ids=[], created_at=np.zeros(0), texts=[])
        views.put("carol", view, views.get("carol", b"r")[1])
        assert views.get("carol", b"r")[0] is None
        counting = CountingEmbedder(mem.embedder)
        cache = CachedEmbedder(counting)
        cache.embed(["the okapi"], read_at=cache.mark())
        cache.embed(["the okapi"], read_at=cache.mark())
        assert counting.texts == ["the okapi", "the okapi"]
    finally:
        mem.close()
    assert SWEEPER.keeping


def test_a_worker_without_a_memory_holds_the_max_age(
    redis_url: str, redis_kv: RedisKVStore, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    tasks = TaskTier(redis_kv)
    workflows.start(tasks, "carol", "sweeper", None, run_id="r")
    fleet = Fleet(redis_url, tmp_path, lease_ttl=5.0)
    monkeypatch.setenv("TIERMEM_CACHE_MAX_AGE_SECONDS", "7")
    fleet.spawn(concurrency=1, app="tests.memory.test_cache_ages:workflows")
    try:
        wait_until(
            lambda: tasks.get_run("r").status is RunStatus.COMPLETED,
            120,
            what=lambda: f"the worker to run the run\n{fleet.logs()}",
        )
    finally:
        fleet.stop_all()
    assert tasks.get_run("r").result == {"max_age": 7.0, "running": True}


@pytest.mark.parametrize("bad", [-1, float("inf"), float("nan"), "soon"])
def test_a_bad_max_age_is_refused_with_its_field(tmp_path: Path, bad: Any) -> None:
    with pytest.raises(InvalidInputError) as raised:
        Memory.open(tmp_path / "data", cache_max_age_seconds=bad)
    assert raised.value.field == "cache_max_age_seconds"
