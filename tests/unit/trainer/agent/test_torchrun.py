"""trainer/agent/torchrun.py, which keeps a single-node run's sockets on loopback: what it refuses
off loopback, and the stores it makes listen there alone (the whole run is checked in
tests/integration/test_sockets.py).
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta

import psutil
import pytest
from torch.distributed import TCPStore
from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousParameters
from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

from orchestrator.executors.launcher import free_port
from tests.unit.paths import ROOT
from trainer.agent import torchrun


def own_listeners() -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


def test_the_ranks_environment_names_the_loopback_interface() -> None:
    interface = torchrun.loopback_interface()
    addresses = {a.address for a in psutil.net_if_addrs()[interface]}
    assert "127.0.0.1" in addresses
    assert torchrun.loopback_environment(interface) == {
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0", "GLOO_SOCKET_IFNAME": interface, "NCCL_SOCKET_IFNAME": interface}


@pytest.mark.parametrize(("argv", "expected"), [
    (["--nnodes=1:2", "--rdzv-endpoint=127.0.0.1:1", "--local-addr=127.0.0.1"], "--nnodes='1:2'"),
    (["--rdzv-endpoint=0.0.0.0:1", "--local-addr=127.0.0.1"], "--rdzv-endpoint='0.0.0.0'"),
    (["--rdzv-endpoint=localhost:1", "--local-addr=127.0.0.1"], "--rdzv-endpoint='localhost'"),
    (["--rdzv-endpoint=127.0.0.1:1"], "--local-addr=None"),
    (["--rdzv-endpoint=127.0.0.1:1", "--local-addr=192.0.2.7"], "--local-addr='192.0.2.7'"),
    (["--standalone", "--local-addr=127.0.0.1"], "--standalone"),
    (["--rdzv-backend=static", "--rdzv-endpoint=127.0.0.1:1", "--local-addr=127.0.0.1"], "--rdzv-backend='static'"),
])
def test_anything_off_loopback_is_refused(argv: list[str], expected: str) -> None:
    defaults = ["--rdzv-backend=c10d"] if not any(a.startswith("--rdzv-backend") for a in argv) else []
    with pytest.raises(torchrun.NotOneLoopbackNode, match=expected.replace("[", r"\[")):
        torchrun.check_one_loopback_node([*defaults, *argv, "-m", "trainer"])


def test_every_problem_is_named_at_once() -> None:
    with pytest.raises(torchrun.NotOneLoopbackNode) as caught:
        torchrun.check_one_loopback_node(["--nnodes=1:2", "--rdzv-endpoint=10.0.0.1:1", "-m", "trainer"])
    assert all(part in str(caught.value) for part in ("--nnodes", "--rdzv-endpoint", "--local-addr", "--rdzv-backend"))


def test_several_nodes_all_on_loopback_are_accepted() -> None:
    # A local rehearsal of a multi-node config: every agent on this machine, on loopback.
    torchrun.check_one_loopback_node(["--nnodes=2", "--rdzv-backend=c10d", "--rdzv-endpoint=127.0.0.1:1",
                                      "--local-addr=127.0.0.1", "--rdzv-conf=is_host=0", "-m", "trainer"])


def test_a_refused_command_line_exits_2_before_torchrun_starts() -> None:
    result = subprocess.run([sys.executable, "-m", "trainer.agent.torchrun", "--nnodes=1", "--rdzv-backend=c10d",
                             "--rdzv-endpoint=127.0.0.1:1", "--local-addr=10.0.0.1", "-m", "trainer"],
                            capture_output=True, text=True, timeout=60, cwd=ROOT,
                            env={**os.environ, "PYTHONPATH": str(ROOT)}, check=False)
    assert result.returncode == 2
    assert "not on loopback" in result.stderr and "--local-addr='10.0.0.1'" in result.stderr


@pytest.mark.parametrize("port", ["fixed", "any"])
def test_a_loopback_store_listens_on_loopback_alone_and_serves(port: str) -> None:
    wanted = free_port() if port == "fixed" else 0
    server = torchrun.loopback_store("127.0.0.1", wanted, timeout=timedelta(seconds=10))
    assert wanted in (0, server.port)
    assert ("127.0.0.1", server.port) in own_listeners()
    assert not any(p == server.port and ip != "127.0.0.1" for ip, p in own_listeners())
    client = TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=10))
    client.set("key", "value")
    assert server.get("key") == b"value"


def test_a_loopback_store_on_ipv6_loopback() -> None:
    try:
        with socket.socket(socket.AF_INET6) as probe:
            probe.bind(("::1", 0))
    except OSError:
        pytest.skip("no IPv6 loopback here")
    server = torchrun.loopback_store("::1", 0, timeout=timedelta(seconds=10))
    assert ("::1", server.port) in own_listeners()


def test_a_store_port_already_taken_is_an_error_not_a_stranger_s_store() -> None:
    with socket.socket() as holder:
        holder.bind(("127.0.0.1", 0))
        holder.listen()
        port = holder.getsockname()[1]
        with pytest.raises(RendezvousConnectionError, match=f"127.0.0.1:{port}"):
            torchrun.loopback_store("127.0.0.1", port)


def test_a_store_on_a_network_address_is_refused() -> None:
    with pytest.raises(torchrun.NotOneLoopbackNode, match=r"0\.0\.0\.0"):
        torchrun.loopback_store("0.0.0.0", 0)


def test_torchrun_creates_both_its_stores_through_the_loopback_factories(monkeypatch: pytest.MonkeyPatch) -> None:
    # Put back torchrun's own factories after the test.
    monkeypatch.setattr(c10d, "_create_tcp_store", c10d._create_tcp_store)
    monkeypatch.setattr(DynamicRendezvousHandler, "_create_tcp_store_server",
                        DynamicRendezvousHandler._create_tcp_store_server)
    torchrun.bind_stores_to_loopback()

    port = free_port()
    params = RendezvousParameters(backend="c10d", endpoint=f"127.0.0.1:{port}", run_id="unit", min_nodes=1,
                                  max_nodes=1, read_timeout="5")
    backend, rendezvous = c10d.create_backend(params)
    assert rendezvous.port == port  # type: ignore[attr-defined]
    shared = DynamicRendezvousHandler._create_tcp_store_server(None, "127.0.0.1", 0)  # type: ignore[arg-type]
    listening = own_listeners()
    assert backend.name == "c10d"
    assert {("127.0.0.1", port), ("127.0.0.1", shared.port)} <= listening
    assert not [(ip, p) for ip, p in listening if p in (port, shared.port) and ip != "127.0.0.1"]
