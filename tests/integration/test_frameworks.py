"""The recipes of docs/frameworks.md with the real frameworks: a Hugging Face ``Trainer`` script
and a Lightning script (tests/scripts/frameworks/), each in its own virtual environment through
``workload.python`` (tests/services/frameworks.sh makes it, sharing runyard's torch). In each, a
rank SIGKILLed after a checkpoint (the Trainer's: in the middle of its next save): the framework's
own checkpoints are listed at the step they hold, the retry resumes from the newest complete one at
that step with the true steps lost, and the ETA shows from 20% of progress.

Without the environment (``$RUNYARD_TEST_FRAMEWORKS`` unset) the tests skip; CI sets
``RUNYARD_TEST_FRAMEWORKS_REQUIRED=1``, where they fail instead.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import pytest

from tests.integration.conftest import ROOT, Product
from tests.integration.test_script_checkpoints import first_step, kill_rank, live_script_checkpoints, submit

pytestmark = pytest.mark.slow
SHARES_ONE_SCHEDULER = True

FRAMEWORKS = ROOT / "tests" / "scripts" / "frameworks"
FOLDER_ENV, REQUIRED_ENV = "RUNYARD_TEST_FRAMEWORKS", "RUNYARD_TEST_FRAMEWORKS_REQUIRED"
INSTALL_WAIT_S = 600.0  # CI installs it in the background while the unit tier runs (about 45 s)


@pytest.fixture(scope="module")
def framework_python() -> str:
    """The interpreter of the frameworks' environment, once its installation has finished."""
    folder = os.environ.get(FOLDER_ENV)
    problem = None
    if not folder:
        problem = f"no frameworks environment: ${FOLDER_ENV} is unset (tests/services/frameworks.sh start DIR)"
    else:
        deadline = time.monotonic() + INSTALL_WAIT_S
        while not any((Path(folder) / f).exists() for f in ("ready", "failed")) and time.monotonic() < deadline:
            time.sleep(1.0)
        if not (Path(folder) / "ready").exists():
            log = Path(folder) / "install.log"
            tail = log.read_text(errors="replace")[-2000:] if log.exists() else "(no install.log)"
            problem = f"the frameworks environment in {folder} did not install: {tail}"
    if problem:
        if os.environ.get(REQUIRED_ENV) == "1":
            pytest.fail(problem)
        pytest.skip(problem)
    assert folder is not None  # no problem: the folder was named
    return str(Path(folder) / "venv" / "bin" / "python")


def killed_after_a_checkpoint(product: Product, workdir: Path, script: str, args: list[str],
                              extra: str, stalled: str | None = None) -> tuple[int, dict, list[dict]]:
    """Submit ``script`` (tests/scripts/frameworks/) to run 40 steps in ``workdir``; wait for the ETA
    at 20% and a verified checkpoint at step 20 or later (or, with ``stalled``, for the file the
    script leaves when it stops half-way through a save); SIGKILL rank 1; wait for the end. The
    run's id, its detail at its end, and the checkpoints of its first attempt."""
    workdir.mkdir()
    run_id = submit(product, workdir, FRAMEWORKS / script, [*args, "--sleep", "0.2"], f"{extra}\nmax_steps = 40")
    product.start_scheduler()
    running = product.wait_for(run_id, lambda d: d["status"] in ("SUCCEEDED", "FAILED", "CANCELLED")
                               or (d["step"] >= 8 and d["eta_s"] is not None), timeout=150)
    assert running["status"] == "RUNNING" and running["eta_s"] > 0, running["status_reason"]
    product.wait_for(run_id, lambda d: d["status"] != "RUNNING" or (
        (workdir / stalled).exists() if stalled else any(c["verified"] and c["step"] >= 20
                                                         for c in live_script_checkpoints(d))))
    kill_rank(product, run_id, 1, 1)
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", "CANCELLED")
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    return run_id, detail, [c for c in detail["checkpoints"] if c["attempt"] == 1]


def resumed_at_the_newest(product: Product, run_id: int, detail: dict, own: list[dict]) -> dict:
    """The retry's resume, steps lost and first step, against attempt 1's own checkpoints."""
    first, second = detail["attempts"][:2]
    assert first["status"] in ("FAILED", "CRASHED") and first["cause"], first
    newest = max(own, key=lambda c: c["step"])
    assert first["last_checkpoint_step"] == newest["step"]
    assert first["steps_lost"] == first["last_step"] - newest["step"] <= 10, first  # a save every 10 steps
    assert second["resume_step"] == newest["step"], second
    assert Path(second["resume_path"]).name in {Path(c["origin"]).name for c in own if c["step"] == newest["step"]}
    assert first_step(product, run_id, 2) == newest["step"] + 1  # the framework went on from there, not from 0
    return newest


def test_hugging_face_trainer_resumes_a_rank_killed_mid_save_from_its_save_before(
        framework_python: str, product: Product, tmp_path: Path) -> None:
    """A rank killed while the Trainer writes checkpoint-30 (its weights written, its
    trainer_state.json not: the script waits there, ``--stall_save_at``): the folder is listed
    refused, never verified, and the retry resumes from checkpoint-20. It was verified after two
    still looks, handed to every retry, and the run FAILED on it."""
    run_id, detail, own = killed_after_a_checkpoint(
        product, tmp_path / "hf", "hf_trainer.py", ["--max_steps", "40", "--save_steps", "10", "--stall_save_at", "30"],
        f"python = '{framework_python}'\ncheckpoint_glob = 'hf_out/checkpoint-*'\ntensorboard_dir = 'hf_out/runs'",
        stalled="save-stalled")
    # checkpoint-N folders, each at trainer_state.json's global_step
    assert own and all(c["source"] == "script" and Path(c["origin"]).name == f"checkpoint-{c['step']}"
                       and c["step"] % 10 == 0 for c in own), own
    (broken,) = [c for c in own if c["step"] == 30]
    assert not broken["verified"] and "incomplete: no trainer_state.json" in broken["refused_reason"], broken
    newest = resumed_at_the_newest(product, run_id, detail, [c for c in own if c["verified"]])
    assert newest["step"] == 20
    assert detail["step"] == 40
    assert detail["config"]["workload"]["python"] == framework_python


def test_lightning_resumes_a_killed_rank_from_its_own_checkpoint(
        framework_python: str, product: Product, tmp_path: Path) -> None:
    run_id, detail, own = killed_after_a_checkpoint(
        product, tmp_path / "pl", "lightning_train.py", ["--max_steps", "40", "--every", "10"],
        f"python = '{framework_python}'\ncheckpoint_glob = 'ckpts/*.ckpt'")
    # epoch=0-step=N.ckpt at the step in its name and in its global_step; last.ckpt at its global_step
    named = [c for c in own if Path(c["origin"]).name != "last.ckpt"]
    assert named and all(Path(c["origin"]).name == f"epoch=0-step={c['step']}.ckpt" for c in named), own
    resumed_at_the_newest(product, run_id, detail, own)
    log = product.cli("logs", str(run_id), "--attempt", "2", "--rank", "0").stdout
    assert "Restored all states from the checkpoint" in log, log[-3000:]
    assert detail["step"] == 40


def test_lightning_s_wandb_logger_reports_through_runyard_s_stand_in(
        framework_python: str, product: Product, tmp_path: Path) -> None:
    """Lightning's ``WandbLogger`` takes runyard's wandb stand-in (``RUNYARD_WANDB_SHIM``; it checks
    for an installed ``wandb`` distribution, which the stand-in carries): every value lands in runyard
    at its true step (Lightning logs ``trainer/global_step`` from 0), and nothing is sent anywhere."""
    workdir = tmp_path / "plw"
    workdir.mkdir()
    run_id = submit(product, workdir, FRAMEWORKS / "lightning_train.py",
                    ["--max_steps", "12", "--every", "6", "--logger", "wandb"],
                    f"python = '{framework_python}'\ncheckpoint_glob = 'ckpts/*.ckpt'\nmax_steps = 12",
                    RUNYARD_WANDB_SHIM="1")
    product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", "CANCELLED")
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    (steps,) = product.query("SELECT MIN(step), MAX(step), COUNT(DISTINCT step) FROM metrics "
                             "WHERE run_id = :run AND key = 'train_loss'", run=run_id)
    assert tuple(steps) == (1, 12, 12)  # steps 1-12, as its checkpoints count them
    assert sorted({c["step"] for c in detail["checkpoints"]}) == [6, 12]
    assert not (workdir / "wandb").exists()  # the real wandb would have written its run folder here


def test_an_exception_under_lightning_s_on_exception_checkpoint_is_the_user_s_error(
        framework_python: str, product: Product, tmp_path: Path) -> None:
    """Issue 52 item 4: rank 1 raises; OnExceptionCheckpoint's save waits in a barrier inside its
    handler while rank 0 waits in the gradient all-reduce (Lightning #20187). The hang's stacks
    name rank 1 and the exception, and the attempt is its USER_ERROR, not a hang."""
    workdir = tmp_path / "ple"
    workdir.mkdir()
    config = product.home / "ple.toml"
    config.write_text(f"name = 'ple'\n[workload]\nkind = 'script'\nscript = '{FRAMEWORKS / 'lightning_train.py'}'\n"
                      f"workdir = '{workdir}'\npython = '{framework_python}'\ncheckpoint_glob = 'ckpts/*.ckpt'\n"
                      "args = ['--max_steps', '40', '--raise_at', '4', '--on_exception']\n")
    run_id = product.submit_file(config, "retry.max_retries=0", "supervision.hang_timeout_s=3")
    product.start_scheduler()
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", "CANCELLED")
    assert detail["status"] == "FAILED", detail["status_reason"]
    (attempt,) = detail["attempts"]
    assert (attempt["cause"], attempt["failed_rank"]) == ("USER_ERROR", 1), attempt
    assert attempt["exception"].startswith("ValueError (handled at on_exception_checkpoint.py:"), attempt
    assert "waited inside its exception handler for the other ranks" in attempt["reason"], attempt["reason"]
