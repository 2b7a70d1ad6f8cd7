"""API keys of the HTTP service: random secrets that map a caller to one tenant.

A key may also be bound to one user id of its tenant (``user_id``), for an
agent that acts for one end user: the service then refuses it every other
user's data (403 for a route naming another user, 404 for an object of
another user addressed by its own id).

A key looks like ``tmk_<key id>_<secret>``. The key id (12 hex digits) is not
secret: it names the key in listings and revocations. The whole key is shown
once, when it is created; the store keeps only its SHA-256, so a leaked
database gives no usable key. The secret is 256 random bits, so a plain
SHA-256 (no slow password hash) is enough to make guessing hopeless.

Keys live in one KV space outside every tenant (:func:`tiers.keys.api_keys_space`),
because a key is looked up before its tenant is known.

Hierarchy::

    ApiKeyError                  root of every API-key error
    ├── InvalidApiKeyError       the key is malformed, unknown or revoked
    └── ApiKeyNotFoundError      no key has that key id
"""

from __future__ import annotations

import hashlib
import hmac
import re
import secrets
from datetime import datetime
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError

from memory.errors import MemoryLayerError
from tiers import keys
from tiers.backends.base import Check, KVStore, Put
from tiers.codec import decode, encode
from tiers.errors import ConflictError, InvalidInputError
from tiers.ids import Id, check_id
from tiers.models import Record, UtcDatetime, utcnow

__all__ = [
    "ApiKeyError",
    "ApiKeyInfo",
    "ApiKeyNotFoundError",
    "ApiKeyRecord",
    "ApiKeyRegistry",
    "InvalidApiKeyError",
    "Scope",
]

Scope = Literal["read", "write"]
"""``read``: GET routes, recall and context. ``write``: everything else."""

_PREFIX = "tmk"
_KEY = re.compile(r"tmk_([0-9a-f]{12})_([A-Za-z0-9_-]{43})")
_KEY_ID = re.compile(r"[0-9a-f]{12}")
_CAS_ATTEMPTS = 16


class ApiKeyError(MemoryLayerError):
    """Root of every API-key error."""


class InvalidApiKeyError(ApiKeyError):
    """The presented key is malformed, unknown or revoked.

    The message never repeats the key. Ask the operator for a new key
    (``tiermem keys create --tenant ...``).
    """


class ApiKeyNotFoundError(ApiKeyError):
    """No API key has that key id (see ``tiermem keys list``)."""


class ApiKeyInfo(BaseModel):
    """What is known about a key, without its secret.

    Attributes:
        key_id: Public id of the key (12 hex digits); the key starts with ``tmk_<key_id>_``.
        tenant: The tenant every request made with the key acts in.
        scopes: ``["read"]`` for a read-only key, ``["read", "write"]`` otherwise.
        name: A label for people (who or what uses the key).
        created_at: When the key was created.
        revoked_at: When it was revoked, or ``None`` while it is active.
        user_id: The one user the key may act for, or ``None`` for every user of its tenant.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    key_id: str
    tenant: str
    scopes: list[Scope]
    name: str
    created_at: datetime
    revoked_at: datetime | None
    user_id: str | None = None

    @property
    def active(self) -> bool:
        """True until the key is revoked."""
        return self.revoked_at is None

    @property
    def read_only(self) -> bool:
        """True if the key may not write."""
        return "write" not in self.scopes


class ApiKeyRecord(Record):
    """The stored form of a key: its info and the SHA-256 of the whole key."""

    key_id: Annotated[str, Field(pattern=r"^[0-9a-f]{12}$")]
    tenant: Id
    scopes: list[Scope]
    name: Annotated[str, Field(max_length=256)] = ""
    secret_sha256: Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
    created_at: UtcDatetime
    revoked_at: UtcDatetime | None = None
    # Absent in records written before keys could be bound to a user: they stay tenant-wide.
    user_id: Id | None = None

    def info(self) -> ApiKeyInfo:
        """The record without its hash."""
        return ApiKeyInfo(
            key_id=self.key_id,
            tenant=self.tenant,
            scopes=list(self.scopes),
            name=self.name,
            created_at=self.created_at,
            revoked_at=self.revoked_at,
            user_id=self.user_id,
        )


def _digest(key: str) -> str:
    return hashlib.sha256(key.encode()).hexdigest()


class ApiKeyRegistry:
    """Create, verify, list and revoke API keys in a KV store. Thread-safe.

    Args:
        kv: The store; usually the one of the :class:`~memory.facade.Memory`
            the service runs on.
    """

    def __init__(self, kv: KVStore) -> None:
        self._kv = kv
        self._space = keys.api_keys_space()

    def create(
        self,
        tenant: str,
        *,
        read_only: bool = False,
        name: str = "",
        user_id: str | None = None,
    ) -> tuple[str, ApiKeyInfo]:
        """Create a key for ``tenant``.

        Args:
            tenant: The tenant the key acts in (an id).
            read_only: Allow only reads (GET routes, recall and context).
            name: A label for people, up to 256 characters.
            user_id: Bind the key to this one user of the tenant (an id): every
                other user's data is refused to it. ``None``: every user.

        Returns:
            The key itself (shown only now; it is not stored) and its info.

        Raises:
            InvalidInputError: A bad tenant, user id or name.
            BackendUnavailableError: The store failed; no key was created.
        """
        check_id(tenant, "tenant")
        if user_id is not None:
            check_id(user_id, "user_id")
        scopes: list[Scope] = ["read"] if read_only else ["read", "write"]
        for _ in range(_CAS_ATTEMPTS):
            key_id = secrets.token_hex(6)
            key = f"{_PREFIX}_{key_id}_{secrets.token_urlsafe(32)}"
            try:
                record = ApiKeyRecord(
                    key_id=key_id,
                    tenant=tenant,
                    scopes=scopes,
                    name=name,
                    secret_sha256=_digest(key),
                    created_at=utcnow(),
                    user_id=user_id,
                )
            except ValidationError as exc:
                first = exc.errors()[0]
                field = ".".join(str(p) for p in first["loc"]) or "name"
                raise InvalidInputError(
                    f"invalid API key {field}: {first['msg']}", field=field
                ) from exc
            try:
                self._kv.commit(
                    [Put(self._space, key_id, encode(record))], [Check(self._space, key_id, None)]
                )
            except ConflictError:
                continue  # a 48-bit id collided; draw another
            return key, record.info()
        raise ConflictError("could not find a free API key id; retry")

    def verify(self, key: str) -> ApiKeyInfo:
        """The info of an active key.

        Raises:
            InvalidApiKeyError: The key is malformed, unknown or revoked.
            BackendUnavailableError: The store failed.
        """
        match = _KEY.fullmatch(key) if isinstance(key, str) else None
        if match is None:
            raise InvalidApiKeyError("malformed API key: expected 'tmk_<key id>_<secret>'")
        record = self._read(match.group(1))
        # Compare digests in constant time, so timing reveals nothing about the stored hash.
        if record is None or not hmac.compare_digest(record.secret_sha256, _digest(key)):
            raise InvalidApiKeyError("unknown API key: ask the operator for a valid key")
        if record.revoked_at is not None:
            raise InvalidApiKeyError(
                f"API key {record.key_id} was revoked: ask the operator for a new key"
            )
        return record.info()

    def get(self, key_id: str) -> ApiKeyInfo:
        """The info of a key, active or revoked.

        Raises:
            ApiKeyNotFoundError: No key has that id.
        """
        record = self._read(self._check_key_id(key_id))
        if record is None:
            raise ApiKeyNotFoundError(f"no API key with id {key_id!r}: see `tiermem keys list`")
        return record.info()

    def list_keys(self, *, tenant: str | None = None) -> list[ApiKeyInfo]:
        """Every key (revoked ones too), oldest first, optionally only one tenant's."""
        if tenant is not None:
            check_id(tenant, "tenant")
        records = [
            decode(ApiKeyRecord, data, where=f"{self._space}/{key}")
            for key, data in self._kv.scan(self._space)
        ]
        records.sort(key=lambda r: (r.created_at, r.key_id))
        return [r.info() for r in records if tenant is None or r.tenant == tenant]

    def revoke(self, key_id: str) -> ApiKeyInfo:
        """Revoke a key for good. Revoking a revoked key does nothing.

        Returns:
            The key's info, with ``revoked_at`` set.

        Raises:
            ApiKeyNotFoundError: No key has that id.
        """
        self._check_key_id(key_id)
        for _ in range(_CAS_ATTEMPTS):
            (data,) = self._kv.get_many(self._space, [key_id])
            if data is None:
                raise ApiKeyNotFoundError(f"no API key with id {key_id!r}: see `tiermem keys list`")
            record = decode(ApiKeyRecord, data, where=f"{self._space}/{key_id}")
            if record.revoked_at is not None:
                return record.info()
            revoked = record.model_copy(update={"revoked_at": utcnow()})
            try:
                self._kv.commit(
                    [Put(self._space, key_id, encode(revoked))], [Check(self._space, key_id, data)]
                )
            except ConflictError:
                continue
            return revoked.info()
        raise ConflictError(f"API key {key_id} is changing too fast to revoke; retry")

    def _read(self, key_id: str) -> ApiKeyRecord | None:
        (data,) = self._kv.get_many(self._space, [key_id])
        return None if data is None else decode(ApiKeyRecord, data, where=f"{self._space}/{key_id}")

    @staticmethod
    def _check_key_id(key_id: object) -> str:
        if not isinstance(key_id, str) or _KEY_ID.fullmatch(key_id) is None:
            raise InvalidInputError(
                f"key id {str(key_id)[:40]!r} is invalid: use the 12 hex digits shown by "
                "`tiermem keys list`",
                field="key_id",
            )
        return key_id
