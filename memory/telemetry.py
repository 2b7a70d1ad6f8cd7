"""OpenTelemetry for tiermem: live spans of the task tier, and a run's checkpoint DAG as a trace.

Three parts:

- :class:`TracingObserver`, a :class:`~tiers.task.TaskObserver` that turns what the
  task tier reports into spans: ``tiermem.run`` when a worker takes a run (start or
  resume), with ``tiermem.step`` / ``tiermem.effect`` children for every step executed,
  effect recorded and checkpoint replayed instead of re-executed (``tiermem.replayed``),
  and ``tiermem.fenced`` / ``tiermem.effect.unknown`` / ``tiermem.run.refused`` for the
  failures. Every span of a run is in one trace whose id is derived from the run id
  (as :func:`run_trace`'s), under the run's derived span id: the spans of a run's
  first worker, of the worker that resumed it after a crash, and the exported DAG
  join up. It needs the ``otel`` extra (``pip install 'tiermem[otel]'``:
  ``opentelemetry-api``); without it, or without a configured tracer provider, every
  span is a no-op and nothing changes.
- :func:`run_trace`, which writes a run's checkpoint DAG (every branch, and the runs
  forked from it) as an OTLP JSON trace (``resourceSpans`` / ``scopeSpans`` /
  ``spans``), with ids derived deterministically from the run and checkpoint ids,
  so exporting twice gives the same trace. It needs no extra.
- :func:`operation_span`, the spans of the session operations (``tiermem.session.*``:
  save, end, summarize, recall, context), sent to the global tracer provider. Without
  the extra, or before the app configures a provider, it does nothing at all.

Spans carry ids, names and counts only: run id, step name, checkpoint id, idempotency
key, tenant, user and session ids, lease epoch, result and token counts. Never content:
no transcript, summary, query, state value or step output.
"""

from __future__ import annotations

import functools
import hashlib
import time
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import datetime
from types import ModuleType
from typing import TYPE_CHECKING, Any

from tiers.models import Checkpoint, RunInfo

if TYPE_CHECKING:
    from opentelemetry.context import Context
    from opentelemetry.trace import Span, Tracer, TracerProvider

    from memory.core import Memory

__all__ = [
    "SpanAttributes",
    "TracingObserver",
    "operation_span",
    "run_context",
    "run_span_id",
    "run_trace",
    "run_trace_id",
]

SCOPE = "tiermem"
_RUNS_KEPT = 4096


def _hex(text: str, length: int) -> str:
    return hashlib.sha256(text.encode()).hexdigest()[:length]


def run_trace_id(run_id: str) -> str:
    """The trace id (32 hex digits) of every span of ``run_id``, live or exported."""
    return _hex(f"trace:{run_id}", 32)


def run_span_id(run_id: str) -> str:
    """The span id (16 hex digits) of ``run_id`` itself: the parent of its live spans."""
    return _hex(f"run:{run_id}", 16)


def run_context(run_id: str) -> Context:
    """An OpenTelemetry context whose current span is ``run_id``'s derived span.

    A span started in it belongs to the run's trace, whichever process starts
    it. The span is marked sampled, so a parent-based sampler keeps the run's spans.
    """
    from opentelemetry import trace

    run = trace.SpanContext(
        trace_id=int(run_trace_id(run_id), 16),
        span_id=int(run_span_id(run_id), 16),
        is_remote=True,
        trace_flags=trace.TraceFlags(trace.TraceFlags.SAMPLED),
    )
    return trace.set_span_in_context(trace.NonRecordingSpan(run))


def _tracer(provider: TracerProvider | None) -> Tracer:
    try:
        from opentelemetry import trace
    except ImportError as exc:  # the extra is missing: say which one
        raise ImportError(
            "tracing needs OpenTelemetry: pip install 'tiermem[otel]' (opentelemetry-api)"
        ) from exc
    return trace.get_tracer(SCOPE, tracer_provider=provider)


class TracingObserver:
    """A task tier observer that emits OpenTelemetry spans (see the module docstring).

    Args:
        tenant: The tenant of the task tier it observes (a span attribute).
        tracer_provider: Where spans go; default: the global provider (a no-op
            until the app configures one).

    Raises:
        ImportError: ``opentelemetry-api`` is not installed (the ``otel`` extra).
    """

    def __init__(self, *, tenant: str = "default", tracer_provider: TracerProvider | None = None):
        self.tenant = tenant
        self._tracer = _tracer(tracer_provider)
        # The span of each run's latest take: replays and fencing of the run are its children.
        self._runs: dict[str, Span] = {}

    def _span(
        self,
        name: str,
        run_id: str,
        attrs: dict[str, Any] | None = None,
        seconds: float = 0.0,
        *,
        under_take: bool = True,
    ) -> Span:
        from opentelemetry import trace

        # Under this process's take of the run when there is one, else under the run itself.
        parent = self._runs.get(run_id) if under_take else None
        context = run_context(run_id) if parent is None else trace.set_span_in_context(parent)
        start = time.time_ns() - int(seconds * 1e9)
        attributes = {"tiermem.run_id": run_id, "tiermem.tenant": self.tenant, **(attrs or {})}
        span = self._tracer.start_span(
            name, context=context, attributes=attributes, start_time=start
        )
        span.end()
        return span

    def committed(self, seconds: float, written_bytes: int) -> None:
        """Commits are metrics, not spans (the step and effect spans cover them)."""

    def flushed(self, seconds: float) -> None:
        """Flushes are metrics, not spans."""

    def run_taken(
        self, run_id: str, *, resumed: bool, takeover: bool, compensation: bool, seconds: float
    ) -> None:
        """A ``tiermem.run`` span: the take of the run's lease."""
        if len(self._runs) >= _RUNS_KEPT:  # a long-lived process: forget the oldest run
            self._runs.pop(next(iter(self._runs)))
        self._runs[run_id] = self._span(
            "tiermem.run",
            run_id,
            {
                "gen_ai.operation.name": "invoke_agent",
                "tiermem.resumed": resumed,
                "tiermem.takeover": takeover,
                "tiermem.compensation": compensation,
            },
            seconds,
            under_take=False,
        )

    def take_refused(self, run_id: str) -> None:
        """A ``tiermem.run.refused`` span: another worker holds the live lease."""
        self._span("tiermem.run.refused", run_id)

    def step_committed(
        self,
        run_id: str,
        step: str,
        seq: int,
        checkpoint_id: str,
        idempotency_key: str,
        seconds: float,
    ) -> None:
        """A ``tiermem.step`` span: a step executed, from its start to its commit."""
        self._span(
            "tiermem.step",
            run_id,
            {
                "tiermem.replayed": False,
                "tiermem.checkpoint.kind": "step",
                "tiermem.step": step,
                "tiermem.seq": seq,
                "tiermem.checkpoint_id": checkpoint_id,
                "tiermem.idempotency_key": idempotency_key,
            },
            seconds,
        )

    def effect_recorded(
        self, run_id: str, key: str, name: str, kind: str, source: str, seconds: float
    ) -> None:
        """A ``tiermem.effect`` span: an effect invoked and its result recorded (a tool call)."""
        self._span(
            "tiermem.effect",
            run_id,
            {
                "gen_ai.operation.name": "execute_tool",
                "gen_ai.tool.name": name,
                "tiermem.replayed": False,
                "tiermem.effect.name": name,
                "tiermem.effect.kind": kind,
                "tiermem.effect.source": source,
                "tiermem.idempotency_key": key,
            },
            seconds,
        )

    def replayed(self, run_id: str, kind: str, idempotency_key: str) -> None:
        """A ``tiermem.step`` (or ``tiermem.effect``) span: a checkpoint replayed."""
        name = "tiermem.effect" if kind == "effect" else "tiermem.step"
        self._span(
            name,
            run_id,
            {
                "tiermem.replayed": True,
                "tiermem.checkpoint.kind": kind,
                "tiermem.idempotency_key": idempotency_key,
            },
        )

    def validation_failed(self, operation: str) -> None:
        """Refused replays are metrics (the error reaches the caller's own span)."""

    def fenced(self, run_id: str) -> None:
        """A ``tiermem.fenced`` span: a write refused because the run was taken over."""
        self._span("tiermem.fenced", run_id)

    def unknown_effect(self, run_id: str, count: int) -> None:
        """A ``tiermem.effect.unknown`` span: effects invoked but never recorded."""
        self._span("tiermem.effect.unknown", run_id, {"tiermem.effects": count})

    def compensation_depth(self, depth: int) -> None:
        """The compensation depth is a metric."""

    def swept(self, runs: int) -> None:
        """Sweeps are metrics."""

    def approval(self, run_id: str, key: str, status: str) -> None:
        """A ``tiermem.approval`` span: a gate requested, granted or rejected."""
        attrs = {"tiermem.approval.key": key, "tiermem.approval.status": status}
        self._span("tiermem.approval", run_id, attrs)


# -- spans of the session operations ----------------------------------------------------------

SpanAttributes = dict[str, str | int | float | bool]
"""A span's attributes: ids, names and counts (OpenTelemetry's scalar attribute types)."""


@functools.cache
def _trace_api() -> ModuleType | None:
    try:
        from opentelemetry import trace
    except ImportError:  # no otel extra: the session operations are not traced
        return None
    return trace


@functools.lru_cache(maxsize=8)
def _provider_tracer(provider: TracerProvider) -> Tracer:
    return provider.get_tracer(SCOPE)


def _global_tracer() -> Tracer | None:
    """The tracer of the app's global provider; ``None`` without the extra or a provider."""
    trace = _trace_api()
    if trace is None:
        return None
    provider = trace.get_tracer_provider()
    if isinstance(provider, trace.ProxyTracerProvider | trace.NoOpTracerProvider):
        return None  # none configured yet: not even a no-op span is made
    return _provider_tracer(provider)


@contextmanager
def operation_span(name: str, attributes: SpanAttributes) -> Iterator[SpanAttributes]:
    """Trace the operation in the ``with`` block as span ``name`` of the global provider.

    Yields ``attributes`` itself: what the block adds to it (result and token
    counts) is set on the span when the block ends. An exception raised in the
    block sets the span's status to ERROR and ``error.type`` to its class name
    (not its message, which might quote input) and is raised unchanged.
    Without the ``otel`` extra, or without a configured tracer provider,
    nothing is traced.

    Args:
        name: The span's name (``tiermem.session.recall``, ...).
        attributes: Its attributes so far: ids and numbers only, never content.
    """
    tracer = _global_tracer()
    if tracer is None:
        yield attributes
        return
    from opentelemetry.trace import Status, StatusCode  # there: a tracer was found

    with tracer.start_as_current_span(
        name, attributes=attributes, record_exception=False, set_status_on_exception=False
    ) as span:
        try:
            yield attributes
        except BaseException as exc:
            span.set_attribute("error.type", type(exc).__qualname__)
            span.set_status(Status(StatusCode.ERROR, type(exc).__qualname__))
            raise
        span.set_attributes(attributes)


# -- export of a run's checkpoint DAG ---------------------------------------------------------


def _nanos(at: datetime | None) -> str:
    return "0" if at is None else str(int(at.timestamp() * 1_000_000_000))


def _attributes(values: dict[str, str | int]) -> list[dict[str, Any]]:
    return [
        {"key": k, "value": {"intValue": str(v)} if isinstance(v, int) else {"stringValue": v}}
        for k, v in values.items()
    ]


def run_trace(memory: Memory, run_id: str) -> dict[str, Any]:
    """A run's checkpoint DAG as an OTLP JSON trace (see the module docstring).

    The trace id is derived from ``run_id``; each run gets a ``tiermem.run`` span,
    each checkpoint a ``tiermem.<kind>`` span whose parent is its parent
    checkpoint's (the run's span for the first), and each run forked from a
    checkpoint hangs under that checkpoint's span, with its own checkpoints.

    Raises:
        RunNotFoundError: No such run.
    """
    trace_id = run_trace_id(run_id)
    spans = list(_run_spans(memory, memory.get_run(run_id), trace_id, parent=""))
    return {
        "resourceSpans": [
            {
                "resource": {
                    "attributes": _attributes(
                        {"service.name": "tiermem", "tiermem.tenant": memory.tenant}
                    )
                },
                "scopeSpans": [{"scope": {"name": SCOPE}, "spans": spans}],
            }
        ]
    }


def _run_spans(
    memory: Memory, info: RunInfo, trace_id: str, parent: str
) -> Iterator[dict[str, Any]]:
    run_span = run_span_id(info.run_id)
    checkpoints = memory.run_history(info.run_id)
    end = info.finished_at or info.updated_at
    yield {
        "traceId": trace_id,
        "spanId": run_span,
        "parentSpanId": parent,
        "name": "tiermem.run",
        "kind": 1,
        "startTimeUnixNano": _nanos(info.created_at),
        "endTimeUnixNano": _nanos(end),
        "attributes": _attributes(
            {
                "gen_ai.operation.name": "invoke_agent",
                "tiermem.run_id": info.run_id,
                "tiermem.user_id": info.user_id,
                "tiermem.status": info.status.value,
                "tiermem.lease_epoch": info.lease_epoch,
                "tiermem.tenant": memory.tenant,
            }
        ),
        "status": {"code": 2 if info.status.value == "failed" else 0},
    }
    forks = [r for r in memory.list_runs() if r.parent_run_id == info.run_id]
    for ckpt in checkpoints:
        span_id = _checkpoint_span(ckpt)
        yield {
            "traceId": trace_id,
            "spanId": span_id,
            "parentSpanId": run_span if ckpt.parent_id is None else _parent_span(ckpt),
            "name": f"tiermem.{ckpt.kind}",
            "kind": 1,
            "startTimeUnixNano": _nanos(ckpt.started_at),
            "endTimeUnixNano": _nanos(ckpt.created_at),
            "attributes": _attributes(
                {
                    "tiermem.run_id": info.run_id,
                    "tiermem.step": ckpt.step,
                    "tiermem.seq": ckpt.seq,
                    "tiermem.checkpoint_id": ckpt.checkpoint_id,
                    "tiermem.idempotency_key": ckpt.idempotency_key,
                    "tiermem.in_lineage": "yes" if info.in_lineage(ckpt.seq) else "superseded",
                    "tiermem.tenant": memory.tenant,
                }
            ),
            "status": {"code": 0},
        }
        for fork in forks:
            if fork.parent_checkpoint_id == ckpt.checkpoint_id:
                yield from _run_spans(memory, fork, trace_id, parent=span_id)


def _checkpoint_span(ckpt: Checkpoint) -> str:
    return _hex(f"ckpt:{ckpt.run_id}:{ckpt.checkpoint_id}", 16)


def _parent_span(ckpt: Checkpoint) -> str:
    return _hex(f"ckpt:{ckpt.run_id}:{ckpt.parent_id}", 16)
