"""``runyard alerts``: the channels alerts go to, the global defaults, a test, and the history.

    runyard alerts add URL [--on TRIGGER ...] [--secret S] [--allow HOST]
    runyard alerts ls [--json]
    runyard alerts rm ID
    runyard alerts test [ID ...]
    runyard alerts history [RUN] [--json]
    runyard alerts defaults [--triggers a,b] [--repeat-s N] [--quiet-hours 22:00-07:00]
                            [--day-budget-usd X] [--ui-url URL]

URLs are shown masked (their secrets stay in ``alerts.json``, mode 0600, in the data folder). A
value that cannot be accepted (a URL, a trigger, a secret, a channel id: :class:`RefusedValue`)
exits with code 2, a data folder that cannot be used with 1.
"""

from __future__ import annotations

import json
from typing import Any, NoReturn

import click

from db.vocabulary.config import TRIGGERS
from db.vocabulary.settings import load_settings
from orchestrator.alerts import AlertsError, RefusedValue
from orchestrator.alerts.store import AlertStore, off_by_default_note
from orchestrator.cli.base import (
    EXIT_FAILURE,
    EXIT_USAGE,
    RunyardGroup,
    fail,
    fmt_time,
    json_safe,
    open_existing,
    open_sessions,
    resolve_ref,
)

TRIGGER = click.Choice(TRIGGERS)


@click.group(cls=RunyardGroup)
def alerts() -> None:
    """Alerts: where runyard tells you about your runs (docs/ALERTS.md)."""


@alerts.command("add")
@click.argument("url")
@click.option("--on", "on", multiple=True, type=TRIGGER, help="Only these triggers (repeat the option), sent here "
              "even when the defaults leave them off; default: every trigger enabled for the run.")
@click.option("--secret", default=None, help="The signed webhook's HMAC secret, at least 16 characters "
              "(default: a new random one).")
@click.option("--allow", multiple=True, help="A host name whose link-local or metadata address may be reached.")
def add(url: str, on: tuple[str, ...], secret: str | None, allow: tuple[str, ...]) -> None:
    """Add a channel: an Apprise URL (json://, mailto://, slack://, ntfy://, ...) or
    runyard+https://HOST/PATH (runyard's signed webhook)."""
    store = AlertStore(load_settings().home)
    try:
        channel = store.add(url, on=on, secret=secret, allow=allow)
        defaults = store.load().defaults
    except AlertsError as exc:
        refused(exc)
    click.echo(f"channel {channel.id} added: {channel.masked}" + (f" (on {', '.join(on)})" if on else ""))
    if note := off_by_default_note(channel, defaults):
        click.echo(f"note: {note}", err=True)
    if channel.signed and secret is None:
        click.echo(f"its signing secret (X-Runyard-Signature: sha256=HMAC-SHA256(secret, body)): {channel.secret}")


def refused(exc: AlertsError) -> NoReturn:
    """End the command: exit 2 for a value refused, 1 for a data folder that cannot be used."""
    fail(str(exc), EXIT_USAGE if isinstance(exc, RefusedValue) else EXIT_FAILURE)


@alerts.command("ls")
@click.option("--json", "as_json", is_flag=True)
def ls(as_json: bool) -> None:
    """The channels (masked) and the defaults."""
    settings = AlertStore(load_settings().home).load()
    if as_json:
        click.echo(json.dumps({"channels": [{"id": c.id, "url": c.masked, "on": list(c.on), "signed": c.signed,
                                             "allow": list(c.allow)} for c in settings.channels],
                               "defaults": {**settings.defaults.__dict__}}, indent=2, default=list))
        return
    if not settings.channels:
        click.echo("no channels: `runyard alerts add URL` adds one")
    for c in settings.channels:
        click.echo(f"{c.id:>3}  {c.masked}  on: {', '.join(c.on) or 'every enabled trigger'}"
                   + ("  (signed)" if c.signed else ""))
    d = settings.defaults
    click.echo(f"defaults: triggers {', '.join(d.triggers)}; repeat every {d.repeat_s:g} s; quiet hours "
               f"{d.quiet_hours or 'none'}; day budget {f'${d.day_budget_usd:.2f}' if d.day_budget_usd else 'none'}")


@alerts.command("rm")
@click.argument("channel_id", type=int)
def rm(channel_id: int) -> None:
    """Remove a channel."""
    try:
        gone = AlertStore(load_settings().home).remove(channel_id)
    except AlertsError as exc:
        refused(exc)
    click.echo(f"channel {gone.id} removed: {gone.masked}")


@alerts.command("test")
@click.argument("channel_ids", nargs=-1, type=int)
def test(channel_ids: tuple[int, ...]) -> None:
    """Send a test message to each channel (or those named) and say which failed."""
    from orchestrator.alerts.engine import send_test  # noqa: PLC0415 - the alert engine and database only for this verb

    settings = load_settings()
    try:
        rows = send_test(open_sessions(settings), settings.home, list(channel_ids) or None)
    except AlertsError as exc:
        refused(exc)
    if not rows:
        fail("no channels: `runyard alerts add URL` adds one")
    for row in rows:
        click.echo(f"channel {row.channel_id} {row.channel}: {row.status}" + (f": {row.error}" if row.error else ""))
    failed = [r for r in rows if r.status != "delivered"]
    if failed:
        fail(f"{len(failed)} of {len(rows)} channel(s) failed")


@alerts.command("history")
@click.argument("run", required=False)
@click.option("--json", "as_json", is_flag=True)
@click.option("--limit", default=50, show_default=True, type=click.IntRange(1, 10_000))
def history(run: str | None, as_json: bool, limit: int) -> None:
    """The alerts (of one run, or all), newest first, with each delivery's outcome."""
    from orchestrator.alerts.engine import history as read_history  # noqa: PLC0415 - the alert engine and database only for this verb

    settings = load_settings()
    sessions = open_existing(settings)
    if sessions is None:
        rows: list[dict[str, Any]] = []
    else:
        run_id = resolve_ref(sessions, run) if run is not None else None
        with sessions() as session:
            rows = read_history(session, run_id, limit)
    if as_json:
        click.echo(json.dumps(json_safe(rows), indent=2))
        return
    if not rows:
        click.echo("no alerts")
    for a in rows:
        where = f"run {a['run_id']}" if a["run_id"] is not None else "runyard"
        click.echo(f"{fmt_time(a['opened_at'])}  {a['trigger']:<9} {a['state']:<8} {where}: {a['message']}")
        for d in a["deliveries"]:
            click.echo(f"    {d['kind']:<8} -> channel {d['channel_id']} {d['channel']}: {d['status']}"
                       f" ({d['tries']} tries)" + (f": {d['error']}" if d["error"] else ""))


@alerts.command("defaults")
@click.option("--triggers", default=None, help="Comma-separated triggers on by default.")
@click.option("--repeat-s", type=click.FloatRange(0), default=None, help="Repeat a still-true alert after this.")
@click.option("--quiet-hours", default=None, help="HH:MM-HH:MM local time (empty: none).")
@click.option("--urgent", default=None, help="Comma-separated triggers still sent during quiet hours.")
@click.option("--day-budget-usd", type=click.FloatRange(0), default=None, help="The day's budget over every run.")
@click.option("--ui-url", default=None, help="The UI's address for links (default: where it last listened).")
def defaults(triggers: str | None, repeat_s: float | None, quiet_hours: str | None, urgent: str | None,
             day_budget_usd: float | None, ui_url: str | None) -> None:
    """Show or change the global defaults (a run's [alerts] changes them for that run)."""
    changes: dict[str, object] = {}
    if triggers is not None:
        changes["triggers"] = [t.strip() for t in triggers.split(",") if t.strip()]
    if urgent is not None:
        changes["urgent"] = [t.strip() for t in urgent.split(",") if t.strip()]
    for key, value in (("repeat_s", repeat_s), ("quiet_hours", quiet_hours), ("day_budget_usd", day_budget_usd),
                       ("ui_url", ui_url)):
        if value is not None:
            changes[key] = value
    store = AlertStore(load_settings().home)
    try:
        current = store.set_defaults(**changes) if changes else store.load().defaults
    except AlertsError as exc:
        refused(exc)
    click.echo(json.dumps(current.__dict__, indent=2, default=list))
