"""A sweep's trial on the run pages: a PRUNED one says it was stopped early, at which step and by
which sweep (where a paused run says PAUSED), its page names its sweep and links to it, its Resume is
the sweep's promotion, and the Runs list names each trial's sweep and opens filtered to one sweep.
"""

from __future__ import annotations

import json
import time

from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Checkpoint, Run, SweepTrial
from db.requests import create_run
from db.states import RunStatus, transition
from db.sweeps.requests import create_sweep, request_prune, trial_of
from db.vocabulary.config import RunConfig, parse_config
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from tests.unit.app.pages import add_run, as_read, no_exception, open_page, sessions, settings

__all__ = ["sessions", "settings"]  # the fixtures, from the helper module

SWEEP = {"name": "lr", "sweep": {"space": {"train.lr": {"log_uniform": [1e-4, 1e-2]}}, "max_trials": 4}}
WHY = {"rung": 0, "step": 30, "value": 0.5123, "cut": 0.41, "metric": "eval_loss"}


def pruned_trial(sessions: sessionmaker[Session], settings: Settings) -> tuple[int, int]:
    """Sweep "lr" with trial 0 stopped early at step 33 (a verified checkpoint at step 30) and trial 1
    queued, beside a run of no sweep; returns (sweep id, the pruned trial's run id)."""
    with sessions() as s:
        sweep = create_sweep(s, parse_config(SWEEP), [30])
        runs = []
        for number in range(2):
            run = create_run(s, RunConfig(name=f"lr-t{number}", tags=(f"sweep:{sweep.id}",)), settings.runs_dir,
                             Price(0.1, "test"))
            s.add(SweepTrial(sweep_id=sweep.id, number=number, run_id=run.id, params_json="{}", created_at=time.time()))
            runs.append(run.id)
        add_run(s, settings, "alone")
        s.flush()
        pruned = runs[0]
        for to in (RunStatus.STARTING, RunStatus.RUNNING):
            transition(s, pruned, to, "launch")
        request_prune(s, trial_of(s, sweep.id, 0), WHY, f"sweep {sweep.id}")
        transition(s, pruned, RunStatus.PRUNED, f"stopped early by sweep {sweep.id} at step 33 (with a checkpoint)")
        s.add(Attempt(run_id=pruned, number=1, status="PAUSED", dir="/x", started_at=time.time() - 60,
                      ended_at=time.time(), last_step=33))
        s.add(Checkpoint(run_id=pruned, attempt=1, step=30, path="/x/30", bytes=1, sha256="s", params_digest="p",
                         blocked_s=0, total_s=0, created_at=time.time(), verified=True))
        s.commit()
        return sweep.id, pruned


def test_a_pruned_trials_page_says_stopped_early_names_its_sweep_and_promotes(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    sweep_id, run_id = pruned_trial(sessions, settings)
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    title = as_read(at.markdown[0].value)
    assert f"stopped early at step 33 by sweep {sweep_id}" in title and "content_cut" in title
    assert any(f"trial 0 of [sweep {sweep_id} lr](sweep?id={sweep_id})" in as_read(m.value) for m in at.markdown)
    assert any(f"stopped early by sweep {sweep_id}" in c.value for c in at.caption)  # the reason, as given
    # Resume is the promotion, from the newest verified checkpoint.
    promote = next(b for b in at.button if b.label == "Promote: continue from step 30")
    assert not [b for b in at.button if b.label.startswith("Resume from step")]
    promote.click().run()
    no_exception(at)
    with sessions() as s:
        run = s.get(Run, run_id)
        assert run is not None and run.status == "QUEUED"
        assert trial_of(s, sweep_id, 0).promoted == 1


def test_a_paused_run_of_no_sweep_still_says_paused(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        run_id = add_run(s, settings, "plain", RunStatus.STARTING, RunStatus.RUNNING, RunStatus.PAUSING,
                         RunStatus.PAUSED)
        s.commit()
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    assert "pause_circle: PAUSED]" in at.markdown[0].value
    assert not any("trial" in m.value and "sweep?id=" in m.value for m in at.markdown)


def test_the_runs_list_names_each_trials_sweep_and_filters_by_sweep(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    sweep_id, run_id = pruned_trial(sessions, settings)
    at = open_page("views/runs.py")
    no_exception(at)
    table = at.dataframe[0].value.set_index("name")
    assert table.loc["lr-t0", "status"] == f"stopped early at step 33 by sweep {sweep_id}"
    assert table.loc["lr-t1", "status"] == "QUEUED"
    assert (table.loc["lr-t1", "sweep"], table.loc["alone", "sweep"]) == (f"lr #{sweep_id}, trial 1", "")
    at = open_page("views/runs.py", sweep=str(sweep_id))
    no_exception(at)
    assert sorted(at.dataframe[0].value["name"]) == ["lr-t0", "lr-t1"]
    with sessions() as s:
        assert json.loads(s.get_one(Run, run_id).tags_json) == [f"sweep:{sweep_id}"]
