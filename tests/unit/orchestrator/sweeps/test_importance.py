"""Parameter importance: the key the objective depends on is found the most important, a key it
ignores the least (its time for 300 trials is bench/bench_sweep.py's)."""

from __future__ import annotations

import math
import random

from db.vocabulary.config import parse_config
from db.vocabulary.config.sweep import SweepConfig
from orchestrator.sweeps.importance import importance

SPACE = {"train.lr": {"log_uniform": [1e-5, 1e-1]}, "workload.hidden": {"choice": [32, 64, 128, 256]},
         "train.weight_decay": {"uniform": [0.0, 0.1]}}


def sweep() -> SweepConfig:
    config = parse_config({"sweep": {"space": SPACE, "goal": "minimize"}}).sweep
    assert config is not None
    return config


def synthetic(n: int, seed: int = 0) -> list[dict]:
    """Trials whose value depends on the learning rate a lot, on the width a little, on the decay not."""
    rng = random.Random(seed)
    out = []
    for _ in range(n):
        params = {"train.lr": math.exp(rng.uniform(math.log(1e-5), math.log(1e-1))),
                  "workload.hidden": rng.choice([32, 64, 128, 256]), "train.weight_decay": rng.uniform(0.0, 0.1)}
        value = (math.log10(params["train.lr"]) + 3) ** 2 + 1.0 * (params["workload.hidden"] == 32)
        out.append({"params": params, "value": value + rng.gauss(0, 0.01)})
    return out


def test_the_key_that_matters_is_found() -> None:
    shares = importance(sweep(), synthetic(120))
    assert list(shares) == list(SPACE) and abs(sum(shares.values()) - 1.0) < 1e-9
    assert shares["train.lr"] > 0.8 and shares["train.lr"] > shares["workload.hidden"] > shares["train.weight_decay"]


def test_too_few_or_valueless_trials_say_nothing() -> None:
    few = synthetic(3)
    assert set(importance(sweep(), few).values()) == {0.0}
    valueless = [{**t, "value": None} for t in synthetic(10)] + [{**t, "value": math.nan} for t in synthetic(10)]
    assert set(importance(sweep(), valueless).values()) == {0.0}

