"""The task tier: checkpoint-resume for long agent runs.

The public face of the package; the modules beside it are private. Where to look:

- ``_tier.py``: :class:`TaskTier` (start, acquire, cancel, budgets);
- ``_handle.py`` / ``_handle_core.py``: :class:`RunHandle` and how a step is committed;
- ``_storage.py`` / ``_txn.py``: reads and the one write path (a commit against the run head);
- ``_effects.py``, ``_approvals.py``, ``_time_travel.py``, ``_retention.py``, ``_queries.py``:
  the effect ledger, approval gates, forks and state edits, retention, and reads;
- ``_records.py``: the records stored in a run (events, effects, approvals, snapshots).
"""

from tiers.task._handle import (
    RunHandle,
)
from tiers.task._records import (
    MAX_NOTE,
    NOT_DONE,
    Approval,
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
from tiers.task._storage import (
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
    "DEFAULT_RETENTION",
    "DEFAULT_SNAPSHOT_EVERY",
    "MAX_NOTE",
    "NOT_DONE",
    "UNSET",
    "Approval",
    "Charged",
    "EffectRecord",
    "EffectStart",
    "EffectStatus",
    "Event",
    "EventKind",
    "NotDone",
    "RunHandle",
    "TaskTier",
    "input_hash",
    "output_digest",
]
