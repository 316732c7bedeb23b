"""The launcher's torchrun command and trainer/agent/torchrun.py, which keeps a single-node run's sockets
on loopback (the whole run is checked in tests/integration/test_sockets.py)."""

from __future__ import annotations

import os
import socket
import subprocess
import sys
from datetime import timedelta
from pathlib import Path

import psutil
import pytest
from torch.distributed.elastic.rendezvous import RendezvousParameters
from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler

from db.vocabulary.config import parse_config
from orchestrator.executors.launcher import SHIMS_DIR, agent_env, free_port, rank_env, torchrun_argv
from trainer.agent import torchrun
from trainer.agent.warm import ROOM_VARIABLE, WARM_OPTION

ROOT = Path(__file__).resolve().parents[2]
SCRIPT_RUNNER = ROOT / "trainer" / "process" / "script_runner.py"


def own_listeners() -> set[tuple[str, int]]:
    return {(c.laddr.ip, c.laddr.port) for c in psutil.Process().net_connections(kind="tcp")
            if c.status == psutil.CONN_LISTEN}


def test_the_launcher_runs_torchrun_through_the_loopback_entry() -> None:
    config = parse_config({"launch": {"nproc_per_node": 2}})
    argv = torchrun_argv(config, 7, 3, 29511, Path("/tmp/a"))
    assert argv[:3] == [sys.executable, "-m", "trainer.agent.torchrun"]
    assert "--rdzv-endpoint=127.0.0.1:29511" in argv and "--local-addr=127.0.0.1" in argv
    # Everything else is torchrun's, as before: one node, no restarts, per-rank logs and redirects.
    assert {"--nnodes=1", "--nproc-per-node=2", "--rdzv-backend=c10d", "--rdzv-id=runyard-7-3", "--max-restarts=0",
            "--log-dir=/tmp/a/ranks", "--redirects=3"} <= set(argv)
    assert argv[-2:] == ["-m", "trainer"]
    assert argv[3] == "--warm-ranks"  # the built-in trainer's ranks are forked from the agent
    torchrun.check_one_loopback_node(argv[4:])  # the entry accepts what the launcher builds


def test_only_the_built_in_trainer_starts_warm_and_only_its_agent_gets_the_room() -> None:
    built_in, cold = parse_config({}), parse_config({"launch": {"warm_start": False}})
    script = script_config(script="/w/t.py")
    for config, warm in ((built_in, True), (cold, False), (script, False)):
        argv = torchrun_argv(config, 7, 3, 29511, Path("/tmp/a"))  # type: ignore[arg-type]
        assert (WARM_OPTION in argv) is warm
        assert (ROOM_VARIABLE in agent_env(config, {"A": "1"})) is warm  # type: ignore[arg-type]


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
    client = torchrun.TCPStore("127.0.0.1", server.port, is_master=False, timeout=timedelta(seconds=10))
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
        with pytest.raises(torchrun.RendezvousConnectionError, match=f"127.0.0.1:{port}"):
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


def script_config(**workload: object) -> object:
    return parse_config({"launch": {"nproc_per_node": 2},
                         "workload": {"kind": "script", **workload}})


def test_a_script_runs_through_the_runner_with_its_resume_arguments_only_when_resuming() -> None:
    config = script_config(script="/w/train.py", args=["cfg.py", "--x=1"], checkpoint_glob="out/ckpt.pt",
                           resume_args=["--init_from=resume"])
    fresh = torchrun_argv(config, 1, 1, 29500, Path("/tmp/a"))
    assert fresh[-5:] == ["-m", "trainer.process.script_runner", "/w/train.py", "cfg.py", "--x=1"]
    resumed = torchrun_argv(config, 1, 2, 29500, Path("/tmp/a"), resuming=True)
    assert resumed[-3:] == ["cfg.py", "--x=1", "--init_from=resume"]
    torchrun.check_one_loopback_node(resumed[3:])


def test_a_module_and_another_interpreter_are_started_as_python_would() -> None:
    config = script_config(module="pkg.train", args=["--lr=3"], python="/venvs/x/bin/python")
    argv = torchrun_argv(config, 1, 1, 29500, Path("/tmp/a"))
    # torchrun starts that interpreter itself, and the runner by its path (nothing of runyard's
    # environment is imported there).
    runner = str(SCRIPT_RUNNER)
    assert argv[-7:] == ["--no-python", "/venvs/x/bin/python", "-u", runner, "-m", "pkg.train", "--lr=3"]
    torchrun.check_one_loopback_node(argv[3:])


def test_omp_threads_default_to_the_cores_per_rank_unless_set() -> None:
    assert rank_env(script_config(script="/w/t.py"), {}, cores=16)["OMP_NUM_THREADS"] == "8"
    assert rank_env(script_config(script="/w/t.py"), {}, cores=1)["OMP_NUM_THREADS"] == "1"
    assert "OMP_NUM_THREADS" not in rank_env(script_config(script="/w/t.py"), {"OMP_NUM_THREADS": "3"}, cores=16)
    assert rank_env(script_config(script="/w/t.py", env={"OMP_NUM_THREADS": "5"}), {}, cores=16)[
        "OMP_NUM_THREADS"] == "5"


def test_built_in_ranks_get_the_same_threads_on_one_node_or_two() -> None:
    """torchrun sets OMP_NUM_THREADS=1 only where a node has several ranks: a local 2-node run of
    one rank each got every core per rank (oversubscribed), and arithmetic other than the same
    world on one node (its losses differed in the last bits under load). runyard sets it for every
    workload, from the ranks that share this machine."""
    one_node = parse_config({"launch": {"nproc_per_node": 2}})
    two_nodes = parse_config({"launch": {"nnodes": 2, "nproc_per_node": 1}})
    assert rank_env(one_node, {}, cores=2) == rank_env(two_nodes, {}, cores=2) == {"OMP_NUM_THREADS": "1"}
    assert rank_env(two_nodes, {}, cores=8) == {"OMP_NUM_THREADS": "4"}
    assert rank_env(one_node, {"OMP_NUM_THREADS": "3"}, cores=8) == {}  # the person's own wins


def test_the_wandb_stand_in_goes_first_on_the_ranks_path_when_asked() -> None:
    env = rank_env(script_config(script="/w/t.py", env={"RUNYARD_WANDB_SHIM": "1"}), {"PYTHONPATH": "/mine"},
                     cores=2)
    assert env["PYTHONPATH"].split(os.pathsep) == [str(SHIMS_DIR), "/mine"]
    assert "PYTHONPATH" not in rank_env(script_config(script="/w/t.py"), {"PYTHONPATH": "/mine"}, cores=2)


def test_the_runner_started_by_its_path_needs_nothing_of_runyard(tmp_path: Path) -> None:
    script = tmp_path / "s.py"
    script.write_text("import sys\nprint(sys.argv[1:], 'trainer' in sys.modules, sys.path[0])\n")
    # -I: an isolated interpreter, as a foreign virtual environment would be (no PYTHONPATH, no site).
    out = subprocess.run([sys.executable, "-I", str(SCRIPT_RUNNER), str(script), "a", "b"],
                         capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    assert out.strip() == f"['a', 'b'] False {tmp_path}"
    pkg = tmp_path / "pkg"
    pkg.mkdir()
    (pkg / "__init__.py").write_text("")
    (pkg / "train.py").write_text("import os, sys\nprint(__name__, sys.argv[1:], sys.path[0] == os.getcwd())\n")
    out = subprocess.run([sys.executable, "-I", str(SCRIPT_RUNNER), "-m", "pkg.train", "x"],
                         capture_output=True, text=True, cwd=tmp_path, check=True).stdout
    assert out.strip() == "__main__ ['x'] True"
