"""The evidence an ended attempt's folder holds (orchestrator/scheduler/diagnosis.py): a rank that
dies by a signal after every rank finished its work is not a failure, any other death is; and
the agent's note of the moment it first saw a rank fail.
"""

from __future__ import annotations

import json
from pathlib import Path

from db.models import Attempt
from db.vocabulary.config import RunConfig, parse_config
from orchestrator.executors.logs import launcher_log
from orchestrator.scheduler.diagnosis import died_after_finishing, first_failure_at
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
               stop_reason: str | None = None) -> tuple[Attempt, RunConfig]:
    attempt_dir = tmp_path / "attempts" / "1"
    attempt_dir.mkdir(parents=True)
    launcher_log(attempt_dir).write_text(
        SUMMARY.format(others="  <NO_OTHER_FAILURES>", code=code, error_file=error_file))
    for rank in finished:
        write_finished(attempt_dir, rank, 40)
    config = parse_config({"launch": {"nproc_per_node": 2}})
    return Attempt(dir=str(attempt_dir), stop_reason=stop_reason), config  # as it ended: no row needed


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


RANK_MARKS = {"spawned": 205.0, "imported": 207.5, "joined": 207.75, "data": 208.5, "checkpoint": 208.75}


def test_the_agent_note_of_the_failure(tmp_path: Path) -> None:
    assert first_failure_at(tmp_path) is None
    (tmp_path / "failure.json").write_text(json.dumps({"at": 123.5, "local_ranks": {"1": -9}}))
    assert first_failure_at(tmp_path) == 123.5
    (tmp_path / "failure.json").write_text("{")  # being written: the exit time serves
    assert first_failure_at(tmp_path) is None
