"""Where the checkout is, for the unit tests of every folder: its root, which holds the packages,
the examples and the docs."""

from __future__ import annotations

from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
