"""orchestrator/scripts/checkpoint_steps.py: the step a framework's checkpoint holds, read from the
checkpoint (Hugging Face's folder, Lightning's ``.ckpt``, nanoGPT's ``ckpt.pt``, names), without
running any code the checkpoint names."""

from __future__ import annotations

import json
import pickle
import sys
import types
from collections import OrderedDict
from pathlib import Path

import pytest
import torch

from orchestrator.scripts.checkpoint_steps import name_step, read_pickled_dict, step_in_checkpoint

FAKE_MODULE = "lightning.fabric.utilities.data"


class _Touch:
    """Unpickled by a plain unpickler, this creates a file: proof that a reader ran pickled code."""

    def __init__(self, marker: Path) -> None:
        self.marker = marker

    def __reduce__(self) -> tuple[object, tuple[Path]]:
        return Path.touch, (self.marker,)


def _lightning_ckpt(path: Path, global_step: int, marker: Path) -> None:
    """A checkpoint laid out like Lightning 2.x's ``Trainer.save_checkpoint``: tensors, an
    ``AttributeDict`` from Lightning (faked here: Lightning is not installed for the tests), the
    callbacks' states keyed by strings, a tensor score, and one object that runs code when a
    plain unpickler loads it."""
    fake = types.ModuleType(FAKE_MODULE)

    class AttributeDict(dict):
        pass

    AttributeDict.__module__ = FAKE_MODULE
    AttributeDict.__qualname__ = AttributeDict.__name__ = "AttributeDict"
    fake.AttributeDict = AttributeDict  # type: ignore[attr-defined]
    names = ["lightning", "lightning.fabric", "lightning.fabric.utilities", FAKE_MODULE]
    for name in names:
        sys.modules[name] = fake
    try:
        hparams = AttributeDict(lr=0.01, hidden=32)
        torch.save({
            "epoch": 3,
            "global_step": global_step,
            "pytorch-lightning_version": "2.4.0",
            "state_dict": OrderedDict([("layer.weight", torch.randn(4, 4)), ("layer.bias", torch.zeros(4))]),
            "loops": {"fit_loop": {"state_dict": {}, "epoch_progress": {"total": {"ready": 4, "completed": 3}}}},
            "callbacks": {"ModelCheckpoint{'monitor': 'val_loss', 'mode': 'min'}": {
                "best_model_score": torch.tensor(0.25), "best_model_path": "ckpts/epoch=2-step=200.ckpt"}},
            "optimizer_states": [{"state": {0: {"step": torch.tensor(300.0)}}, "param_groups": [{"lr": 0.01}]}],
            "lr_schedulers": [],
            "hparams_name": "kwargs",
            "hyper_parameters": hparams,
            "trap": _Touch(marker),
        }, path)
    finally:
        for name in names:
            sys.modules.pop(name, None)


def test_lightning_ckpt_step_read_without_lightning_and_without_running_its_code(tmp_path: Path) -> None:
    ckpt, marker = tmp_path / "last.ckpt", tmp_path / "ran"
    _lightning_ckpt(ckpt, 300, marker)
    assert "lightning" not in sys.modules
    with pytest.raises(pickle.UnpicklingError):
        torch.load(ckpt, weights_only=True)  # why a reader of its own is needed
    assert step_in_checkpoint(ckpt) == 300
    assert not marker.exists()
    pickle.loads(pickle.dumps(_Touch(marker)))  # noqa: S301 - our own bytes, to show the trap runs
    assert marker.exists()  # the trap is real: a plain unpickler runs it
    top = read_pickled_dict(ckpt)
    assert top is not None and top["epoch"] == 3 and top["hparams_name"] == "kwargs"


def test_lightning_step_beats_the_name(tmp_path: Path) -> None:
    ckpt = tmp_path / "epoch=3-step=290.ckpt"
    _lightning_ckpt(ckpt, 300, tmp_path / "ran")
    assert step_in_checkpoint(ckpt) == 300


def test_nanogpt_and_plain_dicts(tmp_path: Path) -> None:
    torch.save({"model": {"w": torch.ones(2)}, "iter_num": 1250, "best_val_loss": torch.tensor(1.5)},
               tmp_path / "ckpt.pt")
    assert step_in_checkpoint(tmp_path / "ckpt.pt") == 1250
    torch.save({"MODEL_STATE": {"w": torch.ones(2)}, "EPOCHS_RUN": 20, "STEPS_RUN": 160}, tmp_path / "snapshot.pt")
    assert step_in_checkpoint(tmp_path / "snapshot.pt") is None  # no key it knows
    assert step_in_checkpoint(tmp_path / "snapshot.pt", keys=["STEPS_RUN"]) == 160
    torch.save({"step": 7, "global_step": True}, tmp_path / "s.pt")  # a bool is not a step
    assert step_in_checkpoint(tmp_path / "s.pt") == 7


def test_a_real_modules_state_dict_beside_the_step(tmp_path: Path) -> None:
    """A module's state_dict() is an OrderedDict with ``_metadata`` set as instance state: the read
    must not stumble on it (it did: every nanoGPT and DDP-tutorial checkpoint said no step)."""
    model = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.LayerNorm(2))
    torch.save({"model": model.state_dict(), "iter_num": 350}, tmp_path / "ckpt.pt")
    assert step_in_checkpoint(tmp_path / "ckpt.pt") == 350
    torch.save({"MODEL_STATE": model.state_dict(), "EPOCHS_RUN": 6, "STEPS_RUN": 48}, tmp_path / "snapshot.pt")
    assert step_in_checkpoint(tmp_path / "snapshot.pt", keys=["EPOCHS_RUN"]) == 6


def test_hugging_face_folder_and_a_file_inside_it(tmp_path: Path) -> None:
    folder = tmp_path / "hf_out" / "checkpoint-350"
    folder.mkdir(parents=True)
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 352, "epoch": 1.4, "log_history": []}))
    (folder / "model.safetensors").write_bytes(b"\0" * 16)
    assert step_in_checkpoint(folder) == 352  # the state wins over the name
    assert step_in_checkpoint(folder / "model.safetensors") == 352
    (folder / "trainer_state.json").write_text("{not json")
    assert step_in_checkpoint(folder) == 350  # then the name


@pytest.mark.parametrize(("name", "step"), [
    ("checkpoint-350", 350), ("epoch=3-step=300.ckpt", 300), ("ckpt_000350.pt", 350), ("step_40.pt", 40),
    ("iter1500.pt", 1500), ("global_step400", 400), ("model-step-12.safetensors", 12),
    ("ckpt.pt", None), ("model_v2.pt", None), ("epoch=3.ckpt", None), ("last.ckpt", None), ("snapshot.pt", None),
])
def test_numbers_in_names(name: str, step: int | None) -> None:
    assert name_step(Path("out") / name) == step


def test_a_file_in_a_numbered_folder() -> None:
    assert name_step(Path("runs/checkpoint-80/optimizer.pt")) == 80


def test_accelerates_automatic_names_count_saves_not_steps(tmp_path: Path) -> None:
    """``ProjectConfiguration(automatic_checkpoint_naming=True)``: ``checkpoints/checkpoint_<i>``, i
    the number of saves before it. Its third save at step 67 was read as step 2."""
    folder = tmp_path / "checkpoints" / "checkpoint_2"
    folder.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.bin", "scheduler.bin"):
        (folder / name).write_bytes(b"\0" * 16)
    torch.save({"step": 0}, folder / "random_states_0.pkl")  # its accumulation counter, inside: not read
    assert step_in_checkpoint(folder) is None  # the caller takes the step the run had reported
    assert name_step(folder / "optimizer.bin") is None
    assert name_step(Path("ckpts/checkpoint-2")) == 2  # the Trainer's name is its step


def test_unreadable_or_foreign_files_say_no_step(tmp_path: Path) -> None:
    (tmp_path / "a.pt").write_bytes(b"PK\x03\x04 truncated")
    (tmp_path / "b.pt").write_bytes(pickle.dumps({"step": 5}))  # a bare pickle: not torch.save's zip
    torch.save([1, 2, 3], tmp_path / "c.pt")
    for name in ("a.pt", "b.pt", "c.pt", "missing.pt"):
        assert step_in_checkpoint(tmp_path / name) is None
