"""How many round trips a durable step costs on Redis, counted on the wire, so it cannot regress.

A step of a handle that created its run (the common case) in a tight loop is
one round trip: the commit (one script call: every check and write of the
step, the head's CAS included). The head the handle's last commit returned
decides whether the step's function may run while it is fresh
(``head_fresh_ms``) and no write through the same tier changed the run since;
otherwise (``head_fresh_ms=0``, or a slow step) the head is read first, as
before: two round trips. A handle that resumed a run reads the run's
idempotency index once (runs of up to 512 checkpoints), then steps as fast;
once anyone else writes to the run, each step also reads its own index entry
(the replay lookup). The format record is read once per store.
``append_checkpoint`` (a step the caller ran) trusts the same window: one round
trip per call in a tight loop, two with ``head_fresh_ms=0``.

The tests give a window far longer than any step takes, so a loaded machine
cannot push a step out of it.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis.connection

from tiers.backends.redis_kv import RedisKVStore
from tiers.errors import RunCancelledError
from tiers.task import TaskTier


class Wire:
    """Counts requests sent to the server (a pipeline or a script call is one)."""

    def __init__(self) -> None:
        self.sent = 0


@pytest.fixture
def wire(monkeypatch: pytest.MonkeyPatch) -> Wire:
    counter = Wire()
    send = redis.connection.Connection.send_packed_command

    def counting(
        self: redis.connection.Connection, command: Any, check_health: bool = True
    ) -> None:
        counter.sent += 1
        send(self, command, check_health)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", counting)
    return counter


# Far longer than a step takes, even on a loaded machine: every step below is inside it.
WINDOW_MS = 60_000


def test_a_step_in_a_tight_loop_is_one_round_trip(redis_kv: RedisKVStore, wire: Wire) -> None:
    tasks = TaskTier(redis_kv, head_fresh_ms=WINDOW_MS)
    run = tasks.start_run("u", "r1")
    run.step("warm", lambda: 0)  # the commit script is loaded once per connection
    wire.sent = 0
    for i in range(10):
        run.step("s", lambda i=i: {"i": i, "text": "x" * 5000})
    assert wire.sent == 10


def test_a_heartbeat_between_steps_keeps_the_next_step_at_one_round_trip(
    redis_kv: RedisKVStore, wire: Wire
) -> None:
    tasks = TaskTier(redis_kv, head_fresh_ms=WINDOW_MS)
    run = tasks.start_run("u", "r1", lease_ttl=60)
    run.step("warm", lambda: 0)
    for i in range(5):
        run.heartbeat()  # reads the head and renews the lease: two round trips
        wire.sent = 0
        run.step("s", lambda i=i: i)
        assert wire.sent == 1


def test_with_no_window_a_step_reads_the_head_then_commits(
    redis_kv: RedisKVStore, wire: Wire
) -> None:
    tasks = TaskTier(redis_kv, head_fresh_ms=0)
    run = tasks.start_run("u", "r1")
    run.step("warm", lambda: 0)
    wire.sent = 0
    for i in range(10):
        run.step("s", lambda i=i: {"i": i, "text": "x" * 5000})
    assert wire.sent == 2 * 10


def test_a_handle_window_of_zero_reads_the_head_before_every_step(
    redis_kv: RedisKVStore, wire: Wire
) -> None:
    run = TaskTier(redis_kv, head_fresh_ms=WINDOW_MS).start_run("u", "r1")
    run.step("warm", lambda: 0)
    run.head_fresh_ms = 0
    wire.sent = 0
    for i in range(10):
        run.step("s", lambda i=i: i)
    assert wire.sent == 2 * 10


def test_a_resumed_handle_reads_the_index_once_then_steps_as_fast(
    redis_kv: RedisKVStore, wire: Wire
) -> None:
    tasks = TaskTier(redis_kv, head_fresh_ms=WINDOW_MS)
    first = tasks.start_run("u", "r1")
    first.step("s", lambda: 0)
    resumed = tasks.start_run("u", "r1")
    assert resumed.step("s", lambda: 1) == 0  # a replay: the index once, its checkpoint
    wire.sent = 0
    for i in range(10):
        resumed.step("t", lambda i=i: i)
    assert wire.sent == 10
    # A write through the same tier: the next step reads the head (and its index entry).
    tasks.set_budget("r1", tokens=1000)
    wire.sent = 0
    resumed.step("t", lambda: 10)
    assert wire.sent == 3
    # Once someone else wrote to the run, each step also reads its own index entry.
    wire.sent = 0
    for i in range(10):
        resumed.step("u", lambda i=i: i)
    assert wire.sent == 2 * 10


def test_a_write_by_another_tier_costs_the_next_step_a_failed_commit_and_a_read(
    redis_kv: RedisKVStore, wire: Wire
) -> None:
    tasks = TaskTier(redis_kv, head_fresh_ms=WINDOW_MS)
    run = tasks.start_run("u", "r1")
    run.step("warm", lambda: 0)
    TaskTier(redis_kv).set_budget("r1", tokens=1000)
    wire.sent = 0
    run.step("s", lambda: 1)
    # The commit fails its head check, the head is read, the step's index entry is read
    # (anyone else may have committed it), and the rebuilt commit succeeds.
    assert wire.sent == 4
    wire.sent = 0
    for i in range(10):
        run.step("t", lambda i=i: i)
    assert wire.sent == 2 * 10


# -- append_checkpoint (the Agents SDK session, the HTTP checkpoint route) -----------


@pytest.mark.parametrize("keyed", [False, True])
def test_append_checkpoint_in_a_tight_loop_is_one_round_trip(
    redis_kv: RedisKVStore, wire: Wire, keyed: bool
) -> None:
    run = TaskTier(redis_kv, head_fresh_ms=WINDOW_MS).start_run("u", "r1")
    run.append_checkpoint("warm", 0)
    wire.sent = 0
    for i in range(10):
        key = f"k{i}" if keyed else None
        run.append_checkpoint("items", {"i": i, "text": "x" * 5000}, idempotency_key=key)
    assert wire.sent == 10


def test_with_no_window_append_checkpoint_reads_the_head_then_commits(
    redis_kv: RedisKVStore, wire: Wire
) -> None:
    run = TaskTier(redis_kv, head_fresh_ms=0).start_run("u", "r1")
    run.append_checkpoint("warm", 0)
    wire.sent = 0
    for i in range(10):
        run.append_checkpoint("items", {"i": i})
    assert wire.sent == 2 * 10


def test_a_cancel_by_another_tier_refuses_append_checkpoint_at_the_commit_or_at_the_read(
    redis_kv: RedisKVStore, wire: Wire
) -> None:
    inside = TaskTier(redis_kv, head_fresh_ms=WINDOW_MS).start_run("u", "r1")
    inside.append_checkpoint("warm", 0)
    outside = TaskTier(redis_kv, head_fresh_ms=0).start_run("u", "r2")
    outside.append_checkpoint("warm", 0)
    for run_id in ("r1", "r2"):
        TaskTier(redis_kv).cancel(run_id)
    wire.sent = 0
    with pytest.raises(RunCancelledError):
        inside.append_checkpoint("items", 1)
    assert wire.sent == 2  # the commit fails its head check; the head read refuses it
    wire.sent = 0
    with pytest.raises(RunCancelledError):
        outside.append_checkpoint("items", 1)
    assert wire.sent == 1  # the head read first refuses it; no commit is tried
