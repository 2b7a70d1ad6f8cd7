"""``tiermem migrate``: move the task tier's runs to the newest storage layout.

Idempotent and resumable: each tenant is one small record, written after its
runs were read, so a migration stopped half way is finished by running it
again, and a migrated tenant is reported and left alone. No stored run record
is rewritten (older ones keep reading); see :func:`tiers.task.migrate_layout`.
"""

from __future__ import annotations

from typing import Annotated

import typer

from memory.cli_support import open_kv
from tiers.models import utcnow
from tiers.task import LATEST_LAYOUT, MigrationReport, migrate_layout, tenants_with_runs


def migrate(
    tenant: Annotated[
        list[str] | None,
        typer.Option(help="A tenant to migrate (repeatable); default: every tenant with runs."),
    ] = None,
    dry_run: Annotated[
        bool, typer.Option("--dry-run", help="Report what would change; write nothing.")
    ] = False,
    force: Annotated[
        bool,
        typer.Option(
            "--force",
            help="Migrate although runs hold a live lease: only when every worker already "
            "runs this release (a worker of an older one cannot read the new layout).",
        ),
    ] = False,
) -> None:
    """Move the task tier's runs to the newest storage layout (one row fewer per step).

    Prints one line per tenant: its layout before and after, its runs, and what
    was done. Exits 1 when a tenant was refused (a run's lease is live: stop the
    workers of the previous release first, or --force).
    """
    refused = False
    with open_kv() as (kv, _):
        tenants = tenant or tenants_with_runs(kv)
        if tenants is None:
            raise typer.BadParameter("this store cannot list its tenants: name them with --tenant")
        if not tenants:
            typer.echo("no runs stored: nothing to migrate")
        for name in tenants:
            report = migrate_layout(kv, name, utcnow(), dry_run=dry_run, force=force)
            typer.echo(_describe(report, dry_run=dry_run))
            refused = refused or report.refused is not None
    if refused:
        raise typer.Exit(1)


def _describe(report: MigrationReport, *, dry_run: bool) -> str:
    """One line about one tenant's migration."""
    counts = (
        f"{report.runs} run(s), {len(report.unfinished)} unfinished, "
        f"{len(report.leased)} with a live lease"
    )
    if report.before >= LATEST_LAYOUT:
        done = "already on the newest layout"
    elif report.refused is not None:
        done = f"refused: {report.refused}"
    elif dry_run:
        done = f"would move layout {report.before} -> {LATEST_LAYOUT} (dry run, nothing written)"
    else:
        done = f"moved layout {report.before} -> {report.after}"
    return f"{report.tenant}: layout {report.before}, {counts}: {done}"
