"""The rendezvous port of an attempt: free now, and not one the kernel hands out by itself.

The scheduler picks the port and torchrun's agent binds it seconds later (after importing torch).
A port taken from the kernel's ephemeral range (``bind(host, 0)``) can be handed meanwhile to any
other process's outgoing connection or ``bind(0)``: another process on the machine got one in
CI, and the agent, which never joins a store it did not start (trainer/agent/torchrun.py), failed the
attempt with "Address already in use". Below that range the kernel assigns nothing
on its own, so only a process that asks for the very port can take it; torch's own defaults
(29400, 29500), which a person's bare torchrun may use, are left alone.
"""

from __future__ import annotations

import random
import socket
from pathlib import Path

EPHEMERAL_RANGE_FILE = Path("/proc/sys/net/ipv4/ip_local_port_range")
LOWEST = 20000
# torchrun's default rendezvous (29400) and MASTER_PORT (29500), with room around them.
TORCH_DEFAULTS = range(29400, 29600)
TRIES = 64


def ephemeral_start(path: Path = EPHEMERAL_RANGE_FILE) -> int:
    """The first port of the kernel's ephemeral range (Linux's default 32768; 1024 where it
    cannot be read, which leaves no room below it)."""
    try:
        return int(path.read_text().split()[0])
    except (OSError, ValueError, IndexError):
        return 1024


def _bindable(host: str, port: int) -> bool:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        try:
            s.bind((host, port))
        except OSError:
            return False
    return True


def rendezvous_port(host: str = "127.0.0.1", *, start: int | None = None) -> int:
    """A port free on ``host`` now, below the ephemeral range where there is room (a random one of
    ``LOWEST`` up to the range's start, torch's defaults left out); else one the kernel picks."""
    top = ephemeral_start() if start is None else start
    rng = random.SystemRandom()
    for _ in range(TRIES if top > LOWEST else 0):
        port = rng.randrange(LOWEST, top)
        if port not in TORCH_DEFAULTS and _bindable(host, port):
            return port
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind((host, 0))
        return int(s.getsockname()[1])
