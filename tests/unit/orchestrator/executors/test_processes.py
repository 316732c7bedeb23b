"""Process watching (orchestrator/executors/processes.py): the launch record read back, and the
sweep of a run's processes by their environment.
"""

from __future__ import annotations

import signal
import time
from pathlib import Path

import psutil

from orchestrator.executors.processes import end_processes, read_launch_record
from tests.unit.orchestrator.fake_runs import stray


def test_a_launch_record_that_is_missing_or_damaged_is_none(tmp_path: Path) -> None:
    assert read_launch_record(tmp_path) is None
    (tmp_path / "launch.json").write_text('{"shim_pid": "12')
    assert read_launch_record(tmp_path) is None
    (tmp_path / "launch.json").write_text('{"shim_pid": null}')
    assert read_launch_record(tmp_path) is None


def test_the_sweep_finds_processes_by_environment_only_for_its_own_run(tmp_path: Path) -> None:
    mine, other = stray(str(tmp_path / "run-1"), 1), stray(str(tmp_path / "run-10"), 1)
    spared = stray(str(tmp_path / "run-1"), 2)
    try:
        deadline = time.monotonic() + 10  # the environment is readable once the child has exec'd
        while "RUNYARD_RUN_DIR" not in psutil.Process(mine.pid).environ() and time.monotonic() < deadline:
            time.sleep(0.02)
        sweep = end_processes(str(tmp_path / "run-1"), spare_attempt=2)
        assert sweep.clean and sweep.killed == 1
        assert mine.wait(5) == -signal.SIGKILL
        assert other.poll() is None and spared.poll() is None
    finally:
        for p in (mine, other, spared):
            p.kill()
            p.wait()
