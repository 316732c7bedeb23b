"""The sweep page in a real Chromium against the real product (`runyard up`).

A finished grid sweep of nine trials (three learning rates on a log scale, three widths) is
written into the data folder the way the scheduler's sweeps job leaves one (``create_sweep``, each
trial a SUCCEEDED run with an attempt and its eval_loss from rank 0, the trial row with its
objective), with no training: the page is what is tested. A person opens the sweep's page and
checks:

- the parallel coordinates are drawn: an axis per key of the space and one for the objective, a
  line per trial;
- a drag along the learning rate's axis brushes its top end: the caption and the trial table keep
  exactly the three trials with the largest learning rate; Clear brush shows the nine again;
- the parameter importance is drawn, and names both keys.

    pytest -m browser tests/browser/test_sweep_browser.py
"""

from __future__ import annotations

import json
import math
import time
from pathlib import Path
from typing import Any

import pytest

from db.engine import make_engine, make_sessionmaker
from db.metricstore import write_points
from db.models import Attempt, SweepTrial
from db.requests import create_run
from db.states import RunStatus, transition
from db.sweeps.requests import create_sweep
from db.sweeps.states import SweepStatus, sweep_transition
from db.vocabulary.config import RunConfig, parse_config
from db.vocabulary.cost import Price

pytestmark = pytest.mark.browser

PAGE_TIMEOUT_MS = 60_000
LRS = (1e-3, 1e-2, 1e-1)
WIDTHS = (32, 64, 128)
SWEEP = {"name": "grid", "train": {"max_steps": 50},
         "sweep": {"metric": "eval_loss", "searcher": "grid", "max_trials": 9, "max_concurrent": 2,
                   "space": {"train.lr": {"log_uniform": [1e-3, 1e-1], "points": 3},
                             "workload.hidden": {"choice": list(WIDTHS)}}}}


def expect(target: Any) -> Any:
    from playwright.sync_api import expect as pw_expect  # noqa: PLC0415 - optional: the browser fixture says how to install Playwright

    return pw_expect(target)


def objective(lr: float, hidden: int) -> float:
    """The learning rate matters most, the width a little."""
    return 1.0 + math.log10(lr) * 0.3 + hidden / 1000


def seed_sweep(db_url: str, runs_dir: Path) -> int:
    """The finished grid sweep (see the module docstring); its id."""
    engine = make_engine(db_url)
    now = time.time()
    try:
        with make_sessionmaker(engine)() as s:
            sweep = create_sweep(s, parse_config(SWEEP), [], now=now - 300)
            for number, (lr, hidden) in enumerate((lr, h) for lr in LRS for h in WIDTHS):
                run = create_run(s, RunConfig.model_validate({"name": f"grid-t{number}", "train": {"lr": lr}}),
                                 runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
                s.flush()
                for status in (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED):
                    assert transition(s, run.id, status, "seeded by the sweep browser test")
                s.add(Attempt(run_id=run.id, number=1, status="SUCCEEDED", dir=str(Path(run.run_dir) / "attempts"),
                              started_at=now - 200 + number, ended_at=now - 150 + number, last_step=50,
                              devices_json="[]"))
                value = objective(lr, hidden)
                s.flush()
                write_points(s.connection(), [dict(run_id=run.id, attempt=1, rank=0, step=step, key="eval_loss",
                                                   value=value + 1.0 / step, wall_time=now) for step in (10, 30, 50)])
                s.add(SweepTrial(sweep_id=sweep.id, number=number, run_id=run.id,
                                 params_json=json.dumps({"train.lr": lr, "workload.hidden": hidden}),
                                 rungs_json="{}", objective=value + 1.0 / 50, objective_step=50,
                                 created_at=now - 200 + number))
            # Ended: the scheduler's sweeps job leaves a finished sweep alone (no trial to start or promote).
            assert sweep_transition(s, sweep.id, SweepStatus.FINISHED, "seeded: every point of the grid tried")
            s.commit()
            return sweep.id
    finally:
        engine.dispose()


def table_trials(page: Any) -> list[str]:
    """The trial table's first column (st.dataframe keeps an accessible copy of its visible cells)."""
    rows = page.get_by_test_id("stDataFrame").locator("table[role='grid'] tbody tr")
    return [row.locator("td").first.inner_text().strip() for row in rows.all()]


def test_brush_the_parallel_coordinates_and_the_table_follows(page: Any, runyard_up: Any) -> None:
    sweep_id = seed_sweep(f"sqlite:///{runyard_up.home / 'runyard.db'}", runyard_up.home / "runs")
    page.goto(f"{runyard_up.url}/sweep?id={sweep_id}")
    expect(page.get_by_role("heading", name=f"Sweep #{sweep_id} grid", level=1)).to_be_visible(
        timeout=PAGE_TIMEOUT_MS)
    chart = page.locator(".runyard-parallel")
    expect(chart.locator("path.trial")).to_have_count(9, timeout=PAGE_TIMEOUT_MS)
    names = [t.strip() for t in chart.locator("text.axis-name").all_text_contents()]
    assert names == ["train.lr", "workload.hidden", "eval_loss (minimize)"]
    expect(page.get_by_test_id("stException")).to_have_count(0)
    expect(page.get_by_test_id("stDataFrame").locator("table[role='grid'] tbody tr")).to_have_count(9)

    # A drag along the learning rate's axis over its top end (1e-1, the axis's largest value).
    strip = chart.locator("rect.grab[data-key='train.lr']")
    box = strip.bounding_box()
    assert box is not None
    x = box["x"] + box["width"] / 2
    page.mouse.move(x, box["y"] + 1)
    page.mouse.down()
    page.mouse.move(x, box["y"] + box["height"] * 0.15, steps=5)
    page.mouse.up()
    expect(chart.locator("path.trial:not(.dimmed)")).to_have_count(3)
    expect(page.get_by_text("3 of 9 trials in the brush")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(page.get_by_test_id("stDataFrame").locator("table[role='grid'] tbody tr")).to_have_count(3)
    assert table_trials(page) == ["6", "7", "8"]  # lr 1e-1 with each width

    # Clear brush: every trial again.
    chart.get_by_role("button", name="Clear brush").click()
    rows = page.get_by_test_id("stDataFrame").locator("table[role='grid'] tbody tr")
    expect(rows).to_have_count(9, timeout=PAGE_TIMEOUT_MS)
    expect(chart.locator("path.trial.dimmed")).to_have_count(0)

    # The importance: a bar per key, the learning rate first.
    importance = page.get_by_test_id("stVegaLiteChart").filter(has_text="Parameter importance")
    expect(importance).to_have_count(1, timeout=PAGE_TIMEOUT_MS)
    labels = [t.strip() for t in importance.locator(".role-axis-label text").all_text_contents()]
    assert [label for label in labels if "." in label] == ["train.lr", "workload.hidden"], labels
