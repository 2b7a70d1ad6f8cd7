"""Encryption at rest in the KV layer: keys, rotation, refusals, tampering, migration.

Each test runs on a SQLite file and on a real redis-server (the ``kv`` fixture
gives the plain store as the backend holds it; the encrypted store is opened
over it). What the backend stores is read through the plain store.
"""

from __future__ import annotations

import base64
from pathlib import Path

import pytest

from memory.settings import Settings
from tiers.backends import open_kv_store
from tiers.backends.base import Check, KVStore, Put, TokenizesKeys
from tiers.backends.encrypted_kv import (
    OVERHEAD,
    EncryptedKVStore,
    MasterKey,
    encrypt_existing,
    refuse_if_encrypted,
    rotate_master_key,
)
from tiers.errors import (
    ConflictError,
    EncryptionKeyError,
    InvalidInputError,
    UndecryptableValueError,
    ValueTooLargeError,
)

KEYRING = "_system:keyring"
SECRET = b"my card is 4111 1111 1111 1111"


def key() -> MasterKey:
    return MasterKey.generate()[0]


def test_values_are_stored_encrypted_and_read_back(kv: KVStore) -> None:
    store = EncryptedKVStore(kv, key())
    store.commit([Put("acme:user:u1:facts", "card", SECRET), Put("acme:runs", "r1", b"")])
    assert store.get_many("acme:user:u1:facts", ["card", "gone"]) == [SECRET, None]
    assert store.scan("acme:runs") == [("r1", b"")]
    (raw,) = kv.get_many("acme:user:u1:facts", ["card"])
    assert raw is not None
    assert SECRET not in raw
    assert b"4111" not in raw
    assert len(raw) == len(SECRET) + OVERHEAD
    assert raw.startswith(b"\xf5TM\x01")
    assert store.max_value_bytes == kv.max_value_bytes - OVERHEAD


def test_each_tenant_has_its_own_data_key(kv: KVStore) -> None:
    store = EncryptedKVStore(kv, key())
    for space in ("acme:s", "zeta:s", "solo"):
        store.commit([Put(space, "k", SECRET)])  # one placement a commit
    names = [name for name, _ in kv.scan(KEYRING)]
    assert names == ["dek:", "dek:acme", "dek:zeta", "master"]
    raws = {kv.get_many(space, ["k"])[0] for space in ("acme:s", "zeta:s", "solo")}
    assert len(raws) == 3
    # The same plaintext at the same key encrypts to the same bytes (what checks rely on) ...
    before = kv.get_many("acme:s", ["k"])
    store.commit([Put("acme:s", "k", SECRET)])
    assert kv.get_many("acme:s", ["k"]) == before
    # ... and at another key of the same space to other bytes.
    store.commit([Put("acme:s", "k2", SECRET)])
    assert kv.get_many("acme:s", ["k2"]) != before


def test_a_check_of_the_plaintext_read_holds_and_a_stale_one_fails(kv: KVStore) -> None:
    store = EncryptedKVStore(kv, key())
    store.commit([Put("t:s", "head", b"1")], [Check("t:s", "head", None)])
    store.commit([Put("t:s", "head", b"2")], [Check("t:s", "head", b"1")])
    with pytest.raises(ConflictError):
        store.commit([Put("t:s", "head", b"3")], [Check("t:s", "head", b"1")])
    assert store.get_many("t:s", ["head"]) == [b"2"]


def test_a_wrong_master_key_is_refused_at_open_naming_both_keys(kv: KVStore) -> None:
    right, wrong = key(), key()
    EncryptedKVStore(kv, right).commit([Put("t:s", "k", SECRET)])
    with pytest.raises(EncryptionKeyError, match="wrong master key") as refused:
        EncryptedKVStore(kv, wrong)
    assert right.id in str(refused.value)
    assert wrong.id in str(refused.value)


def test_an_encrypted_store_is_refused_without_its_key(kv: KVStore) -> None:
    master = key()
    EncryptedKVStore(kv, master).commit([Put("t:s", "k", SECRET)])
    with pytest.raises(EncryptionKeyError, match="TIERMEM_MASTER_KEY") as refused:
        refuse_if_encrypted(kv)
    assert master.id in str(refused.value)


def test_a_store_with_plaintext_is_refused_until_encrypted_in_place(kv: KVStore) -> None:
    # One commit per placement, as a store that shards requires (tiers.keys.placement).
    kv.commit([Put("t:user:u:facts", "card", SECRET)])
    kv.commit([Put("_system:api-keys", "id1", b"{}")])
    master = key()
    with pytest.raises(EncryptionKeyError, match="tiermem encrypt"):
        EncryptedKVStore(kv, master)
    report = encrypt_existing(kv, master, page=1)
    assert (report.spaces, report.encrypted, report.already) == (2, 2, 0)
    # A fact key names its subject: it is renamed to its opaque token as well.
    assert report.renamed == 1
    store = EncryptedKVStore(kv, master)
    token = store.key_token("t:user:u:facts", "card")
    assert kv.get_many("t:user:u:facts", ["card"]) == [None]
    (raw,) = kv.get_many("t:user:u:facts", [token])
    assert raw is not None
    assert SECRET not in raw
    assert store.get_many("t:user:u:facts", [token]) == [SECRET]
    assert store.get_many("_system:api-keys", ["id1"]) == [b"{}"]
    # Resumable: a second run finds everything encrypted already.
    again = encrypt_existing(kv, master)
    assert (again.encrypted, again.already, again.renamed) == (0, 2, 0)


def test_a_plaintext_value_in_an_encrypted_store_fails_its_read(kv: KVStore) -> None:
    store = EncryptedKVStore(kv, key())
    kv.commit([Put("t:s", "k", b'{"plain": true}')])
    with pytest.raises(UndecryptableValueError, match=r"not encrypted.*tiermem encrypt"):
        store.get_many("t:s", ["k"])
    with pytest.raises(UndecryptableValueError):
        store.scan("t:s")


def test_a_changed_or_moved_value_fails_authentication(kv: KVStore) -> None:
    store = EncryptedKVStore(kv, key())
    store.commit([Put("a:s", "k", SECRET)])
    store.commit([Put("b:s", "k", b"other")])
    (raw,) = kv.get_many("a:s", ["k"])
    assert raw is not None
    flipped = raw[:-1] + bytes([raw[-1] ^ 1])
    kv.commit([Put("a:s", "k", flipped)])
    with pytest.raises(UndecryptableValueError, match="fails authentication"):
        store.get_many("a:s", ["k"])
    kv.commit([Put("a:s", "k", raw), Put("a:s", "moved", raw), Put("a:t", "k", raw)])
    assert store.get_many("a:s", ["k"]) == [SECRET]
    with pytest.raises(UndecryptableValueError, match="fails authentication"):
        store.get_many("a:s", ["moved"])  # another key
    with pytest.raises(UndecryptableValueError, match="fails authentication"):
        store.get_many("a:t", ["k"])  # another space
    kv.commit([Put("b:s", "k", raw)])
    with pytest.raises(UndecryptableValueError, match="not the data key"):
        store.get_many("b:s", ["k"])  # another tenant
    kv.commit([Put("a:s", "k", raw[:10])])
    with pytest.raises(UndecryptableValueError, match="truncated"):
        store.get_many("a:s", ["k"])


def test_rotation_rewraps_data_keys_and_rewrites_no_value(kv: KVStore) -> None:
    old, new = key(), key()
    store = EncryptedKVStore(kv, old)
    for write in [Put("a:s", "k", SECRET), Put("b:s", "k", b"b"), Put("g", "k", b"g")]:
        store.commit([write])  # one placement a commit
    values_before = {space: kv.scan(space) for space in ("a:s", "b:s", "g")}
    keyring_before = dict(kv.scan(KEYRING))

    assert rotate_master_key(kv, old, new) == 3
    assert {space: kv.scan(space) for space in ("a:s", "b:s", "g")} == values_before
    keyring_after = dict(kv.scan(KEYRING))
    assert all(keyring_after[name] != keyring_before[name] for name in keyring_before)

    rotated = EncryptedKVStore(kv, new)
    assert rotated.get_many("a:s", ["k"]) == [SECRET]
    assert rotated.scan("g") == [("k", b"g")]
    with pytest.raises(EncryptionKeyError, match="wrong master key"):
        EncryptedKVStore(kv, old)
    # Again with the same keys: nothing to do. With a key that is neither: refused.
    assert rotate_master_key(kv, old, new) == 0
    with pytest.raises(EncryptionKeyError, match="wrong master key"):
        rotate_master_key(kv, key(), key())

    # A store still open on the old key keeps reading and writing with the data keys it
    # holds, but cannot make a data key under the old master key any more.
    store.commit([Put("a:s", "k2", b"still works")])
    assert rotated.get_many("a:s", ["k2"]) == [b"still works"]
    with pytest.raises(EncryptionKeyError, match="rotated"):
        store.commit([Put("newtenant:s", "k", b"x")])
    rotated.commit([Put("newtenant:s", "k", b"x")])
    assert rotated.get_many("newtenant:s", ["k"]) == [b"x"]


def test_a_data_key_made_during_a_rotation_is_rewrapped_too(kv: KVStore) -> None:
    old, new = key(), key()
    EncryptedKVStore(kv, old).commit([Put("a:s", "k", b"a")])
    racing = EncryptedKVStore(kv, old)
    original_scan = kv.scan
    made = False

    def scan_then_race(space: str, **kwargs: object) -> list[tuple[str, bytes]]:
        nonlocal made
        pairs = original_scan(space, **kwargs)  # type: ignore[arg-type]
        if space == KEYRING and not made:
            made = True  # a data key appears after the rotation read the keyring
            racing.commit([Put("b:s", "k", b"b")])
        return pairs

    kv.scan = scan_then_race  # type: ignore[method-assign]
    try:
        assert rotate_master_key(kv, old, new) == 2
    finally:
        kv.scan = original_scan  # type: ignore[method-assign]
    rotated = EncryptedKVStore(kv, new)
    assert rotated.get_many("b:s", ["k"]) == [b"b"]


def test_the_keyring_is_closed_to_callers(kv: KVStore) -> None:
    store = EncryptedKVStore(kv, key())
    with pytest.raises(InvalidInputError, match="encryption keys"):
        store.get_many(KEYRING, ["master"])
    with pytest.raises(InvalidInputError, match="encryption keys"):
        store.scan(KEYRING)
    with pytest.raises(InvalidInputError, match="encryption keys"):
        store.commit([Put(KEYRING, "master", b"x")])
    with pytest.raises(InvalidInputError, match="encryption keys"):
        store.commit([], [Check(KEYRING, "master", None)])
    assert kv.get_many(KEYRING, ["master"]) != [None]


def test_only_the_encrypted_store_names_keys_opaquely(kv: KVStore) -> None:
    store = EncryptedKVStore(kv, key())
    assert isinstance(store, TokenizesKeys)
    assert not isinstance(kv, TokenizesKeys)  # a plain store keeps names as they are
    token = store.key_token("t:user:u:facts", "card")
    assert token.startswith("~")
    assert "card" not in token
    assert store.key_token("t:user:u:facts", "card") == token
    # Its own spaces stay closed, and are neither listed nor counted as the callers'.
    for own in (KEYRING, "_system:opaque-names"):
        with pytest.raises(InvalidInputError, match="encryption keys"):
            store.key_token(own, "master")
        with pytest.raises(InvalidInputError, match="encryption keys"):
            store.scan(own)
    assert kv.get_many("_system:opaque-names", ["facts"]) != [None]  # a new store is marked
    store.commit([Put("t:s", "k", b"v")])
    assert store.spaces() == ["t:s"]


def test_the_value_limit_shrinks_by_the_overhead(kv: KVStore) -> None:
    store = EncryptedKVStore(kv, key())
    limit = store.max_value_bytes
    store.commit([Put("t:s", "k", b"x" * limit)])
    assert store.get_many("t:s", ["k"]) == [b"x" * limit]
    with pytest.raises(ValueTooLargeError):
        store.commit([Put("t:s", "k", b"x" * (limit + 1))])


def test_open_kv_store_encrypts_with_a_key_and_refuses_without(tmp_path: Path) -> None:
    path = str(tmp_path / "kv.sqlite3")
    master = key()
    store = open_kv_store(path, max_value_bytes=1000, master_key=master)
    assert isinstance(store, EncryptedKVStore)
    assert store.max_value_bytes == 1000  # the backend got the overhead on top
    store.commit([Put("t:s", "k", SECRET)])
    store.close()
    with pytest.raises(EncryptionKeyError, match="encrypted at rest"):
        open_kv_store(path)
    with pytest.raises(EncryptionKeyError, match="wrong master key"):
        open_kv_store(path, master_key=key())
    again = open_kv_store(path, master_key=master)
    assert again.get_many("t:s", ["k"]) == [SECRET]
    again.close()


def test_master_keys_from_text_and_files(tmp_path: Path) -> None:
    master, text = MasterKey.generate()
    assert MasterKey.from_text(text).id == master.id
    assert MasterKey.from_text(text.replace("+", "-").replace("/", "_").rstrip("=")).id == master.id
    assert master.id not in text
    assert text not in repr(master)
    as_text = tmp_path / "key.txt"
    as_text.write_text(text + "\n")
    raw = tmp_path / "key.bin"
    raw.write_bytes(base64.b64decode(text))
    assert MasterKey.from_file(as_text).id == MasterKey.from_file(raw).id == master.id
    for bad in ("not base64!", base64.b64encode(b"short").decode()):
        with pytest.raises(InvalidInputError) as refused:
            MasterKey.from_text(bad)
        assert refused.value.field == "master_key"
    with pytest.raises(InvalidInputError, match="cannot read"):
        MasterKey.from_file(tmp_path / "missing")


def test_settings_take_one_master_key(tmp_path: Path) -> None:
    master, text = MasterKey.generate()
    assert Settings(master_key=text).encryption_key().id == master.id  # type: ignore[union-attr]
    (tmp_path / "k").write_text(text)
    assert Settings(master_key_file=tmp_path / "k").encryption_key().id == master.id  # type: ignore[union-attr]
    assert Settings().encryption_key() is None
    with pytest.raises(ValueError, match="both set"):
        Settings(master_key=text, master_key_file=tmp_path / "k")
    with pytest.raises(ValueError, match="master_key"):
        Settings(master_key="nope")
    assert text not in repr(Settings(master_key=text))
