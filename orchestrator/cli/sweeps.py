"""The ``runyard sweep`` verbs: start, preview, ls, show, pause, resume, cancel, promote, best,
edit. Each writes a request or reads rows; the scheduler's ``sweeps`` job does the rest (the CLI
never starts a trial). A bad sweep file or option value exits with code 2, nothing started or
changed; a sweep (or trial) that does not exist, or whose state refuses the request, with 1.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

import click

from db.models import Run
from db.sweeps.queries import sweep_detail, sweep_list
from db.sweeps.requests import (
    cancel_sweep,
    edit_sweep,
    pause_sweep,
    promote,
    resolve_sweep,
    resume_sweep,
    trial_of,
)
from db.vocabulary.config import ConfigError, plausibility_warnings
from db.vocabulary.config.sweep import MAX_TRIALS
from db.vocabulary.config.writing import toml_document
from db.vocabulary.settings import load_settings
from orchestrator.alerts.store import AlertStore
from orchestrator.cli.base import (
    COUNT,
    EXIT_USAGE,
    RunyardGroup,
    fail,
    fmt_duration,
    json_safe,
    open_existing,
    open_sessions,
)
from orchestrator.scheduler.resources import known_inventory
from orchestrator.sweeps.preview import preview_in, preview_lines
from orchestrator.sweeps.space import sweep_tag
from orchestrator.sweeps.submission import start_sweep, validate_sweep_file

FILE = click.Path(path_type=Path)  # read_config_text says what is wrong with it
SET = click.option("--set", "overrides", multiple=True, metavar="KEY=VALUE",
                   help="Override a key of the file, e.g. train.max_steps=600 or sweep.max_trials=20.")
AS_JSON = click.option("--json", "as_json", is_flag=True, help="Print JSON.")


@click.group(cls=RunyardGroup)
def sweep() -> None:
    """Sweeps: a search over a run config, each trial a run (docs/SWEEPS.md)."""


def _checked(config_file: Path, overrides: tuple[str, ...], verb: str) -> Any:
    """The sweep file checked on this machine; exit 2 with every problem when it is refused."""
    settings = load_settings()
    try:
        config = validate_sweep_file(config_file, list(overrides), known_inventory(settings.scheduler_file),
                                     channels=AlertStore(settings.home).config_problems)
    except ConfigError as exc:
        click.echo(f"error: {config_file}: {exc}\nnothing was {verb}.", err=True)
        sys.exit(EXIT_USAGE)
    for warning in plausibility_warnings(config.base()):
        click.echo(f"warning: {config_file}: {warning}", err=True)
    return config


@sweep.command()
@click.argument("config_file", type=FILE)
@SET
@AS_JSON
def start(config_file: Path, overrides: tuple[str, ...], as_json: bool) -> None:
    """Start a sweep from a run config with a [sweep] section; prints its id."""
    config = _checked(config_file, overrides, "started")
    sweep_id = start_sweep(open_sessions(load_settings()), config)
    click.echo(json.dumps({"id": sweep_id}) if as_json else str(sweep_id))


@sweep.command("preview")
@click.argument("config_file", type=FILE)
@SET
@AS_JSON
def preview_command(config_file: Path, overrides: tuple[str, ...], as_json: bool) -> None:
    """The arithmetic before Start: trials, rungs, full-run equivalents, GPU-hours and cost."""
    config = _checked(config_file, overrides, "previewed")
    settings = load_settings()
    shown = preview_in(open_existing(settings), config, known_inventory(settings.scheduler_file))
    click.echo(json.dumps(json_safe(shown.as_dict()), indent=2) if as_json else "\n".join(preview_lines(shown)))


def _value(v: float | None) -> str:
    return "-" if v is None else f"{v:.5g}"


@sweep.command("ls")
@AS_JSON
def ls(as_json: bool) -> None:
    """List sweeps, newest first: status, trials by status, best value, spent."""
    sessions = open_existing(load_settings())
    rows: list[dict[str, Any]] = []
    if sessions is not None:
        with sessions() as session:
            rows = sweep_list(session)
    if as_json:
        click.echo(json.dumps(json_safe(rows), indent=2))
        return
    if not rows:
        click.echo("no sweeps yet; start one with `runyard sweep start FILE` (docs/SWEEPS.md)")
        return
    click.echo(f"{'ID':>4}  {'NAME':<20} {'STATUS':<9} {'TRIALS':>9} {'BEST':>10}  {'SPENT':>9}  BY STATUS")
    for r in rows:
        best = r["best"]
        by = ", ".join(f"{n} {s}" for s, n in sorted(r["by_status"].items()))
        click.echo(f"{r['id']:>4}  {r['name'][:20]:<20} {r['status']:<9} {r['trial_count']:>4}/{r['max_trials']:<4} "
                   f"{_value(best['value'] if best else None):>10}  ${r['spent']['usd']:>8.4f}  {by}")


def _detail(session_ref: str) -> dict[str, Any]:
    sessions = open_existing(load_settings())
    if sessions is None:
        fail(f"no sweep {session_ref}: no database yet")
    with sessions() as session:
        detail = sweep_detail(session, resolve_sweep(session, session_ref))
    assert detail is not None
    return detail


def _print_sweep(d: dict[str, Any]) -> None:
    click.echo(f"sweep {d['id']}  {d['name']}  {d['status']}  ({d['status_reason']})")
    click.echo(f"  {d['searcher']} over {', '.join(d['space'])}: {d['metric']} ({d['goal']}), "
               f"{d['trial_count']} of {d['max_trials']} trial(s), {d['max_concurrent']} at a time, seed {d['seed']}")
    spent, budget = d["spent"], d["budget"]
    limits = ", ".join(f"{k} {budget[k]:g}" for k in budget if budget[k]) or "none"
    ends = fmt_duration(d["eta_s"]) if d["eta_s"] is not None else "?"
    click.echo(f"  spent {spent['gpu_hours']:.3g} GPU-hours, ${spent['usd']:.4f}, "
               f"{fmt_duration(spent['wall_hours'] * 3600)} (budget: {limits}); ends in {ends}")
    for r in d["rung_table"]:
        click.echo(f"  rung {r['rung']} at step {r['step']}: {r['count']} value(s), best {r['kept']} go on")
    click.echo(f"  {'#':>3} {'RUN':>5}  {'STATUS':<10} {'RUNG':>4} {'VALUE':>10} {'STEP':>7}  PARAMS")
    for t in d["trials"]:
        params = ", ".join(f"{k}={_value(v) if isinstance(v, float) else v}" for k, v in t["params"].items())
        rung = "-" if t["rung"] is None else str(t["rung"])
        step = "-" if t["step"] is None else str(t["step"])
        click.echo(f"  {t['number']:>3} {t['run_id'] or '-':>5}  {t['status']:<10} {rung:>4} {_value(t['value']):>10} "
                   f"{step:>7}  {params}{'  ' + t['error'] if t['error'] else ''}")
    if d["best"] is not None:
        click.echo(f"  best: trial {d['best']['number']} (run {d['best']['run_id']}), {d['metric']} "
                   f"{_value(d['best']['value'])}; `runyard sweep best {d['id']}` prints its config")


@sweep.command()
@click.argument("sweep_ref", metavar="SWEEP")
@AS_JSON
def show(sweep_ref: str, as_json: bool) -> None:
    """One sweep (an id or a name): its trials with their params, status and objective, its rungs."""
    detail = _detail(sweep_ref)
    if as_json:
        click.echo(json.dumps(json_safe(detail), indent=2))
    else:
        _print_sweep(detail)


def _request(sweep_ref: str, as_json: bool, act: Any) -> None:
    """Resolve the sweep, make the request ``act(session, id)`` (its sentence), commit, print it."""
    sessions = open_sessions(load_settings())
    with sessions() as session:
        sweep_id = resolve_sweep(session, sweep_ref)
        message = act(session, sweep_id)
        session.commit()
    click.echo(json.dumps({"id": sweep_id, "message": message}) if as_json else message)


@sweep.command()
@click.argument("sweep_ref", metavar="SWEEP")
@AS_JSON
def pause(sweep_ref: str, as_json: bool) -> None:
    """Start and promote no trial until resumed (the trials training go on)."""
    _request(sweep_ref, as_json, lambda s, i: pause_sweep(s, i, who="cli"))


@sweep.command()
@click.argument("sweep_ref", metavar="SWEEP")
@AS_JSON
def resume(sweep_ref: str, as_json: bool) -> None:
    """Resume a paused sweep."""
    _request(sweep_ref, as_json, lambda s, i: resume_sweep(s, i, who="cli"))


@sweep.command()
@click.argument("sweep_ref", metavar="SWEEP")
@AS_JSON
def cancel(sweep_ref: str, as_json: bool) -> None:
    """End a sweep and cancel its trials still training (they checkpoint and stop)."""
    _request(sweep_ref, as_json, lambda s, i: cancel_sweep(s, i, who="cli"))


@sweep.command("promote")
@click.argument("sweep_ref", metavar="SWEEP")
@click.argument("trial", type=COUNT)
@AS_JSON
def promote_command(sweep_ref: str, trial: int, as_json: bool) -> None:
    """Continue a PRUNED trial from its checkpoint (its steps so far are kept)."""
    def act(session: Any, sweep_id: int) -> str:
        step = promote(session, trial_of(session, sweep_id, trial), "cli")
        return f"sweep {sweep_id}: trial {trial} promoted; it continues from step {step}"

    _request(sweep_ref, as_json, act)


@sweep.command()
@click.argument("sweep_ref", metavar="SWEEP")
def best(sweep_ref: str) -> None:
    """Print the best trial's full config as TOML, ready to submit or fork from."""
    detail = _detail(sweep_ref)
    chosen = detail["best"]
    if chosen is None or chosen["run_id"] is None:
        fail(f"sweep {detail['id']} has no trial with a value of {detail['metric']} yet")
    sessions = open_existing(load_settings())
    assert sessions is not None
    with sessions() as session:
        run = session.get(Run, chosen["run_id"])
        assert run is not None
        config = json.loads(run.config_json)
    config["tags"] = [t for t in config.get("tags", []) if t != sweep_tag(detail["id"])]  # a copy is no trial
    run_id = chosen["run_id"]
    click.echo(f"# sweep {detail['id']} ({detail['name']}): its best trial, {chosen['number']} (run {run_id}, "
               f"{chosen['status']}), {detail['metric']} = {_value(chosen['value'])}\n"
               f"# `runyard submit FILE` trains it again; `runyard fork {run_id}` goes on from its checkpoint\n"
               + toml_document(config))


@sweep.command()
@click.argument("sweep_ref", metavar="SWEEP")
@click.option("--max-trials", type=click.IntRange(1, MAX_TRIALS), default=None, help="The most trials to start.")
@click.option("--max-concurrent", type=click.IntRange(1, 1024), default=None, help="The most trials at once.")
@AS_JSON
def edit(sweep_ref: str, max_trials: int | None, max_concurrent: int | None, as_json: bool) -> None:
    """Change a running sweep's limits: how many trials in all, and at once."""
    if max_trials is None and max_concurrent is None:
        fail("say what to change: --max-trials or --max-concurrent", EXIT_USAGE)
    _request(sweep_ref, as_json,
             lambda s, i: edit_sweep(s, i, max_trials=max_trials, max_concurrent=max_concurrent, who="cli"))
