"""User tier on an encrypted store: fact keys are opaque names, and the facts API is unchanged.

A fact key names its subject (``preference.green_tea``), and an encrypted store
encrypts values, not key names: the tier stores each fact under the store's
token of its key (``EncryptedKVStore.key_token``), the key inside the encrypted
record. Each test runs on a SQLite file and on a real redis-server; what the
backend holds is read through the plain store (``kv``) under the encrypted one.

A store encrypted by the previous release (fact keys readable in key names) is
made here as that release made it: the tier writing through a view of the
encrypted store that offers no key tokens, and no mark of opaque fact names.
"""

from __future__ import annotations

from collections.abc import Callable
from datetime import UTC, datetime, timedelta

import pytest

from tests.kv_spies import PassThroughKV
from tiers import keys
from tiers.backends.base import DeleteSpace, KVStore, Put
from tiers.backends.encrypted_kv import (
    EncryptedKVStore,
    MasterKey,
    encrypt_existing,
    rotate_master_key,
)
from tiers.errors import EncryptionKeyError, FactNotFoundError
from tiers.models import FactCandidate
from tiers.user import UserTier

FACTS = keys.facts_space("default", "alice")
HISTORY = keys.fact_history_space("default", "alice")


def key() -> MasterKey:
    return MasterKey.generate()[0]


@pytest.fixture
def master() -> MasterKey:
    return key()


@pytest.fixture
def store(kv: KVStore, master: MasterKey) -> EncryptedKVStore:
    return EncryptedKVStore(kv, master)


@pytest.fixture
def users(store: EncryptedKVStore) -> UserTier:
    return UserTier(store)


def names(kv: KVStore, space: str) -> list[str]:
    """The key names the backend holds in ``space``."""
    return [name for name, _ in kv.scan(space)]


def test_fact_keys_are_stored_as_tokens_and_read_back_by_key(
    users: UserTier, store: EncryptedKVStore, kv: KVStore
) -> None:
    users.set_fact("alice", "wifi_network_name", "HomeNet")
    users.set_facts("alice", {"zeta": 1, "preference.green_tea": True, "alpha": "a"})
    users.set_fact("alice", "wifi_network_name", "CafeNet")

    assert users.get_fact("alice", "wifi_network_name").value == "CafeNet"
    # Listed in the order of the keys, as on a plain store (tokens have an order of their own).
    listed = users.get_facts("alice")
    assert [f.key for f in listed] == ["alpha", "preference.green_tea", "wifi_network_name", "zeta"]
    assert [f.value for f in users.fact_history("alice", "wifi_network_name")] == [
        "HomeNet",
        "CafeNet",
    ]

    token = store.key_token(FACTS, "wifi_network_name")
    assert token.startswith("~")
    assert len(token) == 27  # "~" and 128 bits in base32
    assert sorted(names(kv, FACTS)) == sorted(
        store.key_token(FACTS, k)
        for k in ("alpha", "preference.green_tea", "wifi_network_name", "zeta")
    )
    # A fact's history is one prefix scan of its token.
    (past,) = names(kv, HISTORY)
    assert past.startswith(token + "/")
    for name in names(kv, FACTS) + names(kv, HISTORY):
        for fact_key in ("wifi", "network", "green_tea", "preference", "alpha", "zeta"):
            assert fact_key not in name


def test_tokens_are_stable_keyed_and_per_user(kv: KVStore, master: MasterKey) -> None:
    store = EncryptedKVStore(kv, master)
    bob = keys.facts_space("default", "bob")
    token = store.key_token(FACTS, "city")
    assert store.key_token(FACTS, "city") == token
    assert EncryptedKVStore(kv, master).key_token(FACTS, "city") == token  # reopened
    assert store.key_token(FACTS, "town") != token
    assert store.key_token(bob, "city") != token  # one user's tokens tell nothing of another's
    # Another tenant has another data key, so other tokens for the same user and key.
    assert store.key_token(keys.facts_space("acme", "alice"), "city") != token
    # Rotating the master key re-wraps the data keys: the tokens stay.
    new = key()
    rotate_master_key(kv, master, new)
    assert EncryptedKVStore(kv, new).key_token(FACTS, "city") == token


def test_a_plain_store_keeps_fact_keys_as_names(kv: KVStore) -> None:
    users = UserTier(kv)
    users.set_fact("alice", "city", "Lyon")
    users.set_fact("alice", "city", "Paris")
    assert names(kv, FACTS) == ["city"]
    (past,) = names(kv, HISTORY)
    assert past.startswith("city/")


def test_delete_keeps_a_tombstone_and_delete_user_removes_everything(
    users: UserTier, kv: KVStore
) -> None:
    users.set_fact("alice", "pet", "cat")
    assert users.delete_fact("alice", "pet") is True
    assert users.delete_fact("alice", "pet") is False
    with pytest.raises(FactNotFoundError, match="pet"):
        users.get_fact("alice", "pet")
    history = users.fact_history("alice", "pet")
    assert [(f.key, f.value, f.source) for f in history] == [
        ("pet", "cat", "api"),
        ("pet", None, "deleted"),
    ]
    users.set_fact("alice", "a", 1)
    users.set_fact("bob", "a", 3)
    users.delete_user("alice")
    assert users.get_facts("alice") == []
    assert users.fact_history("alice", "pet") == []
    assert names(kv, FACTS) == names(kv, HISTORY) == []
    assert users.get_fact("bob", "a").value == 3


def test_learned_facts_are_withdrawn_with_their_source(users: UserTier) -> None:
    users.set_fact("alice", "city", "Lyon", source="api")
    learned = [
        FactCandidate(key="city", value="Paris", evidence="I moved to Paris"),
        FactCandidate(key="preference.green_tea", value=True, evidence="I prefer green tea"),
    ]
    stored = users.set_learned_facts("alice", learned, source="session:s1")
    assert [(f.key, f.value) for f in stored] == [("city", "Paris"), ("preference.green_tea", True)]
    assert users.get_fact("alice", "preference.green_tea").evidence == "I prefer green tea"

    assert users.forget_source("alice", "session:s1") == 2
    # Paris came from s1: Lyon, the value before it, is current again (and once, not twice).
    assert [(f.value, f.source) for f in users.fact_history("alice", "city")] == [("Lyon", "api")]
    with pytest.raises(FactNotFoundError):
        users.get_fact("alice", "preference.green_tea")
    assert [f.key for f in users.get_facts("alice")] == ["city"]


def test_facts_expire_by_retention_history_included(users: UserTier, kv: KVStore) -> None:
    now = datetime.now(UTC)
    for n in range(3):  # several pages of names
        users.set_fact("alice", f"old-{n}", n, updated_at=now - timedelta(days=100))
        users.set_fact("alice", f"old-{n}", n + 1, updated_at=now - timedelta(days=90))
    users.set_fact("alice", "live", "v1", updated_at=now - timedelta(days=100))
    users.set_fact("alice", "live", "v2", updated_at=now - timedelta(days=60))
    users.set_fact("alice", "live", "v3", updated_at=now - timedelta(days=5))
    removed = users.expire_facts("alice", before=now - timedelta(days=30), page=2)
    assert removed == 3 * 2 + 1  # old-*: current + one past version each; live: v1
    assert [f.key for f in users.get_facts("alice")] == ["live"]
    assert [v.value for v in users.fact_history("alice", "live")] == ["v2", "v3"]
    assert users.expire_facts("alice", before=now + timedelta(days=1)) == 2
    assert names(kv, FACTS) == names(kv, HISTORY) == []


# -- a store encrypted by the previous release ----------------------------------------------------


def write_as_the_previous_release(
    inner: KVStore, master: MasterKey, write: Callable[[UserTier], object]
) -> None:
    """Encrypt ``inner`` and let ``write`` store facts as the previous release did."""
    # Seen through the KVStore protocol alone, the encrypted store offers no key tokens: the
    # tier writes fact keys readable, values encrypted, as that release did.
    write(UserTier(PassThroughKV(EncryptedKVStore(inner, master))))
    # That release kept no mark of opaque fact names.
    inner.commit([DeleteSpace(keys.opaque_names_space())])


def old_facts(users: UserTier) -> None:
    users.set_fact("alice", "wifi_network_name", "HomeNet")
    users.set_fact("alice", "wifi_network_name", "CafeNet")
    users.set_fact("alice", "preference.green_tea", True, source="session:s1")
    users.set_fact("alice", "pet", "cat")
    users.delete_fact("alice", "pet")


def test_a_store_of_the_previous_release_is_refused_until_encrypt_renames_its_fact_keys(
    kv: KVStore, master: MasterKey
) -> None:
    write_as_the_previous_release(kv, master, old_facts)
    assert "wifi_network_name" in names(kv, FACTS)
    with pytest.raises(EncryptionKeyError, match="tiermem encrypt"):
        EncryptedKVStore(kv, master)

    report = encrypt_existing(kv, master, page=2)
    assert (report.encrypted, report.renamed) == (0, 2 + 3)  # 2 facts; 3 past versions
    store = EncryptedKVStore(kv, master)
    users = UserTier(store)
    assert users.get_fact("alice", "wifi_network_name").value == "CafeNet"
    assert [f.key for f in users.get_facts("alice")] == [
        "preference.green_tea",
        "wifi_network_name",
    ]
    assert [f.value for f in users.fact_history("alice", "wifi_network_name")] == [
        "HomeNet",
        "CafeNet",
    ]
    assert [f.value for f in users.fact_history("alice", "pet")] == ["cat", None]
    assert users.forget_source("alice", "session:s1") == 1
    for name in names(kv, FACTS) + names(kv, HISTORY):
        assert name.startswith("~")
    # Resumable, and done: nothing more to rename.
    again = encrypt_existing(kv, master)
    assert (again.encrypted, again.renamed) == (0, 0)


def test_an_interrupted_upgrade_is_finished_by_running_encrypt_again(
    kv: KVStore, master: MasterKey
) -> None:
    write_as_the_previous_release(kv, master, old_facts)
    store = EncryptedKVStore(kv, master, adopt_plaintext=True)
    # Half done: the current fact renamed, its history not, and the store not marked.
    (value,) = store.get_many(FACTS, ["wifi_network_name"])
    assert value is not None
    store.commit(
        [Put(FACTS, store.key_token(FACTS, "wifi_network_name"), value)],
    )
    kv.commit([DeleteSpace(keys.opaque_names_space())])
    with pytest.raises(EncryptionKeyError, match="tiermem encrypt"):
        EncryptedKVStore(kv, master)
    encrypt_existing(kv, master)
    users = UserTier(EncryptedKVStore(kv, master))
    assert [f.value for f in users.fact_history("alice", "wifi_network_name")] == [
        "HomeNet",
        "CafeNet",
    ]


def test_a_store_of_the_previous_release_without_facts_opens_as_it_is(
    kv: KVStore, master: MasterKey
) -> None:
    write_as_the_previous_release(kv, master, lambda users: None)
    EncryptedKVStore(kv, master).commit([Put("default:runs", "r1", b"{}")])
    # Marked at that open: facts written now are opaque, and it opens again.
    users = UserTier(EncryptedKVStore(kv, master))
    users.set_fact("alice", "city", "Lyon")
    assert names(kv, FACTS)[0].startswith("~")
    assert UserTier(EncryptedKVStore(kv, master)).get_fact("alice", "city").value == "Lyon"
