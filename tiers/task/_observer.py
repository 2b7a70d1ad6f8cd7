"""What the task tier reports as it works: a :class:`TaskObserver` it calls at fixed points.

The tier never imports a metrics or tracing library: an app (``memory.metrics``,
``memory.telemetry``) passes an observer to :class:`~tiers.task.TaskTier` and turns
these calls into Prometheus samples or spans. The default, :data:`NULL_OBSERVER`,
does nothing. Observers are called on the worker's thread, inside the tier's
write path: they must be quick and must not raise.
"""

from __future__ import annotations

from typing import Protocol

__all__ = ["NULL_OBSERVER", "NullObserver", "TaskObserver"]


class TaskObserver(Protocol):
    """The points of the task tier an observer hears about (every method is a no-op by default)."""

    def committed(self, seconds: float, written_bytes: int) -> None:
        """One atomic commit of a run (checkpoint, event, head) took ``seconds`` and wrote
        ``written_bytes`` of values."""

    def flushed(self, seconds: float) -> None:
        """Draining the store's buffered (acknowledged, not yet durable) commits took ``seconds``."""

    def run_taken(
        self, run_id: str, *, resumed: bool, takeover: bool, compensation: bool, seconds: float
    ) -> None:
        """A worker took the lease of ``run_id`` in ``seconds``.

        Args:
            run_id: The run.
            resumed: The run existed before (a resume, not a new run).
            takeover: The previous lease holder was another worker (expired or stolen).
            compensation: The lease was taken for compensation only.
            seconds: How long taking the lease took (reads, retries, the commit).
        """

    def take_refused(self, run_id: str) -> None:
        """A worker could not take ``run_id``: another worker holds its live lease."""

    def step_committed(
        self,
        run_id: str,
        step: str,
        seq: int,
        checkpoint_id: str,
        idempotency_key: str,
        seconds: float,
    ) -> None:
        """A step of ``run_id`` executed and its checkpoint committed (not a replay).

        Args:
            run_id: The run.
            step: The step's name.
            seq: The checkpoint's sequence number in the run.
            checkpoint_id: The checkpoint's id.
            idempotency_key: The step's idempotency key.
            seconds: From the step's start to its commit (its function and the commit).
        """

    def effect_recorded(
        self, run_id: str, key: str, name: str, kind: str, source: str, seconds: float
    ) -> None:
        """An effect of ``run_id`` was invoked and its result recorded (not a replay).

        Args:
            run_id: The run.
            key: The effect's idempotency key.
            name: The effect's name.
            kind: ``effect``, or ``compensation`` for an undo.
            source: Who gave the result: ``fn`` (the effect returned) or ``reconcile``.
            seconds: From the call in this process to the commit of its result.
        """

    def replayed(self, run_id: str, kind: str, idempotency_key: str) -> None:
        """A committed checkpoint of ``kind`` (step, effect, ...) was replayed, not re-executed."""

    def validation_failed(self, operation: str) -> None:
        """A replay was refused: its step name, input or effect request differs from the record."""

    def fenced(self, run_id: str) -> None:
        """A handle was fenced out: its run was taken over (``StaleWriterError``)."""

    def unknown_effect(self, run_id: str, count: int) -> None:
        """``count`` effects of ``run_id`` were found invoked but never recorded."""

    def compensation_depth(self, depth: int) -> None:
        """Compensations still to run in the compensation now under way (0: done)."""

    def swept(self, runs: int) -> None:
        """A retention sweep deleted ``runs`` whole runs."""

    def approval(self, run_id: str, key: str, status: str) -> None:
        """Approval gate ``key`` of ``run_id`` was requested, granted or rejected (``status``)."""


class NullObserver:
    """The observer that does nothing (the default)."""

    def committed(self, seconds: float, written_bytes: int) -> None:
        """Ignore a commit."""

    def flushed(self, seconds: float) -> None:
        """Ignore a flush."""

    def run_taken(
        self, run_id: str, *, resumed: bool, takeover: bool, compensation: bool, seconds: float
    ) -> None:
        """Ignore a taken lease."""

    def take_refused(self, run_id: str) -> None:
        """Ignore a refused take."""

    def step_committed(
        self,
        run_id: str,
        step: str,
        seq: int,
        checkpoint_id: str,
        idempotency_key: str,
        seconds: float,
    ) -> None:
        """Ignore an executed step."""

    def effect_recorded(
        self, run_id: str, key: str, name: str, kind: str, source: str, seconds: float
    ) -> None:
        """Ignore a recorded effect."""

    def replayed(self, run_id: str, kind: str, idempotency_key: str) -> None:
        """Ignore a replay."""

    def validation_failed(self, operation: str) -> None:
        """Ignore a refused replay."""

    def fenced(self, run_id: str) -> None:
        """Ignore a fenced handle."""

    def unknown_effect(self, run_id: str, count: int) -> None:
        """Ignore effects of unknown outcome."""

    def compensation_depth(self, depth: int) -> None:
        """Ignore the compensation depth."""

    def swept(self, runs: int) -> None:
        """Ignore a sweep."""

    def approval(self, run_id: str, key: str, status: str) -> None:
        """Ignore an approval gate."""


NULL_OBSERVER: TaskObserver = NullObserver()
