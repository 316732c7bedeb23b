"""The RUNYARD_* variables: one typed model per audience (db/vocabulary/settings.py), every variable
the product reads is in one of them, bad values are named, the ranks' protocol round-trips
through its model, and the fault hooks and the processes that start by the dozen read theirs
without it.
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
from click.testing import CliRunner

from db.vocabulary.settings import EnvSettings, FaultEnv, RankEnv, Settings, SettingsError, load_settings
from db.vocabulary.settings_doc import TABLES
from orchestrator.cli.group import cli
from orchestrator.executors import shim
from tests.unit.paths import ROOT
from trainer import faults
from trainer.context import RunContext, context_from_env

PRODUCT = ("app", "orchestrator", "trainer", "db")

# Names that look like a variable but are not one: a Python constant (orchestrator/scripts/allowed_roots.py),
# the family name in trainer/faults.py's prose.
NOT_VARIABLES = frozenset({"RUNYARD_PACKAGES", "RUNYARD_FAULT"})


def _names_in_product() -> dict[str, set[str]]:
    """Every RUNYARD_NAME written in the product's Python files, with the files it is in."""
    found: dict[str, set[str]] = {}
    files = [ROOT / "runyard.py", *(p for top in PRODUCT for p in (ROOT / top).rglob("*.py"))]
    for path in files:
        if "migrations" in path.parts:
            continue
        for name in re.findall(r"(?<![A-Za-z0-9_])RUNYARD_[A-Z0-9_]*[A-Z0-9]", path.read_text()):
            found.setdefault(name, set()).add(str(path.relative_to(ROOT)))
    return found


def test_every_runyard_variable_the_product_names_is_in_a_model() -> None:
    """A new RUNYARD_* variable must be added to a model of db/vocabulary/settings.py (and so to the docs)."""
    known = {model.variable(field) for model in TABLES for field in model.model_fields}
    stray = {name: sorted(files) for name, files in _names_in_product().items() if name not in known | NOT_VARIABLES}
    assert stray == {}, f"RUNYARD_* names read outside db/vocabulary/settings.py's models: {stray}"


def test_values_are_typed_with_the_documented_defaults() -> None:
    env = EnvSettings.from_env({"RUNYARD_CPU_SLOTS": "6", "RUNYARD_SLURM_POLL_S": "1.5", "RUNYARD_HOME": "",
                                "runyard_slurm_max_jobs": "3", "RUNYARD_PROXY_SECRET": "s" * 20})
    assert env.cpu_slots == 6 and env.slurm_poll_s == 1.5
    assert env.home is None  # empty is unset
    assert env.slurm_max_jobs == 16  # only the name in capitals counts, as on Linux
    assert env.proxy_secret_text == "s" * 20 and "s" * 20 not in repr(env)
    assert env.exit_retry_s == shim.EXIT_RETRY_S  # the shim reads it without pydantic, with the same default


@pytest.mark.parametrize(("name", "value", "said"), [
    ("RUNYARD_CPU_SLOTS", "two", "RUNYARD_CPU_SLOTS = 'two': input should be a valid integer"),
    ("RUNYARD_CPU_SLOTS", "0", "RUNYARD_CPU_SLOTS = '0': input should be greater than or equal to 1"),
    ("RUNYARD_SLURM_POLL_S", "fast", "RUNYARD_SLURM_POLL_S = 'fast': input should be a valid number"),
    ("RUNYARD_SLURM_MAX_JOBS", "-1", "RUNYARD_SLURM_MAX_JOBS = '-1'"),
    ("RUNYARD_EXIT_RETRY_S", "-5", "RUNYARD_EXIT_RETRY_S = '-5'"),
])
def test_a_bad_value_is_one_sentence_naming_the_variable_and_the_value(name: str, value: str, said: str) -> None:
    with pytest.raises(SettingsError) as info:
        load_settings({name: value, "RUNYARD_HOME": "/tmp/x"})
    assert said in str(info.value) and "\n" not in str(info.value)


def test_a_bad_rank_variable_is_named_and_a_secret_is_never_shown() -> None:
    with pytest.raises(SettingsError, match=r"RUNYARD_ATTEMPT = 'first'"):
        context_from_env({"RUNYARD_ATTEMPT": "first"})
    with pytest.raises(SettingsError) as info:
        RankEnv.from_env({"RUNYARD_WANDB_SHIM": "yes"})
    assert "RUNYARD_WANDB_SHIM = 'yes'" in str(info.value)


def test_a_command_stops_on_a_bad_variable_with_one_line(settings: Settings, monkeypatch) -> None:
    monkeypatch.setenv("RUNYARD_SLURM_MAX_JOBS", "many")
    result = CliRunner().invoke(cli, ["ls"])
    assert result.exit_code == 1
    assert result.stderr.strip().splitlines() == [
        "error: RUNYARD_SLURM_MAX_JOBS = 'many': input should be a valid integer, unable to parse string as an "
        "integer (expected a whole number, at least 1)"]


def test_the_home_and_the_database_are_resolved_from_the_variables(tmp_path: Path) -> None:
    relative = load_settings({"RUNYARD_HOME": "data"}, cwd=tmp_path)
    assert relative.home == tmp_path / "data" and relative.home_from_env
    assert relative.db_url == f"sqlite:///{tmp_path / 'data' / 'runyard.db'}"
    default = load_settings({"HOME": str(tmp_path), "RUNYARD_DB_URL": "postgresql+psycopg://u@h/r"}, cwd=tmp_path)
    assert not default.home_from_env and default.db_url == "postgresql+psycopg://u@h/r"


@pytest.mark.parametrize("context", [
    RunContext(run_id=7, attempt=3, db_url="sqlite:////x/runyard.db", run_dir=Path("/r/run-7"),
               attempt_dir=Path("/r/run-7/attempts/3"), resume_dir=Path("/r/run-7/checkpoints/step-40"),
               resume_step=40),
    RunContext(run_id=2, attempt=1, db_url=None, run_dir=Path("/r/run-2"), attempt_dir=Path("/r/run-2/attempts/1"),
               resume_path=Path("/w/out/ckpt.pt"), resume_step=12),
])
def test_the_rank_protocol_round_trips_through_rank_env(context: RunContext) -> None:
    env = context.to_env()
    assert set(env) <= {RankEnv.variable(field) for field in RankEnv.model_fields}
    assert context_from_env(env) == context


def test_outside_runyard_a_rank_has_no_run() -> None:
    context = context_from_env({})
    assert context.run_id is None and context.attempt == 1 and not context.managed
    assert context.run_dir == Path(".") == context.attempt_dir


def test_fault_hooks_read_nothing_but_the_switch_until_it_is_on(monkeypatch) -> None:
    monkeypatch.setenv("RUNYARD_FAULT_STEP_DELAY_S", "soon")  # would be refused if it were read
    monkeypatch.delenv("RUNYARD_FAULTS", raising=False)
    assert faults.step_delay_s() == 0.0
    monkeypatch.setenv("RUNYARD_FAULTS", "1")
    with pytest.raises(SettingsError, match="RUNYARD_FAULT_STEP_DELAY_S = 'soon'"):
        faults.step_delay_s()
    monkeypatch.setenv("RUNYARD_FAULT_STEP_DELAY_S", "0.25")
    monkeypatch.setenv("RUNYARD_FAULT_STALL", "5:1")
    assert faults.step_delay_s() == 0.25 and FaultEnv.from_env().spec("RUNYARD_FAULT_STALL") == "5:1"


def test_the_processes_that_start_by_the_dozen_never_load_pydantic_settings() -> None:
    """A plain script's runner, the attempt's shim, the torchrun wrapper and the fault hooks (switch
    off) start once per rank or attempt: they read their variables without the settings models."""
    code = ("import sys, trainer.process.script_runner, trainer.agent.torchrun, trainer.context, trainer.faults\n"
            "import orchestrator.executors.shim\n"
            "trainer.faults.step_delay_s()\n"
            "print(sorted(m for m in ('pydantic_settings', 'db.vocabulary.settings') if m in sys.modules))")
    env = {k: v for k, v in os.environ.items() if k != "RUNYARD_FAULTS"}
    out = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, check=True, env=env)
    assert out.stdout.strip() == "[]", out.stdout + out.stderr
