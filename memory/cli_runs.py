"""The ``tiermem runs`` commands: list, show (a tree of checkpoints and forks), dry-run, export.

:func:`runs_app` builds them around a function that opens the configured
stores (``memory.cli``'s), so they share its error handling and data-dir lock.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import TYPE_CHECKING, Annotated

import typer

from tiers.models import Checkpoint, RunInfo, RunStatus

if TYPE_CHECKING:
    from memory.facade import Memory

__all__ = ["render_tree", "runs_app"]

OpenRoot = Callable[[str], AbstractContextManager["Memory"]]
"""Opens the configured stores for a command (named for its error messages)."""

_Tenant = Annotated[str, typer.Option(help="The tenant whose runs to read.")]


def render_tree(info: RunInfo, checkpoints: list[Checkpoint], forks: list[RunInfo]) -> list[str]:
    """A run as plain-text lines: its head, then its checkpoints as a tree by parent.

    Branches (``update_run_state``) show as siblings; checkpoints out of the run's
    lineage are marked ``superseded``; runs forked from a checkpoint hang under it.
    """
    lines = [
        f"run {info.run_id}  user {info.user_id}  status {info.status.value}  "
        f"head seq {info.head_seq}  lease epoch {info.lease_epoch}"
    ]
    children: dict[str | None, list[Checkpoint]] = {}
    for ckpt in sorted(checkpoints, key=lambda c: c.seq):
        children.setdefault(ckpt.parent_id, []).append(ckpt)
    forked: dict[str | None, list[RunInfo]] = {}
    for fork in forks:
        forked.setdefault(fork.parent_checkpoint_id, []).append(fork)

    def walk(parent: str | None, depth: int) -> None:
        for ckpt in children.get(parent, []):
            mark = "" if info.in_lineage(ckpt.seq) else "  (superseded)"
            lines.append(
                f"{'  ' * depth}- #{ckpt.seq} {ckpt.step} [{ckpt.kind}] "
                f"{ckpt.checkpoint_id} key={ckpt.idempotency_key}{mark}"
            )
            for fork in forked.get(ckpt.checkpoint_id, []):
                lines.append(f"{'  ' * (depth + 1)}=> fork {fork.run_id} ({fork.status.value})")
            walk(ckpt.checkpoint_id, depth + 1)

    walk(None, 1)
    return lines


def runs_app(open_root: OpenRoot) -> typer.Typer:
    """The ``runs`` command group, opening the stores with ``open_root``."""
    app = typer.Typer(help="List runs, show one as a tree, dry-run a resume.", no_args_is_help=True)

    @app.command("list")
    def list_runs(
        tenant: _Tenant = "default",
        status: Annotated[
            RunStatus | None, typer.Option(help="Only runs with this status.")
        ] = None,
        user: Annotated[str | None, typer.Option(help="Only this user's runs.")] = None,
        all_tenants: Annotated[
            bool, typer.Option("--all-tenants", help="Every tenant of the store.")
        ] = False,
    ) -> None:
        """One line per run: tenant, id, user, status, head seq, last checkpoint time."""
        with open_root("runs") as root:
            for name in root.tenants() if all_tenants else [tenant]:
                for info in root.for_tenant(name).list_runs(user_id=user, status=status):
                    at = info.last_checkpoint_at.isoformat() if info.last_checkpoint_at else "-"
                    typer.echo(
                        f"{name}\t{info.run_id}\t{info.user_id}\t{info.status.value}\t"
                        f"{info.head_seq}\t{at}"
                    )

    @app.command("show")
    def show(run_id: str, tenant: _Tenant = "default") -> None:
        """The run's head and its checkpoints as a tree, with branches and forks."""
        with open_root("runs") as root:
            memory = root.for_tenant(tenant)
            info = memory.get_run(run_id)
            forks = [r for r in memory.list_runs() if r.parent_run_id == run_id]
            lines = render_tree(info, memory.run_history(run_id), forks)
        typer.echo("\n".join(lines))

    @app.command("dry-run")
    def dry_run(run_id: str, tenant: _Tenant = "default") -> None:
        """What resuming the run would do now, as JSON; nothing is written."""
        with open_root("runs") as root:
            plan = root.for_tenant(tenant).plan_resume(run_id)
        typer.echo(plan.model_dump_json(indent=2))

    @app.command("export")
    def export(run_id: str, tenant: _Tenant = "default") -> None:
        """The run's checkpoint DAG (forks included) as an OTLP JSON trace on stdout."""
        from memory.telemetry import run_trace

        with open_root("runs") as root:
            trace = run_trace(root.for_tenant(tenant), run_id)
        typer.echo(json.dumps(trace, indent=2))

    return app
