"""OpenTelemetry: spans of a SIGKILLed run resumed elsewhere, and a run's DAG exported as OTLP JSON."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from opentelemetry import trace
from opentelemetry.sdk.trace import ReadableSpan, TracerProvider
from opentelemetry.sdk.trace.export import SimpleSpanProcessor
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter
from opentelemetry.trace import StatusCode
from typer.testing import CliRunner

from memory import Memory
from memory.cli import app as cli
from memory.metrics import TiermemMetrics
from memory.settings import Settings
from memory.telemetry import TracingObserver, run_trace
from tests.memory import traced_worker
from tests.tiers.crash_worker import (
    USER,
    crash_frozen_worker,
    crash_when_stopped,
    open_store,
    run_to_end,
)
from tiers.errors import ApprovalPendingError, InvalidInputError
from tiers.task import TaskTier

ROOT = Path(__file__).resolve().parents[2]


def test_a_crash_and_resume_shows_as_run_step_and_effect_spans(tmp_path: Path) -> None:
    store, log, run_id = str(tmp_path / "kv.sqlite3"), tmp_path / "effects.log", "traced"
    # The dead worker's lease must still be live when the taker steals it (a takeover): 600 s,
    # since a loaded machine can take most of a minute to get there; nothing waits it out.
    crash_frozen_worker(store, run_id, log, "unit:4")  # a real crash

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    kv = open_store(store)
    try:
        tier = TaskTier(kv, observer=TracingObserver(tenant="default", tracer_provider=provider))
        outputs = run_to_end(tier, run_id, str(log), dedupe=True, worker_id="taker", steal=True)
    finally:
        kv.close()
    spans = exporter.get_finished_spans()
    (run,) = [s for s in spans if s.name == "tiermem.run"]
    assert run.attributes is not None
    assert run.attributes["tiermem.run_id"] == run_id
    assert run.attributes["tiermem.resumed"] is True
    assert run.attributes["tiermem.takeover"] is True
    assert run.attributes["tiermem.tenant"] == "default"
    replays = [s for s in spans if s.name in ("tiermem.step", "tiermem.effect")]
    assert {s.name for s in replays} == {"tiermem.step", "tiermem.effect"}
    for span in replays:
        assert span.parent is not None
        assert span.parent.span_id == run.context.span_id
        assert span.context.trace_id == run.context.trace_id
        assert span.attributes is not None
        assert str(span.attributes["tiermem.idempotency_key"]).startswith(f"{run_id}/")
    # Ids and names only: no output of any step or effect is in any span.
    dumped = json.dumps([dict(s.attributes or {}) for s in spans])
    assert "receipt" not in dumped
    assert "R-" not in dumped
    assert outputs


def _span_record(span: ReadableSpan) -> dict[str, Any]:
    """A finished span as the traced worker writes it (``ReadableSpan.to_json``)."""
    record: dict[str, Any] = json.loads(span.to_json(None))
    return record


def test_live_steps_and_effects_of_a_crashed_and_resumed_run_form_one_trace(
    tmp_path: Path,
) -> None:
    data = tmp_path / "data"
    store, spans_file, run_id = str(data / "tiermem.sqlite3"), tmp_path / "spans.jsonl", "shop"
    Memory.from_settings(Settings(data_dir=data)).close()  # the store file, in the data dir
    crash_when_stopped(
        "-m",
        "tests.memory.traced_worker",
        store,
        run_id,
        str(spans_file),
        what="the worker to stop after two units",
    )
    first = [json.loads(line) for line in spans_file.read_text().splitlines()]

    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = TracingObserver(tenant="default", tracer_provider=provider)
    metrics = TiermemMetrics(forward_to=[tracing])
    with Memory.from_settings(Settings(data_dir=data), metrics=metrics) as memory:
        run = memory.tasks.start_run(traced_worker.USER, run_id, worker_id="taker", steal=True)
        outputs = traced_worker.run_units(run)
        run.complete(result=None)
        exported = run_trace(memory, run_id)
    second = [_span_record(s) for s in exporter.get_finished_spans()]
    assert outputs[0] == {"plan": "secret plan"}

    def named(spans: list[dict[str, Any]], name: str) -> list[dict[str, Any]]:
        return [s for s in spans if s["name"] == name]

    # The crashed worker: its take, the step and the effect it executed.
    (take,) = named(first, "tiermem.run")
    assert take["attributes"]["tiermem.resumed"] is False
    (plan,) = named(first, "tiermem.step")
    assert plan["attributes"] == {
        "tiermem.run_id": run_id,
        "tiermem.tenant": "default",
        "tiermem.replayed": False,
        "tiermem.checkpoint.kind": "step",
        "tiermem.step": "plan",
        "tiermem.seq": 1,
        "tiermem.checkpoint_id": plan["attributes"]["tiermem.checkpoint_id"],
        "tiermem.idempotency_key": f"{run_id}/plan/0",
    }
    (pay,) = named(first, "tiermem.effect")
    assert pay["attributes"]["tiermem.effect.name"] == "pay"
    assert pay["attributes"]["gen_ai.tool.name"] == "pay"
    assert pay["attributes"]["tiermem.effect.source"] == "fn"
    assert pay["attributes"]["tiermem.replayed"] is False
    assert pay["attributes"]["tiermem.idempotency_key"] == f"{run_id}/effect:pay/0"

    # The worker that resumed it: a takeover, the two replays, then the rest live.
    (retake,) = named(second, "tiermem.run")
    assert retake["attributes"]["tiermem.resumed"] is True
    assert retake["attributes"]["tiermem.takeover"] is True
    replays = [s for s in second if s["attributes"].get("tiermem.replayed") is True]
    assert sorted((s["name"], s["attributes"]["tiermem.idempotency_key"]) for s in replays) == [
        ("tiermem.effect", f"{run_id}/effect:pay/0"),
        ("tiermem.step", f"{run_id}/plan/0"),
    ]
    (label,) = [s for s in named(second, "tiermem.effect") if s not in replays]
    assert label["attributes"]["tiermem.idempotency_key"] == f"{run_id}/ship/0/effect:label/0"
    (ship,) = [s for s in named(second, "tiermem.step") if s not in replays]
    assert ship["attributes"]["tiermem.step"] == "ship"
    assert ship["attributes"]["tiermem.seq"] == 3

    # One trace across both processes, the exported DAG's: the takes hang under the
    # run's derived span, everything else under the take of its own process.
    (otlp_run,) = [
        s
        for s in exported["resourceSpans"][0]["scopeSpans"][0]["spans"]
        if s["name"] == "tiermem.run"
    ]
    assert {s["context"]["trace_id"] for s in first + second} == {f"0x{otlp_run['traceId']}"}
    assert take["parent_id"] == retake["parent_id"] == f"0x{otlp_run['spanId']}"
    for spans, parent in ((first, take), (second, retake)):
        for span in spans:
            if span is not parent:
                assert span["parent_id"] == parent["context"]["span_id"], span["name"]
    assert plan["attributes"]["tiermem.checkpoint_id"] in json.dumps(exported)

    # The recovery metrics of the same resume.
    assert (
        metrics.registry.get_sample_value("tiermem_recovery_attempts_total", {"action": "replay"})
        == 1
    )
    assert metrics.registry.get_sample_value("tiermem_lease_takeovers_total") == 1
    assert metrics.registry.get_sample_value("tiermem_step_replays_total", {"kind": "step"}) == 1
    assert metrics.registry.get_sample_value("tiermem_step_replays_total", {"kind": "effect"}) == 1
    # Ids and names only: no output of any step or effect is in any span of either process.
    assert "secret" not in json.dumps(first + second)


def test_a_run_exports_as_a_deterministic_otlp_trace_with_its_forks(tmp_path: Path) -> None:
    with Memory.open(tmp_path / "data") as memory:
        run = memory.start_run("alice", "r1")
        run.step("plan", lambda: "secret plan")
        run.step("act", lambda: "secret act")
        first = memory.run_history("r1")[0]
        memory.fork_run("r1", first.checkpoint_id, "r1-fork")
        trace = run_trace(memory, "r1")
        assert run_trace(memory, "r1") == trace  # deterministic
    (resource,) = trace["resourceSpans"]
    (scope,) = resource["scopeSpans"]
    spans = scope["spans"]
    by_id = {s["spanId"]: s for s in spans}
    runs = [s for s in spans if s["name"] == "tiermem.run"]
    assert len(runs) == 2  # the run and its fork
    root = next(s for s in runs if s["parentSpanId"] == "")
    fork = next(s for s in runs if s["parentSpanId"])
    assert by_id[fork["parentSpanId"]]["name"] == "tiermem.step"  # hangs under its checkpoint
    assert {s["traceId"] for s in spans} == {root["traceId"]}
    assert len(root["traceId"]) == 32
    assert all(len(s["spanId"]) == 16 for s in spans)
    act = next(
        s
        for s in spans
        if {"key": "tiermem.step", "value": {"stringValue": "act"}} in s["attributes"]
    )
    assert by_id[act["parentSpanId"]]["name"] == "tiermem.step"  # parent checkpoint: plan
    assert "secret" not in json.dumps(trace)


def test_runs_export_prints_the_trace(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    data = tmp_path / "data"
    monkeypatch.setenv("TIERMEM_DATA_DIR", str(data))
    monkeypatch.delenv("TIERMEM_KV_URL", raising=False)
    monkeypatch.delenv("TIERMEM_VECTOR_URL", raising=False)
    with Memory.open(data) as memory:
        memory.start_run(USER, "r1").step("plan", lambda: 1)
    exported = CliRunner().invoke(cli, ["runs", "export", "r1"])
    assert exported.exit_code == 0, exported.output
    spans = json.loads(exported.output)["resourceSpans"][0]["scopeSpans"][0]["spans"]
    assert [s["name"] for s in spans] == ["tiermem.run", "tiermem.step"]


def test_memory_metrics_forward_to_tracing_approvals_included(tmp_path: Path) -> None:
    exporter = InMemorySpanExporter()
    provider = TracerProvider()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    tracing = TracingObserver(tenant="default", tracer_provider=provider)
    metrics = TiermemMetrics(forward_to=[tracing])
    with Memory.from_settings(Settings(data_dir=tmp_path / "data"), metrics=metrics) as memory:
        run = memory.start_run("alice", "r1")
        with pytest.raises(ApprovalPendingError) as pending:
            run.await_approval({"refund": "secret amount"}, key="refund")
        memory.approve_run("r1", pending.value.plan_hash, by="ops")
    names = [s.name for s in exporter.get_finished_spans()]
    assert names.count("tiermem.approval") == 2
    statuses = [
        (s.attributes or {}).get("tiermem.approval.status")
        for s in exporter.get_finished_spans()
        if s.name == "tiermem.approval"
    ]
    assert statuses == ["requested", "granted"]
    assert metrics.registry.get_sample_value("tiermem_approvals_total", {"status": "granted"}) == 1
    assert "secret" not in json.dumps(
        [dict(s.attributes or {}) for s in exporter.get_finished_spans()]
    )


@pytest.fixture
def global_spans() -> Iterator[InMemorySpanExporter]:
    """Spans of the global tracer provider (set once per process: an SDK one), for this test."""
    provider = trace.get_tracer_provider()
    if not isinstance(provider, TracerProvider):
        provider = TracerProvider()
        trace.set_tracer_provider(provider)
    exporter = InMemorySpanExporter()
    provider.add_span_processor(SimpleSpanProcessor(exporter))
    yield exporter
    exporter.shutdown()  # a provider's processors stay: later spans are dropped here


TRANSCRIPT = [
    {
        "role": "user",
        "content": "Secret-topic: migrate the billing cluster. I prefer terse answers.",
    },
    {"role": "assistant", "content": "Done: the secret-topic migration plan is written."},
]


def test_session_operations_are_traced_and_timed_with_ids_and_counts_only(
    tmp_path: Path, global_spans: InMemorySpanExporter
) -> None:
    metrics = TiermemMetrics()
    with Memory.from_settings(Settings(data_dir=tmp_path / "data"), metrics=metrics) as memory:
        memory.save_session(
            {"user_id": "alice", "session_id": "s0", "task_description": "secret-topic draft"}
        )
        memory.end_session("alice", "s1", TRANSCRIPT)
        hits = memory.recall_relevant("alice", "secret-topic billing", top_k=3)
        text = memory.build_continuation_context("alice", "secret-topic billing", max_tokens=500)
        with pytest.raises(InvalidInputError):
            memory.recall_relevant("alice", "secret-topic", top_k=0)
        with pytest.raises(InvalidInputError):  # not an id: it could be anything, left out
            memory.recall_relevant("secret user text", "billing")
    assert hits
    assert "secret-topic" in text.lower()  # the content is there, in the result only
    spans = {s.name: s for s in global_spans.get_finished_spans()}
    by_name = [s.name for s in global_spans.get_finished_spans()]
    assert by_name.count("tiermem.session.recall") == 3

    def attributes(name: str) -> dict[str, Any]:
        return dict(spans[name].attributes or {})

    assert attributes("tiermem.session.save") == {
        "tiermem.tenant": "default",
        "tiermem.user_id": "alice",
        "tiermem.session_id": "s0",
    }
    end, summarize = spans["tiermem.session.end"], spans["tiermem.session.summarize"]
    assert summarize.parent is not None
    assert summarize.parent.span_id == end.context.span_id
    assert attributes("tiermem.session.end")["tiermem.session_id"] == "s1"
    assert attributes("tiermem.session.summarize")["tiermem.messages"] == 2
    assert "tiermem.facts" in attributes("tiermem.session.summarize")
    (recalled, refused, not_an_id) = [
        s for s in global_spans.get_finished_spans() if s.name == "tiermem.session.recall"
    ]
    assert "tiermem.user_id" not in dict(not_an_id.attributes or {})
    assert dict(recalled.attributes or {}) == {
        "tiermem.tenant": "default",
        "tiermem.user_id": "alice",
        "tiermem.top_k": 3,
        "tiermem.results": len(hits),
    }
    assert refused.status.status_code is StatusCode.ERROR  # the typed error is on its span
    assert dict(refused.attributes or {})["error.type"] == "InvalidInputError"
    assert not refused.events  # no exception event: its message might quote the input
    context = attributes("tiermem.session.context")
    assert context["tiermem.max_tokens"] == 500
    assert context["tiermem.top_k"] == 5
    assert 0 < context["tiermem.tokens"] <= 500
    assert context["tiermem.context.sessions"] == 2
    # The query, the transcript and the summaries are in no span.
    dumped = json.dumps(
        [dict(s.attributes or {}) for s in global_spans.get_finished_spans()]
    ).lower()
    assert "secret" not in dumped
    assert "billing" not in dumped
    # The same calls fed the library's latency histograms (no service involved).
    for family, count in (
        ("tiermem_recall_duration_seconds_count", 1),
        ("tiermem_context_duration_seconds_count", 1),
        ("tiermem_summarizer_duration_seconds_count", 1),
    ):
        assert metrics.registry.get_sample_value(family) == count, family


NO_PROVIDER = """
from opentelemetry import trace
from opentelemetry.sdk.trace import TracerProvider

from memory.telemetry import _global_tracer, operation_span

assert _global_tracer() is None  # no provider configured: no tracer, not even a no-op one
with operation_span("tiermem.session.recall", {"tiermem.top_k": 3}) as span:
    span["tiermem.results"] = 0
assert span == {"tiermem.top_k": 3, "tiermem.results": 0}
trace.set_tracer_provider(TracerProvider())
assert _global_tracer() is not None  # configured later: traced from then on
"""


def test_session_spans_are_made_only_once_a_tracer_provider_is_configured() -> None:
    # A fresh process: the global provider can be set once per process.
    subprocess.run(
        [sys.executable, "-c", NO_PROVIDER],
        cwd=ROOT,
        env={**os.environ, "PYTHONPATH": str(ROOT)},
        check=True,
        timeout=120,
    )
