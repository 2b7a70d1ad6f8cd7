"""User tier on every KV backend."""

from __future__ import annotations

import threading
from datetime import UTC, datetime, timedelta

import pytest

from tiers import keys
from tiers.backends.base import Check, Delete, KVStore, Put
from tiers.codec import encode
from tiers.errors import ConflictError, FactNotFoundError, InvalidInputError, ValueTooLargeError
from tiers.models import FactCandidate, UserFact
from tiers.user import UserTier


@pytest.fixture
def users(kv: KVStore) -> UserTier:
    return UserTier(kv)


def test_set_get_and_list(users: UserTier) -> None:
    users.set_fact("alice", "language", "fr", source="session:s1")
    users.set_fact("alice", "tone", {"style": "brief", "emoji": False})
    fact = users.get_fact("alice", "language")
    assert fact.value == "fr"
    assert fact.source == "session:s1"
    assert fact.updated_at.tzinfo is not None
    assert [f.key for f in users.get_facts("alice")] == ["language", "tone"]
    assert users.get_facts("bob") == []


def test_update_keeps_history(users: UserTier) -> None:
    users.set_fact("alice", "city", "Lyon")
    users.set_fact("alice", "city", "Paris", source="session:s2")
    history = users.fact_history("alice", "city")
    assert [f.value for f in history] == ["Lyon", "Paris"]
    assert users.get_fact("alice", "city").value == "Paris"


def test_same_value_is_not_a_new_version(users: UserTier) -> None:
    users.set_fact("alice", "city", "Lyon")
    users.set_fact("alice", "city", "Lyon")
    assert len(users.fact_history("alice", "city")) == 1


def test_older_write_loses_by_recency_but_is_kept(users: UserTier) -> None:
    now = datetime.now(UTC)
    users.set_fact("alice", "diet", "vegan", updated_at=now)
    result = users.set_fact("alice", "diet", "omnivore", updated_at=now - timedelta(days=3))
    assert result.value == "vegan"
    assert users.get_fact("alice", "diet").value == "vegan"
    assert [f.value for f in users.fact_history("alice", "diet")] == ["omnivore", "vegan"]


def test_delete_records_tombstone(users: UserTier) -> None:
    users.set_fact("alice", "pet", "cat")
    assert users.delete_fact("alice", "pet") is True
    assert users.delete_fact("alice", "pet") is False
    with pytest.raises(FactNotFoundError, match="pet"):
        users.get_fact("alice", "pet")
    history = users.fact_history("alice", "pet")
    assert [f.value for f in history] == ["cat", None]
    assert history[-1].source == "deleted"


def test_delete_user_removes_everything(users: UserTier) -> None:
    users.set_fact("alice", "a", 1)
    users.set_fact("alice", "a", 2)
    users.set_fact("bob", "a", 3)
    users.delete_user("alice")
    assert users.get_facts("alice") == []
    assert users.fact_history("alice", "a") == []
    assert users.get_fact("bob", "a").value == 3


def test_tenants_are_isolated(kv: KVStore) -> None:
    UserTier(kv, tenant="t1").set_fact("alice", "k", "one")
    other = UserTier(kv, tenant="t2")
    assert other.get_facts("alice") == []
    with pytest.raises(FactNotFoundError):
        other.get_fact("alice", "k")


@pytest.mark.parametrize(
    ("user_id", "key", "field"),
    [("", "k", "user_id"), ("a:b", "k", "user_id"), ("alice", "", "key"), ("alice", "x y", "key")],
)
def test_bad_ids_are_refused(users: UserTier, user_id: str, key: str, field: str) -> None:
    with pytest.raises(InvalidInputError) as info:
        users.set_fact(user_id, key, "v")
    assert info.value.field == field


def test_bad_confidence_is_refused_and_nothing_changes(users: UserTier) -> None:
    users.set_fact("alice", "k", "v")
    with pytest.raises(InvalidInputError, match="confidence"):
        users.set_fact("alice", "k", "w", confidence=2.0)
    assert users.get_fact("alice", "k").value == "v"


def test_oversized_value_is_refused_and_nothing_changes(users: UserTier) -> None:
    users.set_fact("alice", "notes", "short")
    with pytest.raises(ValueTooLargeError):
        users.set_fact("alice", "notes", "x" * 100_000)
    assert users.get_fact("alice", "notes").value == "short"
    assert len(users.fact_history("alice", "notes")) == 1


def test_concurrent_writers_lose_no_version(users: UserTier) -> None:
    def write(i: int) -> None:
        for j in range(10):
            users.set_fact("alice", "counter", f"{i}-{j}")

    # Eight threads on one fact: each write must get through (lost compare-and-sets back off).
    threads = [threading.Thread(target=write, args=(i,)) for i in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    history = users.fact_history("alice", "counter")
    assert len(history) == 80
    assert len({f.value for f in history}) == 80


def test_values_read_back_exactly_but_prose_is_trimmed(kv: KVStore) -> None:
    users = UserTier(kv)
    users.set_fact("u", "signature", "  -- Dana\n", evidence="  my sig  ")
    fact = users.get_fact("u", "signature")
    assert fact.value == "  -- Dana\n"
    assert fact.evidence == "my sig"


NOT_JSON = [
    pytest.param(float("nan"), id="nan"),
    pytest.param(float("inf"), id="inf"),
    pytest.param(-float("inf"), id="-inf"),
    pytest.param(1e400, id="1e400"),
    pytest.param({"nested": [1, float("nan")]}, id="nested-nan"),
    pytest.param("\ud800", id="lone-surrogate"),
    pytest.param(["ok", {"k": "x\udfff"}], id="nested-surrogate"),
    pytest.param({"\ud800": 1}, id="surrogate-key"),
]


@pytest.mark.parametrize("value", NOT_JSON)
def test_values_json_cannot_hold_are_refused_and_nothing_changes(
    users: UserTier, value: object
) -> None:
    users.set_fact("alice", "k", "before")
    with pytest.raises(InvalidInputError) as info:
        users.set_fact("alice", "k", value)  # type: ignore[arg-type]
    assert info.value.field == "value"
    with pytest.raises(InvalidInputError) as info:
        users.set_fact("alice", "fresh", value)  # type: ignore[arg-type]
    assert info.value.field == "value"
    assert [(f.key, f.value) for f in users.get_facts("alice")] == [("k", "before")]
    assert len(users.fact_history("alice", "k")) == 1


@pytest.mark.parametrize("value", NOT_JSON)
def test_set_facts_is_all_or_nothing(users: UserTier, value: object) -> None:
    users.set_fact("alice", "a", "before")
    with pytest.raises(InvalidInputError) as info:
        users.set_facts("alice", {"a": "after", "b": 2, "bad": value})  # type: ignore[dict-item]
    assert info.value.field == "facts.bad"
    assert [(f.key, f.value) for f in users.get_facts("alice")] == [("a", "before")]


def test_set_facts_over_the_size_limit_writes_nothing(users: UserTier, kv: KVStore) -> None:
    with pytest.raises(ValueTooLargeError) as info:
        users.set_facts("alice", {"small": "ok", "huge": "x" * kv.max_value_bytes})
    assert info.value.field == "facts.huge"
    assert users.get_facts("alice") == []


def test_set_facts_needs_a_mapping(users: UserTier) -> None:
    with pytest.raises(InvalidInputError) as info:
        users.set_facts("alice", [("a", "b")])  # type: ignore[arg-type]
    assert info.value.field == "facts"
    assert users.get_facts("alice") == []


def test_a_future_updated_at_is_clamped_so_a_later_write_wins(users: UserTier) -> None:
    before = datetime.now(UTC)
    learned = users.set_fact(
        "alice", "contact", "email", source="session:s1", updated_at=before + timedelta(hours=2)
    )
    assert learned.updated_at <= datetime.now(UTC)  # never dated after it was written
    assert users.set_fact("alice", "contact", "phone").value == "phone"
    assert users.get_fact("alice", "contact").value == "phone"


def test_a_stored_future_time_does_not_outrank_now(users: UserTier, kv: KVStore) -> None:
    # A fact written future-dated by an older version (before clamping) loses to a write now.
    future = UserFact(
        user_id="alice",
        key="contact",
        value="email",
        updated_at=datetime.now(UTC) + timedelta(days=1),
    )
    kv.commit([Put(keys.facts_space("default", "alice"), "contact", encode(future))])
    assert users.set_fact("alice", "contact", "phone").value == "phone"
    # A backfill (dated in the past) still goes to the history only.
    old = datetime.now(UTC) - timedelta(days=3)
    assert users.set_fact("alice", "contact", "fax", updated_at=old).value == "phone"


def test_naive_updated_at_is_utc_and_non_datetimes_are_refused(users: UserTier) -> None:
    naive = datetime(2025, 1, 2, 3, 4, 5)  # naive on purpose
    fact = users.set_fact("alice", "k", "v", updated_at=naive)
    assert fact.updated_at == naive.replace(tzinfo=UTC)
    for bad in ("yesterday", 5, 1.5):
        with pytest.raises(InvalidInputError) as info:
            users.set_fact("alice", "k", "w", updated_at=bad)  # type: ignore[arg-type]
        assert info.value.field == "updated_at"
    assert users.get_fact("alice", "k").value == "v"


# -- facts learned from a source: written only while it exists, withdrawn with it -------------


def test_learned_facts_are_written_only_while_their_source_holds(
    users: UserTier, kv: KVStore
) -> None:
    space, key = "default:transcripts", "s1"  # stands for the transcript the facts came from
    kv.commit([Put(space, key, b"header")])

    def guard() -> list[Check]:
        (raw,) = kv.get_many(space, [key])
        if raw is None:
            raise ConflictError("the transcript is gone")
        return [Check(space, key, raw)]

    learned = [
        FactCandidate(key="tea", value="green", confidence=0.7, evidence="I like green tea"),
        FactCandidate(key="tea", value="black", confidence=0.6, evidence="Actually black tea"),
        FactCandidate(key="city", value="Lyon"),
    ]
    stored = users.set_learned_facts("alice", learned, source="session:s1", guard=guard)
    assert [(f.key, f.value) for f in stored] == [("tea", "black"), ("city", "Lyon")]
    assert users.get_fact("alice", "tea").evidence == "Actually black tea"
    kv.commit([Delete(space, key)])
    with pytest.raises(ConflictError, match="gone"):
        users.set_learned_facts("bob", learned, source="session:s1", guard=guard)
    assert users.get_facts("bob") == []


def test_forget_source_withdraws_every_version_and_restores_the_one_before(
    users: UserTier,
) -> None:
    users.set_fact("alice", "city", "Lyon", source="api")
    users.set_fact("alice", "city", "Paris", source="session:s1", evidence="I moved to Paris")
    users.set_fact("alice", "tea", "green", source="session:s1", evidence="I like green tea")
    users.set_fact("alice", "tea", "black", source="session:s2")
    users.set_fact("alice", "pet", "cat", source="session:s1", evidence="my cat Tom")
    users.delete_fact("alice", "pet")
    users.set_fact("alice", "dog", "Rex", source="session:s1")
    users.set_fact("bob", "city", "Rome", source="session:s1")

    assert users.forget_source("alice", "session:s1") == 4  # Paris, green, cat, Rex
    assert users.forget_source("alice", "session:s1") == 0
    # Paris came from s1: Lyon, the value before it, is current again (and once, not twice).
    assert [(f.value, f.source) for f in users.fact_history("alice", "city")] == [("Lyon", "api")]
    # s2's later value stays; s1's earlier one leaves the history.
    assert [f.value for f in users.fact_history("alice", "tea")] == ["black"]
    # Deleted before, still deleted; its tombstone keeps no evidence of s1.
    history = users.fact_history("alice", "pet")
    assert [(f.value, f.source, f.evidence) for f in history] == [(None, "deleted", "")]
    with pytest.raises(FactNotFoundError):
        users.get_fact("alice", "dog")
    assert users.get_fact("bob", "city").value == "Rome"
