"""A per-attempt secret under which every key of a run's stores lies, and a rendezvous that
unpickles nothing but its own state.

Why: a run's stores (torchrun's c10d rendezvous store and the store its agent shares with the
ranks) are TCPStores on 127.0.0.1 without authentication, and their ports are no secret (``ps``
shows the endpoint, ``/proc/net/tcp`` every listening port and its owner). Loopback stops other
hosts, not the other accounts of a shared workstation: any local user could connect, write the
rendezvous state (a pickle, which torchrun's agent unpickles) and so run code as runyard's user,
join the rendezvous, or overwrite the addresses the ranks exchange.

A TCPStore can be read and written only by key, and it offers no way to list its keys. So the
scheduler gives every attempt a fresh 256-bit secret (:func:`new_secret`), in the environment of
the processes it starts (never on a command line: ``/proc/PID/environ`` is readable by the owner
alone, ``/proc/PID/cmdline`` by everyone), and every key the agent and the ranks use lies under
``runyard/<secret>/`` (:func:`key_prefix`): a stranger who connects cannot name a single key of
the run, so can neither read nor write its state, nor join it. Behind that, the agent unpickles
the rendezvous state with an unpickler that knows only the rendezvous state's own classes
(:func:`guard_rendezvous_unpickling`), so a forged state could not run code even if its key were
known.

Why not the alternatives: a network namespace per attempt would hide the ports themselves, but
needs unprivileged user namespaces (refused on Ubuntu 24.04 by AppArmor, and in many
containers), and its private loopback would cut rank 0 off a PostgreSQL on the host's loopback.
A secret works the same for a local run, a local run of several nodes and a Slurm job across
hosts, and needs nothing from the kernel.

This module imports only the standard library at import time (a script's runner loads it by
location under another interpreter, trainer/process/script_runner.py); torch is imported where needed.
"""

from __future__ import annotations

import importlib
import io
import os
import pickle
import secrets
import types
from collections.abc import Callable, Mapping
from typing import Any

# The environment variable that carries an attempt's secret to its agents and ranks.
SECRET_VAR = "RUNYARD_RDZV_SECRET"  # noqa: S105 - a variable's name, not a secret
# 32 random bytes, hex: 64 characters.
SECRET_BYTES = 32
RENDEZVOUS_MODULE = "torch.distributed.elastic.rendezvous.dynamic_rendezvous"
# What a rendezvous state pickle may name (torch's _RendezvousState and what it holds).
RENDEZVOUS_STATE_GLOBALS = frozenset({
    (RENDEZVOUS_MODULE, "_RendezvousState"),
    (RENDEZVOUS_MODULE, "_NodeDesc"),
    ("datetime", "datetime"),
    ("datetime", "timezone"),
    ("datetime", "timedelta"),
})


class MissingSecret(RuntimeError):
    """A process of a run found no secret in its environment where one is required."""


def new_secret() -> str:
    """A fresh secret for one attempt."""
    return secrets.token_hex(SECRET_BYTES)


def secret_from_env(environ: Mapping[str, str] | None = None) -> str | None:
    """The attempt's secret, or None when the environment carries none."""
    value = (os.environ if environ is None else environ).get(SECRET_VAR, "")
    return value or None


def key_prefix(secret: str) -> str:
    """The prefix of every key a run's processes use in its stores."""
    return f"runyard/{secret}"


def ensure_secret(nnodes: int) -> str:
    """The secret of this agent's attempt, made here when this is a run of one node started
    without one (``python -m trainer.agent.torchrun`` by hand): every process of it descends from this
    agent and inherits it. A run of several nodes cannot agree on one made here.

    Raises:
        MissingSecret: several nodes and no secret in the environment.
    """
    secret = secret_from_env()
    if secret is None:
        if nnodes != 1:
            raise MissingSecret(f"{SECRET_VAR} must be set (the same on every node) for a run of {nnodes} nodes")
        secret = new_secret()
        os.environ[SECRET_VAR] = secret
    return secret


class RendezvousStateUnpickler(pickle.Unpickler):
    """An unpickler that builds a rendezvous state and nothing else: any other global (a
    function to call, a class to instantiate) is refused."""

    def find_class(self, module: str, name: str) -> Any:
        if (module, name) not in RENDEZVOUS_STATE_GLOBALS:
            raise pickle.UnpicklingError(f"the rendezvous state names {module}.{name}, which is not part of one")
        return super().find_class(module, name)


def load_rendezvous_state(data: bytes) -> Any:
    """``pickle.loads`` for a rendezvous state, through :class:`RendezvousStateUnpickler`."""
    return RendezvousStateUnpickler(io.BytesIO(data)).load()


def guard_rendezvous_unpickling() -> None:
    """Make torchrun's dynamic rendezvous unpickle its state with :func:`load_rendezvous_state`.

    It reads the state through its module's ``pickle`` name at call time (``pickle.loads`` in
    ``_BackendRendezvousStateHolder.sync``); a refused state raises ``pickle.UnpicklingError``,
    which it reports as a corrupt rendezvous state.
    """
    from torch.distributed.elastic.rendezvous import dynamic_rendezvous  # noqa: PLC0415 - torch-free: the scheduler and a script's own python load this module

    dynamic_rendezvous.pickle = types.SimpleNamespace(  # type: ignore[assignment]
        dumps=pickle.dumps, loads=load_rendezvous_state,
        PickleError=pickle.PickleError, UnpicklingError=pickle.UnpicklingError,
    )


def prefixed(factory: Callable[..., Any], secret: str) -> Callable[..., Any]:
    """``factory`` (a function that makes a store) with its store put under the secret's
    prefix."""
    from torch.distributed import PrefixStore  # noqa: PLC0415 - torch-free: the scheduler and a script's own python load this module

    def make(*args: Any, **kwargs: Any) -> Any:
        return PrefixStore(key_prefix(secret), factory(*args, **kwargs))

    make.__wrapped__ = factory  # type: ignore[attr-defined]
    return make


def guard_worker_store(secret: str | None = None) -> bool:
    """In a rank: put the store that ``init_process_group`` (``env://``) joins under the
    attempt's secret, as runyard's agents and the built-in trainer do.

    A script's ``init_process_group()`` reaches the agent's store through
    ``torch.distributed.rendezvous._create_c10d_store``, looked up at call time. Without a
    secret in the environment (a run not started by runyard) nothing changes.

    Returns:
        Whether the store is now guarded (False too where the interpreter has no torch: a script
        under ``workload.python`` that never joins a process group).
    """
    secret = secret or secret_from_env()
    if secret is None:
        return False
    try:
        # By its module path: ``torch.distributed.rendezvous`` the attribute is a function.
        rendezvous: Any = importlib.import_module("torch.distributed.rendezvous")
    except ImportError:
        return False
    if not hasattr(rendezvous._create_c10d_store, "__wrapped__"):
        rendezvous._create_c10d_store = prefixed(rendezvous._create_c10d_store, secret)
    return True
