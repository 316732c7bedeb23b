"""The fault hooks of runyard's own tests (trainer/faults.py): one object per component, there only
under the switch (``RUNYARD_FAULTS=1``), so that a stray ``RUNYARD_FAULT_*`` reaches nothing.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
import torch

from orchestrator.executors.local import LocalExecutor
from trainer import faults
from trainer.checkpoint import CheckpointManager

# -- the fault hooks' switch -------------------------------------------------------------------


def test_fault_hooks_do_nothing_without_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    for name, value in {"RUNYARD_FAULT_RAISE": "1", "RUNYARD_FAULT_STEP_DELAY_S": "5",
                        "RUNYARD_FAULT_SAVE_DELAY": "1:5", "RUNYARD_FAULT_SLOW_RANK": "0:5",
                        "RUNYARD_FAULT_STALL": "1:0", "RUNYARD_FAULT_SIGKILL": "1:0",
                        "RUNYARD_FAULT_EXIT_AFTER_LAUNCH": "1", "RUNYARD_FAULT_ABORT_AT_EXIT": "0",
                        "RUNYARD_FAULT_CUDA_OOM": "1:0", "RUNYARD_FAULT_PERTURB": "1:0"}.items():
        monkeypatch.setenv(name, value)
    monkeypatch.delenv("RUNYARD_FAULTS", raising=False)
    assert not faults.enabled()
    injected = faults.StepFaults(rank=0, attempt=1)
    injected.before(1, batch_size=64)  # would raise, OOM, SIGKILL or stall with the switch on
    injected.after()
    faults.maybe_abort_at_exit(0)
    faults.maybe_perturb(1, 0, [])
    assert (faults.step_delay_s(), faults.save_delay_s(1), faults.slow_rank_s(0)) == (0.0, 0.0, 0.0)
    assert not faults.exit_after_launch()
    monkeypatch.setenv("RUNYARD_FAULTS", "1")
    assert faults.step_delay_s() == 5.0 and faults.exit_after_launch()
    with pytest.raises(RuntimeError, match="injected failure at step 1"):
        faults.maybe_raise(1, 0, 1)
    monkeypatch.setenv("RUNYARD_FAULTS", "yes")  # only "1" turns them on
    assert not faults.enabled()


def test_the_training_loop_gets_its_fault_hooks_only_under_the_switch(monkeypatch: pytest.MonkeyPatch) -> None:
    """The built-in loop asks for one hook object: None in real training (nothing is called),
    the hooks in runyard's tests, where the perturbation lands after the optimizer step it names."""
    monkeypatch.setenv("RUNYARD_FAULT_PERTURB", "3:0")
    monkeypatch.delenv("RUNYARD_FAULTS", raising=False)
    assert faults.StepFaults.installed(rank=0, attempt=1) is None
    monkeypatch.setenv("RUNYARD_FAULTS", "1")
    hooks = faults.StepFaults.installed(rank=0, attempt=1)
    assert hooks is not None
    param = torch.zeros(2)
    hooks.after_update(2, [param])
    assert param.tolist() == [0.0, 0.0]
    hooks.after_update(3, [param])
    assert param[0].item() == pytest.approx(1e-3) and param[1].item() == 0.0


def test_every_component_gets_its_fault_hooks_only_under_the_switch(monkeypatch: pytest.MonkeyPatch,
                                                                      tmp_path: Path) -> None:
    """The entry point, the checkpoint writer and the local executor each ask for one hook
    object, as the training loop does: None without the switch (a stray RUNYARD_FAULT_* in a
    user's shell reaches nothing), the hooks in runyard's tests."""
    monkeypatch.setenv("RUNYARD_FAULT_SAVE_DELAY", "2:0.3")
    monkeypatch.setenv("RUNYARD_FAULT_EXIT_AFTER_LAUNCH", "1")
    monkeypatch.setenv("RUNYARD_FAULT_SETUP_DELAY_S", "0.3")
    monkeypatch.delenv("RUNYARD_FAULTS", raising=False)
    assert faults.EntryFaults.installed(rank=0) is None
    assert faults.SaveFaults.installed() is None and faults.LaunchFaults.installed() is None
    assert CheckpointManager(tmp_path / "off")._faults is None and LocalExecutor()._faults is None
    monkeypatch.setenv("RUNYARD_FAULTS", "1")
    entry, save, launch = faults.EntryFaults.installed(rank=0), faults.SaveFaults.installed(), \
        faults.LaunchFaults.installed()
    assert entry is not None and save is not None and launch is not None
    assert CheckpointManager(tmp_path / "on")._faults is not None and LocalExecutor()._faults is not None
    assert launch.exit_after_launch()
    started = time.monotonic()
    save.before_publish(1)  # not the step it names: no wait
    assert time.monotonic() - started < 0.25
    save.before_publish(2)
    entry.during_setup()
    assert time.monotonic() - started >= 0.6
