"""The CLI's import verbs: ``runyard import tensorboard LOGDIR [--name NAME]`` makes a finished
run of a past run's TensorBoard scalars (orchestrator/scripts/imported_runs.py) and prints its id."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import click

from db.vocabulary.config import ConfigError
from db.vocabulary.settings import load_settings
from orchestrator.cli.base import EXIT_USAGE, RunyardCommand, fail, open_sessions


@click.group("import")
def import_() -> None:
    """Bring a run trained elsewhere into runyard."""


@import_.command(cls=RunyardCommand)
@click.argument("logdir", type=click.Path(path_type=Path))
@click.option("--name", default=None, help="The run's name (default: the folder's name).")
@click.option("--json", "as_json", is_flag=True, help="Print {\"id\": N} as JSON.")
def tensorboard(logdir: Path, name: str | None, as_json: bool) -> None:
    """Import the scalars of a TensorBoard log folder as a SUCCEEDED run; prints its id."""
    from orchestrator.scripts.imported_runs import LogdirError, import_tensorboard  # noqa: PLC0415 - TensorBoard and numpy only when the verb runs, not for --help

    settings = load_settings()
    try:
        run_id = import_tensorboard(open_sessions(settings), settings.runs_dir, logdir, name)
    except ConfigError as exc:
        click.echo(f"error: --name {name!r}: {exc}", err=True)
        sys.exit(EXIT_USAGE)
    except LogdirError as exc:
        fail(f"{exc}; nothing was imported", EXIT_USAGE)  # LOGDIR names no folder of scalars: bad input
    click.echo(json.dumps({"id": run_id}) if as_json else str(run_id))
