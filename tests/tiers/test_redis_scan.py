"""How a scan reads Redis: small values in the script, large ones outside Lua.

A scan whose values come to at most ``SCAN_INLINE_BYTES`` (estimated from the
first one) reads them in the scan script; a larger one reads them in a
``MULTI`` after the listing, and checks
that the listing still holds. These tests put a real commit between the two
round trips (a store whose ``_read_listed`` commits first) and check that the
scan still returns one snapshot: no key without its value, no deleted key, no
key a commit added inside the range left out. A range read so before and
unchanged since is read in one ``MULTI`` that guesses its keys: the same
snapshot whatever a commit changed in between, and no guess while the range
keeps changing; a store's own commit that deletes forgets its space's listings.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator
from typing import Any

import pytest

from tiers.backends import _redis_ranges
from tiers.backends._redis_scripts import SCAN_INLINE_BYTES
from tiers.backends.base import Delete, DeleteSpace, Put, Write
from tiers.backends.redis_cluster_kv import RedisClusterKVStore
from tiers.backends.redis_kv import RedisKVStore

# Values of an eighth of the bound: the script reads up to 8 of them itself.
INLINE = 8
KEYS = [f"c/{i:04d}" for i in range(1, 13)]


def value(key: str) -> bytes:
    """The value stored at ``key``: the key, padded to an eighth of the script's bound."""
    return key.encode().ljust(SCAN_INLINE_BYTES // INLINE, b".")


class _Interposed(RedisKVStore):
    """A Redis store that runs ``between`` (one per read) after a listing, before its values."""

    between: list[Callable[[], None]]
    reads = 0
    guessed = 0

    def _read_listed(
        self, hash_name: str, index_name: str, listed: list[Any], span: tuple[bytes, bytes]
    ) -> tuple[list[Any], Any]:
        self.reads += 1
        if self.between:
            self.between.pop(0)()
        return super()._read_listed(hash_name, index_name, listed, span)

    def _read_guessed(
        self, hash_name: str, index_name: str, args: list[bytes], guess: list[Any]
    ) -> tuple[list[Any], Any]:
        self.guessed += 1
        return super()._read_guessed(hash_name, index_name, args, guess)


class _InterposedCluster(_Interposed, RedisClusterKVStore):
    """The same on a Redis Cluster (its ``MULTI`` goes through the cluster client)."""


@pytest.fixture(params=["redis", "redis_cluster"])
def pair(request: pytest.FixtureRequest) -> Iterator[tuple[_Interposed, RedisKVStore]]:
    """A store that interposes, and a plain one on the same server for the commits."""
    if request.param == "redis":
        url: str = request.getfixturevalue("redis_url")
        reader: _Interposed = _Interposed(url)
        writer = RedisKVStore(url)
    else:
        url = request.getfixturevalue("redis_cluster_url")
        reader = _InterposedCluster(url)
        writer = RedisClusterKVStore(url)
    reader.between = []
    writer.commit([Put("s", key, value(key)) for key in KEYS])
    yield reader, writer
    reader.close()
    writer.close()


def test_small_scans_read_their_values_in_the_script(
    pair: tuple[_Interposed, RedisKVStore],
) -> None:
    reader, writer = pair
    assert reader.scan("s", limit=INLINE) == [(k, value(k)) for k in KEYS[:INLINE]]
    assert reader.scan("s", reverse=True, limit=1) == [(KEYS[-1], value(KEYS[-1]))]
    writer.commit([Put("t", key, b"small") for key in KEYS])
    assert reader.scan("t") == [(key, b"small") for key in KEYS]
    assert reader.reads == 0
    assert reader.scan("s", limit=INLINE + 1) == [(k, value(k)) for k in KEYS[: INLINE + 1]]
    assert reader.reads == 1


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize(
    "change",
    [
        pytest.param([Delete("s", KEYS[5])], id="a-listed-key-deleted"),
        pytest.param([Put("s", "c/0005x", b"new")], id="a-key-added-in-the-span"),
        pytest.param([Put("s", KEYS[6], b"changed")], id="a-value-replaced"),
        pytest.param(
            [Delete("s", KEYS[2]), Put("s", "c/0003x", b"moved")], id="a-key-moved-atomically"
        ),
    ],
)
def test_a_commit_between_listing_and_values_gives_the_later_snapshot(
    pair: tuple[_Interposed, RedisKVStore], change: list[Write], reverse: bool
) -> None:
    reader, writer = pair
    reader.between = [lambda: writer.commit(change)]
    got = reader.scan("s", prefix="c/", reverse=reverse)
    assert got == writer.scan("s", prefix="c/", reverse=reverse)  # the state after the commit
    assert reader.scan("s", prefix="c/", reverse=reverse) == got


@pytest.mark.parametrize("reverse", [False, True])
def test_a_limited_scan_sees_the_range_as_the_commit_left_it(
    pair: tuple[_Interposed, RedisKVStore], reverse: bool
) -> None:
    reader, writer = pair
    limit = INLINE + 2
    # A key added past the page's span leaves the page as it was; one added inside it shifts it.
    outside = "c/9999" if not reverse else "c/0000"
    inside = "c/0002x" if not reverse else f"{KEYS[-2]}x"
    for added in (outside, inside):
        reader.between = [lambda key=added: writer.commit([Put("s", key, b"+")])]
        got = reader.scan("s", prefix="c/", limit=limit, reverse=reverse)
        assert got == writer.scan("s", prefix="c/", limit=limit, reverse=reverse)
        assert len(got) == limit


def test_a_range_that_keeps_changing_is_read_in_the_script(
    pair: tuple[_Interposed, RedisKVStore],
) -> None:
    reader, writer = pair
    moves = [Put("s", f"c/0001-{n}", b"+") for n in range(10)]
    reader.between = [lambda put=put: writer.commit([put]) for put in moves]
    got = reader.scan("s", prefix="c/")
    # Every listing was changed before its values were read: the last try read in the script.
    assert reader.reads == 2
    assert got == writer.scan("s", prefix="c/")
    assert len(got) == len(KEYS) + 2


def test_scans_racing_atomic_moves_never_see_half_of_one(
    pair: tuple[_Interposed, RedisKVStore],
) -> None:
    reader, writer = pair
    # The writer moves one token between two keys in one commit (delete one, put the
    # other): every snapshot holds exactly one token, whatever the interleaving.
    writer.commit([Put("s", "c/token-a", b"t")])
    done = threading.Event()

    def move() -> None:
        side = "a"
        while not done.is_set():
            other = "b" if side == "a" else "a"
            writer.commit([Delete("s", f"c/token-{side}"), Put("s", f"c/token-{other}", b"t")])
            side = other

    thread = threading.Thread(target=move)
    thread.start()
    try:
        for _ in range(300):
            got = reader.scan("s", prefix="c/")
            assert sum(key.startswith("c/token-") for key, _ in got) == 1
            assert len(got) == len(KEYS) + 1
    finally:
        done.set()
        thread.join()


@pytest.mark.parametrize("kv_name", ["redis_kv", "redis_cluster_kv"])
def test_a_scan_over_many_socket_reads_returns_every_value_whole(
    kv_name: str, request: pytest.FixtureRequest
) -> None:
    # 1.3 MB of distinct values: read outside the script, in several socket reads, each
    # value split across them at a different offset.
    store: RedisKVStore = request.getfixturevalue(kv_name)
    stored = {f"v/{i:03d}": bytes([i % 251]) * (20_000 + 37 * i) for i in range(60)}
    store.commit([Put("big", key, data) for key, data in stored.items()])
    assert store.scan("big") == sorted(stored.items())
    assert store.scan("big", reverse=True, limit=7) == sorted(stored.items())[::-1][:7]


@pytest.mark.parametrize("limit", [None, INLINE + 2])
@pytest.mark.parametrize("reverse", [False, True])
def test_a_range_read_again_unchanged_is_one_round_trip(
    pair: tuple[_Interposed, RedisKVStore], reverse: bool, limit: int | None
) -> None:
    reader, writer = pair
    first = reader.scan("s", prefix="c/", reverse=reverse, limit=limit)
    assert (reader.reads, reader.guessed) == (1, 0)
    for _ in range(3):
        assert reader.scan("s", prefix="c/", reverse=reverse, limit=limit) == first
    assert (reader.reads, reader.guessed) == (1, 3)
    assert first == writer.scan("s", prefix="c/", reverse=reverse, limit=limit)
    # Another range (a page after a cursor) is listed on its own.
    cursor = KEYS[-1] if reverse else KEYS[0]
    assert reader.scan("s", prefix="c/", start_after=cursor, reverse=reverse, limit=limit)
    assert (reader.reads, reader.guessed) == (2, 3)


@pytest.mark.parametrize("reverse", [False, True])
@pytest.mark.parametrize(
    "change",
    [
        pytest.param([Delete("s", KEYS[5])], id="a-listed-key-deleted"),
        pytest.param([Put("s", "c/0005x", b"new")], id="a-key-added-in-the-span"),
        pytest.param([Put("s", KEYS[6], b"changed")], id="a-value-replaced"),
        pytest.param(
            [Delete("s", KEYS[2]), Put("s", "c/0003x", b"moved")], id="a-key-moved-atomically"
        ),
        pytest.param([Delete("s", key) for key in KEYS], id="every-key-deleted"),
    ],
)
def test_a_guessed_range_a_commit_changed_gives_the_later_snapshot(
    pair: tuple[_Interposed, RedisKVStore], change: list[Write], reverse: bool
) -> None:
    reader, writer = pair
    reader.scan("s", prefix="c/", reverse=reverse)
    writer.commit(change)
    got = reader.scan("s", prefix="c/", reverse=reverse)
    assert reader.guessed == 1
    assert got == writer.scan("s", prefix="c/", reverse=reverse)
    if not got:
        # Another client deleted every key: the reader keeps none of their names.
        assert not reader._listings._by_range
        return
    # And a commit between a missed guess's listing and its values' read.
    for _ in range(2):  # the range read twice as it stands: guessed next
        reader.scan("s", prefix="c/", reverse=reverse)
    writer.commit([Put("s", "c/0001y", b"+")])
    reader.between = [lambda: writer.commit([Delete("s", "c/0001y")])]
    guessed = reader.guessed
    got = reader.scan("s", prefix="c/", reverse=reverse)
    assert reader.guessed == guessed + 1
    assert not reader.between  # the commit came between
    assert got == writer.scan("s", prefix="c/", reverse=reverse)


def test_a_range_that_keeps_changing_is_not_guessed_until_it_stays(
    pair: tuple[_Interposed, RedisKVStore],
) -> None:
    reader, writer = pair
    reader.scan("s", prefix="c/")
    for n in range(3):  # a run growing by a step between reads
        writer.commit([Put("s", f"c/9{n}", b"+")])
        assert reader.scan("s", prefix="c/") == writer.scan("s", prefix="c/")
    # One guess missed (the first read after the growth began); none after it.
    assert (reader.guessed, reader.reads) == (1, 4)
    reader.scan("s", prefix="c/")  # the same listing as the last one: the range stays
    assert reader.scan("s", prefix="c/") == writer.scan("s", prefix="c/")
    assert (reader.guessed, reader.reads) == (2, 5)


def remembered(store: RedisKVStore) -> set[str]:
    """Every key name the store's remembered listings hold."""
    by_range = store._listings._by_range
    return {bytes(key).decode() for listing, _ in by_range.values() for key in listing}


@pytest.mark.parametrize(
    "delete",
    [
        pytest.param([Delete("s", KEYS[3])], id="a-key"),
        pytest.param([DeleteSpace("s")], id="the-space"),
    ],
)
def test_a_commit_that_deletes_forgets_the_listings_of_its_space(
    pair: tuple[_Interposed, RedisKVStore], delete: list[Write]
) -> None:
    reader, writer = pair
    writer.commit([Put("u", key, value(key)) for key in KEYS])
    for space in ("s", "u"):
        reader.scan(space)
        reader.scan(space, reverse=True, limit=INLINE + 2)
    assert remembered(reader) == set(KEYS)
    reader.commit(delete)
    # Deleting means gone: no listing of "s" is kept; "u"'s are untouched.
    kept = reader._listings._by_range
    assert [span[0] for span in kept] == [reader._keys("u")[0]] * 2
    assert reader.scan("s") == writer.scan("s")
    assert reader.scan("u") == writer.scan("u")


def test_a_long_listing_is_not_remembered_and_close_forgets_all(
    pair: tuple[_Interposed, RedisKVStore], monkeypatch: pytest.MonkeyPatch
) -> None:
    reader, _ = pair
    monkeypatch.setattr(_redis_ranges, "LISTED_KEYS_KEPT", INLINE + 2)
    assert len(reader.scan("s")) == len(KEYS)
    assert reader.scan("s", limit=INLINE + 2)
    assert remembered(reader) == set(KEYS[: INLINE + 2])
    assert reader.scan("s", limit=INLINE + 2) == reader.scan("s")[: INLINE + 2]
    reader.close()
    assert not reader._listings._by_range
