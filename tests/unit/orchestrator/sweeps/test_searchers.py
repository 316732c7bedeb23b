"""The searchers: a suggestion is a function of the space, the seed, the trial's number and what
the searcher was told, never of timing: the same in every process, so a replay from a trial's row
gives its values; grid in its order, random seeded per trial, TPE through Optuna's ask/tell with a
constant liar; a repeat of an earlier trial is asked again, and a space with nothing new says so."""

from __future__ import annotations

import math
import subprocess
import sys
from typing import Any

import pytest

from db.vocabulary.config import parse_config
from db.vocabulary.config.sweep import SweepConfig
from orchestrator.sweeps.searchers import (
    COMPLETE,
    FAILED,
    PRUNED,
    RUNNING,
    Told,
    history_from_json,
    history_json,
    params_key,
    suggest,
)

SPACE = {"train.lr": {"log_uniform": [1e-4, 1e-2]}, "train.weight_decay": {"uniform": [0.0, 0.1]},
         "workload.hidden": {"int": [8, 64]}, "train.lr_schedule": {"choice": ["constant", "cosine"]}}


def sweep(searcher: str, space: dict[str, Any] = SPACE, **rest: Any) -> SweepConfig:
    config = parse_config({"sweep": {"searcher": searcher, "space": space, **rest}}).sweep
    assert config is not None
    return config


def test_random_is_seeded_per_trial_and_stays_in_the_space() -> None:
    s = sweep("random")
    first = [suggest(s, 7, n, []) for n in range(20)]
    assert first == [suggest(s, 7, n, []) for n in reversed(range(20))][::-1]  # not the order asked in
    assert first != [suggest(s, 8, n, []) for n in range(20)]  # the seed matters
    for p in first:
        assert p is not None and list(p) == list(SPACE)
        assert 1e-4 <= p["train.lr"] <= 1e-2 and 0.0 <= p["train.weight_decay"] <= 0.1
        assert isinstance(p["workload.hidden"], int) and 8 <= p["workload.hidden"] <= 64
        assert p["train.lr_schedule"] in ("constant", "cosine")
    lrs = sorted(math.log10(p["train.lr"]) for p in first if p is not None)
    assert lrs[0] < -3.3 and lrs[-1] > -2.7  # spread on the log scale


def test_the_same_suggestion_in_another_process() -> None:
    code = ("from db.vocabulary.config import parse_config; from orchestrator.sweeps.searchers import suggest;"
            f"s = parse_config({{'sweep': {{'space': {SPACE!r}}}}}).sweep; print(suggest(s, 7, 3, []))")
    other = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.strip()
    assert other == str(suggest(sweep("random"), 7, 3, []))


def test_a_repeat_is_asked_again_and_a_spent_space_says_so() -> None:
    small = sweep("random", {"workload.hidden": {"choice": [8, 16]}})
    first = suggest(small, 0, 0, [])
    assert first is not None
    second = suggest(small, 0, 1, [], taken={params_key(first)})
    assert second is not None and second != first
    assert suggest(small, 0, 2, [], taken={params_key(first), params_key(second)}) is None


def test_grid_is_the_nth_point_and_ends() -> None:
    grid = sweep("grid", {"workload.hidden": {"choice": [8, 16]}, "train.lr": {"uniform": [0.1, 0.3], "points": 3}})
    assert [suggest(grid, 0, n, []) for n in range(7)] == [
        {"workload.hidden": 8, "train.lr": 0.1}, {"workload.hidden": 8, "train.lr": pytest.approx(0.2)},
        {"workload.hidden": 8, "train.lr": 0.3}, {"workload.hidden": 16, "train.lr": 0.1},
        {"workload.hidden": 16, "train.lr": pytest.approx(0.2)}, {"workload.hidden": 16, "train.lr": 0.3}, None]


def _history(n: int) -> list[Told]:
    """n earlier trials: finished ones with their objective, one pruned with its rung values, one
    failed, the newest two still running."""
    s = sweep("random")
    states = [COMPLETE] * (n - 4) + [PRUNED, FAILED, RUNNING, RUNNING]
    out = []
    for number, state in enumerate(states):
        params = suggest(s, 1, number, [])
        assert params is not None
        value = (math.log10(params["train.lr"]) + 3) ** 2 if state == COMPLETE else None
        out.append(Told(number, params, state, value, {10: 0.9} if state == PRUNED else {}))
    return out


def test_tpe_replays_from_the_stored_history_and_lies_for_the_running_ones() -> None:
    s = sweep("tpe", goal="minimize")
    history = _history(14)
    first = suggest(s, 5, 14, history)
    stored = history_json(history)
    params = {t.number: t.params for t in history}
    assert suggest(s, 5, 14, history_from_json(stored, params)) == first  # from the row, the same values
    again = suggest(s, 5, 15, [*history, Told(14, first or {}, RUNNING)])
    assert again is not None and again != first  # started together, they differ
    assert first is not None and set(first) == set(SPACE)


def test_optuna_is_imported_only_for_a_tpe_sweep() -> None:
    code = ("import sys; from db.vocabulary.config import parse_config; from orchestrator.sweeps.searchers import "
            f"suggest; s = parse_config({{'sweep': {{'space': {SPACE!r}}}}}).sweep; suggest(s, 0, 0, []);"
            "import orchestrator.cli.group, orchestrator.scheduler.service;"
            "sys.exit(1 if 'optuna' in sys.modules else 0)")
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, check=False).returncode == 0
