"""The Run page's costs (app/run_panels.py's ``cost_tiles`` and ``cost_strip``): "Your cost" and
"Cloud reference" as two named tiles among the headline numbers, and one line under them with
each one's wasted part and, while the run goes on, its projected total; without a tariff, no
number and a link to Settings."""

from __future__ import annotations

from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt
from db.states import RunStatus
from db.vocabulary.settings import Settings
from db.vocabulary.settings_file import write_values
from tests.unit.app.pages import add_attempt, add_run, no_exception, open_page, seeded, sessions, settings

__all__ = ["seeded", "sessions", "settings"]  # the fixtures, from the helper module


def cost_panel(at) -> tuple[dict[str, str], list[str], list[str]]:
    """The panel's two numbers by label, its captions, and its links' labels."""
    metrics = {m.label: m.value for m in at.metric if m.label in ("Your cost", "Cloud reference")}
    captions = [c.value for c in at.caption]
    links = [e.proto.label for e in at.get("page_link")]
    return metrics, captions, links


def test_without_a_tariff_the_panel_links_to_settings(seeded: dict[str, int]) -> None:
    at = open_page("views/run.py", run=str(seeded["running"]))
    no_exception(at)
    metrics, captions, links = cost_panel(at)
    assert metrics["Your cost"] == "–"
    assert metrics["Cloud reference"].startswith("$")
    assert "**Cost so far** · Your cost: No electricity tariff set, so no cost of yours." in captions
    assert "Set your tariff in Settings" in links
    assert {m.label for m in at.metric} >= {"Energy", "Your cost", "Cloud reference"}
    assert "Cost so far" not in {m.label for m in at.metric}  # never a cost without its name


def test_with_a_tariff_both_lines_show_wasted_and_projected(settings: Settings,
                                                           seeded: dict[str, int]) -> None:
    write_values(settings.home, {("cost", "electricity_usd_per_kwh"): 0.30, ("cost", "hardware_usd_per_gpu"): 8760.0,
                                 ("cost", "hardware_life_years"): 1.0})
    at = open_page("views/run.py", run=str(seeded["running"]))
    no_exception(at)
    metrics, captions, links = cost_panel(at)
    assert metrics["Your cost"].startswith("$") and "Set your tariff in Settings" not in links
    yours = next(c for c in captions if "hardware" in c)
    assert "energy not measured" in yours and "wasted" in yours and "projected" in yours
    cloud = next(c for c in captions if c.startswith("Cloud reference: cpu-hour"))  # the unit it was priced with
    assert "wasted" in cloud and "projected" in cloud


def test_a_finished_run_shows_no_projection(settings: Settings, sessions: sessionmaker[Session]) -> None:
    write_values(settings.home, {("cost", "electricity_usd_per_kwh"): 0.30})
    with sessions() as s:
        run_id = add_run(s, settings, "done", RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED)
        add_attempt(s, run_id, last_step=300)
        s.flush()
        attempt = s.query(Attempt).filter_by(run_id=run_id).one()
        attempt.status, attempt.ended_at = "SUCCEEDED", attempt.started_at + 60
        s.commit()
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    _, captions, _ = cost_panel(at)
    assert [c for c in captions if "wasted" in c] and not [c for c in captions if "projected" in c]


