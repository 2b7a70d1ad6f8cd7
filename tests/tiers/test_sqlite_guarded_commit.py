"""A lone SQLite commit whose checks its own puts enforce: the same outcome as checking first.

A step's commit puts its checkpoint and index entry (checked absent) and the
run's head (checked to hold its bytes). Alone in its transaction, such a commit
runs as plain inserts and a guarded update, with no read; when one of them
finds its check failed, the commit is checked and written the usual way. These
tests pin that every outcome (what is stored, the error, the check it names)
is the one the checking path gives, for every check that can fail.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from tiers.backends.base import Check, Delete, Put, Write
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import ConflictError

_RUN = "default:run:r1"
_RUNS = "default:runs"


def _step(seq: int, head: bytes | None) -> tuple[list[Write], list[Check]]:
    """A step's commit: checkpoint and index entry expected absent, the head expected ``head``."""
    new_head = b'{"head_seq":%d}' % seq
    writes: list[Write] = [
        Put(_RUN, f"ckpt:{seq:012d}", b"c" * 5000),
        Put(_RUN, f"idem:r1/s/{seq}", b"i%d" % seq),
        Put(_RUNS, "r1", new_head),
    ]
    checks = [
        Check(_RUN, f"ckpt:{seq:012d}", None),
        Check(_RUN, f"idem:r1/s/{seq}", None),
        Check(_RUNS, "r1", head),
    ]
    return writes, checks


def _rows(store: SqliteKVStore) -> list[tuple[str, bytes]]:
    return store.scan(_RUN) + store.scan(_RUNS)


@pytest.fixture
def store(tmp_path: Path) -> SqliteKVStore:
    kv = SqliteKVStore(tmp_path / "kv.sqlite3", durable=False)
    kv.commit([Put(_RUNS, "r1", b'{"head_seq":0}')], [Check(_RUNS, "r1", None)])
    return kv


def test_steps_commit_and_store_every_put(store: SqliteKVStore) -> None:
    head = b'{"head_seq":0}'
    for seq in (1, 2, 3):
        store.commit(*_step(seq, head))
        head = b'{"head_seq":%d}' % seq
    assert store.get_many(_RUNS, ["r1"]) == [head]
    assert len(store.scan(_RUN)) == 6
    assert store.get_many(_RUN, ["idem:r1/s/2"]) == [b"i2"]
    store.close()


@pytest.mark.parametrize(
    ("taken", "named"),
    [
        ("ckpt", "ckpt:000000000001"),  # the checkpoint's row exists
        ("idem", "idem:r1/s/1"),  # the index entry exists
        ("head", "r1"),  # the head changed
        ("all", "ckpt:000000000001"),  # every check fails: the first one is named
        ("idem+head", "idem:r1/s/1"),
    ],
)
def test_a_failed_check_writes_nothing_and_names_the_first_failed_check(
    store: SqliteKVStore, taken: str, named: str
) -> None:
    if taken in ("ckpt", "all"):
        store.commit([Put(_RUN, "ckpt:000000000001", b"other")])
    if taken in ("idem", "all", "idem+head"):
        store.commit([Put(_RUN, "idem:r1/s/1", b"other")])
    if taken in ("head", "all", "idem+head"):
        store.commit([Put(_RUNS, "r1", b'{"head_seq":9}')])
    before = _rows(store)
    with pytest.raises(ConflictError) as failed:
        store.commit(*_step(1, b'{"head_seq":0}'))
    assert f"{named!r}" in str(failed.value)
    assert _rows(store) == before
    # The store still takes a commit whose checks hold.
    (head,) = store.get_many(_RUNS, ["r1"])
    store.commit([Put(_RUN, "ckpt:000000000002", b"c")], [Check(_RUNS, "r1", head)])
    assert store.get_many(_RUN, ["ckpt:000000000002"]) == [b"c"]
    store.close()


def test_a_head_expected_absent_is_inserted_and_refused_when_present(
    store: SqliteKVStore,
) -> None:
    store.commit([Put(_RUNS, "r2", b"new")], [Check(_RUNS, "r2", None)])
    assert store.get_many(_RUNS, ["r2"]) == [b"new"]
    with pytest.raises(ConflictError):
        store.commit([Put(_RUNS, "r2", b"again")], [Check(_RUNS, "r2", None)])
    assert store.get_many(_RUNS, ["r2"]) == [b"new"]
    store.close()


@pytest.mark.parametrize(
    ("writes", "checks"),
    [
        # A put no check covers, and a check no put covers: the checking path.
        ([Put(_RUN, "a", b"1"), Put(_RUN, "b", b"2")], [Check(_RUN, "a", None)]),
        ([Put(_RUN, "a", b"1")], [Check(_RUN, "a", None), Check(_RUN, "b", None)]),
        # Two puts of one address (the later wins), a delete among the writes.
        (
            [Put(_RUN, "a", b"1"), Put(_RUN, "a", b"2")],
            [Check(_RUN, "a", None), Check(_RUN, "b", None)],
        ),
        (
            [Put(_RUN, "a", b"1"), Delete(_RUN, "z")],
            [Check(_RUN, "a", None), Check(_RUN, "z", None)],
        ),
        # Two checks of one address.
        (
            [Put(_RUN, "a", b"1"), Put(_RUN, "b", b"2")],
            [Check(_RUN, "a", None), Check(_RUN, "a", None)],
        ),
    ],
)
def test_other_commits_check_first_as_before(
    store: SqliteKVStore, writes: list[Write], checks: list[Check]
) -> None:
    store.commit(writes, checks)
    expected = {}
    for write in writes:
        if isinstance(write, Put):
            expected[write.key] = write.value
        else:
            expected.pop(write.key, None)
    assert dict(store.scan(_RUN)) == expected
    with pytest.raises(ConflictError):
        store.commit(writes, checks)
    assert dict(store.scan(_RUN)) == expected
    store.close()
