"""`runyard import tensorboard LOGDIR` (orchestrator/cli/imported.py): a past run's scalars, written
by torch's own SummaryWriter, become a finished run that `runyard ls`, `show` and `metrics` list
like any other, and that cannot be rerun or resumed.
"""

from __future__ import annotations

import csv
import io
import json
from pathlib import Path

import pytest
from click.testing import CliRunner

from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli

tensorboard = pytest.importorskip("torch.utils.tensorboard")


def write_logdir(root: Path) -> Path:
    """A run as TensorBoard users keep one: a writer per rank in rank<N> folders, two tags on
    their own step counters."""
    for rank in (0, 1):
        writer = tensorboard.SummaryWriter(str(root / "exp" / f"rank{rank}"))
        for step in range(1, 21):
            writer.add_scalar("train/loss", 1 / step + rank, step)
            if step % 5 == 0:
                writer.add_scalar("eval/acc", step / 20, step // 5)
        writer.close()
    return root / "exp"


def invoke(*args: str) -> str:
    result = CliRunner().invoke(cli, list(args), catch_exceptions=False)
    assert result.exit_code == 0, result.output
    return result.stdout  # what a script reads (notes go to stderr)


def test_import_makes_a_finished_run_with_every_tag_on_its_own_steps(settings: Settings, tmp_path: Path) -> None:
    logdir = write_logdir(tmp_path / "old")
    run_id = int(invoke("import", "tensorboard", str(logdir), "--name", "baseline").strip())
    (listed,) = json.loads(invoke("ls", "--json"))
    assert (listed["id"], listed["name"], listed["status"]) == (run_id, "baseline", "SUCCEEDED")
    assert listed["status_reason"] == f"imported from {logdir}" and listed["tags"] == ["imported"]
    assert (listed["step"], listed["max_steps"], listed["progress"]) == (20, 20, 1.0)
    assert listed["cost_usd"] == 0.0 and listed["nproc"] == 2
    detail = json.loads(invoke("show", str(run_id), "--json"))
    assert detail["config"]["workload"]["kind"] == "script"
    assert detail["elapsed_s"] is not None and detail["elapsed_s"] >= 0
    (attempt,) = detail["attempts"]
    assert attempt["status"] == "SUCCEEDED" and attempt["reason"] == f"imported from {logdir}"
    rows = list(csv.DictReader(io.StringIO(invoke("metrics", str(run_id)))))
    steps = {(key, rank): sorted(int(r["step"]) for r in rows if (r["key"], r["rank"]) == (key, rank))
             for key in ("train/loss", "eval/acc") for rank in ("0", "1")}
    assert steps == {("train/loss", "0"): list(range(1, 21)), ("train/loss", "1"): list(range(1, 21)),
                     ("eval/acc", "0"): [1, 2, 3, 4], ("eval/acc", "1"): [1, 2, 3, 4]}
    assert "imported from" in invoke("show", str(run_id))


def test_import_names_what_is_wrong_with_the_folder(settings: Settings, tmp_path: Path) -> None:
    runner = CliRunner()
    result = runner.invoke(cli, ["import", "tensorboard", str(tmp_path / "none")])
    assert result.exit_code == 2 and "no such folder" in result.output and "nothing was imported" in result.output
    (tmp_path / "empty").mkdir()
    result = runner.invoke(cli, ["import", "tensorboard", str(tmp_path / "empty")])
    assert result.exit_code == 2 and "no TensorBoard event file" in result.output
    assert json.loads(invoke("ls", "--json")) == []


def test_an_imported_run_cannot_be_rerun_or_resumed(settings: Settings, tmp_path: Path) -> None:
    logdir = write_logdir(tmp_path / "old")
    run_id = invoke("import", "tensorboard", str(logdir)).strip()
    for verb in ("rerun", "resume"):
        result = CliRunner().invoke(cli, [verb, run_id], catch_exceptions=False)
        assert result.exit_code != 0, result.output
    rerun = CliRunner().invoke(cli, ["rerun", run_id], catch_exceptions=False)
    assert f"was imported from {logdir}" in rerun.output and "no script to run" in rerun.output
    (listed,) = json.loads(invoke("ls", "--json"))
    assert listed["status"] == "SUCCEEDED"  # nothing was queued
