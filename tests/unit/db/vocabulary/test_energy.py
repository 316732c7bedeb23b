"""Energy's arithmetic and words (db/vocabulary/energy.py): one device's readings added up through
a driver reload, a wrap, power x time and its gaps; an attempt's and a run's energy in the words
a person reads."""

from __future__ import annotations

import pytest

from db.vocabulary.energy import (
    BRIDGE_S,
    JOULES_PER_KWH,
    Method,
    Reading,
    Tally,
    advance,
    energy_of,
    run_energy,
    weakest,
)

T0 = 1_000_000.0


def counted(readings: list[tuple[float, Reading]], started_at: float | None = None) -> Tally:
    tally: Tally | None = None
    for at, reading in readings:
        tally = advance(tally, reading, at, started_at)
    assert tally is not None
    return tally


def counter(value: float, wrap: float | None = None, share: float = 1.0) -> Reading:
    return Reading("gpu0", Method.MEASURED, value, wrap, share)


def power(watts: float) -> Reading:
    return Reading("gpu0", Method.ESTIMATED, watts)


def test_a_counter_counts_what_it_moved_and_its_new_value_after_a_driver_reload() -> None:
    tally = counted([(T0, counter(1000.0)), (T0 + 2, counter(1500.0)), (T0 + 4, counter(30.0)),
                     (T0 + 6, counter(80.0))])
    assert tally.joules == pytest.approx(500 + 30 + 50)
    assert tally.method is Method.MEASURED and tally.counter == 80.0


def test_a_wrapping_counter_adds_its_range_and_counts_only_the_share_held() -> None:
    tally = counted([(T0, counter(900.0, wrap=1000.0, share=0.5)), (T0 + 2, counter(100.0, wrap=1000.0, share=0.5))])
    assert tally.joules == pytest.approx(100.0)  # 200 J moved, half the slots held


def test_power_times_time_bridges_close_readings_and_says_which_seconds_it_could_not_cover() -> None:
    tally = counted([(T0, power(100.0)), (T0 + 2, power(300.0)), (T0 + 2 + BRIDGE_S + 30, power(300.0)),
                     (T0 + 2 + BRIDGE_S + 31, power(100.0))])
    assert tally.joules == pytest.approx(400 + 200)  # the gap is not bridged with a guess
    assert tally.uncovered_s == pytest.approx(BRIDGE_S + 30)
    assert "(40 s not covered: no reading spanned them)" in energy_of([tally])["source"]


def test_a_first_reading_long_after_the_start_says_what_it_missed_and_a_failed_one_keeps_the_tally() -> None:
    tally = counted([(T0 + 60, counter(10.0)), (T0 + 62, Reading("gpu0", Method.NOT_MEASURED)),
                     (T0 + 64, counter(40.0))], started_at=T0)
    assert tally.joules == pytest.approx(30.0)
    assert tally.uncovered_s == pytest.approx(60.0)


def test_the_weakest_method_wins() -> None:
    assert weakest(["measured", "estimated"]) is Method.ESTIMATED
    assert weakest([Method.MEASURED, Method.NOT_MEASURED, Method.ESTIMATED]) is Method.NOT_MEASURED
    assert weakest([]) is Method.NOT_MEASURED


def test_an_attempts_energy_names_its_gpus_and_a_runs_names_its_attempts_when_they_differ() -> None:
    two = [Tally(f"gpu{i}", Method.MEASURED, 1.8e6, 0.0, T0) for i in (1, 0)]
    three = [Tally(f"gpu{i}", Method.MEASURED, 0.0, 0.0, T0) for i in (2, 0, 1)]
    assert energy_of(two) == {"kwh": pytest.approx(1.0), "method": "measured",
                              "source": "NVML energy counter, GPUs 0 and 1"}
    assert energy_of(three)["source"] == "NVML energy counter, GPUs 0, 1 and 2"
    estimated = energy_of([Tally("gpu0", Method.ESTIMATED, JOULES_PER_KWH / 2, 250.0, T0)])
    unread = energy_of([])
    assert unread == {"kwh": None, "method": "not measured",
                      "source": "not read (the attempt ran before runyard read energy)"}

    run = run_energy([(1, energy_of(two)), (2, estimated), (3, energy_of(two)), (4, unread)])
    assert run["kwh"] == pytest.approx(2.5)
    assert run["method"] == "not measured"
    assert run["source"] == ("attempts 1 and 3: NVML energy counter, GPUs 0 and 1; attempt 2: NVML power x time, "
                             "GPU 0; attempt 4: not read (the attempt ran before runyard read energy)")
    assert run_energy([(1, estimated), (2, estimated)]) == {**estimated, "kwh": pytest.approx(1.0)}


def test_rapl_readings_too_far_apart_to_tell_its_wraps_are_not_covered_rather_than_one_wrap() -> None:
    """A package's 262 kJ range wraps in about 9 minutes at 500 W: readings an hour apart (the
    scheduler down) may have seen several wraps, so the hour is not counted as one."""
    wrap = 262_143.0
    tally = counted([(T0, counter(200_000.0, wrap=wrap)), (T0 + 2, counter(200_300.0, wrap=wrap)),
                     (T0 + 3602, counter(10_000.0, wrap=wrap)), (T0 + 3604, counter(10_300.0, wrap=wrap))])
    assert tally.joules == pytest.approx(300 + 300)
    assert tally.uncovered_s == pytest.approx(3600)
    assert "(3600 s not covered: no reading spanned them)" in energy_of([tally])["source"]
