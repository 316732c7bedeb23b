"""`runyard info`: where a command's data lives and what state it is in."""

from __future__ import annotations

from typing import Any

import click

from db.engine import current_revision, head_revision
from db.queries import scheduler_status
from db.vocabulary.settings import Settings
from orchestrator.cli.base import open_existing, safe_url
from orchestrator.format import duration, runyard_version


def home_info(settings: Settings) -> dict[str, Any]:
    """Where this command's data lives and what state it is in (``runyard info``)."""
    version = runyard_version()
    info: dict[str, Any] = {
        "home": str(settings.home),
        "home_source": "RUNYARD_HOME" if settings.home_from_env else "default",
        "database_url": safe_url(settings.db_url),
        "schema_revision": None,
        "schema_head": head_revision(),
        "scheduler": None,
        "token_file": str(settings.token_file) if settings.token_file.is_file() else None,
        "version": version,
    }
    sessions = open_existing(settings)
    if sessions is not None:
        with sessions() as session:
            info["schema_revision"] = current_revision(session.get_bind())  # type: ignore[arg-type]
            info["scheduler"] = scheduler_status(session, heartbeat_file=settings.scheduler_file)
    return info


def print_info(info: dict[str, Any]) -> None:
    """Print :func:`home_info` as aligned lines."""
    home_note = "set by RUNYARD_HOME" if info["home_source"] == "RUNYARD_HOME" else "default; RUNYARD_HOME overrides"
    click.echo(f"home       {info['home']}  ({home_note})")
    click.echo(f"database   {info['database_url']}")
    if info["schema_revision"] is None:
        click.echo("schema     none yet (the first `runyard submit` or `runyard up` creates the database)")
    else:
        click.echo(f"schema     {info['schema_revision']} (newest {info['schema_head']})")
    sched = info["scheduler"]
    if sched is None or sched["age_s"] is None:
        click.echo("scheduler  never started on this database")
    else:
        state = "online" if sched["online"] else "offline"
        click.echo(f"scheduler  {state}, pid {sched['pid']} on {sched['host']}, "
                   f"last heartbeat {duration(sched['age_s'])} ago")
        if sched.get("db_error"):
            click.echo(f"           cannot write the database: {sched['db_error']}")
    click.echo(f"token      {info['token_file'] or 'none'}")
    click.echo(f"version    {info['version']}")
