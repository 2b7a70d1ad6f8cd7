"""Settings of a tiermem deployment, read from ``TIERMEM_*`` environment variables.

Built at the edge (``Memory.from_settings()``, the CLI, ``create_app``), never
at import time; everything below takes explicit constructor arguments.
"""

from __future__ import annotations

from datetime import timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from pydantic import Field, SecretStr, field_validator, model_validator
from pydantic_settings import BaseSettings, SettingsConfigDict

from tiers.backends.base import DEFAULT_MAX_VALUE_BYTES
from tiers.cache_ages import DEFAULT_MAX_AGE_SECONDS
from tiers.errors import InvalidInputError
from tiers.redaction import DEFAULT_PLACEHOLDER, RedactMode, check_patterns
from tiers.task import DEFAULT_HEAD_FRESH_MS

if TYPE_CHECKING:
    from tiers.backends.encrypted_kv import MasterKey
    from tiers.retention import RetentionPolicy


class Settings(BaseSettings):
    """Where tiermem keeps its data and which models it uses.

    The defaults are the embedded setup: a SQLite file and an embedded Chroma
    index in ``data_dir``, the local embedding model, the offline summarizer.
    """

    model_config = SettingsConfigDict(env_prefix="TIERMEM_", extra="forbid")

    data_dir: Path = Field(default=Path(".tiermem"), description="Folder of the embedded stores.")
    kv_url: str | None = Field(
        default=None,
        description=(
            "KV store: 'sqlite:///path', 'redis://host:port/db', "
            "'redis+cluster://host:port,host:port/?wait=1' (Redis Cluster) or "
            "'postgresql://user:password@host:port/db' (the postgres extra); "
            "default: SQLite in data_dir."
        ),
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
    summarizer_max_input_tokens: int | None = Field(
        default=None,
        ge=100,
        description="Largest transcript part, in tokens, summarized in one call (longer ones are "
        "map-reduced); default: the model's window as litellm knows it, else 8000. Set it for "
        "a self-hosted model litellm does not know.",
    )
    summarizer_timeout: float = Field(
        default=60.0, gt=0, description="Seconds per summarizer call before it is a timeout."
    )
    summarizer_max_retries: int = Field(
        default=2,
        ge=0,
        description="Extra summarizer calls after an invalid reply (bad JSON or schema), each "
        "telling the model what was wrong.",
    )
    summarizer_max_transient_retries: int = Field(
        default=3,
        ge=0,
        description="Extra summarizer calls after a timeout, rate limit, connection failure or "
        "5xx error (with backoff).",
    )
    tenant: str = Field(default="default", description="Namespace of every stored key.")
    max_value_bytes: int = Field(default=DEFAULT_MAX_VALUE_BYTES, gt=0)
    durable: bool = Field(default=True, description="fsync every SQLite commit.")
    flush_interval: float | None = Field(
        default=None,
        gt=0,
        description="Bounded durability (SQLite, with durable=false only): commits are "
        "acknowledged before fsync and made durable within this many seconds, and always "
        "before a run's external effect is invoked.",
    )
    allow_volatile: bool = Field(
        default=False,
        description="Start on a KV store that may lose acknowledged writes (Redis without "
        "appendonly yes + appendfsync always, or one that refuses CONFIG GET; SQLite with "
        "durable=false). Without it such a store is refused; with it a warning is logged and "
        "/readyz reports volatile with the reason.",
    )
    master_key: SecretStr | None = Field(
        default=None,
        description="Encryption at rest: the master key (base64 of 32 bytes; `tiermem "
        "new-master-key` makes one). Every KV value is then encrypted with a per-tenant data key "
        "wrapped by it. Unset (and no master_key_file): values are stored unencrypted.",
    )
    master_key_file: Path | None = Field(
        default=None,
        description="Encryption at rest: a file holding the master key (its base64 text, or 32 "
        "raw bytes), instead of master_key.",
    )
    context_max_tokens: int = Field(default=2000, gt=0)
    run_retention_days: float = Field(
        default=7.0,
        gt=0,
        le=36_500,
        description="Finished task runs are deleted by `tiermem sweep` (and the HTTP service's "
        "periodic sweep) this many days after they ended.",
    )
    retention_sessions_days: float | None = Field(
        default=None,
        gt=0,
        le=36_500,
        description="Retention default: sessions (summary, transcript, vectors, facts learned "
        "from them) are deleted by the sweep this many days after they ended (unset: kept "
        "forever). A tenant may override it (`tiermem retention set`).",
    )
    retention_transcripts_days: float | None = Field(
        default=None,
        gt=0,
        le=36_500,
        description="Retention default: raw transcripts are deleted this many days after their "
        "session ended, the summary kept (unset: kept as long as the session).",
    )
    retention_facts_days: float | None = Field(
        default=None,
        gt=0,
        le=36_500,
        description="Retention default: user facts are deleted with their history this many "
        "days after their last update (unset: kept forever).",
    )
    retention_idle_runs_days: float | None = Field(
        default=None,
        gt=0,
        le=36_500,
        description="Retention default: task runs never finished, untouched this many days and "
        "with no live lease are deleted (unset: kept forever).",
    )
    snapshot_every: int = Field(
        default=64,
        ge=1,
        description="Snapshot a run's state every this many events, so resuming a long run "
        "reads one snapshot and a short tail.",
    )
    head_fresh_ms: float = Field(
        default=DEFAULT_HEAD_FRESH_MS,
        ge=0,
        allow_inf_nan=False,
        description="Milliseconds a run handle trusts the run head its last commit or read "
        "returned: a step or appended checkpoint within it skips reading the head first (one "
        "round trip on Redis in a tight loop). A cancel or takeover by another process inside "
        "it is still refused, at the commit, after a step's function ran once. 0: read the "
        "head before every step.",
    )
    scrub_deleted: bool = Field(
        default=True,
        description="After forgetting a user or deleting a session, have the KV store drop the "
        "deleted data from its files too: SQLite truncates its WAL (deleted rows are zeroed "
        "anyway), Redis rewrites its AOF (BGREWRITEAOF). Turn off to rewrite on your own "
        "schedule (a large Redis).",
    )
    cache_max_age_seconds: float = Field(
        default=DEFAULT_MAX_AGE_SECONDS,
        ge=0,
        allow_inf_nan=False,
        description="Seconds an in-process cache keeps anything of a user's data (decoded "
        "facts, recall views, embedded vectors, LangGraph list channels, Redis listings, "
        "memoised words and JSON keys): older entries are swept even if nothing reads them, so "
        "data deleted by another process leaves this one's memory within this time (the "
        "smallest any open Memory of the process set). 0: nothing is kept across calls (the "
        "memos of words and keys are cleared every 50 ms).",
    )
    redact: RedactMode = Field(
        default="secrets",
        description="Redact before anything is stored (transcripts, before the summarizer sees "
        "them; summaries; facts; run outputs, state, scopes and effect outputs): 'secrets' "
        "(API keys, tokens, passwords, card numbers, private keys), 'secrets+pii' (also "
        "e-mail addresses, phone numbers, US SSNs) or 'off'.",
    )
    redact_patterns: dict[str, str] = Field(
        default_factory=dict,
        description="More kinds to redact, kind -> regex (as JSON in TIERMEM_REDACT_PATTERNS, "
        'e.g. {"employee_id": "EMP-\\\\d{6}"}); a group named secret is what is replaced.',
    )
    redact_placeholder: str = Field(
        default=DEFAULT_PLACEHOLDER,
        min_length=1,
        description="What a redacted value becomes; {kind} names what it was.",
    )

    # -- HTTP service (``tiermem serve``, ``api.create_app``) --------------------------------
    auth_enabled: bool = Field(
        default=True,
        description="Require an API key on /v1 routes; turn off only for local development.",
    )
    auth_cache_seconds: float = Field(
        default=2.0,
        ge=0,
        description="How long a verified API key is trusted without re-reading it; "
        "a revocation takes effect within this time (0: check on every request).",
    )
    max_request_bytes: int = Field(
        default=2 * 1024 * 1024, gt=0, description="Largest request body accepted (HTTP 413)."
    )
    background_indexing: bool = Field(
        default=True,
        description="Embed saved sessions in a worker thread, batched: saves return once "
        "durable in the KV store and recall still sees them. False: index before returning.",
    )
    api_host: str = Field(default="127.0.0.1", description="Interface `tiermem serve` binds.")
    api_port: int = Field(default=8080, ge=0, le=65535, description="Port `tiermem serve` binds.")
    summarize_workers: int = Field(
        default=2,
        ge=0,
        description="Threads that run summary jobs (of every replica on the store) in this "
        "process; 0: this process only queues them.",
    )
    max_pending_jobs: int = Field(
        default=256,
        gt=0,
        description="Unfinished background summaries per tenant at most; more are refused with "
        "HTTP 429 (before the transcript is stored), other tenants unaffected.",
    )
    job_lease_seconds: float = Field(
        default=60.0,
        gt=0,
        description="A worker's claim on a summary job lasts this long and is renewed while it "
        "runs; a job whose process died is taken by any replica once it expires.",
    )
    job_max_attempts: int = Field(
        default=3,
        ge=1,
        description="Attempts at a summary job (failures and lost workers) before it fails for "
        "good, its error kept in the job's status; retries back off 1 s, 2 s, 4 s, ...",
    )
    run_sweep_interval_seconds: float = Field(
        default=3600.0,
        ge=0,
        description="How often the service sweeps, in its own tenant and every tenant with an "
        "API key: finished runs past run_retention_days, and what each tenant's retention "
        "says is expired (0: never; run `tiermem sweep`).",
    )
    index_check_interval_seconds: float = Field(
        default=300.0,
        ge=0,
        description="How often the service compares each tenant's vector index with the KV "
        "store (missing, stale and orphaned vectors), at startup and then periodically; the "
        "result is in /readyz and /metrics (0: never; run `tiermem reindex --check`).",
    )
    index_repair_batch: int = Field(
        default=500,
        ge=0,
        description="Sessions and items per tenant the service re-indexes from the KV store "
        "after each index check that finds damage, without a restart (0: report only; "
        "repair with `tiermem reindex --all-tenants`).",
    )
    job_retention_seconds: float = Field(
        default=3600.0, gt=0, description="How long a finished background job's status is kept."
    )
    shutdown_timeout_seconds: float = Field(
        default=30.0,
        gt=0,
        description="Graceful shutdown: time allowed for in-flight requests, then again for "
        "running background summaries (a job not finished by then stays queued in the store "
        "for any replica to run).",
    )
    header_timeout_seconds: float = Field(
        default=10.0,
        gt=0,
        description="A connection must send a request's whole head (request line and headers) "
        "within this time after it connects or starts the request, or it is closed (408).",
    )
    keep_alive_timeout_seconds: float = Field(
        default=5.0, gt=0, description="An idle keep-alive connection is closed after this time."
    )
    service_embedder_threads: int = Field(
        default=1,
        ge=1,
        description="onnxruntime threads per call of the local embedding model in `tiermem serve`: "
        "with many requests at once, one thread per call gives the most recalls per second.",
    )
    access_log: bool = Field(default=True, description="One JSON log line per HTTP request.")
    log_level: Literal["critical", "error", "warning", "info", "debug"] = Field(
        default="info", description="Log level of `tiermem serve`."
    )

    @field_validator("redact_patterns")
    @classmethod
    def _patterns_compile(cls, value: dict[str, str]) -> dict[str, str]:
        try:
            check_patterns(value)
        except InvalidInputError as exc:
            raise ValueError(str(exc)) from exc
        return value

    @model_validator(mode="after")
    def _one_master_key(self) -> Settings:
        if self.master_key is not None and self.master_key_file is not None:
            raise ValueError(
                "master_key and master_key_file are both set: give the master key one way"
            )
        if self.master_key is not None:
            from tiers.backends.encrypted_kv import MasterKey

            try:
                MasterKey.from_text(self.master_key.get_secret_value())
            except InvalidInputError as exc:
                raise ValueError(str(exc)) from exc
        return self

    def encryption_key(self) -> MasterKey | None:
        """The master key of encryption at rest (``master_key`` or ``master_key_file``), or ``None``.

        Raises:
            InvalidInputError: The key file cannot be read or holds no key (``field`` names it).
        """
        from tiers.backends.encrypted_kv import MasterKey

        if self.master_key is not None:
            return MasterKey.from_text(self.master_key.get_secret_value())
        if self.master_key_file is not None:
            return MasterKey.from_file(self.master_key_file)
        return None

    @model_validator(mode="after")
    def _flush_interval_needs_non_durable(self) -> Settings:
        if self.flush_interval is not None and self.durable:
            raise ValueError(
                "flush_interval is the bounded-durability mode: set durable=false with it "
                "(TIERMEM_DURABLE=false), or unset it to fsync every commit"
            )
        return self

    def retention_policy(self) -> RetentionPolicy:
        """The default retention these settings name (``retention_*_days``; unset: kept forever)."""
        from tiers.retention import RetentionPolicy

        def days(value: float | None) -> timedelta | None:
            return None if value is None else timedelta(days=value)

        return RetentionPolicy(
            sessions=days(self.retention_sessions_days),
            transcripts=days(self.retention_transcripts_days),
            facts=days(self.retention_facts_days),
            idle_runs=days(self.retention_idle_runs_days),
        )

    def kv_location(self) -> str:
        """The KV store's URL or path: ``kv_url``, else the SQLite file in ``data_dir``."""
        return self.kv_url or str(self.data_dir / "tiermem.sqlite3")
