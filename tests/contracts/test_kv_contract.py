"""The KV store contract: every promise of :class:`tiers.backends.base.KVStore`.

One suite, run unchanged against every backend through the ``kv`` fixture
(SQLite file, real redis-server, PostgreSQL, a real Redis Cluster) and the
``backend`` fixture below (for tests that open a second store on the same
storage). Backend-specific tests (schema migrations, an unreachable server) are
at the end; the Redis Cluster's own are in ``tests/tiers/test_redis_cluster.py``.

A commit's spaces share a placement (:func:`tiers.keys.placement`: the part
before the first ``:``), as the contract requires on a store that shards: the
spaces ``s``, ``s:t`` and ``s:u`` are written together, never ``s`` and ``t``.
"""

from __future__ import annotations

import os
import random
import signal
import subprocess
import sys
import threading
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
import redis

from tests.conftest import PostgresServer, RedisServer, free_port
from tiers.backends import sqlite_kv
from tiers.backends.base import Check, Delete, DeleteSpace, KVStore, Put, Write
from tiers.backends.postgres_kv import PostgresKVStore
from tiers.backends.redis_cluster_kv import RedisClusterKVStore
from tiers.backends.redis_kv import RedisKVStore
from tiers.backends.sqlite_kv import MIGRATIONS, SqliteKVStore
from tiers.errors import (
    BackendUnavailableError,
    ConflictError,
    InvalidInputError,
    StoreClosedError,
    ValueTooLargeError,
)

LIMIT = 64 * 1024  # max_value_bytes of every store under test (see tests/conftest.py)

# Keys around the places where orders and prefix bounds go wrong: ASCII edges,
# two-byte UTF-8, both sides of the surrogate gap, the BMP/astral boundary
# (where UTF-16 order differs from code-point order) and the last code point.
AWKWARD_KEYS = [
    "\x00",
    "\x01",
    "\x7f",
    "\x80",
    "A",
    "Z",
    "a",
    "a\x00",
    "a\x7f",
    "a\xff",
    "é",
    "\u4e2d\u6587",
    "\ud7ff",
    "\ud7ffz",
    "\ue000",
    "\uffff",
    "\U00010000",
    "\U0001f600 emoji",
    "\U0010ffff",
    "\U0010ffff\U0010ffff",
]


def _next_char(char: str) -> str:
    """The next encodable code point (skipping surrogates), or ``char`` at the end."""
    nxt = min(ord(char) + 1, 0x10FFFF)
    return chr(0xE000 if 0xD800 <= nxt <= 0xDFFF else nxt)


def put_all(kv: KVStore, space: str, keys: list[str], value: Callable[[str], bytes]) -> None:
    kv.commit([Put(space, k, value(k)) for k in keys])


# ----------------------------------------------------------------------------- protocol


def test_stores_meet_the_protocol(kv: KVStore) -> None:
    assert isinstance(kv, KVStore)
    assert kv.max_value_bytes == LIMIT


# ----------------------------------------------------------------------------- get_many


def test_get_many_answers_in_request_order_with_none_for_missing(kv: KVStore) -> None:
    kv.commit([Put("s", "a", b"1"), Put("s", "b", b"2"), Put("s", "c", b"3")])
    assert kv.get_many("s", ["c", "missing", "a", "b", "a"]) == [b"3", None, b"1", b"2", b"1"]
    assert kv.get_many("s", ["nope"]) == [None]
    assert kv.get_many("other-space", ["a"]) == [None]


def test_get_many_of_no_keys_is_empty(kv: KVStore) -> None:
    kv.commit([Put("s", "a", b"1")])
    assert kv.get_many("s", []) == []
    assert kv.get_many("s", ()) == []


@pytest.mark.parametrize(
    "value",
    [b"", b"\x00", bytes(range(256)), bytes(range(256))[::-1] * 3, b"\xff" * 1000, b"x" * LIMIT],
    ids=["empty", "nul", "all-bytes", "all-bytes-rev", "ff", "at-limit"],
)
def test_binary_values_round_trip_exactly(kv: KVStore, value: bytes) -> None:
    kv.commit([Put("s", "k", value)])
    (got,) = kv.get_many("s", ["k"])
    assert got == value
    assert type(got) is bytes
    assert kv.scan("s") == [("k", value)]


def test_unicode_keys_round_trip(kv: KVStore) -> None:
    put_all(kv, "s", AWKWARD_KEYS, lambda k: k.encode())
    assert kv.get_many("s", AWKWARD_KEYS) == [k.encode() for k in AWKWARD_KEYS]
    assert {k for k, _ in kv.scan("s")} == set(AWKWARD_KEYS)


def test_get_many_of_many_keys(kv: KVStore) -> None:
    keys = [f"k{i:05d}" for i in range(1_200)]
    put_all(kv, "s", keys[::2], lambda k: k.encode())
    got = kv.get_many("s", keys)
    assert got == [k.encode() if i % 2 == 0 else None for i, k in enumerate(keys)]


# ----------------------------------------------------------------------------- scan


def test_scan_sorts_by_utf8_bytes(kv: KVStore) -> None:
    shuffled = random.Random(7).sample(AWKWARD_KEYS, len(AWKWARD_KEYS))
    put_all(kv, "s", shuffled, lambda k: k.encode())
    by_bytes = sorted(AWKWARD_KEYS, key=lambda k: k.encode())
    assert [k for k, _ in kv.scan("s")] == by_bytes
    assert [k for k, _ in kv.scan("s", reverse=True)] == by_bytes[::-1]
    # UTF-8 byte order is code-point order: U+FFFF sorts before U+10000 (not so in UTF-16).
    assert by_bytes == sorted(AWKWARD_KEYS)
    assert all(v == k.encode() for k, v in kv.scan("s"))


def test_scan_filters_by_prefix(kv: KVStore) -> None:
    keys = ["a", "ab", "ab\x00", "abc", "abd", "ac", "b", "aa", "ab\U0010ffff"]
    put_all(kv, "s", keys, lambda k: k.encode())
    assert [k for k, _ in kv.scan("s", prefix="ab")] == [
        "ab",
        "ab\x00",
        "abc",
        "abd",
        "ab\U0010ffff",
    ]
    # A prefix equal to a full key includes that key.
    assert [k for k, _ in kv.scan("s", prefix="abc")] == ["abc"]
    assert [k for k, _ in kv.scan("s", prefix="a", reverse=True)] == sorted(
        (k for k in keys if k.startswith("a")), reverse=True
    )
    assert kv.scan("s", prefix="abcd") == []
    assert kv.scan("s", prefix="z") == []
    assert [k for k, _ in kv.scan("s", prefix="")] == sorted(keys)


@pytest.mark.parametrize(
    "prefix",
    [
        "a\U0010ffff",
        "\U0010ffff",
        "\U0010ffff\U0010ffff",
        "\ud7ff",
        "a\uffff",
        "a\x7f",
        "a\xff",
        "é",
    ],
)
def test_scan_prefix_ending_in_high_code_points(kv: KVStore, prefix: str) -> None:
    # Keys just inside and just outside the prefix's range, on both sides.
    keys = {
        *AWKWARD_KEYS,
        prefix,
        prefix + "\x00",
        prefix + "z",
        prefix + "\U0010ffff",
        prefix[:-1],
        prefix[:-1] + "\ue000",
        prefix[:-1] + _next_char(prefix[-1]),
        "b",
        "\U0010ffff" * 3,
    }
    keys.discard("")
    put_all(kv, "s", sorted(keys), lambda k: k.encode())
    expected = sorted(k for k in keys if k.startswith(prefix))
    assert [k for k, _ in kv.scan("s", prefix=prefix)] == expected
    assert [k for k, _ in kv.scan("s", prefix=prefix, reverse=True)] == expected[::-1]


def test_scan_start_after_forward_and_reverse(kv: KVStore) -> None:
    keys = ["a1", "a2", "a3", "b1", "b2"]
    put_all(kv, "s", keys, lambda k: k.encode())
    assert [k for k, _ in kv.scan("s", start_after="a2")] == ["a3", "b1", "b2"]
    assert [k for k, _ in kv.scan("s", start_after="a2", reverse=True)] == ["a1"]
    # start_after need not be a stored key.
    assert [k for k, _ in kv.scan("s", start_after="a25")] == ["a3", "b1", "b2"]
    assert [k for k, _ in kv.scan("s", start_after="a25", reverse=True)] == ["a2", "a1"]
    assert [k for k, _ in kv.scan("s", start_after="")] == keys
    assert kv.scan("s", start_after="", reverse=True) == []
    assert kv.scan("s", start_after="b2") == []
    assert kv.scan("s", start_after="a1", reverse=True) == []
    # With a prefix: start_after outside the prefix range on either side.
    assert [k for k, _ in kv.scan("s", prefix="b", start_after="a")] == ["b1", "b2"]
    assert kv.scan("s", prefix="a", start_after="b") == []
    assert [k for k, _ in kv.scan("s", prefix="a", start_after="b", reverse=True)] == [
        "a3",
        "a2",
        "a1",
    ]
    assert kv.scan("s", prefix="b", start_after="a", reverse=True) == []
    assert [k for k, _ in kv.scan("s", prefix="a", start_after="a", limit=2)] == ["a1", "a2"]
    assert [k for k, _ in kv.scan("s", prefix="a", start_after="a2", reverse=True)] == ["a1"]


@pytest.mark.parametrize("reverse", [False, True], ids=["forward", "reverse"])
def test_scan_pages_through_a_space(kv: KVStore, reverse: bool) -> None:
    keys = [f"item:{i:04d}" for i in range(250)]
    put_all(kv, "s", keys[::-1], lambda k: k.encode())
    kv.commit([Put("s", "other", b"x"), Put("s", "item", b"y")])  # outside the prefix "item:"
    pages: list[list[tuple[str, bytes]]] = []
    cursor: str | None = None
    while True:
        page = kv.scan("s", prefix="item:", start_after=cursor, limit=7, reverse=reverse)
        if not page:
            break
        assert len(page) <= 7
        pages.append(page)
        cursor = page[-1][0]
    expected = keys[::-1] if reverse else keys
    assert [k for page in pages for k, _ in page] == expected
    assert [len(p) for p in pages] == [7] * 35 + [5]
    assert all(v == k.encode() for page in pages for k, v in page)


def test_scan_limit(kv: KVStore) -> None:
    keys = [f"k{i}" for i in range(10)]
    put_all(kv, "s", keys, lambda k: k.encode())
    assert kv.scan("s", limit=0) == []
    assert kv.scan("s", limit=0, reverse=True) == []
    assert [k for k, _ in kv.scan("s", limit=None)] == keys
    assert [k for k, _ in kv.scan("s", limit=3)] == keys[:3]
    assert [k for k, _ in kv.scan("s", limit=3, reverse=True)] == keys[::-1][:3]
    assert [k for k, _ in kv.scan("s", limit=100)] == keys


def test_scan_of_unknown_space_is_empty(kv: KVStore) -> None:
    kv.commit([Put("known", "k", b"v")])
    assert kv.scan("unknown") == []
    assert kv.scan("unknown", prefix="k", start_after="a", limit=5, reverse=True) == []
    assert kv.scan("know") == []


def test_scan_of_a_large_space(kv: KVStore) -> None:
    keys = [f"k{i:06d}" for i in range(10_000)]
    for start in range(0, len(keys), 2_500):
        put_all(kv, "big", keys[start : start + 2_500], lambda k: k[-3:].encode())
    assert [k for k, _ in kv.scan("big")] == keys
    assert [k for k, _ in kv.scan("big", reverse=True)] == keys[::-1]
    assert kv.scan("big")[-1] == ("k009999", b"999")
    assert [k for k, _ in kv.scan("big", prefix="k0012", limit=900)] == keys[1_200:1_300]


def test_spaces_are_isolated(kv: KVStore) -> None:
    if isinstance(kv, RedisClusterKVStore):
        pytest.skip(
            "commits spaces of several placements together, which a sharded store refuses; "
            "test_spaces_of_one_placement_are_isolated and tests/tiers/test_redis_cluster.py cover it"
        )
    spaces = ["a", "a:b", "ab", "a:", "b", "A", "a}", "{a}", "a b"]
    kv.commit([Put(space, "k", space.encode()) for space in spaces])
    kv.commit([Put(space, f"only-{space}", b"1") for space in spaces])
    for space in spaces:
        assert kv.scan(space) == [("k", space.encode()), (f"only-{space}", b"1")]
        assert kv.get_many(space, ["k"]) == [space.encode()]
    kv.commit([DeleteSpace("a")])
    assert kv.scan("a") == []
    for space in spaces[1:]:
        assert kv.get_many(space, ["k"]) == [space.encode()]
    kv.commit([Delete("ab", "k")])
    assert kv.get_many("a:b", ["k"]) == [b"a:b"]
    assert kv.get_many("ab", ["k"]) == [None]


def test_spaces_of_one_placement_are_isolated(kv: KVStore) -> None:
    spaces = ["t", "t:a", "t:a:b", "t:ab", "t:a:", "t:b", "t:A", "t:a}", "t:{a}", "t:a b"]
    kv.commit([Put(space, "k", space.encode()) for space in spaces])
    kv.commit([Put(space, f"only-{space}", b"1") for space in spaces])
    for space in spaces:
        assert kv.scan(space) == [("k", space.encode()), (f"only-{space}", b"1")]
    kv.commit([DeleteSpace("t:a")])
    assert kv.scan("t:a") == []
    for space in [s for s in spaces if s != "t:a"]:
        assert kv.get_many(space, ["k"]) == [space.encode()]


# ----------------------------------------------------------------------------- commit


def test_put_overwrites(kv: KVStore) -> None:
    kv.commit([Put("s", "k", b"first")])
    kv.commit([Put("s", "k", b"second")])
    assert kv.get_many("s", ["k"]) == [b"second"]
    kv.commit([Put("s", "k", b"")])
    assert kv.get_many("s", ["k"]) == [b""]
    assert kv.scan("s") == [("k", b"")]


def test_empty_commit_is_a_no_op(kv: KVStore) -> None:
    kv.commit([Put("s", "k", b"v")])
    kv.commit([])
    kv.commit([], [])
    assert kv.scan("s") == [("k", b"v")]


def _seed(kv: KVStore) -> dict[str, list[tuple[str, bytes]]]:
    kv.commit([Put("s", "a", b"1"), Put("s", "b", b"2"), Put("s:t", "x", b"9")])
    return {"s": kv.scan("s"), "t": kv.scan("s:t"), "u": kv.scan("s:u")}


def _state(kv: KVStore) -> dict[str, list[tuple[str, bytes]]]:
    return {"s": kv.scan("s"), "t": kv.scan("s:t"), "u": kv.scan("s:u")}


BIG_BATCH: list[Write] = [
    Put("s", "a", b"changed"),
    Put("s", "new", b"n"),
    Delete("s", "b"),
    Put("s:u", "fresh", b"f"),
    DeleteSpace("s:t"),
    Put("s:t", "y", b"y"),
]


@pytest.mark.parametrize("failing", [0, 1, 2])
def test_a_failed_check_writes_nothing(kv: KVStore, failing: int) -> None:
    before = _seed(kv)
    checks = [Check("s", "a", b"1"), Check("s:t", "x", b"9"), Check("s", "zz", None)]
    wrong = [Check("s", "a", b"2"), Check("s:t", "x", None), Check("s", "b", None)][failing]
    checks[failing] = wrong
    with pytest.raises(ConflictError) as info:
        kv.commit(BIG_BATCH, checks)
    assert repr(wrong.key) in str(info.value)
    assert _state(kv) == before


@pytest.mark.parametrize("position", [0, 3, 6])
def test_an_oversized_value_writes_nothing(kv: KVStore, position: int) -> None:
    before = _seed(kv)
    batch = list(BIG_BATCH)
    batch.insert(position, Put("s", "huge", b"x" * (LIMIT + 1)))
    with pytest.raises(ValueTooLargeError) as info:
        kv.commit(batch)
    assert info.value.field == "value"
    assert str(LIMIT) in str(info.value)
    assert _state(kv) == before


def test_value_at_the_limit_is_accepted_and_one_more_byte_refused(kv: KVStore) -> None:
    kv.commit([Put("s", "max", b"m" * LIMIT)])
    assert kv.get_many("s", ["max"]) == [b"m" * LIMIT]
    with pytest.raises(ValueTooLargeError):
        kv.commit([Put("s", "max", b"n" * (LIMIT + 1))])
    assert kv.get_many("s", ["max"]) == [b"m" * LIMIT]


@pytest.mark.parametrize(
    ("bad", "field_name"),
    [
        (Put("", "k", b"v"), "space"),
        (Put("s", "", b"v"), "key"),
        (Delete("", "k"), "space"),
        (Delete("s", ""), "key"),
        (DeleteSpace(""), "space"),
        (Put("s", "k", "text"), "value"),  # type: ignore[arg-type]
        (Put("s", "k", bytearray(b"v")), "value"),  # type: ignore[arg-type]
        (Put("s", "k", None), "value"),  # type: ignore[arg-type]
        (Put("s", 7, b"v"), "key"),  # type: ignore[arg-type]
        (Put(None, "k", b"v"), "space"),  # type: ignore[arg-type]
        (Put("s", "lone\ud800surrogate", b"v"), "key"),
        (Delete("\udfff", "k"), "space"),
    ],
    ids=lambda x: x if isinstance(x, str) else type(x).__name__,
)
def test_invalid_writes_are_refused_and_write_nothing(
    kv: KVStore, bad: Write, field_name: str
) -> None:
    before = _seed(kv)
    with pytest.raises(InvalidInputError) as info:
        kv.commit([Put("s", "a", b"overwritten"), bad, Put("s:u", "k", b"v")])
    assert type(info.value) is InvalidInputError
    assert info.value.field == field_name
    assert _state(kv) == before


@pytest.mark.parametrize(
    ("bad", "field_name"),
    [
        (Check("", "k", None), "space"),
        (Check("s", "", None), "key"),
        (Check("s", "a", "1"), "expected"),  # type: ignore[arg-type]
        (Check("s", "\ud800", None), "key"),
    ],
    ids=["empty-space", "empty-key", "str-expected", "surrogate-key"],
)
def test_invalid_checks_are_refused_and_write_nothing(
    kv: KVStore, bad: Check, field_name: str
) -> None:
    before = _seed(kv)
    with pytest.raises(InvalidInputError) as info:
        kv.commit([Put("s", "a", b"overwritten")], [Check("s", "b", b"2"), bad])
    assert info.value.field == field_name
    assert _state(kv) == before


@pytest.mark.parametrize(
    "read",
    [
        lambda kv: kv.get_many("s", ["ok", "bad\ud800"]),
        lambda kv: kv.get_many("s", [1]),
        lambda kv: kv.get_many("\ud800", ["k"]),
        lambda kv: kv.scan("s", prefix="\udc00"),
        lambda kv: kv.scan("s", start_after="x\ud800"),
        lambda kv: kv.scan("\ud800"),
    ],
    ids=["get-key", "get-int-key", "get-space", "scan-prefix", "scan-start-after", "scan-space"],
)
def test_reads_refuse_keys_that_are_not_text(
    kv: KVStore, read: Callable[[KVStore], object]
) -> None:
    with pytest.raises(InvalidInputError):
        read(kv)


def test_check_expected_none_means_absent(kv: KVStore) -> None:
    kv.commit([Put("s", "k", b"v")], [Check("s", "k", None)])
    assert kv.get_many("s", ["k"]) == [b"v"]
    with pytest.raises(ConflictError):
        kv.commit([Put("s", "k", b"again")], [Check("s", "k", None)])
    kv.commit([Put("s", "empty", b"")])
    with pytest.raises(ConflictError):  # an empty value is present, not absent
        kv.commit([Put("s", "empty", b"x")], [Check("s", "empty", None)])
    assert kv.get_many("s", ["k", "empty"]) == [b"v", b""]
    kv.commit([Delete("s", "k")])
    kv.commit([Put("s", "k", b"back")], [Check("s", "k", None)])
    assert kv.get_many("s", ["k"]) == [b"back"]


def test_check_compares_exact_bytes(kv: KVStore) -> None:
    kv.commit([Put("s", "k", b"abc"), Put("s", "e", b"")])
    for wrong in [b"ab", b"abcd", b"ABC", b"", b"abc\x00"]:
        with pytest.raises(ConflictError):
            kv.commit([Put("s", "k", b"lost")], [Check("s", "k", wrong)])
    for wrong_empty in [None, b"\x00", b" "]:
        with pytest.raises(ConflictError):
            kv.commit([Put("s", "e", b"lost")], [Check("s", "e", wrong_empty)])
    with pytest.raises(ConflictError):  # an absent key does not equal b""
        kv.commit([Put("s", "absent", b"lost")], [Check("s", "absent", b"")])
    assert kv.get_many("s", ["k", "e", "absent"]) == [b"abc", b"", None]
    kv.commit([Put("s", "k", b"won")], [Check("s", "k", b"abc"), Check("s", "e", b"")])
    assert kv.get_many("s", ["k"]) == [b"won"]


def test_checks_across_two_spaces(kv: KVStore) -> None:
    left, right = "pair:left", "pair:right"  # one placement (see the module docstring)
    kv.commit([Put(left, "v", b"1"), Put(right, "v", b"1")])
    both = [Check(left, "v", b"1"), Check(right, "v", b"1")]
    kv.commit([Put(left, "v", b"2"), Put(right, "v", b"2")], both)
    assert kv.get_many(left, ["v"]) == kv.get_many(right, ["v"]) == [b"2"]
    stale = [Check(left, "v", b"2"), Check(right, "v", b"1")]
    with pytest.raises(ConflictError):
        kv.commit([Put(left, "v", b"3"), Put(right, "v", b"3")], stale)
    assert kv.get_many(left, ["v"]) == kv.get_many(right, ["v"]) == [b"2"]


def test_checks_without_writes(kv: KVStore) -> None:
    kv.commit([Put("s", "k", b"v")])
    kv.commit([], [Check("s", "k", b"v"), Check("s", "other", None)])
    with pytest.raises(ConflictError):
        kv.commit([], [Check("s", "k", b"w")])
    assert kv.scan("s") == [("k", b"v")]


def test_delete_of_a_missing_key_or_space_is_not_an_error(kv: KVStore) -> None:
    kv.commit([Put("s", "k", b"v")])
    kv.commit([Delete("s", "missing"), Delete("s:nowhere", "k"), DeleteSpace("s:empty")])
    assert kv.scan("s") == [("k", b"v")]
    kv.commit([Delete("s", "k"), Delete("s", "k")])
    assert kv.get_many("s", ["k"]) == [None]
    assert kv.scan("s") == []


def test_delete_space_removes_every_key_of_that_space_only(kv: KVStore) -> None:
    put_all(kv, "doomed", [f"k{i}" for i in range(50)], lambda k: k.encode())
    kv.commit([Put("doomed:child", "k", b"c")])
    kv.commit([Put("doomed2", "k", b"d")])  # another placement: a commit of its own
    kv.commit([DeleteSpace("doomed")])
    assert kv.scan("doomed") == []
    assert kv.get_many("doomed", ["k0", "k49"]) == [None, None]
    assert kv.scan("doomed:child") == [("k", b"c")]
    assert kv.scan("doomed2") == [("k", b"d")]
    kv.commit([Put("doomed", "reborn", b"r")], [Check("doomed", "k0", None)])
    assert kv.scan("doomed") == [("reborn", b"r")]


@pytest.mark.parametrize(
    ("writes", "expected"),
    [
        ([Put("s", "k", b"1"), Delete("s", "k")], []),
        ([Delete("s", "k"), Put("s", "k", b"1")], [("k", b"1")]),
        ([Put("s", "k", b"1"), Put("s", "k", b"2")], [("k", b"2")]),
        ([Put("s", "a", b"1"), DeleteSpace("s"), Put("s", "b", b"2")], [("b", b"2")]),
        ([Put("s", "a", b"1"), Put("s", "b", b"2"), DeleteSpace("s")], []),
        (
            [DeleteSpace("s"), Put("s", "k", b"3"), Delete("s", "k"), Put("s", "k", b"4")],
            [("k", b"4")],
        ),
    ],
    ids=["put-delete", "delete-put", "put-put", "put-dropspace-put", "drop-last", "mixed"],
)
def test_writes_apply_in_order(
    kv: KVStore, writes: list[Write], expected: list[tuple[str, bytes]]
) -> None:
    kv.commit([Put("s", "k", b"old")])
    kv.commit(writes)
    assert kv.scan("s") == expected


# ----------------------------------------------------------------------------- concurrency


def test_concurrent_compare_and_set_loses_no_update(kv: KVStore) -> None:
    threads, per_thread = 8, 25
    conflicts = [0] * threads
    errors: list[BaseException] = []
    start = threading.Barrier(threads)

    def increment(slot: int) -> None:
        try:
            start.wait()
            done = 0
            while done < per_thread:
                (raw,) = kv.get_many("counter", ["n"])
                value = 0 if raw is None else int(raw)
                try:
                    kv.commit(
                        [Put("counter", "n", str(value + 1).encode())], [Check("counter", "n", raw)]
                    )
                except ConflictError:
                    conflicts[slot] += 1
                    continue
                done += 1
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=increment, args=(i,)) for i in range(threads)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    assert kv.get_many("counter", ["n"]) == [str(threads * per_thread).encode()]


def test_compare_and_set_across_two_stores_on_one_storage(backend: Backend) -> None:
    stores = [backend.open(), backend.open()]
    per_thread = 20
    errors: list[BaseException] = []

    def increment(store: KVStore) -> None:
        try:
            done = 0
            while done < per_thread:
                (raw,) = store.get_many("counter", ["n"])
                new = str(int(raw or b"0") + 1).encode()
                try:
                    store.commit([Put("counter", "n", new)], [Check("counter", "n", raw)])
                except ConflictError:
                    continue
                done += 1
        except BaseException as exc:
            errors.append(exc)

    workers = [threading.Thread(target=increment, args=(stores[i % 2],)) for i in range(4)]
    for worker in workers:
        worker.start()
    for worker in workers:
        worker.join()
    assert errors == []
    assert stores[0].get_many("counter", ["n"]) == [b"80"]
    assert stores[1].get_many("counter", ["n"]) == [b"80"]


def test_readers_never_see_half_a_commit(kv: KVStore) -> None:
    stop = threading.Event()
    torn: list[tuple[bytes | None, ...]] = []
    errors: list[BaseException] = []

    def read() -> None:
        try:
            while not stop.is_set():
                pair = kv.get_many("s", ["left", "right"])
                if pair[0] != pair[1]:
                    torn.append(tuple(pair))
                scanned = [v for _, v in kv.scan("s")]
                if len(set(scanned)) > 1:
                    torn.append(tuple(scanned))
        except BaseException as exc:
            errors.append(exc)

    readers = [threading.Thread(target=read) for _ in range(3)]
    for reader in readers:
        reader.start()
    try:
        for i in range(150):
            kv.commit([Put("s", "left", b"%d" % i), Put("s", "right", b"%d" % i)])
    finally:
        stop.set()
        for reader in readers:
            reader.join()
    assert errors == []
    assert torn == []
    assert kv.get_many("s", ["left", "right"]) == [b"149", b"149"]


def test_close_during_concurrent_use_raises_only_typed_errors(kv: KVStore) -> None:
    kv.commit([Put("s", f"k{i}", b"v") for i in range(20)])
    started = threading.Barrier(5)
    unexpected: list[BaseException] = []
    refused = [0] * 4

    def use(slot: int) -> None:
        started.wait()
        for i in range(10_000):
            try:
                kv.scan("s", limit=5)
                kv.get_many("s", ["k1", "k2"])
                kv.commit([Put("s", f"w{slot}", b"%d" % i)])
            except BackendUnavailableError:
                refused[slot] += 1
                return
            except BaseException as exc:
                unexpected.append(exc)
                return

    workers = [threading.Thread(target=use, args=(i,)) for i in range(4)]
    for worker in workers:
        worker.start()
    started.wait()
    kv.close()
    for worker in workers:
        worker.join()
    assert unexpected == []
    assert refused == [1, 1, 1, 1]


# ----------------------------------------------------------------------------- lifecycle


@pytest.mark.parametrize(
    "use",
    [
        lambda kv: kv.get_many("s", ["k"]),
        lambda kv: kv.scan("s"),
        lambda kv: kv.commit([Put("s", "k", b"v")]),
        lambda kv: kv.commit([], [Check("s", "k", None)]),
        lambda kv: kv.ping(),
        lambda kv: kv.get_many("s", []),
        lambda kv: kv.scan("s", limit=0),
        lambda kv: kv.commit([]),
    ],
    ids=["get_many", "scan", "commit", "check", "ping", "get-nothing", "scan-nothing", "no-op"],
)
def test_a_closed_store_refuses_use(kv: KVStore, use: Callable[[KVStore], object]) -> None:
    kv.commit([Put("s", "k", b"v")])
    kv.ping()
    kv.close()
    kv.close()  # idempotent
    with pytest.raises(StoreClosedError, match="closed"):
        use(kv)


@dataclass
class Backend:
    """Opens stores on one storage (a SQLite file, a Redis database)."""

    name: str
    factory: Callable[[], KVStore]
    where: str
    opened: list[KVStore] = field(default_factory=list)

    def open(self) -> KVStore:
        store = self.factory()
        self.opened.append(store)
        return store


@pytest.fixture(params=["sqlite", "redis", "postgres", "redis_cluster"])
def backend(request: pytest.FixtureRequest, tmp_path: Path) -> Iterator[Backend]:
    """A way to open several stores on the same storage, for every backend."""
    if request.param == "sqlite":
        path = tmp_path / "kv.sqlite3"
        spec = Backend("sqlite", lambda: SqliteKVStore(path, max_value_bytes=LIMIT), str(path))
    elif request.param == "redis":
        url: str = request.getfixturevalue("redis_url")
        spec = Backend("redis", lambda: RedisKVStore(url, max_value_bytes=LIMIT), url)
    elif request.param == "redis_cluster":
        nodes: str = request.getfixturevalue("redis_cluster_url")
        spec = Backend(
            "redis_cluster", lambda: RedisClusterKVStore(nodes, max_value_bytes=LIMIT), nodes
        )
    else:
        pg_url: str = request.getfixturevalue("postgres_url")
        spec = Backend("postgres", lambda: PostgresKVStore(pg_url, max_value_bytes=LIMIT), pg_url)
    yield spec
    for store in spec.opened:
        store.close()


def test_a_second_store_on_the_same_storage_sees_commits(backend: Backend) -> None:
    first, second = backend.open(), backend.open()
    first.commit([Put("s", "k", b"from-first")])
    assert second.get_many("s", ["k"]) == [b"from-first"]
    second.commit([Put("s", "k", b"from-second")], [Check("s", "k", b"from-first")])
    assert first.scan("s") == [("k", b"from-second")]
    with pytest.raises(ConflictError):
        first.commit([Put("s", "k", b"stale")], [Check("s", "k", b"from-first")])


def test_data_survives_close_and_reopen(backend: Backend) -> None:
    store = backend.open()
    store.commit([Put("s", f"k{i}", bytes([i])) for i in range(200)] + [Put("s:t", "x", b"")])
    store.commit([Delete("s", "k7")])
    store.close()
    again = backend.open()
    assert again.scan("s") == [
        (f"k{i}", bytes([i])) for i in sorted(set(range(200)) - {7}, key=str)
    ]
    assert again.get_many("s:t", ["x"]) == [b""]


_CRASH_CHILD = """
import sys
from tiers.backends.base import Check, Put
kind, where = sys.argv[1], sys.argv[2]
if kind.startswith("sqlite"):
    from tiers.backends.sqlite_kv import SqliteKVStore
    store = SqliteKVStore(where, durable=kind != "sqlite-fast")
elif kind == "postgres":
    from tiers.backends.postgres_kv import PostgresKVStore
    store = PostgresKVStore(where)
elif kind == "redis_cluster":
    from tiers.backends.redis_cluster_kv import RedisClusterKVStore
    store = RedisClusterKVStore(where)
else:
    from tiers.backends.redis_kv import RedisKVStore
    store = RedisKVStore(where)
head = None
i = 0
while True:
    value = str(i).encode()
    try:
        store.commit(
            [Put("crash", f"rec:{i:08d}", value * 100), Put("crash", "head", value)],
            [Check("crash", "head", head)],
        )
    except Exception as exc:
        print("error", type(exc).__name__, flush=True)
        sys.exit(3)
    print(i, flush=True)
    head = value
    i += 1
"""


def _run_until_killed(
    args: list[str], acks_before_kill: int, kill: Callable[[], None] | None = None
) -> list[int]:
    """Run the committing child until it has acked some commits, then SIGKILL it.

    ``kill``, when given, is called first (to crash the server under the child).
    Returns every commit number the child acknowledged.
    """
    child = subprocess.Popen(
        [sys.executable, "-c", _CRASH_CHILD, *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    acked: list[int] = []
    try:
        for line in child.stdout:
            if line.startswith("error"):
                break
            acked.append(int(line))
            if len(acked) == acks_before_kill:
                if kill is not None:
                    kill()
                break
        else:
            raise AssertionError(
                f"child exited early: {child.stderr.read() if child.stderr else ''}"
            )
    finally:
        child.send_signal(signal.SIGKILL)
        child.wait()
    # Lines printed before the kill were acknowledged too. Read them through the same text
    # stream: communicate() reads the pipe itself and would skip the lines it buffered ahead.
    rest = child.stdout.read()
    child.stdout.close()
    if child.stderr is not None:
        child.stderr.close()
    acked += [int(line) for line in rest.splitlines() if line and not line.startswith("error")]
    assert acked == list(range(len(acked)))
    return acked


def _assert_crash_consistent(store: KVStore, acked: list[int]) -> None:
    (head,) = store.get_many("crash", ["head"])
    assert head is not None
    last = int(head)
    assert last >= acked[-1]  # every acknowledged commit is there (maybe one more, unacked)
    records = store.scan("crash", prefix="rec:")
    # Each commit wrote its record and the head together: no torn commit, no gap.
    assert [k for k, _ in records] == [f"rec:{i:08d}" for i in range(last + 1)]
    assert all(v == str(int(k[4:])).encode() * 100 for k, v in records)
    store.commit([Put("crash", "after", b"ok")], [Check("crash", "head", head)])
    assert store.get_many("crash", ["after"]) == [b"ok"]


def test_acknowledged_commits_survive_a_killed_writer(backend: Backend) -> None:
    acked = _run_until_killed([backend.name, backend.where], 120)
    _assert_crash_consistent(backend.open(), acked)


def test_sqlite_non_durable_mode_survives_a_killed_writer(tmp_path: Path) -> None:
    # synchronous=NORMAL may lose commits to a power cut, never to a process crash.
    path = tmp_path / "fast.sqlite3"
    acked = _run_until_killed(["sqlite-fast", str(path)], 150)
    store = SqliteKVStore(path)
    try:
        _assert_crash_consistent(store, acked)
    finally:
        store.close()


@pytest.mark.slow
def test_acknowledged_commits_survive_a_killed_redis_server(tmp_path: Path) -> None:
    workdir = tmp_path / "redis"
    server = RedisServer(workdir, appendfsync="always")
    try:
        acked = _run_until_killed(["redis", server.url], 150, server.process.kill)
    finally:
        server.process.kill()
        server.process.wait()
    restarted = RedisServer(workdir, appendfsync="always")
    store = RedisKVStore(restarted.url)
    try:
        _assert_crash_consistent(store, acked)
    finally:
        store.close()
        restarted.stop()


@pytest.mark.slow
def test_acknowledged_commits_survive_a_killed_postgres_server() -> None:
    server = PostgresServer()
    try:
        url = server.database_url("crash")
        acked = _run_until_killed(["postgres", url], 150, server.kill)
        server.start()  # crash recovery replays the WAL
        store = PostgresKVStore(url)
        try:
            _assert_crash_consistent(store, acked)
        finally:
            store.close()
    finally:
        server.stop()


def test_ping_answers_on_a_live_store(kv: KVStore) -> None:
    kv.ping()
    kv.commit([Put("s", "k", b"v")])
    kv.ping()
    assert kv.get_many("s", ["k"]) == [b"v"]


# ----------------------------------------------------------------------------- SQLite


def test_sqlite_reopen_keeps_data_and_schema_version(tmp_path: Path) -> None:
    path = tmp_path / "nested" / "dir" / "kv.sqlite3"
    store = SqliteKVStore(path)
    assert store.schema_version == len(MIGRATIONS)
    store.commit([Put("s", "k", b"v")])
    store.close()
    for _ in range(3):
        store = SqliteKVStore(path)
        assert store.schema_version == len(MIGRATIONS)
        assert store.scan("s") == [("k", b"v")]
        store.close()


def test_sqlite_applies_each_migration_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "kv.sqlite3"
    SqliteKVStore(path).close()  # an existing database at the current version
    # A later migration that counts its runs in a row: applying it twice would show.
    counting = (
        "INSERT INTO kv (space, key, value) VALUES ('_meta', 'runs', x'01') "
        "ON CONFLICT (space, key) DO UPDATE SET value = value || x'01'"
    )
    monkeypatch.setattr(sqlite_kv, "MIGRATIONS", (*MIGRATIONS, (counting,)))
    for _ in range(3):
        store = SqliteKVStore(path)
        assert store.schema_version == len(MIGRATIONS) + 1
        assert store.get_many("_meta", ["runs"]) == [b"\x01"]
        store.close()


def test_sqlite_migrates_a_version_1_database_keeping_every_row(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "kv.sqlite3"
    conn = sqlite3.connect(path)
    for statement in MIGRATIONS[0]:
        conn.execute(statement)
    rows = [(f"space{n % 3}", f"key{n:04d}", bytes([n % 256]) * (n % 700)) for n in range(500)]
    conn.executemany("INSERT INTO kv (space, key, value) VALUES (?, ?, ?)", rows)
    conn.execute("PRAGMA user_version=1")
    conn.commit()
    conn.close()
    store = SqliteKVStore(path)
    assert store.schema_version == len(MIGRATIONS)
    for space in ("space0", "space1", "space2"):
        expected = sorted((k, v) for s, k, v in rows if s == space)
        assert store.scan(space) == expected
    store.commit([Put("space0", "key0000", b"new")], [Check("space0", "key0000", b"")])
    with pytest.raises(ConflictError):
        store.commit([Put("space0", "key0000", b"x")], [Check("space0", "key0000", b"")])
    store.close()
    conn = sqlite3.connect(path)
    (ddl,) = conn.execute("SELECT sql FROM sqlite_master WHERE name = 'kv'").fetchone()
    conn.close()
    assert "WITHOUT ROWID" not in ddl


def _open_together(path: Path, n: int) -> list[BaseException]:
    """Open ``n`` stores on ``path`` from ``n`` threads at once; the errors they raised."""
    barrier = threading.Barrier(n, timeout=30)
    errors: list[BaseException] = []
    stores: list[SqliteKVStore] = []

    def open_one() -> None:
        barrier.wait()
        try:
            stores.append(SqliteKVStore(path))
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=open_one) for _ in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for store in stores:
        store.close()
    return errors


def test_sqlite_stores_opened_together_on_a_new_file_all_open(tmp_path: Path) -> None:
    # Workers of a pool start together on one new database: every one must open it
    # (switching a new file to WAL answers "database is locked" without waiting).
    for trial in range(30):
        assert _open_together(tmp_path / f"new{trial}.sqlite3", 6) == []


def test_sqlite_refuses_a_database_from_a_newer_version(tmp_path: Path) -> None:
    import sqlite3

    path = tmp_path / "kv.sqlite3"
    SqliteKVStore(path).close()
    conn = sqlite3.connect(path)
    conn.execute(f"PRAGMA user_version={len(MIGRATIONS) + 5}")
    conn.commit()
    conn.close()
    with pytest.raises(BackendUnavailableError, match="newer"):
        SqliteKVStore(path)
    conn = sqlite3.connect(path)
    assert conn.execute("PRAGMA user_version").fetchone() == (len(MIGRATIONS) + 5,)
    conn.close()


def test_sqlite_unusable_path_is_unavailable(tmp_path: Path) -> None:
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"not a directory")
    with pytest.raises(BackendUnavailableError, match="a-file"):
        SqliteKVStore(blocker / "kv.sqlite3")
    garbage = tmp_path / "garbage.sqlite3"
    garbage.write_bytes(b"this is not a database" * 100)
    with pytest.raises(BackendUnavailableError):
        SqliteKVStore(garbage)


@pytest.mark.skipif(not Path("/proc/self/fd").is_dir(), reason="needs /proc to count descriptors")
def test_sqlite_threads_that_end_do_not_leak_connections(sqlite_kv: SqliteKVStore) -> None:
    sqlite_kv.commit([Put("s", "k", b"v")])

    def read_once() -> None:
        assert sqlite_kv.get_many("s", ["k"]) == [b"v"]

    def in_fresh_thread() -> None:
        worker = threading.Thread(target=read_once)
        worker.start()
        worker.join()

    in_fresh_thread()
    folder = sqlite_kv.path.parent  # the test's own tmp_path (see the fixture)
    before = descriptors_under(folder)
    for _ in range(40):
        in_fresh_thread()
    assert descriptors_under(folder) - before < 8


def descriptors_under(folder: Path) -> int:
    """This process's open descriptors on files in ``folder``: those a store there could leak.

    Counting every descriptor would also count files other threads (left over from earlier
    tests) open meanwhile; these are the test's own.
    """
    prefix = f"{folder.resolve()}{os.sep}"
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            target = os.readlink(f"/proc/self/fd/{fd}")
        except OSError:  # closed since the listing (e.g. the listing's own)
            continue
        count += target.startswith(prefix)
    return count


# ----------------------------------------------------------------------------- Redis


@pytest.mark.parametrize(
    "use",
    [
        lambda kv: kv.ping(),
        lambda kv: kv.get_many("s", ["k"]),
        lambda kv: kv.scan("s"),
        lambda kv: kv.commit([Put("s", "k", b"v")]),
    ],
    ids=["ping", "get_many", "scan", "commit"],
)
def test_unreachable_redis_is_unavailable(use: Callable[[KVStore], object]) -> None:
    store = RedisKVStore(f"redis://127.0.0.1:{free_port()}/0")
    try:
        with pytest.raises(BackendUnavailableError) as info:
            use(store)
        assert isinstance(info.value.__cause__, redis.RedisError)
    finally:
        store.close()


def test_redis_invalid_url_is_invalid_input() -> None:
    with pytest.raises(InvalidInputError):
        RedisKVStore("http://example.invalid/")


def test_redis_store_does_not_close_a_borrowed_client(redis_url: str) -> None:
    client = redis.Redis.from_url(redis_url)
    store = RedisKVStore(client=client)
    store.commit([Put("s", "k", b"v")])
    store.close()
    with pytest.raises(BackendUnavailableError):
        store.get_many("s", ["k"])
    assert client.ping() is True
    client.close()
