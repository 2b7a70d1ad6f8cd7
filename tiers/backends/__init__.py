"""Storage backends, chosen by URL.

``open_kv_store`` is the one place that maps a URL to a :class:`KVStore`
implementation, so tier code never branches on the backend.
"""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Protocol, runtime_checkable
from urllib.parse import urlsplit, urlunsplit

from tiers.backends.base import DEFAULT_MAX_VALUE_BYTES, KVStore
from tiers.errors import InvalidInputError, TierError, VolatileStoreError

if TYPE_CHECKING:
    from tiers.backends.encrypted_kv import MasterKey


class MissingExtraError(ImportError):
    """An optional driver or framework is not installed; the message names the extra to install.

    Raised by the PostgreSQL backend without ``tiermem[postgres]``, and by the
    framework adapters (``memory.integrations`` re-exports it) without theirs.
    """


@runtime_checkable
class ReportsDurability(Protocol):
    """A store that can tell whether it would acknowledge a commit it may lose."""

    def volatility(self) -> str | None:
        """Why an acknowledged commit could be lost, or ``None`` if every one is durable."""
        ...


def kv_volatility(kv: KVStore) -> str | None:
    """Why ``kv`` could lose an acknowledged commit; ``None`` if durable (or it cannot say).

    Raises:
        BackendUnavailableError: The store could not be asked.
    """
    return kv.volatility() if isinstance(kv, ReportsDurability) else None


def require_durable(kv: KVStore, *, allow_volatile: bool) -> str | None:
    """Refuse a volatile KV store unless the operator opted in; return why it is volatile.

    Args:
        kv: The store.
        allow_volatile: The operator's explicit opt-in (``TIERMEM_ALLOW_VOLATILE``).

    Returns:
        The reason the store is volatile (allowed), or ``None`` when it is durable.

    Raises:
        VolatileStoreError: The store is volatile and ``allow_volatile`` is false.
        BackendUnavailableError: The store could not be asked.
    """
    reason = kv_volatility(kv)
    if reason is not None and not allow_volatile:
        raise VolatileStoreError(
            f"refusing a KV store that may lose acknowledged writes: {reason}. Make it "
            "durable, or accept the loss explicitly with allow_volatile "
            "(TIERMEM_ALLOW_VOLATILE=true; /readyz then reports it)",
            reason=reason,
        )
    return reason


def redact_url(url: str) -> str:
    """``url`` with any password (and a user name beside it) replaced by ``***``.

    For every URL that is printed or logged: ``redis://:secret@host:6379/0``
    becomes ``redis://***@host:6379/0``, and a ``password`` query parameter (which
    libpq accepts in a ``postgresql://`` URL) becomes ``password=***``. Anything
    that is not a URL with credentials comes back unchanged.
    """
    try:
        parts = urlsplit(url)
    except ValueError:
        return url
    if "password=" in parts.query:
        query = "&".join(
            "password=***" if field.startswith("password=") else field
            for field in parts.query.split("&")
        )
        parts = parts._replace(query=query)
    if "@" in parts.netloc:
        host = parts.netloc.rsplit("@", 1)[1]
        parts = parts._replace(netloc=f"***@{host}")
    return urlunsplit(parts) if parts.geturl() != url else url


# URL scheme -> the KV backend it opens (see open_kv_backend); a bare path is SQLite.
_KV_BACKENDS = {
    "": "SQLite",
    "sqlite": "SQLite",
    "redis": "Redis",
    "rediss": "Redis",
    "unix": "Redis",
    "redis+cluster": "Redis Cluster",
    "rediss+cluster": "Redis Cluster",
    "postgresql": "PostgreSQL",
    "postgres": "PostgreSQL",
}


def kv_backend_name(url: str) -> str:
    """The KV backend a URL names (``SQLite``, ``Redis``, ``Redis Cluster``, ``PostgreSQL``),
    without opening it.

    Raises:
        InvalidInputError: The URL's scheme is not supported.
    """
    scheme = urlsplit(url).scheme
    if scheme not in _KV_BACKENDS:
        raise InvalidInputError(
            f"unsupported KV store URL scheme {scheme!r}: use sqlite:///path, "
            "redis://host:port/db, redis+cluster://host:port,host:port/ or "
            "postgresql://user:password@host:port/db",
            field="kv_url",
        )
    return _KV_BACKENDS[scheme]


@runtime_checkable
class DescribesItself(Protocol):
    """A store that can say what it runs on (a cluster's shape, its commit acknowledgement)."""

    def describe(self) -> str:
        """One line for an operator."""
        ...


def describe_kv_store(url: str) -> str:
    """What the store at ``url`` runs on and how durable its commits are (for ``tiermem info``).

    Opens the store for the question; an error comes back as the description.
    """
    try:
        kv = open_kv_backend(url)
    except TierError as exc:
        return f"unavailable ({exc})"
    try:
        shape = kv.describe() if isinstance(kv, DescribesItself) else kv_backend_name(url)
        reason = kv_volatility(kv)
    except TierError as exc:
        return f"unavailable ({exc})"
    finally:
        kv.close()
    durability = "durable" if reason is None else f"volatile: {reason}"
    return f"{shape}; {durability}"


def open_kv_store(
    url: str,
    *,
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    durable: bool = True,
    flush_interval: float | None = None,
    master_key: MasterKey | None = None,
) -> KVStore:
    """Open the KV store a URL names, encrypted at rest when a master key is given.

    With ``master_key`` the store is an :class:`~tiers.backends.encrypted_kv.EncryptedKVStore`
    over the backend (which gets room for the encryption overhead, so callers still get
    ``max_value_bytes``). Without one, a store that is encrypted is refused rather than
    read as ciphertext.

    Args:
        url: ``sqlite:///relative/or/absolute/path.sqlite3`` (``sqlite:////abs`` for an
            absolute path, as in SQLAlchemy), a bare file path, ``redis://`` /
            ``rediss://``, ``redis+cluster://host:port[,host:port...]/[?wait=1]`` /
            ``rediss+cluster://`` (a Redis Cluster: see ``redis_cluster_kv``), or ``postgresql://`` / ``postgres://`` (needs the
            ``postgres`` extra).
        max_value_bytes: Largest value the store accepts.
        durable: SQLite only: fsync every commit.
        flush_interval: SQLite with ``durable=False`` only: make acknowledged
            commits durable in the background at this period (bounded durability).
        master_key: Encrypt every value with per-tenant data keys wrapped by this key.

    Raises:
        InvalidInputError: The URL's scheme is not supported.
        MissingExtraError: A ``postgresql://`` URL without ``tiermem[postgres]`` installed.
        EncryptionKeyError: ``master_key`` is not the store's, the store is
            encrypted and no key is given, or it holds unencrypted data and a key
            is given (``tiermem encrypt`` first).
    """
    if master_key is None:
        kv = open_kv_backend(
            url, max_value_bytes=max_value_bytes, durable=durable, flush_interval=flush_interval
        )
        from tiers.backends.encrypted_kv import refuse_if_encrypted

        try:
            refuse_if_encrypted(kv)
        except BaseException:
            kv.close()
            raise
        return kv
    from tiers.backends.encrypted_kv import OVERHEAD, EncryptedKVStore

    inner = open_kv_backend(
        url,
        max_value_bytes=max_value_bytes + OVERHEAD,
        durable=durable,
        flush_interval=flush_interval,
    )
    try:
        return EncryptedKVStore(inner, master_key)
    except BaseException:
        inner.close()
        raise


def open_kv_backend(
    url: str,
    *,
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    durable: bool = True,
    flush_interval: float | None = None,
) -> KVStore:
    """The backend a URL names, as it stores bytes: neither encrypted nor checked for encryption.

    For maintenance that works on stored bytes (``tiermem encrypt``, ``rotate-master-key``);
    everything else opens stores with :func:`open_kv_store`. Arguments as there.

    Raises:
        InvalidInputError: The URL's scheme is not supported.
        MissingExtraError: A ``postgresql://`` URL without ``tiermem[postgres]`` installed.
    """
    backend = kv_backend_name(url)
    if backend == "Redis Cluster":
        from tiers.backends.redis_cluster_kv import RedisClusterKVStore

        return RedisClusterKVStore(url, max_value_bytes=max_value_bytes)
    if backend == "Redis":
        from tiers.backends.redis_kv import RedisKVStore

        return RedisKVStore(url, max_value_bytes=max_value_bytes)
    if backend == "PostgreSQL":
        from tiers.backends.postgres_kv import PostgresKVStore

        return PostgresKVStore(url, max_value_bytes=max_value_bytes)
    from tiers.backends.sqlite_kv import SqliteKVStore

    return SqliteKVStore(
        Path(url.removeprefix("sqlite:///")),
        max_value_bytes=max_value_bytes,
        durable=durable,
        flush_interval=flush_interval,
    )
