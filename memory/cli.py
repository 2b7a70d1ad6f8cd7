"""The ``tiermem`` command line of the library: demo, info, keys, reindex, resummarize, sweep,
worker, retention, encryption at rest (new-master-key, encrypt, rotate-master-key), and
migrate (the task tier's storage layout).

:func:`build_app` makes the Typer app of these commands. The installed
``tiermem`` script is :mod:`api.cli`, at the top layer, which adds ``serve``
(the HTTP service) to it: this package never imports ``api`` (layers point
down only), not even by name at run time.
"""

from __future__ import annotations

from contextlib import ExitStack
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any
from urllib.parse import urlsplit

import typer

from memory.cli_encryption import encrypt, new_master_key, rotate_master_key
from memory.cli_migrate import migrate
from memory.cli_runs import runs_app
from memory.cli_support import (
    open_kv,
    open_registry,
    open_root,
    settings_from_env,
)
from memory.settings import Settings
from summarizer.errors import SummarizerError
from tiers.backends import describe_kv_store, kv_backend_name, redact_url
from tiers.cache_ages import SWEEPER
from tiers.errors import TierError

if TYPE_CHECKING:
    from memory.facade import Memory
    from tiers.backends.base import KVStore
    from tiers.retention import RetentionPolicy


def demo(
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Folder for the demo's stores (default: a new temporary folder)."),
    ] = None,
) -> None:
    """Run the scripted story: preferences, a crash-and-resume workflow, session recall."""
    from memory.demo import main

    main(data_dir)


def info() -> None:
    """Print the settings in effect (from TIERMEM_* environment variables; secrets masked)."""
    settings = settings_from_env()
    for name, value in settings.model_dump().items():
        if isinstance(value, str):
            value = redact_url(value)
        typer.echo(f"{name} = {value}")
    location = settings.kv_location()
    try:
        backend = kv_backend_name(location)
    except TierError as exc:
        backend = f"none ({exc})"
    typer.echo(f"kv_backend = {backend} at {redact_url(location)}")
    if backend == "Redis Cluster":
        typer.echo(f"kv_cluster = {describe_kv_store(location)}")


def keys_create(
    tenant: Annotated[str, typer.Option(help="Tenant the key acts in.")],
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Allow only reads (GET, recall, context).")
    ] = False,
    name: Annotated[str, typer.Option(help="A label: who or what uses the key.")] = "",
    user: Annotated[
        str | None,
        typer.Option(
            help="Bind the key to this one user of the tenant (for an agent acting for one "
            "end user): every other user's data is refused to it."
        ),
    ] = None,
) -> None:
    """Create an API key and print it once (only its SHA-256 is stored)."""
    with open_registry() as registry:
        key, info = registry.create(tenant, read_only=read_only, name=name, user_id=user)
    typer.echo(key)
    bound = "" if info.user_id is None else f", user {info.user_id}"
    typer.echo(
        f"key id {info.key_id}, tenant {info.tenant}{bound}, scopes {','.join(info.scopes)}: "
        "store the key now, it cannot be shown again",
        err=True,
    )


def keys_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
) -> None:
    """List API keys, one a line, tab-separated: id, tenant, scopes, state, created, name, user.

    The user is the one the key is bound to (``--user``), or ``*`` for every
    user of the tenant. The keys themselves are never shown.
    """
    with open_registry() as registry:
        infos = registry.list_keys(tenant=tenant)
    for info in infos:
        state = f"revoked {info.revoked_at:%Y-%m-%dT%H:%M:%SZ}" if info.revoked_at else "active"
        typer.echo(
            f"{info.key_id}\t{info.tenant}\t{','.join(info.scopes)}\t{state}\t"
            f"{info.created_at:%Y-%m-%dT%H:%M:%SZ}\t{info.name}\t{info.user_id or '*'}"
        )


def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key id shown by `keys list`.")],
) -> None:
    """Revoke an API key for good (running servers stop accepting it within auth_cache_seconds)."""
    with open_registry() as registry:
        info = registry.revoke(key_id)
    typer.echo(f"revoked {info.key_id} (tenant {info.tenant})")


TenantOption = Annotated[str, typer.Option(help="The tenant whose sessions to process.")]
UsersOption = Annotated[
    list[str] | None,
    typer.Option("--user", help="Only this user (repeatable); default every user."),
]
AllTenantsOption = Annotated[
    bool,
    typer.Option(
        "--all-tenants",
        help="Every tenant of the store (each one opened before, each with an API key) "
        "instead of --tenant.",
    ),
]


def reindex(
    tenant: TenantOption = "default",
    user: UsersOption = None,
    all_tenants: AllTenantsOption = False,
    check: Annotated[
        bool,
        typer.Option(
            "--check",
            help="Only compare the index with the KV store and report missing, stale and "
            "orphaned vectors per tenant; exit 1 if any.",
        ),
    ] = False,
    damaged: Annotated[
        bool,
        typer.Option(
            "--damaged",
            help="Re-index only what the check finds missing or stale, delete orphans "
            "(fast after a lost index), instead of re-embedding every session.",
        ),
    ] = False,
) -> None:
    """Rebuild the vector index from the KV store (a lost or damaged index, a new embedder).

    By default every session is re-embedded, then what a check still finds
    (items, orphaned vectors) is repaired. The KV store is the truth and is not
    changed; recall keeps working meanwhile. Exits 1 if an index is left damaged.
    """
    if user and all_tenants:
        raise typer.BadParameter("--user names users of one tenant: not with --all-tenants")
    if check and damaged:
        raise typer.BadParameter("--check only reports: not with --damaged")
    left = 0
    with open_root("reindex") as root:
        for name in root.tenants() if all_tenants else [tenant]:
            memory = root.for_tenant(name)
            if check:
                report = memory.check_index()
            else:
                if not damaged:
                    done = _rebuild(memory, user)
                    typer.echo(f"reindexed {done} sessions of tenant {name}")
                # With --user the rest of the tenant is left as it is.
                report = memory.check_index() if user else memory.repair_index().after
            typer.echo(report.describe())
            left += not report.consistent
    if left:
        raise typer.Exit(1)


def _rebuild(memory: Memory, users: list[str] | None) -> int:
    from tiers.session import ReindexProgress

    bar: Any = None

    def progress(step: ReindexProgress) -> None:
        nonlocal bar
        if bar is None:
            bar = typer.progressbar(length=step.total, label="re-embedding sessions")
            bar.__enter__()
        bar.update(step.done - bar.pos)

    try:
        return memory.sessions.reindex(users, progress=progress)
    finally:
        if bar is not None:
            bar.__exit__(None, None, None)


def resummarize(
    tenant: TenantOption = "default",
    user: UsersOption = None,
    all_tenants: AllTenantsOption = False,
) -> None:
    """Summarize every session whose transcript is stored but has no summary (a failed summary)."""
    if user and all_tenants:
        raise typer.BadParameter("--user names users of one tenant: not with --all-tenants")
    failed = 0
    with open_root("resummarize") as root:
        for name in root.tenants() if all_tenants else [tenant]:
            memory = root.for_tenant(name)
            users = user or memory.sessions.user_ids()
            pending = [(u, sid) for u in users for sid in memory.pending_summaries(u)]
            failures = 0
            with typer.progressbar(pending, label=f"summarizing ({name})") as bar:
                for user_id, session_id in bar:
                    try:
                        memory.resummarize(user_id, session_id)
                    except (TierError, SummarizerError) as exc:
                        failures += 1
                        typer.echo(f"\n{name}/{user_id}/{session_id}: {exc}", err=True)
            typer.echo(
                f"summarized {len(pending) - failures} of {len(pending)} pending sessions "
                f"of tenant {name}"
            )
            failed += failures
    if failed:
        raise typer.Exit(1)


def sweep(
    tenant: Annotated[str, typer.Option(help="The tenant to sweep.")] = "default",
    all_tenants: AllTenantsOption = False,
) -> None:
    """Delete what is past its retention: finished runs (TIERMEM_RUN_RETENTION_DAYS, default 7),
    and sessions, transcripts, facts and idle runs past the tenant's retention (`retention show`).
    """
    with open_root("sweep") as root:
        for name in root.tenants() if all_tenants else [tenant]:
            report = root.for_tenant(name).sweep()
            typer.echo(f"deleted {report.finished_runs} finished runs of tenant {name}")
            typer.echo(
                f"retention: deleted {report.idle_runs} idle runs, {report.sessions} sessions, "
                f"{report.transcripts} transcripts, {report.facts} fact versions"
            )


def worker(
    app_path: Annotated[
        str,
        typer.Option(
            "--app",
            help="module:attr of the registered workflows: a memory.workers.Workflows, or a "
            "memory.workers.WorkerApp (the workflows and how to open Memory from settings).",
        ),
    ],
    concurrency: Annotated[int, typer.Option(min=1, help="Runs driven at once (threads).")] = 1,
    poll_interval: Annotated[
        float, typer.Option(min=0.01, help="Seconds between polls when there is nothing to take.")
    ] = 1.0,
    lease_ttl: Annotated[
        float,
        typer.Option(
            min=0.1,
            help="Seconds a lease lives without a heartbeat (heartbeats every third of it): "
            "how long the runs of a killed worker wait for another.",
        ),
    ] = 30.0,
    tenant: Annotated[
        str | None, typer.Option(help="The tenant whose runs to serve (default: TIERMEM_TENANT).")
    ] = None,
    metrics_port: Annotated[
        int | None,
        typer.Option(
            min=1,
            max=65535,
            help="Serve Prometheus metrics (tiermem_worker_* and the task tier's) on "
            "http://127.0.0.1:PORT/metrics (default: not served).",
        ),
    ] = None,
) -> None:
    """Run resumable workflow runs until SIGTERM, then drain (finish each step, release, exit 0).

    Needs a store shared by processes (TIERMEM_KV_URL=redis://... or postgresql://...).
    """
    import logging
    import signal

    from memory.metrics import TiermemMetrics
    from memory.workers import Worker, load_app, task_tier_from_settings

    settings = settings_from_env()
    # What the fleet does (runs taken, released, failed) is its operators' only view of it.
    logging.basicConfig(
        level=settings.log_level.upper(), format="%(asctime)s %(levelname)s %(name)s: %(message)s"
    )
    if urlsplit(settings.kv_location()).scheme in ("", "sqlite"):
        typer.echo(
            "error: `tiermem worker` needs a store shared by processes: set TIERMEM_KV_URL to "
            "redis://... or postgresql://... (the embedded SQLite store is one process per data "
            "dir, so a fleet of workers cannot share it)",
            err=True,
        )
        raise typer.Exit(2)
    try:
        app = load_app(app_path)
    except (ImportError, AttributeError, TypeError) as exc:
        raise typer.BadParameter(str(exc), param_hint="--app") from exc
    with ExitStack() as stack:
        if app.open_memory is not None:
            try:
                memory = stack.enter_context(app.open_memory(settings))
            except TierError as exc:
                typer.echo(f"error: {exc}", err=True)
                raise typer.Exit(1) from exc
            tasks = memory.for_tenant(tenant or settings.tenant).tasks
            metrics = memory.metrics or TiermemMetrics()
        else:
            kv, _ = stack.enter_context(open_kv())
            # No Memory holds the cache max age here: the worker holds it for its caches.
            stack.callback(SWEEPER.hold(settings.cache_max_age_seconds))
            metrics = TiermemMetrics()
            tasks = task_tier_from_settings(
                kv, settings, tenant or settings.tenant, metrics=metrics
            )
        fleet = Worker(
            tasks,
            app.workflows,
            concurrency=concurrency,
            lease_ttl=lease_ttl,
            poll_interval=poll_interval,
            metrics=metrics,
        )
        if metrics_port is not None:
            try:
                stack.callback(metrics.serve(metrics_port))
            except OSError as exc:
                typer.echo(
                    f"error: cannot serve metrics on 127.0.0.1:{metrics_port}: {exc}", err=True
                )
                raise typer.Exit(1) from exc
        for signum in (signal.SIGTERM, signal.SIGINT):
            signal.signal(signum, lambda *_: fleet.stop())
        typer.echo(f"worker {fleet.name}: serving {', '.join(app.workflows.names)}", err=True)
        fleet.run()
    typer.echo(f"worker {fleet.name}: drained", err=True)


def _ttl_option(kind: str, meaning: str) -> Any:
    return typer.Option(
        f"--{kind.replace('_', '-')}",
        help=f"{meaning}: a duration (90d, 12h, 2w, 30m, 45s), 'off' (kept forever) or "
        "'default' (follow TIERMEM_RETENTION_*_DAYS).",
    )


def retention_show(
    tenant: Annotated[str, typer.Option(help="The tenant.")] = "default",
) -> None:
    """Print the tenant's retention, one kind a line: kind, TTL, and where it comes from."""
    with open_kv() as (kv, settings):
        policy = _effective(kv, tenant, settings)
    _print_policy(policy)


def retention_set(
    tenant: Annotated[str, typer.Option(help="The tenant.")] = "default",
    sessions: Annotated[
        str | None, _ttl_option("sessions", "Whole sessions, from when they ended")
    ] = None,
    transcripts: Annotated[
        str | None,
        _ttl_option("transcripts", "Raw transcripts (the summary stays), from the session's end"),
    ] = None,
    facts: Annotated[
        str | None, _ttl_option("facts", "User facts with their history, from the last update")
    ] = None,
    idle_runs: Annotated[
        str | None, _ttl_option("idle_runs", "Unfinished runs untouched and with no live lease")
    ] = None,
) -> None:
    """Set the tenant's own retention of the kinds given (the others are unchanged).

    Stored with the tenant's data; the next sweep applies it (a running server
    sweeps every TIERMEM_RUN_SWEEP_INTERVAL_SECONDS). Safe beside a running server.
    """
    from tiers.retention import set_overrides

    given = {
        kind: value
        for kind, value in (
            ("sessions", sessions),
            ("transcripts", transcripts),
            ("facts", facts),
            ("idle_runs", idle_runs),
        )
        if value is not None
    }
    if not given:
        raise typer.BadParameter(
            "give at least one of --sessions, --transcripts, --facts, --idle-runs"
        )
    with open_kv() as (kv, settings):
        set_overrides(kv, tenant, given)
        policy = _effective(kv, tenant, settings)
    _print_policy(policy)


def _effective(kv: KVStore, tenant: str, settings: Settings) -> RetentionPolicy:
    from tiers.retention import effective_policy, read_overrides

    return effective_policy(settings.retention_policy(), read_overrides(kv, tenant))


def _print_policy(policy: RetentionPolicy) -> None:
    from tiers.retention import KINDS, format_ttl

    for kind in KINDS:
        source = "tenant" if kind in policy.tenant_set else "default"
        typer.echo(f"{kind}\t{format_ttl(policy.ttl(kind))}\t{source}")


def build_app() -> typer.Typer:
    """A new Typer app with the library's commands (the ``tiermem`` script adds ``serve``)."""
    app = typer.Typer(help="tiermem: three-tier memory for LLM agents.", no_args_is_help=True)
    app.command()(demo)
    app.command()(info)
    keys_app = typer.Typer(
        help="Create, list and revoke API keys of the HTTP service.", no_args_is_help=True
    )
    keys_app.command("create")(keys_create)
    keys_app.command("list")(keys_list)
    keys_app.command("revoke")(keys_revoke)
    app.add_typer(keys_app, name="keys")
    app.command()(reindex)
    app.command()(resummarize)
    app.command()(sweep)
    app.command()(worker)
    retention_app = typer.Typer(
        help="Show and set a tenant's retention of sessions, transcripts, facts and idle runs.",
        no_args_is_help=True,
    )
    retention_app.command("show")(retention_show)
    retention_app.command("set")(retention_set)
    app.add_typer(retention_app, name="retention")
    app.command("new-master-key")(new_master_key)
    app.command()(encrypt)
    app.command("rotate-master-key")(rotate_master_key)
    app.command()(migrate)
    # _root is defined below build_app, which runs at import: look it up when a command runs.
    app.add_typer(runs_app(lambda command: open_root(command)), name="runs")
    return app


app = build_app()
"""The library's commands (``python -m memory.cli``); the installed script is ``api.cli:app``."""


if __name__ == "__main__":
    app()
