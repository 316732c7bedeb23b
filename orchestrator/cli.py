"""The ``runyard`` command line: the same verbs as the UI.

    runyard up [--host 127.0.0.1] [--port 8501]    scheduler + UI
    runyard submit CONFIG.toml [--set key=value]  queue a run, print its id
    runyard ls | show RUN | logs RUN | cancel RUN
    runyard resume RUN [--step N] | fork RUN [--step N] [--set k=v] | pin RUN --step N
    runyard pause RUN | stacks RUN | metrics RUN --csv
    runyard scheduler | ui | token [--rotate] | db upgrade | info [--adopt-legacy] | config-reference

Data lives under $RUNYARD_HOME (default: the per-user data folder, ~/.local/share/runyard on
Linux); $RUNYARD_DB_URL overrides the database. `runyard info` says which ones a command uses.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import math
import sys
import time
from pathlib import Path
from typing import Any

import click
from sqlalchemy.orm import Session, sessionmaker

from db.settings import Settings, load_settings
from orchestrator.cli_base import (
    EXIT_USAGE,
    RunyardGroup,
    fail,
    no_database_line,
    open_existing,
    open_sessions,
)
from orchestrator.cli_ui import scheduler, token, ui, up

# Ids, steps, ranks and attempts are stored as 64-bit integers.
INT64_MAX = 2**63 - 1
COUNT = click.IntRange(0, INT64_MAX)


def _json_safe(obj: Any) -> Any:
    """NaN and infinities as null: JSON has no token for them (a NaN loss stays visible as null)."""
    if isinstance(obj, float) and not math.isfinite(obj):
        return None
    if isinstance(obj, dict):
        return {k: _json_safe(v) for k, v in obj.items()}
    if isinstance(obj, (list, tuple)):
        return [_json_safe(v) for v in obj]
    return obj

def _settings() -> Settings:
    return load_settings()


def _sessions(settings: Settings) -> sessionmaker[Session]:
    """A sessionmaker on an up-to-date schema, creating the database when there is none."""
    return open_sessions(settings)


def _existing_sessions(settings: Settings, run: str) -> sessionmaker[Session]:
    """The database of a read-only command about ``run``; exit 1 when there is none yet."""
    sessions = open_existing(settings)
    if sessions is None:
        fail(f"no run {run}: {no_database_line(settings)}")
    return sessions



def _fmt_duration(seconds: float | None) -> str:
    from orchestrator.format import duration

    return duration(seconds).replace(" ", "")


def _fmt_time(ts: float | None) -> str:
    return dt.datetime.fromtimestamp(ts).strftime("%Y-%m-%d %H:%M:%S") if ts else "-"


def _resolve(sessions: sessionmaker[Session], ref: str) -> int:
    from db.queries import resolve_run
    from db.requests import RunNotFound

    with sessions() as session:
        try:
            return resolve_run(session, ref)
        except RunNotFound as exc:
            fail(str(exc))
            raise  # unreachable


@click.group(cls=RunyardGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.option("-v", "--verbose", is_flag=True, help="Debug logging.")
def cli(verbose: bool) -> None:
    """runyard: launch, watch and resume distributed PyTorch training on this machine."""
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
    )
    logging.getLogger("alembic").setLevel(logging.DEBUG if verbose else logging.WARNING)


# -- processes -------------------------------------------------------------------------------


for _command in (scheduler, ui, up, token):
    cli.add_command(_command)


@cli.group()
def db() -> None:
    """Database maintenance."""


@db.command("upgrade")
def db_upgrade() -> None:
    """Apply the schema migrations (idempotent)."""
    from db.engine import upgrade

    settings = _settings()
    upgrade(settings.db_url)
    click.echo(f"database at head: {settings.db_url}")


@cli.command()
@click.option("--json", "as_json", is_flag=True)
@click.option("--adopt-legacy", is_flag=True,
              help="Move an older ./.runyard data folder of this directory to the per-user home.")
def info(as_json: bool, adopt_legacy: bool) -> None:
    """Say where runyard keeps its data: home, database, schema, scheduler, token, version."""
    from db.home import adopt_legacy as adopt
    from orchestrator.cli_info import home_info, print_info

    settings = _settings()
    if adopt_legacy:
        click.echo(adopt(settings))
        settings = _settings()
    details = home_info(settings)
    if as_json:
        click.echo(json.dumps(_json_safe(details), indent=2))
    else:
        print_info(details)


@cli.command("config-reference")
def config_reference() -> None:
    """Print the run config reference (docs/CONFIG.md) in Markdown."""
    from db.config import reference_markdown

    click.echo(reference_markdown())


# -- requests --------------------------------------------------------------------------------


@cli.command()
@click.argument("config_file", type=click.Path(path_type=Path))  # read_config_text says what is wrong with it
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Override a config key, e.g. train.lr=0.0005.")
@click.option("--json", "as_json", is_flag=True, help="Print {\"id\": N} as JSON.")
def submit(config_file: Path, overrides: tuple[str, ...], as_json: bool) -> None:
    """Queue a run from a TOML config; prints the new run's id."""
    from db.config import ConfigError, apply_overrides, parse_toml, read_config_text
    from orchestrator.resources import detect_inventory
    from orchestrator.submission import submit as submit_run
    from orchestrator.submission import validate

    settings = _settings()
    try:
        text = read_config_text(config_file)
        inventory = detect_inventory()
        config = validate(apply_overrides(parse_toml(text), list(overrides)), inventory)
        run_id = submit_run(_sessions(settings), settings, config, inventory)
    except ConfigError as exc:
        click.echo(f"error: {config_file}: {exc}\nnothing was queued.", err=True)
        sys.exit(EXIT_USAGE)
    click.echo(json.dumps({"id": run_id}) if as_json else str(run_id))


def _stop_run(run: str, as_json: bool, mode: str) -> None:
    from db.requests import request_cancel

    sessions = _sessions(_settings())
    run_id = _resolve(sessions, run)
    with sessions() as session:
        message = request_cancel(session, run_id, who="cli", mode=mode)
        session.commit()
    click.echo(json.dumps({"id": run_id, "message": message}) if as_json else message)


@cli.command()
@click.argument("run")
@click.option("--json", "as_json", is_flag=True)
def cancel(run: str, as_json: bool) -> None:
    """Cancel a run: SIGTERM (the ranks checkpoint and exit), SIGKILL after supervision.grace_s."""
    _stop_run(run, as_json, "cancel")


@cli.command()
@click.argument("run")
@click.option("--json", "as_json", is_flag=True)
def pause(run: str, as_json: bool) -> None:
    """Pause a run: it checkpoints, frees its devices, and `runyard resume RUN` continues it."""
    _stop_run(run, as_json, "pause")


@cli.command()
@click.argument("run")
def stacks(run: str) -> None:
    """Save every rank's Python stack of a running run (nothing is stopped)."""
    from db.requests import RequestRefused, request_stack_dump

    sessions = _sessions(_settings())
    run_id = _resolve(sessions, run)
    with sessions() as session:
        try:
            message = request_stack_dump(session, run_id)
        except RequestRefused as exc:
            fail(str(exc))
        session.commit()
    click.echo(message)


@cli.command()
@click.argument("run")
@click.option("--step", type=COUNT, default=None, help="Checkpoint step (default: the newest verified one).")
@click.option("--json", "as_json", is_flag=True)
def resume(run: str, step: int | None, as_json: bool) -> None:
    """Resume a finished run from one of its checkpoints (a new attempt of the same run)."""
    from db.requests import RequestRefused, request_resume

    sessions = _sessions(_settings())
    run_id = _resolve(sessions, run)
    with sessions() as session:
        try:
            chosen = request_resume(session, run_id, step, who="cli")
        except RequestRefused as exc:
            fail(str(exc))
        session.commit()
    if as_json:
        click.echo(json.dumps({"id": run_id, "step": chosen}))
    else:
        click.echo(f"run {run_id} queued to resume from step {chosen}")


@cli.command()
@click.argument("run")
@click.option("--step", type=COUNT, default=None, help="Checkpoint step of RUN (default: the newest verified one).")
@click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE", help="Changed setting, e.g. train.lr=0.0001.")
@click.option("--json", "as_json", is_flag=True)
def fork(run: str, step: int | None, overrides: tuple[str, ...], as_json: bool) -> None:
    """Start a new run from a checkpoint of RUN with changed settings; prints the new id."""
    from db.config import ConfigError
    from db.requests import RequestRefused
    from orchestrator.resources import detect_inventory
    from orchestrator.submission import fork as fork_run

    settings = _settings()
    sessions = _sessions(settings)
    parent = _resolve(sessions, run)
    try:
        new_id = fork_run(sessions, settings, parent, step, list(overrides), detect_inventory())
    except ConfigError as exc:
        click.echo(f"error: {exc}\nnothing was queued.", err=True)
        sys.exit(EXIT_USAGE)
    except RequestRefused as exc:
        fail(str(exc))
    click.echo(json.dumps({"id": new_id, "parent": parent}) if as_json else str(new_id))


@cli.command()
@click.argument("run")
@click.option("--step", type=COUNT, required=True, help="Checkpoint step.")
@click.option("--unpin", is_flag=True, help="Remove the pin instead.")
def pin(run: str, step: int, unpin: bool) -> None:
    """Pin a checkpoint so that retention never deletes it (or --unpin)."""
    from db.requests import RequestRefused, set_pinned

    sessions = _sessions(_settings())
    run_id = _resolve(sessions, run)
    with sessions() as session:
        try:
            set_pinned(session, run_id, step, not unpin)
        except RequestRefused as exc:
            fail(str(exc))
        session.commit()
    click.echo(f"run {run_id} step {step}: {'unpinned' if unpin else 'pinned'}")


# -- reading ---------------------------------------------------------------------------------


def _status_filter(statuses: tuple[str, ...]) -> list[str]:
    """The ``--status`` values in upper case; exit 2 naming an unknown one and the valid ones."""
    from db.states import RunStatus

    valid = [s.value for s in RunStatus]
    wanted = [s.strip().upper() for s in statuses]
    unknown = [s for s, w in zip(statuses, wanted) if w not in valid]
    if unknown:
        fail(f"--status {unknown[0]!r} is not a run status; use one of {', '.join(valid)}", EXIT_USAGE)
    return wanted


@cli.command("ls")
@click.option("--status", "statuses", multiple=True, help="Only runs in this status (repeatable).")
@click.option("--json", "as_json", is_flag=True)
def ls(statuses: tuple[str, ...], as_json: bool) -> None:
    """List runs, newest first."""
    from db.queries import list_runs

    wanted = _status_filter(statuses)
    settings = _settings()
    sessions = open_existing(settings)
    runs: list[dict[str, Any]] = []
    if sessions is not None:
        with sessions() as session:
            runs = list_runs(session, wanted or None)
    if as_json:
        click.echo(json.dumps(_json_safe(runs), indent=2))
        return
    if not runs:
        if wanted:
            click.echo(f"no runs with status {' or '.join(wanted)} in {settings.home}")
        else:
            click.echo(f"no runs yet in {settings.home}; queue one with `runyard submit examples/digits.toml`")
        return
    click.echo(f"{'ID':>5}  {'NAME':<20} {'STATUS':<10} {'STEP':>11} {'ELAPSED':>8} {'ETA':>7} {'COST':>9}")
    for r in runs:
        step = f"{r['step']}/{r['max_steps']}"
        click.echo(
            f"{r['id']:>5}  {r['name'][:20]:<20} {r['status']:<10} {step:>11} "
            f"{_fmt_duration(r['elapsed_s']):>8} {_fmt_duration(r['eta_s']):>7} ${r['cost_usd']:>8.4f}"
        )


def _print_detail(d: dict[str, Any]) -> None:
    click.echo(f"run {d['id']}  {d['name']}  {d['status']}  ({d['status_reason']})")
    click.echo(f"  step {d['step']}/{d['max_steps']}  elapsed {_fmt_duration(d['elapsed_s'])}  "
               f"eta {_fmt_duration(d['eta_s'])}  cost ${d['cost_usd']:.4f} ({d['price_unit']})")
    click.echo(f"  dir {d['run_dir']}")
    click.echo("  attempts:")
    for a in d["attempts"]:
        click.echo(f"    #{a['number']} {a['status']:<9} exit {a['exit_code']!s:<4} "
                   f"{_fmt_time(a['started_at'])} -> {_fmt_time(a['ended_at'])}  {a['reason'] or ''}")
        if a["cause"]:
            click.echo(f"       cause {a['cause']}, rank {a['failed_rank']}, steps lost {a['steps_lost']}, "
                       f"detected after {_fmt_duration(a['detect_s'])}")
    if d["status"] == "RETRYING" and d["retry_at"]:
        click.echo(f"  next attempt at {_fmt_time(d['retry_at'])} (retries used {d['retries_used']})")
    if d["checkpoints"]:
        click.echo("  checkpoints:")
        for c in d["checkpoints"]:
            flags = [f for f, on in (("verified", c["verified"]), ("pinned", c["pinned"]), ("deleted", c["deleted"])) if on]
            click.echo(f"    step {c['step']:<7} attempt {c['attempt']:<3} {c['bytes'] / 1e6:8.1f} MB  "
                       f"{','.join(flags):<16} {c['params_digest'][:12]}  {c['refused_reason'] or c['deleted_reason'] or ''}")
    if d["metrics"]:
        click.echo("  latest metrics:")
        for key, ranks in d["metrics"].items():
            vals = "  ".join(f"r{r}={v:.4g}" if v is not None else f"r{r}=nan" for r, v in ranks.items())
            click.echo(f"    {key:<16} {vals}")


@cli.command()
@click.argument("run")
@click.option("--json", "as_json", is_flag=True)
def show(run: str, as_json: bool) -> None:
    """Show a run: status, attempts, latest metrics per rank, cost, ETA."""
    from db.queries import run_detail

    sessions = _existing_sessions(_settings(), run)
    run_id = _resolve(sessions, run)
    with sessions() as session:
        detail = run_detail(session, run_id)
    if as_json:
        click.echo(json.dumps(_json_safe(detail), indent=2))
    else:
        _print_detail(detail)


def _log_attempt(run_id: int, sources: dict[str, Any], status: str, attempt: int | None, rank: int | None,
                 follow: bool) -> dict[str, Any] | None:
    """The attempt whose logs to print; ``None`` while following a run that has none yet.
    Exits 1 with a sentence for a run without attempts, a wrong attempt or a wrong rank.

    Args:
        run_id: The run.
        sources: ``db.queries.log_sources`` of the run.
        status: The run's status now.
        attempt: ``--attempt`` (None: the newest).
        rank: ``--rank`` (None: every rank).
        follow: ``--follow``.
    """
    ranks = sources["nproc_per_node"]
    if rank is not None and ranks and rank >= ranks:
        fail(f"--rank {rank}: run {run_id} has ranks 0 to {ranks - 1} (launch.nproc_per_node = {ranks})")
    attempts = sources["attempts"]
    if not attempts:
        if follow and status not in ("SUCCEEDED", "FAILED", "CANCELLED"):
            return None
        fail(f"run {run_id} has no attempts yet (it is {status}), so no logs; "
             f"`runyard logs {run_id} --follow` waits for them")
    if attempt is None:
        return attempts[-1]
    chosen = next((a for a in attempts if a["number"] == attempt), None)
    if chosen is None:
        fail(f"--attempt {attempt}: run {run_id} has attempts 1 to {len(attempts)}")
    return chosen


@cli.command()
@click.argument("run")
@click.option("--rank", type=COUNT, default=None, help="Only this rank (default: every rank).")
@click.option("--attempt", type=click.IntRange(1, INT64_MAX), default=None, help="Attempt number (default: the newest).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends.")
def logs(run: str, rank: int | None, attempt: int | None, follow: bool) -> None:
    """Print the ranks' stdout/stderr of a run's attempt."""
    from db.queries import log_sources, run_status
    from db.states import TERMINAL, RunStatus
    from orchestrator.logs import launcher_log, rank_log_files

    sessions = _existing_sessions(_settings(), run)
    run_id = _resolve(sessions, run)
    offsets: dict[Path, int] = {}
    sources: dict[str, Any] = {}

    def read_sources() -> str:
        """Read the run's log sources; returns its status. Every poll after the first reads only
        the status and the newest attempt's number (one small statement, every 0.5 s), and the
        attempts again only when a new one has begun."""
        with sessions() as session:
            if sources:
                status, newest = run_status(session, run_id)
                if newest == (sources["attempts"][-1]["number"] if sources["attempts"] else None):
                    return status
            sources.update(log_sources(session, run_id))
            return sources["status"]

    def emit_new() -> str:
        """Print what is new; returns the run's status."""
        status = read_sources()
        chosen = _log_attempt(run_id, sources, status, attempt, rank, follow)
        if chosen is None:
            return status
        adir = Path(chosen["dir"])
        files = rank_log_files(adir)
        if rank is not None and rank not in files and not follow:
            fail(f"no logs for rank {rank} in attempt {chosen['number']} of run {run_id} yet; "
                 f"ranks with logs: {sorted(files) or 'none'}")
        targets = [(f"rank {r}", p) for r, paths in files.items() if rank is None or r == rank for p in paths]
        if rank is None:
            targets.insert(0, ("launcher", launcher_log(adir)))
        for label, path in targets:
            try:
                with open(path, "rb") as f:
                    f.seek(offsets.get(path, 0))
                    data = f.read()
                    offsets[path] = f.tell()
            except OSError:
                continue
            for line in data.decode(errors="replace").splitlines():
                click.echo(f"[{label}] {line}" if rank is None else line)
        return status

    if not follow:
        emit_new()
        return
    while RunStatus(emit_new()) not in TERMINAL:
        time.sleep(0.5)
    emit_new()


@cli.command()
@click.argument("run")
@click.option("--csv", "as_csv", is_flag=True, help="Every raw point as CSV (the default).")
def metrics(run: str, as_csv: bool) -> None:
    """Export a run's raw metric points: attempt, rank, step, key, value, time, superseded."""
    import csv

    from db.queries import iter_metric_rows

    sessions = _existing_sessions(_settings(), run)
    run_id = _resolve(sessions, run)
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["attempt", "rank", "step", "key", "value", "time", "superseded"])
    with sessions() as session:
        for row in iter_metric_rows(session, run_id):
            attempt, rank, step, key, value, wall, superseded = row
            out.writerow([attempt, rank, step, key, "nan" if value is None else repr(value), f"{wall:.6f}", int(superseded)])


def main() -> None:
    cli(prog_name="runyard")


if __name__ == "__main__":
    main()
