"""The shim (orchestrator/executors/shim.py): its launch record names itself and torchrun, torchrun
dies with it, and a SIGTERM that reaches torchrun between the fork and the exec still ends it.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import psutil
import pytest

from orchestrator.executors.launcher import launch
from orchestrator.executors.processes import end_processes, read_launch_record
from tests.unit.paths import ROOT

# -- the launch record ------------------------------------------------------------------------


def test_the_shim_records_itself_and_torchrun_and_takes_torchrun_with_it(tmp_path: Path) -> None:
    attempt_dir = tmp_path / "attempts" / "1"
    launched = launch([sys.executable, "-c", "import time; time.sleep(60)"], attempt_dir, tmp_path, {})
    try:
        deadline = time.monotonic() + 15
        record = read_launch_record(attempt_dir)
        while (record is None or record["torchrun_pid"] is None) and time.monotonic() < deadline:
            time.sleep(0.05)
            record = read_launch_record(attempt_dir)
        assert record is not None and record["shim_pid"] == launched.pid
        assert record["shim_create_time"] == pytest.approx(launched.create_time, abs=0.01)
        child = psutil.Process(record["torchrun_pid"])
        assert child.ppid() == launched.pid
        assert child.create_time() == pytest.approx(record["torchrun_create_time"], abs=0.01)
        os.kill(launched.pid, signal.SIGKILL)  # the shim dies: its child must not run on unsupervised
        launched.popen.wait(10)
        child.wait(10)  # TimeoutExpired if it lives on
    finally:
        end_processes(str(tmp_path), launched.pid, launched.create_time)


def test_a_cancel_that_reaches_torchrun_before_its_exec_still_ends_it() -> None:
    """The shim ignores SIGTERM, and its child holds that disposition from the fork until its
    set-up restores the default. A SIGTERM in between (a cancel just after the launch; seen under
    load in test_devices_are_counted_per_host, which then stayed CANCELLING for the 30 s grace) was
    lost. Here the child signals itself at that very moment; it must die of it, not run on."""
    program = textwrap.dedent("""
        import os, signal, sys
        from orchestrator.executors import shim
        for sig in shim.STOP_SIGNALS:
            signal.signal(sig, signal.SIG_IGN)  # as shim.main does
        real = shim._child_setup

        def cancelled_before_setup(shim_pid):
            setup = real(shim_pid)
            def run():
                os.kill(os.getpid(), signal.SIGTERM)  # the scheduler's SIGTERM lands between fork and exec
                setup()
            return run

        shim._child_setup = cancelled_before_setup
        (child,) = shim.start_children([[sys.executable, "-c", "import time; time.sleep(15)"]])
        print(child.wait(timeout=60))
    """)
    out = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True, timeout=90,
                         cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert out.stdout.strip() == str(-signal.SIGTERM)  # ended by the SIGTERM, at once
