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
differently). Spaces and keys (ids: tenants, users, sessions, step names) are not
encrypted; the lengths of values are visible.

**Opaque key names.** A key name that says what its record holds (a fact's key
names its subject) is stored as :meth:`EncryptedKVStore.key_token` by the tier
that writes it (:class:`~tiers.backends.base.TokenizesKeys`): ``~`` and an
HMAC-SHA256 of the space and key, truncated to 128 bits, under a key derived
from the tenant's data key. A store encrypted by an earlier tiermem kept fact
keys readable: one holding facts is refused at open until :func:`encrypt_existing`
(``tiermem encrypt``) has renamed them; either marks the store
(:func:`tiers.keys.opaque_names_space`) so it is not asked again.

**Plaintext.** A store that holds values written without encryption is refused
at open (when the backend can list its spaces) until :func:`encrypt_existing`
(``tiermem encrypt``) has encrypted them in place; a plaintext value found later
fails its read. A store that is encrypted is refused when opened without a
master key (:func:`refuse_if_encrypted`).
"""

from tiers.backends._encrypted_store import MIN_INNER_VALUE_BYTES, OVERHEAD, EncryptedKVStore
from tiers.backends._encryption_admin import (
    EncryptReport,
    encrypt_existing,
    refuse_if_encrypted,
    rotate_master_key,
)
from tiers.backends._keyring import MasterKey

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
