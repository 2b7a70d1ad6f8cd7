"""The background index worker stops when its store is closed under it, instead of retrying forever.

A closed store (``StoreClosedError``) is final, unlike an outage: a worker that kept retrying
it logged "session window indexing failed ... is closed" until the process exited (seen with
Memory objects sharing a test module's stores, closed at the module's end).

Real parts: every KV backend, embedded Chroma, the real MiniLM model, wrapped only to hold the
second pass inside its embedding call until the test has closed a store.
"""

from __future__ import annotations

import threading
import time
from datetime import UTC, datetime

import pytest

from tests.tiers.spy_embedders import HoldingEmbedder
from tiers.backends.base import KVStore
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.embedders import MiniLMEmbedder
from tiers.models import Message
from tiers.session import SessionSummary, SessionTier

TENANT = "closing"  # the worker thread is named after it: no other test's worker matches
WORKER = f"tiermem-session-index-{TENANT}"


def workers() -> list[threading.Thread]:
    return [thread for thread in threading.enumerate() if thread.name == WORKER]


def wait_until_gone(deadline_s: float) -> list[threading.Thread]:
    """The worker threads still alive once they are gone or the deadline passed."""
    deadline = time.monotonic() + deadline_s
    while workers() and time.monotonic() < deadline:
        time.sleep(0.05)
    return workers()


@pytest.mark.parametrize("closed", ["kv", "index"])
def test_the_index_worker_stops_when_a_store_is_closed_under_its_pending_windows(
    kv: KVStore, index: ChromaVectorIndex, embedder: MiniLMEmbedder, closed: str
) -> None:
    transcript = [
        Message(role="user" if n % 2 == 0 else "assistant", content=f"Turn {n}: kayaks. " * 40)
        for n in range(10)
    ]
    summary = SessionSummary(
        session_id="trip",
        user_id="dana",
        task_description="Kayak trip",
        created_at=datetime(2025, 4, 1, tzinfo=UTC),
    )
    # The second pass's call (several windows at once) waits.
    held = HoldingEmbedder(embedder, lambda texts: len(texts) > 1, timeout=120)
    tier = SessionTier(kv, index, held, tenant=TENANT, background=True)
    try:
        assert len(workers()) == 1
        tier.save_transcript("dana", "trip", transcript)
        tier.save_session(summary)
        # The first pass is done; the second is inside its embedding call, its writes to come.
        assert held.held.wait(300)
        (kv if closed == "kv" else index).close()
        held.release.set()
        # It meets the closed store when it writes, and ends (it used to retry until exit).
        assert wait_until_gone(120) == []
        # Nothing will do the windows now: flush says so (a stopped worker is not waited for).
        assert tier.flush(timeout=300) is False
    finally:
        held.release.set()
        tier.close()
