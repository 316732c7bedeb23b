"""Text a run controls reaches the page as text (issue 25 item 2; ``app.style.plain`` and
``plain_frame``): a run's name, a failure message, an exception, an event message and a metric key
carrying an image link, bold, LaTeX and HTML show as written on every page that shows them.
"""

from __future__ import annotations

import json
import time

import pandas as pd
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest

from app.style import STATUS_BADGE, status_css
from db.metricstore import write_points
from db.models import Checkpoint, Event, Run
from db.states import RunStatus, transition
from db.vocabulary.settings import Settings
from tests.unit.app.pages import (
    EVIL,
    add_failed_run,
    add_forkable,
    add_run,
    as_read_frame,
    no_exception,
    open_page,
    seeded,
    sessions,
    settings,
    show_section,
)

__all__ = ["seeded", "sessions", "settings"]  # the fixtures, from the helper module


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
        s.get_one(Run, parent).name = EVIL
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
    Run page and in its Logs section, as written."""
    tail = f"[rank1]: Traceback (most recent call last):\n[rank1]: ValueError: {EVIL}\n"
    run_id = add_failed_run(sessions, settings, f"ValueError: {EVIL}", tail, reason=f"crashed: {EVIL}")
    at = open_page("views/run.py", run=str(run_id))
    no_exception(at)
    assert any(t.startswith(r"**Attempt 1: rank 1 failed (USER_ERROR)**: ValueError\: ") for t in assert_inert(at))
    logs = assert_inert(show_section(at, "Logs"))
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
    table, costs = at.table  # the summary, then the energy and cost table (no metric keys in it)
    assert all(isinstance(t.value.index, pd.RangeIndex) for t in (table, costs))
    assert f"{EVIL} final" in as_read_frame(table.value).columns


def test_status_fills_follow_the_theme_light_pastels_only_on_the_light_one() -> None:
    """Issue 56, item 6: a status cell on the dark theme is a translucent fill with light text, not
    the light theme's pastel with dark text."""
    for status in STATUS_BADGE:
        light, dark = status_css(status, dark=False), status_css(status, dark=True)
        assert light.startswith("background-color: #") and "rgba(" in dark and light != dark
        text = dark.rsplit("color: #", 1)[1]
        assert sum(int(text[i:i + 2], 16) for i in (0, 2, 4)) > 3 * 150  # light text on the dark grid
    assert status_css("FAILED") == status_css("FAILED", dark=False)  # outside a browser session: light
