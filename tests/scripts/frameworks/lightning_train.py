"""A Lightning script as its users write one: Lightning's own API and nothing of runyard but the
line docs/frameworks.md asks of a script of your own (``ckpt_path`` from ``RUNYARD_RESUME_PATH``).
A small regression on two CPU ranks (``strategy="ddp"``, which under torchrun takes its ranks from
torchrun's environment), a ``ModelCheckpoint`` every ``--every`` steps, TensorBoard's logger (or
``--logger wandb``: Lightning's ``WandbLogger``). ``--raise_at N`` makes rank 1 raise at step N;
``--on_exception`` adds ``OnExceptionCheckpoint``, whose save then deadlocks (Lightning #20187).

    torchrun --nproc-per-node=2 lightning_train.py --max_steps 40 --every 10
"""

from __future__ import annotations

import argparse
import os
import time

import lightning as L
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint, OnExceptionCheckpoint
from lightning.pytorch.loggers import TensorBoardLogger, WandbLogger


class Regression(L.LightningModule):
    def __init__(self, raise_at: int = 0) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 1))
        self.raise_at = raise_at

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.global_rank == 1 and self.global_step + 1 == self.raise_at:
            raise ValueError(f"bad batch at step {self.raise_at}")
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.net(x), y)
        self.log("train_loss", loss)
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.AdamW(self.parameters(), lr=1e-2)


class Pace(Callback):
    """A pause after each step, so that a person (or a test) can watch the run between saves."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_train_batch_end(self, *args: object) -> None:
        time.sleep(self.seconds)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--max_steps", type=int, default=40)
    parser.add_argument("--every", type=int, default=10)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--logger", choices=["tensorboard", "wandb"], default="tensorboard")
    parser.add_argument("--raise_at", type=int, default=0)
    parser.add_argument("--on_exception", action="store_true")
    args = parser.parse_args()
    L.seed_everything(0)
    x = torch.randn(2048, 16, generator=torch.Generator().manual_seed(0))
    data = torch.utils.data.TensorDataset(x, x.sum(dim=1, keepdim=True))
    trainer = L.Trainer(
        accelerator="cpu", devices=2, strategy="ddp", max_steps=args.max_steps, log_every_n_steps=1,
        enable_progress_bar=False, enable_model_summary=False,
        logger=WandbLogger(project="regression") if args.logger == "wandb" else TensorBoardLogger("."),
        callbacks=[ModelCheckpoint(dirpath="ckpts", every_n_train_steps=args.every, save_top_k=-1, save_last=True),
                   Pace(args.sleep), *([OnExceptionCheckpoint(dirpath="ckpts")] if args.on_exception else [])],
    )
    trainer.fit(Regression(args.raise_at), torch.utils.data.DataLoader(data, batch_size=32, shuffle=True),
                ckpt_path=os.environ.get("RUNYARD_RESUME_PATH"))


if __name__ == "__main__":
    main()
