"""The browser tests' last measured durations, so that the longest start first (tests/conftest.py).

Under pytest-xdist every worker takes the next test as it frees up; a long test dispatched last
keeps one worker busy after the others have run out of work (the browser tier's 70 s test, taken
11th of 21, added about 20 s to the tier in a replay of CI 52's durations). ``durations.json``
beside this file holds the tests that took at least ``KEEP_FROM_S`` in a CI run, by node id; a
test not in it counts as quick. Refresh it from a run's JUnit file after the tests change a lot:

    .venv/bin/python -m tests.durations .test-reports/browser.xml

It only orders the tests: a stale or missing file costs some minutes of balance, never a result.
"""

from __future__ import annotations

import functools
import json
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

FILE = Path(__file__).with_name("durations.json")
ROOT = Path(__file__).resolve().parents[1]
KEEP_FROM_S = 2.0


@functools.cache
def measured() -> dict[str, float]:
    """Node id -> seconds, from ``durations.json`` (empty where it is missing or unreadable)."""
    try:
        data = json.loads(FILE.read_text())
    except (OSError, ValueError):
        return {}
    return {str(k): float(v) for k, v in data.items()} if isinstance(data, dict) else {}


def node_id(classname: str, name: str) -> str:
    """The pytest node id of a JUnit test case (``tests.browser.test_x`` or ``tests.unit.test_y.TestZ``)."""
    parts = classname.split(".")
    for cut in range(len(parts), 0, -1):
        module = "/".join(parts[:cut]) + ".py"
        if (ROOT / module).is_file():
            return "::".join([module, *parts[cut:], name])
    return f"{classname.replace('.', '/')}.py::{name}"


def from_junit(paths: list[str]) -> dict[str, float]:
    """The tests of the JUnit XML files at ``paths`` that took at least ``KEEP_FROM_S``."""
    out: dict[str, float] = {}
    for path in paths:
        for case in ET.parse(path).getroot().iter("testcase"):  # noqa: S314 - a test run's own report
            seconds = float(case.get("time") or 0)
            if seconds >= KEEP_FROM_S:
                out[node_id(case.get("classname") or "", case.get("name") or "")] = round(seconds, 1)
    return dict(sorted(out.items()))


if __name__ == "__main__":
    if len(sys.argv) < 2:
        sys.exit("usage: python -m tests.durations JUNIT.xml ...")
    durations = from_junit(sys.argv[1:])
    FILE.write_text(json.dumps(durations, indent=0) + "\n")
    print(f"{FILE}: {len(durations)} tests of at least {KEEP_FROM_S:g} s")
