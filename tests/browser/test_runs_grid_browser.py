"""Nothing "None", "nan" or a raw key on any page, no Runs-list cell cut and the default columns
held by the grid without scrolling inside it, in a real Chromium at 1280x800 and 1440x900 (issue
56, items 2 and 3); and the Runs table as an analysis tool at both (item 8): grouped by a config
value, filtered on the best loss, every shown run selected, and their parallel coordinates; and the
page loads in one script run at both (issue 56 review, item 5).

One `runyard up` with a seeded home: runs of every state and kind written straight into its
database (a finished run with metrics, tags and a note; a failed one with a crashed attempt; a
cancelled one; one paused before it started; a fork of the finished run that logged nothing; a
loss falling four decades; a script run), and one real run (paced) holding both CPU slots while
another waits behind it. The Runs list, each run's page (every section for a finished, a failed
and a script run), Compare of every run, New run, Sweeps and Settings are read as a person sees them;
Compare draws the four-decade loss on a log axis.

The Runs list's grid draws on a canvas; glide-data-grid keeps an accessible copy of its visible
cells as a <table role="grid">, read here, and each column's width is what the grid draws its
header at. A cell is cut when its text, measured with a canvas in the page in the grid's own
font, is wider than its column less the cell's padding; the columns scroll inside the grid when
its scroller is wider than its box.

    pytest -m browser tests/browser/test_runs_grid_browser.py
"""

from __future__ import annotations

import json
import re
import time
from pathlib import Path
from typing import Any

import pytest
from streamlit.proto.ForwardMsg_pb2 import ForwardMsg

from bench.seed import seed_run
from db.compare import runs_list
from db.engine import make_engine, make_sessionmaker
from db.metricstore import write_points
from db.models import Attempt, Run
from db.requests import create_run
from db.run_list import run_configs
from db.states import RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from tests.browser.test_resume_browser import submit, wait_for
from tests.browser.test_ui_browser import PAGE_TIMEOUT_MS, expect, open_page, wait_settled
from tests.conftest import wait_until

pytestmark = pytest.mark.browser
WIDTHS = (1440, 1280)
HEIGHTS = {1440: 900, 1280: 800}
# Raw metric keys a page must label (the metric registry's "Eval accuracy", "Step time"...).
RAW_KEYS = re.compile(r"\b(eval_accuracy|step_time|grad_norm|samples_per_s|tokens_per_s|train_loss)\b")
NOT_A_VALUE = re.compile(r"\b(None|nan|NaN)\b")

# The visible text of the main area, without code blocks (a log or a config as written).
VISIBLE_TEXT = """() => {
  const main = document.querySelector('[data-testid="stMain"]');
  const copy = main.cloneNode(true);
  copy.querySelectorAll('pre, code, [data-testid="stCode"], textarea, input').forEach(e => e.remove());
  return copy.innerText;
}"""

# The Runs grid as glide-data-grid holds it: its columns (title, width as drawn) and every cell's
# text (getCellContent: the rows and columns scrolled out of view too), read from the props
# Streamlit passes to the grid's React component; each text measured with a canvas in the grid's
# own font (its theme's). The page's width, the grid's box and the action buttons' place come
# from the DOM.
GRID = """() => {
  const frame = document.querySelector('[data-testid="stDataFrame"]');
  const canvas = frame.querySelector('canvas');
  const fiberKey = Object.keys(canvas).find(k => k.startsWith('__reactFiber$'));
  let f = canvas[fiberKey];
  while (f && !(f.memoizedProps && f.memoizedProps.getCellContent && Array.isArray(f.memoizedProps.columns))) {
    f = f.return;
  }
  if (!f) return null;
  const props = f.memoizedProps;
  const theme = props.theme || {};
  const ctx = document.createElement('canvas').getContext('2d');
  ctx.font = `${theme.baseFontStyle || '14px'} ${theme.fontFamily || 'sans-serif'}`;
  const padding = 2 * (theme.cellHorizontalPadding ?? 8);
  const columns = props.columns.map((c, i) => ({title: c.title, width: c.width, index: i}));
  const cells = [];
  for (let r = 0; r < props.rows; r++) {
    for (const c of columns) {
      const cell = props.getCellContent([c.index, r]);
      const shown = cell.displayData ?? cell.data ?? '';
      // A progress cell holds its bar's value and the label drawn beside it ("12.34%").
      const text = String(typeof shown === 'object' ? (shown.label ?? shown.value ?? '') : shown);
      cells.push({row: r, title: c.title, text, px: ctx.measureText(text).width, room: c.width - padding,
                  kind: cell.kind});
    }
  }
  const heads = columns.map(c => ({title: c.title, px: ctx.measureText(c.title).width, room: c.width - padding - 16}));
  const box = frame.getBoundingClientRect();
  const scroller = frame.querySelector('.dvn-scroller');
  const open = [...document.querySelectorAll('button')].find(b => b.innerText.includes('Open run'));
  return {font: ctx.font, columns, cells, heads, gridRight: box.right, gridTop: box.top,
          innerWidth: scroller ? scroller.clientWidth : null, innerScrollWidth: scroller ? scroller.scrollWidth : null,
          pageWidth: document.documentElement.clientWidth, scrollWidth: document.documentElement.scrollWidth,
          openTop: open ? open.getBoundingClientRect().top : null};
}"""


def grid_rows_as_data(page: Any) -> list[dict[str, str]]:
    """Every row of the Runs grid as {column title: text}, the columns scrolled out of view too
    (the accessible table holds only the visible ones)."""
    grid = page.evaluate(GRID)
    assert grid is not None, "the grid's React props were not found (a Streamlit upgrade?)"
    rows: dict[int, dict[str, str]] = {}
    for c in grid["cells"]:
        rows.setdefault(c["row"], {})[c["title"]] = c["text"]
    return [rows[r] for r in sorted(rows)]


def cut_cells(grid: dict[str, Any]) -> list[str]:
    """Each cell or header whose text is wider than its column's room (the progress bar draws its
    own text over the bar: its cells are judged by their percent too)."""
    cut = [f"{c['title']!r} row {c['row']}: {c['text']!r} ({c['px']:.0f} px in {c['room']:.0f})"
           for c in grid["cells"] if c["px"] > c["room"] + 0.5]
    cut += [f"header {h['title']!r} ({h['px']:.0f} px in {h['room']:.0f})" for h in grid["heads"]
            if h["px"] > h["room"] + 0.5]
    return cut


def seed_home(home: Path) -> dict[str, int]:
    """Runs of every state and kind, written into the server's database."""
    db_url = f"sqlite:///{home / 'runyard.db'}"
    ids = {"baseline": seed_run(db_url, ranks=2, steps=300, keys=("loss", "eval_accuracy", "step_time"),
                                name="baseline", runs_dir=home / "runs")}
    engine = make_engine(db_url)
    try:
        with make_sessionmaker(engine)() as s:
            base = s.get_one(Run, ids["baseline"])
            base.tags_json, base.note = json.dumps(["baseline", "lr-search", "digits"]), "the first try"
            now = time.time()

            def add(name: str, path: tuple[RunStatus, ...], **config: Any) -> Run:
                run = create_run(s, RunConfig.model_validate({"name": name, **config}), home / "runs",
                                 Price(usd_per_hour=1.0, unit="seeded"))
                s.flush()
                for status in path:
                    assert transition(s, run.id, status, "seeded"), (name, status)
                ids[name] = run.id
                return run

            failed = add("diverged", (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.FAILED))
            failed.started_at, failed.ended_at = now - 120, now - 60
            s.add_all([
                Attempt(run_id=failed.id, number=1, status="CRASHED", dir="a/1", started_at=now - 120,
                        ended_at=now - 100, cause="UNKNOWN", last_step=20),
                Attempt(run_id=failed.id, number=2, status="FAILED", dir="a/2", started_at=now - 90,
                        ended_at=now - 60, exit_code=1, cause="NAN_LOSS", failed_rank=1, resume_step=0,
                        last_step=40, steps_lost=40, exception="FloatingPointError: the loss diverged")])
            add("stopped", (RunStatus.CANCELLED,))
            add("held", (RunStatus.PAUSED,))
            fork = add("fork-of-baseline", (RunStatus.CANCELLED,))
            fork.parent_run_id, fork.parent_step = ids["baseline"], 150
            steep = add("steep", (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED))
            steep.started_at, steep.ended_at = now - 400, now - 100
            s.add(Attempt(run_id=steep.id, number=1, status="SUCCEEDED", dir="a/1", started_at=now - 400,
                          ended_at=now - 100, exit_code=0, last_step=300, resume_step=0))
            s.flush()
            # A loss from 10 to 0.001: four decades, a flat line at zero on a linear axis.
            write_points(s.connection(), [dict(run_id=steep.id, attempt=1, rank=0, step=step, key="loss",
                                               value=10.0 * 0.97**step, wall_time=now - 400 + step)
                                          for step in range(1, 301)])
            script = add("own-script", (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED),
                         workload={"kind": "script", "script": "train.py"})
            script.started_at, script.ended_at = now - 30, now - 10
            s.commit()
    finally:
        engine.dispose()
    return ids


def use_the_table_as_an_analysis_tool(page: Any, home: Path, count: int) -> None:
    """Group by a config value (a table per group under its value and count), filter on the best
    loss (the rows narrow to the runs the database says; a bad filter says why and which fields),
    select all (every shown run, then none) and the selected runs' parallel coordinates (a line
    per run) (issue 56, item 8)."""
    engine = make_engine(f"sqlite:///{home / 'runyard.db'}")
    try:
        with make_sessionmaker(engine)() as s:
            kinds = [c["workload.kind"] for c in run_configs(s, limit=1000).values()]

        def low_losses() -> list[int]:  # read again each time: the live run's best loss goes down as it trains
            with make_sessionmaker(engine)() as s:
                return sorted(r["id"] for r in runs_list(s) if r["best_loss"] is not None and r["best_loss"] < 0.01)

        grids = page.get_by_test_id("stDataFrame")
        page.get_by_test_id("stSelectbox").filter(has_text="Group by").click()
        page.get_by_role("option", name="workload.kind", exact=True).click()
        for kind in set(kinds):
            n = kinds.count(kind)
            heading = f"workload.kind = {kind} · {n} run{'' if n == 1 else 's'} · best loss"
            expect(page.get_by_test_id("stMarkdown").filter(has_text=heading)).to_be_visible(timeout=PAGE_TIMEOUT_MS)
        expect(grids).to_have_count(len(set(kinds)))
        page.get_by_test_id("stSelectbox").filter(has_text="Group by").click()
        page.get_by_role("option", name="no grouping", exact=True).click()
        expect(grids).to_have_count(1, timeout=PAGE_TIMEOUT_MS)

        rows = grids.locator("table[role='grid'] tbody tr")
        box = page.get_by_label("Filter", exact=True)
        box.fill("best loss < 0.01")
        box.press("Enter")
        expect(rows).not_to_have_count(count, timeout=PAGE_TIMEOUT_MS)
        shown: list[int] = []

        def shows_what_the_database_says() -> bool:
            shown[:] = sorted(int(r["run"]) for r in grid_rows_as_data(page))
            return shown == low_losses()

        wait_until(shows_what_the_database_says, PAGE_TIMEOUT_MS / 1000,
                   "the filtered rows never were the runs whose best loss the database says is under 0.01")
        assert 0 < len(shown) < count, shown  # the seeded home has runs on both sides of 0.01
    finally:
        engine.dispose()
    box.fill("best los < 0.01")
    box.press("Enter")
    warning = page.get_by_test_id("stAlert").filter(has_text="“best los” is no field to filter on")
    expect(warning).to_contain_text("The fields: best loss, headline, steps", timeout=PAGE_TIMEOUT_MS)
    expect(rows).to_have_count(count)  # not applied
    box.fill("")
    box.press("Enter")
    expect(warning).to_have_count(0, timeout=PAGE_TIMEOUT_MS)

    page.get_by_role("button", name="Select all").click()
    expect(page.get_by_role("button", name=f"Compare {count} runs")).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    chart = page.locator(".runyard-parallel")
    expect(chart.locator("path.trial")).to_have_count(count, timeout=PAGE_TIMEOUT_MS)
    expect(chart.locator(".axis-name").filter(has_text="best loss")).to_have_count(1)
    page.get_by_role("button", name="Clear", exact=True).click()
    expect(page.get_by_role("button", name="Compare", exact=True)).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    expect(chart).to_have_count(0)


def count_page_runs(page: Any) -> list[str]:
    """The page's script runs as they end (the whole page's, not a fragment's), from the messages
    Streamlit sends over its websocket; the list fills while Playwright waits on the page."""
    ended: list[str] = []

    def frame(payload: Any) -> None:
        if isinstance(payload, bytes):
            msg = ForwardMsg()
            msg.ParseFromString(payload)
            if msg.WhichOneof("type") == "script_finished" and msg.script_finished == ForwardMsg.FINISHED_SUCCESSFULLY:
                ended.append(page.url)

    page.on("websocket", lambda ws: ws.on("framereceived", frame))
    return ended


def visible_problems(page: Any) -> list[str]:
    text = page.evaluate(VISIBLE_TEXT)
    found = [f"{m.group(0)!r} in …{text[max(0, m.start() - 40):m.end() + 40]!r}…"
             for pattern in (NOT_A_VALUE, RAW_KEYS) for m in pattern.finditer(text)]
    return found


# A page whose script run is over (a live run's page reruns its panels every few seconds: on a
# busy machine it is never idle for wait_settled's 300 ms, so its text is read once a run ends).
SCRIPT_DONE = "() => document.querySelector('[data-testid=\"stApp\"]')?.dataset.testScriptState === 'notRunning'"


def settle(page: Any, live: bool = False) -> None:
    if live:
        page.wait_for_function(SCRIPT_DONE, polling=100, timeout=PAGE_TIMEOUT_MS)
    else:
        wait_settled(page)


def settled_text(page: Any, url: str, ready: Any, live: bool = False) -> list[str]:
    page.goto(url)
    expect(ready).to_be_visible(timeout=PAGE_TIMEOUT_MS)
    not_found = page.get_by_role("dialog").filter(has_text="Page not found")  # streamlit#9992
    if not_found.count():
        page.keyboard.press("Escape")
    settle(page, live)
    return visible_problems(page)


def walk_pages(page: Any, url: str, ids: dict[str, int]) -> dict[str, list[str]]:
    """Compare of every run, New run, Sweeps and Settings at both widths; each run's page at 1280
    px, every section of it for the finished runs that have the most to show (metrics, a failed
    run's attempts, a script run)."""
    found: dict[str, list[str]] = {}
    everything = ",".join(str(i) for i in sorted(ids.values())[:10])
    pages = {"compare": (f"{url}/compare?runs={everything}", "Compare runs"), "new run": (f"{url}/new", "New run"),
             "sweeps": (f"{url}/sweeps", "Sweeps"), "settings": (f"{url}/settings", "Settings")}
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": 800})
        for name, (address, heading) in pages.items():
            if problems := settled_text(page, address, page.get_by_role("heading", name=heading, level=1)):
                found[f"{name} at {width}"] = problems
    page.set_viewport_size({"width": 1280, "height": 800})
    for name, run_id in ids.items():
        header = page.get_by_role("heading", level=2).filter(has_text=f"#{run_id} {name}")
        live = name in ("live", "waiting")
        if problems := settled_text(page, f"{url}/run?run={run_id}", header, live):
            found[f"run {name}"] = problems
        # Every section of the finished runs with the most to show (a live run's Metrics section
        # redraws its charts all the time: on a busy machine its script run never ends).
        if name not in ("baseline", "diverged", "own-script"):
            continue
        sections = page.get_by_role("radiogroup", name="Section").get_by_role("radio")
        for label in [r.inner_text().strip() for r in sections.all()][1:]:
            choice = sections.filter(has_text=label).first
            choice.click()
            expect(choice).to_have_attribute("aria-checked", "true", timeout=PAGE_TIMEOUT_MS)
            settle(page, live)
            if problems := visible_problems(page):
                found[f"run {name}, {label}"] = problems
    return found


def test_no_none_nan_or_raw_key_on_any_page_and_no_runs_cell_cut(
        paced_runs: float, runyard_up: Any, page: Any) -> None:
    ids = seed_home(runyard_up.home)
    ids["live"] = submit(runyard_up, "train.max_steps=100000", "name=live")
    ids["waiting"] = submit(runyard_up, "name=waiting")  # RUNYARD_CPU_SLOTS=2: waits for live's two slots
    wait_for(runyard_up, ids["live"], lambda d: d["status"] == "RUNNING" and d["step"] > 0, "RUNNING")

    found: dict[str, list[str]] = {}
    page_runs = count_page_runs(page)
    for width in WIDTHS:
        page.set_viewport_size({"width": width, "height": HEIGHTS[width]})
        page_runs.clear()
        open_page(page, runyard_up.url, "Runs")
        rows = page.get_by_test_id("stDataFrame").locator("table[role='grid'] tbody tr")
        expect(rows).to_have_count(len(ids), timeout=PAGE_TIMEOUT_MS)
        wait_settled(page)
        # One script run a load at every width: nothing in the page reruns it to measure itself (a
        # component that said the grid's width reran the page, and a rerun racing "Open run"'s
        # switch blanked the page: Streamlit's "Cannot set a node at a delta path").
        if len(page_runs) != 1:
            found[f"runs at {width}: page runs on load"] = [f"{len(page_runs)} whole-page script runs"]
        grid = page.evaluate(GRID)
        assert grid is not None, "the grid's React props were not found (a Streamlit upgrade?)"
        print(grid["font"], [(c["title"], c["width"]) for c in grid["columns"]])
        texts = " | ".join(c["text"] for c in grid["cells"])
        problems = [*visible_problems(page), *cut_cells(grid),
                    *(f"cell {m.group(0)!r}" for m in NOT_A_VALUE.finditer(texts))]
        if grid["scrollWidth"] > grid["pageWidth"] or grid["gridRight"] > grid["pageWidth"]:
            problems.append(f"wider than the page: grid to {grid['gridRight']:.0f} px, page {grid['pageWidth']} px")
        if grid["openTop"] is None or grid["openTop"] > grid["gridTop"]:
            problems.append(f"the actions are not above the grid: {grid['openTop']} vs {grid['gridTop']}")
        if grid["innerScrollWidth"] is None or grid["innerScrollWidth"] > grid["innerWidth"] + 1:
            problems.append(f"the default columns scroll inside the grid: {grid['innerScrollWidth']} px of columns "
                            f"in {grid['innerWidth']} px")
        if problems:
            found[f"runs at {width}"] = problems
        use_the_table_as_an_analysis_tool(page, runyard_up.home, len(ids))
    # Compare draws a loss spanning four decades on a log axis, as the Run page does (item 4).
    open_page(page, f"{runyard_up.url}/compare?runs={ids['baseline']},{ids['steep']}&metrics=loss", "Compare runs")
    wait_settled(page)
    y_axis = page.locator("[data-testid='stVegaLiteChart'] [aria-label^='Y-axis']")
    expect(y_axis.first).to_have_attribute("aria-label", re.compile(r"\blog scale\b"))
    found.update(walk_pages(page, runyard_up.url, ids))
    assert not found, "\n".join(f"{where}: {p}" for where, ps in found.items() for p in ps)
