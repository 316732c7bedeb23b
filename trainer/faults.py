"""Fault injection for runyard's own tests, read from the environment of the ranks.

These make timing-dependent failures reproducible (a kill while a checkpoint is being written,
a kill at a known step); they never change what is computed.

- ``RUNYARD_FAULT_STEP_DELAY_S``: sleep this long after every step.
- ``RUNYARD_FAULT_SAVE_DELAY_S``: the checkpoint writer sleeps this long before publishing.
"""

from __future__ import annotations

import os


def step_delay_s() -> float:
    return float(os.environ.get("RUNYARD_FAULT_STEP_DELAY_S") or 0.0)


def save_delay_s() -> float:
    return float(os.environ.get("RUNYARD_FAULT_SAVE_DELAY_S") or 0.0)
