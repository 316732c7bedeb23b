"""One rank of tests/integration/test_sharded_checkpoints.py: a small gpt-char model sharded with
FSDP2 on gloo (CPU), saved and loaded through runyard's CheckpointManager exactly as the gpt-char
workload does (its ShardedModelState and ShardedOptimizerState adapters).

Started by ``torch.multiprocessing.start_processes``, forked from multiprocessing's fork server
(which imports this module once), with a file store in the test's folder; rank 0 writes what the
test asserts on to ``<folder>/<scenario>.json``.
"""

from __future__ import annotations

import hashlib
import json
import os
import pickle
import shutil
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict, get_optimizer_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from trainer.checkpoint import CheckpointManager
from trainer.workloads.gpt_char import GPT, ShardedModelState, ShardedOptimizerState

MODEL = {"vocab_size": 17, "n_layer": 2, "n_head": 2, "n_embd": 24, "block_size": 8}


def build(n_embd: int = MODEL["n_embd"]) -> tuple[Any, Any, Any, Any]:
    torch.manual_seed(0)
    model = GPT(MODEL["vocab_size"], MODEL["n_layer"], MODEL["n_head"], n_embd, MODEL["block_size"])
    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    for block in model.blocks:
        fully_shard(block, mesh=mesh)
    fully_shard(model, mesh=mesh)
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.1)
    return model, optimizer, ShardedModelState(model), ShardedOptimizerState(model, optimizer)


def train_step(model: Any, optimizer: Any, step: int) -> float:
    """One step on batches that depend on the step alone: every world size sees the same data."""
    gen = torch.Generator().manual_seed(1000 + step)
    x = torch.randint(0, MODEL["vocab_size"], (4, MODEL["block_size"]), generator=gen)
    y = torch.randint(0, MODEL["vocab_size"], (4, MODEL["block_size"]), generator=gen)
    loss = torch.nn.functional.cross_entropy(model(x).view(-1, MODEL["vocab_size"]), y.view(-1))
    loss.backward()
    optimizer.step()
    optimizer.zero_grad()
    return float(loss)


def full_state(model: Any, optimizer: Any) -> dict[str, Any]:
    """The whole model and optimizer state (a collective gather: what a test compares)."""
    options = StateDictOptions(full_state_dict=True, cpu_offload=True)
    return {"model": get_model_state_dict(model, options=options),
            "optimizer": get_optimizer_state_dict(model, optimizer, options=options)}


def flat(obj: Any, prefix: str = "") -> dict[str, Any]:
    if isinstance(obj, dict):
        out: dict[str, Any] = {}
        for key, value in obj.items():
            out.update(flat(value, f"{prefix}{key}/"))
        return out
    if isinstance(obj, (list, tuple)):
        return flat(dict(enumerate(obj)), prefix)
    return {prefix.rstrip("/"): obj}


def differences(a: dict[str, Any], b: dict[str, Any]) -> list[str]:
    """Keys whose values are not bit-identical (tensors) or equal (plain values)."""
    fa, fb = flat(a), flat(b)
    out = sorted(set(fa) ^ set(fb))
    for key in sorted(set(fa) & set(fb)):
        va, vb = fa[key], fb[key]
        same = torch.equal(va, vb) if isinstance(va, torch.Tensor) and isinstance(vb, torch.Tensor) else va == vb
        if not same:
            out.append(key)
    return out


def main(rank: int, world: int, folder: str, scenario: str) -> None:
    root = Path(folder)
    dist.init_process_group("gloo", init_method=f"file://{root}/store-{scenario}", rank=rank, world_size=world)
    try:
        model, optimizer, model_state, optim_state = build()
        out: dict[str, Any] = {"world": world}
        refused: list[tuple[int, str]] = []

        def load(manager_root: Path, step: int = -1, adapters: tuple[Any, Any] = (model_state, optim_state)) -> int:
            ms, os_ = adapters
            manager = CheckpointManager(manager_root, is_writer=False,
                                        on_refused=lambda s, reason: refused.append((s, reason)))
            loaded, saved = manager.load(step, targets=lambda: {"model": ms.state_dict(),
                                                                "optimizer": os_.state_dict()})
            ms.load_state_dict(saved["model"])
            os_.load_state_dict(saved["optimizer"])
            return loaded

        def save(manager_root: Path, step: int) -> None:
            manager = CheckpointManager(manager_root, is_writer=rank == 0, async_save=True)
            manager.save(step, {"model": model_state.state_dict(), "optimizer": optim_state.state_dict(), "step": step})
            result = manager.wait()
            manager.close()
            if result is not None:
                out.setdefault("saved", {})[str(step)] = {"digest": result.params_digest, "bytes": result.bytes}

        if scenario == "save4":
            ckpts = root / "four"
            for step in (1, 2, 3):
                train_step(model, optimizer, step)
                save(ckpts, step)
                reference = full_state(model, optimizer)
                if rank == 0:
                    torch.save(reference, root / f"reference-{step}.pt")
            out["files"] = sorted(os.listdir(ckpts / "step-3"))
            out["manifest"] = json.loads((ckpts / "step-3" / "manifest.json").read_text())
            out["losses"] = [train_step(model, optimizer, step) for step in (4, 5)]  # the uninterrupted run
            # Then, in the same processes, each damage case on a copy of the checkpoints.
            cases: dict[str, Any] = {}
            for case in ("truncated", "flipped", "missing", "evil-metadata", "manifest-shapes"):
                where = root / f"damage-{case}"
                if rank == 0:
                    shutil.copytree(root / "four", where)
                    damage(where / "step-3", case, root)
                dist.barrier()
                refused.clear()
                step = load(where)
                cases[case] = {"loaded": step, "refused": list(refused),
                               "same": not differences(full_state(model, optimizer),
                                                       torch.load(root / f"reference-{step}.pt", weights_only=True))}
            # A model of other shapes: every checkpoint refused, naming the tensor.
            other = build(n_embd=32)
            refused.clear()
            try:
                load(root / "four", adapters=(other[2], other[3]))
                cases["other-model"] = {"error": ""}
            except Exception as exc:  # noqa: BLE001 - the test asserts on the message
                cases["other-model"] = {"error": str(exc), "refused": list(refused)}
            out["cases"] = cases
            out["evil_ran"] = (root / "evil-ran").exists()
        elif scenario in ("load-on-2", "load-on-4"):  # from the other world size's checkpoints, then on
            source, target = (root / "four", root / "two") if scenario == "load-on-2" else (root / "two", None)
            step = load(source)
            out["loaded"] = step
            out["differences"] = differences(full_state(model, optimizer),
                                             torch.load(root / f"reference-{step}.pt", weights_only=True))
            if target is not None:  # the 2-rank run saves the state it loaded, for the 4-rank load
                save(target, step)
            out["losses"] = [train_step(model, optimizer, s) for s in (step + 1, step + 2)]
        if rank == 0:
            (root / f"{scenario}.json").write_text(json.dumps(out, default=str))
    finally:
        dist.destroy_process_group()


def damage(step_dir: Path, case: str, root: Path) -> None:
    """Damage one shard (or the metadata, or the manifest) of a sharded checkpoint as a disk, a
    crash or an attacker with write access to the folder would."""
    manifest_path = step_dir / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    if case == "truncated":
        path = step_dir / "__1_0.distcp"
        path.write_bytes(path.read_bytes()[:-100])
    elif case == "flipped":
        path = step_dir / "__2_0.distcp"
        data = bytearray(path.read_bytes())
        data[len(data) // 2] ^= 0xFF
        path.write_bytes(bytes(data))
    elif case == "missing":
        (step_dir / "__3_0.distcp").unlink()
    elif case == "evil-metadata":  # a pickle that would run code, with the manifest rewritten to match
        class Evil:
            def __reduce__(self) -> tuple[Any, ...]:
                return (os.system, (f"touch {root / 'evil-ran'}",))

        evil = pickle.dumps(Evil())
        (step_dir / ".metadata").write_bytes(evil)
        manifest["files"][".metadata"] = {"bytes": len(evil), "sha256": hashlib.sha256(evil).hexdigest()}
        manifest_path.write_text(json.dumps(manifest))
    elif case == "manifest-shapes":  # the manifest no longer describes DCP's tensors
        key = next(iter(manifest["shards"]))
        manifest["shards"][key]["shape"][0] += 1
        manifest_path.write_text(json.dumps(manifest))
