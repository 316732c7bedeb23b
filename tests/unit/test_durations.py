"""tests/durations.py: the browser tests' last durations, read from JUnit, order the tier longest first."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from tests import durations
from tests.conftest import RUNYARD_UP_MARK, module_shares_a_product

ROOT = Path(__file__).resolve().parents[2]

JUNIT = """<?xml version="1.0" encoding="utf-8"?>
<testsuites><testsuite name="pytest">
<testcase classname="tests.browser.test_ui_browser" name="test_slow[a b]" time="70.25"/>
<testcase classname="tests.browser.test_ui_browser" name="test_quick" time="1.9"/>
<testcase classname="tests.unit.test_durations.TestSome" name="test_in_a_class" time="3"/>
</testsuite></testsuites>
"""


def test_a_junit_report_becomes_node_ids_of_the_tests_that_took_two_seconds_or_more(tmp_path: Path) -> None:
    report = tmp_path / "browser.xml"
    report.write_text(JUNIT)
    assert durations.from_junit([str(report)]) == {
        "tests/browser/test_ui_browser.py::test_slow[a b]": 70.2,
        "tests/unit/test_durations.py::TestSome::test_in_a_class": 3.0,
    }


def test_the_browser_tier_is_collected_longest_first() -> None:
    """The committed durations order the browser tier: its longest single test (one not in a
    module that shares one `runyard up`) comes before every test measured at under half of it."""
    measured = {k: v for k, v in durations.measured().items() if k.startswith("tests/browser/")}
    assert measured, "tests/durations.json holds no browser test"
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    out = subprocess.run([sys.executable, "-m", "pytest", "--collect-only", "-q", "-p", "no:cacheprovider",
                          "tests/browser"], cwd=ROOT, env=env, capture_output=True, text=True, check=True).stdout
    order = [line for line in out.splitlines() if line.startswith("tests/browser/") and "::" in line]
    shared = {p for p in {k.split("::")[0] for k in measured} if module_shares_a_product(ROOT / p, (RUNYARD_UP_MARK,))}
    singles = {k: v for k, v in measured.items() if k.split("::")[0] not in shared}
    longest = max(singles, key=singles.__getitem__)
    quick = [k for k in order if measured.get(k, 0.0) < singles[longest] / 2 and k.split("::")[0] not in shared]
    assert quick and all(order.index(longest) < order.index(k) for k in quick), (longest, order)
