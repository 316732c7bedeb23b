"""The dashboard's pages as the unit tests open them: Streamlit's AppTest (tests/unit/apptest.py) on a
real, seeded database, and what the tests read off a page.

The fixtures point ``RUNYARD_HOME`` at ``tmp_path`` with the schema at head; the seeding helpers
write rows the way the scheduler and the ranks would (``create_run``, ``transition``, Attempt /
``write_points`` / SchedulerHeartbeat rows). AppTest renders ``@st.fragment`` bodies on a full run
(it cannot call them alone), so every check goes through ``at.run()``.
"""

from __future__ import annotations

import io
import json
import re
import shutil
import time
from collections.abc import Iterator
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pytest
import streamlit as st
from sqlalchemy.engine import make_url
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest

from db import run_list
from db.engine import make_engine, make_sessionmaker
from db.metricstore import write_points
from db.models import Attempt, Checkpoint, Run, SchedulerHeartbeat
from db.requests import create_run
from db.states import AttemptStatus, RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings, load_settings
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


def add_run(session: Session, settings: Settings, name: str, *path: RunStatus, **train: float) -> int:
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
            dir=str(Path(session.get_one(Run, run_id).run_dir) / "attempts" / "1"),
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
    """Choose one of the Run page's sections (Overview, Metrics, Logs, Checkpoints, Attempts,
    System, Config): only the chosen one is drawn."""
    at.segmented_control(key="section").set_value(section).run()
    no_exception(at)
    return at


def event_badges(at: AppTest) -> str:
    """The Run page's row of event badges (the header's first markdown is the title)."""
    return next(m.value for m in at.markdown[1:] if m.value.startswith(":") and "-badge[" in m.value)


def no_exception(at: AppTest) -> None:
    assert not at.exception, [e.value for e in at.exception]


class LiveChart:
    """A live run's chart as the browser holds it: the live component's messages (app/charts/live.py)
    applied one after another, as app/charts/live.js does: the spec of the last full one, each
    dataset's rows by id, inserts added and removes dropped. Read like an st.altair_chart element."""

    def __init__(self) -> None:
        self.spec: dict = {}
        self.rows: list[dict[int, dict]] = []
        self.seq: int | None = None
        self.base: int | None = None

    def apply(self, message: dict) -> bool:
        """Apply ``message``; False when it is a refresh on top of one this chart did not get."""
        if (message["seq"], message["base"]) == (self.seq, self.base):
            return True  # the same message read again
        if message["spec"] is not None:
            self.spec, self.rows = message["spec"], [{} for _ in message["inserts"]]
        elif message["base"] != self.seq:
            return False
        for d, columns in enumerate(message["inserts"]):
            for i in message["removes"][d]:
                del self.rows[d][i]
            for i, values in enumerate(columns["rows"]):
                self.rows[d][message["first_ids"][d] + i] = dict(zip(columns["fields"], values, strict=True))
        self.seq, self.base = message["seq"], message["base"]
        return True

    def frames(self) -> list[pd.DataFrame]:
        return [pd.DataFrame(list(rows.values())) for rows in self.rows]


def _live_charts(at: AppTest) -> list[LiveChart]:
    """The live charts on the page, each rebuilt from the messages this AppTest read for it. A
    test that ran the page again without reading them missed some: then, as the browser does, it
    asks for the whole chart (the trigger ``resync``: the page forgets what it sent) and runs again."""
    held: dict[str, LiveChart] = at.__dict__.setdefault("_live_charts", {})
    for _ in range(2):
        out, lost = [], []
        for element in at.get("bidi_component"):
            if element.proto.component_name != "runyard.live_chart":
                continue
            chart = held.setdefault(element.proto.id, LiveChart())
            if not chart.apply(json.loads(element.proto.json)):
                lost.append(element.proto.id.split("-", 2)[2])  # "$$ID-<hash>-<key>": the chart's key
            out.append(chart)
        if not lost:
            return out
        for key in lost:  # as the trigger ``resync`` with nothing held: the whole chart
            at.session_state[f"live-sent-{key}"].rewind(None)
        at.run()
    raise AssertionError("a live chart the page did not send whole after a resync")


def chart_spec(chart) -> dict:
    return chart.spec if isinstance(chart, LiveChart) else json.loads(chart.proto.spec)


def chart_title(chart) -> str:
    """The title of an st.altair_chart element or a live chart (a plain chart, or the first layer of one)."""
    spec = chart_spec(chart)
    return spec.get("title") or next(layer["title"] for layer in spec.get("layer", []) if "title" in layer)


def metric_chart_elements(at: AppTest) -> list:
    """The Run page's charts without the rank legend strip above them (a chart with a title): a
    finished run's st.altair_chart elements, a live run's live charts."""
    return [c for c in at.get("vega_lite_chart") if json.loads(c.proto.spec).get("title")] + _live_charts(at)


def chart_frames(chart) -> list[pd.DataFrame]:
    """Every dataset of a chart, as the browser has them."""
    if isinstance(chart, LiveChart):
        return chart.frames()
    return [pa.ipc.open_stream(io.BytesIO(d.data.data)).read_all().to_pandas() for d in chart.proto.datasets]


def chart_data(chart) -> pd.DataFrame:
    """The rows of a chart's first dataset, as the browser has them."""
    return chart_frames(chart)[0]


def chart_lines(chart) -> pd.DataFrame:
    """The rows of a metric chart's lines (not its band or NaN marks)."""
    return next(f for f in chart_frames(chart) if "rank" in f and "value" in f)


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


# -- text a run controls reaches the page as text (issue 25 item 2) ---------------------------

EVIL = r"![b](http://127.0.0.1:9/beacon.png) **x** $\frac12$ <img src=x>"


# -- a sweep with trials (the Sweeps and sweep pages) ------------------------------------------

SWEEP_FILE = {
    "name": "digits-lr", "train": {"max_steps": 90},
    "sweep": {"metric": "eval_loss", "max_trials": 8, "max_concurrent": 2, "early_stop": {"reduction": 3},
              "space": {"train.lr": {"log_uniform": [1e-4, 1e-1]}, "workload.hidden": {"choice": [32, 64, 128]}},
              "budget": {"usd": 5.0}},
}
# Per trial: its run's status, lr, hidden, {rung: [step, value]}, objective at the end (step 90).
SWEEP_TRIALS: list[tuple[str, float, int, dict[str, list[int | float]], float | None]] = [
    ("SUCCEEDED", 1e-3, 64, {"0": [10, 0.9], "1": [30, 0.5]}, 0.31),
    ("PRUNED", 1e-1, 32, {"0": [10, 2.1]}, None),
    ("SUCCEEDED", 3e-3, 128, {"0": [10, 0.8], "1": [30, 0.45]}, 0.28),
    ("PRUNED", 1e-4, 32, {"0": [10, 1.9]}, None),
    ("SUCCEEDED", 2e-2, 128, {"0": [10, 1.1], "1": [30, 0.7]}, 0.62),
    ("RUNNING", 5e-4, 64, {"0": [10, 1.0]}, None),
]


def add_sweep(sessions: sessionmaker[Session], settings: Settings) -> int:
    """A RUNNING sweep of :data:`SWEEP_TRIALS` as the scheduler's sweeps job leaves it: each trial a
    run (its status walked there, one attempt, eval_loss every 10 steps on rank 0; a stopped one
    with its checkpoint at its rung) with its trial row; returns the sweep's id."""
    from db.models import SweepTrial  # noqa: PLC0415 - only the sweep pages' tests need these
    from db.sweeps.requests import create_sweep  # noqa: PLC0415
    from db.vocabulary.config import parse_config  # noqa: PLC0415

    now = time.time()
    with sessions() as s:
        sweep = create_sweep(s, parse_config(SWEEP_FILE), [10, 30], now=now - 600)
        for number, (status, lr, hidden, rungs, objective) in enumerate(SWEEP_TRIALS):
            path = [RunStatus.STARTING, RunStatus.RUNNING]
            path += {"SUCCEEDED": [RunStatus.SUCCEEDED],
                     "PRUNED": [RunStatus.PAUSING, RunStatus.PRUNED]}.get(status, [])
            run_id = add_run(s, settings, f"digits-lr-t{number}", *path, lr=lr)
            last = 90 if status == "SUCCEEDED" else int(max(step for step, _ in rungs.values())) + 2
            s.add(Attempt(run_id=run_id, number=1, status="RUNNING", dir="/x", started_at=now - 500 + 10 * number,
                          ended_at=None if status == "RUNNING" else now - 400 + 10 * number, last_step=last,
                          devices_json="[]"))
            if status == "PRUNED":  # stopped at its rung's checkpoint: what a promotion continues from
                s.add(Checkpoint(run_id=run_id, attempt=1, step=10, path=f"/c/{run_id}/step-10", bytes=10, sha256="0",
                                 params_digest="0", blocked_s=1.0, total_s=2.0, created_at=now))
            s.flush()
            write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=step, key="eval_loss",
                                               value=2.0 / (step * lr * 100 + 1) + 0.01 * hidden / 64, wall_time=now)
                                          for step in range(10, last + 1, 10)])
            s.add(SweepTrial(sweep_id=sweep.id, number=number, run_id=run_id,
                             params_json=json.dumps({"train.lr": lr, "workload.hidden": hidden}),
                             rung=max(map(int, rungs)), rungs_json=json.dumps(rungs), objective=objective,
                             objective_step=90 if objective is not None else None, created_at=now - 500 + number,
                             prune_json='{"rung": 0, "step": 10, "value": 2.0, "cut": 1.0}' if status == "PRUNED"
                             else None))
        s.commit()
        return sweep.id
