"""The launcher's torchrun command (orchestrator/executors/launcher.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from db.vocabulary.config import RunConfig, parse_config
from orchestrator.executors.launcher import SHIMS_DIR, agent_env, rank_env, torchrun_argv
from tests.unit.paths import ROOT
from trainer.agent import torchrun
from trainer.agent.warm import ROOM_VARIABLE, WARM_OPTION

SCRIPT_RUNNER = ROOT / "trainer" / "process" / "script_runner.py"


def test_a_script_launch_goes_through_the_entry_module() -> None:
    config = parse_config({"workload": {"kind": "script", "script": "/abs/train.py", "args": ["--lr", "1"]}})
    argv = torchrun_argv(config, 1, 1, 29500, Path("/tmp/a"))
    assert argv[-5:] == ["-m", "trainer.process.script_runner", "/abs/train.py", "--lr", "1"]
    config = parse_config({"workload": {"kind": "script", "module": "pkg.train", "workdir": "/w"}})
    assert torchrun_argv(config, 1, 1, 29500, Path("/tmp/a"))[-5:] == [
        "trainer.process.script_runner", "--workdir", "/w", "-m", "pkg.train"]


def test_the_launcher_runs_torchrun_through_the_loopback_entry() -> None:
    config = parse_config({"launch": {"nproc_per_node": 2}})
    argv = torchrun_argv(config, 7, 3, 29511, Path("/tmp/a"))
    assert argv[:3] == [sys.executable, "-m", "trainer.agent.torchrun"]
    assert "--rdzv-endpoint=127.0.0.1:29511" in argv and "--local-addr=127.0.0.1" in argv
    # Everything else is torchrun's, as before: one node, no restarts, per-rank logs and redirects.
    assert {"--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-id=runyard-7-3", "--max-restarts=0",
            "--log-dir=/tmp/a/ranks", "--redirects=3"} <= set(argv)
    assert argv[-2:] == ["-m", "trainer"]
    assert argv[3] == "--warm-ranks"  # the built-in trainer's ranks are forked from the agent
    torchrun.check_one_loopback_node(argv[4:])  # the entry accepts what the launcher builds


def test_only_the_built_in_trainer_starts_warm_and_only_its_agent_gets_the_room() -> None:
    built_in, cold = parse_config({}), parse_config({"launch": {"warm_start": False}})
    script = script_config(script="/w/t.py")
    for config, warm in ((built_in, True), (cold, False), (script, False)):
        argv = torchrun_argv(config, 7, 3, 29511, Path("/tmp/a"))
        assert (WARM_OPTION in argv) is warm
        assert (ROOM_VARIABLE in agent_env(config, {"A": "1"})) is warm


def script_config(**workload: object) -> RunConfig:
    return parse_config({"launch": {"nproc_per_node": 2},
                         "workload": {"kind": "script", **workload}})


def test_a_script_runs_through_the_runner_with_its_resume_arguments_only_when_resuming() -> None:
    config = script_config(script="/w/train.py", args=["cfg.py", "--x=1"], checkpoint_glob="out/ckpt.pt",
                           resume_args=["--init_from=resume"])
    fresh = torchrun_argv(config, 1, 1, 29500, Path("/tmp/a"))
    assert fresh[-5:] == ["-m", "trainer.process.script_runner", "/w/train.py", "cfg.py", "--x=1"]
    resumed = torchrun_argv(config, 1, 2, 29500, Path("/tmp/a"), resuming=True)
    assert resumed[-3:] == ["cfg.py", "--x=1", "--init_from=resume"]
    torchrun.check_one_loopback_node(resumed[3:])


def test_a_module_and_another_interpreter_are_started_as_python_would() -> None:
    config = script_config(module="pkg.train", args=["--lr=3"], python="/venvs/x/bin/python")
    argv = torchrun_argv(config, 1, 1, 29500, Path("/tmp/a"))
    # torchrun starts that interpreter itself, and the runner by its path (nothing of runyard's
    # environment is imported there).
    runner = str(SCRIPT_RUNNER)
    assert argv[-7:] == ["--no-python", "/venvs/x/bin/python", "-u", runner, "-m", "pkg.train", "--lr=3"]
    torchrun.check_one_loopback_node(argv[3:])


def test_omp_threads_default_to_the_cores_per_rank_unless_set() -> None:
    assert rank_env(script_config(script="/w/t.py"), {}, cores=16)["OMP_NUM_THREADS"] == "8"
    assert rank_env(script_config(script="/w/t.py"), {}, cores=1)["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in rank_env(script_config(script="/w/t.py"), {"OMP_NUM_THREADS": "3"}, cores=16)
    assert rank_env(script_config(script="/w/t.py", env={"OMP_NUM_THREADS": "5"}), {}, cores=16)[
        "OMP_NUM_THREADS"] == "5"


def test_built_in_ranks_get_the_same_threads_on_one_node_or_two() -> None:
    """torchrun sets OMP_NUM_THREADS=1 only where a node has several ranks: a local 2-node run of
    one rank each got every core per rank (oversubscribed), and arithmetic other than the same
    world on one node (its losses differed in the last bits under load). runyard sets it for every
    workload, from the ranks that share this machine."""
    one_node = parse_config({"launch": {"nproc_per_node": 2}})
    two_nodes = parse_config({"launch": {"nnodes": 2, "nproc_per_node": 1}})
    assert rank_env(one_node, {}, cores=2) == rank_env(two_nodes, {}, cores=2) == {"OMP_NUM_THREADS": "1"}
    assert rank_env(two_nodes, {}, cores=8) == {"OMP_NUM_THREADS": "4"}
    assert rank_env(one_node, {"OMP_NUM_THREADS": "3"}, cores=8) == {}  # the person's own wins


def test_the_wandb_stand_in_goes_first_on_the_ranks_path_when_asked() -> None:
    env = rank_env(script_config(script="/w/t.py", env={"RUNYARD_WANDB_SHIM": "1"}), {"PYTHONPATH": "/mine"},
                     cores=2)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(SHIMS_DIR), "/mine"]
    assert "PYTHONPATH" not in rank_env(script_config(script="/w/t.py"), {"PYTHONPATH": "/mine"}, cores=2)
