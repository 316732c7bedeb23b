"""A short script that writes its TensorBoard scalars only in its last second, as a 2-second
training script does when it logs at the end of each short epoch: it prints a line per step for
``--warmup`` seconds (its output is what shows it alive), then each rank creates its writer in a new
``runs/rank{r}/`` folder, writes ``train/loss`` every 10 of ``--steps`` steps, closes it and exits.

Written without torch (the tensorboard package's own event writer), so that it starts in a
fraction of a second and its whole life fits between two of runyard's searches for event files.

    torchrun --nproc-per-node=2 tests/scripts/last_second.py --steps 100 --warmup 1
"""

from __future__ import annotations

import argparse
import os
import time

from tensorboard.compat.proto.event_pb2 import Event
from tensorboard.compat.proto.summary_pb2 import Summary
from tensorboard.summary.writer.event_file_writer import EventFileWriter


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--steps", type=int, default=100)
    parser.add_argument("--warmup", type=float, default=1.0)
    args = parser.parse_args()
    rank = int(os.environ["RANK"])
    end = time.monotonic() + args.warmup
    step = 0
    while time.monotonic() < end:
        print(f"rank {rank} warming up {step}", flush=True)
        step += 1
        time.sleep(0.1)
    writer = EventFileWriter(f"runs/rank{rank}")
    for step in range(0, args.steps, 10):
        value = Summary.Value(tag="train/loss", simple_value=1.0 / (step + 1) + rank / 100)
        writer.add_event(Event(wall_time=time.time(), step=step, summary=Summary(value=[value])))
    writer.close()
    print(f"rank {rank} done", flush=True)


if __name__ == "__main__":
    main()
