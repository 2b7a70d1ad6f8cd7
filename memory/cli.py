"""The ``tiermem`` command line."""

from __future__ import annotations

import importlib
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

import typer
from pydantic import ValidationError

from memory.apikeys import ApiKeyError, ApiKeyRegistry
from memory.settings import Settings
from summarizer.errors import SummarizerError
from tiers.backends import open_kv_store
from tiers.errors import TierError

if TYPE_CHECKING:
    from memory.facade import Memory

app = typer.Typer(help="tiermem: three-tier memory for LLM agents.", no_args_is_help=True)


@app.command()
def demo(
    data_dir: Annotated[
        Path | None,
        typer.Option(help="Folder for the demo's stores (default: a new temporary folder)."),
    ] = None,
) -> None:
    """Run the scripted story: preferences, a crash-and-resume workflow, session recall."""
    from memory.demo import main

    main(data_dir)


@app.command()
def info() -> None:
    """Print the settings in effect (from TIERMEM_* environment variables)."""
    from memory.settings import Settings

    settings = Settings()
    for name, value in settings.model_dump().items():
        typer.echo(f"{name} = {value}")


@app.command()
def serve(
    host: Annotated[
        str | None, typer.Option(help="Interface to bind (default: TIERMEM_API_HOST or 127.0.0.1).")
    ] = None,
    port: Annotated[
        int | None, typer.Option(help="Port to bind (default: TIERMEM_API_PORT or 8080).")
    ] = None,
    no_auth: Annotated[
        bool,
        typer.Option(
            "--no-auth", help="Accept requests without an API key (local development only)."
        ),
    ] = False,
) -> None:
    """Run the HTTP service (settings from TIERMEM_* environment variables)."""
    # The service lives in the api package, above this one; it is looked up by name so the
    # memory package never imports it (layers point down only).
    server = importlib.import_module("api.server")
    settings = _settings()
    if no_auth:
        settings = settings.model_copy(update={"auth_enabled": False})
    server.serve(settings, host=host, port=port)


keys_app = typer.Typer(
    help="Create, list and revoke API keys of the HTTP service.", no_args_is_help=True
)
app.add_typer(keys_app, name="keys")


@keys_app.command("create")
def keys_create(
    tenant: Annotated[str, typer.Option(help="Tenant the key acts in.")],
    read_only: Annotated[
        bool, typer.Option("--read-only", help="Allow only reads (GET, recall, context).")
    ] = False,
    name: Annotated[str, typer.Option(help="A label: who or what uses the key.")] = "",
) -> None:
    """Create an API key and print it once (only its SHA-256 is stored)."""
    with _registry() as registry:
        key, info = registry.create(tenant, read_only=read_only, name=name)
    typer.echo(key)
    typer.echo(
        f"key id {info.key_id}, tenant {info.tenant}, scopes {','.join(info.scopes)}: "
        "store the key now, it cannot be shown again",
        err=True,
    )


@keys_app.command("list")
def keys_list(
    tenant: Annotated[str | None, typer.Option(help="Only this tenant's keys.")] = None,
) -> None:
    """List API keys (ids, tenants, scopes; never the keys themselves)."""
    with _registry() as registry:
        infos = registry.list_keys(tenant=tenant)
    for info in infos:
        state = f"revoked {info.revoked_at:%Y-%m-%dT%H:%M:%SZ}" if info.revoked_at else "active"
        typer.echo(
            f"{info.key_id}\t{info.tenant}\t{','.join(info.scopes)}\t{state}\t"
            f"{info.created_at:%Y-%m-%dT%H:%M:%SZ}\t{info.name}"
        )


@keys_app.command("revoke")
def keys_revoke(
    key_id: Annotated[str, typer.Argument(help="The key id shown by `keys list`.")],
) -> None:
    """Revoke an API key for good (running servers stop accepting it within auth_cache_seconds)."""
    with _registry() as registry:
        info = registry.revoke(key_id)
    typer.echo(f"revoked {info.key_id} (tenant {info.tenant})")


TenantOption = Annotated[str, typer.Option(help="The tenant whose sessions to process.")]
UsersOption = Annotated[
    list[str] | None,
    typer.Option("--user", help="Only this user (repeatable); default every user."),
]


@app.command()
def reindex(tenant: TenantOption = "default", user: UsersOption = None) -> None:
    """Rebuild the session vector index from the KV store (a damaged index, a new embedder).

    The KV store is the truth and is not changed; recall keeps working meanwhile.
    """
    from tiers.session import ReindexProgress

    with _memory(tenant) as memory:
        bar: Any = None

        def progress(step: ReindexProgress) -> None:
            nonlocal bar
            if bar is None:
                bar = typer.progressbar(length=step.total, label="re-embedding sessions")
                bar.__enter__()
            bar.update(step.done - bar.pos)

        try:
            done = memory.sessions.reindex(user, progress=progress)
        finally:
            if bar is not None:
                bar.__exit__(None, None, None)
        typer.echo(f"reindexed {done} sessions of tenant {tenant}")


@app.command()
def resummarize(tenant: TenantOption = "default", user: UsersOption = None) -> None:
    """Summarize every session whose transcript is stored but has no summary (a failed summary)."""
    with _memory(tenant) as memory:
        users = user or memory.sessions.user_ids()
        pending = [(u, sid) for u in users for sid in memory.pending_summaries(u)]
        failed = 0
        with typer.progressbar(pending, label="summarizing") as bar:
            for user_id, session_id in bar:
                try:
                    memory.resummarize(user_id, session_id)
                except (TierError, SummarizerError) as exc:
                    failed += 1
                    typer.echo(f"\n{user_id}/{session_id}: {exc}", err=True)
        typer.echo(f"summarized {len(pending) - failed} of {len(pending)} pending sessions")
        if failed:
            raise typer.Exit(1)


@contextmanager
def _memory(tenant: str) -> Iterator[Memory]:
    """The configured stores, as one tenant's view; errors become a clear message and exit 1."""
    from memory.facade import Memory

    settings = _settings()
    try:
        with Memory.from_settings(settings) as memory:
            yield memory.for_tenant(tenant)
    except TierError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


def _settings() -> Settings:
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        raise typer.BadParameter(f"TIERMEM_{str(first['loc'][0]).upper()}: {first['msg']}") from exc


@contextmanager
def _registry() -> Iterator[ApiKeyRegistry]:
    """The key registry on the configured KV store only (no index or model is opened)."""
    settings = _settings()
    try:
        kv = open_kv_store(
            settings.kv_location(),
            max_value_bytes=settings.max_value_bytes,
            durable=settings.durable,
        )
    except TierError as exc:
        raise typer.BadParameter(str(exc)) from exc
    try:
        yield ApiKeyRegistry(kv)
    except (ApiKeyError, TierError) as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    finally:
        kv.close()


if __name__ == "__main__":
    app()
