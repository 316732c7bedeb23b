"""The Overview's curves (app/panels/overview.py): the loss and the headline metric until the
person pins others, then the pins this run has, in the run's order; every curve unpinned shows
none, with a line saying how to pin some; pinning on one run keeps the person's pins of metrics
that run does not have, for the runs that have them."""

from __future__ import annotations

import time

from sqlalchemy.orm import Session, sessionmaker

from app.panels.overview import pinned_after
from db.metricstore import write_points
from db.states import RunStatus
from db.vocabulary.settings import Settings
from tests.unit.app.pages import (
    add_attempt,
    add_run,
    chart_title,
    metric_chart_elements,
    no_exception,
    open_page,
    sessions,
    settings,
)

__all__ = ["sessions", "settings"]  # the fixtures, from the helper module


def test_pins_of_metrics_the_run_lacks_are_kept() -> None:
    assert pinned_after(None, ["loss", "lr"], ["lr"]) == ["lr"]
    assert pinned_after(("val/x", "loss"), ["loss", "lr"], ["lr"]) == ["val/x", "lr"]
    assert pinned_after(("loss",), ["loss"], []) == []


def test_the_overview_draws_the_pinned_curves_and_none_when_all_are_unpinned(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        run_id = add_run(s, settings, "pins", RunStatus.STARTING, RunStatus.RUNNING)
        add_attempt(s, run_id, last_step=20)
        s.flush()
        write_points(s.connection(), [dict(run_id=run_id, attempt=1, rank=0, step=step, key=key, value=1.0 + step,
                                           wall_time=time.time())
                                      for key in ("loss", "eval_accuracy", "lr", "train/grad_norm")
                                      for step in (10, 20)])
        s.commit()
    at = open_page("views/run.py", run=str(run_id))
    pins = at.button_group(key=f"pin-{run_id}")
    assert [chart_title(c) for c in metric_chart_elements(at)] == ["Loss", "Eval accuracy"]  # the defaults
    assert list(pins.value or ()) == ["loss", "eval_accuracy"]  # the pills say what is drawn
    pins.set_value(["train/grad_norm", "lr"]).run()
    no_exception(at)
    assert [chart_title(c) for c in metric_chart_elements(at)] == ["Learning rate", "train/grad_norm"]  # run's order
    at.button_group(key=f"pin-{run_id}").set_value([]).run()
    no_exception(at)
    assert metric_chart_elements(at) == []  # none pinned: no curve, not the defaults back
    assert list(at.button_group(key=f"pin-{run_id}").value or ()) == []
    assert any("Pin curves" in c.value for c in at.caption)  # and how to pin some
    assert metric_chart_elements(open_page("views/run.py", run=str(run_id))) == []  # in a new session too
