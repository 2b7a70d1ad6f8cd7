"""Settings of a tiermem deployment, read from ``TIERMEM_*`` environment variables.

Built at the edge (``Memory.from_settings()``, the CLI, ``create_app``), never
at import time; everything below takes explicit constructor arguments.
"""

from __future__ import annotations

from pathlib import Path

from pydantic import Field, SecretStr
from pydantic_settings import BaseSettings, SettingsConfigDict

from tiers.backends.base import DEFAULT_MAX_VALUE_BYTES


class Settings(BaseSettings):
    """Where tiermem keeps its data and which models it uses.

    The defaults are the embedded setup: a SQLite file and an embedded Chroma
    index in ``data_dir``, the local embedding model, the offline summarizer.
    """

    model_config = SettingsConfigDict(env_prefix="TIERMEM_", extra="forbid")

    data_dir: Path = Field(default=Path(".tiermem"), description="Folder of the embedded stores.")
    kv_url: str | None = Field(
        default=None,
        description="KV store: 'redis://host:port/db' or 'sqlite:///path'; default: SQLite in data_dir.",
    )
    vector_url: str | None = Field(
        default=None,
        description="Chroma server 'http://host:port'; default: embedded Chroma in data_dir.",
    )
    embedding_model: str | None = Field(
        default=None,
        description="litellm embedding model (hosted); default: the bundled local MiniLM model.",
    )
    summarizer_model: str | None = Field(
        default=None,
        description="litellm chat model for summaries; default: the offline extractive summarizer.",
    )
    summarizer_api_base: str | None = None
    summarizer_api_key: SecretStr | None = None
    tenant: str = Field(default="default", description="Namespace of every stored key.")
    max_value_bytes: int = Field(default=DEFAULT_MAX_VALUE_BYTES, gt=0)
    durable: bool = Field(default=True, description="fsync every SQLite commit.")
    context_max_tokens: int = Field(default=2000, gt=0)
