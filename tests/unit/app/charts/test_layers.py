"""Which layers a metric chart draws (app/charts/layers.py's table): a decision over plain values,
one row a case, no chart built. The layers themselves, drawn, are tests/unit/app/charts/test_metric.py's."""

from __future__ import annotations

import pytest

from app.charts.layers import BUILDERS, LAYER_RULES, Drawn, Layer, layers

BAND, FAINT, LINES, SMOOTHED, PICKED = Layer.BAND, Layer.FAINT_RANKS, Layer.LINES, Layer.SMOOTHED, Layer.PICKED
SUPERSEDED, NANS, CURSOR, HOVER = Layer.SUPERSEDED, Layer.NAN_RULES, Layer.CURSOR, Layer.HOVER


def drawn(mean: bool = False, bucketed: bool = False, smoothing: bool = False, isolated: bool = False,
          superseded: bool = False, nans: bool = False, ranks: bool = True, cursor: bool = False) -> Drawn:
    return Drawn(mean, bucketed, smoothing, isolated, superseded, nans, ranks, cursor)


ROWS = [
    # (the chart, what decides its layers, its layers in drawing order)
    ("raw per-rank lines", drawn(), [LINES, HOVER]),
    ("no row at all: the lines alone", drawn(ranks=False), [LINES]),
    ("bucketed rows keep their spikes in a band", drawn(bucketed=True), [BAND, LINES, HOVER]),
    ("the rank mean always has its band", drawn(mean=True), [BAND, LINES, HOVER]),
    ("smoothing draws the EMA over the faint values", drawn(smoothing=True), [LINES, SMOOTHED, HOVER]),
    ("isolated ranks strong, the others faint", drawn(isolated=True), [FAINT, LINES, HOVER]),
    ("isolated ranks over the mean", drawn(mean=True, isolated=True), [BAND, LINES, PICKED, HOVER]),
    ("superseded steps shown", drawn(superseded=True), [LINES, SUPERSEDED, HOVER]),
    ("a NaN step", drawn(nans=True), [LINES, NANS, HOVER]),
    ("a marked step", drawn(cursor=True), [LINES, CURSOR, HOVER]),
    ("a marked step with no row to read out", drawn(cursor=True, ranks=False), [LINES]),
    ("everything at once", drawn(True, True, True, True, True, True, True, True),
     [BAND, LINES, SMOOTHED, PICKED, SUPERSEDED, NANS, CURSOR, HOVER]),
]


@pytest.mark.parametrize(("name", "facts", "expected"), ROWS, ids=[row[0] for row in ROWS])
def test_the_layers_of_a_metric_chart(name: str, facts: Drawn, expected: list[Layer]) -> None:
    assert layers(facts) == expected


def test_every_layer_has_a_rule_and_a_builder() -> None:
    assert [layer for layer, _ in LAYER_RULES] == list(Layer)  # drawing order is the enum's
    assert set(BUILDERS) == set(Layer)
    assert {layer for row in ROWS for layer in row[2]} == set(Layer)
