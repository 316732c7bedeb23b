"""A run's sockets stay on the machine: every socket that any process of a single-node run
listens on (the shim, torchrun's agent, every rank, their children) is bound to 127.0.0.1 or ::1.

Before trainer/agent/torchrun.py, torchrun's agent listened on ``::`` (every interface, dual stack)
twice: the c10d rendezvous store, whose contents the agent unpickles, and the store it shares
with the workers. gloo's pair sockets listen wherever the host name resolves, and with
``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=1`` rank 0 hosted a store on ``::`` as well.

The processes of a run are found as the scheduler finds them: by RUNYARD_RUN_DIR in their
environment. Sockets are read with psutil once the run has trained a step, so both stores and
gloo's listeners are up; the test also requires seeing them, so it cannot pass on an empty list.
"""

from __future__ import annotations

import ipaddress
import socket
import sqlite3
from dataclasses import dataclass

import psutil
import pytest

from tests.integration.conftest import Product

pytestmark = pytest.mark.slow


@dataclass(frozen=True)
class Listener:
    """A listening TCP socket, or a bound UDP one, of a process of the run."""

    pid: int
    cmdline: str
    local_rank: str | None  # None: not a rank (the shim, the agent)
    kind: str
    ip: str
    port: int

    @property
    def on_loopback(self) -> bool:
        return ipaddress.ip_address(self.ip.split("%")[0]).is_loopback

    def __str__(self) -> str:
        address = f"[{self.ip}]:{self.port}" if ":" in self.ip else f"{self.ip}:{self.port}"
        return f"{self.kind} {address} of pid {self.pid} ({self.cmdline})"


def run_processes(product: Product) -> dict[int, tuple[str, str | None]]:
    """Every live process of a run under ``product.home``: pid -> (command line, LOCAL_RANK)."""
    prefix = str(product.home) + "/"
    found = {}
    for proc in psutil.process_iter(["pid"]):
        try:
            env = proc.environ()
            if env.get("RUNYARD_RUN_DIR", "").startswith(prefix) and proc.status() != psutil.STATUS_ZOMBIE:
                found[proc.pid] = (" ".join(proc.cmdline())[:300], env.get("LOCAL_RANK"))
        except (psutil.Error, OSError):
            continue
    return found


def listeners(product: Product) -> tuple[dict[int, tuple[str, str | None]], list[Listener]]:
    """The run's processes and every socket of theirs that waits for others to connect."""
    procs = run_processes(product)
    found = []
    for conn in psutil.net_connections(kind="inet"):
        if conn.pid not in procs or not conn.laddr:
            continue
        if conn.type == socket.SOCK_STREAM and conn.status != psutil.CONN_LISTEN:
            continue  # a connection, not a listener
        if conn.type == socket.SOCK_DGRAM and conn.raddr:
            continue  # a connected UDP socket only hears its peer
        kind = "tcp" if conn.type == socket.SOCK_STREAM else "udp"
        cmdline, local_rank = procs[conn.pid]
        found.append(Listener(conn.pid, cmdline, local_rank, kind, conn.laddr.ip, conn.laddr.port))
    return procs, found


def rendezvous_port(product: Product, run_id: int) -> int:
    con = sqlite3.connect(product.home / "runyard.db")
    try:
        (port,) = con.execute("SELECT port FROM attempts WHERE run_id = ? ORDER BY number DESC LIMIT 1",
                              (run_id,)).fetchone()
    finally:
        con.close()
    return int(port)


def network_interface() -> str | None:
    """An interface that is up and has a non-loopback IPv4 address (to point gloo at), if any."""
    stats = psutil.net_if_stats()
    for name, addresses in psutil.net_if_addrs().items():
        if name in stats and stats[name].isup and any(
            a.family == socket.AF_INET and not ipaddress.ip_address(a.address).is_loopback for a in addresses
        ):
            return name
    return None


# "hostile": the scheduler's environment as a user might have left it: gloo and NCCL pointed at
# a network interface, and torchrun's store sharing off (rank 0 would host a store of its own).
@pytest.mark.parametrize("environment", ["plain", "hostile"])
def test_every_listening_socket_of_a_run_is_on_loopback(product: Product, environment: str) -> None:
    if environment == "hostile":
        product.env["TORCH_DISABLE_SHARE_RDZV_TCP_STORE"] = "1"
        interface = network_interface()
        if interface is not None:
            product.env["GLOO_SOCKET_IFNAME"] = product.env["NCCL_SOCKET_IFNAME"] = interface
    run_id = product.submit("train.max_steps=1000000", f"name=sockets-{environment}", "train.log_every=1")
    product.start_scheduler()
    product.wait_step(run_id, 2, timeout=120)  # training: both stores and gloo are up

    procs, found = listeners(product)
    ranks = {local_rank for _, local_rank in procs.values() if local_rank is not None}
    assert ranks == {"0", "1"}, f"expected two live ranks, saw processes {procs}"
    port = rendezvous_port(product, run_id)
    seen = "; ".join(map(str, found)) or "none"
    # Not vacuous: the agent's rendezvous store and gloo's listener in every rank were seen.
    assert any(s.port == port and s.local_rank is None for s in found), (
        f"the rendezvous store (port {port}) was not among the listeners: {seen}")
    assert {s.local_rank for s in found if s.local_rank is not None} == {"0", "1"}, (
        f"a rank without a listening socket (gloo's pairs listen): {seen}")
    exposed = [s for s in found if not s.on_loopback]
    assert not exposed, "reachable from another host: " + "; ".join(map(str, exposed))
