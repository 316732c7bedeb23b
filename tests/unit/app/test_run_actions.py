"""The Run page offers Resume for a run paused before it started (issue 25 item 6)."""

from __future__ import annotations

from typing import Any

from app.run_actions import offered, resume_held_button, resume_menu


def _applies(d: dict[str, Any]) -> set[str]:
    return {draw.__name__ for applies, draw in offered(d) if applies}


def test_a_run_paused_before_it_started_offers_resume_and_a_started_one_does_not() -> None:
    held = {"id": 1, "status": "PAUSED", "attempts": [], "checkpoints": [], "imported": False,
            "config": {"workload": {"kind": "digits"}}}
    assert resume_held_button.__name__ in _applies(held)
    started = {**held, "attempts": [{"number": 1}]}
    assert resume_held_button.__name__ not in _applies(started)
    assert resume_menu.__name__ not in _applies(held)  # nothing to choose from: one plain Resume
