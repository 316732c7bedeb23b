"""The web UI's server: Streamlit behind runyard's gate, in one process.

    python -m app.server.asgi [--host 127.0.0.1] [--port 8501] [--auth token|proxy|none] [--allowed-host NAME]

``runyard ui`` and ``runyard up`` start it (and check the options first). Streamlit's app
(``st.App`` over app/main.py, an ASGI app) is wrapped in :class:`app.server.gate.Gate` and served by
uvicorn on a socket this module binds itself: Streamlit never listens on anything, so no request
reaches it without passing the gate. Once the socket is bound, the URL to open is printed on a
line of its own (``http://127.0.0.1:PORT/?token=TOKEN``) and recorded in the data folder's
``ui.json`` for ``runyard token``. ``GET /metrics`` (Prometheus) is answered in front of the gate,
with its own scrape token (app/server/prometheus.py).
"""

from __future__ import annotations

import argparse
import errno
import functools
import logging
import os
import socket
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

from app.server.access import (
    AccessPolicy,
)
from db.vocabulary.layout import UI_FILE
from db.vocabulary.settings import EnvSettings, Settings, SettingsError, load_settings
from orchestrator.format import runyard_version
from orchestrator.own_processes import STARTED_IN, move_into
from orchestrator.ui_access import (
    AUTH_MODES,
    DEFAULT_PROXY_USER_HEADER,
    AccessError,
    TokenSource,
    check_bind,
    ensure_token,
    is_wildcard,
    login_url,
    open_bind_warning,
    parse_allowed_hosts,
    read_token,
    read_ui_file,
    url_host,
    write_ui_file,
)

# Streamlit, uvicorn, Altair, the gate (Starlette) and the database (SQLAlchemy) are imported in
# the functions that serve, "after the options pass": main() checks the options and the data
# folder first, and a refused one exits in 0.3 s instead of after 1.6 s of imports.

logger = logging.getLogger(__name__)

EXIT_USAGE = 2
# With --auth proxy, the key of ``st.user`` that holds the proxy's authenticated user (Streamlit's
# ``server.trustedUserHeaders``): the page keeps each person's panel layout under it (app/panels/layout.py).
PROXY_USER_KEY = "runyard_proxy_user"
MAIN_SCRIPT = Path(__file__).parents[1] / "main.py"  # app/main.py: the server side is a room of app/
# Streamlit's options for a UI behind the gate: no browser opened, no telemetry, no file watcher
# (the code does not change under a running product), XSRF protection kept on.
STREAMLIT_OPTIONS: dict[str, object] = {
    "server.headless": True,
    "browser.gatherUsageStats": False,
    "server.fileWatcherType": "none",
    "server.enableXsrfProtection": True,
    "server.runOnSave": False,
    # No full garbage collection after every script run: a live Run page reruns its fragments
    # every 2 s per open tab, and Streamlit's gc.collect(2) after each was 23% of the UI server's
    # CPU (py-spy over a live run). Python's own collector still runs (docs/benchmarks-journal.md,
    # "Where the CPU of the two slow tiers goes").
    "runner.postScriptGC": False,
    # A product, not a Streamlit app: no Deploy button, no "Record screen" or "Made with Streamlit"
    # menu, no Stop/Running widget that blinks on every refresh, no links out of the machine.
    "client.toolbarMode": "minimal",
    "ui.hideTopBar": True,
    "client.showErrorLinks": False,
    # Nothing embeds runyard: no other origin may postMessage into the page.
    "client.allowedOrigins": [],
    # Blue, not Streamlit's red (which reads as danger on Start and on progress bars). Set per theme,
    # and no theme.base: the page follows the system's light or dark preference (a plain
    # theme.primaryColor made a custom theme on the light base, whatever the system said).
    "theme.light.primaryColor": "#1f6feb",
    "theme.dark.primaryColor": "#4d8ff0",
}


def parse_args(argv: list[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog="python -m app.server.asgi", description=__doc__.splitlines()[0])
    parser.add_argument("--host", default="127.0.0.1")
    parser.add_argument("--port", type=int, default=8501)
    parser.add_argument("--auth", choices=AUTH_MODES, default="token")
    parser.add_argument("--allowed-host", action="append", default=[])
    parser.add_argument("--proxy-user-header", default=DEFAULT_PROXY_USER_HEADER)
    # runyard up/ui start this server in runyard's own folder and name the caller's here.
    parser.add_argument(STARTED_IN, dest="started_in", default=None, help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def bind(host: str, port: int) -> socket.socket:
    """A listening socket on ``host:port`` (no search for another port: the URL must be right)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    if family == socket.AF_INET6 and is_wildcard(host):
        sock.setsockopt(socket.IPPROTO_IPV6, socket.IPV6_V6ONLY, 0)
    sock.bind((host.strip("[]"), port))
    sock.listen(2048)
    sock.setblocking(False)
    return sock


def health_reader(settings: Settings, writable: bool = True) -> Callable[[], dict[str, Any]]:
    """What ``/healthz`` answers (JSON, without login): the UI's status, runyard's version and
    whether the scheduler is alive (its heartbeat, as the pages' banner reads it). It names no
    host, pid, path or run. ``status`` is ``degraded`` when the database cannot be read."""
    from sqlalchemy.exc import SQLAlchemyError  # noqa: PLC0415 - after the options pass
    from sqlalchemy.orm import Session, sessionmaker  # noqa: PLC0415 - after the options pass

    from db import DatabaseError, queries  # noqa: PLC0415 - after the options pass
    from db.engine import make_engine, make_read_only_engine, make_sessionmaker, sqlite_path  # noqa: PLC0415 - after the options pass

    version = runyard_version()
    db_file = sqlite_path(settings.db_url)

    @functools.cache  # the one engine, made at the first answer that reads
    def sessions() -> sessionmaker[Session]:
        # A data folder that cannot be written is read as it is (the UI is a viewer there).
        return make_sessionmaker((make_engine if writable else make_read_only_engine)(settings.db_url))

    def health() -> dict[str, Any]:
        body: dict[str, Any] = {"status": "ok", "version": version, "scheduler_alive": False}
        if db_file is not None and not db_file.exists():
            return body  # nothing has created the database yet: reading would create an empty file
        try:
            with sessions()() as session:
                status = queries.scheduler_status(session, heartbeat_file=settings.scheduler_file)
        except (SQLAlchemyError, DatabaseError) as exc:
            logger.warning("healthz: the database cannot be read: %s", str(exc).splitlines()[0])
            return {**body, "status": "degraded", "scheduler_alive": None}
        body["scheduler_alive"] = bool(status["online"])
        if status["age_s"] is not None:
            body["scheduler_heartbeat_age_s"] = round(float(status["age_s"]), 1)
        return body

    return health


def build_app(policy: AccessPolicy, settings: Settings, writable: bool = True,
              metrics_recent_s: float | None = None) -> object:
    """Streamlit's ASGI app for app/main.py behind the gate, with ``GET /metrics`` (Prometheus,
    its own scrape token: app/server/prometheus.py) answered before the gate."""
    from app.server.gate import Gate  # noqa: PLC0415 - after the options pass
    from app.server.prometheus import DEFAULT_RECENT_S, metrics_route  # noqa: PLC0415 - after the options pass

    # Only in proxy mode, where the gate lets nothing through without the proxy's secret, is the
    # user header the proxy's word and not the browser's.
    user_header = policy.proxy_user_header if policy.mode == "proxy" else None
    gate = Gate(streamlit_app(MAIN_SCRIPT, user_header), policy,  # type: ignore[arg-type]
                health=health_reader(settings, writable))
    return metrics_route(gate, policy, settings, writable,
                         DEFAULT_RECENT_S if metrics_recent_s is None else metrics_recent_s)


def streamlit_app(script: Path, user_header: str | None = None) -> object:
    """Streamlit's ASGI app (``st.App``) for ``script`` with this server's options (also what
    bench/streamlit_floor.py serves, without the gate, as the floor of a Streamlit page); with
    ``user_header``, that header of the page's connection is ``st.user[PROXY_USER_KEY]``."""
    import streamlit as st  # noqa: PLC0415 - after the options pass
    from streamlit import config as streamlit_config  # noqa: PLC0415 - after the options pass
    from streamlit.web import bootstrap  # noqa: PLC0415 - after the options pass

    streamlit_config._main_script_path = str(script)
    options = {**STREAMLIT_OPTIONS, "server.trustedUserHeaders": {user_header: PROXY_USER_KEY} if user_header else {}}
    bootstrap.load_config_options({key.replace(".", "_"): value for key, value in options.items()})
    # Altair validates every chart object against the Vega-Lite schema as it is built, then the
    # whole spec again when Streamlit draws it. The server keeps the second: a chart of the Run
    # page took 35 ms instead of 46 to build (the tests keep both checks).
    from altair.utils.schemapi import disable_debug_mode  # noqa: PLC0415 - after the options pass

    disable_debug_mode()
    return st.App(script)


def uvicorn_server(app: object) -> Any:
    """The uvicorn server the UI runs ``app`` with (``.run(sockets=[...])`` serves it)."""
    import uvicorn  # noqa: PLC0415 - after the options pass

    config = uvicorn.Config(app, lifespan="on", access_log=False, log_level="warning",  # type: ignore[arg-type]
                            ws_max_size=200 * 1024 * 1024, ws_per_message_deflate=False, timeout_graceful_shutdown=5)
    return uvicorn.Server(config)


def main(argv: list[str] | None = None) -> int:
    from db.home import PRIVATE_UMASK, HomeUnusable, check_home, make_private  # noqa: PLC0415 - after the options pass

    args = parse_args(argv)
    move_into(args.started_in)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        variables = EnvSettings.from_env()
    except SettingsError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    proxy_secret = variables.proxy_secret_text
    problem = check_bind(args.host, args.auth, proxy_secret)
    try:
        allowed = parse_allowed_hosts([*args.allowed_host, variables.allowed_hosts])
    except AccessError as exc:
        problem = problem or str(exc)
    metrics_recent_s = variables.metrics_recent_s  # checked with the other variables above
    if problem:
        print(f"error: {problem}", file=sys.stderr)
        return EXIT_USAGE
    settings = load_settings()
    os.umask(PRIVATE_UMASK)  # before anything is created: the home itself too
    try:
        # A home that exists but cannot be written (an archived copy, a read-only mount) is shown
        # as a viewer: every action disabled and a banner saying why (app.data.read_only_reason).
        writable = check_home(settings, create=True, write=False)
        if writable and (tightened := make_private(settings.home)):
            logger.warning("made %d paths under %s private to you (they were readable by other accounts)",
                           tightened, settings.home)
    except HomeUnusable as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 1
    if not writable:
        if args.auth == "token" and read_token(settings.token_file) is None:
            print(f"error: data folder {settings.home} is not writable and holds no token file "
                  f"({settings.token_file}) to open the UI with; copy the folder somewhere writable and set "
                  "RUNYARD_HOME to the copy", file=sys.stderr)
            return 1
        print(f"runyard: {settings.home} cannot be written; the UI only shows it (every action is disabled)",
              file=sys.stderr)
    if not is_wildcard(args.host):
        allowed |= parse_allowed_hosts([url_host(args.host)])  # the address it was asked to bind
    token = (ensure_token(settings.token_file) if writable else read_token(settings.token_file)) \
        if args.auth == "token" else None
    policy = AccessPolicy(
        mode=args.auth, port=args.port, allowed_hosts=allowed,
        token=TokenSource(settings.token_file) if args.auth == "token" else None,
        proxy_secret=proxy_secret, proxy_user_header=args.proxy_user_header,
    )
    try:
        sock = bind(args.host, args.port)
    except OSError as exc:
        why = "is in use by another program" if exc.errno == errno.EADDRINUSE else f"cannot be bound ({exc.strerror})"
        print(f"error: port {args.port} on {args.host} {why}; choose another with --port", file=sys.stderr)
        return 1
    return serve(sock, build_app(policy, settings, writable, metrics_recent_s), settings.home, args, token,
                 record=writable)


def serve(sock: socket.socket, app: object, home: Path, args: argparse.Namespace, token: str | None,
          record: bool = True) -> int:
    """Serve ``app`` on ``sock``; ``record`` writes where it listens into the home (not on a
    read-only one)."""
    warning = open_bind_warning(args.host)
    if warning:
        print(warning, file=sys.stderr)
    if record:
        write_ui_file(home, args.host, args.port, args.auth)
    base = f"http://{url_host(args.host)}:{args.port}"
    if token is not None:
        print(f"runyard UI on {base} (data in {home}). Open this URL; it holds the access token "
              "(`runyard token` prints it again):")
        print(login_url(args.host, args.port, token), flush=True)
    else:
        print(f"runyard UI on {base} (auth: {args.auth}; data in {home})", flush=True)
    server = uvicorn_server(app)
    try:
        server.run(sockets=[sock])
    finally:
        sock.close()
        recorded = read_ui_file(home)
        if recorded is not None and recorded.get("pid") == os.getpid():  # not a newer UI's record
            (home / UI_FILE).unlink(missing_ok=True)
    return 0 if server.started else 1


if __name__ == "__main__":
    try:
        sys.exit(main())
    except KeyboardInterrupt:  # Ctrl-C on `runyard ui` before uvicorn took over the signal (while importing)
        print("runyard UI stopped", file=sys.stderr)
        sys.exit(130)
