"""When a run ends (db/vocabulary/eta.py): the basis it names, the band that widens with the share of
the run still to do, and the restart a run waiting to retry (or pausing) is about to pay: its own
measured restarts, else the machine's median, plus the steps it will redo."""

from __future__ import annotations

import pytest

from db.vocabulary.eta import forecast, restart_ahead


def steady(first: int, last: int, every: int = 10, step_s: float = 0.1, t0: float = 1000.0) -> list[tuple[int, float]]:
    """(step, wall time) points at a steady 1/step_s steps a second."""
    return [(s, t0 + s * step_s) for s in range(first, last + 1, every)]


def test_the_basis_names_the_steps_and_time_the_pace_comes_from() -> None:
    f = forecast(steady(10, 1000), 2000)
    assert f is not None
    assert f.seconds == pytest.approx(100.0)  # 1000 steps left at 10 steps/s
    # The newest 60 points: steps 410..1000, 59 s.
    assert f.basis == ("from the last 590 steps' pace over 59 s (10 steps/s), evaluation and checkpoint "
                       "pauses included")
    assert f.low <= f.seconds <= f.high


def test_no_forecast_without_two_points_of_progress() -> None:
    assert forecast([], 100) is None
    assert forecast([(5, 1.0), (5, 2.0)], 100) is None


def test_the_band_widens_with_the_share_still_to_do() -> None:
    """At the same steady pace, a run 10% done gets a wider band (as a share of the time left) than
    one 90% done: it extrapolates its pace over many more steps than it measured."""
    early = forecast(steady(10, 1000), 10_000)  # 10% done, 9000 steps left
    late = forecast(steady(10, 9000), 10_000)  # 90% done, 1000 steps left
    assert early is not None and late is not None
    early_width = (early.high - early.low) / early.seconds
    late_width = (late.high - late.low) / late.seconds
    assert early_width > late_width > 0
    # A steady pace alone (no spread between the window's parts) still gets a band.
    assert late.low < late.seconds < late.high


def test_a_retrying_run_includes_its_own_restart_and_the_steps_it_redoes() -> None:
    """Failed at step 1000 after a checkpoint at 800; its earlier restart took 6 s from launch to
    first step; 10 s of backoff are left."""
    restart = restart_ahead("RETRYING", [(1, 4.0), (2, 6.0)], retry_at=110.0, now=100.0,
                            machine_startups=[30.0, 40.0], resume_step=800)
    assert restart is not None and restart.startup_s == 6.0 and restart.backoff_s == 10.0
    f = forecast(steady(10, 1000), 2000, restart)
    assert f is not None
    # 10 s backoff + 6 s start-up + 1200 steps from the checkpoint at 10 steps/s.
    assert f.seconds == pytest.approx(10 + 6 + 120)
    assert "includes a restart of ~36 s" in f.basis  # 10 + 6 + 200 steps redone at 10 steps/s
    assert "10 s of backoff left" in f.basis and "(this run's own last restart)" in f.basis
    assert "200 steps to redo from the checkpoint at step 800" in f.basis
    assert f.low <= f.seconds <= f.high


def test_a_run_that_never_restarted_uses_the_machines_median() -> None:
    restart = restart_ahead("RETRYING", [(1, 4.0)], retry_at=100.0, now=105.0,
                            machine_startups=[20.0, 30.0, 90.0], resume_step=None)
    assert restart is not None
    assert restart.startup_s == 30.0 and restart.backoff_s == 0.0 and restart.resume_step == 0
    f = forecast(steady(10, 1000), 2000, restart)
    assert f is not None
    assert f.seconds == pytest.approx(30 + 200)  # from scratch: all 2000 steps again
    assert "(the machine's median over 3 recent restart(s))" in f.basis
    assert "backoff" not in f.basis and "1,000 steps to redo from scratch (no checkpoint)" in f.basis


def test_without_any_restart_measured_the_runs_first_start_up_stands_in() -> None:
    restart = restart_ahead("RETRYING", [(1, 4.0)], retry_at=None, now=0.0, machine_startups=[], resume_step=900)
    assert restart is not None and restart.startup_s == 4.0 and restart.startup_source == "this run's first start-up"
    assert restart_ahead("RETRYING", [], retry_at=None, now=0.0, machine_startups=[], resume_step=None) is None


def test_a_pausing_run_says_its_restart_holds_if_resumed_at_once() -> None:
    restart = restart_ahead("PAUSING", [(1, 4.0), (2, 5.0), (3, 7.0)], retry_at=None, now=0.0,
                            machine_startups=[], resume_step=200)
    assert restart is not None
    f = forecast(steady(10, 1000), 2000, restart)
    assert f is not None
    assert f.seconds == pytest.approx(6.0 + 100)  # the median of its own restarts; the pause saves its step
    assert "if resumed at once, it includes a restart of ~6 s" in f.basis and "redo" not in f.basis


def test_a_running_run_pays_no_restart() -> None:
    assert restart_ahead("RUNNING", [(1, 4.0), (2, 5.0)], retry_at=None, now=0.0, machine_startups=[5.0],
                         resume_step=100) is None
