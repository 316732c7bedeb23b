"""runyard's torchrun with ``--warm-ranks`` (trainer/agent/warm.py), run by hand as a person would
run ``torchrun ... -m trainer``: with the launcher's room in its environment the agent forks its
ranks with torch imported; without it a rank's environment does not fit, and the agent starts it
cold, as torchrun would, says why, and the run trains all the same.

Real torchrun, one real rank, two steps of the built-in digits workload; nothing of runyard's
scheduler or database (outside runyard the trainer reports nothing).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from db.vocabulary.config import parse_config
from orchestrator.executors.launcher import free_port
from trainer.agent.warm import WARM_OPTION, room

ROOT = Path(__file__).resolve().parents[2]


def run_by_hand(tmp_path: Path, env_extra: dict[str, str]) -> tuple[subprocess.CompletedProcess, str]:
    """torchrun with --warm-ranks over one rank; (the agent's result, the rank's output)."""
    config = tmp_path / "config.json"
    config.write_text(parse_config({"launch": {"nproc_per_node": 1}, "train": {"max_steps": 2}}).to_json())
    logs = tmp_path / "logs"
    env = {k: v for k, v in os.environ.items() if not k.startswith("RUNYARD_")}
    env.update(PYTHONPATH=str(ROOT), **env_extra)
    result = subprocess.run(
        [sys.executable, "-m", "trainer.agent.torchrun", WARM_OPTION, "--nnodes=1", "--nproc-per-node=1",
         "--rdzv-backend=c10d", f"--rdzv-endpoint=127.0.0.1:{free_port()}", "--local-addr=127.0.0.1",
         "--max-restarts=0", f"--log-dir={logs}", "--redirects=3", "-m", "trainer", "--config", str(config)],
        cwd=tmp_path, env=env, capture_output=True, text=True, timeout=180, check=False)
    (stdout,) = logs.rglob("stdout.log")
    return result, stdout.read_text()


@pytest.mark.parametrize("with_room", [True, False], ids=["room", "no-room"])
def test_the_agent_forks_its_ranks_warm_or_starts_them_cold_and_says_why(tmp_path: Path, with_room: bool) -> None:
    result, rank_output = run_by_hand(tmp_path, room() if with_room else {})
    assert result.returncode == 0, result.stderr[-3000:]
    assert "finished" in rank_output, rank_output[-3000:]
    if with_room:
        assert "started warm (forked from torchrun's agent)" in rank_output
        assert "starting cold" not in result.stderr
    else:
        assert "started cold (a fresh interpreter)" in rank_output
        assert "warm ranks: starting cold: the rank's environment does not fit the agent's" in result.stderr
