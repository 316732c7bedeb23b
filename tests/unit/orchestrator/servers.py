"""runyard's servers started as a person starts them (``runyard up``, ``runyard ui``), for the tests
that need the real processes: a free port, the UI's health answer, a start that waits for it, and
a stop.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import urllib.request
from pathlib import Path

import psutil

from tests.conftest import wait_until


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def healthz(port: int) -> dict[str, object]:
    """The UI's health answer, or an empty dict while it does not answer."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{port}/healthz", timeout=5) as response:
            return dict(json.loads(response.read()))
    except OSError:
        return {}


def serve(command: list[str], project: Path, home: Path, port: int, scheduler: bool) -> list[psutil.Process]:
    """Start ``command`` (with ``--port``) in ``project``; wait for the health answer (and the
    scheduler's heartbeat); returns the processes that serve, the command's own first."""
    env = {k: v for k, v in os.environ.items() if k not in ("RUNYARD_DB_URL", "PYTHONPATH")}
    env.update(RUNYARD_HOME=str(home), RUNYARD_CPU_SLOTS="1")
    log = home.parent / "serve.log"
    with log.open("w") as out:
        proc = subprocess.Popen([*command, "--port", str(port)], cwd=project, env=env, stdout=out,
                                stderr=subprocess.STDOUT)
    try:
        wait_until(lambda: proc.poll() is not None or healthz(port).get("scheduler_alive" if scheduler else "status"),
                   60, "no health answer")
        assert proc.poll() is None, log.read_text()
        return [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    except BaseException:
        proc.kill()
        raise


def stop(family: list[psutil.Process]) -> None:
    family[0].terminate()
    _gone, alive = psutil.wait_procs(family, timeout=30)
    for p in alive:
        p.kill()
