"""The serving verbs (orchestrator/cli/ui.py): Ctrl-C on `runyard up` in a terminal (SIGINT to the
terminal's foreground process group) stops the scheduler and the UI with one line, not a
KeyboardInterrupt traceback from the UI server; `runyard token --scrape` prints its own token and
rotates it alone."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import psutil
import pytest
from click.testing import CliRunner

from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli
from tests.conftest import wait_until
from tests.unit.orchestrator.servers import free_port, healthz

STOPPED = "runyard stopped: the scheduler and the UI are down"


def _up(tmp_path: Path, port: int) -> tuple[subprocess.Popen[str], Path]:
    """`runyard up` as a terminal starts it: the leader of a process group of its own."""
    env = {k: v for k, v in os.environ.items() if k not in ("RUNYARD_DB_URL", "PYTHONPATH")}
    env.update(RUNYARD_HOME=str(tmp_path / "home"), RUNYARD_CPU_SLOTS="1")
    log = tmp_path / "up.log"
    runyard = str(Path(sys.executable).with_name("runyard"))
    with log.open("w") as out:
        proc = subprocess.Popen([runyard, "up", "--port", str(port)], cwd=tmp_path, env=env, stdout=out,
                                stderr=subprocess.STDOUT, text=True, start_new_session=True)
    return proc, log


@pytest.mark.parametrize("when", ["serving", "starting"])
def test_ctrl_c_on_runyard_up_stops_both_with_one_line(tmp_path: Path, when: str) -> None:
    port = free_port()
    proc, log = _up(tmp_path, port)
    try:
        if when == "serving":
            wait_until(lambda: proc.poll() is not None or healthz(port).get("scheduler_alive"), 60,
                       "runyard up did not come up")
        else:  # the UI server still importing Streamlit, the scheduler its modules
            wait_until(lambda: proc.poll() is not None or len(psutil.Process(proc.pid).children()) == 2, 30,
                       "runyard up started no children")
        assert proc.poll() is None, log.read_text()
        children = psutil.Process(proc.pid).children(recursive=True)
        os.killpg(proc.pid, signal.SIGINT)  # what the terminal does on Ctrl-C
        assert proc.wait(30) == 0, log.read_text()
        _gone, alive = psutil.wait_procs(children, timeout=20)
        assert not alive, [p.cmdline() for p in alive]
    finally:
        if proc.poll() is None:
            proc.kill()
    output = log.read_text()
    assert "Traceback" not in output and "KeyboardInterrupt" not in output and "Aborted!" not in output, output
    assert output.strip().splitlines()[-1].startswith(STOPPED), output


UUIDS = ("GPU-00000000-aaaa-0000-0000-000000000000", "GPU-11111111-bbbb-1111-1111-111111111111",
         "GPU-22222222-cccc-2222-2222-222222222222")


@pytest.mark.both_dbs  # the token file beside a database of either dialect
def test_runyard_token_scrape_prints_its_own_token_and_rotates_it_alone(settings: Settings) -> None:
    runner = CliRunner()
    ui_url = runner.invoke(cli, ["token"]).stdout.strip()
    first = runner.invoke(cli, ["token", "--scrape"])
    assert first.exit_code == 0, first.output
    token = first.stdout.strip()
    assert len(token) == 43 and token not in ui_url
    assert settings.scrape_token_file.read_text().strip() == token
    assert settings.scrape_token_file.stat().st_mode & 0o777 == 0o600
    assert runner.invoke(cli, ["token", "--scrape"]).stdout.strip() == token  # printed again, not replaced
    rotated = runner.invoke(cli, ["token", "--scrape", "--rotate"])
    assert rotated.exit_code == 0, rotated.output
    new = rotated.stdout.strip()
    assert new != token and settings.scrape_token_file.read_text().strip() == new
    assert runner.invoke(cli, ["token"]).stdout.strip() == ui_url  # the UI's token was left alone
