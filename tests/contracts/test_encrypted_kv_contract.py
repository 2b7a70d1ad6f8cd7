"""The KV contract suite and the dict-model state machine, run over :class:`EncryptedKVStore`.

Every test of ``test_kv_contract.py`` that takes the ``kv`` or ``backend``
fixture runs here unchanged, with those fixtures giving an encrypted store over
a SQLite file and over a real redis-server (the inner store gets the
encryption overhead on top of the suite's limit, so the wrapper's limit is the
suite's). Left out: the killed-writer test, whose child process writes through
a plain store (durability is the inner store's; the wrapper holds no state of
its own but the keyring, written with a checked commit like any other).
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest
import redis
from hypothesis.stateful import run_state_machine_as_test

from tests.contracts import test_kv_contract as contract
from tests.contracts.test_kv_contract import LIMIT, Backend
from tests.contracts.test_kv_model import MAX_VALUE, MODEL_SETTINGS, KVModelMachine
from tiers.backends.base import KVStore
from tiers.backends.encrypted_kv import (
    MIN_INNER_VALUE_BYTES,
    OVERHEAD,
    EncryptedKVStore,
    MasterKey,
)
from tiers.backends.redis_kv import RedisKVStore
from tiers.backends.sqlite_kv import SqliteKVStore

MASTER, _ = MasterKey.generate()

_LEFT_OUT = {"test_acknowledged_commits_survive_a_killed_writer"}
for _name, _test in vars(contract).copy().items():
    if (
        _name.startswith("test_")
        and _name not in _LEFT_OUT
        and {"kv", "backend"} & set(inspect.signature(_test).parameters)
    ):
        globals()[_name] = _test


def _room(limit: int) -> int:
    return max(limit + OVERHEAD, MIN_INNER_VALUE_BYTES)


def _sqlite(path: Path, limit: int) -> KVStore:
    inner = SqliteKVStore(path, max_value_bytes=_room(limit))
    return EncryptedKVStore(inner, MASTER, max_value_bytes=limit)


def _redis(url: str, limit: int) -> KVStore:
    inner = RedisKVStore(url, max_value_bytes=_room(limit))
    return EncryptedKVStore(inner, MASTER, max_value_bytes=limit)


@pytest.fixture(params=["encrypted-sqlite", "encrypted-redis"])
def kv(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVStore]:
    """An encrypted store over each backend."""
    if request.param == "encrypted-sqlite":
        store = _sqlite(tmp_path / "kv.sqlite3", LIMIT)
    else:
        store = _redis(request.getfixturevalue("redis_url"), LIMIT)
    yield store
    store.close()


@pytest.fixture(params=["encrypted-sqlite", "encrypted-redis"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """Several encrypted stores (one master key) on one storage."""
    if request.param == "encrypted-sqlite":
        path = tmp_path / "kv.sqlite3"
        spec = Backend("sqlite", lambda: _sqlite(path, LIMIT), str(path))
    else:
        url: str = request.getfixturevalue("redis_url")
        spec = Backend("redis", lambda: _redis(url, LIMIT), url)
    yield spec
    for store in spec.opened:
        store.close()


Opener = Callable[[], tuple[KVStore, Callable[[], KVStore]]]


@pytest.mark.slow
@pytest.mark.parametrize("inner", ["sqlite", "redis"])
def test_encrypted_store_behaves_like_a_dict_model(
    inner: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    counter = iter(range(1_000_000))
    url: str = request.getfixturevalue("redis_url") if inner == "redis" else ""

    def opener() -> tuple[KVStore, Callable[[], KVStore]]:
        if inner == "sqlite":
            path = tmp_path / f"model-{next(counter)}.sqlite3"
            return _sqlite(path, MAX_VALUE), lambda: _sqlite(path, MAX_VALUE)
        client = redis.Redis.from_url(url)
        client.flushall()
        client.close()
        return _redis(url, MAX_VALUE), lambda: _redis(url, MAX_VALUE)

    run_state_machine_as_test(lambda: KVModelMachine(opener), settings=MODEL_SETTINGS)
