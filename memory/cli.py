"""The ``tiermem`` command line."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer

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


if __name__ == "__main__":
    app()
