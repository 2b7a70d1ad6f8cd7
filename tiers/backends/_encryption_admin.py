"""Maintenance of an encrypted store: refusing it without its key, rotating the master key,
encrypting a plaintext store in place (see :mod:`tiers.backends.encrypted_kv`)."""

from __future__ import annotations

import base64
from dataclasses import dataclass

from cryptography.exceptions import InvalidTag

from tiers import keys
from tiers.backends._encrypted_store import OPAQUE_MARK, EncryptedKVStore
from tiers.backends._keyring import (
    DEK_PREFIX,
    INTERNAL_SPACES,
    KEYRING,
    MASTER,
    DataKeyRecord,
    MasterKey,
    MasterRecord,
    decode_keyring,
    mark_fact_names_opaque,
    read_master,
    tenant_label,
    tenant_of,
    wrong_key,
)
from tiers.backends.base import Check, Delete, KVStore, ListsSpaces, Put, Scrubbable, Write
from tiers.errors import (
    BackendUnavailableError,
    ConflictError,
    EncryptionKeyError,
    InvalidInputError,
)


def refuse_if_encrypted(kv: KVStore) -> None:
    """Refuse to use an encrypted store without its master key (its values would be ciphertext).

    Raises:
        EncryptionKeyError: The store has an encryption keyring.
        BackendUnavailableError: The store failed.
    """
    master = read_master(kv)
    if master is not None:
        raise EncryptionKeyError(
            "this store is encrypted at rest (master key "
            f"{master.master_key_id}): set TIERMEM_MASTER_KEY or TIERMEM_MASTER_KEY_FILE to "
            "its master key"
        )


def rotate_master_key(inner: KVStore, old: MasterKey, new: MasterKey) -> int:
    """Re-wrap every data key of the store under ``new``; values are not rewritten.

    Atomic: one commit re-wraps every data key and names ``new`` in the keyring,
    checked against what was read, so a store is never half rotated. A data key
    made meanwhile by a process still on ``old`` is re-wrapped after it; such a
    process cannot make another one (its keyring check fails) and must restart
    with ``new``. Running it again with the same keys does nothing.

    Args:
        inner: The store as the backend holds it (not an :class:`EncryptedKVStore`).
        old: The master key the store's data keys are wrapped by now.
        new: The master key to wrap them by.

    Returns:
        How many data keys were re-wrapped.

    Raises:
        EncryptionKeyError: The store is not encrypted, or ``old`` is not its master key.
    """
    if isinstance(inner, EncryptedKVStore):
        inner = inner.inner
    done = 0
    while True:
        (master_bytes,) = inner.get_many(KEYRING, [MASTER])
        if master_bytes is None:
            raise EncryptionKeyError(
                "this store is not encrypted: there is no master key to rotate"
            )
        master = decode_keyring(MasterRecord, master_bytes, MASTER)
        assert isinstance(master, MasterRecord)
        if master.master_key_id not in (old.id, new.id):
            raise wrong_key(master.master_key_id, old)
        writes: list[Write] = []
        checks: list[Check] = [Check(KEYRING, MASTER, master_bytes)]
        for name, data in inner.scan(KEYRING, prefix=DEK_PREFIX):
            record = decode_keyring(DataKeyRecord, data, name)
            assert isinstance(record, DataKeyRecord)
            if record.master_key_id == new.id:
                continue
            if record.master_key_id != old.id:
                raise wrong_key(record.master_key_id, old)
            tenant = name[len(DEK_PREFIX) :]
            key_id = bytes.fromhex(record.key_id)
            try:
                dek = old.unwrap(tenant, key_id, base64.b64decode(record.wrapped))
            except (InvalidTag, ValueError) as exc:
                raise EncryptionKeyError(
                    f"the data key of {tenant_label(tenant)} does not unwrap with master key "
                    f"{old.id}: the keyring record was changed or damaged"
                ) from exc
            rewrapped = DataKeyRecord(
                key_id=record.key_id,
                master_key_id=new.id,
                wrapped=base64.b64encode(new.wrap(tenant, key_id, dek)).decode(),
            )
            writes.append(Put(KEYRING, name, rewrapped.model_dump_json().encode()))
            checks.append(Check(KEYRING, name, data))
        if master.master_key_id != new.id:
            record_bytes = MasterRecord(master_key_id=new.id).model_dump_json().encode()
            writes.append(Put(KEYRING, MASTER, record_bytes))
        if not writes:
            return done
        try:
            inner.commit(writes, checks)
        except ConflictError:
            continue  # a data key was made meanwhile: read again
        done += sum(1 for w in writes if isinstance(w, Put) and w.key != MASTER)


@dataclass(frozen=True, slots=True)
class EncryptReport:
    """What :func:`encrypt_existing` did.

    Attributes:
        spaces: Spaces walked.
        encrypted: Values encrypted now.
        already: Values found encrypted already (under their final names).
        renamed: Fact keys (current or past versions) renamed to their opaque
            tokens now: on a plaintext store, and on one encrypted by an earlier
            tiermem that left them readable.
        scrubbed: Whether the store dropped the replaced plaintext from its files
            (SQLite: WAL truncated, the rows' old bytes zeroed; Redis: AOF rewrite started).
    """

    spaces: int
    encrypted: int
    already: int
    renamed: int
    scrubbed: bool


def encrypt_existing(inner: KVStore, master_key: MasterKey, *, page: int = 500) -> EncryptReport:
    """Encrypt in place every value of a store written without encryption (``tiermem encrypt``),
    and rename every fact key to its opaque token (:meth:`EncryptedKVStore.key_token`).

    Also upgrades a store encrypted by an earlier tiermem, which encrypted the
    values but left fact keys readable in key names: it renames them, and then
    marks the store so that it opens again. Resumable: values that are already
    this store's ciphertext under their final names are left as they are, so an
    interrupted run is simply run again. Each page of a space is one commit
    checked against what was read. Run it with every service using the store
    stopped: one still writing without encryption (or by an earlier tiermem)
    would add plaintext.

    Args:
        inner: The store as the backend holds it; it must list its spaces.
        master_key: The key to encrypt with (the store's, if it has a keyring).
        page: Values per commit.

    Raises:
        EncryptionKeyError: The store is encrypted with another master key.
        InvalidInputError: The backend cannot list its spaces.
        ValueTooLargeError: A value is too large to grow by :data:`OVERHEAD`
            (open the store with a larger ``max_value_bytes``).
    """
    if not isinstance(inner, ListsSpaces):
        raise InvalidInputError("this store cannot list its spaces to encrypt them", field="kv")
    store = EncryptedKVStore(inner, master_key, adopt_plaintext=True)
    encrypted = already = renamed = spaces = 0
    for space in inner.spaces():
        if space in INTERNAL_SPACES:
            continue
        spaces += 1
        names_space = keys.fact_names_space(space)
        # Renamed keys sort after the readable ones ("~"): the walk meets them again.
        moved: set[str] = set()
        after: str | None = None
        while True:
            pairs = inner.scan(space, start_after=after, limit=page)
            if not pairs:
                break
            writes: list[Write] = []
            checks: list[Check] = []
            page_encrypted = 0
            page_moved: set[str] = set()
            for name, value in pairs:
                if name in moved:
                    continue
                plain = not store._authentic(space, name, value)
                to = name if names_space is None else _opaque_name(store, names_space, name)
                if not plain and to == name:
                    already += 1
                    continue
                plaintext = value if plain else store._open(space, name, value)
                key = store._key_for_write(tenant_of(space))
                writes.append(Put(space, to, store._seal(key, space, to, plaintext)))
                checks.append(Check(space, name, value))
                if plain:
                    page_encrypted += 1
                if to != name:
                    writes.append(Delete(space, name))
                    page_moved.add(to)
            if writes:
                try:
                    inner.commit(writes, checks)
                except ConflictError:
                    continue  # written meanwhile: read the page again
                encrypted += page_encrypted
                renamed += len(page_moved)
                moved |= page_moved
            after = pairs[-1][0]
    mark_fact_names_opaque(inner)
    scrubbed = False
    if isinstance(inner, Scrubbable):
        try:
            scrubbed = inner.scrub()
        except BackendUnavailableError:
            scrubbed = False
    return EncryptReport(
        spaces=spaces, encrypted=encrypted, already=already, renamed=renamed, scrubbed=scrubbed
    )


def _opaque_name(store: EncryptedKVStore, names_space: str, name: str) -> str:
    """The name a fact's record (current, or a past version: ``<fact name>/...``) has once its
    fact key is replaced by its token in ``names_space`` (itself if it is a token already)."""
    fact_name, rest = keys.fact_name_of_history_key(name)
    if fact_name.startswith(OPAQUE_MARK):
        return name
    return store.key_token(names_space, fact_name) + rest
