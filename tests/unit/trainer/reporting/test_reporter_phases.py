"""What a launched run does before its first step: rank 0 reports SETUP and FIRST_STEP through
its database writer, the first step clears the phase, the watchdog's clock is not reset by a
phase, and the words a person reads on the Run page and in `runyard show`."""

from __future__ import annotations

import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt
from db.requests import create_run
from db.states import AttemptPhase, RunStatus
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from orchestrator.format import startup_text
from tests.conftest import wait_until
from tests.unit.paths import ROOT
from trainer.reporting.reporter import DatabaseWriter


def _attempt(sessions: sessionmaker[Session], settings: Settings) -> tuple[int, float]:
    started = time.time() - 30
    with sessions.begin() as s:
        run = create_run(s, RunConfig(), settings.runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
        s.flush()
        s.add(Attempt(run_id=run.id, number=1, status="RUNNING", dir=str(Path(run.run_dir) / "attempts" / "1"),
                      started_at=started))
        return run.id, started


def _read(sessions: sessionmaker[Session], run_id: int) -> tuple[str | None, float | None, int | None]:
    with sessions() as s:
        a = s.query(Attempt).filter_by(run_id=run_id, number=1).one()
        return a.phase, a.progress_at, a.last_step


def test_setup_then_first_step_then_the_first_step_clears_the_phase(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    run_id, _ = _attempt(sessions, settings)
    writer = DatabaseWriter(settings.db_url, run_id, 1, flush_interval_s=0.05)
    writer.start()
    try:
        writer.put_progress(None, phase=AttemptPhase.SETUP.value)
        wait_until(lambda: _read(sessions, run_id)[0] == "setup")
        # A start-up phase is no heartbeat: the watchdog keeps judging the start-up from the launch.
        assert _read(sessions, run_id)[1] is None
        writer.put_progress(None, phase=AttemptPhase.FIRST_STEP.value)
        wait_until(lambda: _read(sessions, run_id)[0] == "first_step")
        writer.put_progress(1)
        wait_until(lambda: _read(sessions, run_id)[2] == 1)
        phase, progress_at, _ = _read(sessions, run_id)
        assert phase is None and progress_at is not None
        writer.put_progress(None, phase=AttemptPhase.FINISHING.value)
        writer.put_progress(2)  # a step after the loop's end keeps "finishing" (only start-up phases clear)
        wait_until(lambda: _read(sessions, run_id)[2] == 2)
        assert _read(sessions, run_id)[0] == "finishing"
    finally:
        writer.close()


def _a(phase: str | None, first_step_at: float | None = None, resume_step: int = 0) -> dict:
    return {"phase": phase, "first_step_at": first_step_at, "ended_at": None, "started_at": 1000.0,
            "resume_step": resume_step}


def test_the_words_for_each_phase() -> None:
    config = RunConfig().as_dict()
    compiled = RunConfig.model_validate({"train": {"compile": True}}).as_dict()
    script = {"workload": {"kind": "script"}, "launch": {"nproc_per_node": 4}}
    assert startup_text(RunStatus.STARTING, _a(None), config, now=1004.0) == (
        "Launching: torchrun starts 2 rank(s), they import torch and join each other (rendezvous) "
        "(4s since launch)")
    assert startup_text(RunStatus.STARTING, _a("setup", resume_step=400), config, now=1012.0) == (
        "Setting up: loading the data and building the model, restoring step 400 (12s since launch)")
    assert startup_text(RunStatus.STARTING, _a("first_step"), config, now=1020.0).startswith("First step")
    assert startup_text(RunStatus.STARTING, _a("first_step"), compiled, now=1020.0).startswith("Compiling")
    assert "script" in startup_text(RunStatus.STARTING, _a(None), script, now=1001.0)
    # Nothing once it trains, before it launched, or after.
    assert startup_text(RunStatus.RUNNING, _a(None, first_step_at=1010.0), config) is None
    assert startup_text(RunStatus.QUEUED, None, config) is None
    assert startup_text(RunStatus.SUCCEEDED, _a("setup"), config) is None
    assert startup_text(RunStatus.RUNNING, _a("finishing"), config) is None


def test_a_process_start_is_read_to_the_tick_not_to_the_boot_second() -> None:
    """The ``spawned`` mark (the end of the launch phase) is when the rank's process was created:
    never before the parent started it, never after the child's first line ran. psutil's
    create_time can be up to a second early (the boot time it adds is in whole seconds)."""
    code = "import time; t = time.time(); from trainer.sdk import process_started; print(t, process_started())"
    before = time.time()
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, timeout=120,
                         cwd=ROOT).stdout
    first_line, started = (float(x) for x in out.split())
    assert before - 0.02 <= started <= first_line  # one clock tick (10 ms) of rounding, no more
