"""Distributed set-up and tear-down: one short block, as in nanoGPT."""

from __future__ import annotations

import os
from dataclasses import dataclass
from datetime import timedelta

import torch
import torch.distributed as dist

from trainer.process.store_secret import key_prefix, secret_from_env


@dataclass(frozen=True)
class DistInfo:
    rank: int
    local_rank: int
    world_size: int
    backend: str
    device: torch.device

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def resolve_backend(requested: str) -> str:
    """``auto`` is nccl when CUDA is available, else gloo."""
    if requested == "auto":
        return "nccl" if torch.cuda.is_available() else "gloo"
    return requested


def setup(requested_backend: str, timeout_s: float = 600.0) -> DistInfo:
    """Join the process group that torchrun describes in the environment.

    The store is prefixed with torchrun's restart count: after a restart, keys left by the
    previous attempt cannot confuse the new rendezvous (without this gloo failed to connect
    about half the time after a restart).
    """
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    local_rank = int(os.environ.get("LOCAL_RANK", "0"))
    backend = resolve_backend(requested_backend)
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device("cuda", local_rank)
    else:
        device = torch.device("cpu")
    timeout = timedelta(seconds=timeout_s)
    restart = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store: dist.Store = dist.TCPStore(
        host_name=os.environ["MASTER_ADDR"],
        port=int(os.environ["MASTER_PORT"]),
        world_size=world_size,
        # torchrun's agent hosts the store when it says so; otherwise rank 0 does.
        is_master=os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True" and rank == 0,
        timeout=timeout,
    )
    # Under the attempt's secret too, as every key of the agent's stores (trainer/process/store_secret.py):
    # another local account that connects to the store cannot name one of them.
    secret = secret_from_env()
    base = f"{key_prefix(secret)}/attempt_{restart}" if secret else f"runyard/attempt_{restart}"
    store = dist.PrefixStore(base, store)
    dist.init_process_group(backend, store=store, rank=rank, world_size=world_size, timeout=timeout)
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, backend=backend, device=device)


def current() -> DistInfo:
    """This process as it stands: the process group's rank and size when there is one, else
    torchrun's environment, else a single process. The device is CUDA under NCCL (the one
    :func:`setup` chose) or once the process has used CUDA, else the CPU."""
    joined = dist.is_initialized()
    rank = dist.get_rank() if joined else int(os.environ.get("RANK", "0"))
    world_size = dist.get_world_size() if joined else int(os.environ.get("WORLD_SIZE", "1"))
    backend = str(dist.get_backend()) if joined else "none"
    if backend == "nccl" or (torch.cuda.is_available() and torch.cuda.is_initialized()):
        device = torch.device("cuda", torch.cuda.current_device())
    else:
        device = torch.device("cpu")
    return DistInfo(rank=rank, local_rank=int(os.environ.get("LOCAL_RANK", "0")), world_size=world_size,
                    backend=backend, device=device)


def teardown() -> None:
    """Leave the process group cleanly.

    The barrier matters: without it about one run in five died at exit with "terminate called
    without an active exception" when one rank destroyed the group while another still used it.
    """
    if dist.is_initialized():
        try:
            dist.barrier()
        finally:
            dist.destroy_process_group()
