"""How an ended attempt ends its run (orchestrator/scheduler/outcomes.py's table, one row a rule), and
orchestrator/scheduler/diagnosis.py's part in it: a rank that dies by a signal after every rank
finished its work is not a failure; any other death is."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from db.states import RunStatus, StopReason
from db.vocabulary.config import RunConfig, parse_config
from orchestrator.executors.logs import launcher_log
from orchestrator.scheduler.diagnosis import died_after_finishing
from orchestrator.scheduler.outcomes import APPLIERS, ENDINGS, Ended, Ending, ending
from trainer.process.lifecycle import write_finished

SUMMARY = """\
============================================================
trainer FAILED
------------------------------------------------------------
Failures:
{others}
------------------------------------------------------------
Root Cause (first observed failure):
[0]:
  time      : 2026-11-22_20:00:00
  host      : box
  rank      : 1 (local_rank: 1)
  exitcode  : {code} (pid: 4242)
  error_file: {error_file}
  traceback : Signal 6 (SIGABRT) received by PID 4242
============================================================
"""


def attempt_in(tmp_path: Path, *, finished: list[int], code: int = -6, error_file: str = "<N/A>",
               stop_reason: str | None = None) -> tuple[SimpleNamespace, RunConfig]:
    attempt_dir = tmp_path / "attempts" / "1"
    attempt_dir.mkdir(parents=True)
    launcher_log(attempt_dir).write_text(
        SUMMARY.format(others="  <NO_OTHER_FAILURES>", code=code, error_file=error_file))
    for rank in finished:
        write_finished(attempt_dir, rank, 40)
    config = parse_config({"launch": {"nproc_per_node": 2}})
    return SimpleNamespace(dir=str(attempt_dir), stop_reason=stop_reason), config


def test_every_rank_finished_then_one_aborted_is_a_success_with_a_warning(tmp_path: Path) -> None:
    warning = died_after_finishing(*attempt_in(tmp_path, finished=[0, 1]))
    assert warning is not None and "rank 1 by SIGABRT" in warning and "nothing was lost" in warning


def test_a_rank_that_had_not_finished_makes_it_a_failure(tmp_path: Path) -> None:
    assert died_after_finishing(*attempt_in(tmp_path, finished=[0])) is None


def test_an_exception_or_an_exit_code_is_a_failure_even_after_the_notes(tmp_path: Path) -> None:
    error_file = tmp_path / "error.json"
    error_file.write_text('{"message": {"message": "RuntimeError: boom", "extraInfo": {"py_callstack": ""}}}')
    after_an_exception = attempt_in(tmp_path / "a", finished=[0, 1], code=1, error_file=str(error_file))
    assert died_after_finishing(*after_an_exception) is None
    assert died_after_finishing(*attempt_in(tmp_path / "b", finished=[0, 1], code=1)) is None


def test_a_stop_runyard_asked_for_is_not_judged_here(tmp_path: Path) -> None:
    assert died_after_finishing(*attempt_in(tmp_path, finished=[0, 1], stop_reason="hang")) is None


# -- how an ended attempt ends its run: the decision table, without a database ------------------

CANCEL, PAUSE, HANG, PRUNE = StopReason.CANCEL, StopReason.PAUSE, StopReason.HANG, StopReason.PRUNE


def ended(status: RunStatus = RunStatus.RUNNING, stop: StopReason | None = None, code: int | None = 1,
          exited: bool = True, stopped: bool = False, every_step: bool = False, crash: str | None = None,
          by: str | None = None, mode: StopReason | None = None) -> Ended:
    """What is known once the processes are gone; ``mode`` defaults as stop_mode() reads it."""
    mode = mode or (PAUSE if status is RunStatus.PAUSING or stop is PAUSE else CANCEL)
    return Ended(status, stop, mode, code, exited, stopped, every_step, crash, by)


ENDING_ROWS = [
    # (what happened, the facts, how the run ends)
    ("every step trained before the cancel took effect", ended(RunStatus.CANCELLING, CANCEL, 0, every_step=True),
     Ending.FINISHED_BEFORE_STOP),
    ("every step trained before the pause took effect", ended(RunStatus.PAUSING, PAUSE, 0, every_step=True),
     Ending.FINISHED_BEFORE_STOP),
    ("a pause with a checkpoint", ended(RunStatus.PAUSING, PAUSE, 0, stopped=True), Ending.PAUSED),
    ("a pause whose ranks had not trained every step", ended(RunStatus.PAUSING, PAUSE, 0), Ending.PAUSED),
    # A sweep's prune is a pause that ends PRUNED (never FAILED or CANCELLED), unless every step was trained.
    ("a prune with a checkpoint", ended(RunStatus.PAUSING, PRUNE, 0, stopped=True, mode=PRUNE), Ending.PRUNED),
    ("a prune whose agent answered the SIGTERM with 1", ended(RunStatus.PAUSING, PRUNE, 1, stopped=True, mode=PRUNE),
     Ending.PRUNED),
    ("a prune after every step was trained", ended(RunStatus.PAUSING, PRUNE, 0, every_step=True, mode=PRUNE),
     Ending.FINISHED_BEFORE_STOP),
    ("a failure while pruning", ended(RunStatus.PAUSING, code=1, exited=True, mode=PRUNE),
     Ending.FAILED_WHILE_PAUSING),
    ("a cancel answered by torchrun's own non-zero exit", ended(RunStatus.CANCELLING, CANCEL, 1, stopped=True),
     Ending.CANCELLED),
    ("a cancel asked for while pausing", ended(RunStatus.CANCELLING, PAUSE, 0, stopped=True, mode=CANCEL),
     Ending.CANCELLED),
    ("a run being cancelled whose launcher left no record", ended(RunStatus.CANCELLING, None, None, exited=False),
     Ending.CANCELLED),
    ("a run being paused whose launcher left no record", ended(RunStatus.PAUSING, None, None, exited=False),
     Ending.PAUSED),
    ("every rank exited 0", ended(code=0), Ending.SUCCEEDED),
    ("every rank finished, then one died in shutdown", ended(code=-6, crash="rank 1 by SIGABRT"), Ending.SUCCEEDED),
    ("a hang killed by runyard is a failure", ended(stop=HANG, code=-9), Ending.FAILED),
    ("exit 0 after a SIGTERM from outside is a preemption", ended(code=0, stopped=True), Ending.FAILED),
    ("a person's scancel", ended(code=143, by="Slurm job 7 was cancelled with scancel"), Ending.CANCELLED_OUTSIDE),
    ("a person's scancel after the ranks finished", ended(code=0, by="Slurm job 7 ended CANCELLED"), Ending.SUCCEEDED),
    ("a failure while pausing", ended(RunStatus.PAUSING, code=1), Ending.FAILED_WHILE_PAUSING),
    ("a failure while cancelling", ended(RunStatus.CANCELLING, code=1), Ending.FAILED_WHILE_CANCELLING),
    ("a failure", ended(code=1), Ending.FAILED),
    ("a launcher that vanished", ended(code=None, exited=False), Ending.FAILED),
]


@pytest.mark.parametrize(("name", "facts", "expected"), ENDING_ROWS, ids=[row[0] for row in ENDING_ROWS])
def test_how_an_ended_attempt_ends_its_run(name: str, facts: Ended, expected: Ending) -> None:
    assert ending(facts) is expected


def test_every_ending_has_a_rule_and_is_applied() -> None:
    assert [e for e, _ in ENDINGS] == list(Ending)  # the table in the enum's order, each once
    assert set(APPLIERS) == set(Ending)
    assert {row[2] for row in ENDING_ROWS} == set(Ending)  # and every one has a row above
