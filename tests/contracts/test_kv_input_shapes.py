"""Unusual Put and Check shapes: every store refuses or takes each one as the full checks do.

``check_writes`` and ``check_checks`` (tiers/backends/common.py) pass the common
case (exact ``str`` spaces and keys in ASCII, exact ``bytes`` values under the
limit) in one expression and send anything else to the full checks. These cases
sit on the edges of that expression: types close to the exact ones (``bool``,
``bytearray``, ``memoryview``, subclasses of ``str`` and ``bytes``), empty or
non-ASCII text in a subclass, NUL and spaces, surrogates, a value one byte over
the limit. Each is committed alone (the fast path's only item) and after a valid
put, on every backend the ``kv`` fixture gives and on an encrypted SQLite store,
and gets the error type and field the full checks give (what 8b1f80d refused).
A key of ``None`` (a Put, Delete or Check) was let through then, as if it
were a DeleteSpace's missing key: it is refused as a non-str key now.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.contracts.test_kv_contract import LIMIT
from tiers.backends.base import Check, Delete, KVStore, Put, Write
from tiers.backends.encrypted_kv import (
    MIN_INNER_VALUE_BYTES,
    OVERHEAD,
    EncryptedKVStore,
    MasterKey,
)
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import InvalidInputError, ValueTooLargeError

MASTER, _ = MasterKey.generate()


class Text(str):
    """A ``str`` subclass: the full checks take it (``isinstance``), the fast path does not."""

    __slots__ = ()


class Blob(bytes):
    """A ``bytes`` subclass, taken as a value by the full checks."""

    __slots__ = ()


@pytest.fixture(
    params=["sqlite_kv", "redis_kv", "postgres_kv", "redis_cluster_kv", "encrypted_sqlite"]
)
def store(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[KVStore]:
    """Each backend of the ``kv`` fixture, and an encrypted store over a SQLite file."""
    if request.param != "encrypted_sqlite":
        plain: KVStore = request.getfixturevalue(request.param)
        yield plain
        return
    inner = SqliteKVStore(
        tmp_path / "inner.sqlite3", max_value_bytes=max(LIMIT + OVERHEAD, MIN_INNER_VALUE_BYTES)
    )
    encrypted = EncryptedKVStore(inner, MASTER, max_value_bytes=LIMIT)
    yield encrypted
    encrypted.close()


BAD_WRITES: list[tuple[Write, type[InvalidInputError], str]] = [
    (Put("s", "k", True), InvalidInputError, "value"),  # type: ignore[arg-type]
    (Put("s", "k", 1), InvalidInputError, "value"),  # type: ignore[arg-type]
    (Put("s", "k", memoryview(b"v")), InvalidInputError, "value"),  # type: ignore[arg-type]
    (Put("s", "k", bytearray(b"v")), InvalidInputError, "value"),  # type: ignore[arg-type]
    (Put("s", "k", Text("v")), InvalidInputError, "value"),  # type: ignore[arg-type]
    (Put("s", "k", b"x" * (LIMIT + 1)), ValueTooLargeError, "value"),
    (Put("s", "k", Blob(b"x" * (LIMIT + 1))), ValueTooLargeError, "value"),
    (Put(Text(""), "k", b"v"), InvalidInputError, "space"),
    (Put("s", Text(""), b"v"), InvalidInputError, "key"),
    (Put(Text("s\ud800"), "k", b"v"), InvalidInputError, "space"),
    (Put("s", Text("k\udfff"), b"v"), InvalidInputError, "key"),
    (Put("s", "\udc80", b"v"), InvalidInputError, "key"),
    (Put("s", b"k", b"v"), InvalidInputError, "key"),  # type: ignore[arg-type]
    (Put(b"s", "k", b"v"), InvalidInputError, "space"),  # type: ignore[arg-type]
    (Put("s", True, b"v"), InvalidInputError, "key"),  # type: ignore[arg-type]
    # A key of None is what only a DeleteSpace has: refused like any other non-str key.
    (Put("s", None, b"v"), InvalidInputError, "key"),  # type: ignore[arg-type]
    (Delete("s", None), InvalidInputError, "key"),  # type: ignore[arg-type]
]

BAD_CHECKS: list[tuple[Check, str]] = [
    (Check("s", "a", bytearray(b"1")), "expected"),  # type: ignore[arg-type]
    (Check("s", "a", memoryview(b"1")), "expected"),  # type: ignore[arg-type]
    (Check("s", "a", False), "expected"),  # type: ignore[arg-type]
    (Check("s", "a", 0), "expected"),  # type: ignore[arg-type]
    (Check("s", "a", Text("1")), "expected"),  # type: ignore[arg-type]
    (Check(Text(""), "a", None), "space"),
    (Check("s", Text(""), None), "key"),
    (Check("s", Text("a\ud800"), b"1"), "key"),
    (Check("s\udfff", "a", None), "space"),
    (Check("s", 1, None), "key"),  # type: ignore[arg-type]
    (Check("s", None, None), "key"),  # type: ignore[arg-type]
]


def _ids(case: object) -> str:
    return repr(case)[:60]


@pytest.mark.parametrize(("bad", "error", "field_name"), BAD_WRITES, ids=_ids)
@pytest.mark.parametrize("after_a_valid_put", [False, True])
def test_unusual_puts_are_refused_with_the_full_checks_error(
    store: KVStore,
    bad: Write,
    error: type[InvalidInputError],
    field_name: str,
    after_a_valid_put: bool,
) -> None:
    writes: list[Write] = [Put("s", "a", b"new")] if after_a_valid_put else []
    with pytest.raises(InvalidInputError) as info:
        store.commit([*writes, bad])
    assert type(info.value) is error
    assert info.value.field == field_name
    assert store.get_many("s", ["a", "k"]) == [None, None]


@pytest.mark.parametrize(("bad", "field_name"), BAD_CHECKS, ids=_ids)
def test_unusual_checks_are_refused_with_the_full_checks_error(
    store: KVStore, bad: Check, field_name: str
) -> None:
    with pytest.raises(InvalidInputError) as info:
        store.commit([Put("s", "a", b"new")], [bad])
    assert type(info.value) is InvalidInputError
    assert info.value.field == field_name
    assert store.get_many("s", ["a"]) == [None]


@pytest.mark.parametrize(
    "put",
    [
        Put("s", "\x00", b"nul key"),
        Put("s", "a key with spaces", b"v"),
        Put(" ", "k", b"a space of one space"),
        Put(Text("s"), Text("k"), b"str subclasses"),
        Put("s", "k", Blob(b"a bytes subclass")),
        Put("s", "\u00e9\U0001f600", b"non-ASCII key"),
        Put("s", "k", b""),
        Put("s", "k", b"x" * LIMIT),
    ],
    ids=_ids,
)
def test_unusual_but_valid_puts_are_stored(store: KVStore, put: Put) -> None:
    store.commit([put], [Check(put.space, put.key, None)])
    assert store.get_many(str(put.space), [str(put.key)]) == [bytes(put.value)]
    # A check expecting exactly those bytes holds; one expecting None no longer does.
    store.commit([Put(put.space, put.key, b"again")], [Check(put.space, put.key, put.value)])
    assert store.get_many(str(put.space), [str(put.key)]) == [b"again"]
