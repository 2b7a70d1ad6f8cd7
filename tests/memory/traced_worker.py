"""A traced worker of the telemetry crash test (run as a script; the test SIGKILLs it).

Usage::

    python -m tests.memory.traced_worker STORE RUN_ID SPANS_FILE

It takes the run with a long lease and a :class:`~memory.telemetry.TracingObserver`
whose spans are written to ``SPANS_FILE`` as they end (one JSON object a line,
flushed at once, so a kill loses none), runs the first :data:`CRASH_AFTER` units
of :func:`units` and stops itself with SIGSTOP: the test kills it there, a real
crash with its lease still live, then resumes the run with :func:`run_units`.
Every output holds the word ``secret``: the test checks no span carries it.
"""

from __future__ import annotations

import os
import signal
import sys
from collections.abc import Callable

from opentelemetry.sdk.trace import TracerProvider
from opentelemetry.sdk.trace.export import ConsoleSpanExporter, SimpleSpanProcessor
from pydantic import JsonValue

from memory.telemetry import TracingObserver
from tiers.backends.sqlite_kv import SqliteKVStore
from tiers.task import RunHandle, TaskTier

USER = "traced-user"
CRASH_AFTER = 2


def units(run: RunHandle) -> list[Callable[[], JsonValue]]:
    """The run: two steps and a top-level effect, the second step with an effect inside."""
    return [
        lambda: run.step("plan", lambda: {"plan": "secret plan"}),
        lambda: run.effect("pay", lambda: {"receipt": "secret receipt"}),
        lambda: run.step("ship", lambda: {"label": run.effect("label", lambda: "secret label")}),
    ]


def run_units(run: RunHandle, stop: int | None = None) -> list[JsonValue]:
    """Run (or replay) the units up to ``stop`` (default: all); returns their outputs."""
    return [unit() for unit in units(run)[:stop]]


def main(store: str, run_id: str, spans_file: str) -> int:
    """Run the first units with spans to ``spans_file``, then stop (see the module docstring)."""
    provider = TracerProvider()
    with open(spans_file, "a") as out:
        exporter = ConsoleSpanExporter(out=out, formatter=lambda span: span.to_json(None) + "\n")
        provider.add_span_processor(SimpleSpanProcessor(exporter))
        kv = SqliteKVStore(store)
        try:
            tier = TaskTier(kv, observer=TracingObserver(tracer_provider=provider))
            # Still live when the test's taker steals it (a takeover), however loaded the machine.
            run = tier.start_run(USER, run_id, worker_id="first", lease_ttl=600.0)
            run_units(run, CRASH_AFTER)
            os.kill(os.getpid(), signal.SIGSTOP)  # the test kills it here
        finally:
            kv.close()
    return 0


if __name__ == "__main__":
    sys.exit(main(*sys.argv[1:4]))
