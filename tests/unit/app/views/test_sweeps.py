"""The Sweeps page (app/views/sweeps.py): every sweep with its state, best value, trials by state,
budget and ETA, linked to its page; and what it says before the first sweep."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from db.vocabulary.settings import Settings
from tests.unit.app.pages import add_sweep, no_exception, open_page, sessions, settings

__all__ = ["sessions", "settings"]  # the fixtures, from the helper module


def test_the_sweeps_page_lists_a_sweep_with_its_trials_by_state(settings: Settings,
                                                                sessions: sessionmaker[Session]) -> None:
    sweep_id = add_sweep(sessions, settings)
    at = open_page("views/sweeps.py")
    no_exception(at)
    assert at.title[0].value == "Sweeps"
    frame = at.dataframe[0].value
    row = frame.set_index("id").loc[sweep_id]
    assert row["sweep"] == f"sweep?id={sweep_id}"  # the link to its page
    assert (row["name"], row["state"], row["trials"]) == ("digits-lr", "RUNNING", "6 / 8")
    assert row["best"] == "0.28"  # trial 2: finished, the lowest eval_loss of the finished ones
    assert row["by state"] == "3 SUCCEEDED · 2 PRUNED · 1 RUNNING"
    assert row["left"].startswith("$") and "GPU-h" in row["spent"]  # a dollar budget, no GPU-hour limit
    assert row["ends"].startswith("in ")


def test_before_the_first_sweep_the_page_says_how_to_start_one(settings: Settings) -> None:
    at = open_page("views/sweeps.py")
    no_exception(at)
    said = at.info[0].value
    assert "runyard sweep start" in said and "New sweep" in said
    assert not at.dataframe
