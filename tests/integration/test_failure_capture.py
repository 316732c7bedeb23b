"""The failure fixtures stay true: one case of tests/scripts/fail_cases.py runs again under real
2-rank torchrun, launched as the scheduler launches a script, and classifies exactly as its
captured copy in tests/fixtures/torchrun/ does (the unit tests classify the copies)."""

from __future__ import annotations

from pathlib import Path

import pytest

from orchestrator.scheduler.failures import classify
from tests.fixtures.torchrun.capture import HERE, materialize, run_case

pytestmark = pytest.mark.slow


def test_a_fresh_rank1_raise_classifies_as_its_fixture(tmp_path: Path) -> None:
    fresh_dir = tmp_path / "fresh"
    code = run_case("raise_rank1", fresh_dir, timeout_s=240)
    assert code != 0
    fresh = classify(fresh_dir, code)
    kept = classify(materialize(HERE / "raise_rank1", tmp_path / "kept"), code)
    assert (fresh.cause, fresh.rank, fresh.exception, fresh.location) == (
        kept.cause, kept.rank, kept.exception, kept.location)
    assert fresh.summary() == (
        "USER_ERROR on rank 1: ValueError: loss went NaN at step 50 (at fail_cases.py:24 in scale_gradients)")
