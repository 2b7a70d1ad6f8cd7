"""Encryption at rest: a :class:`KVStore` that encrypts every value before an inner store keeps it.

**Keys.** Each tenant has its own data key (256 random bits), made on its first
write; values of spaces outside every tenant (no ``:`` in the space, or the
``_system`` spaces of API keys) use the deployment's own. Data keys are stored
in the inner store (:func:`tiers.keys.keyring_space`) wrapped by the master
key with AES-GCM, each bound to its tenant and key id, and are cached once
unwrapped. The master key never touches the store: only its id, an HMAC of it,
so a wrong key is told apart from a right one at open (:class:`EncryptionKeyError`
naming both ids) without trying to decrypt anything. Rotating the master key
(:func:`rotate_master_key`) re-wraps the data keys and rewrites nothing else.

**Values.** A stored value is ``header || nonce || AES-GCM(ciphertext || tag)``
with the header ``F5 'T' 'M' version || data key id`` (8 bytes; ``0xF5`` never
occurs in UTF-8, so no JSON or text value begins like one) and the associated
data ``header || len(space) || space || key``: a value moved to another key,
space or tenant, or changed by one bit, fails authentication, and a read
raises :class:`UndecryptableValueError` instead of returning garbage.

**Why deterministic.** Commit checks compare exact stored bytes, and callers pass
the plaintext they read. The nonce is therefore synthetic (SIV-style):
``HMAC-SHA256(mac key, associated data || plaintext)[:12]``, so one plaintext at
one location always encrypts to the same bytes and ``Check(expected=plaintext)``
becomes ``Check(expected=its ciphertext)`` without a read. Two different
plaintexts get different nonces unless HMAC collides on 96 bits (the birthday
bound of random nonces: fine for 2^32 values per data key, and there is one
data key per tenant). What it leaks: whether the value of one key equals a
value that key held before (the same plaintext at another key encrypts
differently). Spaces and keys (ids: tenants, users, sessions, fact keys, step
names) are not encrypted; the lengths of values are visible.

**Plaintext.** A store that holds values written without encryption is refused
at open (when the backend can list its spaces) until :func:`encrypt_existing`
(``tiermem encrypt``) has encrypted them in place; a plaintext value found later
fails its read. A store that is encrypted is refused when opened without a
master key (:func:`refuse_if_encrypted`).
"""

from __future__ import annotations

import base64
import binascii
import hmac
import os
import secrets
import struct
import threading
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Literal

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import BaseModel, ConfigDict, ValidationError

from tiers import keys
from tiers.backends.base import Check, KVStore, ListsSpaces, Put, Scrubbable, Write
from tiers.backends.common import check_checks, check_writes
from tiers.errors import (
    BackendUnavailableError,
    ConflictError,
    EncryptionKeyError,
    InvalidInputError,
    UndecryptableValueError,
)

__all__ = [
    "MIN_INNER_VALUE_BYTES",
    "OVERHEAD",
    "EncryptReport",
    "EncryptedKVStore",
    "MasterKey",
    "encrypt_existing",
    "refuse_if_encrypted",
    "rotate_master_key",
]

_MAGIC = b"\xf5TM"
_VERSION = 1
_PREFIX = _MAGIC + bytes([_VERSION])
_KEY_ID_BYTES = 4
_HEADER_BYTES = len(_PREFIX) + _KEY_ID_BYTES
_NONCE_BYTES = 12
_TAG_BYTES = 16
OVERHEAD = _HEADER_BYTES + _NONCE_BYTES + _TAG_BYTES
"""Bytes an encrypted value takes beyond its plaintext."""
MIN_INNER_VALUE_BYTES = 512
"""The least ``max_value_bytes`` of an inner store: room for a keyring record (~200 bytes)."""

_KEYRING = keys.keyring_space()
_MASTER = "master"
_DEK_PREFIX = "dek:"
_GLOBAL = ""  # the data key of spaces outside every tenant


def _tenant_of(space: str) -> str:
    head, sep, _ = space.partition(":")
    return head if sep else _GLOBAL


def _tenant_label(tenant: str) -> str:
    return repr(tenant) if tenant else "the deployment (spaces outside every tenant)"


class MasterKey:
    """A 256-bit master key; its ``id`` (an HMAC of the key) names it without revealing it.

    Raises:
        InvalidInputError: The key is not 32 bytes (``field`` says ``master_key``).
    """

    __slots__ = ("_aead", "id")

    def __init__(self, key: bytes) -> None:
        if not isinstance(key, bytes) or len(key) != 32:
            raise InvalidInputError(
                "a master key is 32 random bytes (256 bits), given as base64: make one with "
                "`tiermem new-master-key`",
                field="master_key",
            )
        self._aead = AESGCM(key)
        self.id = hmac.digest(key, b"tiermem master key id v1", "sha256")[:8].hex()

    @classmethod
    def generate(cls) -> tuple[MasterKey, str]:
        """A new random key and its base64 text (what ``TIERMEM_MASTER_KEY`` or a key file holds)."""
        raw = secrets.token_bytes(32)
        return cls(raw), base64.b64encode(raw).decode()

    @classmethod
    def from_text(cls, text: str, *, field: str = "master_key") -> MasterKey:
        """A key from its base64 text (standard or URL-safe alphabet; whitespace ignored).

        Raises:
            InvalidInputError: Not base64 of exactly 32 bytes; ``field`` is named.
        """
        cleaned = "".join(text.split())
        try:
            raw = base64.b64decode(
                cleaned.replace("-", "+").replace("_", "/") + "=" * (-len(cleaned) % 4),
                validate=True,
            )
        except (binascii.Error, ValueError) as exc:
            raise InvalidInputError(
                f"{field} is not base64 text (make a key with `tiermem new-master-key`)",
                field=field,
            ) from exc
        if len(raw) != 32:
            raise InvalidInputError(
                f"{field} decodes to {len(raw)} bytes; a master key is 32 bytes "
                "(make one with `tiermem new-master-key`)",
                field=field,
            )
        return cls(raw)

    @classmethod
    def from_file(
        cls, path: str | os.PathLike[str], *, field: str = "master_key_file"
    ) -> MasterKey:
        """A key from a file holding its base64 text (or exactly 32 raw bytes).

        Raises:
            InvalidInputError: The file cannot be read or holds no key; ``field`` is named.
        """
        try:
            data = Path(path).read_bytes()
        except OSError as exc:
            raise InvalidInputError(
                f"cannot read the master key file {os.fspath(path)}: {exc.strerror}", field=field
            ) from exc
        if len(data) == 32:  # raw bytes (base64 text of a key is 44 characters)
            return cls(data)
        try:
            text = data.decode("ascii")
        except UnicodeDecodeError as exc:
            raise InvalidInputError(
                f"the master key file {os.fspath(path)} holds neither base64 text nor 32 raw bytes",
                field=field,
            ) from exc
        return cls.from_text(text, field=field)

    def __repr__(self) -> str:
        return f"MasterKey(id={self.id!r})"

    def wrap(self, tenant: str, key_id: bytes, dek: bytes) -> bytes:
        nonce = secrets.token_bytes(_NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, dek, _wrap_aad(tenant, key_id))

    def unwrap(self, tenant: str, key_id: bytes, wrapped: bytes) -> bytes:
        """Raises InvalidTag when the key is not this one's, or the record was changed."""
        return self._aead.decrypt(
            wrapped[:_NONCE_BYTES], wrapped[_NONCE_BYTES:], _wrap_aad(tenant, key_id)
        )


def _wrap_aad(tenant: str, key_id: bytes) -> bytes:
    return b"tiermem data key v1\x00" + key_id + tenant.encode()


class _Record(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1


class _MasterRecord(_Record):
    """Which master key wraps this store's data keys (its id, never the key)."""

    master_key_id: str


class _DataKeyRecord(_Record):
    """One tenant's data key, wrapped: ``nonce || AES-GCM(key || tag)``, base64."""

    key_id: str
    master_key_id: str
    wrapped: str


def _decode_keyring(model: type[_Record], data: bytes, where: str) -> _Record:
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        raise EncryptionKeyError(
            f"the encryption keyring record {where} is corrupt ({exc.errors()[0]['msg']}); "
            "restore it from a backup: without it the store's data cannot be read"
        ) from exc


def _read_master(kv: KVStore) -> _MasterRecord | None:
    (data,) = kv.get_many(_KEYRING, [_MASTER])
    if data is None:
        return None
    record = _decode_keyring(_MasterRecord, data, _MASTER)
    assert isinstance(record, _MasterRecord)
    return record


def _wrong_key(stored: str, given: MasterKey) -> EncryptionKeyError:
    return EncryptionKeyError(
        f"wrong master key: this store's data keys are wrapped by master key {stored}, and the "
        f"configured key is {given.id}. Set TIERMEM_MASTER_KEY or TIERMEM_MASTER_KEY_FILE to "
        "the key the store was encrypted with (or rotated to last: `tiermem rotate-master-key`)"
    )


class _DataKey:
    """One tenant's unwrapped data key, split into an AES-GCM key and a nonce (MAC) key."""

    __slots__ = ("aead", "id", "mac")

    def __init__(self, key_id: bytes, dek: bytes) -> None:
        self.id = key_id
        self.aead = AESGCM(hmac.digest(dek, b"tiermem value encryption v1", "sha256"))
        self.mac = hmac.digest(dek, b"tiermem synthetic nonce v1", "sha256")


def _location(header: bytes, space: str, key: str) -> bytes:
    encoded = space.encode()
    return header + struct.pack(">I", len(encoded)) + encoded + key.encode()


class EncryptedKVStore:
    """A :class:`KVStore` whose values are encrypted with per-tenant data keys (module docstring).

    Space and key names, order, checks and atomicity are the inner store's;
    values are encrypted on the way in and authenticated and decrypted on the
    way out. ``max_value_bytes`` is the inner store's less :data:`OVERHEAD`.

    Args:
        inner: The store that keeps the ciphertext.
        master_key: The key that wraps the data keys.
        max_value_bytes: Largest plaintext accepted; default and most: the inner
            store's limit less :data:`OVERHEAD`.
        adopt_plaintext: Open a store that holds unencrypted values (for
            :func:`encrypt_existing` only: reads of those values fail).

    Raises:
        EncryptionKeyError: ``master_key`` is not the store's (both ids named),
            a data key does not unwrap with it, or the store holds data written
            without encryption and ``adopt_plaintext`` is false.
        InvalidInputError: The inner store's ``max_value_bytes`` is under
            :data:`MIN_INNER_VALUE_BYTES` (no room for the keyring's records), or
            ``max_value_bytes`` is more than it leaves.
        BackendUnavailableError: The inner store failed.
    """

    def __init__(
        self,
        inner: KVStore,
        master_key: MasterKey,
        *,
        max_value_bytes: int | None = None,
        adopt_plaintext: bool = False,
    ) -> None:
        room = inner.max_value_bytes - OVERHEAD
        if inner.max_value_bytes < MIN_INNER_VALUE_BYTES:
            raise InvalidInputError(
                f"an encrypted store needs an inner store taking values of "
                f"{MIN_INNER_VALUE_BYTES} bytes (for its keyring); this one takes "
                f"{inner.max_value_bytes}",
                field="max_value_bytes",
            )
        if max_value_bytes is not None and not 0 < max_value_bytes <= room:
            raise InvalidInputError(
                f"max_value_bytes must be in 1..{room} (the inner store's limit less "
                f"{OVERHEAD} bytes of encryption)",
                field="max_value_bytes",
            )
        self.inner = inner
        self.master_key = master_key
        self.max_value_bytes = room if max_value_bytes is None else max_value_bytes
        self._keys: dict[str, _DataKey] = {}
        self._lock = threading.Lock()
        self._master_bytes = self._open_keyring(adopt_plaintext)

    # -- keyring -------------------------------------------------------------------------------

    def _open_keyring(self, adopt_plaintext: bool) -> bytes:
        while True:
            (data,) = self.inner.get_many(_KEYRING, [_MASTER])
            if data is not None:
                record = _decode_keyring(_MasterRecord, data, _MASTER)
                assert isinstance(record, _MasterRecord)
                if record.master_key_id != self.master_key.id:
                    raise _wrong_key(record.master_key_id, self.master_key)
                for name, value in self.inner.scan(_KEYRING, prefix=_DEK_PREFIX):
                    tenant = name[len(_DEK_PREFIX) :]
                    self._keys[tenant] = self._unwrap(tenant, value)
                return data
            if not adopt_plaintext and isinstance(self.inner, ListsSpaces):
                held = [s for s in self.inner.spaces(limit=2) if s != _KEYRING]
                if held:
                    raise EncryptionKeyError(
                        "this store holds data written without encryption (space "
                        f"{held[0]!r}): encrypt it in place first with `tiermem encrypt` (every "
                        "service using the store stopped), or open it without a master key"
                    )
            data = _MasterRecord(master_key_id=self.master_key.id).model_dump_json().encode()
            try:
                self.inner.commit([Put(_KEYRING, _MASTER, data)], [Check(_KEYRING, _MASTER, None)])
            except ConflictError:
                continue  # another process made it first: read theirs
            return data

    def _unwrap(self, tenant: str, data: bytes) -> _DataKey:
        record = _decode_keyring(_DataKeyRecord, data, _DEK_PREFIX + tenant)
        assert isinstance(record, _DataKeyRecord)
        if record.master_key_id != self.master_key.id:
            raise EncryptionKeyError(
                f"the data key of {_tenant_label(tenant)} is wrapped by master key "
                f"{record.master_key_id}, not by the configured {self.master_key.id}: the master "
                "key was rotated meanwhile; restart with the new key"
            )
        key_id = bytes.fromhex(record.key_id)
        try:
            dek = self.master_key.unwrap(tenant, key_id, base64.b64decode(record.wrapped))
        except (InvalidTag, ValueError, binascii.Error) as exc:
            raise EncryptionKeyError(
                f"the data key of {_tenant_label(tenant)} does not unwrap with master key "
                f"{self.master_key.id} although the keyring names that key: the keyring record "
                "was changed or damaged; restore it from a backup"
            ) from exc
        return _DataKey(key_id, dek)

    def _known_key(self, tenant: str) -> _DataKey | None:
        """The tenant's data key if it has one (read from the keyring when not cached)."""
        key = self._keys.get(tenant)
        if key is not None:
            return key
        (data,) = self.inner.get_many(_KEYRING, [_DEK_PREFIX + tenant])
        if data is None:
            return None
        key = self._unwrap(tenant, data)
        with self._lock:
            return self._keys.setdefault(tenant, key)

    def _key_for_write(self, tenant: str) -> _DataKey:
        """The tenant's data key, made and stored (wrapped) on its first write."""
        while True:
            key = self._known_key(tenant)
            if key is not None:
                return key
            key_id = secrets.token_bytes(_KEY_ID_BYTES)
            dek = secrets.token_bytes(32)
            record = _DataKeyRecord(
                key_id=key_id.hex(),
                master_key_id=self.master_key.id,
                wrapped=base64.b64encode(self.master_key.wrap(tenant, key_id, dek)).decode(),
            )
            name = _DEK_PREFIX + tenant
            try:
                # The master record fences a rotation: a key wrapped by a replaced master key
                # is never added after the rotation has re-wrapped the others.
                self.inner.commit(
                    [Put(_KEYRING, name, record.model_dump_json().encode())],
                    [Check(_KEYRING, name, None), Check(_KEYRING, _MASTER, self._master_bytes)],
                )
            except ConflictError:
                master = _read_master(self.inner)
                if master is None or master.master_key_id != self.master_key.id:
                    raise EncryptionKeyError(
                        "the master key was rotated while this store was open (the keyring "
                        f"now names {master.master_key_id if master else 'none'}): restart "
                        "with the new key"
                    ) from None
                continue  # another process made the tenant's key first: use theirs
            with self._lock:
                return self._keys.setdefault(tenant, _DataKey(key_id, dek))

    # -- values --------------------------------------------------------------------------------

    def _seal(self, key: _DataKey, space: str, name: str, plaintext: bytes) -> bytes:
        header = _PREFIX + key.id
        aad = _location(header, space, name)
        nonce = hmac.digest(key.mac, aad + plaintext, "sha256")[:_NONCE_BYTES]
        return header + nonce + key.aead.encrypt(nonce, plaintext, aad)

    def _open(self, space: str, name: str, stored: bytes) -> bytes:
        where = f"{space!r}/{name!r}"
        if not stored.startswith(_MAGIC):
            raise UndecryptableValueError(
                f"the value at {where} is not encrypted: the store holds data written without "
                "encryption; encrypt it in place with `tiermem encrypt`"
            )
        if len(stored) < OVERHEAD:
            raise UndecryptableValueError(
                f"the value at {where} is truncated ({len(stored)} bytes)"
            )
        if stored[len(_MAGIC)] != _VERSION:
            raise UndecryptableValueError(
                f"the value at {where} is in encryption format {stored[len(_MAGIC)]}, which this "
                "tiermem does not know (written by a newer version?)"
            )
        tenant = _tenant_of(space)
        key = self._known_key(tenant)
        key_id = stored[len(_PREFIX) : _HEADER_BYTES]
        if key is None or key.id != key_id:
            raise UndecryptableValueError(
                f"the value at {where} was encrypted with data key {key_id.hex()}, which is not "
                f"the data key of {_tenant_label(tenant)}: copied from another tenant or store?"
            )
        body = stored[_HEADER_BYTES:]
        try:
            return key.aead.decrypt(
                body[:_NONCE_BYTES],
                body[_NONCE_BYTES:],
                _location(stored[:_HEADER_BYTES], space, name),
            )
        except (InvalidTag, ValueError) as exc:
            raise UndecryptableValueError(
                f"the value at {where} fails authentication: it was changed on disk or moved "
                "from another key"
            ) from exc

    def _authentic(self, space: str, name: str, stored: bytes) -> bool:
        try:
            self._open(space, name, stored)
        except UndecryptableValueError:
            return False
        return True

    @staticmethod
    def _refuse_keyring(space: object) -> None:
        if space == _KEYRING:
            raise InvalidInputError(
                f"space {_KEYRING!r} holds the encryption keys and is not open to callers",
                field="space",
            )

    # -- KVStore -------------------------------------------------------------------------------

    def get_many(self, space: str, keys: Sequence[str]) -> list[bytes | None]:
        """See :meth:`KVStore.get_many`; raises :class:`UndecryptableValueError` for a value
        that is not this store's ciphertext of that key."""
        self._refuse_keyring(space)
        stored = self.inner.get_many(space, keys)
        return [
            None if value is None else self._open(space, name, value)
            for name, value in zip(keys, stored, strict=True)
        ]

    def scan(
        self,
        space: str,
        *,
        prefix: str = "",
        start_after: str | None = None,
        limit: int | None = None,
        reverse: bool = False,
    ) -> list[tuple[str, bytes]]:
        """See :meth:`KVStore.scan` (values decrypted as by :meth:`get_many`)."""
        self._refuse_keyring(space)
        pairs = self.inner.scan(
            space, prefix=prefix, start_after=start_after, limit=limit, reverse=reverse
        )
        return [(name, self._open(space, name, value)) for name, value in pairs]

    def commit(self, writes: Sequence[Write], checks: Sequence[Check] = ()) -> None:
        """See :meth:`KVStore.commit`: puts are encrypted, and a check of a plaintext compares
        the ciphertext that plaintext has at that key (deterministic, so no read is needed)."""
        check_writes(writes, self.max_value_bytes)
        check_checks(checks)
        for item in (*writes, *checks):
            self._refuse_keyring(item.space)
        sealed_writes: list[Write] = []
        for write in writes:
            if isinstance(write, Put):
                key = self._key_for_write(_tenant_of(write.space))
                write = Put(
                    write.space, write.key, self._seal(key, write.space, write.key, write.value)
                )
            sealed_writes.append(write)
        sealed_checks: list[Check] = []
        for check in checks:
            if check.expected is not None:
                key = self._key_for_write(_tenant_of(check.space))
                check = Check(
                    check.space, check.key, self._seal(key, check.space, check.key, check.expected)
                )
            sealed_checks.append(check)
        self.inner.commit(sealed_writes, sealed_checks)

    def ping(self) -> None:
        """See :meth:`KVStore.ping`."""
        self.inner.ping()

    def close(self) -> None:
        """See :meth:`KVStore.close`: closes the inner store."""
        self.inner.close()

    # -- what the inner store can do besides ------------------------------------------------------

    def flush(self) -> None:
        """See :class:`~tiers.backends.base.Flushable` (nothing to do if every commit is durable)."""
        flush = getattr(self.inner, "flush", None)
        if flush is not None:
            flush()

    def scrub(self) -> bool:
        """See :class:`~tiers.backends.base.Scrubbable` (False when the inner store cannot)."""
        scrub = getattr(self.inner, "scrub", None)
        return bool(scrub()) if scrub is not None else False

    def volatility(self) -> str | None:
        """The inner store's (see ``tiers.backends.ReportsDurability``)."""
        volatility = getattr(self.inner, "volatility", None)
        return volatility() if volatility is not None else None

    def spaces(self, *, limit: int | None = None) -> list[str]:
        """The inner store's spaces, the keyring left out (see ``ListsSpaces``)."""
        if not isinstance(self.inner, ListsSpaces):
            raise InvalidInputError("this store cannot list its spaces", field="kv")
        listed = self.inner.spaces(limit=None if limit is None else limit + 1)
        return [s for s in listed if s != _KEYRING][: limit if limit is not None else None]


def refuse_if_encrypted(kv: KVStore) -> None:
    """Refuse to use an encrypted store without its master key (its values would be ciphertext).

    Raises:
        EncryptionKeyError: The store has an encryption keyring.
        BackendUnavailableError: The store failed.
    """
    master = _read_master(kv)
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
        (master_bytes,) = inner.get_many(_KEYRING, [_MASTER])
        if master_bytes is None:
            raise EncryptionKeyError(
                "this store is not encrypted: there is no master key to rotate"
            )
        master = _decode_keyring(_MasterRecord, master_bytes, _MASTER)
        assert isinstance(master, _MasterRecord)
        if master.master_key_id not in (old.id, new.id):
            raise _wrong_key(master.master_key_id, old)
        writes: list[Write] = []
        checks: list[Check] = [Check(_KEYRING, _MASTER, master_bytes)]
        for name, data in inner.scan(_KEYRING, prefix=_DEK_PREFIX):
            record = _decode_keyring(_DataKeyRecord, data, name)
            assert isinstance(record, _DataKeyRecord)
            if record.master_key_id == new.id:
                continue
            if record.master_key_id != old.id:
                raise _wrong_key(record.master_key_id, old)
            tenant = name[len(_DEK_PREFIX) :]
            key_id = bytes.fromhex(record.key_id)
            try:
                dek = old.unwrap(tenant, key_id, base64.b64decode(record.wrapped))
            except (InvalidTag, ValueError) as exc:
                raise EncryptionKeyError(
                    f"the data key of {_tenant_label(tenant)} does not unwrap with master key "
                    f"{old.id}: the keyring record was changed or damaged"
                ) from exc
            rewrapped = _DataKeyRecord(
                key_id=record.key_id,
                master_key_id=new.id,
                wrapped=base64.b64encode(new.wrap(tenant, key_id, dek)).decode(),
            )
            writes.append(Put(_KEYRING, name, rewrapped.model_dump_json().encode()))
            checks.append(Check(_KEYRING, name, data))
        if master.master_key_id != new.id:
            record_bytes = _MasterRecord(master_key_id=new.id).model_dump_json().encode()
            writes.append(Put(_KEYRING, _MASTER, record_bytes))
        if not writes:
            return done
        try:
            inner.commit(writes, checks)
        except ConflictError:
            continue  # a data key was made meanwhile: read again
        done += sum(1 for w in writes if isinstance(w, Put) and w.key != _MASTER)


@dataclass(frozen=True, slots=True)
class EncryptReport:
    """What :func:`encrypt_existing` did.

    Attributes:
        spaces: Spaces walked.
        encrypted: Values encrypted now.
        already: Values found encrypted already.
        scrubbed: Whether the store dropped the replaced plaintext from its files
            (SQLite: WAL truncated, the rows' old bytes zeroed; Redis: AOF rewrite started).
    """

    spaces: int
    encrypted: int
    already: int
    scrubbed: bool


def encrypt_existing(inner: KVStore, master_key: MasterKey, *, page: int = 500) -> EncryptReport:
    """Encrypt in place every value of a store written without encryption (``tiermem encrypt``).

    Resumable: values that are already this store's ciphertext are left as they
    are, so an interrupted run is simply run again. Each page of a space is one
    commit checked against what was read. Run it with every service using the
    store stopped: one still writing without encryption would add plaintext.

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
    encrypted = already = spaces = 0
    for space in inner.spaces():
        if space == _KEYRING:
            continue
        spaces += 1
        after: str | None = None
        while True:
            pairs = inner.scan(space, start_after=after, limit=page)
            if not pairs:
                break
            writes: list[Write] = []
            checks: list[Check] = []
            for name, value in pairs:
                if store._authentic(space, name, value):
                    already += 1
                    continue
                key = store._key_for_write(_tenant_of(space))
                writes.append(Put(space, name, store._seal(key, space, name, value)))
                checks.append(Check(space, name, value))
            if writes:
                try:
                    inner.commit(writes, checks)
                except ConflictError:
                    continue  # written meanwhile: read the page again
                encrypted += len(writes)
            after = pairs[-1][0]
    scrubbed = False
    if isinstance(inner, Scrubbable):
        try:
            scrubbed = inner.scrub()
        except BackendUnavailableError:
            scrubbed = False
    return EncryptReport(spaces=spaces, encrypted=encrypted, already=already, scrubbed=scrubbed)
