"""Prometheus metrics of the library: :class:`TiermemMetrics`, the task tier's observer.

Pass one to :class:`~memory.Memory` (``Memory(..., metrics=TiermemMetrics())``,
``Memory.open(dir, metrics=...)``, ``Memory.from_settings(settings, metrics=...)``)
and scrape :attr:`TiermemMetrics.registry`. Each instance has its own
:class:`~prometheus_client.CollectorRegistry` unless one is passed in, so two
memories in one process never collide on the global registry. The HTTP service
exposes the same families on ``/metrics`` beside its own (``api.metrics``).

The task tier never imports ``prometheus_client``: it calls the
:class:`~tiers.task.TaskObserver` methods this class implements.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from prometheus_client import CollectorRegistry, Counter, Gauge, Histogram

from tiers.task import TaskObserver

__all__ = ["LATENCY_BUCKETS", "TiermemMetrics"]

LATENCY_BUCKETS = (0.001, 0.0025, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0, 2.5, 5.0, 10.0)


class TiermemMetrics:
    """The library's metric families, and the task tier observer that feeds them.

    Args:
        registry: Where the families are registered; default: a new private registry.
        forward_to: Other observers the task tier's reports are passed on to, e.g. a
            :class:`memory.telemetry.TracingObserver` for spans.

    Attributes:
        registry: The registry to scrape (``prometheus_client.generate_latest(registry)``).
        checkpoint_commit: Latency of one atomic commit of a run (checkpoint, events, head).
        buffer_drain: Latency of draining buffered commits (bounded durability's flush).
        checkpoint_bytes: Bytes of values the task tier's commits wrote.
        recovery_attempts: Takes of an existing run, by action: ``replay`` (resumed, its
            committed steps replay), ``compensate`` (taken to undo its effects), ``fail``
            (refused: another worker holds a live lease).
        recovery_duration: How long taking an existing run's lease took.
        runs_resumed: Runs resumed (an existing run taken to continue, not to compensate).
        replays: Committed checkpoints replayed instead of re-executed (idempotency hits), by kind.
        validation_failures: Replays refused because the step name, input or effect request
            differs from the record, by operation (the checkpoint kind, or ``effect``).
        lease_takeovers: Runs taken from another worker (its lease expired or was stolen).
        fenced_writes: Writes refused because the run was taken over (``StaleWriterError``).
        unknown_effects: Effects found invoked but never recorded (unknown outcome).
        compensations_pending: Compensations still to run in the compensation under way.
        swept_runs: Finished or idle runs deleted by retention sweeps.
        approvals: Approval gates requested, granted and rejected, by status.
        scope_violations: Memory scope refusals, by kind (:meth:`scope_violation`): what a
            :class:`~memory.scope.ScopeManager` given ``metrics=`` refused, or what the app reports.
        recall: Latency of session recall.
        context: Latency of continuation-context assembly.
        summarizer: Latency of one summarization.
    """

    def __init__(
        self, registry: CollectorRegistry | None = None, *, forward_to: Sequence[TaskObserver] = ()
    ) -> None:
        self.forward_to = tuple(forward_to)
        self.registry = registry if registry is not None else CollectorRegistry(auto_describe=True)
        r = self.registry
        self.checkpoint_commit = Histogram(
            "tiermem_checkpoint_commit_latency_seconds",
            "Latency of one atomic commit of a run (checkpoint, events, head).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.buffer_drain = Histogram(
            "tiermem_checkpoint_buffer_drain_latency_seconds",
            "Latency of draining buffered commits to durable storage (bounded durability).",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.checkpoint_bytes = Counter(
            "tiermem_checkpoint_storage_bytes",
            "Bytes of values written by the task tier's commits.",
            registry=r,
        )
        self.recovery_attempts = Counter(
            "tiermem_recovery_attempts",
            "Takes of an existing run by action: replay (resume), compensate, fail (refused).",
            ["action"],
            registry=r,
        )
        self.recovery_duration = Histogram(
            "tiermem_recovery_duration_seconds",
            "How long taking an existing run's lease (resume or compensation) took.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.runs_resumed = Counter(
            "tiermem_runs_resumed", "Existing runs taken to continue them.", registry=r
        )
        self.replays = Counter(
            "tiermem_step_replays",
            "Committed checkpoints replayed instead of re-executed (idempotency hits), by kind.",
            ["kind"],
            registry=r,
        )
        self.validation_failures = Counter(
            "tiermem_effect_validation_failures",
            "Replays refused: step name, input or effect request differs from the record.",
            ["operation"],
            registry=r,
        )
        self.lease_takeovers = Counter(
            "tiermem_lease_takeovers",
            "Runs taken from another worker (expired or stolen lease).",
            registry=r,
        )
        self.fenced_writes = Counter(
            "tiermem_fenced_writes",
            "Writes refused because the run was taken over (StaleWriterError).",
            registry=r,
        )
        self.unknown_effects = Counter(
            "tiermem_unknown_outcome_effects",
            "Effects found invoked but never recorded (unknown outcome).",
            registry=r,
        )
        self.compensations_pending = Gauge(
            "tiermem_compensation_depth_current",
            "Compensations still to run in the compensation under way.",
            registry=r,
        )
        self.swept_runs = Counter(
            "tiermem_sweep_deleted_runs", "Runs deleted by retention sweeps.", registry=r
        )
        self.approvals = Counter(
            "tiermem_approvals",
            "Approval gates requested, granted and rejected, by status.",
            ["status"],
            registry=r,
        )
        self.scope_violations = Counter(
            "tiermem_memory_scope_violations",
            "Memory scope refusals by kind: read_only, token_budget, prompt_budget, "
            "invalid_input, invalid_snapshot (a ScopeManager's), or app (reported by the app).",
            ["kind"],
            registry=r,
        )
        self.recall = Histogram(
            "tiermem_recall_duration_seconds",
            "Latency of session recall.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.context = Histogram(
            "tiermem_context_duration_seconds",
            "Latency of continuation-context assembly.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.summarizer = Histogram(
            "tiermem_summarizer_duration_seconds",
            "Latency of one summarization.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        # The worker fleet (memory.workers.Worker, `tiermem worker`), fed by the worker itself:
        # runs claimed, runs finished by outcome, runs active, one poll's latency, idle time.
        self.worker_runs_claimed = Counter(
            "tiermem_worker_runs_claimed",
            "Runs a worker took (leased) to drive.",
            registry=r,
        )
        self.worker_runs_finished = Counter(
            "tiermem_worker_runs_finished",
            "Runs a worker stopped driving, by outcome: completed, failed, drained (released "
            "on SIGTERM), released (paused, blocked, lost its lease, or the store failed).",
            ["outcome"],
            registry=r,
        )
        self.worker_runs_active = Gauge(
            "tiermem_worker_runs_active",
            "Runs a worker is driving now.",
            registry=r,
        )
        self.worker_claim = Histogram(
            "tiermem_worker_claim_duration_seconds",
            "How long one poll for work took (listing resumable runs, taking one), either way.",
            buckets=LATENCY_BUCKETS,
            registry=r,
        )
        self.worker_idle = Counter(
            "tiermem_worker_idle_seconds",
            "Seconds the worker's claim loops waited between polls, finding nothing to take.",
            registry=r,
        )

    def serve(self, port: int, addr: str = "127.0.0.1") -> Callable[[], None]:
        """Serve :attr:`registry` on ``http://addr:port/metrics`` from a daemon thread.

        For a process with no HTTP service of its own (``tiermem worker --metrics-port``).

        Returns:
            A function that stops the server and frees the port.

        Raises:
            OSError: The address cannot be bound (the port is taken, say).
        """
        # Only a process without the HTTP service serves metrics this way.
        from prometheus_client import start_http_server

        server, thread = start_http_server(port, addr=addr, registry=self.registry)

        def stop() -> None:
            server.shutdown()
            server.server_close()
            thread.join()

        return stop

    def scope_violation(self, kind: str = "app") -> None:
        """Count one memory scope violation of ``kind``.

        A :class:`~memory.scope.ScopeManager` given ``metrics=`` calls it for each
        refusal (``read_only``, ``token_budget``, ...); an app may call it for a read
        or write outside the scope it granted (default kind ``app``).
        """
        self.scope_violations.labels(kind=kind).inc()

    # -- TaskObserver ---------------------------------------------------------------------------

    def committed(self, seconds: float, written_bytes: int) -> None:
        """Observe one commit of a run."""
        self.checkpoint_commit.observe(seconds)
        self.checkpoint_bytes.inc(written_bytes)
        for observer in self.forward_to:
            observer.committed(seconds, written_bytes)

    def flushed(self, seconds: float) -> None:
        """Observe one drain of buffered commits."""
        self.buffer_drain.observe(seconds)
        for observer in self.forward_to:
            observer.flushed(seconds)

    def run_taken(
        self, run_id: str, *, resumed: bool, takeover: bool, compensation: bool, seconds: float
    ) -> None:
        """Count a taken lease: a recovery attempt when the run existed."""
        for observer in self.forward_to:
            observer.run_taken(
                run_id,
                resumed=resumed,
                takeover=takeover,
                compensation=compensation,
                seconds=seconds,
            )
        if not resumed:
            return
        self.recovery_attempts.labels(action="compensate" if compensation else "replay").inc()
        self.recovery_duration.observe(seconds)
        if not compensation:
            self.runs_resumed.inc()
        if takeover:
            self.lease_takeovers.inc()

    def take_refused(self, run_id: str) -> None:
        """Count a recovery attempt that could not take the run."""
        self.recovery_attempts.labels(action="fail").inc()
        for observer in self.forward_to:
            observer.take_refused(run_id)

    def step_committed(
        self,
        run_id: str,
        step: str,
        seq: int,
        checkpoint_id: str,
        idempotency_key: str,
        seconds: float,
    ) -> None:
        """Pass an executed step on (its commit is counted by :meth:`committed`)."""
        for observer in self.forward_to:
            observer.step_committed(run_id, step, seq, checkpoint_id, idempotency_key, seconds)

    def effect_recorded(
        self, run_id: str, key: str, name: str, kind: str, source: str, seconds: float
    ) -> None:
        """Pass a recorded effect on (its commits are counted by :meth:`committed`)."""
        for observer in self.forward_to:
            observer.effect_recorded(run_id, key, name, kind, source, seconds)

    def replayed(self, run_id: str, kind: str, idempotency_key: str) -> None:
        """Count one replayed checkpoint."""
        self.replays.labels(kind=kind).inc()
        for observer in self.forward_to:
            observer.replayed(run_id, kind, idempotency_key)

    def validation_failed(self, operation: str) -> None:
        """Count one refused replay."""
        self.validation_failures.labels(operation=operation).inc()
        for observer in self.forward_to:
            observer.validation_failed(operation)

    def fenced(self, run_id: str) -> None:
        """Count one fenced write."""
        self.fenced_writes.inc()
        for observer in self.forward_to:
            observer.fenced(run_id)

    def unknown_effect(self, run_id: str, count: int) -> None:
        """Count effects of unknown outcome."""
        self.unknown_effects.inc(count)
        for observer in self.forward_to:
            observer.unknown_effect(run_id, count)

    def compensation_depth(self, depth: int) -> None:
        """Show the compensations still to run."""
        self.compensations_pending.set(depth)
        for observer in self.forward_to:
            observer.compensation_depth(depth)

    def swept(self, runs: int) -> None:
        """Count runs a sweep deleted."""
        self.swept_runs.inc(runs)
        for observer in self.forward_to:
            observer.swept(runs)

    def approval(self, run_id: str, key: str, status: str) -> None:
        """Count an approval gate requested or decided."""
        self.approvals.labels(status=status).inc()
        for observer in self.forward_to:
            observer.approval(run_id, key, status)
