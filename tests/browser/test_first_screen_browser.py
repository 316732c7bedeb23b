"""The Run page's first screen and its Logs section (issue 56, items 1 and 5), in a real Chromium
against the real product (`runyard up`), on runs written through the product's own writers (no
training: the page is what is measured).

- At 1280x800 and 1440x900 the first chart shows whole in the first screen, its axes included
  (measured from the chart's own box), under one row of actions and one row of headline numbers,
  with Your cost and the Cloud reference on screen too; at 1280x800 a failed run's too, under its
  failure in one line (the error and where in the user's code) with the traceback folded.
- The Logs section opens with the failing rank's log, its traceback from the user's code:
  runyard's own frames folded into one line.

    pytest -m browser tests/browser/test_first_screen_browser.py
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import pytest

from app.log_view import OWN_FRAME_ROOTS
from db.engine import make_engine, make_sessionmaker
from db.metricstore import write_points
from db.models import Attempt
from db.requests import create_run
from db.states import RunStatus, transition
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from tests.browser.test_resume_browser import PAGE_TIMEOUT_MS, expect, open_run_page
from tests.browser.test_ui_browser import show_section, wait_settled

pytestmark = pytest.mark.browser
VIEWPORTS = ((1280, 800), (1440, 900))
TRAINER = OWN_FRAME_ROOTS[0]  # where runyard's trainer lives: its frames are folded

# The first chart of the main area (Vega's canvas or SVG with its axes and title: the chart's own
# box, measured in the page), the viewport's height, and where the two cost tiles are.
FIRST_SCREEN_JS = """() => {
  const main = document.querySelector('[data-testid="stMain"]');
  const chart = [...main.querySelectorAll('[data-testid="stVegaLiteChart"]')].find(e => e.checkVisibility());
  const drawn = chart ? [...chart.querySelectorAll('canvas, svg')].find(e => e.getBoundingClientRect().width > 0)
                      : null;
  const box = (e) => { const r = e.getBoundingClientRect();
                       return {top: r.top, bottom: r.bottom, left: r.left, right: r.right}; };
  const label = (text) => [...main.querySelectorAll('[data-testid="stMetricLabel"]')]
    .find(e => e.innerText.trim() === text);
  return {chart: drawn ? box(drawn) : null, height: window.innerHeight, width: window.innerWidth,
          yours: label('Your cost') ? box(label('Your cost')) : null,
          cloud: label('Cloud reference') ? box(label('Cloud reference')) : null};
}"""


def traceback(prefix: str) -> str:
    """A user's script failing under runyard's script runner, as torchrun writes rank 1's stderr."""
    lines = ["Traceback (most recent call last):",
             f'  File "{TRAINER}process_exit.py", line 40, in run_and_exit', "    code = main()",
             f'  File "{TRAINER}script_runner.py", line 88, in main', "    runpy.run_path(script)",
             '  File "<frozen runpy>", line 291, in run_path',
             '  File "/home/me/proj/train.py", line 12, in <module>', "    raise ValueError('lr too high')",
             "ValueError: lr too high"]
    return "".join(f"{prefix}{line}\n" for line in lines)


def seed(home: Path) -> tuple[int, int]:
    """A SUCCEEDED 2-rank run with 300 steps of loss and eval accuracy, and a FAILED one whose rank 1
    raised in the user's script: their ids."""
    engine = make_engine(f"sqlite:///{home / 'runyard.db'}")
    end = time.time() - 30
    try:
        with make_sessionmaker(engine)() as s:
            ids = []
            for name, last in (("first-screen", RunStatus.SUCCEEDED), ("failing", RunStatus.FAILED)):
                run = create_run(s, RunConfig.model_validate({"name": name}), home / "runs",
                                 Price(usd_per_hour=1.8, unit="2/2 of a CPU node @ $1.8/h"))
                s.flush()
                for status in (RunStatus.STARTING, RunStatus.RUNNING, last):
                    assert transition(s, run.id, status, "seeded by the first-screen browser test")
                run.started_at, run.ended_at = end - 600, end
                failed = last == RunStatus.FAILED
                attempt = Attempt(run_id=run.id, number=1, status="FAILED" if failed else "SUCCEEDED",
                                  dir=str(Path(run.run_dir) / "attempts" / "1"), started_at=end - 600, ended_at=end,
                                  first_step_at=end - 590, progress_at=end, last_step=300, resume_step=0)
                if failed:
                    attempt.cause, attempt.failed_rank, attempt.exit_code = "USER_ERROR", 1, 1
                    attempt.exception, attempt.reason = "ValueError: lr too high", "rank 1 raised ValueError"
                    attempt.log_tail = traceback("[rank1]: ")
                    folder = Path(attempt.dir) / "ranks" / "abc_1" / "attempt_0"
                    for rank in (0, 1):
                        (folder / str(rank)).mkdir(parents=True)
                        (folder / str(rank) / "stdout.log").write_text("".join(f"step {i} loss 1.0\n"
                                                                               for i in range(1, 40)))
                        (folder / str(rank) / "stderr.log").write_text(traceback(f"[rank{rank}]: ") if rank else "")
                s.add(attempt)
                write_points(s.connection(), [
                    dict(run_id=run.id, attempt=1, rank=rank, step=step, key=key, value=value,
                         wall_time=end - 600 + step)
                    for rank in (0, 1) for step in range(1, 301)
                    for key, value in (("loss", 2.0 / step + 0.01 * rank),) + ((("eval_accuracy", step / 400),)
                                                                               if step % 50 == 0 else ())])
                s.commit()
                ids.append(run.id)
            return ids[0], ids[1]
    finally:
        engine.dispose()


def test_the_first_chart_is_whole_in_the_first_screen_and_the_log_has_its_section(
        page: Any, runyard_up: Any) -> None:
    done, failing = seed(runyard_up.home)
    # The finished run at both sizes; the failed one at the smaller, under its one-line failure.
    for run_id, name, width, height in ((done, "first-screen", *VIEWPORTS[0]), (done, "first-screen", *VIEWPORTS[1]),
                                        (failing, "failing", *VIEWPORTS[0])):
        page.set_viewport_size({"width": width, "height": height})
        open_run_page(page, runyard_up.url, run_id, name)
        expect(page.locator("[data-testid='stVegaLiteChart']").first).to_be_visible(timeout=PAGE_TIMEOUT_MS)
        wait_settled(page)
        seen = page.evaluate(FIRST_SCREEN_JS)
        chart = seen["chart"]
        assert chart is not None, f"no chart drawn at {width}x{height}"
        assert chart["top"] >= 0 and chart["bottom"] <= seen["height"], (  # its axes and title included
            f"the first chart of {name} spans y {chart['top']:.0f}-{chart['bottom']:.0f} at {width}x{height}: "
            f"not whole in the first {seen['height']} px")
        assert chart["bottom"] - chart["top"] > 200 and chart["right"] <= seen["width"]
        for tile in ("yours", "cloud"):  # both cost lines on the first screen too
            assert seen[tile] is not None and seen[tile]["bottom"] <= seen["height"], (tile, seen[tile])
    # The failure in one line, where in the user's code: a closed section's label, its traceback folded under it.
    failure = page.locator(".st-key-failure")
    expect(failure.locator("summary")).to_contain_text(
        "Attempt 1: rank 1 failed (USER_ERROR): ValueError: lr too high (at train.py:12)")
    line_box = failure.locator("summary").bounding_box()
    assert line_box is not None and line_box["height"] < 50, line_box  # one line of text
    expect(failure.get_by_text("raise ValueError('lr too high')")).to_be_hidden()
    failure.locator("summary").click()
    expect(failure.get_by_text("raise ValueError('lr too high')")).to_be_visible()

    open_run_page(page, runyard_up.url, failing, "failing")
    show_section(page, "Logs")
    log = page.locator(".runyard-log").first
    expect(log).to_contain_text("runyard frames (trainer/process_exit.py, trainer/script_runner.py)",
                                timeout=PAGE_TIMEOUT_MS)
    expect(log).to_contain_text('File "/home/me/proj/train.py", line 12')  # the user's code, whole
    expect(log).not_to_contain_text("script_runner.py\", line 88")  # runyard's frame, folded
    # The log comes first in its section, the kept tail under it, and its top in the first screen.
    log_box, tail_box = log.bounding_box(), page.get_by_text("Attempt 1: rank 1 raised ValueError").bounding_box()
    assert log_box is not None and tail_box is not None
    assert log_box["y"] < tail_box["y"] and log_box["y"] < VIEWPORTS[-1][1], (log_box, tail_box)
