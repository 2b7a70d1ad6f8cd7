"""Prometheus metrics of one app instance.

Each app has its own :class:`~prometheus_client.CollectorRegistry`, so several
apps in one process (tests) never clash and ``/metrics`` shows only this app.
The registry is the library's (:class:`~memory.metrics.TiermemMetrics`): the
service's families sit beside the library's, and where both measure the same
thing (recall, context assembly) the service observes the library's family.
"""

from __future__ import annotations

from collections.abc import Callable

from prometheus_client import (
    CONTENT_TYPE_LATEST,
    Counter,
    Gauge,
    Histogram,
    generate_latest,
)

from memory.metrics import LATENCY_BUCKETS, TiermemMetrics
from tiers.index_check import IndexRepair, IndexReport
from tiers.models import SummaryUsage
from tiers.retention import SweepReport


class Metrics:
    """The service's metrics.

    Args:
        library: The library's families (the memory's ``metrics``), whose registry this
            adds the service's families to; default: new ones.

    Attributes:
        library: The library's families (task tier, recall, context, summarizer).
        registry: The registry ``/metrics`` renders.
        requests: HTTP request latency per method, route template and status.
        in_flight: HTTP requests being handled.
        recall: Latency of session recall (the library's family).
        context: Latency of continuation-context assembly (the library's family).
        checkpoint_commit: Latency of the append-checkpoint operation as the service
            serves it (the library's ``tiermem_checkpoint_commit_latency_seconds`` is
            the store commit alone).
        summaries: Transcripts summarized, by outcome.
        summarizer_failures: Failed summarizations, by error class.
        summarizer_tokens: Model tokens spent on summaries, by kind (prompt/completion).
        summarizer_cost: US dollars spent on summaries (where litellm knows the price).
        retention_deleted: Records the retention sweeps deleted, by kind.
        index_missing: Vectors the KV store says are indexed but the index lacks, per tenant.
        index_stale: Vectors made from content the KV store no longer holds, per tenant.
        index_orphans: Vectors with no record behind them, per tenant.
        index_repaired: Sessions and items re-indexed, and stray vectors deleted, by kind.
        index_checked: When the last index check of every tenant finished (Unix time).
        job_attempts: Summary job attempts this process ended, by outcome.
    """

    def __init__(self, library: TiermemMetrics | None = None) -> None:
        self.library = library if library is not None else TiermemMetrics()
        self.registry = self.library.registry
        r = self.registry
        self.requests = Histogram(
            "tiermem_http_request_duration_seconds",
            "HTTP request latency by method, route template and status code.",
            ["method", "route", "status"],
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.in_flight = Gauge(
            "tiermem_http_requests_in_flight", "HTTP requests being handled.", registry=r
        )
        self.recall = self.library.recall
        self.context = self.library.context
        self.checkpoint_commit = Histogram(
            "tiermem_checkpoint_commit_duration_seconds",
            "Latency of appending a checkpoint to a run.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.summaries = Counter(
            "tiermem_summaries", "Transcripts summarized, by outcome.", ["outcome"], registry=r
        )
        self.summarizer_failures = Counter(
            "tiermem_summarizer_failures",
            "Failed summarizations, by error class.",
            ["error"],
            registry=r,
        )
        self.summarizer_tokens = Counter(
            "tiermem_summarizer_tokens",
            "Model tokens spent on summaries, by kind.",
            ["kind"],
            registry=r,
        )
        self.summarizer_cost = Counter(
            "tiermem_summarizer_cost_usd",
            "US dollars spent on summaries (models with a known price).",
            registry=r,
        )
        self.retention_deleted = Counter(
            "tiermem_retention_deleted",
            "Records deleted by retention sweeps, by kind (finished_runs, idle_runs, sessions, "
            "transcripts, facts).",
            ["kind"],
            registry=r,
        )
        self.job_attempts = Counter(
            "tiermem_summary_job_attempts",
            "Summary job attempts this process ended, by outcome (succeeded, retried, failed: "
            "for good, lost: its lease was taken over or the job erased, released: given back "
            "at shutdown).",
            ["outcome"],
            registry=r,
        )
        self.index_missing = Gauge(
            "tiermem_index_missing_vectors",
            "Vectors the KV store says are indexed but the vector index lacks (last check).",
            ["tenant"],
            registry=r,
        )
        self.index_stale = Gauge(
            "tiermem_index_stale_vectors",
            "Vectors in the index made from content the KV store no longer holds (last check).",
            ["tenant"],
            registry=r,
        )
        self.index_orphans = Gauge(
            "tiermem_index_orphan_vectors",
            "Vectors in the index with no record in the KV store (last check).",
            ["tenant"],
            registry=r,
        )
        self.index_repaired = Counter(
            "tiermem_index_repaired",
            "Repairs of the vector index from the KV store, by kind (sessions, items, strays).",
            ["kind"],
            registry=r,
        )
        self.index_checked = Gauge(
            "tiermem_index_check_timestamp_seconds",
            "When the last index check of every tenant finished (Unix time).",
            registry=r,
        )
        self._jobs_pending = Gauge(
            "tiermem_session_jobs_pending",
            "Background summaries queued or running, every tenant's (read from the store).",
            registry=r,
        )
        self._outbox = Gauge(
            "tiermem_session_outbox_backlog",
            "Session index updates not yet confirmed (tenants this process has served).",
            registry=r,
        )

    def watch(
        self, *, jobs_pending: Callable[[], float], outbox_backlog: Callable[[], float]
    ) -> None:
        """Read the gauges that are computed at scrape time from these callbacks."""
        self._jobs_pending.set_function(jobs_pending)
        self._outbox.set_function(outbox_backlog)

    def summarized(self, usage: SummaryUsage | None) -> None:
        """Count one successful summarization and what it cost."""
        self.summaries.labels(outcome="succeeded").inc()
        if usage is not None:
            self.summarizer_tokens.labels(kind="prompt").inc(usage.prompt_tokens)
            self.summarizer_tokens.labels(kind="completion").inc(usage.completion_tokens)
            if usage.cost_usd:
                self.summarizer_cost.inc(usage.cost_usd)

    def summarizer_failed(self, exc: BaseException) -> None:
        """Count one failed summarization."""
        self.summaries.labels(outcome="failed").inc()
        self.summarizer_failures.labels(error=type(exc).__name__).inc()

    def job_outcome(self, outcome: str) -> None:
        """Count one summary job attempt that ended with ``outcome``."""
        self.job_attempts.labels(outcome=outcome).inc()

    def swept(self, report: SweepReport) -> None:
        """Count what one tenant's retention sweep deleted."""
        for kind in ("finished_runs", "idle_runs", "sessions", "transcripts", "facts"):
            self.retention_deleted.labels(kind=kind).inc(getattr(report, kind))

    def index_checked_tenant(self, report: IndexReport) -> None:
        """Show the latest index check of one tenant."""
        self.index_missing.labels(tenant=report.tenant).set(report.missing)
        self.index_stale.labels(tenant=report.tenant).set(report.stale)
        self.index_orphans.labels(tenant=report.tenant).set(report.orphans)

    def index_repaired_tenant(self, repair: IndexRepair) -> None:
        """Count what one tenant's index repair did."""
        self.index_repaired.labels(kind="sessions").inc(repair.sessions)
        self.index_repaired.labels(kind="items").inc(repair.items)
        self.index_repaired.labels(kind="strays").inc(repair.deleted)

    def render(self) -> tuple[bytes, str]:
        """The exposition text and its content type."""
        return generate_latest(self.registry), CONTENT_TYPE_LATEST
