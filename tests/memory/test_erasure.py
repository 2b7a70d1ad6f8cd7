"""Deleting means gone (invariant 8): erasure wins over work in flight, and replacing a session
leaves nothing of what it replaced.

Every test runs on the embedded default (SQLite + embedded Chroma) and on a real Redis. A
summarizer that blocks on an event keeps a summary in flight while the user is forgotten or the
session deleted. Afterwards every file of the data directory (``-wal`` files and the Chroma
folder included) and every Redis key are searched for strings only that user ever wrote.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator, Mapping, Sequence
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
import redis

from memory import Memory, SessionNotFoundError, SessionSummary
from memory.settings import Settings
from summarizer import ExtractiveSummarizer, Summarization
from tests.waiting import wait_until
from tiers.errors import ConflictError
from tiers.models import Message

# Strings nobody but the forgotten user ever wrote, one per place they are stored.
FACT = "quokkafactzanzibar"
SESSION = "marmosetsessionlagos"
PENDING = "axolotlpendingtromso"
IN_FLIGHT = "pangolininflightquito"
RUN = "okapirunvaduz"
EFFECT = "tapireffectmaseru"
ITEM = "narwhalitemthimphu"
EVERY = (FACT, SESSION, PENDING, IN_FLIGHT, RUN, EFFECT, ITEM)

# Another user's data stays: the search must find it (the search works) and forget must keep it.
OTHER = "wombatotheruserbamako"


def said(*lines: str) -> list[dict[str, str]]:
    return [
        {"role": "user" if n % 2 == 0 else "assistant", "content": line}
        for n, line in enumerate(lines)
    ]


class BlockingSummarizer:
    """The extractive summarizer, held inside ``summarize`` until ``release`` is set."""

    name = "blocking"

    def __init__(self) -> None:
        self.inner = ExtractiveSummarizer()
        self.entered = threading.Event()
        self.release = threading.Event()
        self.block = True

    def summarize(
        self,
        transcript: Sequence[Message | Mapping[str, Any]],
        *,
        user_id: str,
        session_id: str,
        created_at: datetime | None = None,
    ) -> Summarization:
        result = self.inner.summarize(
            transcript, user_id=user_id, session_id=session_id, created_at=created_at
        )
        if self.block:
            self.entered.set()
            assert self.release.wait(30), "the test never released the summarizer"
        return result


@pytest.fixture
def memory(backend: str | None, tmp_path: Path) -> Iterator[Memory]:
    mem = Memory.from_settings(Settings(data_dir=tmp_path / "data", kv_url=backend))
    mem.summarizer = BlockingSummarizer()
    yield mem
    mem.close()


def blocking(memory: Memory) -> BlockingSummarizer:
    summarizer = memory.summarizer
    assert isinstance(summarizer, BlockingSummarizer)
    return summarizer


def summarize_now(memory: Memory, user: str, session: str, lines: list[dict[str, str]]) -> None:
    summarizer = blocking(memory)
    summarizer.block = False
    try:
        memory.end_session(user, session, lines)
    finally:
        summarizer.block = True


def in_flight(memory: Memory, user: str, session: str, lines: list[dict[str, str]]) -> Any:
    """Start ``end_session`` in a thread and return once it is inside the summarizer."""
    outcome: dict[str, object] = {}

    def run() -> None:
        try:
            outcome["summary"] = memory.end_session(user, session, lines)
        except Exception as exc:  # what the job reports; checked by the caller
            outcome["error"] = exc

    thread = threading.Thread(target=run)
    thread.start()
    assert blocking(memory).entered.wait(30), "the summary never started"

    def finish() -> dict[str, object]:
        blocking(memory).release.set()
        thread.join(30)
        assert not thread.is_alive()
        return outcome

    return finish


def found_in_files(root: Path, needles: Sequence[str]) -> dict[str, list[str]]:
    """Which of ``needles`` occur in which files under ``root`` (raw bytes, any file)."""
    hits: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        for needle in needles:
            if needle.encode() in data:
                hits.setdefault(needle, []).append(str(path.relative_to(root)))
    return hits


def found_in_redis(url: str, needles: Sequence[str]) -> dict[str, list[str]]:
    """Which of ``needles`` occur in which Redis keys (names and every value)."""
    client = redis.Redis.from_url(url)
    hits: dict[str, list[str]] = {}
    try:
        for name in client.scan_iter(count=1000):
            kind = client.type(name)
            blobs: list[bytes] = [name]
            if kind == b"hash":
                for field, value in client.hgetall(name).items():
                    blobs += [field, value]
            elif kind == b"zset":
                blobs += list(client.zrange(name, 0, -1))
            elif kind == b"string":
                blobs.append(client.get(name) or b"")
            else:
                dumped = client.dump(name)
                blobs.append(dumped if isinstance(dumped, bytes) else b"")
            for needle in needles:
                if any(needle.encode() in blob for blob in blobs):
                    hits.setdefault(needle, []).append(name.decode(errors="replace"))
    finally:
        client.close()
    return hits


def write_everything(memory: Memory, user: str) -> None:
    """The user's data through every tier: facts, sessions, transcripts, runs, items."""
    memory.set_fact(user, "nickname", FACT, evidence=f"they said {FACT}")
    memory.set_fact(user, "nickname", f"{FACT}-2")  # the first value goes to the history
    summarize_now(memory, user, "done", said(f"I prefer {SESSION} tea.", f"Noted: {SESSION}."))
    memory.save_transcript(user, "pending", said(f"Remember {PENDING} for me."))
    run = memory.start_run(user, f"run-{user}")
    run.step("note", lambda: {"note": RUN})
    run.effect("send", lambda: {"sent": EFFECT})
    run.complete({"result": RUN})
    memory.items.put(("memories", user), "k1", {"content": ITEM}, user_id=user)
    assert memory.flush(60)


def test_forget_user_wins_over_a_summary_in_flight_and_leaves_no_trace(
    memory: Memory, backend: str | None, tmp_path: Path
) -> None:
    write_everything(memory, "alice")
    summarize_now(memory, "bob", "bob-1", said(f"I prefer {OTHER} coffee."))
    finish = in_flight(
        memory, "alice", "late", said(f"I prefer {IN_FLIGHT} sandwiches.", "I live in Quito.")
    )
    memory.forget_user("alice")
    outcome = finish()
    # The job started before the erasure: it must fail, never write its results back.
    assert isinstance(outcome.get("error"), ConflictError | SessionNotFoundError), outcome
    assert memory.flush(60)

    assert memory.get_facts("alice") == []
    assert memory.fact_history("alice", "nickname") == []
    assert memory.list_sessions("alice") == []
    assert memory.pending_summaries("alice") == []
    assert memory.list_runs(user_id="alice") == []
    assert memory.items.list_items(("memories", "alice")) == []
    assert memory.recall_relevant("alice", f"{SESSION} {IN_FLIGHT}") == []
    assert memory.index.ids(where={"tenant": "default", "user_id": "alice"}) == []
    context = memory.build_continuation_context("alice", IN_FLIGHT)
    assert not [token for token in EVERY if token in context]
    # Bob is untouched.
    assert [s.session_id for s in memory.list_sessions("bob")] == ["bob-1"]

    if backend is None:
        data = tmp_path / "data"
        hits = found_in_files(data, [*EVERY, OTHER])
        assert hits.pop(OTHER, None), "the search finds nothing at all: it is broken"
        assert hits == {}, f"the forgotten user's text is still on disk: {hits}"
    else:
        hits = found_in_redis(backend, [*EVERY, OTHER])
        assert hits.pop(OTHER, None)
        assert hits == {}, f"the forgotten user's text is still in Redis: {hits}"
        # The append-only file was rewritten after the deletes: its files hold none of it.
        files = found_in_files(redis_aof_dir(backend), [*EVERY, OTHER])
        assert files.pop(OTHER, None), "the AOF search finds nothing at all: it is broken"
        assert files == {}, f"the forgotten user's text is still in the AOF: {files}"


def redis_aof_dir(url: str) -> Path:
    """The server's append-only files' folder, once no rewrite is running or scheduled."""
    client = redis.Redis.from_url(url, decode_responses=True)

    def rewritten() -> bool:
        info = client.info("persistence")
        return not info["aof_rewrite_in_progress"] and not info["aof_rewrite_scheduled"]

    try:
        wait_until(rewritten, what="the AOF rewrite to finish", every_s=0.05)
        folder = Path(client.config_get("dir")["dir"])
        return folder / client.config_get("appenddirname")["appenddirname"]
    finally:
        client.close()


def test_delete_session_wins_over_its_summary_in_flight(memory: Memory) -> None:
    finish = in_flight(memory, "alice", "s1", said(f"I prefer {IN_FLIGHT} sandwiches."))
    assert memory.delete_session("alice", "s1")
    outcome = finish()
    assert isinstance(outcome.get("error"), ConflictError | SessionNotFoundError), outcome
    assert memory.get_facts("alice") == []  # the facts it found are not written back
    with pytest.raises(SessionNotFoundError):
        memory.get_session("alice", "s1")
    assert memory.pending_summaries("alice") == []
    assert memory.flush(60)
    assert memory.index.ids(where={"tenant": "default", "user_id": "alice"}) == []


def test_a_transcript_replaced_while_summarized_gets_none_of_the_old_facts(
    memory: Memory,
) -> None:
    finish = in_flight(memory, "alice", "s1", said(f"I prefer {IN_FLIGHT} sandwiches."))
    summarize_now(memory, "alice", "s1", said("I prefer green tea."))
    outcome = finish()
    assert isinstance(outcome.get("error"), ConflictError), outcome
    facts = memory.get_facts("alice")
    assert [f.key for f in facts] == ["preference.green_tea"]
    assert not [f for f in facts if IN_FLIGHT in f.model_dump_json()]


# -- replacing a session leaves nothing of what it replaced ------------------------------------


def keyword_of(memory: Memory, user: str, session: str, query: str) -> float:
    for hit in memory.recall_relevant(user, query, top_k=10):
        if hit.summary.session_id == session:
            return hit.keyword
    return 0.0


def test_a_summary_saved_over_a_summarized_session_replaces_its_transcript(
    memory: Memory, backend: str | None, tmp_path: Path
) -> None:
    summarize_now(memory, "alice", "s1", said(f"Plan the {SESSION} trip.", "Booked the ferry."))
    summarize_now(memory, "alice", "s2", said("Plan the garden.", "Bought tomato seeds."))
    assert keyword_of(memory, "alice", "s1", SESSION) > 0
    newer = SessionSummary(
        user_id="alice", session_id="s1", task_description="Sort the winter clothes."
    )
    memory.save_session(newer)
    # Recall no longer matches words only the replaced transcript had.
    assert keyword_of(memory, "alice", "s1", SESSION) == 0.0
    # Resummarize cannot write the replaced content over the newer summary.
    with pytest.raises(SessionNotFoundError):
        memory.resummarize("alice", "s1")
    assert memory.get_session("alice", "s1") == newer
    assert memory.flush(60)
    # The summary's vector only: the replaced transcript's windows are gone.
    assert memory.index.ids(where={"tenant": "default", "session_id": "s1"}) == ["default/alice/s1"]
    memory.forget_user("bob")  # any forget scrubs the stores' files of deleted data
    if backend is None:
        assert SESSION not in found_in_files(tmp_path / "data", [SESSION])
    else:
        assert SESSION not in found_in_redis(backend, [SESSION])


def test_a_session_ended_again_keeps_nothing_of_the_first_transcript(
    memory: Memory, backend: str | None, tmp_path: Path
) -> None:
    summarize_now(memory, "alice", "s1", said(f"I prefer {SESSION} tea.", "Noted."))
    assert [f for f in memory.get_facts("alice") if SESSION in f.model_dump_json()]
    summarize_now(memory, "alice", "s1", said("I prefer green tea.", "Noted."))
    assert keyword_of(memory, "alice", "s1", SESSION) == 0.0
    assert SESSION not in memory.get_session("alice", "s1").render()
    # Facts learned from the replaced transcript go with it (their evidence quotes it).
    learned = [f.model_dump_json() for f in memory.get_facts("alice")]
    learned += [
        v.model_dump_json()
        for f in memory.get_facts("alice")
        for v in memory.fact_history("alice", f.key)
    ]
    assert not [text for text in learned if SESSION in text]
    assert memory.get_fact("alice", "preference.green_tea").source == "session:s1"
    assert memory.flush(60)
    memory.forget_user("bob")
    if backend is None:
        assert SESSION not in found_in_files(tmp_path / "data", [SESSION])
    else:
        assert SESSION not in found_in_redis(backend, [SESSION])
