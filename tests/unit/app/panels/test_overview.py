"""The Overview's pins (app/panels/overview.py): pinning on one run keeps the person's pins of
metrics that run does not have, for the runs that have them."""

from __future__ import annotations

from app.panels.overview import pinned_after


def test_pins_of_metrics_the_run_lacks_are_kept() -> None:
    assert pinned_after(None, ["loss", "lr"], ["lr"]) == ["lr"]
    assert pinned_after(("val/x", "loss"), ["loss", "lr"], ["lr"]) == ["val/x", "lr"]
    assert pinned_after(("loss",), ["loss"], []) == []
