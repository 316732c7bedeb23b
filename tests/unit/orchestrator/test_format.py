"""Display text (orchestrator/format.py): the words for a run's start-up phase, a step without
a total, and when a queued run (and the whole queue) should start and be done.
"""

from __future__ import annotations

import datetime as dt

from db.states import RunStatus
from db.vocabulary.config import RunConfig
from db.vocabulary.queue_forecast import Start
from orchestrator.cost_text import tariff_text
from orchestrator.format import (
    day_clock,
    end_help,
    end_text,
    end_words,
    eta_text,
    exit_text,
    queue_text,
    start_text,
    startup_text,
    status_words,
    step_text,
)


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
    assert (startup_text(RunStatus.STARTING, _a("first_step"), config, now=1020.0) or "").startswith("First step")
    assert (startup_text(RunStatus.STARTING, _a("first_step"), compiled, now=1020.0) or "").startswith("Compiling")
    assert "script" in (startup_text(RunStatus.STARTING, _a(None), script, now=1001.0) or "")
    # Nothing once it trains, before it launched, or after.
    assert startup_text(RunStatus.RUNNING, _a(None, first_step_at=1010.0), config) is None
    assert startup_text(RunStatus.QUEUED, None, config) is None
    assert startup_text(RunStatus.SUCCEEDED, _a("setup"), config) is None
    assert startup_text(RunStatus.RUNNING, _a("finishing"), config) is None


def test_a_step_without_a_total_is_shown_alone() -> None:
    assert step_text(12, 300) == "12/300" and step_text(12, 300, " / ") == "12 / 300"
    assert step_text(12, 0) == "12" and step_text(0, None) == "0"


def test_a_trial_stopped_early_says_at_which_step_and_by_which_sweep() -> None:
    trial = {"sweep_id": 3, "sweep_name": "lr", "number": 4}
    assert status_words("PRUNED", 40, trial) == "stopped early at step 40 by sweep 3"
    assert status_words("PAUSED", 40, None) == "PAUSED"
    assert status_words("RUNNING", 40, trial) == "RUNNING"  # a trial training is a run like any


def test_a_finished_run_says_when_it_ended_and_what_it_cost() -> None:
    assert end_words("RUNNING") == ("Ends at", "Cost so far")
    assert end_words("RETRYING") == ("Ends at", "Cost so far")
    for status in ("SUCCEEDED", "FAILED", "CANCELLED", "PAUSED", "PRUNED"):
        assert end_words(status) == ("Ended at", "Cost")
    now = dt.datetime(2026, 12, 2, 15, 0).timestamp()
    ended = dt.datetime(2026, 12, 2, 14, 5).timestamp()
    assert end_text("SUCCEEDED", ended, 0.0, None, now) == "14:05"  # not "–"
    assert end_text("CANCELLED", None, None, None, now) == "–"  # cancelled before it started
    assert end_help("SUCCEEDED", "14:05", None) == "The run ended at 14:05"


def test_a_live_eta_names_its_date_when_it_is_not_today() -> None:
    now = dt.datetime(2026, 12, 2, 15, 0).timestamp()
    assert end_text("RUNNING", None, 3600.0, None, now) == "16:00 (in 1h 00m)"
    assert eta_text("RUNNING", 20 * 3600.0, None, now) == "Thu 3 Dec 11:00 (in 20h 00m)"
    assert day_clock(dt.datetime(2026, 12, 9, 8, 30).timestamp(), now) == "Wed 9 Dec 08:30"
    basis = "from the last 590 steps' pace over 59 s (10 steps/s), evaluation and checkpoint pauses included"
    assert end_help("RUNNING", "16:00 (in 1h 00m)", basis) == f"16:00 (in 1h 00m): {basis}"
    assert end_help("RUNNING", "–", None) == "Shown once the run has a pace and a total number of steps"


def test_a_tariff_is_written_as_a_person_writes_it() -> None:
    """Cents keep two decimals ($0.30, not $0.3), finer tariffs keep their digits, PUE one decimal."""
    assert tariff_text(0.3, 1.0) == "$0.30/kWh x PUE 1.0"
    assert tariff_text(0.075, 1.25) == "$0.075/kWh x PUE 1.25"
    assert tariff_text(0.1234, 1.4) == "$0.1234/kWh x PUE 1.4"


def test_a_queued_runs_start_and_the_queues_end_in_words() -> None:
    now = dt.datetime(2026, 12, 2, 15, 0).timestamp()
    at = now + 40 * 60
    start = {"at": at, "after_run": 38, "basis": "after run 38 ends, by that run's predicted end"}
    assert start_text(start, now, short=True) == "starts ≈ 15:40, after run 38"
    assert start_text(start, now) == "starts ≈ 15:40 (in 40m 00s): after run 38 ends, by that run's predicted end"
    assert start_text({**start, "at": now + 86_400}, now, short=True) == "starts ≈ Thu 03 Dec 15:00, after run 38"
    unknown = {"at": None, "after_run": 38, "basis": "after run 38, whose length is not known"}
    assert start_text(unknown, now, short=True) == "start not known"  # the cell; why: the queue's line
    assert start_text(unknown, now) == "start not known: after run 38, whose length is not known"
    assert start_text(None, now) == ""
    queue = {39: Start(at, 38, "", at + 600), 40: Start(None, None, "Slurm decides", here=False)}
    assert queue_text(queue, now) == ("1 run(s) queued here; all done ≈ 15:50 (in 50m 00s); 1 on Slurm (Slurm "
                                      "decides when they start).")
    assert queue_text({39: Start(at, 38, "", None), 41: Start(None, 39, "")}, now) == (
        "2 run(s) queued here; when all are done is not known: run 39's start or length is not known.")
    assert queue_text({}, now) is None


def test_exit_text_says_why_an_attempt_has_no_exit_code() -> None:
    assert exit_text("SUCCEEDED", 0) == "exit 0"
    assert exit_text("FAILED", 1) == "exit 1"
    assert exit_text("FAILED", -9) == "exit -9 (SIGKILL)"
    assert exit_text("FAILED", -200) == "exit -200"  # no such signal
    assert exit_text("RUNNING", None) == "still running"
    assert exit_text("CRASHED", None) == "no exit code (killed or vanished)"
    assert exit_text("CANCELLED", None) == "no exit code (cancelled)"
    assert exit_text("SUCCEEDED", None) == "no exit code"
