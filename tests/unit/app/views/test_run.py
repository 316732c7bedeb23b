"""The dashboard pages, rendered by Streamlit's AppTest on a real, seeded SQLite database.

Each test points ``RUNYARD_HOME`` at ``tmp_path``, applies the migrations, writes rows the way
the scheduler and the ranks would (``create_run``, ``transition``, Attempt / ``write_points`` /
SchedulerHeartbeat rows), runs ``app/main.py`` and checks what a person would look at: the
runs table, the run header, progress, metrics, charts, the scheduler banner, the New run form's
errors, and what the Start and Cancel buttons wrote to the database.

AppTest renders ``@st.fragment`` bodies on a full run (it cannot call them alone), so every
check below goes through ``at.run()``.

    pytest tests/unit/test_app_pages.py
"""

from __future__ import annotations

import io
import json
import re
import shutil
import sysconfig
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pandas as pd
import pyarrow as pa
import pytest
import streamlit as st
from pydantic import Field
from sqlalchemy import select
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest

from app import data
from app.charts import metric as app_charts
from app.charts.layers import NAN_COLOR
from db import queries, run_list
from db.engine import make_engine, make_sessionmaker
from db.metricstore import write_points
from db.models import Attempt, Checkpoint, Event, Run, SchedulerHeartbeat
from db.requests import RequestRefused, create_run, set_prices
from db.states import AttemptStatus, RunStatus, transition
from db.vocabulary.checks import CHECKS_EVENT, checks_message
from db.vocabulary.config import RunConfig, TrainConfig
from db.vocabulary.cost import Price
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings, load_settings
from orchestrator.submission import submit
from tests.unit.apptest import new_app

# -- fixtures and seeding helpers ------------------------------------------------------------


@pytest.fixture
def settings(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, db_dialect: str,
             request: pytest.FixtureRequest) -> Iterator[Settings]:
    """A fresh runyard home in tmp_path with the schema at head (its SQLite file, a copy of the
    session's migrated template, or for the tests marked ``both_dbs`` also a fresh PostgreSQL
    database); Streamlit caches emptied so the app's cached settings and engine point at it."""
    monkeypatch.setenv("RUNYARD_HOME", str(tmp_path))
    monkeypatch.delenv("RUNYARD_DB_URL", raising=False)
    if db_dialect == "postgres":
        monkeypatch.setenv("RUNYARD_DB_URL", request.getfixturevalue("migrated_url"))
    monkeypatch.setenv("RUNYARD_CPU_SLOTS", "2")  # the same machine limits on every host
    monkeypatch.delenv("RUNYARD_SCRIPT_ROOTS", raising=False)  # the default roots: the cwd and tmp_path
    st.cache_resource.clear()
    st.cache_data.clear()
    s = load_settings()
    if db_dialect == "sqlite":  # the home's own database file, where the settings put it
        shutil.copyfile(request.getfixturevalue("sqlite_template"), str(make_url(s.db_url).database))
    yield s
    st.cache_resource.clear()
    st.cache_data.clear()


@pytest.fixture
def sessions(settings: Settings) -> Iterator[sessionmaker[Session]]:
    engine = make_engine(settings.db_url)
    yield make_sessionmaker(engine)
    engine.dispose()


def add_run(session: Session, settings: Settings, name: str, *path: RunStatus, **train: int) -> int:
    """Queue a run named ``name`` and walk it through the statuses in ``path``."""
    config = RunConfig.model_validate({"name": name, "train": {"max_steps": 300, **train}})
    run = create_run(session, config, settings.runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
    session.flush()
    for status in path:
        assert transition(session, run.id, status, f"test: {status}")
    return run.id


def add_attempt(session: Session, run_id: int, last_step: int, status: AttemptStatus = AttemptStatus.RUNNING) -> None:
    now = time.time()
    session.add(
        Attempt(
            run_id=run_id, number=1, status=status.value,
            dir=str(Path(session.get(Run, run_id).run_dir) / "attempts" / "1"),
            started_at=now - 60, first_step_at=now - 55, progress_at=now, last_step=last_step,
        )
    )


def add_failed_run(sessions: sessionmaker[Session], settings: Settings, exception: str, log_tail: str,
                   reason: str | None = None) -> int:
    """A FAILED run named "broken" whose one attempt failed on rank 1 (USER_ERROR, exit code 1) at
    step 49 with ``exception``, ``log_tail`` and ``reason``; its id."""
    with sessions() as s:
        run_id = add_run(s, settings, "broken", RunStatus.STARTING, RunStatus.RUNNING, RunStatus.FAILED)
        add_attempt(s, run_id, 49, AttemptStatus.FAILED)
        s.flush()
        attempt = s.query(Attempt).filter_by(run_id=run_id).one()
        attempt.cause, attempt.failed_rank, attempt.exit_code = "USER_ERROR", 1, 1
        attempt.exception, attempt.reason, attempt.log_tail = exception, reason, log_tail
        s.commit()
    return run_id


def add_metrics(session: Session, run_id: int, last_step: int, ranks: tuple[int, ...] = (0, 1)) -> None:
    """Loss every 10 steps on each rank, and one eval accuracy from rank 0."""
    now = time.time()
    rows = [dict(run_id=run_id, attempt=1, rank=rank, step=step, key="loss", value=2.0 / step + 0.01 * rank,
                 wall_time=now - (last_step - step) / 5)
            for step in range(10, last_step + 1, 10) for rank in ranks]
    rows.append(dict(run_id=run_id, attempt=1, rank=0, step=100, key="eval_accuracy", value=0.875, wall_time=now))
    session.flush()
    write_points(session.connection(), rows)


def add_heartbeat(session: Session, age_s: float) -> None:
    now = time.time()
    session.add(SchedulerHeartbeat(host="testhost", pid=4242, started_at=now - 600, beat_at=now - age_s))


@pytest.fixture
def seeded(settings: Settings, sessions: sessionmaker[Session]) -> dict[str, int]:
    """Run 1 queued; run 2 running at step 120/300 with metrics from ranks 0 and 1; a live
    scheduler."""
    with sessions() as s:
        queued = add_run(s, settings, "queued-one")
        running = add_run(s, settings, "digits-a", RunStatus.STARTING, RunStatus.RUNNING)
        add_attempt(s, running, last_step=120)
        add_metrics(s, running, last_step=120)
        add_heartbeat(s, age_s=0.0)
        s.commit()
    return {"queued": queued, "running": running}


def open_page(page: str, **query: str) -> AppTest:
    """Run the app once (to register the pages), then switch to ``page`` with ``query``."""
    at = new_app().run()
    at.switch_page(page)
    for key, value in query.items():
        at.query_params[key] = value
    return at.run()


def show_section(at: AppTest, section: str) -> AppTest:
    """Choose one of the Run page's sections (Overview, Metrics, Checkpoints, Attempts & logs,
    System, Config): only the chosen one is drawn."""
    at.segmented_control(key="section").set_value(section).run()
    no_exception(at)
    return at


def event_badges(at: AppTest) -> str:
    """The Run page's row of event badges (the header's first markdown is the title)."""
    return next(m.value for m in at.markdown[1:] if m.value.startswith(":") and "-badge[" in m.value)


def no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


def chart_title(chart) -> str:  # type: ignore[no-untyped-def]
    """The title of an st.altair_chart element (a plain chart, or the first layer of one)."""
    spec = json.loads(chart.proto.spec)
    return spec.get("title") or next(layer["title"] for layer in spec.get("layer", []) if "title" in layer)


def metric_chart_elements(at: AppTest) -> list:  # type: ignore[type-arg]
    """The Run page's charts without the rank legend strip above them (a chart with a title)."""
    return [c for c in at.get("vega_lite_chart") if json.loads(c.proto.spec).get("title")]


def chart_data(chart) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    """The rows an st.altair_chart element sends to the browser."""
    return pa.ipc.open_stream(io.BytesIO(chart.proto.datasets[0].data.data)).read_all().to_pandas()


# -- Runs page ------------------------------------------------------------------------------


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_runs_page_lists_runs_with_status_and_step(seeded: dict[str, int]) -> None:
    at = new_app().run()
    no_exception(at)
    assert at.title[0].value == "Runs"
    table = at.dataframe[0].value.set_index("id")
    assert list(table.index) == [seeded["running"], seeded["queued"]]  # newest first
    assert table.loc[seeded["running"], "name"] == "digits-a"
    assert table.loc[seeded["running"], "status"] == "RUNNING"
    assert table.loc[seeded["running"], "step"] == "120/300"
    assert table.loc[seeded["running"], "progress"] == pytest.approx(0.4)
    assert table.loc[seeded["running"], "attempts"] == 1
    assert table.loc[seeded["queued"], "status"] == "QUEUED"
    assert table.loc[seeded["queued"], "step"] == "0/300"
    dollars = {col: float(table.loc[seeded["running"], col].lstrip("$").replace(",", ""))
               for col in ("cost", "projected")}
    assert 0 < dollars["cost"] < dollars["projected"]  # running, 40% done: more to pay
    assert table.loc[seeded["queued"], "projected"] == table.loc[seeded["queued"], "cost"] == "$0.0000"


def test_runs_page_status_filter(seeded: dict[str, int]) -> None:
    at = new_app().run()
    at.multiselect[0].select("QUEUED").run()
    no_exception(at)
    assert at.dataframe[0].value["name"].tolist() == ["queued-one"]


def test_runs_page_without_runs_points_to_new_run(settings: Settings) -> None:
    at = new_app().run()
    no_exception(at)
    assert not at.dataframe
    assert "No runs yet" in at.info[0].value


# -- scheduler banner -----------------------------------------------------------------------


def test_stale_heartbeat_shows_scheduler_offline(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        add_heartbeat(s, age_s=60.0)
        s.commit()
    started = time.monotonic()
    at = new_app().run()
    waited = time.monotonic() - started
    no_exception(at)
    warnings = [w.value for w in at.warning]
    assert len(warnings) == 1
    assert "Scheduler offline" in warnings[0]
    # The age the banner gives is the heartbeat's, counted when the page drew: 60 s plus however
    # long the page took to draw (a loaded machine takes a second or two).
    seen = re.search(r"last heartbeat 1m (\d\d)s ago", warnings[0])
    assert seen and 0 <= int(seen.group(1)) <= 1 + waited, warnings[0]


def test_no_heartbeat_ever_shows_scheduler_offline(settings: Settings) -> None:
    at = new_app().run()
    assert any("Scheduler offline" in w.value and "never seen" in w.value for w in at.warning)


def test_fresh_heartbeat_shows_no_banner(seeded: dict[str, int]) -> None:
    at = new_app().run()
    no_exception(at)
    assert not any("Scheduler offline" in w.value for w in at.warning)


# -- Run page -------------------------------------------------------------------------------


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_run_page_shows_header_progress_attempts_and_metrics(seeded: dict[str, int]) -> None:
    run_id = seeded["running"]
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    assert at.selectbox[0].value == run_id
    assert at.selectbox[0].options == [f"#{run_id} digits-a", f"#{seeded['queued']} queued-one"]
    header = at.markdown[0].value
    assert f"#{run_id} digits-a" in header
    assert "RUNNING" in header and "blue-badge" in header
    assert at.progress[0].value == 40
    assert at.progress[0].proto.text == "step 120 / 300"
    metrics = {m.label: m.value for m in at.metric}
    assert metrics["Eval accuracy"] == "87.5%"  # as the metric registry shows a share
    assert metrics["Attempts"] == "1"
    assert re.fullmatch(r"\d\d:\d\d", metrics["Ends at"])  # a running run with progress: the time it ends
    # The actions in the header, where they apply: no Resume or Fork without a checkpoint; Cancel
    # acts from the confirm button inside its popover.
    assert [b.label for b in at.button] == ["Pause", "Cancel run", "Dump stacks", "Save"]  # Save: Edit…'s form
    show_section(at, "Attempts & logs")
    attempts = at.dataframe[0].value
    assert attempts["attempt"].tolist() == [1]
    assert attempts["status"].tolist() == ["RUNNING"]
    assert attempts["last step"].tolist() == [120]


def test_the_run_page_opens_on_its_main_curves_and_a_person_pins_others(seeded: dict[str, int],
                                                                        sessions: sessionmaker[Session]) -> None:
    run_id = seeded["running"]
    with sessions() as s:  # a third metric, not shown on the Overview unless pinned
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=step, key="lr", value=0.001,
                                           wall_time=time.time()) for step in (10, 20)])
        s.commit()
    at = open_page("views/run.py", run=str(run_id))  # the page a Start lands on: Overview
    assert [chart_title(c) for c in metric_chart_elements(at)] == ["Loss", "Eval accuracy"]
    assert len(chart_data(metric_chart_elements(at)[0])) == 2 * 12  # every step on both ranks
    at.button_group(key=f"pin-{run_id}").set_value(["loss", "lr"]).run()
    no_exception(at)
    assert [chart_title(c) for c in metric_chart_elements(at)] == ["Loss", "Learning rate"]
    show_section(at, "Metrics")  # every curve is still on the Metrics section
    assert sorted(chart_title(c) for c in metric_chart_elements(at)) == ["Eval accuracy", "Learning rate", "Loss"]
    assert [chart_title(c) for c in metric_chart_elements(show_section(at, "Overview"))] == ["Loss", "Learning rate"]


def test_run_page_draws_one_chart_per_metric_with_every_rank(seeded: dict[str, int]) -> None:
    at = show_section(open_page("views/run.py", run=str(seeded["running"])), "Metrics")
    charts = metric_chart_elements(at)
    titles = [chart_title(c) for c in charts]
    assert titles == ["Loss", "Eval accuracy"]  # metric charts titled by the registry, loss first
    assert len(at.get("vega_lite_chart")) == len(charts) + 1  # the rank legend strip above them
    loss = chart_data(charts[0])
    assert sorted(loss["rank"].unique()) == ["0", "1"]
    assert len(loss) == 2 * 12  # steps 10..120 on two ranks
    assert loss["step"].max() == 120


def test_run_page_query_param_selects_the_run(seeded: dict[str, int]) -> None:
    at = open_page("views/run.py", run=str(seeded["queued"]))
    no_exception(at)
    assert f"#{seeded['queued']} queued-one" in at.markdown[0].value
    assert "QUEUED" in at.markdown[0].value
    assert at.progress[0].proto.text == "step 0 / 300"
    reason = at.caption[0].value
    # Where the charts will be: what the run waits for (its status sentence), not a bare "waiting".
    show_section(at, "Metrics")
    assert any(i.value == reason for i in at.info), (reason, [i.value for i in at.info])
    assert not at.get("vega_lite_chart")
    show_section(at, "Attempts & logs")
    assert any(c.value == "Not launched yet." for c in at.caption)


def test_run_page_unknown_run_falls_back_to_newest(seeded: dict[str, int]) -> None:
    at = open_page("views/run.py", run="999")
    no_exception(at)
    assert at.selectbox[0].value == seeded["running"]
    assert at.query_params["run"] == str(seeded["running"])


def test_run_page_without_runs(settings: Settings) -> None:
    at = open_page("views/run.py")
    no_exception(at)
    assert "No runs yet" in at.info[0].value


def test_finished_run_has_no_cancel_button(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        run_id = add_run(s, settings, "done", RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED)
        add_attempt(s, run_id, last_step=300, status=AttemptStatus.SUCCEEDED)
        add_metrics(s, run_id, last_step=300)
        s.commit()
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    assert "SUCCEEDED" in at.markdown[0].value
    assert at.progress[0].value == 100
    assert {m.label: m.value for m in at.metric}["Ends at"] == "–"  # finished: nothing to project
    assert [b.label for b in at.button] == ["Save"]  # Edit…'s form alone: no Cancel


def test_charts_are_built_again_only_when_their_buckets_change(
        seeded: dict[str, int], settings: Settings, sessions: sessionmaker[Session],
        monkeypatch: pytest.MonkeyPatch) -> None:
    """A finished run's charts cannot change: a second tab and every refresh draw the charts the
    first tab built (Altair's build is about 75 ms a chart of 8 ranks), and so does the rank legend
    of any run; two finished runs never share one. A live run's chart is built again at a refresh
    that brings new buckets, and not at one that brings none (slow steps, an evaluation)."""
    with sessions() as s:
        done = {}
        for name, last_step in (("done", 300), ("done-sooner", 200)):
            done[name] = add_run(s, settings, name, RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED)
            add_attempt(s, done[name], last_step=last_step, status=AttemptStatus.SUCCEEDED)
            add_metrics(s, done[name], last_step=last_step)
        s.commit()
    built: list[str] = []
    legends: list[int] = []
    metric_view, rank_legend = app_charts.metric_view, app_charts.rank_legend
    monkeypatch.setattr(app_charts, "metric_view", lambda *a, **k: built.append(a[3]) or metric_view(*a, **k))
    monkeypatch.setattr(app_charts, "rank_legend", lambda ranks: legends.append(len(ranks)) or rank_legend(ranks))

    def drawn(at: AppTest) -> list[tuple[str, list[tuple[int, str]]]]:
        """Each metric chart's title and its lines' (step, rank) rows."""
        return [(chart_title(c), sorted(zip(chart_lines(c)["step"], chart_lines(c)["rank"], strict=True)))
                for c in metric_chart_elements(at)]

    first_tab = show_section(open_page("views/run.py", run=str(done["done"])), "Metrics")
    first = drawn(first_tab)
    assert [t for t, _ in first] == ["Loss", "Eval accuracy"] and len(first[0][1]) == 2 * 30
    assert built and legends == [2]
    builds = len(built)
    second_tab = show_section(open_page("views/run.py", run=str(done["done"])), "Metrics")
    assert drawn(second_tab) == first
    second_tab.run()  # a refresh
    no_exception(second_tab)
    assert drawn(second_tab) == first and len(built) == builds and legends == [2]
    other = show_section(open_page("views/run.py", run=str(done["done-sooner"])), "Metrics")
    assert len(drawn(other)[0][1]) == 2 * 20  # its own 20 steps, not the first run's chart
    assert len(built) > builds
    builds = len(built)
    live = show_section(open_page("views/run.py", run=str(seeded["running"])), "Metrics")
    assert len(built) > builds
    builds, drawn_live = len(built), drawn(live)
    live.run()  # a refresh with nothing new
    no_exception(live)
    assert len(built) == builds and drawn(live) == drawn_live
    with sessions() as s:  # rank 0 and 1 log step 130
        write_points(s.connection(), [dict(run_id=seeded["running"], attempt=1, rank=rank, step=130, key="loss",
                                           value=0.01, wall_time=time.time()) for rank in (0, 1)])
        s.commit()
    live.run()
    no_exception(live)
    loss = dict(drawn(live))["Loss"]
    assert len(built) == builds + 1 and (130, "0") in loss and (130, "1") in loss  # the loss chart alone
    assert legends == [2]  # the live run's legend too was drawn from the cache


def chart_spec(chart) -> dict:  # type: ignore[no-untyped-def]
    return json.loads(chart.proto.spec)


def chart_lines(chart) -> pd.DataFrame:  # type: ignore[no-untyped-def]
    """The rows of a metric chart's lines (not its band or NaN marks)."""
    frames = [pa.ipc.open_stream(io.BytesIO(d.data.data)).read_all().to_pandas() for d in chart.proto.datasets]
    return next(f for f in frames if "rank" in f and "value" in f)


def test_run_page_chart_options_mean_band_wall_time_log_and_ema(seeded: dict[str, int]) -> None:
    run_id = seeded["running"]
    at = show_section(open_page("views/run.py", run=str(run_id)), "Metrics")
    assert at.segmented_control(key=f"ranks-{run_id}").value == "per rank"
    at.segmented_control(key=f"ranks-{run_id}").set_value("mean + band")
    at.segmented_control(key=f"x-{run_id}").set_value("wall time")
    at.button_group(key=f"log-{run_id}").set_value(["loss"])  # the log scale is picked per chart
    at.slider(key=f"ema-{run_id}").set_value(0.6)
    at.run()
    no_exception(at)
    loss = metric_chart_elements(at)[0]
    rows = chart_lines(loss)
    assert rows["rank"].unique().tolist() == ["mean"]
    assert len(rows) == 12  # one point per step: the mean of ranks 0 and 1
    assert rows["value"].iloc[0] == pytest.approx(2.0 / 10 + 0.005)
    assert rows["lo"].iloc[0] == pytest.approx(0.2) and rows["hi"].iloc[0] == pytest.approx(0.21)
    assert rows["smooth"].notna().all()
    spec = json.dumps(chart_spec(loss))
    assert '"type": "log"' in spec and '"type": "temporal"' in spec
    # band, faint mean, smoothed mean, the hover read-out
    assert [layer["mark"]["type"] for layer in chart_spec(loss)["layer"]] == ["area", "line", "line", "rule"]
    assert '"type": "log"' not in json.dumps(chart_spec(metric_chart_elements(at)[1]))  # eval_accuracy: linear
    # The choice is kept for this run across refreshes.
    at.run()
    assert at.segmented_control(key=f"ranks-{run_id}").value == "mean + band"
    assert chart_lines(metric_chart_elements(at)[0])["rank"].unique().tolist() == ["mean"]


def test_run_page_hides_superseded_steps_unless_asked(settings: Settings, sessions: sessionmaker[Session]) -> None:
    # Attempt 1 logged up to step 120; attempt 2 resumed from the checkpoint at step 50.
    now = time.time()
    with sessions() as s:
        run_id = add_run(s, settings, "resumed", RunStatus.STARTING, RunStatus.RUNNING)
        add_attempt(s, run_id, last_step=120, status=AttemptStatus.FAILED)
        s.add(Attempt(run_id=run_id, number=2, status="RUNNING", dir="/x", started_at=now - 10, resume_step=50,
                      last_step=80))
        add_metrics(s, run_id, last_step=120)
        write_points(s.connection(), [dict(run_id=run_id, attempt=2, rank=rank, step=step, key="loss", value=0.5,
                                           wall_time=now) for step in (60, 70, 80) for rank in (0, 1)])
        s.commit()
    at = show_section(open_page("views/run.py", run=str(run_id)), "Metrics")
    lines = chart_lines(metric_chart_elements(at)[0])
    assert set(lines[lines["attempt"] == 1]["step"]) == {10, 20, 30, 40, 50}  # attempt 1 up to the resume step
    assert set(lines[lines["attempt"] == 2]["step"]) == {60, 70, 80}
    loss = metric_chart_elements(at)[0]
    frames = [pa.ipc.open_stream(io.BytesIO(d.data.data)).read_all().to_pandas() for d in loss.proto.datasets]
    assert not any("superseded" in f and f["superseded"].any() for f in frames)  # lines and hover: lineage only
    at.toggle(key=f"superseded-{run_id}").set_value(True).run()
    no_exception(at)
    loss = metric_chart_elements(at)[0]
    frames = [pa.ipc.open_stream(io.BytesIO(d.data.data)).read_all().to_pandas() for d in loss.proto.datasets]
    old = next(f for f in frames if "superseded" in f and f["superseded"].all())
    assert set(old["step"]) == set(range(60, 121, 10)) and set(old["attempt"]) == {1}
    assert any(layer["mark"].get("strokeDash") for layer in chart_spec(loss)["layer"])


def test_during_a_retry_the_first_attempts_curve_stays_whole_until_the_next_one_trains(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    # Attempt 1 logged up to step 120 and failed; attempt 2, from the checkpoint at step 50, is
    # still starting (no step yet): nothing of attempt 1 is superseded yet.
    now = time.time()
    with sessions() as s:
        run_id = add_run(s, settings, "retrying", RunStatus.STARTING, RunStatus.RUNNING)
        add_attempt(s, run_id, last_step=120, status=AttemptStatus.FAILED)
        s.add(Attempt(run_id=run_id, number=2, status="RUNNING", dir="/x", started_at=now - 2, resume_step=50))
        add_metrics(s, run_id, last_step=120)
        s.commit()
    at = show_section(open_page("views/run.py", run=str(run_id)), "Metrics")
    lines = chart_lines(metric_chart_elements(at)[0])
    assert set(lines["step"]) == set(range(10, 121, 10)) and set(lines["attempt"]) == {1}
    assert not [i.value for i in at.info if "Waiting for the first metrics" in i.value]
    with sessions() as s:  # attempt 2 trains: what attempt 1 did after step 50 is superseded now
        s.execute(Attempt.__table__.update().where(Attempt.run_id == run_id, Attempt.number == 2)
                  .values(first_step_at=now, last_step=60))
        write_points(s.connection(), [dict(run_id=run_id, attempt=2, rank=rank, step=60, key="loss", value=0.5,
                                           wall_time=now) for rank in (0, 1)])
        s.commit()
    st.cache_data.clear()
    at.run()
    no_exception(at)
    lines = chart_lines(metric_chart_elements(at)[0])
    assert set(lines[lines["attempt"] == 1]["step"]) == {10, 20, 30, 40, 50}
    assert set(lines[lines["attempt"] == 2]["step"]) == {60}


def element_path(node: Any, match: Callable[[Any], bool]) -> list[int] | None:
    """The delta path (indices from the page's root) of the first element ``match`` accepts."""
    for index, child in sorted(getattr(node, "children", {}).items()):
        if match(child):
            return [index]
        inner = element_path(child, match)
        if inner is not None:
            return [index, *inner]
    return None


def test_the_headline_numbers_keep_their_place_while_a_run_retries(settings: Settings,
                                                                    sessions: sessionmaker[Session]) -> None:
    """Streamlit matches a redrawn element to the one before by its place in the page: when a
    retry's warning and failure summary were drawn above the headline numbers, the new numbers
    came a few places further down, and the old ones stayed until the redraw ended (issue 29:
    "two copies of the headline tiles were in the page at once during a retry")."""
    def elapsed(at: AppTest) -> list[int] | None:
        return element_path(at._tree, lambda e: getattr(e, "type", None) == "metric" and e.label == "Elapsed")

    with sessions() as s:
        run_id = add_run(s, settings, "retrying", RunStatus.STARTING, RunStatus.RUNNING)
        add_attempt(s, run_id, last_step=120)
        add_metrics(s, run_id, last_step=120)
        s.commit()
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    running = elapsed(at)
    assert running is not None
    with sessions() as s:  # attempt 1 failed: a failure summary, a reason and a retry warning
        attempt = s.query(Attempt).filter_by(run_id=run_id).one()
        attempt.status, attempt.cause, attempt.failed_rank, attempt.exit_code = "FAILED", "SIGNAL", 1, -9
        attempt.exception, attempt.ended_at = "killed by SIGKILL", time.time()
        assert transition(s, run_id, RunStatus.RETRYING, "rank 1 was killed (SIGKILL); retrying from step 100")
        s.get(Run, run_id).retry_at = time.time() + 30
        s.commit()
    st.cache_data.clear()
    at.run()
    no_exception(at)
    assert any("Retrying: next attempt at" in w.value for w in at.warning)
    assert elapsed(at) == running


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_run_page_live_panel_fetches_only_new_buckets(seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    run_id = seeded["running"]
    at = open_page("views/run.py", run=str(run_id))  # the Overview: its badges count NaNs in the series
    held = at.session_state[f"live-series/{run_id}/loss"]
    assert held.level == 0 and len(held.rows) == 24 and held.fetched == 24
    show_section(at, "Metrics")
    held = at.session_state[f"live-series/{run_id}/loss"]
    assert len(held.rows) == 24 and held.fetched == 2  # only step 120 (the last cached bucket) again, on 2 ranks
    now = time.time()
    with sessions() as s:
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=rank, step=step, key="loss", value=0.01,
                                           wall_time=now) for step in range(130, 201, 10) for rank in (0, 1)])
        s.commit()
    at.run()
    no_exception(at)
    held = at.session_state[f"live-series/{run_id}/loss"]
    assert held.fetched == 2 * 9  # step 120 again (the last cached bucket) and the 8 new steps, on 2 ranks
    loss = chart_lines(metric_chart_elements(at)[0])
    assert len(loss) == 2 * 20 and loss["step"].max() == 200


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_run_page_badges_count_events_and_nan(seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    run_id = seeded["running"]
    now = time.time()
    with sessions() as s:
        s.add(Event(run_id=run_id, attempt=1, at=now, level="info", kind=CHECKS_EVENT, message=checks_message({})))
        for kind, level in (("straggler", "warning"), ("straggler", "warning"), ("desync", "error")):
            s.add(Event(run_id=run_id, attempt=1, at=now, level=level, kind=kind, message=f"{kind} on rank 1"))
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=1, step=130, key="loss",
                                           value=float("nan"), wall_time=now)])
        s.commit()
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    badges = event_badges(at)
    assert "straggler × 2" in badges and "orange-badge" in badges
    assert "desync × 1" in badges and "NaN × 1" in badges  # no "nan" event: counted from the buckets
    assert "hang ×" not in badges and ":green-badge[:material/check: no hangs]" in badges
    assert "not checked" not in badges
    events = next(d.value for d in at.dataframe if "kind" in d.value)
    assert sorted(events["kind"]) == ["desync", "straggler", "straggler"]
    loss = metric_chart_elements(show_section(at, "Metrics"))[0]
    marks = [(layer["mark"]["type"], layer["mark"].get("color")) for layer in chart_spec(loss)["layer"]]
    assert ("rule", NAN_COLOR) in marks  # the NaN is marked


def test_run_page_without_findings_says_so_for_the_checks_that_ran(seeded: dict[str, int],
                                                                   sessions: sessionmaker[Session]) -> None:
    run_id = seeded["running"]
    at = open_page("views/run.py", run=str(run_id))  # no rank said yet which checks it runs
    badges = event_badges(at)
    assert ":green-badge[:material/check: no NaNs or hangs]" in badges
    assert ":gray-badge[:material/help: stragglers or desyncs not checked (no metrics logged yet)]" in badges
    with sessions() as s:
        s.add(Event(run_id=run_id, attempt=1, at=time.time(), level="info", kind=CHECKS_EVENT,
                    message=checks_message({})))
        s.commit()
    st.cache_data.clear()  # the page caches the run's detail for a few seconds
    badges = event_badges(open_page("views/run.py", run=str(run_id)))
    assert "no stragglers, desyncs, NaNs or hangs" in badges and "not checked" not in badges


def test_run_page_of_a_queued_run_or_one_rank_says_what_was_not_checked(seeded: dict[str, int],
                                                                       sessions: sessionmaker[Session]) -> None:
    badges = event_badges(open_page("views/run.py", run=str(seeded["queued"])))
    assert badges == (":gray-badge[:material/help: stragglers, desyncs, NaNs or hangs not checked "
                      "(the run has not started)]")  # no green check for a run that never ran
    run_id = seeded["running"]
    with sessions() as s:
        s.add(Event(run_id=run_id, attempt=1, at=time.time(), level="info", kind=CHECKS_EVENT,
                    message=checks_message({"stragglers": "one rank, nothing to compare",
                                            "desyncs": "one rank, nothing to compare"})))
        s.commit()
    badges = event_badges(open_page("views/run.py", run=str(run_id)))
    assert ":green-badge[:material/check: no NaNs or hangs]" in badges
    assert "stragglers or desyncs not checked (one rank, nothing to compare)" in badges


def test_run_page_of_a_plain_script_says_nothing_was_checked(settings: Settings,
                                                            sessions: sessionmaker[Session]) -> None:
    """A script that never imports the SDK: no straggler or desync check runs, and before its
    first output and metric neither does the hang or the NaN check, so the page must not say
    that none was found; its steps read from stdout make the hang and NaN checks run, the SDK's
    report the other two."""
    with sessions() as s:
        config = RunConfig.model_validate({"name": "plain", "workload": {"kind": "script", "script": "/p/train.py"}})
        run = create_run(s, config, settings.runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
        s.flush()
        for status in (RunStatus.STARTING, RunStatus.RUNNING):
            assert transition(s, run.id, status, f"test: {status}")
        s.add(Attempt(run_id=run.id, number=1, status=AttemptStatus.RUNNING.value,
                      dir=str(Path(run.run_dir) / "attempts" / "1"), started_at=time.time() - 60))
        add_heartbeat(s, age_s=0.0)
        s.commit()
        run_id = run.id
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    badges = event_badges(at)
    assert "green-badge" not in badges
    assert "stragglers or desyncs not checked (the script has not reported through runyard's SDK)" in badges
    assert "hangs not checked (the script has printed nothing yet)" in badges
    assert "NaNs not checked (no metric recorded yet)" in badges
    with sessions() as s:  # its loss lines on stdout: steps and a metric, still no SDK
        now = time.time()
        s.execute(Attempt.__table__.update().where(Attempt.run_id == run_id).values(first_step_at=now))
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=10, key="loss", value=2.0,
                                           wall_time=now)])
        s.commit()
    st.cache_data.clear()  # the page caches the run's detail for a few seconds
    badges = event_badges(open_page("views/run.py", run=str(run_id)))
    assert ":green-badge[:material/check: no NaNs or hangs]" in badges
    assert "stragglers or desyncs not checked (the script has not reported through runyard's SDK)" in badges
    with sessions() as s:  # once its ranks report through the SDK, rank 0 says which checks run
        s.add(Event(run_id=run_id, attempt=1, at=time.time(), level="info", kind=CHECKS_EVENT,
                    message=checks_message({})))
        s.commit()
    st.cache_data.clear()
    assert "no stragglers, desyncs, NaNs or hangs" in event_badges(open_page("views/run.py", run=str(run_id)))


def test_run_page_checkpoint_advice(seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    run_id = seeded["running"]
    at = show_section(open_page("views/run.py", run=str(run_id)), "Checkpoints")
    advice = next(c.value for c in at.caption if "Young–Daly" in c.value)
    assert "not enough data yet" in advice and "no checkpoint written yet" in advice
    assert "configured: every 100 steps" in advice.lower()
    now = time.time()
    with sessions() as s:
        # 2 s blocked per save; one failure in 2 h of attempts on this machine (plus the 60 s of
        # the seeded attempt); the seeded attempt made 119 steps in 55 s.
        s.add(Checkpoint(run_id=run_id, attempt=1, step=100, path="/c/step-100", bytes=10, sha256="0",
                         params_digest="0", blocked_s=2.0, total_s=9.0, created_at=now))
        other = add_run(s, load_settings(), "crashed")
        s.add(Attempt(run_id=other, number=1, status="FAILED", dir="/x", started_at=now - 7200, ended_at=now,
                      cause="SIGNAL"))
        s.commit()
    st.cache_data.clear()
    at.run()
    no_exception(at)
    advice = next(c.value for c in at.caption if "Young–Daly" in c.value)
    assert advice.startswith("Young–Daly suggests every ~")
    assert "given save cost 2 s and MTBF 2 h" in advice
    assert "configured: every 100 steps" in advice


# -- Cancel ---------------------------------------------------------------------------------


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_cancel_running_run_moves_it_to_cancelling(seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    run_id = seeded["running"]
    at = open_page("views/run.py", run=str(run_id))
    at.button(key=f"cancel-{run_id}").click().run()
    no_exception(at)
    assert "cancel requested" in at.toast[0].value
    with sessions() as s:
        run = s.get(Run, run_id)
        assert run.status == RunStatus.CANCELLING.value
        assert run.status_reason == "cancel requested by ui"
    # The header was drawn before the button in that script run; the next refresh (the live
    # fragment reruns every 2 s) shows the new status, and no Cancel button any more.
    at.run()
    assert "CANCELLING" in at.markdown[0].value
    assert [b.label for b in at.button] == ["Save"]  # Edit…'s form alone: no Cancel, no Pause


def test_cancel_queued_run_cancels_it_at_once(seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    run_id = seeded["queued"]
    at = open_page("views/run.py", run=str(run_id))
    at.button(key=f"cancel-{run_id}").click().run()
    no_exception(at)
    with sessions() as s:
        assert s.get(Run, run_id).status == RunStatus.CANCELLED.value


# -- New run page ---------------------------------------------------------------------------


def queued_runs(sessions: sessionmaker[Session]) -> list[dict]:
    with sessions() as s:
        return run_list.list_runs(s)


def start(at: AppTest) -> AppTest:
    """Press Start (the form's submit button)."""
    return next(b for b in at.button if "Start" in b.label).click().run()


SUMMARY = "**Not started:"


def as_read(text: str) -> str:
    """Markdown that ``app.style.plain`` escaped, as a person reads it on the page."""
    return re.sub(r"\\(.)", r"\1", text).replace("&lt;", "<").replace("&gt;", ">").replace("&amp;", "&")


def as_read_frame(frame: pd.DataFrame) -> pd.DataFrame:
    """An ``st.table`` frame (``app.style.plain_frame``) as a person reads it."""
    out = frame.map(lambda v: as_read(v) if isinstance(v, str) else v)
    out.columns = [as_read(str(c)) for c in frame.columns]
    return out


def refusals(at: AppTest, summarised: bool = True) -> list[str]:
    """The errors shown under the fields, after checking that the summary above Start (on the
    New run page: ``summarised``) lists every one of them; as a person reads them."""
    shown = [as_read(e.value) for e in at.error]
    summaries = [e for e in shown if e.startswith(SUMMARY)]
    rest = [e for e in shown if not e.startswith(SUMMARY)]
    if rest and summarised:
        assert len(summaries) == 1 and all(e in summaries[0] for e in rest), (summaries, rest)
    return rest


def test_new_run_form_shows_the_defaults(settings: Settings) -> None:
    at = open_page("views/new_run.py")
    no_exception(at)
    assert at.title[0].value == "New run"
    assert at.number_input(key="launch.nproc_per_node").value == 2
    # The first run is one a person can watch (about a minute), not over 4 s after its first point.
    assert at.number_input(key="train.max_steps").value == 3000
    assert at.number_input(key="train.lr").value == pytest.approx(0.001)
    assert not at.error


def test_the_slurm_fields_appear_for_a_slurm_run_and_reach_its_config(settings: Settings,
                                                                     sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    assert not [k for k in ("slurm.partition", "slurm.time_limit") if k in at.session_state]  # local: none shown
    at.selectbox(key="launch.executor").set_value("slurm").run()
    no_exception(at)
    at.text_input(key="slurm.partition").set_value("gpu")
    at.text_input(key="slurm.time_limit").set_value("01:30:00")
    at.number_input(key="launch.nnodes").set_value(2)
    start(at)
    no_exception(at)
    assert not refusals(at)
    with sessions() as s:
        (config_json,) = s.scalars(select(Run.config_json)).all()
    config = json.loads(config_json)
    assert config["launch"]["executor"] == "slurm" and config["launch"]["nnodes"] == 2
    assert (config["slurm"]["partition"], config["slurm"]["time_limit"]) == ("gpu", "01:30:00")


def test_negative_learning_rate_is_rejected_and_nothing_queued(settings: Settings,
                                                                sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    at.number_input(key="train.lr").set_value(-1.0)
    start(at)
    no_exception(at)
    errors = refusals(at)
    assert len(errors) == 1
    assert errors[0].startswith("train.lr = -1.0")
    assert "greater than 0" in errors[0]
    assert queued_runs(sessions) == []


def test_an_implausible_value_is_asked_about_once_then_started(settings: Settings,
                                                                sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    at.number_input(key="train.lr").set_value(50.0)
    start(at)
    no_exception(at)
    (warning,) = [as_read(w.value) for w in at.warning if "Check before starting" in w.value]
    assert "press Start again" in warning and "train.lr = 50.0: a learning rate above 1 usually diverges" in warning
    assert queued_runs(sessions) == []
    start(at)
    assert [r["name"] for r in queued_runs(sessions)] == ["run"]


def test_a_name_with_a_space_is_refused_in_words(settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    at.text_input(key="name").input("my run")
    start(at)
    (error,) = refusals(at)
    assert error == ("name = 'my run': use letters, digits, '.', '_' and '-', starting with a letter or digit "
                     "(no spaces)")
    assert "pattern" not in error


def test_too_many_ranks_is_rejected_and_nothing_queued(settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    at.number_input(key="launch.nproc_per_node").set_value(64)
    start(at)
    no_exception(at)
    errors = refusals(at)
    assert len(errors) == 1
    assert errors[0].startswith("launch.nproc_per_node = 64")
    assert "this machine has only" in errors[0]
    assert queued_runs(sessions) == []


def test_every_problem_is_reported_at_once(settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    at.text_input(key="name").set_value("bad name!")
    at.number_input(key="train.lr").set_value(-1.0)
    at.number_input(key="launch.nproc_per_node").set_value(64)
    start(at)
    no_exception(at)
    errors = " | ".join(refusals(at))
    for field in ("name = 'bad name!'", "train.lr = -1.0", "launch.nproc_per_node = 64"):
        assert field in errors
    assert queued_runs(sessions) == []


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_valid_form_queues_one_run_and_opens_it(settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    at.text_input(key="name").set_value("form-run")
    at.text_input(key="tags").set_value("ui, smoke")
    at.number_input(key="launch.nproc_per_node").set_value(1)
    at.number_input(key="train.max_steps").set_value(50)
    at.number_input(key="train.lr").set_value(0.002)
    start(at)
    no_exception(at)
    assert not at.error

    runs = queued_runs(sessions)
    assert len(runs) == 1
    assert runs[0]["name"] == "form-run"
    assert runs[0]["status"] == "QUEUED"
    with sessions() as s:
        config = queries.run_detail(s, runs[0]["id"])["config"]
    assert config["tags"] == ["ui", "smoke"]
    assert config["launch"]["nproc_per_node"] == 1
    assert config["train"]["max_steps"] == 50
    assert config["train"]["lr"] == pytest.approx(0.002)
    assert (Path(settings.run_dir(runs[0]["id"])) / "config.json").is_file()

    # The page switched to the new run.
    assert at.query_params["run"] == str(runs[0]["id"])
    assert f"#{runs[0]['id']} form-run" in at.markdown[0].value
    assert "QUEUED" in at.markdown[0].value


def test_errors_clear_after_a_corrected_submit(settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    at.number_input(key="train.lr").set_value(-1.0)
    start(at)
    assert at.error
    at.number_input(key="train.lr").set_value(0.001)
    at.number_input(key="launch.nproc_per_node").set_value(1)
    start(at)
    no_exception(at)
    assert len(queued_runs(sessions)) == 1
    at.switch_page("views/new_run.py").run()
    assert not at.error


PASTED = 'name = "pasted"\n[launch]\nnproc_per_node = 1\n[train]\nmax_steps = 40\nlr = 0.005\n'


def paste(at: AppTest, text: str) -> None:
    """Type ``text`` into the paste box (part of the form: it is sent with the next press)."""
    at.text_area(key="new_run_pasted").input(text)


def press(at: AppTest, label: str) -> AppTest:
    return next(b for b in at.button if b.label == label).click().run()


def test_a_pasted_toml_is_what_starts_never_the_forms_defaults(settings: Settings,
                                                                sessions: sessionmaker[Session]) -> None:
    """Start with a paste the form does not hold yet: the form is filled from it and nothing starts
    (the page says so); the next Start queues what was pasted. Before, the form's defaults (run,
    2 ranks, 3000 steps) were queued and the paste silently dropped."""
    at = open_page("views/new_run.py")
    paste(at, PASTED)
    start(at)
    no_exception(at)
    assert queued_runs(sessions) == []
    assert any("Not started" in w.value and "pasted TOML was not in the form" in w.value for w in at.warning)
    assert at.text_input(key="name").value == "pasted" and at.number_input(key="train.max_steps").value == 40
    start(at)
    (run,) = queued_runs(sessions)
    with sessions() as s:
        config = queries.run_detail(s, run["id"])["config"]
    assert (config["name"], config["launch"]["nproc_per_node"], config["train"]["max_steps"]) == ("pasted", 1, 40)
    assert config["train"]["lr"] == pytest.approx(0.005)


def test_a_paste_applied_with_fill_the_form_keeps_the_persons_later_edits(settings: Settings,
                                                                          sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    paste(at, PASTED)
    press(at, "Fill the form")
    assert any("Form filled from the pasted TOML" in m.value for m in at.success)
    at.text_input(key="name").set_value("edited")
    start(at)
    no_exception(at)
    (run,) = queued_runs(sessions)
    assert run["name"] == "edited"  # the same paste is not applied again over the edit
    with sessions() as s:
        assert queries.run_detail(s, run["id"])["config"]["train"]["max_steps"] == 40


def test_a_paste_that_is_not_toml_refuses_every_start_until_it_is_fixed_or_cleared(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    paste(at, 'name = "half\n[train\n')
    for _ in range(2):
        start(at)
        no_exception(at)
        assert any("the pasted TOML was not loaded" in as_read(e.value) for e in at.error)
        assert queued_runs(sessions) == []
    paste(at, "")
    start(at)
    assert [r["name"] for r in queued_runs(sessions)] == ["run"]  # what the form shows, the box empty


def test_new_run_form_shows_the_chosen_kinds_fields_and_queues_a_gpt_char_run(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    keys = {w.key for w in at.number_input} | {w.key for w in at.selectbox}
    assert "workload.hidden" in keys and not keys & {"workload.n_layer", "parallel.strategy"}
    at.selectbox(key="workload.kind").set_value("gpt-char").run()
    no_exception(at)
    keys = {w.key for w in at.number_input} | {w.key for w in at.selectbox}
    assert {"workload.n_layer", "workload.n_embd", "parallel.strategy", "train.precision"} <= keys
    assert "workload.hidden" not in keys
    assert at.number_input(key="workload.n_layer").label == "Transformer blocks (n_layer)"
    at.number_input(key="workload.n_layer").set_value(2)
    at.number_input(key="train.grad_accum").set_value(2)
    at.number_input(key="launch.nproc_per_node").set_value(1)
    at.checkbox(key="train.compile").check()
    next(b for b in at.button if "Start" in b.label).click().run()
    no_exception(at)
    assert not at.error
    (run,) = queued_runs(sessions)
    with sessions() as s:
        config = queries.run_detail(s, run["id"])["config"]
    assert (config["workload"]["kind"], config["workload"]["n_layer"]) == ("gpt-char", 2)
    assert (config["train"]["grad_accum"], config["train"]["compile"]) == (2, True)


class TrainWithSmoothing(TrainConfig):
    label_smoothing: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    """Share of the target probability spread over the other classes."""


class RunConfigWithSmoothing(RunConfig):
    """A RunConfig with a field the page has never heard of."""

    train: TrainWithSmoothing = Field(default=TrainWithSmoothing(), json_schema_extra={"common": True})


def test_a_field_added_to_the_config_appears_on_the_new_run_page(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """No UI edit: the page draws whatever RunConfig declares."""
    monkeypatch.setattr("db.vocabulary.config.RunConfig", RunConfigWithSmoothing)
    at = open_page("views/new_run.py")
    no_exception(at)
    smoothing = at.number_input(key="train.label_smoothing")
    assert (smoothing.label, smoothing.value, smoothing.min, smoothing.max) == ("Label smoothing", 0.0, 0.0, 1.0)
    assert smoothing.help.startswith("Share of the target probability spread over the other classes.")


def test_new_run_form_queues_a_script_run_with_its_arguments(sessions: sessionmaker[Session], tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text("print('hello')\n")
    at = open_page("views/new_run.py")
    at.selectbox(key="workload.kind").set_value("script").run()  # the script fields appear for kind = script
    at.text_input(key="workload.script").input(str(script))
    at.text_input(key="workload.args").input("--steps 5 --name 'a b'")
    at.number_input(key="retry.max_retries").set_value(1)
    next(b for b in at.button if "Start" in b.label).click().run()
    no_exception(at)
    with sessions() as s:
        (run,) = run_list.list_runs(s)
        detail = queries.run_detail(s, run["id"])
    assert detail["config"]["workload"] == {**detail["config"]["workload"], "kind": "script", "script": str(script),
                                            "args": ["--steps", "5", "--name", "a b"]}
    assert detail["config"]["retry"]["max_retries"] == 1


def start_script_run(at: AppTest, script: Path | str, args: str = "") -> AppTest:
    at.selectbox(key="workload.kind").set_value("script").run()  # the script fields appear for kind = script
    at.text_input(key="workload.script").input(str(script))
    at.text_input(key="workload.args").input(args)
    at.number_input(key="launch.nproc_per_node").set_value(1)
    return next(b for b in at.button if "Start" in b.label).click().run()


def test_new_run_refuses_a_script_outside_the_roots_then_queues_one_inside(
        settings: Settings, sessions: sessionmaker[Session], tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("elsewhere") / "train.py"  # beside the home, not in it
    outside.write_text("print('hello')\n")
    at = start_script_run(open_page("views/new_run.py"), outside)
    no_exception(at)
    (error,) = refusals(at)
    assert error.startswith(f"workload.script = {str(outside)!r}: {outside.resolve()} is outside")
    assert f"{Path.cwd().resolve()}, {settings.home}" in error  # the roots: where the UI started, the data folder
    assert "RUNYARD_SCRIPT_ROOTS" in error and "`runyard submit`" in error
    assert queued_runs(sessions) == []

    inside = settings.home / "train.py"
    inside.write_text("print('hello')\n")
    at = start_script_run(at, inside)
    no_exception(at)
    (run,) = queued_runs(sessions)
    with sessions() as s:
        assert queries.run_detail(s, run["id"])["config"]["workload"]["script"] == str(inside)


def test_new_run_refuses_the_standard_library_with_a_command_in_its_arguments(
        settings: Settings, sessions: sessionmaker[Session], monkeypatch: pytest.MonkeyPatch) -> None:
    """The reported attack, with a root as wide as / set: timeit.py runs its -s setup as Python."""
    monkeypatch.setenv("RUNYARD_SCRIPT_ROOTS", "/")
    timeit = Path(sysconfig.get_paths()["stdlib"]) / "timeit.py"
    at = start_script_run(open_page("views/new_run.py"), timeit, "-s 'import os; os.system(\"cat /etc/shadow\")' pass")
    no_exception(at)
    (error,) = refusals(at)
    assert error.startswith(f"workload.script = {str(timeit)!r}")
    assert "refused even under the folders the UI may launch from: / (RUNYARD_SCRIPT_ROOTS)" in error
    assert queued_runs(sessions) == []


def add_forkable(sessions: sessionmaker[Session], settings: Settings, name: str = "parent") -> tuple[int, int]:
    """A cancelled run with one verified checkpoint at step 100; returns (run id, checkpoint id)."""
    with sessions() as s:
        parent = add_run(s, settings, name, RunStatus.CANCELLED, lr=0.001)
        add_attempt(s, parent, 120, AttemptStatus.CANCELLED)
        checkpoint = Checkpoint(run_id=parent, attempt=1, step=100, path="/c/step-100", bytes=10, sha256="0",
                                params_digest="0", blocked_s=1.0, total_s=2.0, created_at=time.time())
        s.add(checkpoint)
        s.commit()
        return parent, checkpoint.id


def test_a_checkpoint_that_is_not_the_runs_own_is_never_preselected_and_says_whose_it_is(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """Issue 52 item 1: a run paused before its first own save lists the ckpt.pt that was in its
    working folder before it started; Resume and Fork preselected it (the newest), and its
    checkpoint list said only "verified: yes"."""
    with sessions() as s:
        run_id = add_run(s, settings, "paused", RunStatus.STARTING, RunStatus.RUNNING, RunStatus.PAUSING,
                         RunStatus.PAUSED)
        add_attempt(s, run_id, 70, AttemptStatus.PAUSED)
        s.add(Checkpoint(run_id=run_id, attempt=1, step=1500, path="/w/out/ckpt.pt", origin="/w/out/ckpt.pt",
                         source="script", bytes=10, sha256="ab" * 32, params_digest="", blocked_s=0.0, total_s=0.0,
                         created_at=time.time(), file_mtime=time.time() - 3600, verified=True,
                         refused_reason="existed before the run started (written at ...): not chosen automatically; "
                                        "probably run 7's ('nanogpt-a'), which recorded the same file at step 1500"))
        s.commit()
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    assert at.selectbox(key=f"resume-from-{run_id}").value is None  # a person chooses it, or nothing
    assert at.selectbox(key=f"fork-from-{run_id}").value is None
    at = show_section(at, "Checkpoints")
    assert any("yes; not this run's own: existed before the run started" in m.value and "probably run 7's" in m.value
               for m in at.markdown), [m.value for m in at.markdown]


def test_fork_opens_the_new_run_form_filled_shows_the_changes_then_queues_the_fork(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    parent, checkpoint = add_forkable(sessions, settings)
    at = open_page("views/run.py", run=str(parent))
    no_exception(at)
    # Fork… in the header lists the checkpoint; its button opens the New run page for it.
    assert at.selectbox(key=f"fork-from-{parent}").value == checkpoint
    at.button(key=f"fork-open-{parent}").click().run()
    no_exception(at)
    assert at.query_params["fork"] == str(parent) and at.query_params["checkpoint"] == str(checkpoint)
    assert at.text_input(key="name").value == "parent-fork"  # every value from the run's config
    assert at.number_input(key="train.max_steps").value == 300
    assert at.number_input(key="train.lr").value == pytest.approx(0.001)
    assert any(f"No changes yet against run #{parent} at step 100" in i.value for i in at.info)
    # AppTest reruns the page it was switched to last, not the one st.switch_page opened: open it.
    at = open_page("views/new_run.py", fork=str(parent), checkpoint=str(checkpoint))
    assert at.text_input(key="name").value == "parent-fork"
    at.number_input(key="train.lr").set_value(0.0005)
    start(at)
    no_exception(at)
    # The first Start shows the changes (not seen before) and asks again; nothing is queued yet.
    changes = next(as_read(i.value) for i in at.info if i.value.startswith("**Changes against"))
    assert f"run #{parent} at step 100** (1)" in changes and "train.lr: 0.001 → 0.0005" in changes
    assert any("press Start again to fork" in w.value for w in at.warning)
    assert [r["id"] for r in queued_runs(sessions)] == [parent]
    start(at)
    no_exception(at)
    runs = queued_runs(sessions)
    assert len(runs) == 2
    with sessions() as s:
        fork = s.get(Run, max(r["id"] for r in runs))
        source = json.loads(s.get(Run, parent).config_json)
        config = json.loads(fork.config_json)
        assert config == {**source, "name": "parent-fork", "train": {**source["train"], "lr": 0.0005}}
        assert (fork.parent_run_id, fork.parent_step) == (parent, 100)
        assert s.get(Checkpoint, checkpoint).pinned  # the fork's origin is kept from retention
        events = [e.message for e in s.query(Event).filter_by(run_id=fork.id, kind="fork")]
        assert events == [f"forked from run {parent} at step 100 with train.lr=0.0005"]


def test_fork_that_switches_to_a_script_outside_the_roots_is_refused(
        settings: Settings, sessions: sessionmaker[Session], tmp_path_factory: pytest.TempPathFactory) -> None:
    outside = tmp_path_factory.mktemp("elsewhere") / "train.py"
    outside.write_text("print('hello')\n")
    parent, checkpoint = add_forkable(sessions, settings)
    at = open_page("views/new_run.py", fork=str(parent), checkpoint=str(checkpoint))
    no_exception(at)
    at.selectbox(key="workload.kind").set_value("script").run()
    at.text_input(key="workload.script").set_value(str(outside))
    start(at)
    no_exception(at)
    (error,) = refusals(at)
    assert f"workload.script = {str(outside)!r}: {outside.resolve()} is outside" in error
    assert [r["id"] for r in queued_runs(sessions)] == [parent]


def test_a_fork_of_a_checkpoint_that_cannot_be_used_says_why_and_shows_a_fresh_form(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    parent, checkpoint = add_forkable(sessions, settings)
    at = open_page("views/new_run.py", fork=str(parent), checkpoint=str(checkpoint + 1))
    no_exception(at)
    assert any(f"checkpoint={checkpoint + 1}: no such checkpoint in run {parent}" in as_read(e.value)
               for e in at.error)
    assert at.text_input(key="name").value != "parent-fork"


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
    summary, diff = at.table
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


# -- Settings page --------------------------------------------------------------------------


def test_settings_page_shows_the_price_table(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        set_prices(s, {"cpu-node": 0.5, "H100": 3.5})
        s.commit()
    at = open_page("views/settings.py")
    no_exception(at)
    table = at.dataframe[0].value
    assert dict(zip(table["device"], table["usd_per_hour"], strict=True)) == {"H100": 3.5, "cpu-node": 0.5}
    assert [b.label for b in at.button][:1] == ["Save prices"]


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_edited_prices_apply_to_new_runs_only(settings: Settings, sessions: sessionmaker[Session]) -> None:
    """The price is snapshotted at submit: editing the table (what the Settings page's Save
    does) changes new runs, not submitted ones. AppTest cannot edit a data_editor's cells, so
    the save is called directly."""
    cpu = Inventory(kind="cpu", slots=2)
    submit(sessions, settings, RunConfig(name="before"), cpu)
    assert data_module().save_prices({"cpu-node": 0.50, "H100": 3.50}) is None
    submit(sessions, settings, RunConfig(name="after"), cpu)
    with sessions() as s:
        by_name = {r["name"]: r for r in run_list.list_runs(s)}
        assert queries.price_table(s) == {"cpu-node": 0.50, "H100": 3.50}
    assert by_name["before"]["price_usd_per_hour"] == pytest.approx(0.10)  # 2 of 2 slots at the default $0.10
    assert by_name["after"]["price_usd_per_hour"] == pytest.approx(0.50)


def data_module():  # type: ignore[no-untyped-def]
    return data


def test_negative_price_is_refused(sessions: sessionmaker[Session]) -> None:
    with sessions() as s, pytest.raises(RequestRefused, match="non-negative"):
        set_prices(s, {"cpu-node": -1.0})


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_runs_page_filters_by_tag(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        for name, tags in (("a", ["baseline"]), ("b", ["sweep", "lr"]), ("c", [])):
            config = RunConfig.model_validate({"name": name, "tags": tags})
            run = create_run(s, config, settings.runs_dir, Price(1.0, "x"))
            s.flush()
            assert run.id
        s.commit()
    at = new_app().run()
    no_exception(at)
    assert at.multiselect[1].options == ["baseline", "lr", "sweep"]
    at.multiselect[1].set_value(["sweep"]).run()
    assert at.dataframe[0].value["name"].tolist() == ["b"]


# -- single sign-on -------------------------------------------------------------------------


def test_with_oidc_configured_the_pages_wait_for_the_sign_in(seeded: dict[str, int]) -> None:
    at = new_app()
    at.secrets["auth"] = {"redirect_uri": "http://127.0.0.1:8501/oauth2callback", "cookie_secret": "x" * 32,
                          "client_id": "runyard", "client_secret": "s",
                          "server_metadata_url": "https://id.example/.well-known/openid-configuration"}
    at.run()
    no_exception(at)
    assert [b.label for b in at.button] == ["Log in"]
    assert not at.dataframe  # no run is shown before the sign-in


def test_without_oidc_the_pages_show_at_once(seeded: dict[str, int]) -> None:
    at = new_app().run()
    no_exception(at)
    assert "Log in" not in [b.label for b in at.button]
    assert at.dataframe


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_the_pin_toggle_pins_once_and_a_refused_pin_springs_back(settings: Settings,
                                                                 sessions: sessionmaker[Session]) -> None:
    now = time.time()
    with sessions() as s:
        run_id = add_run(s, settings, "pins", RunStatus.CANCELLED)
        add_attempt(s, run_id, 200, AttemptStatus.CANCELLED)
        ours = Checkpoint(run_id=run_id, attempt=1, step=100, path="/c/step-100", bytes=10, sha256="0",
                          params_digest="0", blocked_s=1.0, total_s=2.0, created_at=now)
        gone = str(settings.home / "out" / "ckpt.pt")  # the script's file, no longer on disk
        theirs = Checkpoint(run_id=run_id, attempt=1, step=200, path=gone, origin=gone, source="script", bytes=10,
                            sha256="1" * 64, params_digest="", blocked_s=0.0, total_s=0.0, created_at=now,
                            file_mtime=now)
        s.add_all([ours, theirs])
        s.commit()
        ours_id, theirs_id = ours.id, theirs.id
    at = show_section(open_page("views/run.py", run=str(run_id)), "Checkpoints")
    at.toggle(key=f"pin-{ours_id}").set_value(True).run()
    no_exception(at)
    at.toggle(key=f"pin-{theirs_id}").set_value(True).run()
    no_exception(at)
    (error,) = [e.value for e in at.error]
    assert error.startswith(f"cannot pin checkpoint {theirs_id}")
    assert at.toggle(key=f"pin-{theirs_id}").value is False  # back off: not asked again on each refresh
    with sessions() as s:
        assert (s.get(Checkpoint, ours_id).pinned, s.get(Checkpoint, theirs_id).pinned) == (True, False)
    at.run()
    assert not at.error


def test_a_failed_run_names_the_failing_rank_and_its_exception_at_the_top(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    tail = ("[rank1]: Traceback (most recent call last):\n[rank1]:   File \"train.py\", line 74, in _run_batch\n"
            "[rank1]: ValueError: bad batch at step 50\n")
    run_id = add_failed_run(sessions, settings, "ValueError: bad batch at step 50 (at train.py:74 in _run_batch)",
                            tail)
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    first = at.error[0].value
    assert first.startswith(r"**Attempt 1: rank 1 failed (USER_ERROR)**: ValueError\: bad batch at step 50"), first
    assert r"First error line: Traceback \(most recent call last\)\:" in [c.value for c in at.caption]
    assert tail.strip() in [c.value for c in at.code]


def test_a_failure_message_with_markup_shows_as_written(settings: Settings, sessions: sessionmaker[Session]) -> None:
    """Issue 25 item 2: a rank's exception carrying an image link, bold, LaTeX and HTML reached the
    Run page's header as Markdown (the viewer's browser fetched the image)."""
    evil = r"![b](http://127.0.0.1:9/beacon.png) **x** $\frac12$ <img src=x>"
    with sessions() as s:
        run_id = add_run(s, settings, "evil", RunStatus.STARTING, RunStatus.RUNNING)
        assert transition(s, run_id, RunStatus.FAILED, evil)
        s.commit()
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    caption = next(c.value for c in at.caption if "beacon" in c.value)
    # Every markup character is escaped: Markdown shows each as itself, nothing is interpreted.
    for special in ("![", "](", "**", "<img"):
        assert special not in caption, (special, caption)
    assert caption.count("$") == caption.count("\\$") == 2, caption  # LaTeX needs a bare $
    assert caption.replace("\\", "").replace("&lt;", "<").replace("&gt;", ">") == evil.replace("\\", "")


# -- text a run controls reaches the page as text (issue 25 item 2) ---------------------------

EVIL = r"![b](http://127.0.0.1:9/beacon.png) **x** $\frac12$ <img src=x>"


def page_texts(at: AppTest) -> list[str]:
    """Every text the page hands Streamlit's Markdown renderer: markdown, captions, alerts,
    expander labels and the cells, columns and index of static tables (``st.table``)."""
    texts = [e.value for kind in ("markdown", "caption", "error", "warning", "info", "success")
             for e in getattr(at, kind)]
    texts += [e.label for e in at.expander]
    for table in at.table:
        frame = table.value
        texts += [str(v) for v in frame.to_numpy().ravel()] + [str(c) for c in frame.columns]
        texts += [str(i) for i in frame.index]
    return texts


def assert_inert(at: AppTest, needle: str = "beacon") -> list[str]:
    """The texts carrying ``EVIL`` (at least one) show it as written: no image link, bold or HTML
    tag left for Markdown to read, every ``$`` escaped (LaTeX needs a bare one)."""
    hits = [t for t in page_texts(at) if needle in t]
    assert hits, page_texts(at)
    for text in hits:
        for special in ("![", "](", "**x", "<img"):
            assert special not in text, (special, text)
        assert text.count("$") == text.count("\\$"), text
    return hits


def test_a_run_name_with_markup_shows_as_text_on_the_run_and_fork_pages(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """A run's name (stored by an older version, or through the database) with markup: the Run
    page's title and the New run page's fork banner show it as written."""
    parent, checkpoint = add_forkable(sessions, settings)
    with sessions() as s:
        s.get(Run, parent).name = EVIL
        s.commit()
    at = open_page("views/run.py", run=str(parent))
    no_exception(at)
    assert_inert(at)
    at = open_page("views/new_run.py", fork=str(parent), checkpoint=str(checkpoint))
    no_exception(at)
    assert any(t.startswith(f"**Fork of run #{parent} ") for t in assert_inert(at))


def test_a_failing_attempts_exception_with_markup_shows_as_text(settings: Settings,
                                                                sessions: sessionmaker[Session]) -> None:
    """The exception of a failed attempt, its reason and its first error line: at the top of the
    Run page and in Attempts & logs, as written."""
    tail = f"[rank1]: Traceback (most recent call last):\n[rank1]: ValueError: {EVIL}\n"
    run_id = add_failed_run(sessions, settings, f"ValueError: {EVIL}", tail, reason=f"crashed: {EVIL}")
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    assert any(t.startswith(r"**Attempt 1: rank 1 failed (USER_ERROR)**: ValueError\: ") for t in assert_inert(at))
    logs = assert_inert(show_section(at, "Attempts & logs"))
    assert any(t.startswith(r"Attempt 1: crashed\: ") for t in logs), logs  # the log tail's expander
    assert tail.strip() in [c.value for c in at.code]  # the log itself as a code block, verbatim


def test_an_event_message_with_markup_shows_as_text(seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    """An event's message (a rank's warning) is a cell of the events grid, verbatim, and reaches no
    Markdown."""
    with sessions() as s:
        s.add(Event(run_id=seeded["running"], attempt=1, at=time.time(), level="warning", kind="straggler",
                    message=EVIL))
        s.commit()
    at = open_page("views/run.py", run=str(seeded["running"]))
    no_exception(at)
    events = next(d.value for d in at.dataframe if "message" in d.value)
    assert list(events["message"]) == [EVIL]
    assert not any("beacon" in t for t in page_texts(at))


def test_a_metric_key_with_markup_shows_as_text(seeded: dict[str, int], sessions: sessionmaker[Session]) -> None:
    """A metric key a script chose: the latest-values table (``st.table`` reads Markdown) and the
    checkpoint table's metrics show it as written."""
    run_id = seeded["running"]
    with sessions() as s:
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=120, key=EVIL, value=1.5,
                                           wall_time=time.time())])
        s.add(Checkpoint(run_id=run_id, attempt=1, step=100, path="/c/step-100", bytes=10, sha256="0",
                         params_digest="0", blocked_s=1.0, total_s=2.0, created_at=time.time(),
                         metrics_json=json.dumps({EVIL: 1.5})))
        s.commit()
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    assert_inert(at)
    assert any("beacon" in t for t in assert_inert(show_section(at, "Checkpoints")))




def test_a_metric_key_with_markup_shows_as_text_on_the_compare_page(seeded: dict[str, int],
                                                                    sessions: sessionmaker[Session]) -> None:
    """The Compare summary (``st.table`` of a Styler) and its caption name the key as written, and
    the table keeps the plain row numbers hidden (Streamlit hides only a RangeIndex)."""
    run_id = seeded["running"]
    with sessions() as s:
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=120, key=EVIL, value=1.5,
                                           wall_time=time.time())])
        s.commit()
    at = open_page("views/compare.py", runs=str(run_id), metrics=EVIL)
    no_exception(at)
    assert_inert(at)
    (table,) = at.table
    assert isinstance(table.value.index, pd.RangeIndex)
    assert f"{EVIL} final" in as_read_frame(table.value).columns


def test_a_submit_answers_once_with_every_refusal_and_the_warnings(
        settings: Settings, sessions: sessionmaker[Session], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Issue 29, item 11: the model's checks across fields (all of them, not the first), the refused
    path and the learning-rate warning come in the one answer to Start; once the refusals are fixed,
    the next Start queues the run (the warning was seen beside them, and is not asked again)."""
    outside = tmp_path_factory.mktemp("elsewhere") / "input.txt"  # beside the home, not in it
    outside.write_text("to be or not to be\n" * 1000)
    at = open_page("views/new_run.py")
    at.selectbox(key="workload.kind").set_value("gpt-char").run()
    at.number_input(key="workload.n_embd").set_value(100)
    at.number_input(key="workload.n_head").set_value(3)
    at.text_input(key="workload.text").input(str(outside))
    at.number_input(key="train.lr").set_value(50.0)
    at.selectbox(key="parallel.strategy").set_value("fsdp")
    at.selectbox(key="train.precision").set_value("fp16")
    start(at)
    no_exception(at)
    errors = refusals(at)
    joined = " | ".join(errors)
    assert "workload.n_embd = 100 must be a multiple of workload.n_head = 3" in joined
    assert "train.precision = 'fp16' with parallel.strategy = 'fsdp' is not supported" in joined
    assert f"workload.text = {str(outside)!r}: {outside.resolve()} is outside" in joined
    (warning,) = [as_read(w.value) for w in at.warning if "train.lr" in w.value]
    assert "Also check" in warning and "train.lr = 50.0: a learning rate above 1 usually diverges" in warning
    assert queued_runs(sessions) == []

    inside = settings.home / "input.txt"
    inside.write_text(outside.read_text())
    at.number_input(key="workload.n_head").set_value(4)
    at.text_input(key="workload.text").input(str(inside))
    at.selectbox(key="train.precision").set_value("bf16")
    at.selectbox(key="parallel.strategy").set_value("ddp")
    start(at)
    no_exception(at)
    assert not refusals(at)
    assert [r["name"] for r in queued_runs(sessions)] == ["run"]  # one Start, no second question about lr


def test_a_ranks_log_is_searched_highlighted_opened_at_its_first_error_and_downloadable(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """Issue 29, item 9, on the page: Attempts & logs opens on the failing rank's log, read from the
    run's folder, its markup shown as text; a search lists the matching lines with the matches
    marked; First error shows the log from the traceback; the rank's log and all of them download."""
    run_id = add_failed_run(sessions, settings, "ValueError: boom", "[rank1]: ValueError: boom\n")
    with sessions() as s:
        attempt_dir = Path(s.query(Attempt).filter_by(run_id=run_id).one().dir)
    body = "".join(f"step {i} loss {1 / i:.3f}\n" for i in range(1, 400))
    for rank in (0, 1):
        folder = attempt_dir / "ranks" / "abc_1" / "attempt_0" / str(rank)
        folder.mkdir(parents=True)
        (folder / "stdout.log").write_text(body if rank == 1 else "rank 0 waits\n")
        (folder / "stderr.log").write_text(f"[rank1]: Traceback (most recent call last):\n[rank1]: ValueError: {EVIL}\n"
                                           if rank == 1 else "")
    at = show_section(open_page("views/run.py", run=str(run_id)), "Attempts & logs")
    no_exception(at)
    assert at.selectbox(key=f"log-source-{run_id}").value == "rank 1"  # the failing rank
    logs = [h.proto.body for h in at.html if "runyard-log" in h.proto.body and "<pre>" in h.proto.body]
    stderr, stdout = logs  # in the files' order
    assert "step 399 loss" in stdout and "step 99 loss" not in stdout  # its end (the last 300 lines)
    assert "<img" not in stderr and "&lt;img src=x&gt;" in stderr
    assert "runyard-log-follow" not in stdout  # a finished run's log is not followed

    at.text_input(key=f"log-search-{run_id}").input("loss 0.5").run()
    stdout = [h.proto.body for h in at.html if "<pre>" in h.proto.body][1]
    assert stdout.count("<mark>loss 0.5</mark>") == 1 and "step 2 " in stdout  # "step 2 loss 0.500"
    assert any(as_read(c.value).startswith("stdout.log: 1 line(s) with") for c in at.caption)

    at.text_input(key=f"log-search-{run_id}").input("").run()
    at.button(key=f"log-error-button-{run_id}").click().run()
    assert any(as_read(c.value) == "stderr.log: from the first error, line 1" for c in at.caption)
    error_log = next(h.proto.body for h in at.html if "runyard-log-error" in h.proto.body)
    assert "Traceback" in error_log
    at.button(key=f"log-prepare-zip-{run_id}").click().run()
    (save,) = at.get("download_button")
    assert save.proto.label.startswith(f"Save run-{run_id}-logs.zip")


def test_a_loss_spanning_more_than_two_decades_opens_on_a_log_axis_until_a_person_chooses(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """Issue 29, item 6: on the Overview and the Metrics section; unpicked, it stays linear."""
    with sessions() as s:
        run_id = add_run(s, settings, "decades", RunStatus.STARTING, RunStatus.RUNNING)
        add_attempt(s, run_id, 2000)
        s.flush()
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=step, key=key, value=value,
                                           wall_time=1000.0 + step)
                                      for step in range(10, 2001, 10)
                                      for key, value in (("loss", 10.0 / step), ("step_time", 0.05 + step * 1e-6))])
        s.commit()

    def log_axes(at: AppTest) -> dict[str, bool]:
        return {chart_title(c): '"type": "log"' in json.dumps(chart_spec(c)) for c in metric_chart_elements(at)}

    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    assert log_axes(at)["Loss"] is True  # the Overview: 1 down to 0.005
    at = show_section(at, "Metrics")
    assert log_axes(at) == {"Loss": True, "Step time": False}  # 50 to 52 ms: linear
    assert at.button_group(key=f"log-{run_id}").value == ["loss"]
    at.button_group(key=f"log-{run_id}").set_value([]).run()
    assert log_axes(at)["Loss"] is False
    at.run()  # a live refresh keeps the person's choice
    assert log_axes(at)["Loss"] is False
