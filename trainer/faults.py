"""Fault injection for runyard's own tests, read from the environment of the ranks (and, for
one hook, of the scheduler).

These make timing-dependent failures reproducible (a kill while a checkpoint is being written,
a kill at a known step); they never change what is computed.

The variables are typed and documented in ``db/vocabulary/settings.py`` (:class:`db.vocabulary.settings.FaultEnv`,
docs/DEVELOPMENT.md). Every hook is inert unless ``RUNYARD_FAULTS=1`` is set as well: the ranks inherit the
scheduler's environment, so a stray ``RUNYARD_FAULT_*`` left in a user's shell must not reach
real training. Only runyard's tests set the switch. Each component's hooks are one object, which
the component gets only under the switch (``installed()``, None otherwise): real training and a
real scheduler check one ``None`` and call nothing here.

- :class:`StepFaults`: the training loop's, around every step (trainer/workloads/loop.py);
- :class:`EntryFaults`: ``python -m trainer``'s, around a built-in workload (trainer/__main__.py);
- :class:`SaveFaults`: the checkpoint writer's, before a checkpoint is published
  (trainer/checkpoint/writing.py; the manager installs it);
- :class:`LaunchFaults`: the local executor's, after it started an attempt
  (orchestrator/executors/local.py), in the scheduler.

- ``RUNYARD_FAULT_STEP_DELAY_S=0.02``: sleep this long after every step.
- ``RUNYARD_FAULT_SETUP_DELAY_S=5``: every rank sleeps this long while setting up (a slow data
  load, so a test can watch the start-up phases).
- ``RUNYARD_FAULT_SAVE_DELAY=STEP:SECONDS``: the checkpoint writer sleeps before publishing the
  checkpoint of STEP (so a test can kill the ranks while that save is in flight); ``*:SECONDS``,
  before publishing every checkpoint (so a stop, which waits for its last checkpoint, lasts that
  long and a test can watch it).
- ``RUNYARD_FAULT_SLOW_RANK=RANK:SECONDS``: RANK sleeps this long at the start of every step (a
  straggler).
- ``RUNYARD_FAULT_PERTURB=STEP:RANK``: RANK nudges one parameter after the optimizer step of STEP
  (a replica out of sync); this one does change what is computed, on purpose.
- ``RUNYARD_FAULT_ABORT_AT_EXIT=RANK``: RANK aborts (SIGABRT) after it finished its work, as a
  C++ destructor racing the interpreter's shutdown sometimes makes a finished rank do.
- ``RUNYARD_FAULT_STALL=STEP:RANK``: RANK stops making progress before STEP (it sleeps in Python,
  outside any collective, while the other ranks wait for it in one): a hang with one culprit.
- ``RUNYARD_FAULT_FSIZE=STEP:BYTES[@ATTEMPTS]``: rank 0 may not write files past BYTES from STEP
  on (a full disk, for one process).
- ``RUNYARD_FAULT_EXIT_AFTER_LAUNCH=1``: the scheduler exits right after starting an attempt,
  before it commits the launcher's pid (the attempt row keeps ``pid IS NULL``).
"""

from __future__ import annotations

import os
import resource
import signal
import time
from collections.abc import Callable, Iterable
from typing import Any

SWITCH = "RUNYARD_FAULTS"


def enabled() -> bool:
    """True when the tests' switch is on (``RUNYARD_FAULTS=1``); every hook is inert otherwise."""
    return os.environ.get(SWITCH) == "1"


def _spec(name: str) -> str:
    """The value of the hook ``name``, or "" when it is unset or the switch is off (then nothing
    but the switch is read: a rank of a real run never loads the settings model)."""
    if not enabled():
        return ""
    from db.vocabulary.settings import FaultEnv  # noqa: PLC0415 - the settings model only under the switch (see _spec's docstring)

    return FaultEnv.from_env().spec(name)


def step_delay_s() -> float:
    return float(_spec("RUNYARD_FAULT_STEP_DELAY_S") or 0.0)


def setup_delay_s() -> float:
    return float(_spec("RUNYARD_FAULT_SETUP_DELAY_S") or 0.0)


def save_delay_s(step: int) -> float:
    spec = _spec("RUNYARD_FAULT_SAVE_DELAY")
    if ":" not in spec:
        return 0.0
    at, seconds = spec.split(":", 1)
    return float(seconds) if at == "*" or int(at) == step else 0.0


def maybe_raise(step: int, rank: int, attempt: int) -> None:
    """``RUNYARD_FAULT_RAISE=STEP[:RANK][@ATTEMPTS]``: raise a RuntimeError (a "user error") at
    STEP on RANK (every rank when omitted), in attempts up to ATTEMPTS (every attempt when
    omitted)."""
    spec = _spec("RUNYARD_FAULT_RAISE")
    if not spec:
        return
    where, _, upto = spec.partition("@")
    at, _, on_rank = where.partition(":")
    if int(at) == step and (not on_rank or int(on_rank) == rank) and (not upto or attempt <= int(upto)):
        raise RuntimeError(f"injected failure at step {step}")


def maybe_cuda_oom(step: int, batch_size: int) -> None:
    """``RUNYARD_FAULT_CUDA_OOM=STEP:MAX_BATCH``: raise torch's CUDA out-of-memory error at STEP
    while the micro-batch is larger than MAX_BATCH (CI has no GPU to run out of)."""
    spec = _spec("RUNYARD_FAULT_CUDA_OOM")
    if not spec:
        return
    at, _, max_batch = spec.partition(":")
    if int(at) == step and batch_size > int(max_batch or 0):
        import torch  # noqa: PLC0415 - torch-free: the scheduler imports this module

        raise torch.cuda.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate 2.00 GiB (injected at step {step}, micro-batch {batch_size})"
        )


def maybe_sigkill(step: int, rank: int) -> None:
    """``RUNYARD_FAULT_SIGKILL=STEP:RANK``: RANK kills itself with SIGKILL before STEP (in every
    attempt that reaches it), like a host or the OOM killer taking one process."""
    spec = _spec("RUNYARD_FAULT_SIGKILL")
    if not spec:
        return
    at, _, on_rank = spec.partition(":")
    if int(at) == step and int(on_rank or 0) == rank:
        os.kill(os.getpid(), signal.SIGKILL)


def maybe_stall(step: int, rank: int) -> None:
    """``RUNYARD_FAULT_STALL=STEP:RANK``: RANK sleeps for good before STEP, in Python and outside
    any collective (its stack shows this function; the other ranks wait in the next collective)."""
    spec = _spec("RUNYARD_FAULT_STALL")
    if not spec:
        return
    at, _, on_rank = spec.partition(":")
    if int(at) == step and int(on_rank or 0) == rank:
        while True:
            time.sleep(3600)


def maybe_limit_file_size(step: int, rank: int, attempt: int, settle: Callable[[], object] | None = None) -> None:
    """``RUNYARD_FAULT_FSIZE=STEP:BYTES[@ATTEMPTS]``: before STEP, rank 0 limits the size of every
    file it writes to BYTES (``RLIMIT_FSIZE``), in attempts up to ATTEMPTS (every attempt when
    omitted): a write past that offset then fails with EFBIG ("File too large"), as a full disk
    fails with ENOSPC. A small filesystem cannot be mounted here; this is the same failure for
    one process. Python ignores SIGXFSZ, so the write fails instead of killing the process.

    ``settle`` is called first: a checkpoint still being written from an earlier step finishes
    before the limit, so every attempt fails at the same save, not at whichever one was in flight."""
    spec = _spec("RUNYARD_FAULT_FSIZE")
    if not spec or rank != 0:
        return
    where, _, upto = spec.partition("@")
    at, _, size = where.partition(":")
    if int(at) == step and (not upto or attempt <= int(upto)):
        if settle is not None:
            settle()
        _, hard = resource.getrlimit(resource.RLIMIT_FSIZE)
        resource.setrlimit(resource.RLIMIT_FSIZE, (int(size), hard))


def exit_after_launch() -> bool:
    """``RUNYARD_FAULT_EXIT_AFTER_LAUNCH=1``: the scheduler is to exit between starting an
    attempt and committing its pid."""
    return _spec("RUNYARD_FAULT_EXIT_AFTER_LAUNCH") == "1"


def slow_rank_s(rank: int) -> float:
    """``RUNYARD_FAULT_SLOW_RANK=RANK:SECONDS``: how long this rank sleeps at the start of each step."""
    spec = _spec("RUNYARD_FAULT_SLOW_RANK")
    on_rank, _, seconds = spec.partition(":")
    return float(seconds) if spec and int(on_rank) == rank else 0.0


def maybe_perturb(step: int, rank: int, params: Iterable[Any]) -> None:
    """``RUNYARD_FAULT_PERTURB=STEP:RANK``: after the optimizer step of STEP, RANK adds 1e-3 to the
    first element of its first parameter, in place and outside autograd. DDP broadcasts the
    parameters only when it wraps the model, so this replica stays different from the others."""
    spec = _spec("RUNYARD_FAULT_PERTURB")
    if not spec:
        return
    at, _, on_rank = spec.partition(":")
    if int(at) == step and int(on_rank or 0) == rank:
        import torch  # noqa: PLC0415 - torch-free: the scheduler imports this module

        with torch.no_grad():
            next(iter(params)).view(-1)[0] += 1e-3


def maybe_abort_at_exit(rank: int) -> None:
    """``RUNYARD_FAULT_ABORT_AT_EXIT=RANK``: RANK aborts here (called after it finished)."""
    spec = _spec("RUNYARD_FAULT_ABORT_AT_EXIT")
    if spec and int(spec) == rank:
        os.abort()


# The hooks :class:`StepFaults` calls at every step.
STEP_HOOKS = ("RUNYARD_FAULT_RAISE", "RUNYARD_FAULT_CUDA_OOM", "RUNYARD_FAULT_SIGKILL", "RUNYARD_FAULT_STALL",
              "RUNYARD_FAULT_FSIZE", "RUNYARD_FAULT_PERTURB")


class StepFaults:
    """One rank's per-step injections, for a training loop: :meth:`before` a step (raise, CUDA
    OOM, SIGKILL, stall, file-size limit, the straggler's sleep), :meth:`after_update` its
    optimizer step (the perturbation), :meth:`after` it (the step delay).

    A loop gets one from :meth:`installed`, which is None unless the switch is on: real training
    checks one ``None`` per step and calls nothing here.

    Which hooks are set is read once, here: a rank's environment is fixed when it is launched, and
    asking the settings model again for each of six hooks at every step cost about 0.6-1 ms of
    CPU a step (0.3 s of each rank of a 300-step test run, py-spy), in every run of the tests."""

    def __init__(self, rank: int, attempt: int, settle: Callable[[], object] | None = None):
        self.rank = rank
        self.attempt = attempt
        self.settle = settle  # waits for the checkpoint being written, if any
        self.slow_s = slow_rank_s(rank)
        self.delay_s = step_delay_s()
        self.armed = frozenset(name for name in STEP_HOOKS if _spec(name))

    @classmethod
    def installed(cls, rank: int, attempt: int, settle: Callable[[], object] | None = None) -> StepFaults | None:
        """The hooks of ``rank`` in ``attempt`` when ``RUNYARD_FAULTS=1``; None otherwise.
        ``settle`` waits for the checkpoint being written: a file-size limit starts after it."""
        return cls(rank, attempt, settle) if enabled() else None

    def before(self, step: int, batch_size: int) -> None:
        """Before STEP (1-based) with micro-batch ``batch_size``."""
        armed = self.armed
        if "RUNYARD_FAULT_RAISE" in armed:
            maybe_raise(step, self.rank, self.attempt)
        if "RUNYARD_FAULT_CUDA_OOM" in armed:
            maybe_cuda_oom(step, batch_size)
        if "RUNYARD_FAULT_SIGKILL" in armed:
            maybe_sigkill(step, self.rank)
        if "RUNYARD_FAULT_STALL" in armed:
            maybe_stall(step, self.rank)
        if "RUNYARD_FAULT_FSIZE" in armed:
            maybe_limit_file_size(step, self.rank, self.attempt, self.settle)
        if self.slow_s:
            time.sleep(self.slow_s)

    def after_update(self, step: int, params: Iterable[Any]) -> None:
        """After the optimizer step of STEP, on the model's ``params``."""
        if "RUNYARD_FAULT_PERTURB" in self.armed:
            maybe_perturb(step, self.rank, params)

    def after(self) -> None:
        if self.delay_s:
            time.sleep(self.delay_s)


class EntryFaults:
    """One rank's injections in ``python -m trainer``, around its built-in workload:
    :meth:`during_setup` (a slow data load, ``RUNYARD_FAULT_SETUP_DELAY_S``) and :meth:`at_exit`
    (an abort after the rank finished, ``RUNYARD_FAULT_ABORT_AT_EXIT``).

    The entry point gets one from :meth:`installed`, which is None unless the switch is on."""

    def __init__(self, rank: int):
        self.rank = rank

    @classmethod
    def installed(cls, rank: int) -> EntryFaults | None:
        """The hooks of ``rank`` when ``RUNYARD_FAULTS=1``; None otherwise."""
        return cls(rank) if enabled() else None

    def during_setup(self) -> None:
        """While the workload sets up: sleep, so that a test can watch the start-up phases."""
        if delay := setup_delay_s():
            time.sleep(delay)

    def at_exit(self) -> None:
        """After the rank's work is done and the process group torn down."""
        maybe_abort_at_exit(self.rank)


class SaveFaults:
    """The checkpoint writer's injection: :meth:`before_publish` holds a checkpoint before its
    folder is published (``RUNYARD_FAULT_SAVE_DELAY``), so that a test can kill the ranks while
    that save is in flight, or watch a stop wait for its last checkpoint.

    A checkpoint manager gets one from :meth:`installed`, which is None unless the switch is on."""

    @classmethod
    def installed(cls) -> SaveFaults | None:
        """The hook when ``RUNYARD_FAULTS=1``; None otherwise."""
        return cls() if enabled() else None

    def before_publish(self, step: int) -> None:
        """Before the checkpoint of ``step`` is renamed into place."""
        if delay := save_delay_s(step):
            time.sleep(delay)


class LaunchFaults:
    """The local executor's injection, in the scheduler: :meth:`exit_after_launch` says to die
    between starting an attempt and committing its pid (``RUNYARD_FAULT_EXIT_AFTER_LAUNCH``).

    An executor gets one from :meth:`installed`, which is None unless the switch is on."""

    @classmethod
    def installed(cls) -> LaunchFaults | None:
        """The hook when ``RUNYARD_FAULTS=1``; None otherwise."""
        return cls() if enabled() else None

    def exit_after_launch(self) -> bool:
        """Whether the scheduler is to exit now, the attempt started and its pid not committed."""
        return exit_after_launch()
