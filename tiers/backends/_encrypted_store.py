"""The :class:`EncryptedKVStore` (see :mod:`tiers.backends.encrypted_kv`)."""

from __future__ import annotations

import base64
import binascii
import hmac
import secrets
import struct
import threading
from collections.abc import Sequence

from cryptography.exceptions import InvalidTag
from cryptography.hazmat.primitives.ciphers.aead import AESGCM

from tiers import keys
from tiers.backends._keyring import (
    DEK_PREFIX,
    INTERNAL_SPACES,
    KEYRING,
    MASTER,
    NONCE_BYTES,
    DataKeyRecord,
    MasterKey,
    MasterRecord,
    decode_keyring,
    fact_names_opaque,
    mark_fact_names_opaque,
    read_master,
    tenant_label,
    tenant_of,
    wrong_key,
)
from tiers.backends.base import Check, KVStore, ListsSpaces, Put, Write
from tiers.backends.common import check_checks, check_writes
from tiers.errors import (
    ConflictError,
    EncryptionKeyError,
    InvalidInputError,
    UndecryptableValueError,
)

_MAGIC = b"\xf5TM"
_VERSION = 1
_PREFIX = _MAGIC + bytes([_VERSION])
_KEY_ID_BYTES = 4
_HEADER_BYTES = len(_PREFIX) + _KEY_ID_BYTES
_TAG_BYTES = 16
OVERHEAD = _HEADER_BYTES + NONCE_BYTES + _TAG_BYTES
"""Bytes an encrypted value takes beyond its plaintext."""
MIN_INNER_VALUE_BYTES = 512
"""The least ``max_value_bytes`` of an inner store: room for a keyring record (~200 bytes)."""
OPAQUE_MARK = "~"
"""What every key token starts with (see :meth:`EncryptedKVStore.key_token`)."""
_TOKEN_BYTES = 16


class _DataKey:
    """One tenant's unwrapped data key, split into an AES-GCM key, a nonce (MAC) key and a
    key-token (MAC) key."""

    __slots__ = ("aead", "id", "mac", "names")

    def __init__(self, key_id: bytes, dek: bytes) -> None:
        self.id = key_id
        self.aead = AESGCM(hmac.digest(dek, b"tiermem value encryption v1", "sha256"))
        self.mac = hmac.digest(dek, b"tiermem synthetic nonce v1", "sha256")
        self.names = hmac.digest(dek, b"tiermem key token v1", "sha256")


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
        adopt_plaintext: Open a store that holds unencrypted values or readable
            fact keys (for :func:`encrypt_existing` only: reads of those values fail).

    Raises:
        EncryptionKeyError: ``master_key`` is not the store's (both ids named),
            a data key does not unwrap with it, or (unless ``adopt_plaintext``)
            the store holds data written without encryption, or was encrypted
            by an earlier tiermem and holds readable fact keys.
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
            (data,) = self.inner.get_many(KEYRING, [MASTER])
            if data is not None:
                record = decode_keyring(MasterRecord, data, MASTER)
                assert isinstance(record, MasterRecord)
                if record.master_key_id != self.master_key.id:
                    raise wrong_key(record.master_key_id, self.master_key)
                for name, value in self.inner.scan(KEYRING, prefix=DEK_PREFIX):
                    tenant = name[len(DEK_PREFIX) :]
                    self._keys[tenant] = self._unwrap(tenant, value)
                if not adopt_plaintext:
                    self._require_opaque_fact_names()
                return data
            if not adopt_plaintext and isinstance(self.inner, ListsSpaces):
                held = [
                    s
                    for s in self.inner.spaces(limit=len(INTERNAL_SPACES) + 1)
                    if s not in INTERNAL_SPACES
                ]
                if held:
                    raise EncryptionKeyError(
                        "this store holds data written without encryption (space "
                        f"{held[0]!r}): encrypt it in place first with `tiermem encrypt` (every "
                        "service using the store stopped), or open it without a master key"
                    )
            data = MasterRecord(master_key_id=self.master_key.id).model_dump_json().encode()
            try:
                self.inner.commit([Put(KEYRING, MASTER, data)], [Check(KEYRING, MASTER, None)])
            except ConflictError:
                continue  # another process made it first: read theirs
            if not adopt_plaintext:
                # A new store: every fact name it will hold is a token. (A store being
                # encrypted in place is marked once its fact keys are renamed.)
                mark_fact_names_opaque(self.inner)
            return data

    def _require_opaque_fact_names(self) -> None:
        """Refuse a store encrypted by an earlier tiermem that holds readable fact keys.

        Read by tokens, such facts would seem gone. A store that holds none is
        marked as having opaque fact names, and this is not asked again.
        """
        if fact_names_opaque(self.inner):
            return
        if isinstance(self.inner, ListsSpaces):
            for space in self.inner.spaces():
                if keys.fact_names_space(space) is None:
                    continue
                # Tokens sort after every readable name ("~" after every id character).
                first = self.inner.scan(space, limit=1)
                if first and not first[0][0].startswith(OPAQUE_MARK):
                    raise EncryptionKeyError(
                        "this store was encrypted by an earlier tiermem, which left fact keys "
                        f"readable on disk (space {space!r}): stop every service using it and "
                        "run `tiermem encrypt` to make them opaque (it is resumable)"
                    )
        mark_fact_names_opaque(self.inner)

    def _unwrap(self, tenant: str, data: bytes) -> _DataKey:
        record = decode_keyring(DataKeyRecord, data, DEK_PREFIX + tenant)
        assert isinstance(record, DataKeyRecord)
        if record.master_key_id != self.master_key.id:
            raise EncryptionKeyError(
                f"the data key of {tenant_label(tenant)} is wrapped by master key "
                f"{record.master_key_id}, not by the configured {self.master_key.id}: the master "
                "key was rotated meanwhile; restart with the new key"
            )
        key_id = bytes.fromhex(record.key_id)
        try:
            dek = self.master_key.unwrap(tenant, key_id, base64.b64decode(record.wrapped))
        except (InvalidTag, ValueError, binascii.Error) as exc:
            raise EncryptionKeyError(
                f"the data key of {tenant_label(tenant)} does not unwrap with master key "
                f"{self.master_key.id} although the keyring names that key: the keyring record "
                "was changed or damaged; restore it from a backup"
            ) from exc
        return _DataKey(key_id, dek)

    def _known_key(self, tenant: str) -> _DataKey | None:
        """The tenant's data key if it has one (read from the keyring when not cached)."""
        key = self._keys.get(tenant)
        if key is not None:
            return key
        (data,) = self.inner.get_many(KEYRING, [DEK_PREFIX + tenant])
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
            record = DataKeyRecord(
                key_id=key_id.hex(),
                master_key_id=self.master_key.id,
                wrapped=base64.b64encode(self.master_key.wrap(tenant, key_id, dek)).decode(),
            )
            name = DEK_PREFIX + tenant
            try:
                # The master record fences a rotation: a key wrapped by a replaced master key
                # is never added after the rotation has re-wrapped the others.
                self.inner.commit(
                    [Put(KEYRING, name, record.model_dump_json().encode())],
                    [Check(KEYRING, name, None), Check(KEYRING, MASTER, self._master_bytes)],
                )
            except ConflictError:
                master = read_master(self.inner)
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
        nonce = hmac.digest(key.mac, aad + plaintext, "sha256")[:NONCE_BYTES]
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
        tenant = tenant_of(space)
        key = self._known_key(tenant)
        key_id = stored[len(_PREFIX) : _HEADER_BYTES]
        if key is None or key.id != key_id:
            raise UndecryptableValueError(
                f"the value at {where} was encrypted with data key {key_id.hex()}, which is not "
                f"the data key of {tenant_label(tenant)}: copied from another tenant or store?"
            )
        body = stored[_HEADER_BYTES:]
        try:
            return key.aead.decrypt(
                body[:NONCE_BYTES],
                body[NONCE_BYTES:],
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
        if space in INTERNAL_SPACES:
            raise InvalidInputError(
                f"space {space!r} holds the store's encryption keys or format and is not open "
                "to callers",
                field="space",
            )

    def key_token(self, space: str, key: str) -> str:
        """See :class:`~tiers.backends.base.TokenizesKeys`.

        ``~`` and 26 base32 characters: HMAC-SHA256 of the space and key under a
        key derived from the data key of the space's tenant, truncated to 128
        bits. A tenant without a data key gets one, as on its first write, so a
        token never changes; rotating the master key keeps the data keys, and
        so the tokens.

        Raises:
            InvalidInputError: ``space`` is the store's own.
            EncryptionKeyError: The tenant's data key had to be made and the master
                key was rotated meanwhile.
            BackendUnavailableError: The inner store failed.
        """
        self._refuse_keyring(space)
        names = self._key_for_write(tenant_of(space)).names
        digest = hmac.digest(names, _location(b"", space, key), "sha256")[:_TOKEN_BYTES]
        return OPAQUE_MARK + base64.b32encode(digest).decode().rstrip("=").lower()

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
                key = self._key_for_write(tenant_of(write.space))
                write = Put(
                    write.space, write.key, self._seal(key, write.space, write.key, write.value)
                )
            sealed_writes.append(write)
        sealed_checks: list[Check] = []
        for check in checks:
            if check.expected is not None:
                key = self._key_for_write(tenant_of(check.space))
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
        """The inner store's spaces, its own (keyring, format) left out (see ``ListsSpaces``)."""
        if not isinstance(self.inner, ListsSpaces):
            raise InvalidInputError("this store cannot list its spaces", field="kv")
        listed = self.inner.spaces(limit=None if limit is None else limit + len(INTERNAL_SPACES))
        return [s for s in listed if s not in INTERNAL_SPACES][
            : limit if limit is not None else None
        ]
