"""Written like a Hugging Face ``Trainer`` script's output, which knows nothing of runyard (and
needs no ``transformers``): every ``--save_steps`` steps rank 0 saves a folder
``OUTPUT_DIR/checkpoint-<global_step>/`` with ``pytorch_model.bin`` and ``trainer_state.json``
(``global_step``), keeps the newest ``--save_total_limit`` of them, and at start resumes by itself
from the newest one (``resume_from_checkpoint=True``); ``train/loss`` goes to TensorBoard under
``OUTPUT_DIR/runs/`` at each global step (``report_to="tensorboard"``), and the log lines are
the Trainer's (a dict of logs, "Saving model checkpoint to ...").

    torchrun --nproc-per-node=2 hf_style.py --max_steps 60 --save_steps 10
"""

from __future__ import annotations

import argparse
import json
import shutil
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch.utils.tensorboard import SummaryWriter


def last_checkpoint(output_dir: Path) -> Path | None:
    """transformers.trainer_utils.get_last_checkpoint: the highest checkpoint-<n> folder."""
    found = [p for p in output_dir.glob("checkpoint-*") if p.is_dir() and p.name.split("-")[-1].isdigit()]
    return max(found, key=lambda p: int(p.name.split("-")[-1])) if found else None


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default="hf_out")
    parser.add_argument("--max_steps", type=int, default=60)
    parser.add_argument("--save_steps", type=int, default=10)
    parser.add_argument("--save_total_limit", type=int, default=2)
    parser.add_argument("--sleep", type=float, default=0.1)
    args = parser.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    output_dir = Path(args.output_dir)
    torch.manual_seed(0)
    model = torch.nn.Linear(8, 1)
    global_step = 0
    resume = last_checkpoint(output_dir)
    if resume is not None:
        model.load_state_dict(torch.load(resume / "pytorch_model.bin", weights_only=True))
        global_step = json.loads((resume / "trainer_state.json").read_text())["global_step"]
        print(f"Resuming from checkpoint {resume} at global step {global_step}", flush=True)
    ddp = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.01)
    writer = SummaryWriter(str(output_dir / "runs" / f"rank{rank}"), flush_secs=1)
    g = torch.Generator().manual_seed(rank + global_step)
    while global_step < args.max_steps:
        x = torch.randn(16, 8, generator=g)
        loss = ((ddp(x) - x.sum(dim=1, keepdim=True)) ** 2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
        global_step += 1
        writer.add_scalar("train/loss", loss.item(), global_step)
        if rank == 0 and global_step % 5 == 0:
            print({"loss": round(loss.item(), 4), "learning_rate": 0.01, "epoch": global_step / args.max_steps},
                  flush=True)
        if rank == 0 and global_step % args.save_steps == 0:
            folder = output_dir / f"checkpoint-{global_step}"
            print(f"Saving model checkpoint to {folder}", flush=True)
            folder.mkdir(parents=True, exist_ok=True)
            torch.save(model.state_dict(), folder / "pytorch_model.bin")
            (folder / "trainer_state.json").write_text(json.dumps({"global_step": global_step, "epoch": 1.0,
                                                                   "max_steps": args.max_steps}))
            kept = sorted((p for p in output_dir.glob("checkpoint-*") if p.is_dir()),
                          key=lambda p: int(p.name.split("-")[-1]))
            for old in kept[:-args.save_total_limit]:
                shutil.rmtree(old)
        time.sleep(args.sleep)
    writer.close()
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
