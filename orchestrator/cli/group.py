"""The ``runyard`` command line: the same verbs as the UI.

    runyard up [--host 127.0.0.1] [--port 8501]    scheduler + UI
    runyard submit CONFIG.toml [--set key=value]  queue a run, print its id
    runyard ls | show RUN | logs RUN | cancel RUN
    runyard resume RUN [--step N|--checkpoint ID] | rerun RUN | fork RUN [--step N|--checkpoint ID] [--set k=v]
    runyard pin RUN (--step N|--checkpoint ID)
    runyard edit RUN [--name NAME] [--add-tag T] [--remove-tag T] [--note TEXT]
    runyard star RUN [--unstar] | archive RUN [--unarchive] | rm RUN [--yes]
    runyard pause RUN | stacks RUN | metrics RUN --csv
    runyard import tensorboard LOGDIR [--name NAME]
    runyard scheduler | ui | token [--rotate] | db upgrade | info | config-reference
    runyard db export FILE | db import FILE
    runyard alerts add URL [--on TRIGGER] | ls | rm ID | test [ID] | history [RUN] [--json] | defaults
    runyard settings show [--json] | settings set cost.electricity_usd_per_kwh=0.30 [KEY=VALUE ...]
    runyard sweep start FILE [--set k=v] | preview FILE | ls | show SWEEP [--json] | pause | resume | cancel SWEEP
    runyard sweep promote SWEEP TRIAL | best SWEEP | edit SWEEP [--max-trials N] [--max-concurrent N]

The verbs live by group in this package: requests.py (submit, cancel, pause, stacks, resume, rerun,
fork, pin), edits.py (edit, star, archive, rm), read.py (ls, show, logs, metrics), imported.py
(import), ui.py (up, ui, scheduler, token),
info.py (info), database.py (db export, db import), alerts.py (alerts), sweeps.py (sweep),
settings.py (settings); base.py
holds what they share (the data-folder check, one-line errors, run references).

Data lives under $RUNYARD_HOME (default: the per-user data folder, ~/.local/share/runyard on
Linux); $RUNYARD_DB_URL overrides the database. `runyard info` says which ones a command uses.
"""

from __future__ import annotations

import importlib
import json
import logging

import click

from db.engine import upgrade
from db.vocabulary.settings import load_settings
from orchestrator.cli.base import (
    RunyardGroup,
    json_safe,
    safe_url,
)
from orchestrator.cli.database import db_export, db_import

# The verbs by group, each module imported only when one of its verbs runs (or --help lists
# them): `runyard submit` need not import what `show` reads with (numpy, the scripts' metric
# collector), which took it from 0.45 to 0.75 s of CPU, paid by every script that calls it.
LAZY_COMMANDS = {
    **dict.fromkeys(("scheduler", "ui", "up", "token"), "orchestrator.cli.ui"),
    **dict.fromkeys(("submit", "cancel", "pause", "stacks", "resume", "rerun", "fork", "pin"),
                    "orchestrator.cli.requests"),
    **dict.fromkeys(("ls", "show", "logs", "metrics"), "orchestrator.cli.read"),
    **dict.fromkeys(("edit", "star", "archive", "rm"), "orchestrator.cli.edits"),
    "import": "orchestrator.cli.imported",
    "alerts": "orchestrator.cli.alerts",
    "settings": "orchestrator.cli.settings",
    "sweep": "orchestrator.cli.sweeps",
}


class LazyGroup(RunyardGroup):
    """The top ``runyard`` group: the commands of :data:`LAZY_COMMANDS` load on first use."""

    def list_commands(self, ctx: click.Context) -> list[str]:
        return sorted({*super().list_commands(ctx), *LAZY_COMMANDS})

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name not in self.commands and cmd_name in LAZY_COMMANDS:
            module = importlib.import_module(LAZY_COMMANDS[cmd_name])
            self.add_command(next(c for c in vars(module).values()
                                  if isinstance(c, click.Command) and c.name == cmd_name))
        return super().get_command(ctx, cmd_name)


@click.group(cls=LazyGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def cli(verbose: bool) -> None:
    """runyard: launch, watch and resume distributed PyTorch training on this machine."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("alembic").setLevel(logging.DEBUG if verbose else logging.WARNING)


@cli.group(cls=RunyardGroup)  # not the lazy group's class: `runyard db` holds its own verbs only
def db() -> None:
    """Database maintenance."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Apply the schema migrations (idempotent)."""
    settings = load_settings()
    upgrade(settings.db_url)
    click.echo(f"database at head: {safe_url(settings.db_url)}")


db.add_command(db_export)
db.add_command(db_import)


@cli.command()
@click.option("--json", "as_json", is_flag=True)
def info(as_json: bool) -> None:
    """Say where runyard keeps its data: home, database, schema, scheduler, token, version."""
    from orchestrator.cli.info import home_info, print_info  # noqa: PLC0415 - only for `runyard info`

    details = home_info(load_settings())
    if as_json:
        click.echo(json.dumps(json_safe(details), indent=2))
    else:
        print_info(details)


@cli.command("config-reference")
def config_reference() -> None:
    """Print the run config reference (docs/CONFIG.md) in Markdown."""
    from db.vocabulary.config import reference_markdown  # noqa: PLC0415 - the config model only for config-reference

    click.echo(reference_markdown())


def main() -> None:
    cli(prog_name="runyard")


if __name__ == "__main__":
    main()
