"""Submitting: a config that cannot run on this machine is refused and nothing is queued."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.run_list import list_runs
from db.vocabulary.config import ConfigError, GptCharWorkload, field_of, parse_config
from db.vocabulary.inventory import Inventory, check_fits
from db.vocabulary.settings import Settings
from orchestrator.scheduler.resources import detect_inventory
from orchestrator.submission import submit, validate

pytestmark = pytest.mark.both_dbs

CPU2 = Inventory(kind="cpu", slots=2)
# A GPU machine as NVML would describe it; CI has no GPU, so the inventory is constructed here.
GPU1 = Inventory(kind="gpu", slots=1, gpu_names=("NVIDIA H100 80GB HBM3",))


def test_too_many_ranks_for_the_cpu_slots() -> None:
    with pytest.raises(ConfigError) as info:
        validate({"launch": {"nproc_per_node": 64}}, CPU2)
    (problem,) = info.value.problems
    assert field_of(problem) == "launch.nproc_per_node"
    assert "64" in problem and "2 CPU slots" in problem
    # CPU slots are a setting, not hardware: the refusal names it and what to do.
    assert problem.endswith("use at most 2, or let 64 ranks share the cores: start the scheduler with "
                            "RUNYARD_CPU_SLOTS=64 (`RUNYARD_CPU_SLOTS=64 runyard up`; the default is the core count)")


def test_more_ranks_than_gpus() -> None:
    problems = check_fits(parse_config({"launch": {"nproc_per_node": 2}}), GPU1)
    assert problems == ["launch.nproc_per_node = 2: this machine has only 1 GPU(s); use at most 1"]


def test_nccl_needs_gpus() -> None:
    problems = check_fits(parse_config({"launch": {"backend": "nccl", "nproc_per_node": 1}}), CPU2)
    assert [field_of(p) for p in problems] == ["launch.backend"]


def test_schema_and_machine_problems_are_reported_together() -> None:
    with pytest.raises(ConfigError) as info:
        validate({"launch": {"nproc_per_node": 64}, "train": {"lr": -1}}, CPU2)
    assert {field_of(p) for p in info.value.problems} == {"train.lr", "launch.nproc_per_node"}


def test_submit_queues_and_writes_the_config(sessions: sessionmaker[Session], settings: Settings) -> None:
    config = validate({"name": "ok", "train": {"max_steps": 50}}, CPU2)
    run_id = submit(sessions, settings, config, CPU2)
    with sessions() as s:
        (run,) = list_runs(s)
    assert run["id"] == run_id and run["status"] == "QUEUED" and run["max_steps"] == 50
    written = json.loads((settings.run_dir(run_id) / "config.json").read_text())
    assert written["train"]["max_steps"] == 50 and written["name"] == "ok"


def test_refused_submit_queues_nothing(sessions: sessionmaker[Session], settings: Settings) -> None:
    with pytest.raises(ConfigError):
        submit(sessions, settings, parse_config({"launch": {"nproc_per_node": 3}}), CPU2)
    with sessions() as s:
        assert list_runs(s) == []
    assert not Path(settings.runs_dir).exists() or not any(Path(settings.runs_dir).iterdir())


def test_cpu_slots_can_be_set() -> None:
    inventory = detect_inventory({"RUNYARD_CPU_SLOTS": "6"})
    if inventory.kind == "gpu":
        pytest.skip("on a GPU machine the slots are the GPUs")
    assert inventory.slots == 6


# -- workload.text: a readable regular file of sensible size, made absolute --------------------


def _gpt(text: str, **workload: object) -> dict:
    return {"workload": {"kind": "gpt-char", "text": text, "block_size": 16, **workload}}


def test_text_is_made_absolute_against_the_submit_directory(tmp_path: Path, monkeypatch) -> None:
    (tmp_path / "corpus.txt").write_text("hello world, " * 100)
    monkeypatch.chdir(tmp_path)
    workload = validate(_gpt("corpus.txt"), CPU2).workload
    assert isinstance(workload, GptCharWorkload) and workload.text == str(tmp_path / "corpus.txt")


@pytest.mark.parametrize(("case", "expected"), [
    ("missing", "no such file"),
    ("directory", "is a directory"),
    ("/dev/zero", "is not a regular file"),
    ("fifo", "is not a regular file"),
    ("huge", "at most 256 MiB"),
    ("short", "too short for workload.block_size = 16"),
    ("", "empty path"),
])
def test_an_unusable_text_is_refused_naming_the_field_and_the_value(tmp_path: Path, case: str, expected: str) -> None:
    paths = {"missing": tmp_path / "nope.txt", "directory": tmp_path, "fifo": tmp_path / "fifo",
             "huge": tmp_path / "huge.txt", "short": tmp_path / "short.txt"}
    os.mkfifo(paths["fifo"])
    with open(paths["huge"], "wb") as f:
        f.truncate(300 * 1024**2)  # sparse: no disk used
    paths["short"].write_text("x" * 100)
    raw = str(paths.get(case, case))
    with pytest.raises(ConfigError) as info:
        validate(_gpt(raw), CPU2)
    (problem,) = info.value.problems
    assert field_of(problem) == "workload.text" and repr(raw) in problem and expected in problem
