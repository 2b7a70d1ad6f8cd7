"""Layout versions of a tenant's runs: which one a store uses, and the migration to the newest.

A small record per tenant (:data:`~tiers.keys.TASK_FORMAT_KEY` in the tenant's
config space, so it lives with the tenant's data and never in a run's commit)
says which layout new writes to the tenant's runs use. A store without it was
written by a release before layout versions: version 1.

===== ==================================================================================
 ver   what a step writes
===== ==================================================================================
  1    checkpoint row + ``StepCommitted`` event row + idempotency row + the run's head
  2    checkpoint row holding its ``StepCommitted`` event (``commit_epoch``) + idempotency
       row + the run's head: one row fewer per step; readers derive the event from it
===== ==================================================================================

Reading never depends on the version: every record of an older layout stays
readable (the upcaster is :func:`tiers.task._records.decode_stored_checkpoint`,
and :meth:`~tiers.task._store.RunStore.inline_events` derives the events), so a
store's runs may mix layouts. Only a *writer* asks the version, because a
release before version 2 cannot read a version-2 checkpoint (its records refuse
unknown fields): a store moves to a newer layout only when no older worker can
still be writing to it. The next bump is one entry in :data:`LAYOUTS`, the
writer's branch on it, and an upcaster.

**Record versions of a checkpoint** are apart from the layout: every release
reads both (:class:`~tiers.models.Record` takes any int ``schema_version``),
so no writer asks for them and no store moves.

===== ==================================================================================
 ver   what the checkpoint record holds
===== ==================================================================================
  1    the model's fields as pydantic writes them (``encode``); any JSON value
  2    the same fields and bytes but the version (:data:`EXACT_INTS_VERSION`): a step's
       checkpoint orjson wrote whole (its output's text from
       :func:`tiers.codec.to_json_text`, also orjson's), which cannot hold an int
       outside 64 bits (orjson refuses one), so readers parse it without looking for
       one; a record read keeps its version (pydantic's decode and ours alike)
===== ==================================================================================

Moving up happens two ways:

* **on open, where it is safe**: a tenant without the record and without an
  unfinished run (a new store, or one whose runs all finished) is stamped with
  :data:`LATEST` when a worker first takes a run; no worker of an older release
  can have a run of it in flight. A tenant with unfinished runs keeps writing
  version 1 until an operator migrates it.
* **``tiermem migrate``** (:func:`migrate`): stamps :data:`LATEST`, refusing
  while a run holds a live lease (a worker, maybe of the older release, is
  writing it) unless forced. Existing records are not rewritten (a committed
  checkpoint is never changed): they keep reading through the upcasters, and
  runs in flight resume on the new layout from their next step.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from datetime import datetime
from typing import Final

from pydantic import Field

from tiers import keys
from tiers.backends.base import Check, KVStore, ListsSpaces, Put
from tiers.codec import decode, encode
from tiers.errors import InvalidInputError
from tiers.models import Record, RunInfo, UtcDatetime

__all__ = [
    "EXACT_INTS_VERSION",
    "LATEST",
    "LAYOUTS",
    "LEGACY",
    "MigrationReport",
    "TaskFormat",
    "layout_version",
    "migrate",
    "pin_layout",
    "read_format",
    "resolve_layout",
    "stamp_check",
    "tenants_with_runs",
    "write_format",
]

LEGACY: Final = 1
"""The layout of a store without a format record (every release before layout versions)."""

LAYOUTS: Final = {
    1: "StepCommitted written as its own event row",
    2: "StepCommitted held in the checkpoint record (one row fewer per step)",
}
"""Every layout version this release reads and writes, and what it changed."""

LATEST: Final = max(LAYOUTS)
"""The layout new stores and migrated ones write."""

EXACT_INTS_VERSION: Final = 2
"""A checkpoint record's ``schema_version`` when orjson wrote every number in it (see above).

A previous release reads such a record through pydantic, exactly as this one
does. Only a step's writer writes it; a copy of such a record (a fork) keeps its
output, scope and state delta, so it may keep the version.
"""

_PAGE = 256


class TaskFormat(Record):
    """The layout version a tenant's runs are written in, and how it was set."""

    version: int = Field(ge=1)
    set_at: UtcDatetime
    # "open" (stamped when a worker first took a run, nothing in flight), "migrate", "pin".
    by: str


@dataclass
class MigrationReport:
    """What :func:`migrate` found and did for one tenant.

    Attributes:
        tenant: The tenant.
        before: Its layout version before (1 when it had no record).
        after: Its layout version now (``before`` on a dry run or a refusal).
        runs: How many runs it has.
        unfinished: Ids of its runs not finished (they resume on the new layout).
        leased: Ids of runs whose lease is live (a worker is writing them).
        changed: Whether the record was written.
        refused: Why nothing was written, when a live lease stopped it.
    """

    tenant: str
    before: int
    after: int
    runs: int = 0
    unfinished: list[str] = field(default_factory=list)
    leased: list[str] = field(default_factory=list)
    changed: bool = False
    refused: str | None = None


def read_format(kv: KVStore, tenant: str) -> TaskFormat | None:
    """The tenant's format record, or ``None`` (then its layout is :data:`LEGACY`)."""
    space = keys.tenant_config_space(tenant)
    (data,) = kv.get_many(space, [keys.TASK_FORMAT_KEY])
    if data is None:
        return None
    return decode(TaskFormat, data, where=f"{space}/{keys.TASK_FORMAT_KEY}")


def write_format(kv: KVStore, tenant: str, version: int, now: datetime, *, by: str) -> bool:
    """Set the tenant's layout ``version`` unless it already has it; ``True`` if written.

    ``by="pin"`` also keeps a store on an older layout (a rolling upgrade with
    workers of the previous release still running): the open never moves a
    tenant that has a record.

    Raises:
        InvalidInputError: ``version`` is not one this release writes.
        ConflictError: The record changed while it was written (retry).
    """
    if version not in LAYOUTS:
        known = ", ".join(str(v) for v in LAYOUTS)
        raise InvalidInputError(
            f"task layout version {version} is unknown to this release (it writes {known})",
            field="version",
        )
    space = keys.tenant_config_space(tenant)
    (data,) = kv.get_many(space, [keys.TASK_FORMAT_KEY])
    if data is not None:
        current = decode(TaskFormat, data, where=f"{space}/{keys.TASK_FORMAT_KEY}")
        if current.version == version:
            return False
    record = TaskFormat(version=version, set_at=now, by=by)
    kv.commit(
        [Put(space, keys.TASK_FORMAT_KEY, encode(record))],
        [Check(space, keys.TASK_FORMAT_KEY, data)],
    )
    return True


def layout_version(kv: KVStore, tenant: str) -> int:
    """The layout version of the tenant's format record (:data:`LEGACY` without one)."""
    record = read_format(kv, tenant)
    return LEGACY if record is None else record.version


def pin_layout(kv: KVStore, tenant: str, version: int, now: datetime) -> bool:
    """Keep the tenant's runs on layout ``version`` (e.g. 1 while workers of the previous
    release still run: the open then never moves it); ``True`` if the record changed.

    Raises:
        InvalidInputError: ``version`` is not one this release writes.
    """
    return write_format(kv, tenant, version, now, by="pin")


def tenants_with_runs(kv: KVStore) -> list[str] | None:
    """Every tenant that has a run, from the store's space names; ``None`` if it cannot list them."""
    if not isinstance(kv, ListsSpaces):
        return None
    suffix = keys.runs_space("")
    return sorted(space[: -len(suffix)] for space in kv.spaces() if space.endswith(suffix))


def _runs(kv: KVStore, tenant: str) -> Iterator[RunInfo]:
    """Every run head of the tenant, a page at a time."""
    space = keys.runs_space(tenant)
    after: str | None = None
    while True:
        page = kv.scan(space, start_after=after, limit=_PAGE)
        for key, data in page:
            yield decode(RunInfo, data, where=f"{space}/{key}")
        if len(page) < _PAGE:
            return
        after = page[-1][0]


def resolve_layout(
    kv: KVStore, tenant: str, now: datetime, *, may_stamp: bool = True
) -> tuple[int, Put | None]:
    """The layout a writer of the tenant's runs uses, and the record to write with its first commit.

    A tenant without a record and without an unfinished run (nothing an older
    worker could be in the middle of) moves to :data:`LATEST`: the second value
    is then the record's write, which the caller commits with its first write
    and :func:`stamp_check` (no commit of its own). Otherwise, or when the
    caller cannot commit the record (``may_stamp=False``), a tenant without a
    record stays on :data:`LEGACY` (asked again at the next open).
    """
    record = read_format(kv, tenant)
    if record is not None:
        return record.version, None
    if not may_stamp or any(not info.status.finished for info in _runs(kv, tenant)):
        return LEGACY, None
    stamp = TaskFormat(version=LATEST, set_at=now, by="open")
    space = keys.tenant_config_space(tenant)
    return LATEST, Put(space, keys.TASK_FORMAT_KEY, encode(stamp))


def stamp_check(tenant: str) -> Check:
    """The check a commit carrying :func:`resolve_layout`'s record makes: still no record."""
    return Check(keys.tenant_config_space(tenant), keys.TASK_FORMAT_KEY, None)


def migrate(
    kv: KVStore, tenant: str, now: datetime, *, dry_run: bool = False, force: bool = False
) -> MigrationReport:
    """Move the tenant's runs to the :data:`LATEST` layout (idempotent; resumable by running it again).

    No stored record is rewritten: older records keep reading through the
    upcasters, and each run writes the new layout from its next step.

    Args:
        kv: The store.
        tenant: The tenant.
        now: When (stored in the record).
        dry_run: Report what would change, write nothing.
        force: Migrate although a run holds a live lease. Only safe when that
            worker runs this release: a worker of an older release cannot read
            the new layout's checkpoints.

    Returns:
        What was found and done.
    """
    record = read_format(kv, tenant)
    before = LEGACY if record is None else record.version
    report = MigrationReport(tenant=tenant, before=before, after=before)
    for info in _runs(kv, tenant):
        report.runs += 1
        if not info.status.finished:
            report.unfinished.append(info.run_id)
            # A lease without a TTL never expires: its worker may still be writing.
            if info.lease_owner is not None and (
                info.lease_expires_at is None or info.lease_live(now)
            ):
                report.leased.append(info.run_id)
    if before >= LATEST or dry_run:
        return report
    if report.leased and not force:
        report.refused = (
            f"{len(report.leased)} run(s) hold a live lease ({', '.join(report.leased[:5])}): "
            "stop the workers of the previous release (or let the leases expire), then run "
            "migrate again; --force if every worker already runs this release"
        )
        return report
    report.changed = write_format(kv, tenant, LATEST, now, by="migrate")
    report.after = LATEST
    return report
