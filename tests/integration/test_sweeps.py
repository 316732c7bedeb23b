"""Sweeps with real 2-rank trials on CPU (torchrun, gloo) under a real scheduler process.

- ASHA over nine mlp-digits trials, two at a time, with the scheduler SIGKILLed in the middle: the
  trials behind at the rung are stopped there (PRUNED, at a checkpoint), the third best of them is
  promoted once enough worse ones fill its rung and resumes from its checkpoint (its first new step
  that checkpoint's next, its chart continuing, its steps counted once), and the sweep goes on after
  the restart with no trial made twice and no result lost.
- A script that fails for every setting trips the breaker.
- A grid sweep of a user's own plain script, its objective read from the lines it prints.

Small on purpose (CI runs on two cores): 12 steps, one rung at step 4, a checkpoint every 4 steps.
The grid's learning rates order the trials at the rung (measured: eval_loss after 4 steps falls with
the rate), so which trials stop and which one is promoted does not depend on timing; the steps are
paced (RUNYARD_FAULT_STEP_DELAY_S) so that a trial is still training when the scheduler's sweeps
job, every 2 s, judges it at its rung.
"""

from __future__ import annotations

import json
import signal
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from db.vocabulary.config import ScriptWorkload, parse_config, parse_toml
from tests.integration.conftest import Product

pytestmark = pytest.mark.slow

ROOT = Path(__file__).resolve().parents[2]
GOOD, THIRD = [0.05, 0.03], 0.01
BAD = [1e-6, 2e-6, 3e-6, 4e-6, 5e-6, 6e-6]  # barely move the weights: the worst at the rung

ASHA = f"""
name = "lr"
[workload]
kind = "mlp-digits"
hidden = 32
[launch]
nproc_per_node = 2
[train]
max_steps = 12
log_every = 1
eval_every = 4
seed = 0
[checkpoint]
every_steps = 4
[sweep]
metric = "eval_loss"
searcher = "grid"
max_trials = 9
max_concurrent = 2
[sweep.space]
"train.lr" = {{choice = {json.dumps([*GOOD, THIRD, *BAD])}}}
[sweep.early_stop]
reduction = 3
min_steps = 4
"""


def sweep_status(product: Product, sweep_id: int) -> str:
    return str(product.query("SELECT status FROM sweeps WHERE id = :s", s=sweep_id)[0][0])


def wait(what: str, done: Callable[[], bool], timeout: float = 240.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if done():
            return
        time.sleep(0.25)
    raise AssertionError(f"{what}: not in {timeout:.0f} s")


def start(product: Product, tmp_path: Path, text: str, name: str) -> int:
    path = tmp_path / f"{name}.toml"
    path.write_text(text)
    return int(product.cli("sweep", "start", str(path)).stdout)


def test_asha_prunes_at_a_rung_and_promotes_from_a_checkpoint_through_a_scheduler_kill(
        product: Product, tmp_path: Path) -> None:
    product.env["RUNYARD_CPU_SLOTS"] = "4"  # two 2-rank trials at once
    product.env["RUNYARD_FAULT_STEP_DELAY_S"] = "0.8"  # 8 steps (6.4 s) from the rung to the end
    sweep_id = start(product, tmp_path, ASHA, "asha")
    first = product.start_scheduler()
    wait("trial 4 made", lambda: product.query("SELECT COUNT(*) FROM sweep_trials")[0][0] >= 5)
    first.send_signal(signal.SIGKILL)  # in the middle: trials training, others pruned, more to make
    first.wait(10)
    product.start_scheduler()
    wait("the sweep finished", lambda: sweep_status(product, sweep_id) == "FINISHED")
    trials = product.query(
        "SELECT t.number, t.run_id, r.name, r.status, t.rung, t.rungs_json, t.objective, t.promoted "
        "FROM sweep_trials t JOIN runs r ON r.id = t.run_id ORDER BY t.number")
    # Nine trials, one run each, none made twice across the kill; every value at the rung kept.
    assert [t[0] for t in trials] == list(range(9))
    assert [t[2] for t in trials] == [f"lr-t{n}" for n in range(9)]
    assert product.query("SELECT COUNT(*) FROM runs")[0][0] == 9
    assert all("0" in json.loads(t[5]) for t in trials)
    statuses = {t[0]: t[3] for t in trials}
    assert statuses == {0: "SUCCEEDED", 1: "SUCCEEDED", 2: "SUCCEEDED", **{n: "PRUNED" for n in range(3, 9)}}
    assert [t[7] for t in trials] == [0, 0, 1, 0, 0, 0, 0, 0, 0]  # the third best, promoted once
    assert all(t[6] is not None for t in trials[:3])  # each finished trial's objective at its end
    at_rung = [json.loads(t[5])["0"][1] for t in trials]  # eval_loss at step 4 falls with the rate
    assert max(at_rung[:2]) < at_rung[2] < min(at_rung[3:])
    pruned = product.detail(trials[3][1])
    assert pruned["status_reason"].startswith(f"stopped early by sweep {sweep_id} (rung 0 at step 4: eval_loss ")
    # The promoted trial: stopped at a checkpoint, continued from it.
    promoted = product.detail(trials[2][1])
    (stopped, resumed) = promoted["attempts"]
    assert stopped["status"] == "PAUSED" and stopped["reason"].startswith(f"stopped early by sweep {sweep_id}")
    at = resumed["resume_step"]
    assert at is not None and 4 <= at < 12 and stopped["last_step"] == at
    assert stopped["ended_at"] <= resumed["started_at"]  # no second of device time counted twice
    steps = product.query("SELECT attempt, MIN(step), MAX(step), COUNT(*) FROM metric_points p "
                          "JOIN metric_names n ON n.id = p.name_id "
                          "WHERE p.run_id = :r AND n.name = 'step_time' AND p.rank = 0 GROUP BY attempt "
                          "ORDER BY attempt", r=trials[2][1])
    assert steps == [(1, 1, at, at), (2, at + 1, 12, 12 - at)]  # its chart goes on at the next step
    assert promoted["step"] == 12 and promoted["goodput"] is not None and promoted["goodput"] <= 1.0
    shown = json.loads(product.cli("sweep", "show", str(sweep_id), "--json").stdout)
    finished = min(range(3), key=lambda n: trials[n][6])  # the best of those trained to the end
    assert shown["best"]["number"] == finished and [t["status"] for t in shown["trials"]][:3] == ["SUCCEEDED"] * 3


FAILING = f"""
name = "crash"
[workload]
kind = "script"
script = "{ROOT / 'tests' / 'scripts' / 'fail_cases.py'}"
args = ["raise_rank1"]
env = {{SEED = "0"}}
[launch]
nproc_per_node = 2
[retry]
max_retries = 0
[sweep]
metric = "loss"
searcher = "grid"
max_trials = 6
max_concurrent = 2
[sweep.space]
"workload.env.SEED" = {{choice = ["1", "2", "3", "4", "5", "6"]}}
[sweep.budget]
max_failed = 2
"""


def test_a_script_that_fails_for_every_setting_trips_the_breaker(product: Product, tmp_path: Path) -> None:
    product.env["RUNYARD_CPU_SLOTS"] = "4"
    sweep_id = start(product, tmp_path, FAILING, "failing")
    product.start_scheduler()
    wait("the breaker tripped", lambda: sweep_status(product, sweep_id) == "STOPPED")
    reason = product.query("SELECT status_reason FROM sweeps WHERE id = :s", s=sweep_id)[0][0]
    assert reason.startswith("stopped: 2 trials failed with the same error (ValueError: loss went NaN at step 50")
    assert "(sweep.budget.max_failed = 2)" in reason
    made = product.query("SELECT COUNT(*) FROM sweep_trials WHERE sweep_id = :s", s=sweep_id)[0][0]
    assert made <= 3  # two failed; a third at most was made before the second failure was seen
    wait("nothing training", lambda: not product.query(
        "SELECT r.id FROM runs r JOIN sweep_trials t ON t.run_id = r.id "
        "WHERE r.status NOT IN ('FAILED', 'PRUNED', 'SUCCEEDED')"))


GRID = f"""
name = "quad"
[workload]
kind = "script"
script = "{ROOT / 'tests' / 'scripts' / 'quadratic.py'}"
args = ["--steps", "5"]
env = {{X = "0"}}
[launch]
nproc_per_node = 2
[sweep]
metric = "loss"
searcher = "grid"
max_concurrent = 3
[sweep.space]
"workload.env.X" = {{choice = ["0.1", "0.3", "0.6"]}}
"""


def test_a_grid_sweep_of_a_users_own_script(product: Product, tmp_path: Path) -> None:
    product.env["RUNYARD_CPU_SLOTS"] = "6"  # the three trials at once
    sweep_id = start(product, tmp_path, GRID, "grid")
    product.start_scheduler()
    wait("the grid finished", lambda: sweep_status(product, sweep_id) == "FINISHED")
    shown = json.loads(product.cli("sweep", "show", str(sweep_id), "--json").stdout)
    assert [(t["params"], t["status"]) for t in shown["trials"]] == [
        ({"workload.env.X": x}, "SUCCEEDED") for x in ("0.1", "0.3", "0.6")]
    # The objective is the script's own RUNYARD line at its last step: (X - 0.3)^2 + 1/5.
    assert [t["objective"] for t in shown["trials"]] == pytest.approx([0.24, 0.2, 0.29])
    best = product.cli("sweep", "best", str(sweep_id)).stdout
    assert 'X = "0.3"' in best and "sweep:" not in best
    config = parse_config(parse_toml(best))  # ready to submit as it is
    assert isinstance(config.workload, ScriptWorkload) and config.workload.env == {"X": "0.3"}
