"""What the ``tiermem`` commands share: settings from the environment, and the stores opened
for one command (whole, the KV store alone, the API-key registry, the raw backend), each turning
a store's error into a message and exit status 1.
"""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING

import typer
from pydantic import ValidationError

from memory.apikeys import ApiKeyError, ApiKeyRegistry
from memory.settings import Settings
from tiers.backends import open_kv_backend, open_kv_store, require_durable
from tiers.errors import DataDirLockedError, TierError

if TYPE_CHECKING:
    from memory.facade import Memory
    from tiers.backends.base import KVStore
    from tiers.backends.encrypted_kv import MasterKey


def settings_from_env() -> Settings:
    """Settings from ``TIERMEM_*``; a bad one is a usage error naming the variable."""
    try:
        return Settings()
    except ValidationError as exc:
        first = exc.errors()[0]
        raise typer.BadParameter(f"TIERMEM_{str(first['loc'][0]).upper()}: {first['msg']}") from exc


# What to do instead when a maintenance command finds the data dir held by a live server.
BESIDE_A_SERVER = {
    "reindex": "a running server checks its index every TIERMEM_INDEX_CHECK_INTERVAL_SECONDS "
    "and repairs TIERMEM_INDEX_REPAIR_BATCH sessions and items each time by itself; or stop it, "
    "run `tiermem reindex`, then start it again",
    "resummarize": "stop the server first, or ask it per session: "
    "POST /v1/users/{user_id}/sessions/{session_id}:resummarize",
    "sweep": "a running server sweeps itself every "
    "TIERMEM_RUN_SWEEP_INTERVAL_SECONDS; or stop it first",
    "runs": "stop the server first, or ask it: GET /v1/runs, GET /v1/runs/{run_id}, "
    "GET /v1/runs/{run_id}:resume-plan",
}


@contextmanager
def open_root(command: str) -> Iterator[Memory]:
    """The configured stores (views of any tenant: ``for_tenant``); errors: a message and exit 1."""
    from memory.facade import Memory

    settings = settings_from_env()
    try:
        with Memory.from_settings(settings) as memory:
            yield memory
    except DataDirLockedError as exc:
        typer.echo(f"error: {exc}", err=True)
        typer.echo(
            f"`tiermem {command}` needs the data dir to itself: {BESIDE_A_SERVER[command]}",
            err=True,
        )
        raise typer.Exit(1) from exc
    except TierError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc


@contextmanager
def open_kv() -> Iterator[tuple[KVStore, Settings]]:
    """The configured KV store only, without the data dir's lock (safe beside a live server)."""
    settings = settings_from_env()
    try:
        kv = open_kv_store(
            settings.kv_location(),
            max_value_bytes=settings.max_value_bytes,
            durable=settings.durable,
            master_key=settings.encryption_key(),
        )
    except TierError as exc:
        raise typer.BadParameter(str(exc)) from exc
    try:
        require_durable(kv, allow_volatile=settings.allow_volatile)
        yield kv, settings
    except TierError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    finally:
        kv.close()


@contextmanager
def open_registry() -> Iterator[ApiKeyRegistry]:
    """The key registry on the configured KV store only (no index or model is opened).

    It does not take the data dir's lock: key commands are meant to run beside a
    live server (SQLite serialises writers of several processes; the server reads
    keys from the store, trusting a verified one for ``auth_cache_seconds``).
    """
    with open_kv() as (kv, _):
        try:
            yield ApiKeyRegistry(kv)
        except ApiKeyError as exc:
            typer.echo(f"error: {exc}", err=True)
            raise typer.Exit(1) from exc


def master_key_from(settings: Settings) -> MasterKey:
    try:
        key = settings.encryption_key()
    except TierError as exc:
        raise typer.BadParameter(str(exc)) from exc
    if key is None:
        raise typer.BadParameter(
            "set TIERMEM_MASTER_KEY or TIERMEM_MASTER_KEY_FILE (`tiermem new-master-key` makes one)"
        )
    return key


@contextmanager
def open_backend(settings: Settings, *, extra: int = 0) -> Iterator[KVStore]:
    """The KV backend as it stores bytes (see ``open_kv_backend``), closed afterwards."""
    kv = open_kv_backend(
        settings.kv_location(),
        max_value_bytes=settings.max_value_bytes + extra,
        durable=settings.durable,
    )
    try:
        yield kv
    finally:
        kv.close()
