"""The Run page's first full render in Chromium for a run of 10M metric points.

    .venv/bin/python bench/bench_render.py [--ranks 8] [--steps 1250000] [--repeats 5] [--live]
    .venv/bin/python bench/bench_render.py --live-bytes [--before REV] [--ranks 8] [--steps 10000] [--rounds 3]

Seeds one finished run of ``ranks x steps`` loss points (bench/seed.py's seed_run: rank 0's
writer path, rollups included) and the system rows the scheduler would have written for it (one
GPU per rank, 10-s windows over the whole run) into a data folder cached under /tmp (seeding 10M points
takes minutes; the folder is reused while its parameters match), starts the UI on it (`runyard ui`)
and times, in Debian's Chromium driven by Playwright, each navigation to the Run page from
``page.goto`` until every chart on it is drawn (a Vega ``svg.marks`` or canvas in each
``stVegaLiteChart``). Every repetition uses a fresh browser context (no cached scripts, a new
Streamlit session, so the live panel fetches the whole series) after one warm-up navigation
(the server's first imports and page compile); a second series reopens the page in one
browser context whose scripts are cached (a person's second visit); a third opens the run the
way a person does from the dashboard: the Runs page loaded in a new context, the run's row
selected, timed from the click until every chart on the Run page it switches to is drawn (no
new tab, so no Streamlit start-up). For scale, the Runs page, which draws no chart, is timed
like the first: what Streamlit's own start-up costs here. ``--floor`` also starts a bare Streamlit
page (bench/streamlit_floor.py: a title and one chart of the Run page's first curve's size, served
as runyard serves its UI, nothing in front) and times it in new tabs taking turns with the Run page's:
what any Streamlit page with one chart costs here, against runyard's.

The first run a person opens after opening the dashboard: a new tab (fresh, and with the scripts
cached) that has loaded the Runs page and selected the run's row, timed from "Open run" to the
first curve drawn: the first chart that tab draws, which pays for loading and first running the
chart code. With ``--floor``, beside the bare page's own first chart after a click (its "Draw"
button, ``?chart=click``).

Issue 32's item 5 in a tab that is already open (a person with the dashboard open, who has seen
a chart in it once): in one page kept for the whole series, back to the Runs page, the run's row
selected, and timed from "Open run" until the Overview's first curve is drawn, then from choosing
the Metrics section until that section's first chart is drawn (a chart element the page did not
have before the click: the Overview's chart does not count). ``--live`` repeats that series on a
live run: a fresh data folder, ``runyard scheduler`` and ``runyard ui`` on it, and a 2-rank mlp-digits run
logging every step while its ranks train flat out on the same cores, timed from its 5,000th step on.

``--live-bytes`` is a series of its own (bench/bench_live_bytes.py, which says how): the bytes the
browser receives and the UI's CPU per 2-s refresh of a simulated live 8-rank run at 10k steps,
this checkout beside the commit ``--before``.

Prints every time, the medians, where the time went (to the header; then to all charts) and
the load average, and ends with its BENCHMARKS.md rows (bench/benchmarks_row.py): the finished
run's, and with ``--live`` the live run's.
"""

from __future__ import annotations

import argparse
import json
import os
import re
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))
from bench.benchmarks_row import load_average, print_row  # noqa: E402 - needs ROOT on sys.path
from bench.seed import seed_run, seed_system_metrics  # noqa: E402 - needs ROOT on sys.path
from db.engine import upgrade  # noqa: E402 - needs ROOT on sys.path

CACHE = Path("/tmp/runyard-bench-render")
# Every chart on the page drawn, once the page's script has run to its end (before that, charts
# further down may not have arrived yet).
ALL_CHARTS_DRAWN = """() => {
    const app = document.querySelector("[data-testid='stApp']");
    if (!app || app.getAttribute("data-test-script-state") !== "notRunning") return false;
    const charts = [...document.querySelectorAll("[data-testid='stVegaLiteChart']")];
    return charts.length > 0 && charts.every(c => c.querySelector('svg.marks, canvas'));
}"""
# The first chart drawn (issue 32, item 5: what a person waits for before there is something to read).
FIRST_CHART_DRAWN = """() => [...document.querySelectorAll("[data-testid='stVegaLiteChart']")]
    .some(c => c.querySelector('svg.marks, canvas'))"""
# Before a click: mark every chart element the page has; after it, a chart element without the
# mark, drawn, is the first chart the click brought (React keeps an element it reuses, mark and all).
MARK_CHARTS = """() => document.querySelectorAll("[data-testid='stVegaLiteChart']")
    .forEach(c => { c.__before = true; })"""
NEW_CHART_DRAWN = """() => [...document.querySelectorAll("[data-testid='stVegaLiteChart']")]
    .some(c => !c.__before && c.querySelector('svg.marks, canvas'))"""
TITLE_SHOWN = """() => {
    const app = document.querySelector("[data-testid='stApp']");
    return !!document.querySelector("h1") && app && app.getAttribute("data-test-script-state") === "notRunning";
}"""
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--no-first-run", "--disable-background-networking"]


def launch_chromium(pw: Any) -> Any:
    """Debian's Chromium headless shell (as the browser tests drive it), else Chromium, under Playwright ``pw``."""
    chromium = next(filter(None, map(shutil.which, ("chromium-headless-shell", "chromium"))), "/usr/bin/chromium")
    return pw.chromium.launch(executable_path=chromium, headless=True, args=CHROMIUM_ARGS)


def seeded_home(ranks: int, steps: int, keys: tuple[str, ...]) -> tuple[Path, int]:
    """A data folder with one seeded run, cached under /tmp by its parameters."""
    home = CACHE / f"{ranks}x{steps}-{'-'.join(keys)}"
    marker = home / "run_id"
    if marker.is_file():
        run_id = int(marker.read_text())
        _with_system_metrics(home, run_id, ranks)
        return home, run_id
    shutil.rmtree(home, ignore_errors=True)
    home.mkdir(parents=True)
    db_url = f"sqlite:///{home / 'runyard.db'}"
    upgrade(db_url)
    t0 = time.monotonic()
    print(f"seeding {ranks} x {steps:,} points of {', '.join(keys)} into {home} (cached for later runs)...", flush=True)
    run_id = seed_run(db_url, ranks=ranks, steps=steps, keys=keys, name=f"bench-{ranks}x{steps}", progress=True)
    print(f"seeded in {time.monotonic() - t0:.0f} s", flush=True)
    marker.write_text(str(run_id))
    _with_system_metrics(home, run_id, ranks)
    return home, run_id


def _with_system_metrics(home: Path, run_id: int, gpus: int) -> None:
    """Add the system rows a real run would have (one GPU per rank) to a seeded home, once."""
    marker = home / "system_metrics"
    if marker.is_file():
        return
    rows = seed_system_metrics(f"sqlite:///{home / 'runyard.db'}", run_id, gpus)
    marker.write_text(str(rows))
    print(f"added {rows:,} system metric rows ({gpus} GPUs, their processes, the host)", flush=True)


def median_s(seconds: list[float]) -> str:
    """The median of ``seconds``, as a BENCHMARKS.md row shows it."""
    return f"{statistics.median(seconds):.2f} s"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _answering(proc: subprocess.Popen[bytes], url: str, what: str, log: Path | None = None) -> None:
    """Wait up to 60 s until ``url`` answers 200 (``what`` started), else kill ``proc`` and raise."""
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as resp:  # noqa: S310 - http://127.0.0.1 URLs built here
                if resp.status == 200:
                    return
        except OSError:
            pass
        time.sleep(0.3)
    os.killpg(proc.pid, signal.SIGKILL)
    raise RuntimeError(f"{what} did not start in 60 s" + (f":\n{log.read_text()[-2000:]}" if log else ""))


def start_floor(port: int) -> subprocess.Popen[bytes]:
    """bench/streamlit_floor.py on ``port``, once it answers."""
    proc = subprocess.Popen([sys.executable, str(ROOT / "bench" / "streamlit_floor.py"), "--port", str(port)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    _answering(proc, f"http://127.0.0.1:{port}/", "the floor page")
    return proc


def start_ui(home: Path, port: int, tree: Path = ROOT) -> tuple[subprocess.Popen[bytes], str]:
    """`runyard ui` of the checkout ``tree`` on ``port``; returns it and the login URL it printed
    (the UI answers nothing but its health check, ``/healthz``, without its token)."""
    env = dict(os.environ, RUNYARD_HOME=str(home))
    env.pop("RUNYARD_DB_URL", None)
    log = home / f"bench-ui-{port}.log"
    with log.open("w") as out:
        proc = subprocess.Popen([sys.executable, "-m", "orchestrator", "ui", "--port", str(port)], env=env, cwd=tree,
                                stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    _answering(proc, f"http://127.0.0.1:{port}/healthz", f"the UI of {tree}", log)
    # The URL is printed once the socket is bound, before the first answer.
    printed = re.search(rf"^http://127\.0\.0\.1:{port}/\?token=\S+$", log.read_text(), re.MULTILINE)
    if not printed:
        os.killpg(proc.pid, signal.SIGKILL)
        raise RuntimeError(f"the UI printed no login URL:\n{log.read_text()[-2000:]}")
    return proc, printed.group(0)


def session_cookies(browser: Any, login_url: str) -> list[dict[str, Any]]:
    """The UI's session cookie, got once by opening the login URL; each fresh context below gets
    it added (no page load), so its first navigation is still one with nothing cached."""
    context = browser.new_context()
    try:
        context.new_page().goto(login_url)
        cookies: list[dict[str, Any]] = context.cookies()
    finally:
        context.close()
    if not any(c["name"].startswith("runyard-session-") for c in cookies):
        raise RuntimeError(f"opening {login_url.split('?')[0]}?token=... gave no session cookie")
    return cookies


def fresh_context(browser: Any, cookies: list[dict[str, Any]]) -> Any:
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    context.add_cookies(cookies)
    return context


def navigate(browser: Any, cookies: list[dict[str, Any]], url: str, ready: str, header: str | None,
             context: Any = None, first: list[float] | None = None) -> tuple[float, float | None]:
    """Seconds from goto until ``ready`` holds, and until ``header`` is visible (if given). In a
    new browser context (nothing cached, logged in) unless ``context`` is given. With ``first``,
    the seconds until the first chart is drawn are appended to it."""
    own = context is None
    context = context or fresh_context(browser, cookies)
    page = context.new_page()
    try:
        t0 = time.monotonic()
        page.goto(url)
        at_header = None
        if header:
            page.wait_for_selector(header, timeout=120_000)
            at_header = time.monotonic() - t0
        if first is not None:
            page.wait_for_function(FIRST_CHART_DRAWN, timeout=120_000, polling="raf")
            first.append(time.monotonic() - t0)
        page.wait_for_function(ready, timeout=120_000)
        total = time.monotonic() - t0
        if page.locator("[data-testid='stException']").count():
            raise RuntimeError(page.locator("[data-testid='stException']").first.inner_text())
        return total, at_header
    finally:
        page.close()
        if own:
            context.close()


def open_from_runs_page(browser: Any, cookies: list[dict[str, Any]], base: str, run_id: int, section: str,
                        ready: str, first: list[float] | None = None) -> float:
    """Seconds from selecting the run's row on the Runs page (a new browser context, the page
    loaded and its table drawn) until ``ready`` holds on the Run page: the row selected, "Open run
    #N" pressed, and ``section`` chosen (the page opens on Overview), as a person does."""
    context = fresh_context(browser, cookies)
    page = context.new_page()
    try:
        page.goto(f"{base}/")
        t0 = select_first_row(page)
        page.get_by_role("button", name=f"Open run #{run_id}").click(timeout=120_000)
        if section:
            page.get_by_role("radiogroup", name="Section").get_by_role("radio", name=section, exact=True).click(
                timeout=120_000)
        if first is not None:
            page.wait_for_function(FIRST_CHART_DRAWN, timeout=120_000, polling="raf")
            first.append(time.monotonic() - t0)
        page.wait_for_function(ready, timeout=120_000)
        return time.monotonic() - t0
    finally:
        context.close()


def select_first_row(page: Any, settle_ms: int = 500) -> float:
    """On the Runs page: once its table is drawn, select the first row; returns the click's time."""
    page.wait_for_selector("[data-testid='stDataFrame']", timeout=120_000)
    page.wait_for_timeout(settle_ms)  # the grid's canvas draws after the element appears
    t0 = time.monotonic()
    page.get_by_test_id("stDataFrame").click(position={"x": 17, "y": 53})  # first row's marker
    return t0


def first_chart_after_click(browser: Any, cookies: list[dict[str, Any]], url: str, button: str,
                            context: Any = None, before: Callable[[Any], object] = lambda page: None) -> float:
    """Seconds from pressing ``button`` until the first chart is drawn, in a new tab (of a fresh
    browser context unless ``context`` is given) that has loaded ``url`` (then ``before(page)``)
    and drawn no chart yet."""
    own = context is None
    context = context or fresh_context(browser, cookies)
    page = context.new_page()
    try:
        page.goto(url)
        before(page)
        pressed = page.get_by_role("button", name=button)
        pressed.wait_for(timeout=120_000)
        t0 = time.monotonic()
        pressed.click(timeout=120_000)
        page.wait_for_function(FIRST_CHART_DRAWN, timeout=120_000, polling="raf")
        return time.monotonic() - t0
    finally:
        page.close()
        if own:
            context.close()


def first_open(browser: Any, cookies: list[dict[str, Any]], base: str, run_id: int, context: Any = None) -> float:
    """"Open run #N" to the first curve in a new tab that has loaded the Runs page and selected the
    run's row: the first run a person opens after opening the dashboard, the tab's first chart."""
    return first_chart_after_click(browser, cookies, f"{base}/", f"Open run #{run_id}", context, select_first_row)


def floor_click(browser: Any, url: str, context: Any = None) -> float:
    """The floor of :func:`first_open`: the bare page's "Draw" button (``?chart=click``) to its chart."""
    return first_chart_after_click(browser, [], f"{url}?chart=click", "Draw", context)


def open_in_this_tab(page: Any, run_id: int, section: str) -> tuple[float, float]:
    """In an open tab: the Runs page (by its link), the run's row selected, then seconds from
    "Open run #N" to the landing section's first chart, and from choosing ``section`` to that
    section's first chart."""
    page.get_by_role("link", name="Runs").first.click()
    select_first_row(page, settle_ms=800)
    opener = page.get_by_role("button", name=f"Open run #{run_id}")
    opener.wait_for(timeout=120_000)
    page.evaluate(MARK_CHARTS)
    t0 = time.monotonic()
    opener.click(timeout=120_000)
    page.wait_for_function(NEW_CHART_DRAWN, timeout=120_000, polling="raf")
    landing = time.monotonic() - t0
    page.wait_for_timeout(500)
    page.evaluate(MARK_CHARTS)
    chooser = page.get_by_role("radiogroup", name="Section").get_by_role("radio", name=section, exact=True)
    t0 = time.monotonic()
    chooser.click(timeout=120_000)
    page.wait_for_function(NEW_CHART_DRAWN, timeout=120_000, polling="raf")
    return landing, time.monotonic() - t0


def in_one_tab(browser: Any, cookies: list[dict[str, Any]], base: str, run_id: int, section: str,
               repeats: int, label: str) -> tuple[list[float], list[float]]:
    """``open_in_this_tab`` ``repeats`` times in one page that has drawn the run's charts once."""
    context = fresh_context(browser, cookies)
    page = context.new_page()
    landing: list[float] = []
    chosen: list[float] = []
    try:
        page.goto(f"{base}/run?run={run_id}&section={section}")
        page.wait_for_function(FIRST_CHART_DRAWN, timeout=120_000)
        for i in range(repeats):
            a, b = open_in_this_tab(page, run_id, section)
            landing.append(a)
            chosen.append(b)
            print(f"  {label} {i + 1}: Open -> first curve {a:.2f} s; {section} -> its first chart {b:.2f} s",
                  flush=True)
    finally:
        context.close()
    return landing, chosen


def live_run(args: argparse.Namespace, browser_run: Any) -> tuple[list[float], list[float]]:
    """``--live``: a fresh data folder, `runyard scheduler` and `runyard ui` on it, a 2-rank
    mlp-digits run logging every step, timed in one tab from its 5,000th step on; then cancelled.
    Returns the seconds from Open to the Overview's first curve, and from the section to its first
    chart."""
    home = Path(tempfile.mkdtemp(prefix="runyard-bench-live-"))
    env = dict(os.environ, RUNYARD_HOME=str(home))
    env.pop("RUNYARD_DB_URL", None)
    runyard = [sys.executable, "-m", "orchestrator"]

    def show(run_id: int) -> dict[str, Any]:
        out = subprocess.run([*runyard, "show", str(run_id), "--json"], env=env, check=True, capture_output=True,
                             text=True).stdout
        return dict(json.loads(out))

    subprocess.run([*runyard, "db", "upgrade"], env=env, check=True, capture_output=True)
    scheduler = subprocess.Popen([*runyard, "scheduler"], env=env, stdout=subprocess.DEVNULL,
                                 stderr=subprocess.DEVNULL, start_new_session=True)
    ui = None
    run_id = None
    try:
        sets = ("train.max_steps=10000000", "train.log_every=1", "train.eval_every=0", "name=live")
        out = subprocess.run([*runyard, "submit", str(ROOT / "examples" / "digits.toml"),
                              *(a for kv in sets for a in ("--set", kv))],
                             env=env, check=True, capture_output=True, text=True).stdout
        run_id = int(out.strip())
        deadline = time.monotonic() + 300
        detail: dict[str, Any] = {"step": 0}
        while (detail["step"] or 0) < 5000:
            if time.monotonic() > deadline:
                raise RuntimeError(f"the live run did not reach step 5,000 in 300 s: {detail}")
            time.sleep(2)
            detail = show(run_id)
        ui, login_url = start_ui(home, free_port())
        base = login_url.split("/?token=")[0]
        landing, chosen = browser_run(login_url, base, run_id)
        detail = show(run_id)
        print(f"live run ({detail['status']} at step {detail['step']:,} when timed), median of {args.repeats}, "
              "in one tab:")
        print(f"  Open -> the Overview's first curve: {statistics.median(landing):.2f} s "
              f"(min {min(landing):.2f}, max {max(landing):.2f})")
        print(f"  {args.section or 'Metrics'} -> its first chart: {statistics.median(chosen):.2f} s "
              f"(min {min(chosen):.2f}, max {max(chosen):.2f})")
        print(f"  load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
        return landing, chosen
    finally:
        if run_id is not None:  # the ranks stopped by the scheduler before it goes (a stopped
            # scheduler leaves a run's ranks training, to adopt them when it comes back)
            subprocess.run([*runyard, "cancel", str(run_id)], env=env, capture_output=True)
            deadline = time.monotonic() + 120
            while show(run_id)["status"] not in ("CANCELLED", "SUCCEEDED", "FAILED") and time.monotonic() < deadline:
                time.sleep(1)
        if ui is not None:
            os.killpg(ui.pid, signal.SIGTERM)
            ui.wait(30)
        os.killpg(scheduler.pid, signal.SIGTERM)
        scheduler.wait(60)
        shutil.rmtree(home, ignore_errors=True)


def main() -> None:
    if "--live-bytes" in sys.argv:  # its own series: bench/bench_live_bytes.py, with the arguments it takes
        from bench import bench_live_bytes  # noqa: PLC0415 - only for this series

        bench_live_bytes.main([a for a in sys.argv[1:] if a != "--live-bytes"])
        return
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--steps", type=int, default=1_250_000)
    parser.add_argument("--keys", default="loss", help="comma-separated metric names, each on every rank and step")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--section", default="Metrics",
                        help="the Run page's section to open (its charts are timed); empty: the page's default")
    parser.add_argument("--floor", action="store_true",
                        help="also time a bare Streamlit page with one chart (bench/streamlit_floor.py) in new tabs")
    parser.add_argument("--live", action="store_true",
                        help="also time the open tab's series on a live 2-rank run (its own data folder and scheduler)")
    args = parser.parse_args()
    load_at_start = load_average()
    from playwright.sync_api import sync_playwright  # noqa: PLC0415 - optional: Playwright, only to render

    keys = tuple(k for k in args.keys.split(",") if k)
    home, run_id = seeded_home(args.ranks, args.steps, keys)
    port = free_port()
    ui, login_url = start_ui(home, port)
    base = f"http://127.0.0.1:{port}"
    floor = start_floor(floor_port := free_port()) if args.floor else None
    floor_url = f"http://127.0.0.1:{floor_port}/" if floor else ""
    floor_first: list[float] = []
    floor_title: list[float] = []
    floor_bare: list[float] = []
    floor_cached: list[float] = []
    first_cached: list[float] = []
    opened: list[float] = []
    opened_cached: list[float] = []
    clicked: list[float] = []
    clicked_cached: list[float] = []
    run_url = f"{base}/run?run={run_id}" + (f"&section={args.section}" if args.section else "")
    try:
        with sync_playwright() as pw:
            browser = launch_chromium(pw)
            cookies = session_cookies(browser, login_url)
            navigate(browser, cookies, run_url, ALL_CHARTS_DRAWN, None)  # warm-up: the server's first page compile
            if floor:
                navigate(browser, [], floor_url, ALL_CHARTS_DRAWN, None)
                floor_warm = fresh_context(browser, [])
                navigate(browser, [], floor_url, ALL_CHARTS_DRAWN, None, floor_warm)  # its own script cache
            runs_ready = "() => !!document.querySelector(\"[data-testid='stDataFrame']\")"
            run_times, header_times, baseline, cached, from_runs = [], [], [], [], []
            first_new: list[float] = []
            first_from_runs: list[float] = []
            warm = fresh_context(browser, cookies)
            navigate(browser, cookies, run_url, ALL_CHARTS_DRAWN, None, warm)  # fills this context's script cache
            for i in range(args.repeats):
                total, at_header = navigate(browser, cookies, run_url, ALL_CHARTS_DRAWN, "h2", first=first_new)
                run_times.append(total)
                header_times.append(at_header or 0.0)
                baseline.append(navigate(browser, cookies, f"{base}/", runs_ready, None)[0])
                cached.append(navigate(browser, cookies, run_url, ALL_CHARTS_DRAWN, None, warm, first=first_cached)[0])
                from_runs.append(open_from_runs_page(browser, cookies, base, run_id, args.section, ALL_CHARTS_DRAWN,
                                                     first=first_from_runs))
                opened.append(first_open(browser, cookies, base, run_id))
                opened_cached.append(first_open(browser, cookies, base, run_id, warm))
                print(f"  {i + 1}: first run opened in a tab (Runs page loaded, Open -> first curve): "
                      f"{opened[-1]:.2f} s fresh, {opened_cached[-1]:.2f} s scripts cached", flush=True)
                if floor:
                    clicked.append(floor_click(browser, floor_url))
                    clicked_cached.append(floor_click(browser, floor_url, floor_warm))
                    print(f"  {i + 1}: floor page, Draw -> its chart: {clicked[-1]:.2f} s fresh, "
                          f"{clicked_cached[-1]:.2f} s scripts cached", flush=True)
                    _, at_title = navigate(browser, [], floor_url, ALL_CHARTS_DRAWN, "h1", first=floor_first)
                    floor_title.append(at_title or 0.0)
                    floor_bare.append(navigate(browser, [], floor_url + "?chart=0", TITLE_SHOWN, None)[0])
                    navigate(browser, [], floor_url, ALL_CHARTS_DRAWN, None, floor_warm, first=floor_cached)
                    print(f"  {i + 1}: floor page: title at {at_title:.2f} s, first chart at {floor_first[-1]:.2f} s "
                          f"(scripts cached {floor_cached[-1]:.2f} s); without its chart {floor_bare[-1]:.2f} s",
                          flush=True)
                print(f"  {i + 1}: Run page {total:.2f} s (header at {at_header:.2f} s, first chart at "
                      f"{first_new[-1]:.2f} s), from the Runs page first chart {first_from_runs[-1]:.2f} s; "
                      "scripts cached "
                      f"{cached[-1]:.2f} s, opened from the Runs page {from_runs[-1]:.2f} s; "
                      f"Runs page {baseline[-1]:.2f} s", flush=True)
            warm.close()
            if floor:
                floor_warm.close()
            tab_landing, tab_chosen = in_one_tab(browser, cookies, base, run_id, args.section or "Metrics",
                                                 args.repeats, "open tab")
            browser.close()
    finally:
        os.killpg(ui.pid, signal.SIGTERM)
        ui.wait(30)
        if floor:
            os.killpg(floor.pid, signal.SIGTERM)
            floor.wait(30)
    points = args.ranks * args.steps * len(keys)
    print(f"run of {points:,} points ({args.ranks} ranks x {args.steps:,} steps x {len(keys)} key(s)), "
          f"median of {args.repeats}:")
    print(f"  Run page, goto -> every chart drawn: {statistics.median(run_times):.2f} s "
          f"(min {min(run_times):.2f}, max {max(run_times):.2f})")
    print(f"    of which goto -> run header shown: {statistics.median(header_times):.2f} s; "
          f"-> first chart drawn: {statistics.median(first_new):.2f} s")
    print(f"  Run page again in the same browser (scripts cached): {statistics.median(cached):.2f} s "
          f"(first chart {statistics.median(first_cached):.2f} s)")
    print(f"  Run page opened from the Runs page (row selected, Open, section -> every chart drawn): "
          f"{statistics.median(from_runs):.2f} s (min {min(from_runs):.2f}, max {max(from_runs):.2f}); "
          f"the first chart (the Overview's curve counts) {statistics.median(first_from_runs):.2f} s "
          f"(min {min(first_from_runs):.2f})")
    print(f"  Runs page (no chart), goto -> table shown: {statistics.median(baseline):.2f} s")
    if floor:
        ratio = statistics.median(first_new) / statistics.median(floor_first)
        print(f"  bare Streamlit page, new tab, goto -> first chart: {statistics.median(floor_first):.2f} s "
              f"(min {min(floor_first):.2f}, max {max(floor_first):.2f}; "
              f"title at {statistics.median(floor_title):.2f} s); "
              f"without its chart, goto -> title {statistics.median(floor_bare):.2f} s; "
              f"the Run page's first chart is {ratio:.2f}x the floor's")
        ratio = statistics.median(first_cached) / statistics.median(floor_cached)
        print(f"  bare Streamlit page again in the same browser (scripts cached), goto -> first chart: "
              f"{statistics.median(floor_cached):.2f} s (min {min(floor_cached):.2f}, max {max(floor_cached):.2f}); "
              f"the Run page's is {ratio:.2f}x")
    print(f"  the first run opened in a new tab (Runs page loaded, Open -> first curve): "
          f"{statistics.median(opened):.2f} s fresh (min {min(opened):.2f}, max {max(opened):.2f}), "
          f"{statistics.median(opened_cached):.2f} s scripts cached (min {min(opened_cached):.2f}, "
          f"max {max(opened_cached):.2f})")
    if floor:
        print(f"  bare Streamlit page, Draw -> its first chart: {statistics.median(clicked):.2f} s fresh "
              f"(min {min(clicked):.2f}, max {max(clicked):.2f}), {statistics.median(clicked_cached):.2f} s "
              f"scripts cached (min {min(clicked_cached):.2f}, max {max(clicked_cached):.2f}); runyard's first "
              f"open is {statistics.median(opened) / statistics.median(clicked):.2f}x and "
              f"{statistics.median(opened_cached) / statistics.median(clicked_cached):.2f}x")
    section = args.section or "Metrics"
    print(f"  in a tab already open: Open -> the Overview's first curve {statistics.median(tab_landing):.2f} s "
          f"(min {min(tab_landing):.2f}, max {max(tab_landing):.2f}); {section} -> its first chart "
          f"{statistics.median(tab_chosen):.2f} s (min {min(tab_chosen):.2f}, max {max(tab_chosen):.2f})")
    print(f"  load average: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if args.live:
        def browser_run(login_url: str, base: str, live_id: int) -> tuple[list[float], list[float]]:
            with sync_playwright() as pw:
                browser = launch_chromium(pw)
                try:
                    return in_one_tab(browser, session_cookies(browser, login_url), base, live_id, section,
                                      args.repeats, "live run")
                finally:
                    browser.close()

        live_landing, live_chosen = live_run(args, browser_run)
    result = (f"in a tab already open: Open -> the Overview's first curve **{median_s(tab_landing)}**, {section} -> "
              f"its first chart **{median_s(tab_chosen)}**; the first run opened in a new tab (Runs page loaded, "
              f"Open -> first curve) **{median_s(opened)}** fresh, {median_s(opened_cached)} scripts cached")
    if floor:
        result += (f" ({statistics.median(opened) / statistics.median(clicked):.2f}x, "
                   f"{statistics.median(opened_cached) / statistics.median(clicked_cached):.2f}x a bare page's click)")
    result += f"; its address in a new tab {median_s(first_new)} fresh, {median_s(first_cached)} cached"
    if floor:
        result += (f" ({statistics.median(first_new) / statistics.median(floor_first):.2f}x, "
                   f"{statistics.median(first_cached) / statistics.median(floor_cached):.2f}x a bare page's)")
    print_row("Run page in the browser", f"a finished {args.ranks}-rank {args.steps:,}-step run's first chart in "
              "Chromium: in an open tab, a new tab's first open, from its address"
              + (", beside a bare Streamlit page (the floor)" if floor else ""),
              result + f"; medians of {args.repeats}", load_at_start)
    if args.live:
        print_row("Run page of a live run", "the same in an open tab, on a 2-rank run training on the same cores",
                  f"Open -> the Overview's first curve **{median_s(live_landing)}**, {section} -> "
                  f"its first chart **{median_s(live_chosen)}**; medians of {args.repeats}", load_at_start)


if __name__ == "__main__":
    main()
