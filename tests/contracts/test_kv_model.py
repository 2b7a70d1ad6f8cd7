"""Every KV backend against a plain dict model, driven by a Hypothesis state machine.

Random puts, deletes, space drops, checked commits (some checks deliberately
wrong), oversized batches, reopenings and reads run on the real store and on
the model side by side; every read and, after every step, every space must
match the model exactly.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from operator import ne
from pathlib import Path

import pytest
import redis
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    initialize,
    invariant,
    rule,
    run_state_machine_as_test,
)

from tiers.backends.base import Check, Delete, DeleteSpace, KVStore, Put, Write
from tiers.backends.postgres_kv import PostgresKVStore
from tiers.backends.redis_kv import RedisKVStore
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import ConflictError, ValueTooLargeError

MAX_VALUE = 24
# Spaces that share prefixes, so a leak between them would show.
SPACES = ("a", "a:b", "ab")
# Few characters, so keys collide often; they straddle the orders and prefix
# bounds that differ between code points, UTF-16 and naive byte handling.
ALPHABET = ("a", "b", "\x00", "é", "\uffff", "\U00010000", "\U0010ffff")

spaces = st.sampled_from(SPACES)
new_keys = st.text(alphabet=st.sampled_from(ALPHABET), min_size=1, max_size=3)
bounds = st.text(alphabet=st.sampled_from(ALPHABET), max_size=3)
values = st.binary(max_size=MAX_VALUE)

Model = dict[str, dict[str, bytes]]
# Opens a store on empty storage; returns it and a way to reopen that storage.
Opener = Callable[[], tuple[KVStore, Callable[[], KVStore]]]


def apply(model: Model, writes: list[Write]) -> Model:
    """The model's commit: a new model with ``writes`` applied in order."""
    after = {space: dict(items) for space, items in model.items()}
    for write in writes:
        if isinstance(write, Put):
            after[write.space][write.key] = write.value
        elif isinstance(write, Delete):
            after[write.space].pop(write.key, None)
        else:
            after[write.space].clear()
    return after


def model_scan(
    items: dict[str, bytes],
    prefix: str,
    start_after: str | None,
    limit: int | None,
    reverse: bool,
) -> list[tuple[str, bytes]]:
    """The model's scan; Python's str order is code-point order, i.e. UTF-8 byte order."""
    keys = sorted((k for k in items if k.startswith(prefix)), reverse=reverse)
    if start_after is not None:
        keys = [k for k in keys if (k < start_after if reverse else k > start_after)]
    if limit is not None:
        keys = keys[: max(limit, 0)]
    return [(k, items[k]) for k in keys]


class KVModelMachine(RuleBasedStateMachine):
    """One backend and the dict model, stepped together."""

    def __init__(self, opener: Opener) -> None:
        super().__init__()
        self.store, self.reopen_store = opener()
        self.model: Model = {space: {} for space in SPACES}

    def teardown(self) -> None:
        self.store.close()

    @initialize()
    def starts_empty(self) -> None:
        for space in SPACES:
            assert self.store.scan(space) == []

    # -- drawing helpers

    def _key(self, data: st.DataObject, space: str) -> str:
        """Mostly an existing key of ``space`` (so deletes and checks hit), else a new one."""
        existing = sorted(self.model[space])
        if data.draw(st.booleans()) and existing:
            return data.draw(st.sampled_from(existing))
        return data.draw(new_keys)

    def _write(self, data: st.DataObject) -> Write:
        space = data.draw(spaces)
        kind = data.draw(st.sampled_from(["put", "put", "delete", "drop"]))
        if kind == "put":
            return Put(space, self._key(data, space), data.draw(values))
        if kind == "delete":
            return Delete(space, self._key(data, space))
        return DeleteSpace(space)

    def _commit(self, writes: list[Write], checks: list[Check] = []) -> None:  # noqa: B006
        self.store.commit(writes, checks)
        self.model = apply(self.model, writes)

    # -- writes

    @rule(space=spaces, key=new_keys, value=values)
    def put_new(self, space: str, key: str, value: bytes) -> None:
        self._commit([Put(space, key, value)])

    @rule(data=st.data())
    def overwrite_or_delete(self, data: st.DataObject) -> None:
        space = data.draw(spaces)
        key = self._key(data, space)
        if data.draw(st.booleans()):
            self._commit([Put(space, key, data.draw(values))])
        else:
            self._commit([Delete(space, key)])

    @rule(space=spaces)
    def delete_space(self, space: str) -> None:
        self._commit([DeleteSpace(space)])

    @rule(data=st.data())
    def batch(self, data: st.DataObject) -> None:
        count = data.draw(st.integers(1, 6))
        self._commit([self._write(data) for _ in range(count)])

    @rule(data=st.data())
    def checked_commit(self, data: st.DataObject) -> None:
        checks: list[Check] = []
        holds = True
        for _ in range(data.draw(st.integers(1, 3))):
            space = data.draw(spaces)
            key = self._key(data, space)
            actual = self.model[space].get(key)
            if data.draw(st.integers(0, 3)) == 0:
                # A wrong expectation: absent vs present, or different bytes.
                wrong = data.draw(st.one_of(st.none(), values).filter(partial(ne, actual)))
                checks.append(Check(space, key, wrong))
                holds = False
            else:
                checks.append(Check(space, key, actual))
        writes = [self._write(data) for _ in range(data.draw(st.integers(0, 4)))]
        if holds:
            self._commit(writes, checks)
        else:
            with pytest.raises(ConflictError):
                self.store.commit(writes, checks)

    @rule(data=st.data())
    def oversized_batch_writes_nothing(self, data: st.DataObject) -> None:
        writes = [self._write(data) for _ in range(data.draw(st.integers(0, 3)))]
        big = Put(data.draw(spaces), data.draw(new_keys), b"x" * (MAX_VALUE + 1))
        writes.insert(data.draw(st.integers(0, len(writes))), big)
        with pytest.raises(ValueTooLargeError):
            self.store.commit(writes)

    @rule()
    def reopen(self) -> None:
        self.store.close()
        self.store = self.reopen_store()

    # -- reads

    def _bound(self, data: st.DataObject, space: str) -> str:
        """Mostly a prefix of an existing key (so the bound cuts through the data)."""
        existing = sorted(self.model[space])
        if data.draw(st.booleans()) and existing:
            key = data.draw(st.sampled_from(existing))
            return key[: data.draw(st.integers(0, len(key)))]
        return data.draw(bounds)

    @rule(data=st.data(), limit=st.none() | st.integers(-1, 6), reverse=st.booleans())
    def scan(self, data: st.DataObject, limit: int | None, reverse: bool) -> None:
        space = data.draw(spaces)
        prefix = self._bound(data, space)
        start_after = self._bound(data, space) if data.draw(st.booleans()) else None
        got = self.store.scan(
            space, prefix=prefix, start_after=start_after, limit=limit, reverse=reverse
        )
        assert got == model_scan(self.model[space], prefix, start_after, limit, reverse)

    @rule(data=st.data())
    def get_many(self, data: st.DataObject) -> None:
        space = data.draw(spaces)
        keys = [self._key(data, space) for _ in range(data.draw(st.integers(0, 5)))]
        assert self.store.get_many(space, keys) == [self.model[space].get(k) for k in keys]

    @invariant()
    def every_space_matches_the_model(self) -> None:
        for space in SPACES:
            assert self.store.scan(space) == sorted(self.model[space].items())


MODEL_SETTINGS = settings(
    max_examples=50,
    stateful_step_count=30,
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow],
)


def _sqlite_opener(root: Path) -> Opener:
    counter = iter(range(1_000_000))

    def opener() -> tuple[KVStore, Callable[[], KVStore]]:
        path = root / f"model-{next(counter)}.sqlite3"
        return SqliteKVStore(path, max_value_bytes=MAX_VALUE), lambda: SqliteKVStore(
            path, max_value_bytes=MAX_VALUE
        )

    return opener


def _redis_opener(url: str) -> Opener:
    def opener() -> tuple[KVStore, Callable[[], KVStore]]:
        client = redis.Redis.from_url(url)
        client.flushall()
        client.close()
        return RedisKVStore(url, max_value_bytes=MAX_VALUE), lambda: RedisKVStore(
            url, max_value_bytes=MAX_VALUE
        )

    return opener


def _postgres_opener(url: str) -> Opener:
    counter = iter(range(1_000_000))

    def opener() -> tuple[KVStore, Callable[[], KVStore]]:
        table = f"model_{next(counter)}"  # a new, empty table per example
        return PostgresKVStore(
            url, table=table, max_value_bytes=MAX_VALUE
        ), lambda: PostgresKVStore(url, table=table, max_value_bytes=MAX_VALUE)

    return opener


@pytest.mark.slow
@pytest.mark.parametrize("backend", ["sqlite", "redis", "postgres"])
def test_store_behaves_like_a_dict_model(
    backend: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    if backend == "sqlite":
        opener = _sqlite_opener(tmp_path)
    elif backend == "redis":
        opener = _redis_opener(request.getfixturevalue("redis_url"))
    else:
        opener = _postgres_opener(request.getfixturevalue("postgres_url"))
    run_state_machine_as_test(lambda: KVModelMachine(opener), settings=MODEL_SETTINGS)


def test_the_model_itself() -> None:
    # Sorting str must equal sorting UTF-8 bytes over the alphabet, or the model is wrong.
    keys = ["".join(p) for p in zip(ALPHABET, reversed(ALPHABET), strict=True)] + list(ALPHABET)
    assert sorted(keys) == sorted(keys, key=lambda k: k.encode())
    items = {k: k.encode() for k in keys}
    assert model_scan(items, "a", "a", 1, False) == [("a\U0010ffff", "a\U0010ffff".encode())]
    assert model_scan(items, "", "b", 2, True) == [
        ("a\U0010ffff", "a\U0010ffff".encode()),
        ("a", b"a"),
    ]
    assert model_scan(items, "", None, -1, False) == []
    after = apply(
        {"a": {"k": b"1"}, "b": {}}, [Delete("a", "k"), Put("a", "k", b"2"), DeleteSpace("b")]
    )
    assert after == {"a": {"k": b"2"}, "b": {}}
