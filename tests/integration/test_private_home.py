"""A real 2-rank run leaves nothing under the data folder that another local account may read
(issue 25, item 4): the database and its -wal/-shm, the run's config, the shim's records, the
ranks' logs written by torchrun's agent, the metrics and the checkpoints. The scheduler is
started under a lax umask (022), as from a usual shell."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from tests.file_modes import open_to_others
from tests.integration.conftest import Product

pytestmark = pytest.mark.slow


def test_a_real_run_writes_nothing_others_can_read(product: Product) -> None:
    run_id = product.cli_submit("train.max_steps=40", "train.log_every=5", "train.eval_every=20",
                            "checkpoint.every_steps=20", "name=private")
    log = open(product.home.parent / "scheduler-private.log", "ab")  # the test's, outside the home  # noqa: SIM115 - the scheduler's log, open for its life
    proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "scheduler"], env=product.env, stdout=log,
                            stderr=subprocess.STDOUT, preexec_fn=lambda: os.umask(0o022))  # noqa: PLW1509 - the test's thread alone forks here
    product.procs.append(proc)
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", timeout=180)
    assert detail["status"] == "SUCCEEDED", detail
    proc.send_signal(signal.SIGTERM)
    proc.wait(30)
    run_dir = next((product.home / "runs").iterdir())
    written = {p.name for p in run_dir.rglob("*")}
    # Not vacuous: the kinds of file that matter were written.
    assert {"config.json", "exit.json"} <= written and any(n.startswith("step-") for n in written), written
    assert any(p.suffix == ".log" for p in run_dir.rglob("*")), written
    assert open_to_others(product.home) == []
