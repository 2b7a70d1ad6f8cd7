"""The master key and the keyring of an encrypted store (see :mod:`tiers.backends.encrypted_kv`).

The keyring space holds which master key wraps the store's data keys (its id,
never the key) and each tenant's data key wrapped by it.
"""

from __future__ import annotations

import base64
import binascii
import contextlib
import hmac
import os
import secrets
from pathlib import Path
from typing import Literal

from cryptography.hazmat.primitives.ciphers.aead import AESGCM
from pydantic import BaseModel, ConfigDict, ValidationError

from tiers import keys
from tiers.backends.base import Check, KVStore, Put
from tiers.errors import ConflictError, EncryptionKeyError, InvalidInputError

NONCE_BYTES = 12
KEYRING = keys.keyring_space()
MASTER = "master"
DEK_PREFIX = "dek:"
GLOBAL = ""  # the data key of spaces outside every tenant
OPAQUE_NAMES = keys.opaque_names_space()
FACT_NAMES = "facts"
INTERNAL_SPACES = (KEYRING, OPAQUE_NAMES)
"""The spaces an encrypted store keeps for itself: closed to callers, not listed, not encrypted."""


def tenant_of(space: str) -> str:
    head, sep, _ = space.partition(":")
    return head if sep else GLOBAL


def tenant_label(tenant: str) -> str:
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
        nonce = secrets.token_bytes(NONCE_BYTES)
        return nonce + self._aead.encrypt(nonce, dek, _wrap_aad(tenant, key_id))

    def unwrap(self, tenant: str, key_id: bytes, wrapped: bytes) -> bytes:
        """Raises InvalidTag when the key is not this one's, or the record was changed."""
        return self._aead.decrypt(
            wrapped[:NONCE_BYTES], wrapped[NONCE_BYTES:], _wrap_aad(tenant, key_id)
        )


def _wrap_aad(tenant: str, key_id: bytes) -> bytes:
    return b"tiermem data key v1\x00" + key_id + tenant.encode()


class KeyringRecord(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    schema_version: Literal[1] = 1


class MasterRecord(KeyringRecord):
    """Which master key wraps this store's data keys (its id, never the key)."""

    master_key_id: str


class DataKeyRecord(KeyringRecord):
    """One tenant's data key, wrapped: ``nonce || AES-GCM(key || tag)``, base64."""

    key_id: str
    master_key_id: str
    wrapped: str


def decode_keyring(model: type[KeyringRecord], data: bytes, where: str) -> KeyringRecord:
    try:
        return model.model_validate_json(data)
    except ValidationError as exc:
        raise EncryptionKeyError(
            f"the encryption keyring record {where} is corrupt ({exc.errors()[0]['msg']}); "
            "restore it from a backup: without it the store's data cannot be read"
        ) from exc


def read_master(kv: KVStore) -> MasterRecord | None:
    (data,) = kv.get_many(KEYRING, [MASTER])
    if data is None:
        return None
    record = decode_keyring(MasterRecord, data, MASTER)
    assert isinstance(record, MasterRecord)
    return record


def wrong_key(stored: str, given: MasterKey) -> EncryptionKeyError:
    return EncryptionKeyError(
        f"wrong master key: this store's data keys are wrapped by master key {stored}, and the "
        f"configured key is {given.id}. Set TIERMEM_MASTER_KEY or TIERMEM_MASTER_KEY_FILE to "
        "the key the store was encrypted with (or rotated to last: `tiermem rotate-master-key`)"
    )


def fact_names_opaque(kv: KVStore) -> bool:
    """Whether the store's fact names are tokens (marked by :func:`mark_fact_names_opaque`)."""
    (data,) = kv.get_many(OPAQUE_NAMES, [FACT_NAMES])
    return data is not None


def mark_fact_names_opaque(kv: KVStore) -> None:
    """Record that every fact name of the store is a token: a new store's, or one renamed."""
    record = KeyringRecord().model_dump_json().encode()
    # Made already by another process: the same record.
    with contextlib.suppress(ConflictError):
        kv.commit([Put(OPAQUE_NAMES, FACT_NAMES, record)], [Check(OPAQUE_NAMES, FACT_NAMES, None)])
