"""`runyard ARGS` run inside the test's own process, through click's test runner.

A `runyard` process costs about a second of CPU on these two cores, nearly all of it imports the
test process has already made (SQLAlchemy, pydantic, runyard's own modules), and the integration
tests called the CLI about 200 times to read what a run did (``show``, ``logs``) or to ask for
something (``resume``, ``cancel``): that CPU was taken from the ranks of the tests beside them.
Here the same command object (``orchestrator.cli.group.cli``: parsing, the data-folder check,
the command's body, its output and exit code) runs in this process in a few milliseconds, with
the environment the process would have had and nothing of its own left behind (umask, logging
handlers, database connections).

Calls are serialized (click's runner swaps the process's standard streams and environment for
the call): two commands that must be at the same moment are two processes.

What only a process shows stays a process: the verbs that serve until stopped (``scheduler``,
``ui``, ``up``, ``logs --follow``), and the tests about the command line as typed (module
``tests/faults/test_bad_input.py``, ``Product.cli(..., process=True)``, ``Product.cli_submit``).
"""

from __future__ import annotations

import logging
import os
import subprocess
import threading
import traceback
from collections.abc import Mapping, Sequence

import click
from click.testing import CliRunner
from sqlalchemy import event
from sqlalchemy.engine import Connection, Engine

# Verbs that run until they are stopped: always a process of their own.
SERVING = frozenset({"scheduler", "ui", "up"})
FOLLOW = frozenset({"-f", "--follow"})
_ONE_AT_A_TIME = threading.Lock()


def needs_a_process(args: Sequence[str]) -> bool:
    """Whether ``runyard ARGS`` would not return by itself (it serves, or follows a log)."""
    return not args or args[0] in SERVING or bool(FOLLOW & set(args))


def run_in_process(args: Sequence[str], env: Mapping[str, str]) -> subprocess.CompletedProcess:
    """``runyard ARGS`` with exactly ``env`` as its environment, in this process; its exit code,
    standard output and standard error as :func:`subprocess.run` gives a process's. An exception
    the command did not handle is printed on standard error with its traceback and exits 1, as
    Python's own handler would."""
    if needs_a_process(args):
        raise ValueError(f"`runyard {' '.join(args)}` does not return by itself; run it as a process")
    from orchestrator.cli.group import cli  # noqa: PLC0415 - the CLI's modules only for the tests that call it

    environ: dict[str, str | None] = {key: None for key in os.environ if key not in env}
    environ.update(env)
    with _ONE_AT_A_TIME:
        return _invoke(cli, args, environ)


def _invoke(cli: click.Command, args: Sequence[str], environ: dict[str, str | None]) -> subprocess.CompletedProcess:
    engines: list[Engine] = []

    def connected(conn: Connection) -> None:
        engines.append(conn.engine)

    umask = os.umask(0o022)
    os.umask(umask)
    root = logging.getLogger()
    handlers, level = list(root.handlers), root.level
    root.handlers[:] = []  # the CLI's own logging.basicConfig then prints its log lines where a process would
    event.listen(Engine, "engine_connect", connected)
    try:
        result = CliRunner().invoke(cli, list(args), env=environ, prog_name="runyard", catch_exceptions=True)
    finally:
        event.remove(Engine, "engine_connect", connected)
        os.umask(umask)  # the CLI makes what it creates private (0o077) for the rest of its process
        root.handlers[:] = handlers
        root.setLevel(level)
        for engine in {id(e): e for e in engines}.values():  # no connection left open (PostgreSQL)
            engine.dispose()
    stderr = result.stderr
    if result.exc_info is not None and not isinstance(result.exc_info[1], SystemExit):
        stderr += "".join(traceback.format_exception(*result.exc_info))
    return subprocess.CompletedProcess(["runyard", *args], result.exit_code, result.stdout, stderr)
