"""Opening the stores and models that :class:`~memory.settings.Settings` name, for ``Memory``.

What :meth:`memory.Memory.from_settings` builds before it constructs the
facade: the KV store (refused when it may lose acknowledged writes unless the
operator allows it), the vector index, the embedder, the summarizer and the
rest of ``Memory``'s arguments.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from datetime import timedelta
from pathlib import Path
from typing import Any

from pydantic import ValidationError

from memory.settings import Settings
from summarizer import LiteLLMSummarizer, Summarizer
from summarizer.embeddings import LiteLLMEmbedder
from tiers.backends import open_kv_store, require_durable
from tiers.backends.base import Embedder, KVStore
from tiers.backends.chroma_index import ChromaVectorIndex
from tiers.backends.dirlock import DataDirLock
from tiers.backends.embedders import MiniLMEmbedder
from tiers.errors import InvalidInputError
from tiers.redaction import Redactor

logger = logging.getLogger("tiermem.memory")


def settings_from(**values: Any) -> Settings:
    """Settings from ``values`` and the environment; a bad one is an error naming the setting.

    Raises:
        InvalidInputError: A setting is invalid; ``field`` names it.
    """
    try:
        return Settings(**values)
    except ValidationError as exc:
        first = exc.errors()[0]
        field = ".".join(str(p) for p in first["loc"]) or "settings"
        raise InvalidInputError(f"invalid setting {field}: {first['msg']}", field=field) from exc


def settings_for_dir(data_dir: object, overrides: dict[str, Any]) -> Settings:
    """The settings :meth:`memory.Memory.open` opens: ``data_dir`` with ``overrides``.

    ``durable=False`` passed here is itself the explicit choice of bounded
    durability, so it implies ``allow_volatile=True`` (unless that is passed too).

    Raises:
        InvalidInputError: ``data_dir`` is not a path, or a setting is invalid.
    """
    if not isinstance(data_dir, str | os.PathLike):
        raise InvalidInputError(
            f"data_dir must be a path, got {type(data_dir).__name__}", field="data_dir"
        )
    if overrides.get("durable") is False:
        overrides.setdefault("allow_volatile", True)
    return settings_from(data_dir=Path(data_dir), **overrides)


@dataclass(frozen=True, slots=True)
class OpenedStores:
    """The stores :func:`open_stores` opened, before ``Memory`` is built around them.

    Attributes:
        arguments: ``Memory``'s constructor arguments.
        lock: The data dir's lock, when an embedded store lives there.
        allow_volatile: Whether a KV store that may lose acknowledged writes was accepted.
    """

    arguments: dict[str, Any]
    lock: DataDirLock | None
    allow_volatile: bool

    def close(self) -> None:
        """Close the KV store and release the lock (building ``Memory`` failed)."""
        try:
            self.arguments["kv"].close()
        finally:
            if self.lock is not None:
                self.lock.release()


def open_stores(settings: Settings | None) -> OpenedStores:
    """Lock the data dir (when an embedded store lives there), then open what ``settings`` name.

    Raises:
        InvalidInputError: ``settings`` is not a ``Settings``, or one from the
            environment (``None``) is invalid.
        DataDirLockedError, VolatileStoreError, EncryptionKeyError: See
            :meth:`memory.Memory.from_settings`.
    """
    if settings is None:
        settings = settings_from()
    elif not isinstance(settings, Settings):
        raise InvalidInputError(
            f"settings must be a Settings, got {type(settings).__name__}", field="settings"
        )
    embedded = settings.kv_url is None or settings.vector_url is None
    lock = DataDirLock(settings.data_dir) if embedded else None
    try:
        kv = open_durable_kv(settings)
        try:
            arguments = memory_arguments(settings, kv)
        except BaseException:
            kv.close()
            raise
    except BaseException:
        if lock is not None:
            lock.release()
        raise
    return OpenedStores(arguments, lock, settings.allow_volatile)


def open_durable_kv(settings: Settings) -> KVStore:
    """Open the settings' KV store, refusing a volatile one unless ``allow_volatile``.

    Raises:
        VolatileStoreError: The store may lose acknowledged writes and
            ``allow_volatile`` is not set (the store is closed again).
    """
    kv_url = settings.kv_url or str(settings.data_dir / "tiermem.sqlite3")
    kv = open_kv_store(
        kv_url,
        max_value_bytes=settings.max_value_bytes,
        durable=settings.durable,
        flush_interval=settings.flush_interval,
        master_key=settings.encryption_key(),
    )
    try:
        reason = require_durable(kv, allow_volatile=settings.allow_volatile)
    except BaseException:
        kv.close()
        raise
    if reason is not None:
        logger.warning("KV store may lose acknowledged writes (allow_volatile is on): %s", reason)
    return kv


def memory_arguments(settings: Settings, kv: KVStore) -> dict[str, Any]:
    """``Memory``'s constructor arguments for ``settings`` over the opened ``kv``.

    Opens the vector index and builds the embedder and the summarizer.
    """
    embedder: Embedder
    if settings.embedding_model:
        embedder = LiteLLMEmbedder(settings.embedding_model)
    else:
        embedder = MiniLMEmbedder()
    index = ChromaVectorIndex(
        settings.vector_url or settings.data_dir / "chroma", embedder=embedder
    )
    summarizer: Summarizer | None = None
    if settings.summarizer_model:
        api_key = settings.summarizer_api_key
        summarizer = LiteLLMSummarizer(
            settings.summarizer_model,
            api_base=settings.summarizer_api_base,
            api_key=api_key.get_secret_value() if api_key else None,
            max_input_tokens=settings.summarizer_max_input_tokens,
            timeout=settings.summarizer_timeout,
            max_retries=settings.summarizer_max_retries,
            max_transient_retries=settings.summarizer_max_transient_retries,
        )
    return {
        "kv": kv,
        "index": index,
        "embedder": embedder,
        "summarizer": summarizer,
        "tenant": settings.tenant,
        "context_max_tokens": settings.context_max_tokens,
        "background_indexing": settings.background_indexing,
        "run_retention": timedelta(days=settings.run_retention_days),
        "snapshot_every": settings.snapshot_every,
        "head_fresh_ms": settings.head_fresh_ms,
        "scrub_deleted": settings.scrub_deleted,
        "cache_max_age_seconds": settings.cache_max_age_seconds,
        "retention": settings.retention_policy(),
        "redactor": Redactor(
            settings.redact,
            patterns=settings.redact_patterns,
            placeholder=settings.redact_placeholder,
        ),
    }
