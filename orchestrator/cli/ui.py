"""The CLI's process commands: ``runyard up``, ``runyard ui``, ``runyard scheduler`` and
``runyard token``.

The UI runs as its own process (``python -m app.server.asgi``, Streamlit behind runyard's gate); the
options that decide who may use it are checked here first, so a refused combination exits with
code 2 before anything starts. ``runyard up``'s children die with it, whatever signal ends it
(``PR_SET_PDEATHSIG``): a killed ``up`` leaves no UI serving the port and no scheduler behind.
Training keeps running either way: it lives in sessions of its own and the next scheduler
re-adopts it. Both servers start in runyard's own folder, never the caller's, whose ``app.py`` or
``db.py`` Python would otherwise import in place of runyard's (orchestrator/own_processes.py).
"""

from __future__ import annotations

import logging
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
import psutil

from db.home import check_folder, home_writable
from db.vocabulary.settings import EnvSettings, Settings, load_settings
from orchestrator.cli.base import EXIT_USAGE, RunyardCommand, fail, open_existing, open_sessions
from orchestrator.own_processes import PACKAGES_ROOT, STARTED_IN, move_into, server_command
from orchestrator.ui_access import (
    ALLOWED_HOSTS_ENV,
    AUTH_MODES,
    DEFAULT_PROXY_USER_HEADER,
    PROXY_SECRET_ENV,
    AccessError,
    check_bind,
    ensure_token,
    login_url,
    parse_allowed_hosts,
    read_token,
    read_ui_file,
    rotate_token,
)
from trainer.process import pdeathsig

HOST_HELP = ("Address to bind. Beyond loopback the token still guards the UI, over plain HTTP: "
             "prefer an SSH tunnel.")


def ui_options(func: Callable[..., None]) -> Callable[..., None]:
    """The options ``runyard ui`` and ``runyard up`` share."""
    options = [
        click.option("--host", default="127.0.0.1", show_default=True, help=HOST_HELP),
        click.option("--port", default=8501, show_default=True, type=click.IntRange(1, 65535)),
        click.option("--auth", type=click.Choice(AUTH_MODES), default="token", show_default=True,
                     help="token: the access token (a signed cookie once logged in); proxy: trust a reverse "
                          f"proxy that sends {PROXY_SECRET_ENV}'s secret and a user header; none: loopback only."),
        click.option("--no-auth", is_flag=True, help="Same as --auth none; refused unless --host is loopback."),
        click.option("--allowed-host", "allowed_hosts", multiple=True, metavar="NAME",
                     help=f"Also serve requests for this host name (repeatable; or {ALLOWED_HOSTS_ENV}, "
                          "comma-separated)."),
        click.option("--proxy-user-header", default=DEFAULT_PROXY_USER_HEADER, show_default=True,
                     help="With --auth proxy: the header that carries the authenticated user."),
    ]
    for option in reversed(options):
        func = option(func)
    return func


def server_argv(host: str, port: int, auth: str, allowed_hosts: tuple[str, ...], proxy_user_header: str) -> list[str]:
    """The UI server's command line, checked: exit code 2 on a refused combination."""
    variables = EnvSettings.from_env()
    problem = check_bind(host, auth, variables.proxy_secret_text)
    if problem is None:
        try:
            parse_allowed_hosts([*allowed_hosts, variables.allowed_hosts])
        except AccessError as exc:
            problem = str(exc)
    if problem:
        fail(problem, EXIT_USAGE)
    args = ["--host", host, "--port", str(port), "--auth", auth, "--proxy-user-header", proxy_user_header]
    for name in allowed_hosts:
        args += ["--allowed-host", name]
    return server_command("app.server.asgi", *args)  # started in PACKAGES_ROOT


def child_env(settings: Settings) -> dict[str, str]:
    env = dict(os.environ)
    env["RUNYARD_HOME"] = str(settings.home)
    env["RUNYARD_DB_URL"] = settings.db_url
    return env


@click.command(cls=RunyardCommand)
@click.option(STARTED_IN, "started_in", hidden=True, help="The folder to work in (`runyard up` starts the "
              "scheduler in runyard's own folder and names the caller's here).")
def scheduler(started_in: str | None) -> None:
    """Run the scheduler in the foreground (launches and supervises runs)."""
    move_into(started_in)
    from orchestrator.scheduler.loop import Scheduler  # noqa: PLC0415 - the scheduler's modules only for `runyard scheduler`
    from orchestrator.scheduler.resources import detect_inventory  # noqa: PLC0415 - the scheduler's modules only for `runyard scheduler`
    from orchestrator.scheduler.service import SchedulerLocked, acquire_lock, refuse_a_second_on_sqlite, serve  # noqa: PLC0415 - the scheduler's modules only for `runyard scheduler`

    settings = load_settings()
    sessions = open_sessions(settings)
    try:
        lock = acquire_lock(settings.home)
        refuse_a_second_on_sqlite(sessions, settings)
    except SchedulerLocked as exc:
        fail(str(exc))
    inventory = detect_inventory()
    logging.getLogger(__name__).info(
        "scheduler on %s: %d %s slot(s), database %s", settings.home, inventory.slots, inventory.kind, settings.db_url
    )
    try:
        serve(Scheduler(sessions, settings, inventory))
    finally:
        lock.release()


@click.command(cls=RunyardCommand)
@ui_options
def ui(host: str, port: int, auth: str, no_auth: bool, allowed_hosts: tuple[str, ...], proxy_user_header: str) -> None:
    """Run the web UI in the foreground; it prints the URL to open (with the access token)."""
    argv = server_argv(host, port, "none" if no_auth else auth, allowed_hosts, proxy_user_header)
    settings = load_settings()
    if home_writable(settings):
        open_sessions(settings)
    else:
        open_existing(settings)  # a viewer: the schema is checked, never migrated
    os.chdir(PACKAGES_ROOT)  # the server moves back into this folder (server_command's --started-in)
    os.execve(sys.executable, argv, child_env(settings))  # noqa: S606 - becomes the UI server (an argv list)


def _die_with_parent(parent: int) -> Callable[[], None]:
    """What runs in a child of ``runyard up`` between fork and exec: SIGTERM when ``up`` dies,
    and a process group of its own, so that a Ctrl-C in the terminal (SIGINT to the foreground
    group) reaches ``up`` alone, which stops its children with SIGTERM: the UI server then ends
    quietly instead of printing a KeyboardInterrupt traceback from wherever it was."""
    prctl = pdeathsig.prctl_function()

    def setup() -> None:
        os.setpgid(0, 0)
        if pdeathsig.set_pdeathsig(signal.SIGTERM, prctl) and os.getppid() != parent:
            os._exit(1)  # up died before the signal was armed

    return setup


@click.command(cls=RunyardCommand)
@ui_options
def up(host: str, port: int, auth: str, no_auth: bool, allowed_hosts: tuple[str, ...], proxy_user_header: str) -> None:
    """Start the scheduler and the UI; Ctrl-C stops both (training keeps running and is
    re-adopted by the next scheduler)."""
    argv = server_argv(host, port, "none" if no_auth else auth, allowed_hosts, proxy_user_header)
    settings = load_settings()
    open_sessions(settings)
    env = child_env(settings)
    setup = _die_with_parent(os.getpid())
    stopping = False

    def stop(_signum: int, _frame: object) -> None:
        nonlocal stopping
        stopping = True

    # Before the first child starts: a Ctrl-C while they start stops them, not click ("Aborted!").
    signal.signal(signal.SIGINT, stop)
    signal.signal(signal.SIGTERM, stop)
    signal.signal(signal.SIGHUP, stop)
    # preexec_fn is safe here: this process has one thread.
    procs = {
        "scheduler": subprocess.Popen(server_command("orchestrator", "scheduler"), cwd=PACKAGES_ROOT, env=env,
                                      preexec_fn=setup),  # noqa: PLW1509
        "ui": subprocess.Popen(argv, cwd=PACKAGES_ROOT, env=env, preexec_fn=setup),  # noqa: PLW1509
    }
    click.echo(f"runyard is up (data in {settings.home}; Ctrl-C to stop); the UI prints its URL below", err=True)
    code = 0
    while not stopping:
        for name, proc in procs.items():
            if proc.poll() is not None:
                click.echo(f"error: the {name} exited with code {proc.returncode}; stopping", err=True)
                code = proc.returncode or 1
                stopping = True
        time.sleep(0.5)
    for proc in procs.values():
        if proc.poll() is None:
            proc.terminate()
    for proc in procs.values():
        try:
            proc.wait(15)
        except subprocess.TimeoutExpired:
            proc.kill()
    if code == 0:
        click.echo("runyard stopped: the scheduler and the UI are down; training keeps running and the next "
                   "`runyard up` takes it over", err=True)
    sys.exit(code)


@click.command(cls=RunyardCommand)
@click.option("--rotate", is_flag=True,
              help="Replace the token: every browser logged in with the old one is logged out.")
@click.option("--scrape", is_flag=True,
              help="Print the read-only token of GET /metrics (Prometheus) instead; with --rotate, replace it "
                   "(the UI's token stays).")
def token(rotate: bool, scrape: bool) -> None:
    """Print the URL that logs a browser into the UI (it holds the access token)."""
    settings = load_settings()
    if scrape:
        scrape_token(settings, rotate)
        return
    value = token_value(settings, settings.token_file, rotate, "token")
    recorded = read_ui_file(settings.home) or {}
    host, port = str(recorded.get("host") or "127.0.0.1"), recorded.get("port")
    port = port if isinstance(port, int) else 8501
    pid = recorded.get("pid")
    running = isinstance(pid, int) and psutil.pid_exists(pid)
    if rotate:
        click.echo("the token was replaced: browsers logged in with the old one must open this URL again", err=True)
    if not recorded:
        click.echo("no UI has run on this data folder yet; this is the URL of `runyard up`'s default port", err=True)
    elif not running:
        click.echo(f"the UI is not running now; this is its URL once started on port {port} again", err=True)
    if recorded.get("auth") not in (None, "token"):
        click.echo(f"note: the UI last ran with --auth {recorded.get('auth')}, which does not use the token", err=True)
    click.echo(login_url(host, port, value))


def token_value(settings: Settings, path: Path, rotate: bool, what: str) -> str:
    """The token in ``path``: created on first use, or replaced with ``rotate``. A data folder
    that cannot be written (an archived copy, a read-only mount) still has its token read, for
    the viewer `runyard ui` serves there; only creating or replacing one is refused (exit 1)."""
    if check_folder(settings.home, f"data folder {settings.home}", create=False, write=False):
        return rotate_token(path) if rotate else ensure_token(path)
    copy = "copy the folder somewhere writable and set RUNYARD_HOME to the copy"
    if rotate:
        fail(f"data folder {settings.home} is not writable, so its {what} cannot be replaced; {copy}")
    try:
        value = read_token(path)
    except OSError as exc:
        fail(f"data folder {settings.home} is not writable and its {what} file {path} cannot be read: "
             f"{exc.strerror}")
    if value is None:
        fail(f"data folder {settings.home} is not writable and holds no {what} file ({path}); {copy}")
    click.echo(f"runyard: {settings.home} cannot be written; this is the {what} it holds", err=True)
    return value


def scrape_token(settings: Settings, rotate: bool) -> None:
    """Print (created on first use, or replaced) the token Prometheus sends as ``Authorization:
    Bearer TOKEN`` to ``GET /metrics``. It opens nothing else and expires only when rotated."""
    value = token_value(settings, settings.scrape_token_file, rotate, "scrape token")
    if rotate:
        click.echo("the scrape token was replaced: Prometheus must send the new one (the UI's token is unchanged)",
                   err=True)
    click.echo(value)
