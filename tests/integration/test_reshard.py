"""Resharding on load, both ways, through the checkpoint manager: an FSDP2 model and its AdamW
state saved by 2 gloo ranks load onto 4, and those 4 save again (each its own shard) and load back
onto 2, with every parameter and every optimizer moment equal to what was saved (compared as full
tensors, gathered only for the comparison). Real processes (forked), real files. (A 4-rank
gpt-char run forked onto 2 trains on in tests/integration/test_gpt_char.py.)"""

from __future__ import annotations

import socket
from pathlib import Path
from typing import Any

import pytest
import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from trainer.checkpoint import CheckpointManager
from trainer.checkpoint.checkpointer import restore_sharded, sharded_state

pytestmark = pytest.mark.slow


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _build(world: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    torch.manual_seed(0)
    model = torch.nn.Sequential(torch.nn.Linear(12, 20), torch.nn.GELU(), torch.nn.Linear(20, 7))
    mesh = init_device_mesh("cpu", (world,))
    for layer in model:
        if isinstance(layer, torch.nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    return model, torch.optim.AdamW(model.parameters(), lr=0.01)


def _full(model: torch.nn.Module, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
    from torch.distributed.checkpoint.state_dict import StateDictOptions, get_state_dict

    model_sd, optim_sd = get_state_dict(model, optimizer, options=StateDictOptions(full_state_dict=True))
    return {"model": model_sd, "optimizer": optim_sd["state"]}


def _rank(rank: int, world: int, port: int, root: str, phase: str) -> None:
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world)
    try:
        model, optimizer = _build(world)
        objects = {"model": model, "optimizer": optimizer}
        ckpts = Path(root) / "checkpoints"
        if phase == "train":  # a few steps, then save
            for step in range(3):
                torch.manual_seed(100 + step * world + rank)
                model(torch.randn(4, 12)).pow(2).mean().backward()
                optimizer.step()
                optimizer.zero_grad()
            saved_step = 3
        else:  # load what the other world saved, then save it again from this one
            tensors, _ = sharded_state(objects)
            loaded, _ = CheckpointManager(ckpts, is_writer=False).load(tensors)
            restore_sharded(objects, tensors)
            saved_step = loaded + 1
        full = _full(model, optimizer)
        if rank == 0:
            torch.save(full, Path(root) / f"full-{phase}-{world}.pt")
        manager = CheckpointManager(ckpts, is_writer=rank == 0)
        tensors, plain = sharded_state(objects)
        manager.save(saved_step, tensors, extra={"state": plain}, defer_snapshot=True)
        manager.close()
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _run(world: int, root: Path, phase: str) -> None:
    # fork: the ranks inherit the imported torch (spawn would import it again in each, ~1 s of CPU).
    mp.start_processes(_rank, args=(world, _free_port(), str(root), phase), nprocs=world, join=True,
                       start_method="fork")


def _assert_equal(a: Any, b: Any, where: str) -> None:
    if isinstance(a, torch.Tensor):
        assert torch.equal(a, b), where
    else:
        assert a.keys() == b.keys(), where
        for key in a:
            _assert_equal(a[key], b[key], f"{where}.{key}")


def test_fsdp_state_saved_on_2_ranks_loads_on_4_and_back(tmp_path: Path) -> None:
    _run(2, tmp_path, "train")
    _run(4, tmp_path, "load")
    _run(2, tmp_path, "load")
    saved = torch.load(tmp_path / "full-train-2.pt", weights_only=True)
    on_four = torch.load(tmp_path / "full-load-4.pt", weights_only=True)
    back_on_two = torch.load(tmp_path / "full-load-2.pt", weights_only=True)
    assert saved["optimizer"], "no optimizer state was saved"
    _assert_equal(saved, on_four, "2 -> 4")
    _assert_equal(saved, back_on_two, "2 -> 4 -> 2")
    shards = sorted(p.name for p in (tmp_path / "checkpoints" / "step-4").iterdir() if p.suffix == ".distcp")
    assert shards == [f"__{rank}_0.distcp" for rank in range(4)]  # the 4-rank world wrote step 4
