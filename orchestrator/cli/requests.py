"""The CLI's request verbs: ``submit``, ``cancel``, ``pause``, ``stacks``, ``resume``, ``rerun``,
``fork``, ``pin``. Each validates, writes a request into the database and prints what it did; the scheduler
carries it out (the CLI never starts or signals a training process). A bad value (a config, a
``--step`` or ``--checkpoint`` that names none of the run's checkpoints) exits with code 2; a run
whose state refuses the request with 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import TYPE_CHECKING

import click
from sqlalchemy import select

from db.models import Checkpoint, Run
from db.requests import RequestRefused, request_cancel, request_rerun, request_resume, request_stack_dump, set_pinned
from db.vocabulary.config import ConfigError, effective_batch_change, plausibility_warnings
from db.vocabulary.settings import load_settings
from orchestrator.alerts.store import AlertStore
from orchestrator.cli.base import (
    COUNT,
    EXIT_USAGE,
    RunyardCommand,
    fail,
    open_sessions,
    resolve_ref,
)
from orchestrator.scheduler.resources import known_inventory

if TYPE_CHECKING:
    from sqlalchemy.orm import Session, sessionmaker


@click.command(cls=RunyardCommand)
@click.argument("config_file", type=click.Path(path_type=Path))  # read_config_text says what is wrong with it
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
              help="Override a config key, e.g. train.lr=0.0005.")
@click.option("--json", "as_json", is_flag=True, help="Print {\"id\": N} as JSON.")
def submit(config_file: Path, overrides: tuple[str, ...], as_json: bool) -> None:
    """Queue a run from a TOML config; prints the new run's id."""
    from orchestrator.submission import submit as submit_run  # noqa: PLC0415 - submit and fork only: the other verbs need not load its checks
    from orchestrator.submission import validate_file  # noqa: PLC0415 - submit and fork only: the other verbs need not load its checks

    settings = load_settings()
    try:
        inventory = known_inventory(settings.scheduler_file)
        channels = AlertStore(settings.home).config_problems
        config = validate_file(config_file, list(overrides), inventory, channels=channels)
        for warning in plausibility_warnings(config):  # queued all the same: the shell has no "are you sure"
            click.echo(f"warning: {config_file}: {warning}", err=True)
        run_id = submit_run(open_sessions(settings), settings, config, inventory, channels=channels)
    except ConfigError as exc:
        click.echo(f"error: {config_file}: {exc}\nnothing was queued.", err=True)
        sys.exit(EXIT_USAGE)
    click.echo(json.dumps({"id": run_id}) if as_json else str(run_id))


def check_named_checkpoint(sessions: sessionmaker[Session], run_id: int, step: int | None,
                           checkpoint_id: int | None) -> None:
    """Exit 2 when ``--step`` or ``--checkpoint`` names none of the run's checkpoints (deleted
    ones included: whether one can be used is the request's to say, with exit 1)."""
    if step is None and checkpoint_id is None:
        return
    with sessions() as session:
        rows = session.execute(select(Checkpoint.id, Checkpoint.step, Checkpoint.deleted)
                               .where(Checkpoint.run_id == run_id).order_by(Checkpoint.step, Checkpoint.id)).all()
    kept = [(i, s) for i, s, deleted in rows if not deleted]
    if checkpoint_id is not None and checkpoint_id not in {i for i, _, _ in rows}:
        listed = ", ".join(f"#{i} (step {s})" for i, s in kept[-10:]) or "none"
        fail(f"--checkpoint {checkpoint_id}: run {run_id} has no checkpoint {checkpoint_id}; its checkpoints: "
             f"{listed} (`runyard show {run_id}` lists them)", EXIT_USAGE)
    if checkpoint_id is None and step is not None and step not in {s for _, s, _ in rows}:
        listed = ", ".join(map(str, sorted({s for _, s in kept})[-10:])) or "none"
        fail(f"--step {step}: run {run_id} has no checkpoint at that step; its checkpoints' steps: {listed} "
             f"(`runyard show {run_id}` lists them)", EXIT_USAGE)


def _stop_run(run: str, as_json: bool, mode: str) -> None:
    sessions = open_sessions(load_settings())
    run_id = resolve_ref(sessions, run)
    with sessions() as session:
        try:
            message = request_cancel(session, run_id, who="cli", mode=mode)
        except RequestRefused as exc:
            fail(str(exc))
        session.commit()
    click.echo(json.dumps({"id": run_id, "message": message}) if as_json else message)


@click.command(cls=RunyardCommand)
@click.argument("run")
@click.option("--json", "as_json", is_flag=True)
def cancel(run: str, as_json: bool) -> None:
    """Cancel a run: SIGTERM (the ranks checkpoint and exit), SIGKILL after supervision.grace_s."""
    _stop_run(run, as_json, "cancel")


@click.command(cls=RunyardCommand)
@click.argument("run")
@click.option("--json", "as_json", is_flag=True)
def pause(run: str, as_json: bool) -> None:
    """Pause a run: it checkpoints, frees its devices, and `runyard resume RUN` continues it."""
    _stop_run(run, as_json, "pause")


@click.command(cls=RunyardCommand)
@click.argument("run")
def stacks(run: str) -> None:
    """Save every rank's Python stack of a running run (nothing is stopped)."""
    sessions = open_sessions(load_settings())
    run_id = resolve_ref(sessions, run)
    with sessions() as session:
        try:
            message = request_stack_dump(session, run_id)
        except RequestRefused as exc:
            fail(str(exc))
        session.commit()
    click.echo(message)


@click.command(cls=RunyardCommand)
@click.argument("run")
@click.option("--step", type=COUNT, default=None, help="Checkpoint step (default: the newest verified one).")
@click.option("--checkpoint", "checkpoint_id", type=COUNT, default=None,
              help="Checkpoint id (`runyard show RUN` lists them): a script's own file may have several at a step.")
@click.option("--json", "as_json", is_flag=True)
def resume(run: str, step: int | None, checkpoint_id: int | None, as_json: bool) -> None:
    """Resume a finished run from one of its checkpoints (a new attempt of the same run)."""
    sessions = open_sessions(load_settings())
    run_id = resolve_ref(sessions, run)
    check_named_checkpoint(sessions, run_id, step, checkpoint_id)
    with sessions() as session:
        try:
            chosen = request_resume(session, run_id, step, who="cli", checkpoint_id=checkpoint_id)
        except RequestRefused as exc:
            fail(str(exc))
        session.commit()
    if as_json:
        click.echo(json.dumps({"id": run_id, "step": chosen}))
    else:
        click.echo(f"run {run_id} queued to resume from step {chosen}" if chosen
                   else f"run {run_id} queued again from the start")


@click.command(cls=RunyardCommand)
@click.argument("run")
@click.option("--json", "as_json", is_flag=True)
def rerun(run: str, as_json: bool) -> None:
    """Run a finished script run again in its working directory, without a checkpoint (for a
    script that keeps its own state there)."""
    sessions = open_sessions(load_settings())
    run_id = resolve_ref(sessions, run)
    with sessions() as session:
        try:
            message = request_rerun(session, run_id, who="cli")
        except RequestRefused as exc:
            fail(str(exc))
        session.commit()
    click.echo(json.dumps({"id": run_id, "message": message}) if as_json else message)


@click.command(cls=RunyardCommand)
@click.argument("run")
@click.option("--step", type=COUNT, default=None, help="Checkpoint step of RUN (default: the newest verified one).")
@click.option("--checkpoint", "checkpoint_id", type=COUNT, default=None, help="Checkpoint id of RUN instead of a step.")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Changed setting, e.g. train.lr=0.0001.")
@click.option("--json", "as_json", is_flag=True)
def fork(run: str, step: int | None, checkpoint_id: int | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Start a new run from a checkpoint of RUN with changed settings; prints the new id."""
    from orchestrator.submission import fork as fork_run  # noqa: PLC0415 - submit and fork only: the other verbs need not load its checks

    settings = load_settings()
    sessions = open_sessions(settings)
    parent = resolve_ref(sessions, run)
    check_named_checkpoint(sessions, parent, step, checkpoint_id)
    try:
        new_id = fork_run(sessions, settings, parent, step, list(overrides), known_inventory(settings.scheduler_file),
                          checkpoint_id=checkpoint_id, channels=AlertStore(settings.home).config_problems)
    except ConfigError as exc:
        click.echo(f"error: {exc}\nnothing was queued.", err=True)
        sys.exit(EXIT_USAGE)
    except RequestRefused as exc:
        fail(str(exc))
    note = fork_batch_note(sessions, parent, new_id)
    if note:
        click.echo(f"note: {note}", err=True)
    click.echo(json.dumps({"id": new_id, "parent": parent, "note": note}) if as_json else str(new_id))


def fork_batch_note(sessions: sessionmaker[Session], parent: int, child: int) -> str | None:
    """The effective-batch change of a fork (another number of ranks, batch or accumulation)."""
    with sessions() as session:
        before, after = session.get(Run, parent), session.get(Run, child)
        if before is None or after is None:
            return None
        return effective_batch_change(json.loads(before.config_json), json.loads(after.config_json))


@click.command(cls=RunyardCommand)
@click.argument("run")
@click.option("--step", type=COUNT, default=None, help="Checkpoint step.")
@click.option("--checkpoint", "checkpoint_id", type=COUNT, default=None, help="Checkpoint id instead of a step.")
@click.option("--unpin", is_flag=True, help="Remove the pin instead.")
def pin(run: str, step: int | None, checkpoint_id: int | None, unpin: bool) -> None:
    """Pin a checkpoint so that retention never deletes it (or --unpin). A script's own checkpoint
    file is copied into the run's folder, where the script cannot overwrite it."""
    if step is None and checkpoint_id is None:
        fail("name the checkpoint: --step N or --checkpoint ID (`runyard show RUN` lists them)", EXIT_USAGE)
    sessions = open_sessions(load_settings())
    run_id = resolve_ref(sessions, run)
    check_named_checkpoint(sessions, run_id, step, checkpoint_id)
    with sessions() as session:
        try:
            set_pinned(session, run_id, step or 0, not unpin, checkpoint_id=checkpoint_id)
        except RequestRefused as exc:
            fail(str(exc))
        session.commit()
    what = f"checkpoint {checkpoint_id}" if checkpoint_id is not None else f"step {step}"
    click.echo(f"run {run_id} {what}: {'unpinned' if unpin else 'pinned'}")

