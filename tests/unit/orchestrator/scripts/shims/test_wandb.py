"""orchestrator/scripts/shims/wandb: a script's wandb calls become RUNYARD protocol lines with
wandb's step rules, and a real subprocess with RUNYARD_WANDB_SHIM=1 imports the stand-in."""

from __future__ import annotations

import importlib.util
import io
import json
import math
import subprocess
import sys
from argparse import Namespace
from pathlib import Path
from types import ModuleType

import pytest

from db.vocabulary.layout import WANDB_SHIM_DIR
from orchestrator.executors.launcher import SHIMS_DIR, with_wandb_shim
from orchestrator.scripts import Sample
from orchestrator.scripts.log_lines import parse_lines

SHIM = SHIMS_DIR / "wandb" / "__init__.py"


@pytest.fixture
def wandb(monkeypatch: pytest.MonkeyPatch) -> ModuleType:
    """A fresh copy of the shim (its module state is wandb's: wandb.run, wandb.config)."""
    spec = importlib.util.spec_from_file_location("wandb_shim_under_test", SHIM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setitem(sys.modules, spec.name, module)
    spec.loader.exec_module(module)
    return module


def lines_of(capsys: pytest.CaptureFixture[str]) -> list[dict]:
    out = capsys.readouterr().out.splitlines()
    assert all(line.startswith("RUNYARD ") for line in out), out
    return [json.loads(line[len("RUNYARD "):]) for line in out]


def test_each_log_call_is_a_step(wandb: ModuleType, capsys: pytest.CaptureFixture[str],
                                 monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RANK", "1")
    run = wandb.init(project="p", name="n", config={"lr": 0.1})
    wandb.log({"loss": 2.0})
    wandb.log({"loss": 1.5, "acc": 0.25})
    assert lines_of(capsys) == [{"step": 0, "rank": 1, "loss": 2.0}, {"step": 1, "rank": 1, "loss": 1.5, "acc": 0.25}]
    assert run.step == 2 and run.name == "n" and wandb.run is run


def test_commit_false_merges_into_the_next_commit(wandb: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    wandb.init()
    wandb.log({"loss": 2.0}, commit=False)
    wandb.log({"lr": 0.5}, commit=False)
    assert lines_of(capsys) == []
    wandb.log({"acc": 0.75})
    assert lines_of(capsys) == [{"step": 0, "rank": 0, "loss": 2.0, "lr": 0.5, "acc": 0.75}]


def test_an_explicit_step_gathers_until_a_later_step(wandb: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    wandb.init()
    wandb.log({"loss": 1.0}, step=10)
    wandb.log({"acc": 0.5}, step=10)  # commit defaults to False with a step: same row
    assert lines_of(capsys) == []
    wandb.log({"loss": 0.5}, step=20)  # a later step commits the one before
    assert lines_of(capsys) == [{"step": 10, "rank": 0, "loss": 1.0, "acc": 0.5}]
    wandb.log({"loss": 9.0}, step=15)  # below the current step: ignored, as wandb does
    captured = capsys.readouterr()
    assert captured.out == "" and "step 15 is below the current step 20" in captured.err
    wandb.log({"acc": 0.25}, step=20, commit=True)
    assert lines_of(capsys) == [{"step": 20, "rank": 0, "loss": 0.5, "acc": 0.25}]
    wandb.log({"loss": 0.1})  # auto-increment goes on from there
    assert lines_of(capsys) == [{"step": 21, "rank": 0, "loss": 0.1}]


def test_finish_commits_what_is_pending(wandb: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    run = wandb.init()
    wandb.log({"loss": 1.0}, step=3)
    wandb.finish()
    assert lines_of(capsys) == [{"step": 3, "rank": 0, "loss": 1.0}]
    assert wandb.run is None
    run.log({"loss": 0.5})  # after finish: ignored
    assert capsys.readouterr().out == ""
    with pytest.raises(wandb.Error, match=r"wandb\.init"):
        wandb.log({"loss": 1.0})


def test_nested_dicts_flatten_and_non_numbers_are_skipped_once(wandb: ModuleType,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    np = pytest.importorskip("numpy")
    torch = pytest.importorskip("torch")
    wandb.init()
    for _ in range(2):
        wandb.log({"train": {"loss": np.float32(0.5), "grad": {"norm": torch.tensor(2.0)}},
                   "samples": wandb.Table(columns=["a"]), "img": wandb.Image(None), "note": "text",
                   "nan": float("nan"), "flag": True})
    captured = capsys.readouterr()
    rows = [json.loads(line[len("RUNYARD "):]) for line in captured.out.splitlines()]
    assert [sorted(r) for r in rows] == [["flag", "nan", "rank", "step", "train/grad/norm", "train/loss"]] * 2
    assert rows[0]["train/loss"] == 0.5 and rows[0]["train/grad/norm"] == 2.0 and math.isnan(rows[0]["nan"])
    warnings = captured.err.splitlines()
    assert len(warnings) == 3 and all("not a number: not recorded" in w for w in warnings)  # one per key, once


def test_config_and_summary(wandb: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    run = wandb.init(config=Namespace(lr=0.1, batch=32))
    wandb.config.update({"epochs": 3})
    wandb.config.dropout = 0.2
    run.config["warmup"] = 10
    assert wandb.config is run.config
    assert (run.config.lr, run.config["batch"], wandb.config.epochs, run.config.dropout, run.config.warmup) == (
        0.1, 32, 3, 0.2, 10)
    assert "lr" in run.config and dict(run.config.items())["epochs"] == 3
    wandb.log({"loss": 1.0})
    wandb.log({"loss": 0.5})
    assert run.summary["loss"] == 0.5
    run.summary["best"] = 0.4
    assert run.summary.best == 0.4
    with pytest.raises(AttributeError):
        _ = run.config.missing


def test_the_rest_of_the_api_is_accepted(wandb: ModuleType) -> None:
    with wandb.init(project="p", entity="e", group="g", job_type="train", tags=["x"], mode="offline",
                    settings=wandb.Settings(start_method="thread")) as run:
        wandb.watch(object(), log="all")
        wandb.define_metric("loss", summary="min")
        run.log_artifact(wandb.Artifact("model", type="model"))
        assert wandb.login() is True
        assert wandb.init() is run  # a second init returns the running run
    assert wandb.run is None


def test_the_printed_lines_are_the_collectors_protocol(wandb: ModuleType) -> None:
    out = io.StringIO()
    run = wandb.init()
    run._out = out
    run.log({"loss": 1.0, "m": {"x": 2}})
    run.log({"loss": float("inf")}, step=5)
    run.finish()
    parsed = parse_lines(out.getvalue().splitlines(), default_rank=7, wall_time=1.0)
    assert parsed.problems == []
    assert parsed.samples == [Sample(0, 0, "loss", 1.0, 1.0), Sample(0, 0, "m/x", 2.0, 1.0),
                              Sample(0, 5, "loss", math.inf, 1.0)]


def test_a_script_finds_the_shim_first_on_its_path(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_text(
        "import wandb, sys\n"
        "print('module', wandb.__file__, file=sys.stderr)\n"
        "wandb.init(project='demo', config={'lr': 0.01})\n"
        "for step in range(3):\n"
        "    wandb.log({'loss': 1.0 / (step + 1), 'epoch': step // 2})\n"
    )  # no finish(): the pending row and the exit are wandb's business at exit
    env = with_wandb_shim({"RUNYARD_WANDB_SHIM": "1", "RANK": "1", "PATH": "/usr/bin:/bin"})
    done = subprocess.run([sys.executable, str(script)], env=env, capture_output=True, text=True, timeout=60,
                          check=False)
    assert done.returncode == 0, done.stderr
    assert f"module {SHIM}" in done.stderr
    parsed = parse_lines(done.stdout.splitlines(), default_rank=0, wall_time=1.0)
    assert [(s.rank, s.step, s.key, s.value) for s in parsed.samples] == [
        (1, 0, "loss", 1.0), (1, 0, "epoch", 0.0), (1, 1, "loss", 0.5), (1, 1, "epoch", 0.0),
        (1, 2, "loss", pytest.approx(1 / 3)), (1, 2, "epoch", 1.0)]
    plain = subprocess.run([sys.executable, "-c", "import wandb; print(wandb.__file__)"],
                           env=with_wandb_shim({"PATH": "/usr/bin:/bin"}), capture_output=True, text=True, timeout=60,
                           check=False)
    assert str(SHIMS_DIR) not in plain.stdout  # without the switch: the real wandb, or none


def test_define_metric_puts_keys_at_their_step_metric(wandb: ModuleType, capsys: pytest.CaptureFixture[str]) -> None:
    """What Hugging Face's WandbCallback declares: every key at its global step (counted after the step)."""
    run = wandb.init()
    run.define_metric("train/global_step")
    run.define_metric("*", step_metric="train/global_step", step_sync=True)
    wandb.log({"train/loss": 0.5, "train/global_step": 49})
    wandb.log({"eval/loss": 0.7, "train/epoch": 0, "train/global_step": 99})
    wandb.log({"train/learning_rate": 0.1})  # no step given: the last global step logged
    assert lines_of(capsys) == [{"step": 49, "rank": 0, "train/loss": 0.5},
                                {"step": 99, "rank": 0, "eval/loss": 0.7, "train/epoch": 0.0},
                                {"step": 99, "rank": 0, "train/learning_rate": 0.1}]


def test_lightnings_global_step_from_zero_is_recorded_one_higher(wandb: ModuleType,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    """Lightning's WandbLogger logs trainer/global_step from 0 (its first step at 0; its checkpoint
    after 50 steps holds global_step 50): recorded one higher, as its checkpoints count (the real
    Lightning: tests/integration/test_frameworks.py)."""
    run = wandb.init()
    run.define_metric("trainer/global_step")
    run.define_metric("*", step_metric="trainer/global_step", step_sync=True)
    wandb.log({"train_loss": 0.5, "trainer/global_step": 0})
    wandb.log({"train_loss": 0.4, "trainer/global_step": 49})
    wandb.log({"val_loss": 0.7, "epoch": 0})  # no step given: the last global step logged
    wandb.log({"trainer/global_step": 49, "lr": 0.1})  # without define_metric's rule too
    assert lines_of(capsys) == [{"step": 1, "rank": 0, "train_loss": 0.5},
                                {"step": 50, "rank": 0, "train_loss": 0.4},
                                {"step": 50, "rank": 0, "val_loss": 0.7, "epoch": 0.0},
                                {"step": 50, "rank": 0, "lr": 0.1}]


def test_the_stand_in_carries_a_wandb_distribution_frameworks_check_for() -> None:
    """Lightning's WandbLogger refuses a wandb without an installed distribution of at least
    0.12.10 (lightning_utilities' RequirementCache reads its metadata), and imports Run and
    RunDisabled from wandb's own modules; Hugging Face's WandbCallback imports ConfigError from
    wandb.sdk.lib.config_util and calls termwarn and the run's _label."""
    found = subprocess.run(
        [sys.executable, "-c", "import importlib.metadata as m, wandb, wandb.wandb_run, wandb.sdk.lib as lib; "
                               "from wandb.sdk.lib.config_util import ConfigError; "
                               "wandb.termwarn('x', repeat=False); wandb.init()._label(code='transformers_trainer'); "
                               "print(m.version('wandb'), wandb.__version__, wandb.wandb_run.Run is wandb.Run, "
                               "isinstance(lib.RunDisabled, type), issubclass(ConfigError, Exception))"],
        env=with_wandb_shim({"RUNYARD_WANDB_SHIM": "1", "PATH": "/usr/bin:/bin"}), capture_output=True, text=True,
        timeout=60, check=False)
    assert found.stdout.split() == ["0.12.10+runyard", "0.12.10+runyard", "True", "True", "True"], found.stderr
    assert "wandb: WARNING x" in found.stderr


def test_define_metric_for_some_keys_and_the_counter_for_the_rest(wandb: ModuleType,
                                                                 capsys: pytest.CaptureFixture[str]) -> None:
    wandb.init()
    wandb.define_metric("val/*", step_metric="epoch")
    wandb.log({"val/loss": 1.0, "epoch": 3, "train/loss": 2.0})
    assert lines_of(capsys) == [{"step": 3, "rank": 0, "val/loss": 1.0}, {"step": 0, "rank": 0, "train/loss": 2.0}]


@pytest.mark.parametrize("key", ["iter", "iter_num", "step", "global_step", "train/global_step"])
def test_a_logged_step_key_is_the_step_of_the_other_keys(wandb: ModuleType, capsys: pytest.CaptureFixture[str],
                                                         key: str) -> None:
    """nanoGPT: wandb.log({"iter": iter_num, "train/loss": ..., "val/loss": ...}) every eval."""
    wandb.init()
    for it in (0, 250, 500):
        wandb.log({key: it, "train/loss": 3.0 - it / 250, "val/loss": 3.1 - it / 250})
    assert [(line["step"], sorted(line)) for line in lines_of(capsys)] == [
        (it, ["rank", "step", "train/loss", "val/loss"]) for it in (0, 250, 500)]


def test_the_counter_continues_in_the_next_attempt(wandb: ModuleType, capsys: pytest.CaptureFixture[str],
                                                   monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    assert wandb.STATE_DIR == WANDB_SHIM_DIR
    monkeypatch.setenv("RUNYARD_RUN_DIR", str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    wandb.init()
    for value in (1.0, 2.0, 3.0):
        wandb.log({"val/loss": value})
    wandb.finish()
    second = wandb.init()  # the next attempt's rank 1 (the same files)
    wandb.log({"val/loss": 4.0})
    assert [line["step"] for line in lines_of(capsys)] == [0, 1, 2, 3] and second.step == 4
    assert json.loads((tmp_path / WANDB_SHIM_DIR / "rank-1.json").read_text()) == {"next_step": 4}
