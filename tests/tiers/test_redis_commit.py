"""How a commit reaches Redis: one buffer, write groups, a lost script or connection.

The commit script writes each run of puts to one space as one ``HSET`` (and a
``ZADD`` only when a key was added) and each run of deletes as one ``HDEL`` and
``ZREM``, in groups of at most ``GROUP_KEYS`` keys; the KV contract checks the
order of writes, these check the groups' edges on both Redis stores.
"""

from __future__ import annotations

from typing import Any

import pytest
import redis
import redis.connection

from tiers.backends._redis_scripts import GROUP_KEYS
from tiers.backends.base import Check, Delete, KVStore, Put, Write
from tiers.backends.redis_kv import RedisKVStore
from tiers.errors import ConflictError


@pytest.fixture(params=["redis_kv", "redis_cluster_kv"])
def store(request: pytest.FixtureRequest) -> KVStore:
    kv: KVStore = request.getfixturevalue(request.param)
    return kv


def test_commits_larger_than_a_group_write_and_delete_every_key(store: KVStore) -> None:
    count = 2 * GROUP_KEYS + 500
    names = [f"k{i:05d}" for i in range(count)]
    # Two spaces (of one tenant, so one cluster slot) interleaved every 700 keys: groups
    # end at a space change and at the cap.
    a, b = "t:a", "t:b"
    writes: list[Write] = [
        Put(a if (i // 700) % 2 == 0 else b, name, name.encode()) for i, name in enumerate(names)
    ]
    store.commit(writes)
    in_a = [w.key for w in writes if w.space == a]
    in_b = [w.key for w in writes if w.space == b]
    assert [key for key, _ in store.scan(a)] == in_a
    assert [key for key, _ in store.scan(b)] == in_b
    store.commit([Delete(a, key) for key in in_a[: GROUP_KEYS + 10]])
    assert [key for key, _ in store.scan(a)] == in_a[GROUP_KEYS + 10 :]
    assert store.get_many(b, in_b[:2]) == [key.encode() for key in in_b[:2]]


def test_a_put_of_existing_and_new_keys_keeps_both_in_the_index(store: KVStore) -> None:
    store.commit([Put("s", "old", b"1")])
    # One group: "old" is replaced (HSET adds nothing for it), "new" is added.
    store.commit([Put("s", "old", b"2"), Put("s", "new", b"3")], [Check("s", "old", b"1")])
    assert store.scan("s") == [("new", b"3"), ("old", b"2")]
    # A group adding nothing leaves the index as it was.
    store.commit([Put("s", "old", b"4"), Put("s", "new", b"5")])
    assert store.scan("s") == [("new", b"5"), ("old", b"4")]


def test_a_commit_of_a_large_value_is_sent_in_one_buffer(
    redis_kv: RedisKVStore, monkeypatch: pytest.MonkeyPatch
) -> None:
    redis_kv.commit([Put("s", "warm", b"0")])
    buffers: list[int] = []
    send = redis.connection.Connection.send_packed_command

    def recording(
        self: redis.connection.Connection, command: Any, check_health: bool = True
    ) -> None:
        buffers.append(len(command))
        send(self, command, check_health)

    monkeypatch.setattr(redis.connection.Connection, "send_packed_command", recording)
    value = b"x" * 20_000
    redis_kv.commit([Put("s", "k", value), Put("s", "i", b"e")], [Check("s", "k", None)])
    assert buffers == [1]
    assert redis_kv.get_many("s", ["k", "i"]) == [value, b"e"]


def test_a_commit_after_the_server_lost_its_scripts_loads_the_script_again(
    redis_kv: RedisKVStore, redis_url: str
) -> None:
    redis_kv.commit([Put("s", "a", b"1")])
    client = redis.Redis.from_url(redis_url)
    try:
        client.script_flush()
    finally:
        client.close()
    redis_kv.commit([Put("s", "b", b"2")], [Check("s", "a", b"1")])
    assert redis_kv.scan("s") == [("a", b"1"), ("b", b"2")]


def test_a_commit_after_the_server_dropped_the_connection_reconnects(
    redis_kv: RedisKVStore, redis_url: str
) -> None:
    redis_kv.commit([Put("s", "a", b"1")])
    client = redis.Redis.from_url(redis_url)
    try:
        # The store's idle commit connection is closed by the server (as on a restart or an
        # idle timeout); nothing was sent on it since, so the next commit is not refused.
        assert client.client_kill_filter(_type="normal", skipme=True) >= 1
    finally:
        client.close()
    redis_kv.commit([Put("s", "b", b"2")], [Check("s", "a", b"1")])
    assert redis_kv.scan("s") == [("a", b"1"), ("b", b"2")]


def test_a_failed_check_in_a_later_space_names_that_space_and_writes_nothing(
    store: KVStore,
) -> None:
    # The script answers 1 when it wrote, else the failing check's space number and key:
    # the error must name the space of that number, not the first one.
    a, b = "t:a", "t:b"
    store.commit([Put(a, "x", b"1"), Put(b, "y", b"2")])
    with pytest.raises(ConflictError, match=r"'t:b'/'y'"):
        store.commit(
            [Put(a, "x", b"3"), Put(b, "y", b"4"), Put(b, "z", b"5")],
            [Check(a, "x", b"1"), Check(b, "y", b"stale")],
        )
    assert store.get_many(a, ["x"]) == [b"1"]
    assert store.scan(b) == [("y", b"2")]
