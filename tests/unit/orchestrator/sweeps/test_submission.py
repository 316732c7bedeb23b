"""A sweep file checked before anything is queued: every bad input the issue names refused, each
naming its key, all of them at once; a good one started as a RUNNING sweep; `runyard submit`'s path
refuses a sweep file with the verb that starts one."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.models import Run, Sweep
from db.vocabulary.config import ConfigError
from db.vocabulary.inventory import Inventory
from orchestrator.submission import validate
from orchestrator.sweeps.submission import start_sweep, validate_sweep, validate_sweep_file

CPU = Inventory(kind="cpu", slots=4)
BASE: dict[str, Any] = {"name": "s", "launch": {"nproc_per_node": 2},
                        "train": {"max_steps": 300, "eval_every": 10, "log_every": 10}}
LR = {"train.lr": {"log_uniform": [1e-4, 1e-2]}}


def refused(sweep: dict[str, Any], base: dict[str, Any] | None = None) -> list[str]:
    with pytest.raises(ConfigError) as caught:
        validate_sweep({**(base or BASE), "sweep": sweep}, CPU)
    return caught.value.problems


BAD: list[tuple[str, dict[str, Any], dict[str, Any] | None, str]] = [
    ("an empty space", {"space": {}}, None, "sweep.space: the space is empty"),
    ("a log range at 0", {"space": {"train.lr": {"log_uniform": [0.0, 1e-2]}}}, None,
     'sweep.space."train.lr": log_uniform = [0.0, 0.01]: a log range needs both bounds above 0'),
    ("a log range below 0", {"space": {"train.weight_decay": {"log_uniform": [-1.0, 1.0]}}}, None,
     'sweep.space."train.weight_decay": log_uniform = [-1.0, 1.0]: a log range needs both bounds above 0'),
    ("a choice of the wrong type for the key", {"space": {"train.batch_size": {"choice": [32, "64"]}}}, None,
     "sweep.space.\"train.batch_size\" choice value '64': train.batch_size = '64': Input should be a valid integer"),
    ("a float range for an integer key", {"space": {"workload.hidden": {"uniform": [16, 64]}}}, None,
     'sweep.space."workload.hidden" uniform value 16.0: workload.hidden = 16.0: Input should be a valid integer'),
    ("a bound the key refuses", {"space": {"train.lr": {"uniform": [0.0, 0.1]}}}, None,
     'sweep.space."train.lr" uniform value 0.0: train.lr = 0.0: Input should be greater than 0'),
    ("a choice outside the key's values", {"space": {"train.precision": {"choice": ["fp32", "fp8"]}}}, None,
     "sweep.space.\"train.precision\" choice value 'fp8': train.precision = 'fp8': Input should be"),
    ("a key the base config does not have", {"space": {"train.learning_rate": {"uniform": [0.1, 1.0]}}}, None,
     'sweep.space."train.learning_rate": train.learning_rate is not a key of the base config'),
    ("another kind's key", {"space": {"workload.n_head": {"choice": [2, 4]}}}, None,
     "sweep.space.\"workload.n_head\": workload.n_head is not a key of the base config (workload.kind = "
     "'mlp-digits'"),
    ("a table, not a setting", {"space": {"train.lr.x": {"uniform": [0.1, 1.0]}}}, None,
     'sweep.space."train.lr.x": train.lr.x is not a key of the base config'),
    ("a metric the workload never records", {"metric": "val_loss", "space": LR}, None,
     "sweep.metric = 'val_loss': the mlp-digits workload never records it; it records loss, "),
    ("an evaluation too rare for the first rung", {"space": LR, "early_stop": {"min_steps": 10}},
     {**BASE, "train": {"max_steps": 300, "eval_every": 100}, "checkpoint": {"every_steps": 10}},
     "sweep.metric = 'eval_loss' is recorded first at step 100 (train.eval_every = 100): no value by the first "
     "rung (step 10)"),
    ("no rung below the end", {"space": LR, "early_stop": {"min_steps": 400}}, None,
     "sweep.early_stop.min_steps = 400 rounded up to checkpoint.every_steps = 100 gives no rung below "
     "train.max_steps = 300"),
    ("the step count varied under an early stop", {"space": {"train.max_steps": {"choice": [100, 200]}},
                                                   "early_stop": {"min_steps": 10}}, None,
     'sweep.space."train.max_steps": a sweep with [sweep.early_stop] cannot vary train.max_steps'),
    ("a grid of a range without points", {"searcher": "grid", "space": LR}, None,
     'sweep.space."train.lr": searcher = "grid" needs `points` for a log_uniform range'),
    ("no [sweep] at all", {}, None, "sweep: the file has no [sweep] section"),
]


@pytest.mark.parametrize(("sweep", "base", "expected"), [(s, b, e) for _, s, b, e in BAD],
                         ids=[name for name, *_ in BAD])
def test_bad_input_is_refused_before_anything_is_queued_naming_the_key(
        sweep: dict[str, Any], base: dict[str, Any] | None, expected: str) -> None:
    data = {**(base or BASE), **({"sweep": sweep} if sweep else {})}
    with pytest.raises(ConfigError) as caught:
        validate_sweep(data, CPU)
    assert any(p.startswith(expected) for p in caught.value.problems), caught.value.problems


def test_every_problem_of_the_base_and_the_sweep_at_once() -> None:
    space = {"train.lr": {"uniform": [0.0, 1.0]}, "train.nope": {"int": [1, 2]}}
    problems = refused({"metric": "nope", "space": space}, {**BASE, "launch": {"nproc_per_node": 9}})
    assert [p.split(":")[0].split(" ")[0] for p in problems] == [
        "launch.nproc_per_node", 'sweep.space."train.lr"', 'sweep.space."train.nope"', "sweep.metric"]


def test_a_good_sweep_file_starts_a_running_sweep(tmp_path: Path, sessions: sessionmaker[Session]) -> None:
    path = tmp_path / "sweep.toml"
    path.write_text('name = "s"\n[train]\nmax_steps = 300\neval_every = 10\n'
                    '[sweep]\nmax_trials = 4\n[sweep.space]\n"train.lr" = {log_uniform = [1e-4, 1e-2]}\n'
                    '[sweep.early_stop]\nmin_steps = 10\n')
    config = validate_sweep_file(path, ["sweep.max_concurrent=2", "train.seed=3"], CPU)
    assert config.sweep is not None and config.sweep.max_concurrent == 2 and config.train.seed == 3
    sweep_id = start_sweep(sessions, config)
    with sessions() as s:
        sweep = s.get(Sweep, sweep_id)
        assert sweep is not None and (sweep.status, sweep.max_trials, sweep.max_concurrent) == ("RUNNING", 4, 2)
        assert sweep.rungs_json == "[100]"  # 10 rounded up to checkpoint.every_steps = 100; 300 is the end
        assert '"sweep"' not in sweep.base_json and s.query(Run).count() == 0  # the scheduler makes the trials


def test_submit_refuses_a_sweep_file_with_the_verb_that_starts_one() -> None:
    with pytest.raises(ConfigError, match=r"this file is a sweep .*`runyard sweep start FILE`"):
        validate({**BASE, "sweep": {"space": LR}}, CPU)
