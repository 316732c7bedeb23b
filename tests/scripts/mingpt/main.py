"""A project laid out like minGPT's: its own ``trainer.py`` beside the script, so ``import trainer``
must find that file, and runyard's SDK comes in as ``import runyard`` with docs/SCRIPTS.md's stop pattern
(``should_stop()`` asked both in the save condition and the break). With ``--sleep`` long, a
pause or a cancel reaches it mid-run: it must end with a checkpoint at the step it stopped at.

    torchrun --nproc-per-node=2 main.py --steps 40
"""

import argparse
import time

import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP
from trainer import Trainer  # this project's trainer.py, not runyard's package

import runyard

parser = argparse.ArgumentParser()
parser.add_argument("--steps", type=int, default=40)
parser.add_argument("--sleep", type=float, default=0.05)
args = parser.parse_args()

dist.init_process_group("gloo")
run = runyard.init()
torch.manual_seed(0)
trainer = Trainer(DDP(torch.nn.Linear(8, 1)))
assert Trainer.__module__ == "trainer" and hasattr(trainer, "run_step")
step = run.load_checkpoint({"model": trainer.model, "optimizer": trainer.optimizer})
g = torch.Generator().manual_seed(dist.get_rank() + 1000 * step)
while step < args.steps:
    loss = trainer.run_step(torch.randn(16, 8, generator=g))
    step += 1
    run.log(step, loss=loss.detach())
    if step % 10 == 0 or step == args.steps or run.should_stop():
        run.save_checkpoint(step, {"model": trainer.model, "optimizer": trainer.optimizer})
    if run.should_stop():
        break
    time.sleep(args.sleep)
run.finish()
dist.destroy_process_group()
