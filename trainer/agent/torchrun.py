"""torchrun for a run on this machine alone, with every socket it listens on bound to loopback.

Run it exactly as torchrun: ``python -m trainer.agent.torchrun --nnodes=1 ... -m trainer``. The
scheduler launches every local attempt this way (orchestrator/executors/launcher.py), and so does a Slurm
job of one node (orchestrator/executors/slurm/node.py). A local run of several nodes starts one such agent
per node on this machine, all on loopback: the agent of node 0 hosts the rendezvous store
(``--rdzv-conf=is_host=1``), the others join it as clients (``is_host=0``), never listening.

``--network=cluster`` as the first argument (a Slurm job across hosts) keeps torchrun's own
networking: its sockets must then be reachable from the other nodes of the allocation.
``--warm-ranks`` (first too) imports torch and the trainer in the agent and forks the ranks from
it (trainer/agent/warm.py).

Either way each rank's log folder is named by its local rank, as torchrun does, and a
``ranks.json`` beside them maps local to global ranks (:class:`RankMapLogsSpecs`): with several
nodes the two differ, and only the agent knows which global ranks it was given.

Why: torchrun's c10d rendezvous store listens on every interface (``*:<port>``, dual stack) even
when ``--rdzv-endpoint`` is ``127.0.0.1:PORT``, so does the second store that the agent shares
with its workers, and the torchrun agent unpickles what it reads from its store: anyone who can
reach the port from another host can run code in the agent. gloo's pair sockets listen on the
address the host name resolves to (often the LAN), NCCL's bootstrap on a network interface it
picks (never loopback unless told), and with sharing off rank 0 hosts a store on every interface.
A run on one machine needs none of that to be reachable from elsewhere.

What it changes, before it hands ``argv`` to ``torch.distributed.run.main`` unchanged (so exit
codes, ``--redirects``, ``--log-dir``, error files and torchrun's log format stay torchrun's):

- the c10d rendezvous store and the store shared with the workers listen on a socket this module
  bound to the loopback address itself (``TCPStore(master_listen_fd=...)``): TCPStore alone
  would bind every interface whatever host name it is given;
- ``TORCH_DISABLE_SHARE_RDZV_TCP_STORE=0``: the workers use the agent's store, so no rank hosts
  one of its own (rank 0 would listen on every interface);
- ``GLOO_SOCKET_IFNAME`` and ``NCCL_SOCKET_IFNAME`` name the loopback interface, for the ranks
  and anything they start (gloo carries its data over it; on one node NCCL uses its sockets for
  bootstrap only and moves data through NVLink, PCIe or shared memory).

Under runyard (``RUNYARD_ATTEMPT_DIR`` set) the agent also notes when it first sees a rank fail
(:func:`note_first_failure`): the start of the recovery's phases (db/vocabulary/phases.py).

These override the environment the scheduler was started with: the guarantee must not depend on
it.

It refuses (exit 2, naming the option) a command line that is not on loopback: a rendezvous
endpoint or ``--local-addr`` that is not a loopback address, an elastic node range, or
``--standalone``. A run across machines needs its sockets reachable and is launched with
``--network=cluster``.
"""

from __future__ import annotations

import gc

if __name__ == "__main__":
    # The agent imports torch (and for warm ranks the trainer) with the collector off;
    # main() turns it back on (trainer.process.lifecycle.settle_imports says why).
    gc.disable()

import ipaddress
import json
import os
import socket
import sys
import time
from datetime import timedelta
from typing import Any

import psutil
from torch.distributed import TCPStore, run
from torch.distributed.elastic.events import NodeState, construct_and_record_rdzv_event
from torch.distributed.elastic.multiprocessing.api import DefaultLogsSpecs, LogsDest, LogsSpecs, SubprocessContext
from torch.distributed.elastic.rendezvous import RendezvousConnectionError, RendezvousParameters
from torch.distributed.elastic.rendezvous import c10d_rendezvous_backend as c10d
from torch.distributed.elastic.rendezvous.dynamic_rendezvous import DynamicRendezvousHandler
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

from db.vocabulary.layout import FAILURE_FILE, RANK_MAP_FILE
from trainer.agent import warm as warm_module
from trainer.process.lifecycle import exit_without_finalising, settle_imports
from trainer.process.store_secret import MissingSecret, ensure_secret, guard_rendezvous_unpickling, prefixed

# Where psutil finds no interface carrying 127.0.0.1 (it always exists on Linux).
LOOPBACK_INTERFACE_FALLBACK = "lo"
NETWORK_OPTION = "--network="


class NotOneLoopbackNode(ValueError):
    """The command line describes something other than one node on loopback."""


def loopback_interface() -> str:
    """The name of the network interface that carries 127.0.0.1 (``lo`` on Linux)."""
    interfaces: dict[str, list[Any]] = psutil.net_if_addrs()  # psutil is untyped: Any
    for name, addresses in interfaces.items():
        if any(a.family == socket.AF_INET and a.address == "127.0.0.1" for a in addresses):
            return name
    return LOOPBACK_INTERFACE_FALLBACK


def loopback_environment(interface: str) -> dict[str, str]:
    """The variables that keep the agent's workers and their backends on loopback.

    They override the caller's own values: the guarantee does not depend on the environment the
    scheduler was started with.

    Args:
        interface: The loopback interface's name (see :func:`loopback_interface`).
    """
    return {
        # The workers use the agent's store; with "1" rank 0 would host one on every interface.
        "TORCH_DISABLE_SHARE_RDZV_TCP_STORE": "0",
        "GLOO_SOCKET_IFNAME": interface,
        "NCCL_SOCKET_IFNAME": interface,
    }


def loopback_address(value: str | None, option: str) -> str:
    """``value`` if it is a loopback IP address (127.0.0.0/8 or ::1), else NotOneLoopbackNode.

    Host names are refused: what a name resolves to can change; an address literal cannot.
    """
    try:
        if value and ipaddress.ip_address(value.strip("[]")).is_loopback:
            return value.strip("[]")
    except ValueError:
        pass
    raise NotOneLoopbackNode(f"{option}={value!r} is not a loopback IP address (127.0.0.1 or ::1)")


def check_one_loopback_node(argv: list[str]) -> None:
    """Refuse a torchrun command line whose rendezvous does not stay on loopback: every node of
    the run is an agent on this machine.

    Raises:
        NotOneLoopbackNode: naming every option that is off, all at once.
    """
    args = run.parse_args(argv)
    problems: list[str] = []
    if args.standalone:
        problems.append("--standalone chooses its own endpoint; give --rdzv-endpoint=127.0.0.1:PORT")
    low, high = run.parse_min_max_nnodes(args.nnodes)
    if low != high:
        problems.append(f"--nnodes={args.nnodes!r}: a fixed number of nodes, all on this machine")
    if args.rdzv_backend != "c10d":
        problems.append(f"--rdzv-backend={args.rdzv_backend!r}: only c10d is bound to loopback here")
    endpoint_host = parse_rendezvous_endpoint(args.rdzv_endpoint, default_port=0)[0] if args.rdzv_endpoint else None
    for option, value in (("--rdzv-endpoint", endpoint_host), ("--local-addr", args.local_addr)):
        try:
            loopback_address(value, option)
        except NotOneLoopbackNode as exc:
            problems.append(str(exc))
    if problems:
        raise NotOneLoopbackNode("; ".join(problems))


def listening_socket(host: str, port: int) -> tuple[int, int]:
    """Bind ``host:port`` (``port`` 0: any free one) and listen; the descriptor and the port.

    The caller owns the descriptor: TCPStore takes it over and closes it with the store.
    """
    family = socket.AF_INET6 if ipaddress.ip_address(host).version == 6 else socket.AF_INET
    with socket.socket(family, socket.SOCK_STREAM) as sock:
        # As TCPStore's own server does: a port whose old connections are in TIME_WAIT is reusable.
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        sock.bind((host, port))
        sock.listen(socket.SOMAXCONN)
        bound = int(sock.getsockname()[1])
        return sock.detach(), bound


def loopback_store(host: str, port: int, **options: Any) -> TCPStore:
    """A multi-tenant TCPStore server, as torchrun's, listening on ``host:port`` alone.

    Args:
        host: A loopback address.
        port: The port, or 0 for a free one.
        options: Passed on to TCPStore (``timeout``).

    Raises:
        RendezvousConnectionError: the port cannot be bound (taken meanwhile). torchrun would
            then join whoever holds it as a client; this refuses to use a stranger's store.
    """
    host = loopback_address(host, "store host")
    try:
        fd, bound = listening_socket(host, port)
    except OSError as exc:
        raise RendezvousConnectionError(f"cannot listen on {host}:{port} for a TCP store: {exc}") from exc
    return TCPStore(host, bound, is_master=True, multi_tenant=True, master_listen_fd=fd, **options)


def rendezvous_store(params: RendezvousParameters) -> TCPStore:
    """The c10d rendezvous store at ``--rdzv-endpoint``, on loopback.

    Stands in for ``c10d_rendezvous_backend._create_tcp_store`` (same read timeout, same event
    and log line). The agent hosts it unless ``--rdzv-conf=is_host=0`` says another agent of the
    run on this machine does (several local nodes): then it connects as a client and listens on
    nothing. Unlike torchrun it never falls back from host to client: a port already taken
    belongs to a stranger.
    """
    host, port = parse_rendezvous_endpoint(params.endpoint, default_port=c10d.DEFAULT_PORT)
    read_timeout = params.get_as_int("read_timeout", 60)
    if read_timeout is None or read_timeout <= 0:
        raise ValueError("The read timeout must be a positive integer.")
    if params.get_as_bool("is_host", True) is False:
        return TCPStore(loopback_address(host, "store host"), port, is_master=False, multi_tenant=True,
                        timeout=timedelta(seconds=read_timeout))
    store = loopback_store(host, port, timeout=timedelta(seconds=read_timeout))
    msg = f"Process {os.getpid()} hosts the TCP store for the C10d rendezvous backend."
    construct_and_record_rdzv_event(run_id=params.run_id, message=msg, node_state=NodeState.INIT)
    c10d.logger.info(msg)
    return store


def shared_store(handler: DynamicRendezvousHandler, master_addr: str, master_port: int) -> TCPStore:
    """The store the agent shares with its workers, on loopback.

    Stands in for ``DynamicRendezvousHandler._create_tcp_store_server``: ``master_addr`` is the
    node's ``--local-addr``, ``master_port`` 0; the bound port reaches the workers as MASTER_PORT.
    """
    return loopback_store(master_addr, master_port)


def bind_stores_to_loopback() -> None:
    """Make torchrun create both its stores with :func:`loopback_store`.

    torchrun looks both factories up at call time, so replacing them before ``run.main`` is
    enough. TCPStore alone binds every interface whatever host name it is given; only a socket
    bound beforehand (``master_listen_fd``) keeps it on one address.
    """
    c10d._create_tcp_store = rendezvous_store
    DynamicRendezvousHandler._create_tcp_store_server = shared_store  # type: ignore[method-assign, assignment]


class RankMapLogsSpecs(DefaultLogsSpecs):
    """torchrun's own log layout, plus ``ranks.json`` beside the local-rank folders: which global
    rank each local rank is (orchestrator/executors/logs.py reads it)."""

    def reify(self, envs: dict[int, dict[str, str]]) -> LogsDest:
        dest = super().reify(envs)
        folders = {local: os.path.dirname(path) for local, path in dest.error_files.items() if path != os.devnull}
        if folders:
            ranks = {str(local): int(envs[local]["RANK"]) for local in folders if "RANK" in envs[local]}
            attempt_dir = os.path.dirname(next(iter(folders.values())))
            tmp = os.path.join(attempt_dir, f".{RANK_MAP_FILE}.tmp")
            with open(tmp, "w") as f:
                json.dump(ranks, f)
            os.replace(tmp, os.path.join(attempt_dir, RANK_MAP_FILE))
        return dest


def use_rank_map_logs() -> None:
    """Make torchrun build its log destinations with :class:`RankMapLogsSpecs` (it looks the
    class up by ``--logs-specs`` name at call time; runyard never passes that option)."""

    def logs_specs_class(logs_specs_name: str | None) -> type[LogsSpecs]:
        return RankMapLogsSpecs

    run._get_logs_specs_class = logs_specs_class


def guard_stores(nnodes: int) -> None:
    """Put every key of the rendezvous store under the attempt's secret, and unpickle the
    rendezvous state with an unpickler that builds nothing else (trainer/process/store_secret.py says
    why: another local account can reach a loopback port).

    Called after :func:`bind_stores_to_loopback` where the run is on loopback: it wraps whichever
    factory torchrun will call. The ranks put their own keys under the same prefix
    (trainer/process/distributed.py, trainer/process/script_runner.py).

    Raises:
        MissingSecret: several nodes and no secret in the environment.
    """
    secret = ensure_secret(nnodes)
    guard_rendezvous_unpickling()
    c10d._create_tcp_store = prefixed(c10d._create_tcp_store, secret)


def note_first_failure(attempt_dir: str) -> None:
    """Make the agent write ``failure.json`` into ``attempt_dir`` the moment it first sees a rank
    fail: ``{"at": wall-clock seconds, "local_ranks": {local rank: exit code}}``, before it stops
    the other ranks (which may take seconds: torchrun's exit comes only after). The scheduler
    takes it as the attempt's ``failed_at`` (db/vocabulary/phases.py). The agent looks every
    ``--monitor-interval`` (0.1 s), so the mark is at most that late. With several local nodes
    the first agent's note stays (created exclusively); a note that cannot be written is skipped
    (the exit time serves). Hooks torchrun's process context where it collects exit codes, before
    it closes the others; a torch without that hook leaves torchrun as it is.
    """
    capture = getattr(SubprocessContext, "_capture_process_failures", None)
    if capture is None:
        return
    path = os.path.join(attempt_dir, FAILURE_FILE)

    def capture_and_note(self: SubprocessContext, done_local_ranks: set[int]) -> None:
        capture(self, done_local_ranks)
        if self._failures and not os.path.exists(path):
            note = {"at": time.time(), "local_ranks": {str(r): f.exitcode for r, f in self._failures.items()}}
            try:
                with open(path, "x") as f:
                    json.dump(note, f)
            except OSError:
                pass

    SubprocessContext._capture_process_failures = capture_and_note  # type: ignore[method-assign]


def main(argv: list[str]) -> None:
    """Check ``argv``, keep every socket on loopback, put every store key under the attempt's
    secret, then run torchrun with ``argv`` unchanged.

    With ``--network=cluster`` first, torchrun's networking is left as it is (a job across hosts);
    the secret guards its stores all the same. Exceptions from torchrun propagate as under
    ``python -m torch.distributed.run`` (its ``@record`` error summary, exit code 1).
    """
    network, warm = "loopback", False
    while argv and (argv[0].startswith(NETWORK_OPTION) or argv[0] == warm_module.WARM_OPTION):
        if argv[0] == warm_module.WARM_OPTION:
            warm = True
        else:
            network = argv[0].removeprefix(NETWORK_OPTION)
        argv = argv[1:]
    if network not in ("loopback", "cluster"):
        print(f"trainer.agent.torchrun: {NETWORK_OPTION}{network}: expected loopback or cluster", file=sys.stderr)
        sys.exit(2)
    use_rank_map_logs()
    if attempt_dir := os.environ.get("RUNYARD_ATTEMPT_DIR"):
        note_first_failure(attempt_dir)
    if network == "loopback":
        try:
            check_one_loopback_node(argv)
        except NotOneLoopbackNode as exc:
            print(f"trainer.agent.torchrun: not on loopback: {exc}", file=sys.stderr)
            sys.exit(2)
        # The agent's workers inherit the agent's environment (plus torchrun's own variables).
        os.environ.update(loopback_environment(loopback_interface()))
        bind_stores_to_loopback()
    try:
        guard_stores(run.parse_min_max_nnodes(run.parse_args(argv).nnodes)[1])
    except MissingSecret as exc:
        print(f"trainer.agent.torchrun: {exc}", file=sys.stderr)
        sys.exit(2)
    if warm:
        warm_module.use_warm_ranks()
    settle_imports()
    run.main(argv)


if __name__ == "__main__":
    # A failed attempt's agent exits at once once its ranks are gone (trainer/process/lifecycle.py says why).
    exit_without_finalising(lambda: main(sys.argv[1:]))
