"""A Hugging Face ``Trainer`` script as its users write one: transformers' own API and nothing of
runyard but the one line docs/frameworks.md asks of a script of your own (``resume_from_checkpoint``
from ``RUNYARD_RESUME_PATH``). A two-layer GPT-2 on random tokens, small enough for two CPU ranks.

    torchrun --nproc-per-node=2 hf_trainer.py --output_dir hf_out --max_steps 40 --save_steps 10

``--stall_save_at N`` is for a test, not a recipe: the first save at step N stops half-way (its
weights written, its optimizer and ``trainer_state.json`` not yet) and waits there, after leaving
the file ``save-stalled``, so that a test kills a rank mid-save every time.
"""

from __future__ import annotations

import argparse
import os
import time
from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, Trainer, TrainerCallback, TrainingArguments


class RandomTokens(torch.utils.data.Dataset):
    """Fixed random sequences: the same on every rank and every attempt."""

    def __init__(self, n: int, length: int, vocab: int) -> None:
        self.ids = torch.randint(vocab, (n, length), generator=torch.Generator().manual_seed(0))

    def __len__(self) -> int:
        return len(self.ids)

    def __getitem__(self, i: int) -> dict[str, torch.Tensor]:
        return {"input_ids": self.ids[i], "labels": self.ids[i]}


class Pace(TrainerCallback):
    """A pause after each step, so that a person (or a test) can watch the run between saves."""

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds

    def on_step_end(self, args, state, control, **kwargs):  # transformers' callback signature
        time.sleep(self.seconds)


STALLED = Path("save-stalled")  # in the working folder: the first stalled save leaves it, the retry sees it


class StallingTrainer(Trainer):
    """The Trainer, waiting in the middle of its first save at ``stall_at``: after ``save_model``
    (the weights, the config, ``training_args.bin``), before the optimizer, the RNG states and
    ``trainer_state.json``, which the Trainer writes last."""

    def __init__(self, *args, stall_at: int = 0, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.stall_at = stall_at

    def _save_optimizer_and_scheduler(self, output_dir):  # transformers' own step of _save_checkpoint
        if self.state.global_step == self.stall_at and self.is_world_process_zero() and not STALLED.exists():
            STALLED.write_text(str(output_dir))
            time.sleep(600)  # until the test kills a rank
        super()._save_optimizer_and_scheduler(output_dir)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--output_dir", default="hf_out")
    parser.add_argument("--max_steps", type=int, default=40)
    parser.add_argument("--save_steps", type=int, default=10)
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--report_to", default="tensorboard")
    parser.add_argument("--stall_save_at", type=int, default=0)
    args = parser.parse_args()
    model = GPT2LMHeadModel(GPT2Config(vocab_size=64, n_positions=32, n_embd=32, n_layer=2, n_head=2,
                                       bos_token_id=0, eos_token_id=0))
    training = TrainingArguments(
        output_dir=args.output_dir, max_steps=args.max_steps, save_steps=args.save_steps, save_total_limit=3,
        logging_steps=1, report_to=[args.report_to], per_device_train_batch_size=4, learning_rate=1e-3,
        use_cpu=True, ddp_backend="gloo", dataloader_num_workers=0, disable_tqdm=True, seed=0,
    )
    trainer = StallingTrainer(model=model, args=training, train_dataset=RandomTokens(512, 32, 64),
                              callbacks=[Pace(args.sleep)], stall_at=args.stall_save_at)
    trainer.train(resume_from_checkpoint=os.environ.get("RUNYARD_RESUME_PATH"))


if __name__ == "__main__":
    main()
