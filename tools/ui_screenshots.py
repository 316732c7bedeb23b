"""docs/UI.md's screenshots: the Run page's Metrics section and the Compare page of two 600-step
digits runs that differ in ``train.lr``, taken in Debian's headless Chromium at 1440 px.

    .venv/bin/python tools/ui_screenshots.py [OUT_DIR]   # default docs/images

It starts its own `runyard up` on a free port with a throwaway data folder, trains the two runs
(about a minute on two cores) and stops everything it started.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from PIL import Image  # noqa: E402 - after the path: the test helpers below live in the repository
from playwright.sync_api import sync_playwright  # noqa: E402

from tests.browser.conftest import CHROMIUM_ARGS, _free_port, _runyard_argv, _stop, _wait_healthy, chromium_binary  # noqa: E402
from tests.browser.test_ui_browser import wait_settled  # noqa: E402

RUNS = (("digits-lr1e-3", "0.001"), ("digits-lr3e-3", "0.003"))


def main(out: Path) -> None:
    out.mkdir(parents=True, exist_ok=True)
    folder = Path(tempfile.mkdtemp(prefix="runyard-shots-"))
    home = folder / "home"
    port = _free_port()
    url = f"http://127.0.0.1:{port}"
    env = {**os.environ, "RUNYARD_HOME": str(home), "RUNYARD_CPU_SLOTS": "2", "OMP_WAIT_POLICY": "PASSIVE"}
    env.pop("RUNYARD_DB_URL", None)
    log = folder / "runyard-up.log"
    with log.open("w") as f:
        proc = subprocess.Popen([*_runyard_argv(), "up", "--port", str(port)], env=env, stdout=f,
                                stderr=subprocess.STDOUT)
    try:
        login = _wait_healthy(url, proc, log)
        ids = []
        for name, lr in RUNS:
            done = subprocess.run([*_runyard_argv(), "submit", str(ROOT / "examples" / "digits.toml"),
                                   "--set", "train.max_steps=600", "--set", f"train.lr={lr}", "--set", f"name={name}",
                                   "--set", "checkpoint.every_steps=200"], env=env, capture_output=True, text=True,
                                  check=True)
            ids.append(int(done.stdout.strip().splitlines()[-1]))
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline:
            listed = json.loads(subprocess.run([*_runyard_argv(), "ls", "--json"], env=env, capture_output=True,
                                               text=True, check=True).stdout)
            if sorted(r["id"] for r in listed if r["status"] == "SUCCEEDED") == sorted(ids):
                break
            time.sleep(3)
        else:
            raise SystemExit(f"the runs did not succeed in 10 minutes; see {log}")
        with sync_playwright() as pw:
            browser = pw.chromium.launch(executable_path=chromium_binary(), headless=True, args=CHROMIUM_ARGS)
            page = browser.new_context(viewport={"width": 1440, "height": 900}, color_scheme="light").new_page()
            page.set_default_timeout(60_000)
            page.goto(login)
            page.goto(f"{url}/run?run={ids[1]}&section=Metrics")
            page.get_by_role("radio", name="per rank", exact=True).wait_for()
            wait_settled(page)
            page.screenshot(path=str(out / "run.png"))
            page.set_viewport_size({"width": 1440, "height": 1350})
            page.goto(f"{url}/compare?runs={ids[0]},{ids[1]}")
            page.get_by_role("heading", name="Compare runs", level=1).wait_for()
            wait_settled(page)
            page.screenshot(path=str(out / "compare.png"))
            browser.close()
        # The compare page down to its first row of charts.
        Image.open(out / "compare.png").crop((0, 0, 1440, 1215)).save(out / "compare.png", optimize=True)
        print(f"wrote {out / 'run.png'} and {out / 'compare.png'}")
    finally:
        _stop(proc, home)


if __name__ == "__main__":
    main(Path(sys.argv[1]) if len(sys.argv) > 1 else ROOT / "docs" / "images")
