"""The Compare page (app/views/compare.py): two runs' rank means overlaid, its runs and metrics read
from the URL, and what it says without runs.
"""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from app import data
from db.metricstore import write_points
from db.states import RunStatus, transition
from db.vocabulary.settings import Settings
from db.vocabulary.settings_file import write_values
from orchestrator.run_edits import edit_run
from tests.unit.app.pages import (
    add_attempt,
    add_metrics,
    add_run,
    as_read_frame,
    chart_data,
    chart_spec,
    chart_title,
    no_exception,
    open_page,
    sessions,
    settings,
)

__all__ = ["sessions", "settings"]  # the fixtures, from the helper module


# -- Compare page ---------------------------------------------------------------------------


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_compare_page_overlays_the_rank_mean_of_two_runs(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        first = add_run(s, settings, "lr-high", RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED)
        add_attempt(s, first, last_step=100)
        add_metrics(s, first, last_step=100)
        second = add_run(s, settings, "lr-low", RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED,
                         batch_size=32)
        add_attempt(s, second, last_step=50)
        add_metrics(s, second, last_step=50)
        s.commit()
    at = open_page("views/compare.py")
    no_exception(at)
    assert at.title[0].value == "Compare runs"
    runs, metrics = at.multiselect
    assert runs.value == [first, second]  # the two newest by default, oldest first
    assert metrics.value == ["loss", "eval_accuracy"]  # loss and the eval metrics first
    assert at.query_params["runs"] == f"{first},{second}"  # the choice is in the URL
    charts = at.get("vega_lite_chart")
    assert [chart_title(c) for c in charts] == ["Loss", "Eval accuracy"]  # one chart per metric, the registry's labels
    rows = chart_data(charts[0])
    assert sorted(rows["run"].unique()) == [f"#{first} lr-high (SUCCEEDED)", f"#{second} lr-low (SUCCEEDED)"]
    high = rows[rows["run"].str.contains("lr-high")].sort_values("step")
    assert len(high) == 10 and len(rows) == 15  # one point per step, ranks averaged
    assert high["value"].iloc[0] == pytest.approx(2.0 / 10 + 0.005)  # mean of ranks 0 and 1
    summary, diff, _costs = at.table  # the summary, the config differences, energy and cost
    table = as_read_frame(summary.value).set_index("run")
    assert table.loc[f"#{first} lr-high", "Loss final"] == f"{2.0 / 100 + 0.005:.4g}"  # step 100, two ranks
    assert table.loc[f"#{second} lr-low", "Loss best (min)"] == f"{2.0 / 50 + 0.005:.4g} @ 50"
    assert table.loc[f"#{first} lr-high", "Eval accuracy (%) best (max)"] == "87.5 @ 100"  # as the Run page says
    assert table.loc[f"#{second} lr-low", "status"] == "SUCCEEDED"
    assert as_read_frame(diff.value)["key"].tolist() == ["train.batch_size"]


def test_compare_page_reads_its_runs_and_metrics_from_the_url(settings: Settings,
                                                              sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        only = add_run(s, settings, "only", RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED)
        add_attempt(s, only, last_step=30)
        add_metrics(s, only, last_step=30)
        add_run(s, settings, "newer")
        s.commit()
    at = open_page("views/compare.py", runs=f"{only},999", metrics="loss")
    no_exception(at)
    assert at.multiselect[0].value == [only] and at.multiselect[1].value == ["loss"]
    assert any("999 is not one of the 2 newest runs" in w.value for w in at.warning)
    infos = [i.value for i in at.info]
    assert any(i.startswith("One run chosen") for i in infos) and any(i.startswith("One run: nothing to diff")
                                                                     for i in infos)
    assert [chart_title(c) for c in at.get("vega_lite_chart")] == ["Loss"]
    at.multiselect[0].set_value([]).run()
    assert any("Pick two or more runs" in i.value for i in at.info)


def test_compare_page_without_runs_says_how_to_get_some(settings: Settings) -> None:
    at = open_page("views/compare.py")
    no_exception(at)
    assert [i.value for i in at.info if "No runs yet" in i.value] == [
        "No runs yet. Start one on the **New run** page; once two have run, compare them here."]
    assert not at.multiselect and not at.table


def test_compare_shows_each_runs_tags_and_the_first_line_of_its_note(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        first = add_run(s, settings, "first")
        second = add_run(s, settings, "second")
        edit_run(s, first, add_tags=["baseline"], note="warmup 100 steps\nthen cosine")
        s.commit()
    at = open_page("views/compare.py", runs=f"{first},{second}")
    no_exception(at)
    summary = at.table[0].value.set_index("run")  # Markdown-escaped cells: \#1
    assert summary.loc["\\#1 first", "tags"] == "baseline" and summary.loc["\\#2 second", "tags"] == "—"
    assert summary.loc["\\#1 first", "note"] == "warmup 100 steps…"  # the rest is on the Run page


def test_compare_shows_energy_your_cost_and_the_cloud_reference_apart(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    write_values(settings.home, {("cost", "electricity_usd_per_kwh"): 0.30})
    with sessions() as s:
        first = add_run(s, settings, "first")
        second = add_run(s, settings, "second")
        s.commit()
    at = open_page("views/compare.py", runs=f"{first},{second}")
    no_exception(at)
    costs = next(t.value for t in at.table if "your cost" in t.value.columns).set_index("run")
    assert "your cost" not in at.table[0].value.columns  # the summary keeps its width
    row = costs.loc["\\#1 first"]
    assert row["energy"] == "—"  # not measured (queued: nothing yet)
    # Markdown-escaped cells; each line with its wasted part, never added to the other.
    assert row["your cost"] == "\\$0.0000, wasted \\$0.0000" and row["cloud ref."] == "\\$0.0000, wasted \\$0.0000"


def test_compare_draws_a_loss_spanning_decades_on_a_log_axis_as_the_run_page_does(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """Issue 56, item 4: three losses falling from 10 to 0.001 were flat lines at zero."""
    with sessions() as s:
        ids = []
        for name in ("a", "b"):
            run = add_run(s, settings, name, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED)
            add_attempt(s, run, last_step=100)
            now = time.time()
            s.flush()
            write_points(s.connection(), [dict(run_id=run, attempt=1, rank=0, step=step, key="loss",
                                               value=10.0 * 0.9**step, wall_time=now - 100 + step)
                                          for step in range(1, 101)])
            ids.append(run)
        s.commit()
    at = open_page("views/compare.py", runs=f"{ids[0]},{ids[1]}", metrics="loss")
    no_exception(at)
    assert at.toggle(key="compare-log-loss").value  # on by the rule, until a person chooses
    (chart,) = at.get("vega_lite_chart")
    assert chart_spec(chart)["layer"][0]["encoding"]["y"]["scale"]["type"] == "log"
    at.toggle(key="compare-log-loss").set_value(False).run()
    assert chart_spec(at.get("vega_lite_chart")[0])["layer"][0]["encoding"]["y"]["scale"].get("type") != "log"


def test_add_to_compare_on_a_run_page_adds_the_run_to_the_runs_compared_last(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        first, second, third = (add_run(s, settings, name) for name in ("a", "b", "c"))
        s.commit()
    at = open_page("views/compare.py", runs=f"{first},{second}")
    no_exception(at)
    at.switch_page("views/run.py")
    at.query_params.clear()
    at.query_params["run"] = str(third)
    at.run()
    no_exception(at)
    (link,) = [p for p in at.get("page_link") if p.proto.label == "Add to Compare"]
    assert (link.proto.page, link.proto.query_string) == ("compare", f"runs={first}%2C{second}%2C{third}")


def add_many_metrics(s: Session, run_id: int, keys: list[str], last_step: int) -> None:
    """Every key of ``keys`` on ranks 0 and 1 every 10 steps up to ``last_step``."""
    now = time.time()
    s.flush()
    write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=rank, step=step, key=key,
                                       value=1.0 + k + 0.1 * rank + 1.0 / step, wall_time=now - last_step + step)
                                  for k, key in enumerate(keys) for step in range(10, last_step + 1, 10)
                                  for rank in (0, 1)])


def test_compare_draws_the_first_charts_and_each_other_metric_when_its_section_is_opened(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """Issue 56, item 10: six metrics of two runs: four charts at once, the other two in closed
    sections that read nothing until opened, or all six when asked for."""
    keys = [f"train/m{i}" for i in range(6)]
    with sessions() as s:
        ids = []
        for name in ("a", "b"):
            run = add_run(s, settings, name, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED)
            add_attempt(s, run, last_step=100)
            add_many_metrics(s, run, keys, 100)
            ids.append(run)
        s.commit()
    at = open_page("views/compare.py", runs=f"{ids[0]},{ids[1]}")
    no_exception(at)
    assert at.multiselect[1].value == keys[:4]  # no loss nor eval metric: the first few, not all six
    at.multiselect[1].set_value(keys).run()
    no_exception(at)
    # Two columns, read column by column here: the first four metrics.
    assert sorted(chart_title(c) for c in at.get("vega_lite_chart")) == keys[:4]
    assert [e.label for e in at.expander] == ["train/m4", "train/m5"]
    assert any("2 more charts: each is drawn when its section is opened" in c.value for c in at.caption)
    at.session_state["compare-open-train/m5"] = True  # a person opens the last metric's section
    at.run()
    no_exception(at)
    charts = at.get("vega_lite_chart")
    assert [chart_title(c) for c in charts][-1] == "train/m5" and len(charts) == 5
    assert sorted(chart_data(charts[-1])["run"].unique()) == [f"#{ids[0]} a (SUCCEEDED)", f"#{ids[1]} b (SUCCEEDED)"]
    at.toggle(key="compare-all").set_value(True).run()
    no_exception(at)
    assert sorted(chart_title(c) for c in at.get("vega_lite_chart")) == keys
    assert not at.expander


def test_compare_keeps_a_finished_runs_series_until_the_run_ends_again(
        settings: Settings, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished run's series is kept once read (by run, metric and end): drawn again, it is not
    read again; a resumed run that ended again later is read again and shows its new steps. The
    metric store's reads are counted (the 2-s cache of data.metric_series_full left out)."""
    with sessions() as s:
        first = add_run(s, settings, "resumed", RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED)
        add_attempt(s, first, last_step=50)
        add_many_metrics(s, first, ["loss"], 50)
        second = add_run(s, settings, "other", RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED)
        add_attempt(s, second, last_step=50)
        add_many_metrics(s, second, ["loss"], 50)
        s.commit()
    read: list[int] = []

    def counting(run_id: int, key: str, max_points: int) -> Any:
        read.append(run_id)
        return data.metric_series(run_id, key, max_points)

    monkeypatch.setattr(data, "metric_series_full", counting)
    at = open_page("views/compare.py", runs=f"{first},{second}", metrics="loss")
    no_exception(at)
    rows = chart_data(at.get("vega_lite_chart")[0])
    assert rows[rows["run"].str.contains("resumed")]["step"].max() == 50
    assert sorted(read) == [first, second]
    read.clear()
    at.run()  # drawn again (a click, a reload): nothing read
    no_exception(at)
    assert read == [] and len(at.get("vega_lite_chart")) == 1
    with sessions() as s:  # resumed: queued again, trained to step 100, ended again
        for status in (RunStatus.QUEUED, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED):
            assert transition(s, first, status, "test: resumed", now=time.time() + 5)
        s.flush()
        write_points(s.connection(), [dict(run_id=first, attempt=1, rank=0, step=step, key="loss", value=0.5,
                                           wall_time=time.time()) for step in range(60, 101, 10)])
        s.commit()
    data.compare_runs.clear()  # its 2-s cache aside: the run's new end is seen
    at.run()
    no_exception(at)
    rows = chart_data(at.get("vega_lite_chart")[0])
    assert rows[rows["run"].str.contains("resumed")]["step"].max() == 100
    assert read == [first]  # the resumed run read again, the other one not
