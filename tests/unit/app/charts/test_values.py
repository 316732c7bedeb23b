"""What the Runs page's analysis tools and the charts agree on (app/charts/values.py): which
values are numbers, a config value as text, and when numbers go on a log axis."""

from __future__ import annotations

import math

from app.charts.values import is_number, spans_decades, value_text


def test_a_number_is_finite_and_not_a_bool() -> None:
    assert [is_number(v) for v in (0, 1.5, -2, True, None, math.nan, math.inf, "1")] == [
        True, True, True, False, False, False, False, False]


def test_a_config_value_reads_exactly() -> None:
    assert [value_text(v) for v in (0.001, 1e-7, 1.0000001e-7, True, [1, 0.5], "cosine", 3)] == [
        "0.001", "1e-07", "1.0000001e-07", "true", "[1, 0.5]", "cosine", "3"]


def test_a_log_axis_takes_more_than_two_decades_of_positive_numbers() -> None:
    assert spans_decades([10.0, 0.01]) and not spans_decades([1.0, 0.01])
    assert not spans_decades([100.0, 0.0, -5.0, math.nan, 1.0]) and not spans_decades([5.0])
    assert spans_decades([10.0, 0.09], decades=2.0)
