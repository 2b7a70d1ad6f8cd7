"""The library's Prometheus metrics: a real crash (SIGKILL) and resume, scraped from the registry."""

from __future__ import annotations

import signal
from datetime import UTC, datetime, timedelta
from pathlib import Path

import pytest
from prometheus_client import CollectorRegistry, generate_latest

from memory import Memory
from memory.metrics import TiermemMetrics
from memory.settings import Settings
from tests.tiers.crash_worker import (
    USER,
    crash_frozen_worker,
    effect_keys,
    effects_done,
    run_to_end,
)
from tiers.errors import LeaseHeldError, StaleWriterError
from tiers.models import RunStatus


def _value(metrics: TiermemMetrics, name: str, **labels: str) -> float:
    value = metrics.registry.get_sample_value(name, labels)
    return 0.0 if value is None else value


def test_two_memories_in_one_process_keep_their_own_registries(tmp_path: Path) -> None:
    first, second = TiermemMetrics(), TiermemMetrics()  # no clash on the global registry
    assert first.registry is not second.registry
    shared = CollectorRegistry()
    assert TiermemMetrics(shared).registry is shared


def test_a_sigkilled_run_resumed_elsewhere_shows_in_the_metrics(tmp_path: Path) -> None:
    data = tmp_path / "data"
    store, log, run_id = str(data / "tiermem.sqlite3"), tmp_path / "effects.log", "crashed"
    # The store file must exist under the memory's data dir: open (and close) it once first.
    Memory.from_settings(Settings(data_dir=data)).close()
    # A worker with a long lease stops itself inside the "ship" effect (the effect happened,
    # its result is not recorded), and is then killed: a real crash, its lease still live
    # (600 s: a loaded machine can take most of a minute to get to the takeover below).
    assert crash_frozen_worker(store, run_id, log, "after:ship") == -signal.SIGKILL

    metrics = TiermemMetrics()
    memory = Memory.from_settings(Settings(data_dir=data), metrics=metrics)
    try:
        tier = memory.tasks
        with pytest.raises(LeaseHeldError):  # the dead worker's lease is still live
            tier.start_run(USER, run_id, worker_id="early")
        outputs = run_to_end(
            tier, run_id, str(log), dedupe=True, worker_id="taker", lease_ttl=30, steal=True
        )
        assert tier.get_run(run_id).status is RunStatus.COMPLETED
        assert outputs
        assert sorted(effects_done(log)) == sorted(effect_keys(run_id))  # each effect once

        assert _value(metrics, "tiermem_recovery_attempts_total", action="fail") == 1
        assert _value(metrics, "tiermem_recovery_attempts_total", action="replay") == 1
        assert _value(metrics, "tiermem_recovery_duration_seconds_count") == 1
        assert _value(metrics, "tiermem_runs_resumed_total") == 1
        assert _value(metrics, "tiermem_lease_takeovers_total") == 1
        # The units committed before the crash replay from their checkpoints.
        assert _value(metrics, "tiermem_step_replays_total", kind="step") >= 1
        assert _value(metrics, "tiermem_checkpoint_commit_latency_seconds_count") >= 1
        assert _value(metrics, "tiermem_checkpoint_storage_bytes_total") > 0

        # A handle whose run is taken over is fenced, and counted (a tenant view shares them).
        view = memory.for_tenant("other")
        first = view.tasks.start_run("u", "fenced", worker_id="a")
        view.tasks.start_run("u", "fenced", worker_id="b")
        with pytest.raises(StaleWriterError):
            first.step("late", lambda: 1)
        assert _value(metrics, "tiermem_fenced_writes_total") == 1
        assert _value(metrics, "tiermem_recovery_attempts_total", action="replay") == 2
    finally:
        memory.close()
    text = generate_latest(metrics.registry).decode()
    for family in (
        "tiermem_checkpoint_buffer_drain_latency_seconds",
        "tiermem_effect_validation_failures_total",
        "tiermem_compensation_depth_current",
        "tiermem_memory_scope_violations_total",
        "tiermem_unknown_outcome_effects_total",
        "tiermem_sweep_deleted_runs_total",
    ):
        assert f"# TYPE {family.removesuffix('_total')}" in text


def test_unknown_outcomes_validation_failures_and_sweeps_are_counted(tmp_path: Path) -> None:
    metrics = TiermemMetrics()
    memory = Memory.from_settings(Settings(data_dir=tmp_path / "data"), metrics=metrics)
    try:
        tier = memory.tasks
        run = tier.start_run("u", "r1")
        run.step("plan", lambda: 1, input={"n": 1})
        run.begin_effect("pay", idempotency_key="pay-1")  # invoked, never recorded
        again = tier.start_run("u", "r1")
        with pytest.raises(Exception, match="different input"):
            again.step("plan", lambda: 1, input={"n": 2})
        assert _value(metrics, "tiermem_effect_validation_failures_total", operation="step") == 1
        with pytest.raises(Exception, match="never recorded"):
            again.effect("pay", lambda: 1, idempotency_key="pay-1")
        assert _value(metrics, "tiermem_unknown_outcome_effects_total") == 1
        tier.start_run("u", "short").complete(result=None)
        assert memory.sweep_runs(now=datetime.now(UTC) + timedelta(days=3650)) == ["short"]
        assert _value(metrics, "tiermem_sweep_deleted_runs_total") == 1
    finally:
        memory.close()
