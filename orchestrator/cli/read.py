"""The CLI's reading verbs: ``ls``, ``show``, ``logs``, ``metrics``. They never create a data
folder or a database (cli_base.READ_ONLY_COMMANDS).
"""

from __future__ import annotations

import csv
import datetime as dt
import json
import sys
import time
from pathlib import Path
from typing import Any

import click

from db.compare import runs_list
from db.queries import iter_metric_rows, log_sources, run_detail, run_status
from db.run_list import LIST_SORTS, RunFilter, list_runs
from db.states import TERMINAL, TERMINAL_VALUES, RunStatus
from db.vocabulary import metric_registry
from db.vocabulary.settings import load_settings
from orchestrator.cli.base import (
    COUNT,
    EXIT_USAGE,
    INT64_MAX,
    RunyardCommand,
    existing_sessions,
    fail,
    fmt_duration,
    fmt_time,
    json_safe,
    open_existing,
    resolve_ref,
)
from orchestrator.cost_text import cost_lines_text
from orchestrator.executors.logs import launcher_log, rank_log_files
from orchestrator.format import (
    end_text,
    end_words,
    eta_text,
    exit_text,
    phases_text,
    start_text,
    startup_text,
    step_text,
    where_short,
    where_text,
)
from orchestrator.scripts.attempt_watch import script_facts

# Sorted smallest first unless --reverse; every other column largest (newest) first.
ASCENDING_FIRST = frozenset({"name", "best_loss", "status"})
METRIC_SORTS = frozenset({"best_loss", "headline"})  # read by db.compare.runs_list


def _status_filter(statuses: tuple[str, ...]) -> list[str]:
    """The ``--status`` values in upper case; exit 2 naming an unknown one and the valid ones."""
    valid = [s.value for s in RunStatus]
    wanted = [s.strip().upper() for s in statuses]
    unknown = [s for s, w in zip(statuses, wanted, strict=True) if w not in valid]
    if unknown:
        fail(f"--status {unknown[0]!r} is not a run status; use one of {', '.join(valid)}", EXIT_USAGE)
    return wanted


@click.command("ls", cls=RunyardCommand)
@click.option("--status", "statuses", multiple=True, help="Only runs in this status (repeatable).")
@click.option("--search", default="", metavar="WORDS",
              help="Only runs whose name, tags, note or config values hold every word; key=value matches a config "
                   "value (train.lr=0.001, or lr=0.001).")
@click.option("--tag", "tags", multiple=True, help="Only runs with this tag (repeatable: any of them).")
@click.option("--starred", is_flag=True, help="Only starred runs.")
@click.option("--archived", is_flag=True, help="Archived runs too (hidden otherwise).")
@click.option("--sort", type=click.Choice(sorted(LIST_SORTS)), default="id", show_default=True,
              help="Order by this column: largest first, except name and best_loss (smallest first).")
@click.option("--reverse", is_flag=True, help="The other way round.")
@click.option("--json", "as_json", is_flag=True)
def ls(statuses: tuple[str, ...], search: str, tags: tuple[str, ...], starred: bool, archived: bool, sort: str,
       reverse: bool, as_json: bool) -> None:
    """List runs, newest first (archived ones only with --archived)."""
    wanted = _status_filter(statuses)
    where = RunFilter(statuses=tuple(wanted), search=search, tags=tags, starred=starred, archived=archived)
    descending = (sort not in ASCENDING_FIRST) != reverse
    settings = load_settings()
    sessions = open_existing(settings)
    runs: list[dict[str, Any]] = []
    if sessions is not None:
        with sessions() as session:
            runs = (runs_list(session, where, sort, descending) if sort in METRIC_SORTS
                    else list_runs(session, where=where, sort=sort, descending=descending))
    if as_json:
        click.echo(json.dumps(json_safe(runs), indent=2))
        return
    if not runs:
        if where != RunFilter():
            click.echo(f"no runs match ({_filter_words(where)}) in {settings.home}")
        else:
            click.echo(f"no runs yet in {settings.home}; queue one with `runyard submit examples/digits.toml`")
        return
    metric = sort in METRIC_SORTS
    extra = f" {'BEST LOSS' if sort == 'best_loss' else 'HEADLINE':>10}" if metric else ""
    # YOURS: your cost ("–" until a tariff is set in `runyard settings`); CLOUD: the cloud reference.
    click.echo(f"{'ID':>5}  {'NAME':<20} {'STATUS':<10} {'STEP':>11} {'ELAPSED':>8} {'ENDS':>9} {'YOURS':>9} "
               f"{'CLOUD':>9}{extra}  WHERE  TAGS")
    now = time.time()
    for r in runs:
        step = step_text(r["step"], r["max_steps"])
        ends = end_cell(r["status"], r["eta_s"], now)
        yours = r["cost"]["yours"]["usd"]
        value = ""
        if metric:
            key = "loss" if sort == "best_loss" else r["headline_key"] or "loss"
            number = r["best_loss"] if sort == "best_loss" else r["headline_value"]
            value = f" {metric_registry.format_value(key, number):>10}"
        click.echo(
            f"{r['id']:>4}{'*' if r['starred'] else ' '}  {r['name'][:20]:<20} {r['status']:<10} {step:>11} "
            f"{fmt_duration(r['elapsed_s']):>8} {ends:>9} {f'${yours:.4f}' if yours is not None else '–':>9} "
            f"${r['cost_usd']:>8.4f}{value}  "
            f"{where_short(r['executor'], r['job_id'], r['job_state'])}  {','.join(r['tags'])}".rstrip()
        )
        if starts := start_text(r.get("start_estimate"), short=True):
            click.echo(f"{'':>7}{starts}")  # a queued run: when it should start, under its row


def end_cell(status: str, eta_s: float | None, now: float) -> str:
    """When a run ends, in ``runyard ls``'s nine characters: ``14:05`` today, ``Thu 14:05`` within
    the week, ``3 Dec`` later; ``–`` when it does not apply."""
    ends = eta_text(status, eta_s, None, now).split(" (")[0]
    if ends == "–" or len(ends) <= 5:
        return ends
    at = dt.datetime.fromtimestamp(now + (eta_s or 0.0))
    if (at.date() - dt.datetime.fromtimestamp(now).date()).days < 7:
        return at.strftime("%a %H:%M")
    return f"{at.day} {at.strftime('%b')}"


def _filter_words(where: Any) -> str:
    """What a list was narrowed by, in words."""
    parts = []
    if where.statuses:
        parts.append(f"status {' or '.join(where.statuses)}")
    if where.search:
        parts.append(f"search {where.search!r}")
    if where.tags:
        parts.append(f"tag {' or '.join(where.tags)}")
    if where.starred:
        parts.append("starred")
    if where.archived:
        parts.append("archived included")
    return ", ".join(parts)


def checkpoint_line(c: dict[str, Any]) -> str:
    """One checkpoint of ``runyard show``: id, step, attempt, size, flags, then for a script's own
    file its sha256 (short), modification time and path, else the parameters' digest."""
    flags = [f for f in ("verified", "pinned", "deleted") if c[f]]
    reason = c["refused_reason"] or c["deleted_reason"] or ""
    head = (f"    #{c['id']:<4} step {c['step']:<7} attempt {c['attempt']:<3} {c['bytes'] / 1e6:8.1f} MB  "
            f"{','.join(flags):<16} ")
    if c["source"] == "script":
        where = c["origin"] + (f" (copy: {c['path']})" if c["path"] != c["origin"] else "")
        return (head + f"script  sha256 {(c['sha256'] or '?')[:12]:<12}  {fmt_time(c['file_mtime'])}  {where}"
                + (f"  {reason}" if reason else ""))
    return head + f"runyard {c['params_digest'][:12]}  {reason}"


def _print_detail(d: dict[str, Any]) -> None:
    marks = "".join((" *starred*" if d["starred"] else "", " (archived)" if d["archived"] else ""))
    click.echo(f"run {d['id']}  {d['name']}  {d['status']}  ({d['status_reason']}){marks}")
    if d["tags"]:
        click.echo(f"  tags {', '.join(d['tags'])}")
    if d["note"]:
        click.echo(f"  note {d['note']}")
    ends_label, _ = end_words(d["status"])
    ends = end_text(d["status"], d["ended_at"], d["eta_s"], d.get("eta_range_s"))
    click.echo(f"  step {step_text(d['step'], d['max_steps'])}  elapsed {fmt_duration(d['elapsed_s'])}  "
               f"{ends_label.lower()} {ends}")
    if d.get("eta_basis") and ends != "–":
        click.echo(f"  eta basis: {d['eta_basis']}")
    for line in cost_lines_text(d):
        click.echo(f"  {line}")
    click.echo(f"  dir {d['run_dir']}")
    if starts := start_text(d.get("start_estimate")):
        click.echo(f"  {starts}")
    if starting := startup_text(d["status"], d["attempts"][-1] if d["attempts"] else None, d["config"]):
        click.echo(f"  {starting}")
    if where := where_text(d["config"], d["attempts"][-1] if d["attempts"] else None):
        click.echo(f"  {where}")
    for label, text in script_facts(d["config"], d["attempts"], d["checkpoints"]):
        click.echo(f"  {label}: {text}")
    click.echo("  attempts:")
    for a in d["attempts"]:
        _print_attempt(a)
    if d["status"] == "RETRYING" and d["retry_at"]:
        click.echo(f"  next attempt at {fmt_time(d['retry_at'])} (retries used {d['retries_used']})")
    if d["checkpoints"]:
        click.echo("  checkpoints:")
        for c in d["checkpoints"]:
            click.echo(checkpoint_line(c))
    if d["metrics"]:
        # As the Run page shows them: the registry's label, unit and format ("Step time (ms)  r0=12.3").
        click.echo("  latest metrics:")
        titles = {key: metric_registry.axis_title(key) for key in d["metrics"]}
        width = max(16, *(len(t) for t in titles.values()))
        for key, ranks in d["metrics"].items():
            vals = "  ".join(f"r{r}={metric_registry.format_number(key, v)}" for r, v in ranks.items())
            click.echo(f"    {titles[key]:<{width}} {vals}")


def _print_attempt(a: dict[str, Any]) -> None:
    click.echo(f"    #{a['number']} {a['status']:<9} {exit_text(a['status'], a['exit_code']):<12} "
               f"{fmt_time(a['started_at'])} -> {fmt_time(a['ended_at'])}  {a['reason'] or ''}")
    if a.get("job_id"):
        click.echo(f"       Slurm job {a['job_id']} {a['job_state'] or ''}"
                   + (f" on {a['job_nodes']}" if a.get("job_nodes") else ""))
    if a.get("resume_path"):
        click.echo(f"       started from {a['resume_path']} (step {a['resume_step']})")
    if a["cause"]:
        rank = f"rank {a['failed_rank']}" if a["failed_rank"] is not None else "no rank named"
        lost = a["steps_lost"] if a["steps_lost"] is not None else "unknown"
        click.echo(f"       cause {a['cause']}, {rank}, steps lost {lost}, "
                   f"detected after {fmt_duration(a['detect_s'])}")
    if timed := phases_text(a.get("phases")):
        # After a failure: from it to this attempt's first step; else launch to first step.
        after = "recovery" if a.get("phases") and a["phases"][0]["phase"] == "teardown" else "start-up"
        click.echo(f"       {after}: {timed}")


@click.command(cls=RunyardCommand)
@click.argument("run")
@click.option("--json", "as_json", is_flag=True)
def show(run: str, as_json: bool) -> None:
    """Show a run: status, attempts, latest metrics per rank, cost, ETA."""
    sessions = existing_sessions(load_settings(), run)
    run_id = resolve_ref(sessions, run)
    with sessions() as session:
        detail = run_detail(session, run_id)
    if as_json:
        click.echo(json.dumps(json_safe(detail), indent=2))
    else:
        _print_detail(detail)


def _log_attempt(run_id: int, sources: dict[str, Any], status: str, attempt: int | None, rank: int | None,
                 follow: bool) -> dict[str, Any] | None:
    """The attempt whose logs to print; ``None`` while following a run that has none yet.
    Exits 1 with a sentence for a run without attempts, 2 for an attempt or a rank it does not have.

    Args:
        run_id: The run.
        sources: ``db.queries.log_sources`` of the run.
        status: The run's status now.
        attempt: ``--attempt`` (None: the newest).
        rank: ``--rank`` (None: every rank).
        follow: ``--follow``.
    """
    ranks = sources["world_size"]
    if rank is not None and ranks and rank >= ranks:
        fail(f"--rank {rank}: run {run_id} has ranks 0 to {ranks - 1} (launch.nnodes x launch.nproc_per_node = "
             f"{ranks})", EXIT_USAGE)
    attempts: list[dict[str, Any]] = sources["attempts"]
    if not attempts:
        if follow and status not in TERMINAL_VALUES:
            return None
        fail(f"run {run_id} has no attempts yet (it is {status}), so no logs; "
             f"`runyard logs {run_id} --follow` waits for them")
    if attempt is None:
        return attempts[-1]
    chosen = next((a for a in attempts if a["number"] == attempt), None)
    if chosen is None:
        fail(f"--attempt {attempt}: run {run_id} has attempts 1 to {len(attempts)}", EXIT_USAGE)
    return chosen


@click.command(cls=RunyardCommand)
@click.argument("run")
@click.option("--rank", type=COUNT, default=None, help="Only this rank (default: every rank).")
@click.option("--attempt", type=click.IntRange(1, INT64_MAX), default=None,
              help="Attempt number (default: the newest).")
@click.option("-f", "--follow", is_flag=True, help="Keep printing new lines until the run ends.")
def logs(run: str, rank: int | None, attempt: int | None, follow: bool) -> None:
    """Print the ranks' stdout/stderr of a run's attempt."""
    sessions = existing_sessions(load_settings(), run)
    run_id = resolve_ref(sessions, run)
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
            now_status: str = sources["status"]
            return now_status

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


@click.command(cls=RunyardCommand)
@click.argument("run")
@click.option("--csv", "as_csv", is_flag=True, help="Every raw point as CSV (the default).")
def metrics(run: str, as_csv: bool) -> None:
    """Export a run's raw metric points: attempt, rank, step, key, value, time, superseded, and
    the key's label from the metric registry. ``value`` stays as reported (step_time in seconds,
    mfu a fraction, or a percentage where a script logged one); ``value x display_scale`` is in
    ``display_unit``, as the dashboard shows it."""
    sessions = existing_sessions(load_settings(), run)
    run_id = resolve_ref(sessions, run)
    out = csv.writer(sys.stdout, lineterminator="\n")
    out.writerow(["attempt", "rank", "step", "key", "value", "time", "superseded", "label", "display_unit",
                  "display_scale"])
    specs: dict[str, tuple[str, str]] = {}
    with sessions() as session:
        for row in iter_metric_rows(session, run_id):
            attempt, rank, step, key, value, wall, superseded = row
            if key not in specs:
                spec = metric_registry.spec_for(key)
                specs[key] = (spec.label, spec.unit)
            scale = metric_registry.display_scale(key, (value,))  # a share logged in percent: 1
            out.writerow([attempt, rank, step, key, "nan" if value is None else repr(value), f"{wall:.6f}",
                          int(superseded), *specs[key], f"{scale:g}"])

