"""The CLI's verbs that change what a person keeps about a run after submit: ``edit`` (name,
tags, note), ``star``, ``archive`` and ``rm`` (the run and its folder, after a confirmation that
names its pinned checkpoints). The same functions as the UI's (orchestrator/run_edits.py); each
change is kept as an ``edit`` event of the run. A value refused (a name, a tag, a note) and a
missing answer exit with code 2; a run whose state forbids the change with 1.
"""

from __future__ import annotations

import json

import click

from db.vocabulary.settings import load_settings
from orchestrator.cli.base import EXIT_USAGE, RunyardCommand, fail, open_sessions, resolve_ref
from orchestrator.run_edits import (
    EditRefused,
    EditValueRefused,
    delete_run,
    deletion_plan,
    edit_run,
    set_archived,
    set_starred,
)


@click.command(cls=RunyardCommand)
@click.argument("run")
@click.option("--name", default=None, help="The new name (letters, digits, '.', '_', '-').")
@click.option("--add-tag", "add_tags", multiple=True, metavar="TAG", help="Add a tag (repeatable).")
@click.option("--remove-tag", "remove_tags", multiple=True, metavar="TAG", help="Remove a tag (repeatable).")
@click.option("--note", default=None, help="The run's note (\"\" clears it).")
@click.option("--json", "as_json", is_flag=True)
def edit(run: str, name: str | None, add_tags: tuple[str, ...], remove_tags: tuple[str, ...], note: str | None,
         as_json: bool) -> None:
    """Rename a run, add or remove its tags, set its note; every change is kept in its events."""
    if name is None and not add_tags and not remove_tags and note is None:
        fail("say what to change: --name, --add-tag, --remove-tag or --note", EXIT_USAGE)
    sessions = open_sessions(load_settings())
    run_id = resolve_ref(sessions, run)
    with sessions() as session:
        try:
            done = edit_run(session, run_id, name=name, add_tags=add_tags, remove_tags=remove_tags, note=note,
                            who="cli")
        except EditValueRefused as exc:
            fail(str(exc), EXIT_USAGE)
        session.commit()
    if as_json:
        click.echo(json.dumps({"id": run_id, "changes": done}))
    else:
        click.echo(f"run {run_id}: " + ("; ".join(done) if done else "nothing to change"))


@click.command(cls=RunyardCommand)
@click.argument("run")
@click.option("--unstar", is_flag=True, help="Remove the star instead.")
def star(run: str, unstar: bool) -> None:
    """Star a run (`runyard ls --starred` lists the starred ones), or --unstar it."""
    sessions = open_sessions(load_settings())
    run_id = resolve_ref(sessions, run)
    with sessions() as session:
        message = set_starred(session, run_id, not unstar, who="cli")
        session.commit()
    click.echo(message)


@click.command(cls=RunyardCommand)
@click.argument("run")
@click.option("--unarchive", is_flag=True, help="Bring it back into the list instead.")
def archive(run: str, unarchive: bool) -> None:
    """Archive a finished run: hidden from `runyard ls` and the Runs page unless asked for."""
    sessions = open_sessions(load_settings())
    run_id = resolve_ref(sessions, run)
    with sessions() as session:
        try:
            message = set_archived(session, run_id, not unarchive, who="cli")
        except EditRefused as exc:
            fail(str(exc))
        session.commit()
    click.echo(message)


@click.command("rm", cls=RunyardCommand)
@click.argument("run")
@click.option("-y", "--yes", is_flag=True, help="Delete without asking.")
def rm(run: str, yes: bool) -> None:
    """Delete a finished run and its folder (checkpoints, logs, metrics), after a confirmation
    that names its pinned checkpoints. A run that is not finished is refused: cancel it first."""
    settings = load_settings()
    sessions = open_sessions(settings)
    run_id = resolve_ref(sessions, run)
    with sessions() as session:
        plan = deletion_plan(session, run_id)
        if plan.refused:
            fail(plan.refused)
        if not yes:
            click.echo(plan.confirmation())
            try:
                confirmed = click.confirm("Delete it?", default=False)
            except click.Abort:  # no answer (stdin closed): a script must say --yes
                fail(f"nothing deleted: no answer; `runyard rm {run_id} --yes` deletes without asking", EXIT_USAGE)
            if not confirmed:
                click.echo("nothing deleted")
                return
        try:
            click.echo(delete_run(session, run_id, settings.runs_dir, who="cli"))
        except EditRefused as exc:
            fail(str(exc))
