"""Storage backends, chosen by URL.

``open_kv_store`` is the one place that maps a URL to a :class:`KVStore`
implementation, so tier code never branches on the backend.
"""

from __future__ import annotations

from pathlib import Path
from urllib.parse import urlsplit

from tiers.backends.base import DEFAULT_MAX_VALUE_BYTES, KVStore
from tiers.errors import InvalidInputError


def open_kv_store(
    url: str,
    *,
    max_value_bytes: int = DEFAULT_MAX_VALUE_BYTES,
    durable: bool = True,
    flush_interval: float | None = None,
) -> KVStore:
    """Open the KV store a URL names.

    Args:
        url: ``sqlite:///relative/or/absolute/path.sqlite3`` (``sqlite:////abs`` for an
            absolute path, as in SQLAlchemy), a bare file path, or ``redis://`` /
            ``rediss://``.
        max_value_bytes: Largest value the store accepts.
        durable: SQLite only: fsync every commit.
        flush_interval: SQLite with ``durable=False`` only: make acknowledged
            commits durable in the background at this period (bounded durability).

    Raises:
        InvalidInputError: The URL's scheme is not supported.
    """
    scheme = urlsplit(url).scheme
    if scheme in ("redis", "rediss", "unix"):
        from tiers.backends.redis_kv import RedisKVStore

        return RedisKVStore(url, max_value_bytes=max_value_bytes)
    if scheme == "sqlite":
        path = url.removeprefix("sqlite:///")
    elif scheme == "":
        path = url
    else:
        raise InvalidInputError(
            f"unsupported KV store URL scheme {scheme!r}: use sqlite:///path or redis://host:port/db",
            field="kv_url",
        )
    from tiers.backends.sqlite_kv import SqliteKVStore

    return SqliteKVStore(
        Path(path),
        max_value_bytes=max_value_bytes,
        durable=durable,
        flush_interval=flush_interval,
    )
