"""What a live chart's refresh sends (app/charts/live.py): the whole chart first, then only the
rows the browser does not hold: new buckets appended, a grown last bucket replaced; a new level,
a new attempt or another spec sends everything again. Built from the Run page's own chart
(app/charts/metric.py's metric_view), as the page sends it."""

from __future__ import annotations

import json
from typing import Any

from app.charts import live
from app.charts import metric as charts
from app.server import assets

OPTIONS = charts.ChartOptions(ranks=charts.PER_RANK)


def bucket(rank: int, step: int, count: int = 1, attempt: int = 1, width: int = 1) -> dict[str, Any]:
    value = 3.0 / step + 0.1 * rank + 0.01 * count
    return {"attempt": attempt, "rank": rank, "step": step, "last_step": step + count - 1, "count": count,
            "value": value, "min": value, "max": value, "nan": 0, "wall_time": 1000.0 + step * width}


def spec(rows: list[dict[str, Any]], options: charts.ChartOptions = OPTIONS) -> Any:
    """The Run page's chart of ``rows`` (as app/chart_widgets.py hands it to ``live.refresh``)."""
    return charts.metric_view(rows, {}, options, "loss", 900.0, bucketed=True)


def steps_sent(update: live.Update) -> set[tuple[str, int]]:
    """The (rank, step) of every per-rank row the update inserts (the lines' dataset)."""
    return {(r["rank"], r["step"]) for d in range(len(update.inserts)) for r in update.rows(d)
            if "rank" in r and "step" in r}


def held(drawn: live.Drawn) -> int:
    return sum(len(ids) for ids in drawn.ids)


def test_the_same_chart_gives_the_same_spec_whatever_altair_named_it() -> None:
    rows = [bucket(r, s) for r in range(2) for s in range(1, 40)]
    a, b = live.split(spec(rows)), live.split(spec(rows))
    assert a[0] == b[0]  # Altair's view names differ per build; the split spec does not
    assert sorted(a[0]["datasets"]) == [f"d{i}" for i in range(len(a[1]))]
    assert all(not rows for rows in a[0]["datasets"].values())  # no data in the spec
    assert "view_" not in json.dumps(a[0])
    # The rows are the ones Altair itself would send (NaN as null), read from the frames directly.
    sent_by_altair = spec(rows).to_dict(validate=False)["datasets"].values()
    assert {frozenset(tuple(r.values()) for r in d) for d in sent_by_altair} == {frozenset(rows) for _, rows in a[1]}


def test_first_refresh_sends_everything_then_only_new_buckets() -> None:
    rows = [bucket(r, s) for r in range(8) for s in range(1, 601)]  # Altair's 5,000-row limit per dataset
    first, drawn = live.refresh(None, spec(rows), "0/1")
    assert first.full and first.base is None
    assert first.rows_sent == held(drawn) >= 8 * 600
    grown = rows + [bucket(r, s) for r in range(8) for s in range(601, 604)]
    second, drawn2 = live.refresh(drawn, spec(grown), "0/1")
    assert not second.full and second.base == first.seq and second.seq == first.seq + 1
    assert steps_sent(second) == {(str(r), s) for r in range(8) for s in range(601, 604)}
    assert sum(map(len, second.removes)) == 0  # nothing drawn before changed
    assert len(json.dumps(second.message())) < len(json.dumps(first.message())) / 50
    chart = spec(grown)
    assert live.split(chart)[1] == live.split(chart)[1]  # the chart is left as it was (its frames in it)
    assert held(drawn2) == held(drawn) + second.rows_sent


def test_a_grown_last_bucket_replaces_the_one_drawn() -> None:
    rows = [bucket(r, s * 10, count=10, width=10) for r in range(2) for s in range(1, 200)]
    _, drawn = live.refresh(None, spec(rows), "1/1")
    grown = [dict(b) for b in rows]
    for b in grown:
        if b["step"] == 1990:  # the last bucket of each rank took three more points
            b.update(bucket(b["rank"], 1990, count=13, width=10))
    update, after = live.refresh(drawn, spec(grown), "1/1")
    assert not update.full
    assert steps_sent(update) == {("0", 1990), ("1", 1990)}
    line = next(d for d in range(len(update.inserts))
                if any(r.get("step") == 1990 and "rank" in r for r in update.rows(d)))
    replaced = set(update.removes[line])
    assert len(replaced) == 2 and replaced <= set(drawn.ids[line].values())  # the two drawn last buckets
    assert held(after) == held(drawn)  # replaced, not added


def test_an_unchanged_chart_sends_nothing() -> None:
    rows = [bucket(r, s) for r in range(2) for s in range(1, 300)]
    _, drawn = live.refresh(None, spec(rows), "0/1")
    update, _ = live.refresh(drawn, spec(rows), "0/1")
    assert not update.full and update.rows_sent == 0 and not any(update.removes)


def test_a_new_level_or_attempt_or_spec_sends_the_whole_chart() -> None:
    rows = [bucket(r, s) for r in range(2) for s in range(1, 300)]
    _, drawn = live.refresh(None, spec(rows), "0/1")
    more = [*rows, bucket(0, 300)]
    level, _ = live.refresh(drawn, spec(more), "1/1")  # the store rolled the series up a level
    assert level.full and level.rows_sent > 500
    attempt, _ = live.refresh(drawn, spec(more), "0/2")  # a new attempt began
    assert attempt.full
    mean, _ = live.refresh(drawn, spec(more, charts.ChartOptions(ranks=charts.RANK_MEAN)), "0/1")
    assert mean.full  # another spec: the rank mean's layers


def test_refreshes_chain_and_a_resync_sends_the_whole_chart_as_it_is_now() -> None:
    rows = [bucket(r, s) for r in range(2) for s in range(1, 100)]
    first, drawn = live.refresh(None, spec(rows), "0/1")
    rows = [*rows, bucket(0, 100), bucket(1, 100)]
    second, drawn = live.refresh(drawn, spec(rows), "0/1")
    rows = [*rows, bucket(0, 101), bucket(1, 101)]
    third, drawn = live.refresh(drawn, spec(rows), "0/1")
    assert (second.base, third.base) == (first.seq, second.seq)  # each applies only on top of the one before
    # The browser lost the chart (its element mounted anew) and asked again: the page forgot ``drawn``.
    again, _ = live.refresh(None, spec(rows), "0/1")
    assert again.full and again.base is None
    assert steps_sent(again) == {(str(r), s) for r in range(2) for s in range(1, 102)}


def test_the_component_imports_its_code_which_is_told_where_vega_is() -> None:
    inline = live.js_code()
    assert f"{assets.PATH}{assets.CODE}?v=" in inline and len(inline) < 300  # what each refresh carries
    code = assets.served(assets.CODE)
    assert code is not None and b"__VENDOR" not in code
    assert all(f"{assets.PATH}{name}?v=".encode() in code for name in assets.VENDOR_FILES)
    assert all(assets.served(name) for name in assets.VENDOR_FILES)
    assert assets.served("../gate.py") is None and assets.served("LICENSE") is None  # named files only
    assert (assets.VENDOR_DIR / "LICENSE").is_file()


def test_a_browser_that_missed_a_refresh_gets_what_it_lacks_not_the_whole_chart() -> None:
    """A rerun cut short after the page built a refresh but before its message left: the browser
    still holds the refresh before it, says so (the trigger ``resync``), and the next refresh
    builds on that one; one that holds nothing the page kept gets the whole chart."""
    rows = [bucket(r, s) for r in range(2) for s in range(1, 200)]
    sent = live.Sent()
    first, drawn = live.refresh(sent.drawn, spec(rows), "0/1")
    sent.record(drawn)
    rows = [*rows, bucket(0, 200), bucket(1, 200)]
    _, drawn = live.refresh(sent.drawn, spec(rows), "0/1")  # its message never reached the browser
    sent.record(drawn)
    sent.rewind(first.seq)  # the browser holds the first
    rows = [*rows, bucket(0, 201), bucket(1, 201)]
    again, drawn = live.refresh(sent.drawn, spec(rows), "0/1")
    assert not again.full and again.base == first.seq
    assert steps_sent(again) == {(str(r), s) for r in range(2) for s in (200, 201)}  # the lost rows too
    sent.record(drawn)
    sent.rewind(None)  # the browser lost the chart
    whole, _ = live.refresh(sent.drawn, spec(rows), "0/1")
    assert whole.full and whole.base is None
