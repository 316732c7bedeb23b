"""Streamlit's AppTest of runyard's UI (app/main.py), as the unit tests open it.

Each new ``AppTest`` scans every installed distribution for Streamlit components on its first
run (``streamlit.components.v2.manifest_scanner``): about 0.2 s of CPU over the ~280 packages of
the test environment, a fifth of a typical page test's. The packages do not change while the
tests run, so the scan is made once per process; the UI server (one Streamlit runtime) scans once
at its start anyway.
"""

from __future__ import annotations

import functools
from pathlib import Path

from streamlit.components.v2 import manifest_scanner
from streamlit.testing.v1 import AppTest

MAIN = Path(__file__).resolve().parents[2] / "app" / "main.py"
TIMEOUT_S = 30

if not hasattr(manifest_scanner.scan_component_manifests, "cache_info"):
    manifest_scanner.scan_component_manifests = functools.cache(manifest_scanner.scan_component_manifests)


def new_app(timeout: float = TIMEOUT_S) -> AppTest:
    """app/main.py in an AppTest, not yet run."""
    return AppTest.from_file(str(MAIN), default_timeout=timeout)
