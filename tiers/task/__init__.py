"""The task tier: the Stateful Execution Contract for long agent runs (checkpoint-resume).

This is the package's public face; the modules beside it are private.

A *run* is one execution of an agent task, possibly spread over several
worker processes: a worker that crashes or is redeployed resumes the run, the
steps already committed are replayed from their checkpoints, and every
external effect happens exactly once.

Storage (every format is in :mod:`tiers.keys`):

- ``runs_space(tenant)`` / ``run_id`` -> :class:`~tiers.models.RunInfo`, the run's
  *head*: owner, status, lease (owner, epoch, expiry), ``head_seq``,
  ``event_seq``, budgets, pending approval. Every change to a run is one
  atomic commit checked against the head's exact bytes, so the head
  serialises all writers of the run.
- ``run_space(tenant, run_id)`` holds, each written in the same commit as the
  head change it belongs to:

  - ``ev:<seq>`` -> :class:`~tiers.task._records.Event`: the append-only event
    log, gap-free seqs, never changed (``compact`` may drop events already
    folded into a snapshot). In layout 2 a step's ``StepCommitted`` event has
    no row: its checkpoint holds it, and :meth:`TaskTier.events` reads it there;
  - ``ckpt:<seq>`` -> :class:`~tiers.models.Checkpoint`: one per committed
    step, with the step's output and only the *change* to the run's state;
  - ``idem:<key>`` -> which checkpoint committed an idempotency key;
  - ``eff:<key>`` -> :class:`~tiers.task._records.EffectRecord`: the effect ledger;
  - ``snap:<seq>`` -> :class:`~tiers.task._records.Snapshot`: the run's state
    every ``snapshot_every`` events and at each branch root, so loading the
    state reads one snapshot and at most K checkpoints, however long the run;
  - ``appr:<key>`` -> :class:`~tiers.task._records.ApprovalRecord`: approval gates.

**Layout versions.** ``tenant_config_space(tenant)`` / ``task-format`` says
which layout the tenant's runs are written in (none: 1, the layout of every
release before it). Every reader reads every layout; a tenant with nothing in
flight moves to the newest when a worker first takes a run, and
:func:`migrate_layout` (``tiermem migrate``) moves the others. See
:mod:`tiers.task._format`.

**Costs.** A step with no effect is one durable commit (layout 2: three rows,
the checkpoint, its idempotency entry and the head); a top-level effect
is two (``EffectInvoked`` before the call, ``EffectRecorded`` + checkpoint
after it).

**Leases and fencing.** Taking a run (:meth:`TaskTier.start_run`,
:meth:`TaskTier.acquire`) increments ``lease_epoch``; every write of a handle
checks the head bytes it holds, so a handle whose run was taken over writes
nothing and gets :class:`~tiers.errors.StaleWriterError`. A lease with a TTL
(``lease_ttl``) is *live* until it expires; heartbeats and every commit renew
it. Another worker cannot take a live lease (:class:`~tiers.errors.LeaseHeldError`)
unless it steals it. A worker is its ``worker_id``: a caller that names none
gets a new one per call (:func:`new_worker_id`), so two threads of a process,
or two requests to a server, are two workers; a caller retakes its own live
lease by passing its worker id again (``RunHandle.worker_id``). An expired
lease is anybody's (resume after a crash). Leases without a TTL never block a
takeover (the embedded default, where a restarted process resumes its own run
at once).

**Operators do not cost a worker its work.** An operator's change to the
head that takes no lease (``set_budget``, ``compact``, ``resolve_effect``,
``approve``/``reject``, ``cancel``) makes a worker's commit fail its head
check; the handle then rebuilds the commit on the fresh head and retries
(bounded, with :mod:`tiers.cas` backoff) as long as the run still takes that
write, so a step's output or an effect's result computed meanwhile is kept.
Only a new lease epoch fences a handle out.

**Exactly-once effects.** See :meth:`RunHandle.effect` (and
:meth:`RunHandle.begin_effect` / :meth:`RunHandle.record_effect`, the same
protocol for a caller that performs the effect itself, e.g. over HTTP). An
effect's result is recorded before the run advances, even if the run was
cancelled while the effect ran (then without a checkpoint, and the worker
gets :class:`~tiers.errors.RunCancelledError` right after). One invoked but
unrecorded has an unknown outcome: the first worker that finds it and cannot
settle it (no ``reconcile``, not ``safe_to_retry``) flags it in
``RunInfo.unknown_effects``, and the run is *blocked*, left out of
:meth:`TaskTier.list_resumable`, until it is reconciled or an operator
decides (:meth:`TaskTier.resolve_effect`). A takeover while the old holder is
still inside an effect's function (a zombie past its lease) is only safe if
the external system checks the idempotency key: pass it along.

**Compensation.** :meth:`RunHandle.compensate` undoes recorded effects,
newest first, each once; it refuses while any effect's outcome is unknown. A
running, cancelled or failed run can be compensated: by the handle that saw
it end, or by a worker taking it with ``acquire(run_id, for_compensation=True)``.

**Branches.** :meth:`TaskTier.update_state` appends a human-edited checkpoint
whose parent is an earlier checkpoint; the checkpoints after it leave the
run's lineage (``RunInfo.superseded``) and their steps run again on resume.
Recorded effects stay recorded (they happened), so they are not repeated.

**Threads.** :class:`TaskTier` is stateless beyond its store and may be
shared by threads. A :class:`RunHandle` is driven by one thread at a time.

**Run statuses.** A run's status (:class:`~tiers.models.RunStatus`) changes only
with an event of its log, as one table declares (``tiers.task._lifecycle``): the
commit that appends the event moves the head, and ``TaskTier.rebuild`` folds the
log over the same table. :func:`lifecycle_table` prints it: the status after each
event, by the status before (``=`` unchanged, ``-`` refused with
:class:`~tiers.errors.RunStateError`, ``*`` a worker's event; an operator's
``resolve_effect`` leaves the status)::

    event                   running    paused     completed  failed     cancelled  resumable
    RunStarted              =          -          -          -          -          -
    RunForked               resumable  -          -          -          -          -
    RunResumed              =          =          -          -          -          running
    CompensationStarted     -          -          -          =          =          -
    StepStarted*            =          =          =          =          =          running
    StepCommitted*          =          =          =          =          =          running
    EffectInvoked*          =          =          =          =          =          running
    EffectRecorded*         =          =          =          =          =          running
    EffectNotDone*          =          =          =          =          =          running
    EffectOutcomeUnknown*   =          =          =          =          =          running
    BudgetDebited*          =          =          =          =          =          running
    Compensated*            =          =          =          =          =          running
    BudgetSet               =          =          =          =          =          =
    ApprovalRequested       =          =          -          -          -          =
    RunPaused               paused     =          -          -          -          paused
    ApprovalGranted         resumable  resumable  -          -          -          =
    ApprovalRejected        resumable  resumable  -          -          -          =
    StateUpdated            resumable  =          -          -          -          =
    RunReleased             resumable  =          -          =          =          =
    RunCompleted            completed  -          -          -          -          completed
    RunFailed               failed     -          -          -          -          failed
    RunCancelled            cancelled  cancelled  -          -          -          cancelled
    CompensationEscalated   =          =          =          =          =          =

**Where to look.** No class here is assembled from mixins: small objects
compose around one storage core.

- ``_tier.py``: :class:`TaskTier`, the operator's face; it forwards to the objects below.
- ``_store.py``: ``RunStore``, configuration, reads and the one write path
  (``RunStore.apply``: a :class:`Txn <tiers.task._txn.Txn>` committed against the run head).
- ``_txn.py``: ``Txn`` and ``HeadUpdate``, the head fields a transaction may change.
- ``_lifecycle.py``: the run state machine (statuses, transitions, which events move them).
- ``_runs.py``: taking a run's lease (start, acquire), attaching, cancel and budgets.
- ``_handle.py``: :class:`RunHandle`, a worker's face: steps, heartbeats, the run's end.
- ``_steps.py``: a handle's ``step`` and ``append_checkpoint``: decided on the head it
  holds while fresh (``_fresh.py``), committed through its writer.
- ``_writer.py``: ``RunWriter``, how a worker's step is committed (the lease a
  handle holds, its checks, ``txn`` / ``add_checkpoint`` / ``commit``).
- ``_effects.py``: exactly-once effects, the worker's protocol (effect, begin/record).
- ``_ledger.py``: every write to the effect ledger, and an operator's ``resolve_effect``.
- ``_compensation.py``: undoing recorded effects.
- ``_approvals.py``: approval gates, the worker's and the operator's sides.
- ``_queries.py``, ``_time_travel.py``, ``_retention.py``: reads and the log's fold
  (``rebuild``); state at a checkpoint, forks, state edits; deleting and compacting runs.
- ``_format.py``: layout versions, and the migration to the newest.
- ``_records.py``: the records stored in a run (events, effects, approvals, snapshots).
"""

from tiers.task._format import (
    LATEST as LATEST_LAYOUT,
)
from tiers.task._format import (
    MigrationReport,
    layout_version,
    pin_layout,
    tenants_with_runs,
)
from tiers.task._format import (
    migrate as migrate_layout,
)
from tiers.task._fresh import DEFAULT_HEAD_FRESH_MS
from tiers.task._handle import (
    RunHandle,
)
from tiers.task._lifecycle import (
    lifecycle_table,
)
from tiers.task._observer import NullObserver, TaskObserver
from tiers.task._records import (
    MAX_NOTE,
    NOT_DONE,
    Approval,
    ApprovalRecord,
    Charged,
    EffectRecord,
    EffectStart,
    EffectStatus,
    Event,
    EventKind,
    NotDone,
    input_hash,
    output_digest,
)
from tiers.task._store import (
    DEFAULT_RETENTION,
    DEFAULT_SNAPSHOT_EVERY,
)
from tiers.task._tier import (
    TaskTier,
)
from tiers.task._txn import (
    UNSET,
)

__all__ = [
    "DEFAULT_HEAD_FRESH_MS",
    "DEFAULT_RETENTION",
    "DEFAULT_SNAPSHOT_EVERY",
    "LATEST_LAYOUT",
    "MAX_NOTE",
    "NOT_DONE",
    "UNSET",
    "Approval",
    "ApprovalRecord",
    "Charged",
    "EffectRecord",
    "EffectStart",
    "EffectStatus",
    "Event",
    "EventKind",
    "MigrationReport",
    "NotDone",
    "NullObserver",
    "RunHandle",
    "TaskObserver",
    "TaskTier",
    "input_hash",
    "layout_version",
    "lifecycle_table",
    "migrate_layout",
    "output_digest",
    "pin_layout",
    "tenants_with_runs",
]
