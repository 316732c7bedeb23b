"""The Runs table as an analysis tool (app/charts/runs_analysis.py): a filter on the runs' numbers
read from what a person types (every wrong clause said, with the fields there are), and the runs
grouped by a config value or a tag, each group with its count and best loss."""

from __future__ import annotations

import math
from typing import Any

import pytest

from app.charts.runs_analysis import (
    BY_TAG,
    NO_GROUPING,
    NOT_SET,
    Clause,
    FilterError,
    filtered,
    group_keys,
    grouped,
    parse_filter,
    unread_note,
)


def run(run_id: int, best_loss: float | None = None, tags: tuple[str, ...] = (), **summary: Any) -> dict[str, Any]:
    return {"id": run_id, "name": f"r{run_id}", "best_loss": best_loss, "tags": list(tags), "step": 0,
            "progress": None, "elapsed_s": 0.0, "cost_usd": 0.0, "cost": {"yours": {"usd": None}},
            "headline_value": None, "attempt_count": 1, **summary}


def ids(runs: Any) -> list[int]:
    return [r["id"] for r in runs]


def test_a_filter_reads_fields_comparisons_and_units() -> None:
    assert parse_filter("best loss < 0.01") == [Clause("best loss", "<", 0.01)]
    assert parse_filter("  ") == []
    assert parse_filter("best_loss<=1e-3, steps >= 1,000 and cost < $2.5") == [
        Clause("best loss", "<=", 0.001), Clause("steps", ">=", 1000.0), Clause("cost", "<", 2.5)]
    assert parse_filter("Duration > 2h, progress >= 50%, elapsed < 90") == [
        Clause("duration", ">", 7200.0), Clause("progress", ">=", 50.0), Clause("duration", "<", 90.0)]
    assert parse_filter("loss = 0.5") == [Clause("best loss", "=", 0.5)]
    assert str(Clause("best loss", "<", 0.01)) == "best loss < 0.01"


def test_a_bad_filter_says_every_wrong_clause_and_the_fields() -> None:
    with pytest.raises(FilterError) as caught:
        parse_filter("best los < 0.01, steps > many, loss 0.5, cost < ")
    said = str(caught.value)
    assert "“best los” is no field to filter on" in said
    assert "“steps > many”: “many” is not a number" in said
    assert "“loss 0.5” is not a comparison" in said and "best loss < 0.01" in said
    assert "“cost <”: nothing is not a number (a cost in dollars: cost < 1.5)" in said
    assert said.endswith("The fields: best loss, headline, steps, progress, duration, cost, your cost, "
                         "projected, attempts.")
    with pytest.raises(FilterError, match="“nan” is not a number"):
        parse_filter("best loss < nan")


def test_a_filter_keeps_the_runs_that_match_every_clause_and_none_without_the_value() -> None:
    runs = [run(1, 0.005, step=2000), run(2, 0.5, step=3000), run(3, None, step=5000),
            run(4, math.nan, step=4000), run(5, 0.001, step=10, progress=0.5, cost={"yours": {"usd": 1.0}})]
    assert ids(filtered(runs, parse_filter("best loss < 0.01"))) == [1, 5]
    assert ids(filtered(runs, parse_filter("best loss < 0.01, steps >= 1000"))) == [1]
    assert ids(filtered(runs, parse_filter("steps > 2500"))) == [2, 3, 4]
    assert ids(filtered(runs, parse_filter("progress >= 50%"))) == [5]  # a fraction, compared in percent
    assert ids(filtered(runs, parse_filter("your cost > 0.5"))) == [5]
    assert ids(filtered(runs, [])) == [1, 2, 3, 4, 5]


def test_groups_by_a_config_value_in_order_with_counts_and_best_loss() -> None:
    runs = [run(1, 0.3), run(2, 0.1), run(3, 0.2), run(4, None), run(5, 0.05)]
    configs = {1: {"train.lr": 0.01}, 2: {"train.lr": 0.001}, 3: {"train.lr": 0.01}, 4: {"train.lr": 0.0001},
               5: {}}
    groups = grouped(runs, configs, "train.lr")
    assert [(g.label, ids(g.runs), g.best_loss) for g in groups] == [
        ("0.0001", [4], None), ("0.001", [2], 0.1), ("0.01", [1, 3], 0.2), (NOT_SET, [5], 0.05)]
    texts = grouped(runs[:3], {1: {"workload.kind": "script"}, 2: {"workload.kind": "mlp-digits"},
                               3: {"workload.kind": "gpt-char"}}, "workload.kind")
    assert [g.label for g in texts] == ["gpt-char", "mlp-digits", "script"]
    assert [(g.label, ids(g.runs)) for g in grouped(runs, configs, NO_GROUPING)] == [("all runs", [1, 2, 3, 4, 5])]


def test_groups_by_tag_put_a_run_under_each_of_its_tags() -> None:
    runs = [run(1, tags=("a", "b")), run(2, tags=("b",)), run(3)]
    assert [(g.label, ids(g.runs)) for g in grouped(runs, {}, BY_TAG)] == [
        ("a", [1]), ("b", [1, 2]), (NOT_SET, [3])]


def test_the_keys_to_group_by_put_the_ones_that_differ_first() -> None:
    configs = [{"name": "x", "train.lr": 0.1, "train.steps": 5, "workload.kind": "mlp-digits", "tags": ["a"]},
               {"name": "y", "train.lr": 0.01, "train.steps": 5, "workload.kind": "mlp-digits"}]
    assert group_keys(configs) == ["train.lr", "train.steps", "workload.kind"]
    assert group_keys([*configs, {"launch.nproc_per_node": 2}]) == [
        "launch.nproc_per_node", "train.lr", "train.steps", "workload.kind"]


def test_a_comma_in_a_number_is_read_between_thousands_only_else_said() -> None:
    """Issue 56 review: "0,010" was read as 10 (every run matched), "0.5,100" as 0.51, "0,01" as
    a clause "01"; a decimal comma is said to be no number, naming what was typed."""
    assert parse_filter("steps >= 1,000") == [Clause("steps", ">=", 1000.0)]
    assert parse_filter("steps >= 12,345.5, cost < $1,200") == [Clause("steps", ">=", 12345.5),
                                                                Clause("cost", "<", 1200.0)]
    for typed, said in (("best loss < 0,010", "0,010"), ("best loss < 0.5,100", "0.5,100"),
                        ("best loss < 0,01", "0,01"), ("cost < $1,5", "$1,5"), ("steps > 1,00", "1,00")):
        with pytest.raises(FilterError) as caught:
            parse_filter(typed)
        assert f"“{typed}”: “{said}” is not a number" in str(caught.value), (typed, str(caught.value))
    # A comma still joins two clauses where a field's name follows it.
    assert parse_filter("best loss < 0.5,steps > 1") == [Clause("best loss", "<", 0.5), Clause("steps", ">", 1.0)]


def test_a_clause_is_echoed_as_typed_not_in_other_units() -> None:
    clauses = parse_filter("duration > 2h, steps > 1e7, progress >= 50 %, cost < $ 1.5, loss == 0.5, steps > 1,000")
    assert [c.value for c in clauses] == [7200.0, 1e7, 50.0, 1.5, 0.5, 1000.0]
    assert [str(c) for c in clauses] == ["duration > 2h", "steps > 1e7", "progress >= 50%", "cost < $1.5",
                                         "best loss = 0.5", "steps > 1,000"]


def test_groups_are_by_the_exact_value_shown_readably() -> None:
    """Values that agree to six significant digits were one group under one label (``:g``)."""
    runs = [run(1, 0.3), run(2, 0.1), run(3, 0.2)]
    configs = {1: {"train.lr": 1e-7}, 2: {"train.lr": 1.0000001e-7}, 3: {"train.lr": 1e-7}}
    assert [(g.label, ids(g.runs)) for g in grouped(runs, configs, "train.lr")] == [
        ("1e-07", [1, 3]), ("1.0000001e-07", [2])]
    assert [g.label for g in grouped(runs, {1: {"x": 0.001}, 2: {"x": 123456789.0}, 3: {"x": True}}, "x")] == [
        "0.001", "123456789.0", "true"]


def test_the_filter_and_groups_say_when_older_runs_were_not_read() -> None:
    assert unread_note(120, 200) == ""
    assert unread_note(200, 200) == (" The filter and the groups see only these 200 newest runs that match: older "
                                     "ones are not read (narrow the search, the statuses or the tags to reach them).")
