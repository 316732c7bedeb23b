"""The rendezvous port of an attempt (orchestrator/executors/ports.py): free, and below the
kernel's ephemeral range, where no other process's outgoing connection or bind(0) can be handed it
in the seconds before torchrun's agent binds it (CI once saw "Address already in use" there)."""

from __future__ import annotations

import random
import socket
from pathlib import Path

import pytest

from orchestrator.executors import ports
from orchestrator.executors.launcher import free_port


def test_the_port_is_free_and_below_the_ephemeral_range() -> None:
    start = ports.ephemeral_start()
    assert start > ports.LOWEST  # Linux's default 32768; this machine's is read from /proc
    chosen = {free_port() for _ in range(20)}
    assert all(ports.LOWEST <= p < start and p not in ports.TORCH_DEFAULTS for p in chosen), sorted(chosen)
    assert len(chosen) > 1  # random, not the same port for every attempt
    for port in chosen:
        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", port))  # free: the agent can bind it


def test_a_taken_port_is_passed_over(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as held:
        held.bind(("127.0.0.1", ports.rendezvous_port()))
        taken = held.getsockname()[1]
        draws = iter([taken, taken])  # the first two draws hit the held port, then any other

        def randrange(_rng: object, low: int, high: int) -> int:
            return next(draws, next(p for p in range(low, high) if p != taken and p not in ports.TORCH_DEFAULTS))

        monkeypatch.setattr(random.SystemRandom, "randrange", randrange)
        port = ports.rendezvous_port()
    assert port != taken and ports.LOWEST <= port < ports.ephemeral_start()


def test_without_room_below_the_range_the_kernel_picks(tmp_path: Path) -> None:
    narrow = tmp_path / "range"
    narrow.write_text("1024\t65535\n")
    assert ports.ephemeral_start(narrow) == 1024
    assert ports.ephemeral_start(tmp_path / "missing") == 1024
    port = ports.rendezvous_port(start=1024)
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", port))
