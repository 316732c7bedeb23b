"""The `runyard sweep` verbs as a person types them (in this process, tests/cli_runner.py): start
and preview a file, list and show sweeps (`show --json` with each trial's params, status, run and
objective), pause, resume, change the limits, cancel, promote a pruned trial, and print the best
trial's config as TOML that `runyard submit` reads back."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Checkpoint, SweepTrial
from db.requests import create_run
from db.states import RunStatus, transition
from db.vocabulary.config import parse_config, parse_toml
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from tests.cli_runner import run_in_process

ROOT = Path(__file__).resolve().parents[4]
SWEEP = str(ROOT / "examples" / "sweep.toml")


def _env(settings: Settings) -> dict[str, str]:
    return {**os.environ, "RUNYARD_HOME": str(settings.home), "RUNYARD_DB_URL": settings.db_url,
            "RUNYARD_CPU_SLOTS": "2"}


def runyard(settings: Settings, *args: str, code: int = 0) -> str:
    result = run_in_process(list(args), _env(settings))
    assert result.returncode == code, result.stderr
    return result.stdout


def _trials(sessions: sessionmaker[Session], settings: Settings, sweep_id: int) -> tuple[int, int]:
    """Two trials as the scheduler would have made them: t0 SUCCEEDED (eval_loss 0.2), t1 PRUNED
    at rung 0 with a checkpoint at step 12."""
    with sessions() as s:
        ids = []
        for number, (status, objective) in enumerate(((RunStatus.SUCCEEDED, 0.2), (RunStatus.PRUNED, None))):
            config = parse_config({"name": f"digits-lr-t{number}", "tags": [f"sweep:{sweep_id}"],
                                   "train": {"lr": 0.01 * (number + 1)}})
            run = create_run(s, config, settings.runs_dir, Price(0.1, "test"))
            for to in (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.PAUSING, status):
                if to is not RunStatus.PAUSING or status is RunStatus.PRUNED:
                    transition(s, run.id, to, "test")
            s.add(Attempt(run_id=run.id, number=1, status="PAUSED", dir="/x", started_at=time.time() - 10,
                          ended_at=time.time(), last_step=270 if objective else 12))
            s.add(Checkpoint(run_id=run.id, attempt=1, step=12, path="/c/step-12", bytes=1, sha256="0",
                             params_digest="0", blocked_s=0.1, total_s=0.1, created_at=time.time()))
            s.add(SweepTrial(sweep_id=sweep_id, number=number, run_id=run.id,
                             params_json=json.dumps({"train.lr": 0.01 * (number + 1)}), rung=0,
                             rungs_json=json.dumps({"0": [10, 0.3 + number]}), objective=objective,
                             objective_step=270 if objective else None, created_at=time.time(),
                             prune_json=None if objective else '{"rung": 0, "step": 10, "value": 1.3, "cut": 0.3}'))
            ids.append(run.id)
        s.commit()
        return ids[0], ids[1]


def test_a_sweep_from_start_to_its_best_trial(settings: Settings, sessions: sessionmaker[Session]) -> None:
    preview = runyard(settings, "sweep", "preview", SWEEP)
    assert preview.splitlines()[:2] == ["27 trial(s), 2 at a time, 270 steps each at most (2 rank(s) a trial)",
                                        "  rung 0 at step 10: 27 trial(s) reach it"]
    assert json.loads(runyard(settings, "sweep", "preview", SWEEP, "--json"))["full_runs"] == 3.0
    sweep_id = json.loads(runyard(settings, "sweep", "start", SWEEP, "--set", "sweep.max_trials=4", "--json"))["id"]
    assert runyard(settings, "sweep", "pause", str(sweep_id)).startswith(f"sweep {sweep_id} paused")
    assert runyard(settings, "sweep", "resume", "digits-lr") == f"sweep {sweep_id} resumed\n"  # by name too
    assert runyard(settings, "sweep", "edit", str(sweep_id), "--max-concurrent", "3") == (
        f"sweep {sweep_id}: max_concurrent 2 -> 3\n")
    done, pruned = _trials(sessions, settings, sweep_id)
    shown = json.loads(runyard(settings, "sweep", "show", str(sweep_id), "--json"))
    assert (shown["status"], shown["max_trials"], shown["max_concurrent"]) == ("RUNNING", 4, 3)
    assert [(t["number"], t["run_id"], t["status"], t["params"], t["objective"]) for t in shown["trials"]] == [
        (0, done, "SUCCEEDED", {"train.lr": 0.01}, 0.2), (1, pruned, "PRUNED", {"train.lr": 0.02}, None)]
    text = runyard(settings, "sweep", "show", str(sweep_id))
    assert f"sweep {sweep_id}  digits-lr  RUNNING" in text and "PRUNED" in text
    assert "rung 0 at step 10: 2 value(s), best 0 go on" in text
    listed = runyard(settings, "sweep", "ls")
    assert "digits-lr" in listed and "1 PRUNED, 1 SUCCEEDED" in listed
    assert runyard(settings, "ls", "--tag", f"sweep:{sweep_id}").count("digits-lr-t") == 2  # trials are runs
    assert "PRUNED" in runyard(settings, "ls", "--status", "pruned")
    best = runyard(settings, "sweep", "best", str(sweep_id))
    assert best.startswith(f"# sweep {sweep_id} (digits-lr): its best trial, 0 (run {done}, SUCCEEDED), "
                           "eval_loss = 0.2")
    again = parse_config(parse_toml(best))  # ready to submit: the trial's own config, without its sweep's tag
    assert again.train.lr == 0.01 and again.name == "digits-lr-t0" and again.tags == ()
    assert runyard(settings, "sweep", "promote", str(sweep_id), "1") == (
        f"sweep {sweep_id}: trial 1 promoted; it continues from step 12\n")
    assert "only a PRUNED trial can be promoted" in run_in_process(
        ["sweep", "promote", str(sweep_id), "1"], _env(settings)).stderr
    assert runyard(settings, "sweep", "cancel", str(sweep_id)) == (
        f"sweep {sweep_id} cancelled; 1 trial(s) being cancelled\n")  # the promoted one, queued again
