"""Every retry timed by phase (db/vocabulary/phases.py; issue 32): from the agent's note of the
failure and the marks rank 0 wrote, the phases `runyard show` and the Run page read.
"""

from __future__ import annotations

from db.vocabulary.phases import attempt_phases, recovery_s
from orchestrator.format import phases_text

RANK_MARKS = {"spawned": 205.0, "imported": 207.5, "joined": 207.75, "data": 208.5, "checkpoint": 208.75}

FAILED = {"cause": "SIGNAL", "failed_at": 198.0, "ended_at": 199.0, "detected_at": 199.5}

RETRY = {"started_at": 200.0, "first_step_at": 209.0, "phase_marks": RANK_MARKS}


def test_a_recovery_is_timed_from_the_failure_to_the_first_step_phase_by_phase() -> None:
    phases = attempt_phases(RETRY, FAILED)
    assert phases is not None
    assert [(p["phase"], p["seconds"]) for p in phases] == [
        ("teardown", 1.0), ("detect", 0.5), ("relaunch", 0.5), ("launch", 5.0), ("import", 2.5),
        ("rendezvous", 0.25), ("data", 0.75), ("checkpoint", 0.25), ("first_step", 0.25)]
    assert sum(p["seconds"] for p in phases) == recovery_s(RETRY, FAILED) == 11.0
    assert phases_text(phases) == ("teardown 1.0s · detect 0.5s · relaunch 0.5s · launch 5.0s · import 2.5s · "
                                   "rendezvous 0.2s · data 0.8s · checkpoint 0.2s · first_step 0.2s = 11.0s")


def test_a_first_attempt_or_one_after_a_pause_has_only_its_start_up() -> None:
    fresh = attempt_phases(RETRY, None)
    assert fresh is not None
    assert [p["phase"] for p in fresh] == ["launch", "import", "rendezvous", "data", "checkpoint", "first_step"]
    assert sum(p["seconds"] for p in fresh) == 9.0
    paused = {**FAILED, "cause": None}
    assert attempt_phases(RETRY, paused) == fresh
    assert recovery_s(RETRY, paused) is None


def test_a_missing_mark_counts_in_the_next_phase_and_none_is_negative() -> None:
    # A script that never calls load_checkpoint: no data or checkpoint mark; a clock read on
    # another host put "joined" before "imported".
    marks = {"spawned": 205.0, "imported": 207.5, "joined": 207.0}
    phases = attempt_phases({**RETRY, "phase_marks": marks}, FAILED)
    assert phases is not None
    assert [p["phase"] for p in phases][-2:] == ["rendezvous", "first_step"]
    assert all(p["seconds"] >= 0 for p in phases)
    assert sum(p["seconds"] for p in phases) == 11.0
    # Before any mark of its own, an attempt has no phases (its launch is still under way).
    assert attempt_phases({**RETRY, "phase_marks": {}, "first_step_at": None}, FAILED) is None
