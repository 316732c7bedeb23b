"""The Run page's panels (app/run_panels.py): the Attempts table's cells say what happened in
words, never "None" (issue 56, item 2)."""

from __future__ import annotations

from typing import Any

from app.run_panels import attempt_row


def attempt(**fields: Any) -> dict[str, Any]:
    base = {"number": 1, "status": "RUNNING", "cause": None, "failed_rank": None, "exception": None,
            "resume_step": None, "last_step": None, "steps_lost": None, "exit_code": None, "started_at": 1000.0,
            "first_step_at": None, "ended_at": None, "retry_counted": None, "overrides": {}}
    return {**base, **fields}


def test_a_running_attempt_has_no_none_in_its_row() -> None:
    row = attempt_row(attempt())
    assert "None" not in " ".join(map(str, row.values()))
    assert (row["exit"], row["cause"], row["rank"], row["from step"], row["retry counted"], row["changes"]) == (
        "still running", "–", "–", 0, "–", "–")


def test_a_failed_attempt_says_its_cause_rank_exit_and_changes() -> None:
    row = attempt_row(attempt(status="FAILED", cause="OOM", failed_rank=1, exit_code=-9, steps_lost=5,
                              retry_counted=True, overrides={"train": {"batch_size": 32}}, ended_at=1100.0))
    assert (row["exit"], row["cause"], row["rank"], row["steps lost"], row["retry counted"], row["changes"]) == (
        "exit -9 (SIGKILL)", "OOM", "1", "5", "yes", "batch_size=32")
    assert attempt_row(attempt(status="CRASHED", cause="UNKNOWN", retry_counted=False))["exit"] == (
        "no exit code (killed or vanished)")
