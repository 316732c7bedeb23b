"""The New run page's estimate before Start: the pace of the most alike earlier run on this
database, its start-up, the machine's price; rough when only the workload matches; none
without an earlier run; a fork's steps from its checkpoint on; none for a run Start would refuse."""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.estimates import start_estimate
from db.models import Attempt
from db.requests import create_run
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from orchestrator.format import estimate_text
from tests.unit.app.pages import add_forkable, as_read, open_page, sessions, settings

# The pages' fixtures: each test's own home, and Streamlit's caches (the app's engine) emptied for it.
__all__ = ["sessions", "settings"]
PRICE = Price(usd_per_hour=0.36, unit="2/2 of a CPU node @ $0.36/h")


def add_trained(session: Session, settings: Settings, steps_per_s: float, startup_s: float, **train: object) -> int:
    """A run that trained 1,000 steps at ``steps_per_s`` after ``startup_s`` of start-up."""
    config = RunConfig.model_validate({"name": f"past-{steps_per_s}", "train": {"max_steps": 1000, **train}})
    run = create_run(session, config, settings.runs_dir, PRICE)
    session.flush()
    start = time.time() - 3600
    run.started_at = start
    first = start + startup_s
    session.add(Attempt(run_id=run.id, number=1, status="SUCCEEDED", dir=str(Path(run.run_dir) / "1"),
                        started_at=start, first_step_at=first, ended_at=first + 1000 / steps_per_s,
                        last_step=1000, resume_step=0))
    session.flush()
    return run.id


def test_the_pace_of_the_alike_run_gives_time_and_cost(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as s:
        alike = add_trained(s, settings, steps_per_s=50.0, startup_s=12.0)
        add_trained(s, settings, steps_per_s=5.0, startup_s=30.0, batch_size=512)  # newer, other batch size
        e = start_estimate(s, RunConfig.model_validate({"train": {"max_steps": 3000}}).as_dict(), PRICE)
    assert (e.like_run, e.exact) == (alike, True)
    assert e.steps_per_s == pytest.approx(50.0)
    assert e.seconds == pytest.approx(12.0 + 3000 / 50.0)
    assert e.cost_usd == pytest.approx(72.0 * 0.36 / 3600)
    assert estimate_text(e).startswith(f"About 1m 12s and $0.0072: 3,000 steps at 50 steps/s as run #{alike}")


def test_another_batch_size_gives_a_rough_estimate_and_nothing_alike_gives_the_price_only(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    config = RunConfig.model_validate({"train": {"max_steps": 3000, "batch_size": 32}}).as_dict()
    with sessions.begin() as s:
        none = start_estimate(s, config, PRICE)
        other = add_trained(s, settings, steps_per_s=40.0, startup_s=10.0)
        rough = start_estimate(s, config, PRICE)
        four_ranks = start_estimate(s, {**config, "launch": {"nproc_per_node": 4, "backend": "auto"}}, PRICE)
    assert none.seconds is None
    assert estimate_text(none) == ("no earlier run of this workload with these ranks has trained here, so no time "
                                   "yet. It will cost $0.36 per hour (2/2 of a CPU node @ $0.36/h); the Run page "
                                   "shows the ETA once it trains.")
    assert (rough.like_run, rough.exact) == (other, False)
    assert "(rough)" in estimate_text(rough)
    assert four_ranks.like_run is None  # another number of ranks trains at another pace


def test_the_new_run_page_shows_the_estimate_before_start(settings: Settings, sessions: sessionmaker[Session]) -> None:
    with sessions.begin() as s:
        past = add_trained(s, settings, steps_per_s=100.0, startup_s=15.0)
    at = open_page("views/new_run.py")
    shown = [as_read(i.value) for i in at.info if i.value.startswith("**Estimate**")]  # escaped Markdown, as read
    # The form's first run: 3,000 steps at the earlier run's 100 steps/s, plus its 15 s start-up.
    assert shown and "About 45s and $" in shown[0] and f"run #{past}" in shown[0], shown


def estimates_shown(at: object) -> list[str]:
    return [as_read(i.value) for i in at.info if i.value.startswith(("**Estimate**", "**No estimate**"))]  # type: ignore[attr-defined]


def test_a_fork_is_priced_for_the_steps_it_trains_from_its_checkpoint(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """A fork of a 300-step run from its checkpoint at step 100 trains 200 steps; before, the page
    priced all 300."""
    parent, checkpoint = add_forkable(sessions, settings)
    with sessions.begin() as s:
        past = add_trained(s, settings, steps_per_s=100.0, startup_s=15.0)
    at = open_page("views/new_run.py", fork=str(parent), checkpoint=str(checkpoint))
    (shown,) = estimates_shown(at)
    assert shown.startswith("**Estimate**: About 17s and $") and \
        f": 200 steps (from step 100 to 300) at 100 steps/s as run #{past} " in shown, shown
    with sessions() as s:
        e = start_estimate(s, RunConfig.model_validate({"train": {"max_steps": 300}}).as_dict(), PRICE, from_step=100)
    assert (e.steps, e.seconds) == (200, pytest.approx(15.0 + 2.0))


def test_a_config_start_would_refuse_is_not_priced_and_the_cpu_slots_are_named(settings: Settings) -> None:
    at = open_page("views/new_run.py")
    at.number_input(key="launch.nproc_per_node").set_value(64)
    next(b for b in at.button if b.label == "Update estimate").click().run()
    (shown,) = estimates_shown(at)
    assert shown.startswith("**No estimate**: as set, Start would refuse it:") and "RUNYARD_CPU_SLOTS=64" in shown
    next(b for b in at.button if b.label == "Start").click().run()
    assert estimates_shown(at) == ["**No estimate**: fix the problems above first"]
    assert any("RUNYARD_CPU_SLOTS=64 runyard up" in as_read(e.value) for e in at.error)
