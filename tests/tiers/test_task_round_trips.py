"""How many round trips a durable step costs on Redis, counted on the wire, so it cannot regress.

A step of a handle that created its run (the common case) reads the run's head
once, before the step's function runs (a cancelled, fenced, deleted or
over-budget run refuses it there, before the function runs), and commits once
(one script call: every check and write of the step, the head's CAS
included). A handle that resumed a run reads the run's idempotency index once
(runs of up to 512 checkpoints), then steps as fast; once anyone else writes
to the run, each step also reads its own index entry (the replay lookup). The
format record is read once per store.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis.connection

from tiers.backends.redis_kv import RedisKVStore
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


def test_a_step_is_one_head_read_and_one_commit(redis_kv: RedisKVStore, wire: Wire) -> None:
    tasks = TaskTier(redis_kv)
    run = tasks.start_run("u", "r1")
    run.step("warm", lambda: 0)  # the commit script is loaded once per connection
    wire.sent = 0
    for i in range(10):
        run.step("s", lambda i=i: {"i": i, "text": "x" * 5000})
    assert wire.sent == 2 * 10


def test_a_resumed_handle_reads_the_index_once_then_steps_as_fast(
    redis_kv: RedisKVStore, wire: Wire
) -> None:
    tasks = TaskTier(redis_kv)
    first = tasks.start_run("u", "r1")
    first.step("s", lambda: 0)
    resumed = tasks.start_run("u", "r1")
    assert resumed.step("s", lambda: 1) == 0  # a replay: head, the index once, its checkpoint
    wire.sent = 0
    for i in range(10):
        resumed.step("t", lambda i=i: i)
    assert wire.sent == 2 * 10
    # Once someone else writes to the run, each step reads its own index entry again.
    tasks.set_budget("r1", tokens=1000)
    resumed.step("t", lambda: 10)
    wire.sent = 0
    for i in range(10):
        resumed.step("u", lambda i=i: i)
    assert wire.sent == 3 * 10
