"""When a queued run starts (db/vocabulary/queue_forecast.py): admission walked forward, first
come first served; a run ahead past its predicted end pushed later; a run ahead of unknown length
named rather than guessed; a run needing more devices than are free waits for enough of them."""

from __future__ import annotations

from db.vocabulary.queue_forecast import OVERRUN_MIN_S, Holder, Waiting, corrected_end, forecast, queue_end

NOW = 100_000.0


def test_a_run_behind_one_running_run_starts_when_it_ends_and_the_next_after_that() -> None:
    # Two CPU slots, both held by run 1 (ends in 10 min); runs 2 and 3 need both, 20 min each.
    starts = forecast([Holder(1, 2, NOW + 600)], [Waiting(2, 2, 1200.0), Waiting(3, 2, 1200.0)], 2, NOW)
    assert (starts[2].at, starts[2].after_run) == (NOW + 600, 1)
    assert (starts[3].at, starts[3].after_run) == (NOW + 1800, 2)
    assert starts[2].basis == "after run 1 ends, by that run's predicted end"
    assert queue_end(starts) == (NOW + 3000, None)


def test_a_run_needing_more_gpus_than_are_free_waits_for_enough_of_them_and_is_not_overtaken() -> None:
    # 4 GPUs: run 1 holds 2 until +5 min, run 2 holds 1 until +30 min; 1 GPU is free.
    holders = [Holder(1, 2, NOW + 300), Holder(2, 1, NOW + 1800)]
    starts = forecast(holders, [Waiting(3, 2, 600.0), Waiting(4, 1, 60.0)], 4, NOW)
    # Run 3 needs 2: 1 free now, 3 once run 1 ends. Run 4 would fit now, but none overtakes.
    assert (starts[3].at, starts[3].after_run) == (NOW + 300, 1)
    assert (starts[4].at, starts[4].after_run) == (NOW + 300, 1)
    # A third one needing all 4 waits for run 2 (the last to let go).
    four = forecast(holders, [Waiting(3, 2, 600.0), Waiting(5, 4, 60.0)], 4, NOW)
    assert (four[5].at, four[5].after_run) == (NOW + 1800, 2)


def test_a_run_ahead_past_its_prediction_is_pushed_to_its_band_then_to_a_share_of_its_time() -> None:
    late = Holder(1, 1, NOW - 60, ends_at_high=NOW + 120, started_at=NOW - 3600)
    assert corrected_end(late, NOW) == NOW + 120
    past_band = Holder(1, 1, NOW - 60, ends_at_high=NOW - 10, started_at=NOW - 3600)
    assert corrected_end(past_band, NOW) == NOW + 360  # a tenth of the hour it has run
    assert corrected_end(Holder(1, 1, NOW - 60, started_at=NOW - 30), NOW) == NOW + OVERRUN_MIN_S
    starts = forecast([past_band], [Waiting(2, 1, 60.0)], 1, NOW)
    assert starts[2].at == NOW + 360 and starts[2].at > NOW
    assert starts[2].basis == "after run 1, which has outlived its predicted end (its end is pushed later)"


def test_a_run_of_unknown_length_ahead_is_named_for_everyone_behind_it() -> None:
    starts = forecast([Holder(1, 1, None)], [Waiting(2, 1, 60.0), Waiting(3, 1, 60.0)], 1, NOW)
    for run_id in (2, 3):
        assert (starts[run_id].at, starts[run_id].after_run) == (None, 1)
        assert starts[run_id].basis == "after run 1, whose length is not known"
    # A queued run of unknown length makes the ones behind it wait on it, not on a made-up time.
    behind = forecast([Holder(1, 1, NOW + 60)], [Waiting(2, 1, None), Waiting(3, 1, 60.0)], 1, NOW)
    assert (behind[2].at, behind[2].after_run) == (NOW + 60, 1)
    assert (behind[3].at, behind[3].after_run) == (None, 2)
    assert queue_end(behind) == (None, 2)


def test_a_run_that_can_never_fit_says_so_and_the_runs_behind_it_wait_on_it() -> None:
    starts = forecast([Holder(1, 1, NOW + 60)], [Waiting(2, 8, 60.0), Waiting(3, 1, 60.0)], 2, NOW)
    assert starts[2].at is None and starts[2].basis.startswith("never here: it needs 8 devices and this machine has 2")
    # Admission lets no run overtake it, so run 3 waits until someone cancels run 2.
    assert (starts[3].at, starts[3].after_run) == (None, 2)
    assert "can never start here" in starts[3].basis


def test_a_free_device_starts_the_head_of_the_queue_now() -> None:
    starts = forecast([Holder(1, 1, NOW + 60)], [Waiting(2, 1, 60.0)], 2, NOW)
    assert (starts[2].at, starts[2].after_run) == (NOW, None)
    assert starts[2].basis == "its devices are free: the scheduler starts it at its next look"
