"""A script's own checkpoint files, with scripts that know nothing of runyard (tests/scripts/):
listed with sha256, a SIGKILLed rank retried from the script's newest file, pause and resume,
a fork, pinning by copy, and `runyard rerun`."""

from __future__ import annotations

import hashlib
import os
import re
import shutil
import signal
import sqlite3
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import psutil
import pytest

from db.file_versions import sha256_of
from tests.conftest import training_processes
from tests.integration.conftest import ROOT, Product

pytestmark = pytest.mark.slow
# The tests share one installation and scheduler, and read their own runs by id
# (tests/integration/conftest.py: product).
SHARES_ONE_SCHEDULER = True

SCRIPTS = ROOT / "tests" / "scripts"
DDP_TUTORIAL = SCRIPTS / "ddp_tutorial" / "multigpu_torchrun.py"
# The tutorial prints "[GPU1] Epoch 3 | Batchsize: 32 | Steps: 4" per epoch: its epoch is the step.
EPOCH_LINE = r"\[GPU\d+\] Epoch (?P<step>\d+) \| Batchsize: (?P<value>\d+)"
NANOGPT_LINE = r"iter (?P<step>\d+): loss (?P<value>[\d.]+)"


def toml_list(items: list[str]) -> str:
    return "[" + ", ".join(f"'{x}'" for x in items) + "]"


def submit(product: Product, workdir: Path, script: Path, args: list[str], extra: str = "", **env: str) -> int:
    config = product.home / f"{workdir.name}.toml"
    env_lines = "".join(f"{k} = '{v}'\n" for k, v in env.items())
    config.write_text(
        f"name = '{workdir.name}'\n[workload]\nkind = 'script'\nscript = '{script}'\nworkdir = '{workdir}'\n"
        f"args = {toml_list(args)}\n{extra}\n[workload.env]\n{env_lines}"
        "[retry]\nmax_retries = 1\nbackoff_s = 0.5\n")
    return product.submit_file(config)  # as `runyard submit CONFIG` does, without its process


def sha256(path: str | Path) -> str:
    return hashlib.sha256(Path(path).read_bytes()).hexdigest()


def live_script_checkpoints(detail: dict) -> list[dict]:
    return [c for c in detail["checkpoints"] if c["source"] == "script" and not c["deleted"]]


def kill_rank(product: Product, run_id: int, attempt: int, rank: int) -> None:
    """SIGKILL one rank of a run's attempt, found by the environment runyard and torchrun gave it.
    Only under this product's home: the tests beside it (pytest-xdist) have a run 1 too."""
    for proc in training_processes(product.home):
        try:
            env = proc.environ()
        except (psutil.Error, OSError):
            continue
        if (env.get("RUNYARD_RUN_ID"), env.get("RUNYARD_ATTEMPT"), env.get("RANK")) == (
                str(run_id), str(attempt), str(rank)) and "LOCAL_RANK" in env:
            proc.send_signal(signal.SIGKILL)
            return
    raise AssertionError(f"no rank {rank} of run {run_id} attempt {attempt} is running")


def first_step(product: Product, run_id: int, attempt: int) -> int | None:
    con = sqlite3.connect(product.home / "runyard.db")
    try:
        return con.execute("SELECT MIN(step) FROM metrics WHERE run_id = ? AND attempt = ?",
                           (run_id, attempt)).fetchone()[0]
    finally:
        con.close()


def test_ddp_tutorial_snapshots_are_listed_and_a_killed_rank_resumes_from_the_newest(
        product: Product, tmp_path: Path) -> None:
    workdir = tmp_path / "ddp"
    workdir.mkdir()
    run_id = submit(product, workdir, DDP_TUTORIAL, ["30", "3", "--batch_size", "32"],
                    f"checkpoint_glob = 'snapshot.pt'\ncheckpoint_step_key = 'EPOCHS_RUN'\n"
                    f"[workload.stdout_metrics]\nbatch_size = '{EPOCH_LINE}'",
                    STEP_SLEEP="0.1")
    product.start_scheduler()
    # The tutorial saves snapshot.pt every 3 epochs: wait until runyard verified one past epoch 3.
    detail = product.wait_for(run_id, lambda d: any(c["verified"] and c["step"] >= 4
                                                    for c in live_script_checkpoints(d)))
    kill_rank(product, run_id, 1, 1)
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", "CANCELLED")
    first, second = detail["attempts"][:2]
    assert first["status"] in ("FAILED", "CRASHED") and first["cause"], first

    # Attempt 1's snapshots: each version it wrote over was recorded, then marked overwritten.
    own = [c for c in detail["checkpoints"] if c["attempt"] == 1]
    assert all(c["source"] == "script" and c["origin"] == str(workdir / "snapshot.pt") for c in own)
    assert all(c["deleted_reason"].startswith("overwritten by the script") for c in own[:-1])
    newest = max(own, key=lambda c: c["file_mtime"])
    # Retried from the newest snapshot: the file, its step, and the tutorial's own words.
    assert second["resume_path"] == str(workdir / "snapshot.pt") and second["resume_step"] == newest["step"]
    log = product.cli("logs", str(run_id), "--attempt", "2", "--rank", "0").stdout
    resumed = re.search(r"Resuming training from snapshot at Epoch (\d+)", log)
    assert resumed is not None, log
    resumed_epoch = int(resumed.group(1))
    # A snapshot's step is the one it holds (checkpoint_step_key = 'EPOCHS_RUN'): the epoch it resumes at.
    assert newest["step"] == resumed_epoch
    # Each version's step was read from its file (EPOCHS_RUN, saved every 3 epochs), never the
    # printed epoch it fell back to while a module's state_dict broke the read (CI, 2026-11-27).
    assert all(c["step"] % 3 == 0 for c in detail["checkpoints"]), [c["step"] for c in detail["checkpoints"]]
    assert first_step(product, run_id, 2) == resumed_epoch
    # Steps lost count from the snapshot, not from 0.
    assert first["last_checkpoint_step"] == max(c["step"] for c in own)
    assert first["steps_lost"] == first["last_step"] - first["last_checkpoint_step"]
    assert first["steps_lost"] < first["last_step"]

    # The file on disk is the newest recorded version, its sha256 as listed.
    final = live_script_checkpoints(detail)
    assert len(final) == 1 and final[0]["verified"] and final[0]["sha256"] == sha256(workdir / "snapshot.pt")
    show = product.cli("show", str(run_id)).stdout
    assert f"script  sha256 {final[0]['sha256'][:12]}" in show and str(workdir / "snapshot.pt") in show


def test_nanogpt_retry_resume_pin_and_fork_use_its_own_checkpoint(product: Product, tmp_path: Path) -> None:
    workdir = tmp_path / "nanogpt"
    shutil.copytree(SCRIPTS / "nanogpt", workdir)
    ckpt = workdir / "out" / "ckpt.pt"
    run_id = submit(product, workdir, workdir / "train.py",
                    ["config/train_tiny_char.py", "--max_iters=160", "--iter_sleep=0.03"],
                    "checkpoint_glob = 'out/ckpt.pt'\nresume_args = ['--init_from=resume']\n"
                    f"[workload.stdout_metrics]\nloss = '{NANOGPT_LINE}'")
    product.start_scheduler()
    product.wait_for(run_id, lambda d: any(c["verified"] and c["step"] >= 40 for c in live_script_checkpoints(d)))
    kill_rank(product, run_id, 1, 1)
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", "CANCELLED")
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    second = detail["attempts"][1]
    assert second["resume_path"] == str(ckpt) and second["resume_step"] >= 40
    assert "Resuming training from out" in product.cli("logs", str(run_id), "--attempt", "2", "--rank", "0").stdout
    # It went on from its checkpoint's iteration instead of redoing iterations from 0.
    assert (first_step(product, run_id, 2) or 0) >= 40

    # Pinning copies the file into the run's folder; the copy has the recorded sha256.
    newest = live_script_checkpoints(detail)[-1]
    assert newest["sha256"] == sha256(ckpt)
    product.cli("pin", str(run_id), "--checkpoint", str(newest["id"]))
    pinned = next(c for c in product.detail(run_id)["checkpoints"] if c["id"] == newest["id"])  # show --json's
    assert pinned["pinned"] and Path(pinned["path"]).is_relative_to(Path(detail["run_dir"]))
    assert sha256(pinned["path"]) == newest["sha256"]

    # `runyard resume RUN --checkpoint ID`: a new attempt that starts from that file.
    product.cli("resume", str(run_id), "--checkpoint", str(newest["id"]))
    # A fork in a fresh copy of the folder: runyard puts the chosen file where the script reads it.
    # Asked for while the resumed attempt is queued or running: it starts when that one ends.
    fork_dir = tmp_path / "nanogpt-fork"
    shutil.copytree(SCRIPTS / "nanogpt", fork_dir)
    fork_id = int(product.cli("fork", str(run_id), "--checkpoint", str(newest["id"]),
                              "--set", f"workload.workdir={fork_dir}").stdout.strip())
    detail = product.wait_for(run_id, lambda d: len(d["attempts"]) == 3 and d["status"] in ("SUCCEEDED", "FAILED"))
    third = detail["attempts"][2]
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    assert (third["resume_path"], third["resume_step"]) == (str(ckpt), newest["step"])
    assert "Resuming training from out" in product.cli("logs", str(run_id), "--rank", "0").stdout

    forked = product.wait_status(fork_id, "SUCCEEDED", "FAILED")
    assert forked["status"] == "SUCCEEDED", forked["status_reason"]
    assert forked["attempts"][0]["resume_path"] == str(fork_dir / "out" / "ckpt.pt")
    fork_log = product.cli("logs", str(fork_id), "--rank", "0").stdout
    assert "Resuming training from out" in fork_log
    assert first_step(product, fork_id, 1) > newest["step"] - 5  # it went on from there, not from 0


def test_pause_needs_a_checkpoint_source_and_rerun_starts_again_in_the_folder(
        product: Product, tmp_path: Path) -> None:
    plain_dir, glob_dir = tmp_path / "plain", tmp_path / "glob"
    plain_dir.mkdir()
    glob_dir.mkdir()
    metrics = f"[workload.stdout_metrics]\nbatch_size = '{EPOCH_LINE}'"
    plain = submit(product, plain_dir, DDP_TUTORIAL, ["40", "2", "--batch_size", "32"], metrics, STEP_SLEEP="0.1")
    product.start_scheduler()
    product.wait_step(plain, 3)  # past its first snapshot (after epoch 1)

    # Both refusals asked at once (two CLI processes): the run stays RUNNING through them.
    with ThreadPoolExecutor(2) as pool:
        pausing = pool.submit(product.cli, "pause", str(plain), check=False, process=True)
        rerunning = pool.submit(product.cli, "rerun", str(plain), check=False, process=True)
        refused, refused_rerun = pausing.result(), rerunning.result()
    assert refused.returncode != 0
    assert "no checkpoint source" in refused.stderr and "workload.checkpoint_glob" in refused.stderr
    assert refused_rerun.returncode != 0 and "only a finished run can be rerun" in refused_rerun.stderr
    assert product.detail(plain)["status"] == "RUNNING"  # `runyard show --json`'s status
    product.cli("cancel", str(plain))
    # Queued while the plain run is cancelled: it starts as soon as the ranks are gone.
    with_glob = submit(product, glob_dir, DDP_TUTORIAL, ["20", "2", "--batch_size", "32"],
                       f"checkpoint_glob = 'snapshot.pt'\n{metrics}", STEP_SLEEP="0.1")
    product.wait_status(plain, "CANCELLED")

    product.wait_for(with_glob, lambda d: any(c["verified"] for c in live_script_checkpoints(d)))
    accepted = product.cli("pause", str(with_glob)).stdout
    assert "Resume will start from" in accepted and str(glob_dir / "snapshot.pt") in accepted
    assert product.wait_status(with_glob, "PAUSED", "CANCELLED", "FAILED", "SUCCEEDED")["status"] == "PAUSED"
    product.cli("resume", str(with_glob))
    # The plain script keeps its own state in its folder: rerun it there, without a checkpoint
    # (queued behind the resumed run, which holds the CPU slots).
    assert os.path.exists(plain_dir / "snapshot.pt")
    product.cli("rerun", str(plain))
    resumed = product.wait_status(with_glob, "SUCCEEDED", "FAILED")
    assert resumed["status"] == "SUCCEEDED" and resumed["attempts"][1]["resume_path"] == str(glob_dir / "snapshot.pt")

    rerun = product.wait_for(plain, lambda d: len(d["attempts"]) == 2 and d["status"] in ("SUCCEEDED", "FAILED"))
    assert rerun["status"] == "SUCCEEDED", rerun["status_reason"]
    assert rerun["attempts"][1]["resume_path"] is None and rerun["attempts"][1]["resume_step"] is None
    assert "Resuming training from snapshot at Epoch" in product.cli("logs", str(plain), "--rank", "0").stdout


def test_hugging_face_checkpoint_folders_a_killed_rank_resumes_at_the_true_step(
        product: Product, tmp_path: Path) -> None:
    """An HF-Trainer-style script (checkpoint-N/ folders with trainer_state.json, train/loss in
    TensorBoard, resumes itself from its newest folder): the folders are checkpoints at the step
    they hold, a SIGKILLed rank costs the true steps lost, and the ETA shows from 20% on."""
    workdir = tmp_path / "hf"
    workdir.mkdir()
    run_id = submit(product, workdir, SCRIPTS / "hf_style.py",
                    ["--max_steps", "60", "--save_steps", "10", "--sleep", "0.15"],
                    "checkpoint_glob = 'hf_out/checkpoint-*'\nmax_steps = 60\ntensorboard_dir = 'hf_out/runs'")
    product.start_scheduler()
    running = product.wait_for(run_id, lambda d: d["status"] in ("SUCCEEDED", "FAILED", "CANCELLED")
                               or (d["step"] >= 15 and d["eta_s"] is not None), timeout=120)
    assert running["status"] == "RUNNING" and running["eta_s"] > 0, running["status_reason"]  # not a metric 'loss'
    detail = product.wait_for(run_id, lambda d: any(c["verified"] and c["step"] >= 20
                                                    for c in live_script_checkpoints(d)))
    kill_rank(product, run_id, 1, 1)
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", "CANCELLED")
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    first, second = detail["attempts"][:2]
    assert first["status"] in ("FAILED", "CRASHED") and first["cause"], first

    own = [c for c in detail["checkpoints"] if c["attempt"] == 1]
    assert own and all(c["source"] == "script" and c["step"] % 10 == 0 for c in own)
    assert all(Path(c["origin"]).name == f"checkpoint-{c['step']}" for c in own)  # the step each one holds
    newest = max(own, key=lambda c: c["step"])
    assert first["last_checkpoint_step"] == newest["step"]
    assert first["steps_lost"] == first["last_step"] - newest["step"] < 10
    assert second["resume_step"] == newest["step"] and second["resume_path"] == newest["origin"]
    log = product.cli("logs", str(run_id), "--attempt", "2", "--rank", "0").stdout
    assert f"Resuming from checkpoint hf_out/checkpoint-{newest['step']} at global step {newest['step']}" in log
    assert detail["step"] == 60
    # A folder that is still there is listed with its files' total size and a digest over them.
    final = [c for c in live_script_checkpoints(detail) if Path(c["origin"]).is_dir()]
    assert final and all(c["bytes"] == sum(f.stat().st_size for f in Path(c["origin"]).iterdir()) for c in final)
    assert all(c["sha256"] == sha256_of(c["origin"]) for c in final if c["verified"])
