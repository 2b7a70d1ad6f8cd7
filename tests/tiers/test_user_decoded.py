"""Facts memoised by their stored bytes (``DecodedFacts``) are never stale and never shared mutably."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pytest

from tests.kv_spies import PassThroughKV
from tests.live_objects import holders
from tiers import keys
from tiers.backends.base import Put
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.errors import CorruptRecordError
from tiers.models import UserFact
from tiers.user import DecodedFacts, UserTier


@pytest.fixture
def db(tmp_path: Path) -> Path:
    return tmp_path / "kv.sqlite3"


def test_a_change_through_another_store_handle_is_read_at_once(db: Path) -> None:
    # Two handles on one file stand for two processes: the reader's memo must not hide the write.
    reader_kv, writer_kv = SqliteKVStore(db, durable=False), SqliteKVStore(db, durable=False)
    try:
        memo = DecodedFacts()
        reader = UserTier(reader_kv, decoded=memo)
        writer = UserTier(writer_kv, decoded=DecodedFacts())
        writer.set_facts("u1", {"tone": "short", "language": "fr"})
        assert {f.key: f.value for f in reader.get_facts("u1")} == {
            "tone": "short",
            "language": "fr",
        }
        assert len(memo) == 2
        writer.set_fact("u1", "tone", "detailed")
        writer.delete_fact("u1", "language")
        assert {f.key: f.value for f in reader.get_facts("u1")} == {"tone": "detailed"}
        assert reader.get_fact("u1", "tone").value == "detailed"
    finally:
        reader_kv.close()
        writer_kv.close()


def test_a_deleted_fact_leaves_the_memo_here_at_once_and_elsewhere_at_the_next_listing(
    db: Path,
) -> None:
    # Deleting means gone from memory too: the memo holds whole fact records (their values).
    reader_kv, writer_kv = SqliteKVStore(db, durable=False), SqliteKVStore(db, durable=False)
    try:
        memo = DecodedFacts()
        reader = UserTier(reader_kv, decoded=memo)
        writer = UserTier(writer_kv, decoded=DecodedFacts())
        reader.set_facts("u1", {"tone": "short", "pet": "okapi"})
        reader.set_facts("u2", {"tone": "long"})
        reader.get_facts("u1")
        reader.get_facts("u2")
        assert len(memo) == 3
        assert reader.delete_fact("u1", "pet")
        assert len(memo) == 1  # u1's kept facts went with the delete; u2's stays
        assert [f.key for f in reader.get_facts("u1")] == ["tone"]
        assert len(memo) == 2
        writer.delete_user("u1")  # another process: this one learns of it by listing u1's facts
        assert reader.get_facts("u1") == []
        assert len(memo) == 1
        writer.set_fact("u2", "tone", "terse")  # a replaced value, alike
        assert [f.value for f in reader.get_facts("u2")] == ["terse"]
        assert len(memo) == 1
    finally:
        reader_kv.close()
        writer_kv.close()


def test_a_caller_mutating_a_container_value_changes_nothing_later(db: Path) -> None:
    kv = SqliteKVStore(db, durable=False)
    try:
        tier = UserTier(kv, decoded=DecodedFacts())
        tier.set_fact("u1", "stack", {"db": "postgres", "langs": ["python", "go"]})
        first = tier.get_facts("u1")[0]
        assert isinstance(first.value, dict)
        first.value["db"] = "mysql"
        langs = first.value["langs"]
        assert isinstance(langs, list)
        langs.append("rust")
        assert tier.get_facts("u1")[0].value == {"db": "postgres", "langs": ["python", "go"]}
        assert tier.get_fact("u1", "stack").value == {"db": "postgres", "langs": ["python", "go"]}
    finally:
        kv.close()


def test_corrupt_bytes_raise_every_time_and_are_not_kept(db: Path) -> None:
    kv = SqliteKVStore(db, durable=False)
    try:
        memo = DecodedFacts()
        tier = UserTier(kv, decoded=memo)
        kv.commit([Put(keys.facts_space("default", "u1"), "bad", b'{"not": "a fact"}')])
        for _ in range(2):
            with pytest.raises(CorruptRecordError, match="bad"):
                tier.get_facts("u1")
        assert len(memo) == 0
    finally:
        kv.close()


def test_the_memo_stays_within_its_bounds() -> None:
    memo = DecodedFacts(max_entries=5, max_bytes=10_000)
    facts = [UserFact(user_id="u1", key=f"k{n}", value=n) for n in range(20)]
    for fact in facts:
        data = fact.model_dump_json().encode()
        assert memo.decode("test", fact.key, data, read_at=memo.mark()) == fact
        assert len(memo) <= 5
    by_bytes = DecodedFacts(max_entries=100, max_bytes=400)
    for fact in facts:
        by_bytes.decode("test", fact.key, fact.model_dump_json().encode(), read_at=0)
    assert 0 < len(by_bytes) <= 400 // len(facts[0].model_dump_json())
    # Least recently used goes first: the newest facts are still there.
    last = facts[-1].model_dump_json().encode()
    assert by_bytes.decode("test", facts[-1].key, last, read_at=0) == facts[-1]


class _DeletesAfterReading(PassThroughKV):
    """A real store, passed through, that runs ``then`` once right after a read of a facts space
    returns: a delete committed while a read of the same facts is in flight (another thread)."""

    def __init__(self, inner: SqliteKVStore) -> None:
        super().__init__(inner)
        self.then: Callable[[], None] | None = None

    def _after_read(self) -> None:
        then, self.then = self.then, None
        if then is not None:
            then()

    def get_many(self, space: str, keys: Sequence[str]) -> list[bytes | None]:
        found = super().get_many(space, keys)
        self._after_read()
        return found

    def scan(self, space: str, **options: Any) -> list[tuple[str, bytes]]:
        found = super().scan(space, **options)
        self._after_read()
        return found


@pytest.mark.parametrize("read", ["get_facts", "get_fact"])
def test_a_read_in_flight_when_its_facts_are_deleted_does_not_keep_them(
    db: Path, read: str
) -> None:
    # The delete forgets the space before the read decodes what it read: that must not be kept.
    kv = _DeletesAfterReading(SqliteKVStore(db, durable=False))
    try:
        memo = DecodedFacts()
        tier = UserTier(kv, decoded=memo)
        tier.set_facts("u1", {"pet": "okapi-in-flight"})
        kv.then = lambda: tier.delete_user("u1")
        if read == "get_facts":
            assert [f.value for f in tier.get_facts("u1")] == ["okapi-in-flight"]
        else:
            assert tier.get_fact("u1", "pet").value == "okapi-in-flight"
        assert kv.then is None  # the delete ran between the read and the decode
        assert len(memo) == 0
        assert holders("okapi-in-flight") == []
    finally:
        kv.close()
