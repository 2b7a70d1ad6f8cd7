"""The run state machine, declared once: which event moves a run's status, and from where.

A run's status (:class:`~tiers.models.RunStatus`) only changes with an event of its
log, so one table says everything: for each :class:`~tiers.task._records.EventKind`,
the statuses a run may be in when the event is appended, and the status it is in
afterwards. The write path moves a transaction's status with every event it adds
(:meth:`tiers.task._txn.Txn.add_event`); ``TaskTier.rebuild`` folds the log over
the same table (:func:`fold`); :func:`lifecycle_table` prints it for the docs.

Appending an event in a status the table does not list raises
:class:`~tiers.errors.RunStateError`. The tier checks what a caller may do before it
builds a commit (with errors that name the fix: :class:`~tiers.errors.RunCancelledError`,
:class:`~tiers.errors.ApprovalPendingError`...), so this refusal is the backstop
that keeps a status change the table does not declare out of the store.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from typing import Final

from pydantic import JsonValue

from tiers.errors import RunStateError
from tiers.models import RunStatus
from tiers.task._records import EventKind

__all__ = ["INITIAL", "TRANSITIONS", "WORKER_KINDS", "advance", "fold", "lifecycle_table"]

RUNNING, PAUSED, RESUMABLE = RunStatus.RUNNING, RunStatus.PAUSED, RunStatus.RESUMABLE
COMPLETED, FAILED, CANCELLED = RunStatus.COMPLETED, RunStatus.FAILED, RunStatus.CANCELLED

INITIAL: Final = RUNNING
"""The status of a run's head before its first event (``RunStarted`` or ``RunForked``)."""


def _unchanged(statuses: Iterable[RunStatus]) -> dict[RunStatus, RunStatus]:
    return {status: status for status in statuses}


# A worker's write to a resumable run means a worker is running it again.
_BY_WORKER: Final = {**_unchanged(RunStatus), RESUMABLE: RUNNING}

WORKER_KINDS: Final = (
    EventKind.STEP_STARTED,
    EventKind.STEP_COMMITTED,
    EventKind.EFFECT_INVOKED,
    EventKind.EFFECT_RECORDED,
    EventKind.EFFECT_NOT_DONE,
    EventKind.EFFECT_OUTCOME_UNKNOWN,
    EventKind.BUDGET_DEBITED,
    EventKind.COMPENSATED,
)
"""Events a worker's handle appends; one with ``source="operator"`` in its data
(an operator's ``resolve_effect``) leaves the status as it is."""

TRANSITIONS: Final[Mapping[EventKind, Mapping[RunStatus, RunStatus]]] = {
    EventKind.RUN_STARTED: {RUNNING: RUNNING},
    EventKind.RUN_FORKED: {RUNNING: RESUMABLE},
    EventKind.RUN_RESUMED: {RUNNING: RUNNING, RESUMABLE: RUNNING, PAUSED: PAUSED},
    EventKind.COMPENSATION_STARTED: _unchanged((CANCELLED, FAILED)),
    **dict.fromkeys(WORKER_KINDS, _BY_WORKER),
    # An operator's set_budget, whatever the status: the worker sees it at its next step.
    EventKind.BUDGET_SET: _unchanged(RunStatus),
    EventKind.APPROVAL_REQUESTED: _unchanged((RUNNING, RESUMABLE, PAUSED)),
    EventKind.RUN_PAUSED: {RUNNING: PAUSED, RESUMABLE: PAUSED, PAUSED: PAUSED},
    EventKind.APPROVAL_GRANTED: {RUNNING: RESUMABLE, RESUMABLE: RESUMABLE, PAUSED: RESUMABLE},
    EventKind.APPROVAL_REJECTED: {RUNNING: RESUMABLE, RESUMABLE: RESUMABLE, PAUSED: RESUMABLE},
    EventKind.STATE_UPDATED: {RUNNING: RESUMABLE, RESUMABLE: RESUMABLE, PAUSED: PAUSED},
    EventKind.RUN_RELEASED: {
        RUNNING: RESUMABLE,
        **_unchanged((RESUMABLE, PAUSED, CANCELLED, FAILED)),
    },
    EventKind.RUN_COMPLETED: {RUNNING: COMPLETED, RESUMABLE: COMPLETED},
    EventKind.RUN_FAILED: {RUNNING: FAILED, RESUMABLE: FAILED},
    EventKind.RUN_CANCELLED: {RUNNING: CANCELLED, RESUMABLE: CANCELLED, PAUSED: CANCELLED},
    EventKind.COMPENSATION_ESCALATED: _unchanged(RunStatus),
}
"""For each event kind: the statuses it may be appended in, and the status after it."""


def advance(
    status: RunStatus, kind: EventKind, data: Mapping[str, JsonValue], *, run_id: str
) -> RunStatus:
    """The status after appending an event of ``kind`` (with ``data``) to a run in ``status``.

    Raises:
        RunStateError: The table does not allow that event in that status.
    """
    if kind in WORKER_KINDS and data.get("source") == "operator":
        return status
    after = TRANSITIONS[kind].get(status)
    if after is None:
        allowed = ", ".join(s.value for s in TRANSITIONS[kind])
        raise RunStateError(
            f"run {run_id!r} is {status.value}: a {kind.value} event is only appended to a "
            f"run that is {allowed}"
        )
    return after


def fold(
    status: RunStatus,
    events: Iterable[tuple[EventKind, Mapping[str, JsonValue]]],
    *,
    run_id: str,
) -> RunStatus:
    """The status after ``events`` (kind and data, in log order), starting from ``status``."""
    for kind, data in events:
        status = advance(status, kind, data, run_id=run_id)
    return status


def lifecycle_table() -> str:
    """The state machine as a text table: for each event kind, the status after it, by status.

    A cell is the status after the event, ``=`` when it stays as it is, ``-``
    when the event is refused in that status (:class:`~tiers.errors.RunStateError`).
    Kinds marked ``*`` are a worker's (one by an operator leaves the status).
    """
    width = max(len(kind.value) for kind in TRANSITIONS) + 3
    cells = [status.value.ljust(11) for status in RunStatus]
    lines = ["event".ljust(width) + "".join(cells)]
    for kind, moves in TRANSITIONS.items():
        row = []
        for status in RunStatus:
            after = moves.get(status)
            cell = "-" if after is None else "=" if after is status else after.value
            row.append(cell.ljust(11))
        name = kind.value + ("*" if kind in WORKER_KINDS else "")
        lines.append((name.ljust(width) + "".join(row)).rstrip())
    return "\n".join(line.rstrip() for line in lines)
