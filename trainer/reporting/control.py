"""runyard's own collective: one small exchange per step, never waited for in the step that sent it.

The ranks must agree on a few things at the same step: stop now (SIGTERM reached some rank),
save now (a time-based checkpoint is due by some rank's clock), and at log steps every rank's
metrics must reach rank 0. :class:`ControlChannel` makes one small collective per step for all
of it, on CPU tensors (a gloo group of its own under NCCL, this module's
``control_group``), launched asynchronously:

- at a log step, an all-gather of every rank's values with the flags appended (:meth:`gather`);
- at any other step, a MAX all-reduce of the flags alone (launched by :meth:`agree`).

The collective launched in step ``s`` is read in step ``s + 1``, by which time a whole step of
compute has hidden its latency, so the training thread does not wait for the other ranks twice
per step (once in the gradient sync, once here). Decisions come one step late, the same on every
rank: a rank that gets SIGTERM during step ``s`` stops after step ``s + 1``, and the metrics of
step ``s`` are handed to their ``done`` callback during step ``s + 1`` (or at :meth:`close`).

Every rank must call :meth:`gather` and :meth:`agree` at the same steps in the same order and add
the same flags; that keeps the collectives matched. Outside a process group everything is
local: flags are read at once and ``done`` runs at once.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Sequence
from contextlib import AbstractContextManager
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

Flag = Callable[[], bool]
Done = Callable[[list[list[float]]], None]
WaitGuard = Callable[[], AbstractContextManager[Any]]


@dataclass
class _InFlight:
    work: Any  # dist.Work
    buffers: list[torch.Tensor]  # the all-gather's outputs, or the all-reduced flags
    names: list[str]  # the flags it carries (those added by the time it was launched)
    width: int  # values before the flags in a gathered row
    done: Done | None


def control_group() -> dist.ProcessGroup | None:
    """The process group for runyard's few control numbers (metrics, stop flag): CPU tensors.

    Under NCCL (which takes CUDA tensors only, and whose results the host must wait for) it is a
    new gloo group over the same ranks, so that exchanging them never waits for the GPU; under
    gloo it is the default group (None). Collective when it creates one: every rank calls it at
    the same point, as the first exchange or stop check does.
    """
    if dist.is_initialized() and dist.get_backend() == "nccl":
        group: dist.ProcessGroup | None = dist.new_group(backend="gloo")
        return group
    return None


class ControlChannel:
    """The per-step control collective of one process (see the module docstring); its group's
    ranks are the default process group's.

    One channel per process, made first and handed to whatever needs the ranks to agree (the
    SDK's ``Run`` does this): the stop signal and the checkpointer add their flags
    (:meth:`add_flag`), the monitor gathers its metrics (:meth:`gather`) and adds its hooks
    (:meth:`add_wait_guard`, :meth:`add_before_agree`); whoever runs the loop calls
    :meth:`agree` once per step. Nobody replaces another's flag or hook.
    """

    def __init__(self) -> None:
        self._names: list[str] = []
        self._flags: list[Flag] = []
        self._group: dist.ProcessGroup | None = None  # None: the default group
        self._group_known = False  # chosen (and, under NCCL, made) at the first collective
        self._in_flight: _InFlight | None = None
        self._answer: dict[str, bool] | None = None  # read, not yet handed out by agree()
        self._launched = False  # a gather was launched since the last agree()
        self._wait_guards: list[WaitGuard] = []
        self._before_agree: list[Callable[[], None]] = []

    @property
    def collective(self) -> bool:
        return dist.is_initialized()

    def add_flag(self, name: str, flag: Flag) -> None:
        """Agree on ``flag()`` (true on any rank -> true on all) at every step from now on.

        Every rank adds the same flags at the same step. Adding a name twice does nothing.
        """
        if name not in self._names:
            self._names.append(name)
            self._flags.append(flag)

    def add_wait_guard(self, guard: WaitGuard) -> None:
        """Wrap every wait for a collective of this channel in ``guard()``.

        The monitor pauses its straggler clock there: a rank waiting for runyard's own exchange
        is not doing its own work.
        """
        self._wait_guards.append(guard)

    def add_before_agree(self, callback: Callable[[], None]) -> None:
        """Call ``callback()`` at the start of every :meth:`agree`, on every rank.

        It may :meth:`gather`: the monitor launches there the exchange of a metrics log whose
        values were still on the device when it was logged.
        """
        self._before_agree.append(callback)

    def _local(self) -> list[float]:
        return [1.0 if flag() else 0.0 for flag in self._flags]

    def _control_group(self) -> dist.ProcessGroup | None:
        if not self._group_known:
            self._group, self._group_known = control_group(), True
        return self._group

    def gather(self, values: Sequence[float], done: Done) -> None:
        """Collective: launch the all-gather of this rank's ``values`` (every rank the same length).

        ``done(table)`` gets every rank's values (``table[rank]``), on every rank, when the
        all-gather is read: at the next :meth:`agree` of a later step, the next :meth:`gather`
        or :meth:`close`. Outside a process group it runs now, with this rank's row alone.
        """
        if not self.collective:
            done([[float(v) for v in values]])
            return
        self._read()  # at most one collective in flight
        local = torch.tensor([*(float(v) for v in values), *self._local()], dtype=torch.float64)
        out = [torch.empty_like(local) for _ in range(dist.get_world_size(self._control_group()))]
        work = dist.all_gather(out, local, group=self._control_group(), async_op=True)
        self._in_flight = _InFlight(work, out, list(self._names), len(values), done)
        self._launched = True

    def agree(self) -> dict[str, bool]:
        """Collective, once per step at its end: every flag, as all ranks agreed one step ago.

        Reads the collective of an earlier step (its wait is normally over: a step of compute
        has passed) and, unless this step already launched a gather, launches the flags'
        all-reduce for the next call. Outside a process group the flags are read now.
        """
        for callback in self._before_agree:
            callback()
        if not self.collective:
            return {name: flag() for name, flag in zip(self._names, self._flags, strict=True)}
        if not self._launched:
            self._read()
        answer, self._answer = self._answer or {}, None
        if not self._launched and self._flags:
            flags = torch.tensor(self._local(), dtype=torch.float64)
            work = dist.all_reduce(flags, op=dist.ReduceOp.MAX, group=self._control_group(), async_op=True)
            self._in_flight = _InFlight(work, [flags], list(self._names), 0, None)
        self._launched = False
        return {name: answer.get(name, False) for name in self._names}

    def _read(self) -> None:
        in_flight, self._in_flight = self._in_flight, None
        if in_flight is None:
            return
        with contextlib.ExitStack() as guards:
            for guard in self._wait_guards:
                guards.enter_context(guard())
            in_flight.work.wait()
        if in_flight.done is not None:
            table = torch.stack(in_flight.buffers).tolist()
            flags = [max(row[in_flight.width + i] for row in table) for i in range(len(in_flight.names))]
        else:
            table, flags = [], in_flight.buffers[0].tolist()
        answer = {name: value > 0 for name, value in zip(in_flight.names, flags, strict=True)}
        if self._answer is not None:  # not handed out yet: a flag raised then still counts
            answer = {name: value or self._answer.get(name, False) for name, value in answer.items()}
        self._answer = answer
        if in_flight.done is not None:
            in_flight.done([row[: in_flight.width] for row in table])

    def close(self) -> None:
        """After the loop: read the collective in flight, so that the last metrics get written.

        Every rank launched it, so no other call is needed for it to finish; after a failure,
        skip this (a rank that failed may not have launched it)."""
        self._read()
