"""Fault injection for runyard's own tests, read from the environment of the ranks.

These make timing-dependent failures reproducible (a kill while a checkpoint is being written,
a kill at a known step); they never change what is computed.

- ``RUNYARD_FAULT_STEP_DELAY_S=0.02``: sleep this long after every step.
- ``RUNYARD_FAULT_SAVE_DELAY=STEP:SECONDS``: the checkpoint writer sleeps before publishing the
  checkpoint of STEP (so a test can kill the ranks while that save is in flight).
"""

from __future__ import annotations

import os


def step_delay_s() -> float:
    return float(os.environ.get("RUNYARD_FAULT_STEP_DELAY_S") or 0.0)


def save_delay_s(step: int) -> float:
    spec = os.environ.get("RUNYARD_FAULT_SAVE_DELAY") or ""
    if ":" not in spec:
        return 0.0
    at, seconds = spec.split(":", 1)
    return float(seconds) if int(at) == step else 0.0
