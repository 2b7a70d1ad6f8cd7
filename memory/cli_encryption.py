"""The ``tiermem`` commands of encryption at rest: new-master-key, encrypt, rotate-master-key."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

from memory.cli_support import master_key_from, open_backend, settings_from_env
from tiers.errors import TierError


def new_master_key(
    out: Annotated[
        Path | None,
        typer.Option(help="Write the key to this new file (mode 0600) instead of printing it."),
    ] = None,
) -> None:
    """Make a random master key for encryption at rest (TIERMEM_MASTER_KEY or ..._FILE)."""
    import os

    from tiers.backends.encrypted_kv import MasterKey

    key, text = MasterKey.generate()
    if out is None:
        typer.echo(text)
    else:
        try:
            fd = os.open(out, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
        except OSError as exc:
            raise typer.BadParameter(f"cannot create {out}: {exc.strerror}") from exc
        with os.fdopen(fd, "w") as file:
            file.write(text + "\n")
    typer.echo(f"master key id {key.id}", err=True)


def encrypt() -> None:
    """Encrypt in place every value the KV store holds unencrypted, with TIERMEM_MASTER_KEY(_FILE).

    Turns encryption on for a store that has data, and renames fact keys to
    opaque tokens (also upgrading a store encrypted by an earlier tiermem, which
    left them readable): stop every service that uses the store first.
    Resumable: run it again after an interruption. The vector index holds no
    text and is left as it is.
    """
    from tiers.backends.dirlock import DataDirLock
    from tiers.backends.encrypted_kv import OVERHEAD, encrypt_existing

    settings = settings_from_env()
    master = master_key_from(settings)
    lock = None
    try:
        if settings.kv_url is None:
            lock = DataDirLock(settings.data_dir)
        with open_backend(settings, extra=OVERHEAD) as kv:
            report = encrypt_existing(kv, master)
    except TierError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    finally:
        if lock is not None:
            lock.release()
    typer.echo(
        f"encrypted {report.encrypted} values in {report.spaces} spaces "
        f"({report.already} were encrypted already) and renamed {report.renamed} fact keys to "
        f"opaque tokens, with master key {master.id}"
    )
    if report.encrypted and not report.scrubbed:
        typer.echo(
            "warning: the store could not drop the replaced plaintext from its files now; "
            "it stays on disk until the store compacts on its own",
            err=True,
        )


def rotate_master_key(
    new_key_file: Annotated[
        Path, typer.Option(help="File holding the new master key (its base64 text).")
    ],
) -> None:
    """Re-wrap the store's data keys from the current master key (TIERMEM_MASTER_KEY(_FILE)) to a new one.

    Values are not rewritten. Safe beside running services: they keep working
    with the data keys they hold; restart them with the new key (a new tenant's
    first write fails until then).
    """
    from tiers.backends.encrypted_kv import MasterKey
    from tiers.backends.encrypted_kv import rotate_master_key as rotate

    settings = settings_from_env()
    old = master_key_from(settings)
    try:
        new = MasterKey.from_file(new_key_file, field="new-key-file")
    except TierError as exc:
        raise typer.BadParameter(str(exc)) from exc
    try:
        with open_backend(settings) as kv:
            count = rotate(kv, old, new)
    except TierError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(1) from exc
    typer.echo(
        f"re-wrapped {count} data keys from master key {old.id} to {new.id}; "
        "set TIERMEM_MASTER_KEY(_FILE) to the new key and restart the services"
    )
