"""The parent-death signal (trainer/process/pdeathsig.py): a rank dies with its torchrun agent, and
one whose agent is already gone does not start.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import psutil

from orchestrator.executors.processes import end_processes

# -- the parent-death signal and the script entry ----------------------------------------------


def test_a_rank_dies_with_its_agent(tmp_path: Path) -> None:
    """A stand-in agent (carrying the attempt's environment, as torchrun does) starts a rank in a
    session of its own that arms the signal like trainer/__main__.py; the agent is SIGKILLed."""
    env = {**os.environ, "RUNYARD_RUN_DIR": str(tmp_path), "RUNYARD_ATTEMPT": "1", "PYTHONPATH": os.getcwd()}
    rank = ("import time, trainer.process.pdeathsig as p; armed = p.arm_under_agent(); "
            "open('armed', 'w').write(str(armed)); time.sleep(60)")
    agent_code = (f"import subprocess, sys, time; subprocess.Popen([sys.executable, '-c', {rank!r}], "
                  "start_new_session=True, cwd=sys.argv[1]); time.sleep(60)")
    agent = subprocess.Popen([sys.executable, "-c", agent_code, str(tmp_path)], env=env)
    try:
        deadline = time.monotonic() + 15
        while not (tmp_path / "armed").exists() and time.monotonic() < deadline:
            time.sleep(0.05)
        assert (tmp_path / "armed").read_text() == "True"
        (child,) = psutil.Process(agent.pid).children()
        agent.kill()
        agent.wait()
        child.wait(5)  # not our child: psutil waits for it to vanish (TimeoutExpired if it lives on)
        assert not child.is_running()
    finally:
        end_processes(str(tmp_path), wait_s=1)


def test_a_rank_whose_agent_is_already_gone_does_not_start(tmp_path: Path) -> None:
    """Orphaned before it armed the signal (its parent is now not the attempt's agent): it exits."""
    env = {**os.environ, "RUNYARD_RUN_DIR": str(tmp_path), "RUNYARD_ATTEMPT": "1", "PYTHONPATH": os.getcwd()}
    code = "import trainer.process.pdeathsig as p; p.arm_under_agent(); print('trained as an orphan')"
    # Its parent here is this test process, which does not carry the attempt's environment.
    result = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=30,
                            check=False)
    assert result.returncode == 1 and "trained as an orphan" not in result.stdout
    assert "agent is gone" in result.stderr
