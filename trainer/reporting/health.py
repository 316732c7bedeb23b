"""The ranks' health: who is slow (straggler check) and whose parameters drifted (desync check).

Measuring happens on every rank, deciding only on rank 0, from the values that the metrics
exchange (one all-gather per log interval, trainer/reporting/monitoring.py) brings it. Nothing here issues
a collective of its own; the only wait for the device is reading the checksum's total, at a
desync check.

- :class:`PreSyncClock` and :func:`timed_allreduce` measure each step's *time to the gradient
  sync* of a DDP model; :class:`StragglerCheck` compares it across ranks.
- :func:`params_checksum` reduces a replica's parameters to one exact number;
  :class:`DesyncCheck` decides when to compare and what differs.
"""

# No `from __future__ import annotations` here: DDP compares the communication hook's annotations
# with dist.GradBucket and torch.futures.Future[torch.Tensor] as objects.
import math
import statistics
import threading
import time
from collections import deque
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

# A rank this little slower than the others is not called a straggler, whatever the ratio: on a
# busy CPU host the OS scheduler alone moves tiny steps by a few milliseconds (a time slice).
STRAGGLER_MIN_EXCESS_S = 0.005
MAX_PENDING_STEPS = 10_000  # steps measured but not yet reported (a script that never logs)

Stamp = Any  # a perf_counter() value, or a recorded torch.cuda.Event


@dataclass(frozen=True)
class Finding:
    """Something rank 0 concluded, to be written as an Event row."""

    level: str
    kind: str
    message: str


# -- the time to the gradient sync ---------------------------------------------------------------


class PreSyncClock:
    """Each step's *time to the gradient sync*: this rank's own work between two gradient syncs.

    In synchronous data parallelism every rank leaves a step's gradient all-reduce at about the
    same moment, however late it arrived, so a fast rank's step time includes its wait for the
    slow one and step times cannot tell them apart. What differs is how long each rank works
    before it can join the next sync: from the moment it left the previous step's all-reduce to
    the moment DDP launches this step's first gradient bucket. That span holds the optimizer
    step, the wait for data, the forward pass and the backward pass up to the first full bucket
    (all of it, for a model that fits one bucket), and no wait for another rank, with two
    exceptions that are handled or tolerated:

    - runyard's own collectives in that span (the metrics all-gather, the stop flag) are cut out:
      the clock is paused around them (:meth:`pause`, :meth:`resume`);
    - evaluation and checkpoint collectives are not; they fall on a few steps, and the straggler
      check compares medians over a window, which such steps do not move. Neither do DDP's buffer
      broadcasts, which make a model with buffers (batch norm) look less straggly, never more.

    Marks come from the DDP communication hook (:func:`timed_allreduce`): the first bucket of a
    step closes the span, the completion of the last bucket's all-reduce opens the next one.
    On CUDA the marks are CUDA events on the current stream, so the span is GPU time (including
    time the GPU sat idle waiting for the host); they are read at the next report, after the
    host has synchronised with the device anyway. On CPU they are ``perf_counter`` values.

    Thread safety: the hook runs on autograd's thread and the completion on the communication
    thread, so the state is kept under a lock.
    """

    def __init__(self, device: torch.device):
        self._cuda = device.type == "cuda"
        self._lock = threading.Lock()
        self._open: Stamp | None = self._stamp()  # start of the running span of own work
        self._segments: list[tuple[Stamp, Stamp]] = []  # closed spans of the current step
        self._steps: list[list[tuple[Stamp, Stamp]]] = []  # steps that reached their sync
        self._in_sync = False
        self._pending = 0  # buckets launched and not yet reduced
        self._last_launched = False

    def _stamp(self) -> Stamp:
        if self._cuda:
            event = torch.cuda.Event(enable_timing=True)
            event.record()
            return event
        return time.perf_counter()

    def _seconds(self, start: Stamp, end: Stamp) -> float:
        if self._cuda:
            end.synchronize()  # done long ago: the report synchronised the host already
            elapsed_ms: float = start.elapsed_time(end)
            return elapsed_ms / 1000.0
        seconds: float = end - start
        return seconds

    def restart(self) -> None:
        """Forget everything so far (after loading a checkpoint: that was not a step)."""
        with self._lock:
            self._segments, self._steps = [], []
            self._open = None if self._in_sync else self._stamp()

    def pause(self) -> None:
        """This rank enters a collective that is not the gradient sync: stop counting."""
        with self._lock:
            if self._open is not None and not self._in_sync:
                self._segments.append((self._open, self._stamp()))
                self._open = None

    def resume(self) -> None:
        """It left that collective: count again."""
        with self._lock:
            if self._open is None and not self._in_sync:
                self._open = self._stamp()

    def bucket_launched(self, last: bool) -> None:
        """DDP hands a bucket to the all-reduce; the first of a step ends the step's span."""
        with self._lock:
            if not self._in_sync:
                self._in_sync = True
                if self._open is not None:
                    self._segments.append((self._open, self._stamp()))
                    self._open = None
                self._steps.append(self._segments)
                self._segments = []
                if len(self._steps) > MAX_PENDING_STEPS:
                    del self._steps[: len(self._steps) - MAX_PENDING_STEPS]
            self._pending += 1
            self._last_launched |= last

    def bucket_reduced(self) -> None:
        """A bucket's all-reduce completed; after the last one the next span begins."""
        with self._lock:
            self._pending -= 1
            if self._last_launched and self._pending == 0:
                self._in_sync = self._last_launched = False
                self._open = self._stamp()

    def take(self) -> list[float]:
        """Seconds per step since the last call, one value per step that reached its sync."""
        with self._lock:
            steps, self._steps = self._steps, []
        return [sum(self._seconds(a, b) for a, b in segments) for segments in steps]


def timed_allreduce(state: tuple[PreSyncClock, dist.ProcessGroup | None],
                    bucket: dist.GradBucket) -> torch.futures.Future[torch.Tensor]:
    """DDP communication hook: DDP's own averaging all-reduce, with the clock's marks around it.

    Register it with ``ddp.register_comm_hook((clock, ddp.process_group), timed_allreduce)``.
    The gradients are the same as without a hook (divided by the group size, then summed, as
    ``default_hooks.allreduce_hook`` does). The completion mark is taken in the future's ``then``
    callback, so it is in place before DDP's backward returns. Cost: about 50 us per bucket on
    a CPU (one Python call and one callback).
    """
    clock, group = state
    clock.bucket_launched(bucket.is_last())
    tensor = bucket.buffer()
    tensor.div_(group.size() if group is not None else dist.get_world_size())

    def reduced(fut: torch.futures.Future[list[torch.Tensor]]) -> torch.Tensor:
        clock.bucket_reduced()
        reduced_tensor: torch.Tensor = fut.value()[0]  # Future.value() is unannotated in torch
        return reduced_tensor

    # torch's all_reduce carries no annotations: its result (a Work, with async_op) is Any.
    done: torch.futures.Future[torch.Tensor] = dist.all_reduce(tensor, group=group, async_op=True).get_future().then(
        reduced)
    return done


# -- stragglers ----------------------------------------------------------------------------------


class StragglerCheck:
    """Rank 0's straggler decision from the gathered times to the gradient sync.

    Each report adds every rank's median time over its interval. Over the newest reports that
    cover ``window_steps`` steps, a rank is *slow* when the lower median of its values is above
    ``ratio`` times the median of the other ranks' (and above it by at least
    ``STRAGGLER_MIN_EXCESS_S``). A rank slow at every report for ``window_steps`` more steps is
    a straggler, provided it also stayed slow for ``sustain_s`` seconds: one warning, then
    nothing until it has not been slow for as long (an info finding closes the episode). Medians
    make one long step (a checkpoint, an evaluation, a hiccup) irrelevant; the seconds make a
    busy machine's noise irrelevant: on a CPU host running other work, which rank is slow moves
    every few seconds (2-rank and 4-rank digits runs of 3,000 steps beside other jobs had 14 and
    13 episodes of 30-100 steps each with a 40-step rule, every one a different moment and most
    a different rank), while a slow device, a throttled GPU or a rank's slow data loader stays.

    Args:
        world_size: Number of ranks.
        ratio: The threshold, above 1.
        window_steps: The window, and how many steps the condition must hold.
        sustain_s: How many seconds the condition must hold too (0: steps alone).
    """

    def __init__(self, world_size: int, ratio: float, window_steps: int, sustain_s: float = 0.0):
        self.world_size = world_size
        self.ratio = ratio
        self.window_steps = window_steps
        self.sustain_s = sustain_s
        self._window: deque[tuple[int, list[float]]] = deque()
        self._covered = 0  # steps the window holds
        self._slow_since: dict[int, tuple[int, float]] = {}  # rank -> (step, seconds)
        self._fine_since: dict[int, tuple[int, float]] = {}
        self.stragglers: set[int] = set()

    def _held(self, since: tuple[int, float], step: int, now: float) -> bool:
        return step - since[0] >= self.window_steps and now - since[1] >= self.sustain_s

    def update(self, step: int, steps: int, times: list[float], now: float | None = None) -> list[Finding]:
        """Add one report: ``times[r]`` is rank r's median time to the sync over the ``steps``
        steps before ``step`` (NaN when it measured none), reported at ``now`` (seconds on any
        clock; default the monotonic clock)."""
        if steps <= 0:
            return []
        now = time.monotonic() if now is None else now
        self._window.append((steps, times))
        self._covered += steps
        while self._covered - self._window[0][0] >= self.window_steps:
            self._covered -= self._window.popleft()[0]
        if self._covered < self.window_steps:
            return []
        medians = [_median([t[r] for _, t in self._window]) for r in range(self.world_size)]
        findings = []
        for rank, own in enumerate(medians):
            others = [m for r, m in enumerate(medians) if r != rank and math.isfinite(m)]
            if not math.isfinite(own) or not others:
                continue
            base = statistics.median(others)
            if base > 0 and own > self.ratio * base and own - base >= STRAGGLER_MIN_EXCESS_S:
                self._fine_since.pop(rank, None)
                since = self._slow_since.setdefault(rank, (step, now))
                if rank not in self.stragglers and self._held(since, step, now):
                    self.stragglers.add(rank)
                    findings.append(Finding("warning", "straggler", (
                        f"rank {rank} is a straggler: {own / base:.2f}x the median of the other ranks' "
                        f"time to the gradient sync ({own * 1e3:.1f} ms vs {base * 1e3:.1f} ms per step, "
                        f"medians over the {self._covered} steps before step {step})")))
            else:
                self._slow_since.pop(rank, None)
                if rank in self.stragglers:
                    since = self._fine_since.setdefault(rank, (step, now))
                    if self._held(since, step, now):
                        self.stragglers.discard(rank)
                        del self._fine_since[rank]
                        findings.append(Finding("info", "straggler_end", (
                            f"rank {rank} is no longer a straggler ({own * 1e3:.1f} ms vs "
                            f"{base * 1e3:.1f} ms per step before step {step})")))
        return findings


def _median(values: list[float]) -> float:
    """The lower median of the finite values: with an even count, the smaller middle one, so
    that half a window of slow steps does not make a rank slow yet."""
    finite = [v for v in values if math.isfinite(v)]
    return statistics.median_low(finite) if finite else math.nan


# -- desync --------------------------------------------------------------------------------------

_BITS = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
CHECKSUM_MODULUS = 2**52  # a float64 holds every integer below 2**53 exactly


def params_checksum(params: Iterable[torch.Tensor]) -> float:
    """One number per replica: the sum of the parameters' raw bits as integers.

    Integer addition is exact and does not depend on the order, so equal parameters give equal
    checksums on any device and thread count, and a change of one bit of one value changes it.
    Each parameter is summed in place (``sum(dtype=int64)`` over an integer view, no copy); the
    total is reduced modulo 2**52 so it travels exactly in the float64 metrics exchange. One
    host synchronisation (reading the total).
    """
    total: torch.Tensor | None = None
    for p in params:
        t = p.detach()
        part = t.view(_BITS[t.element_size()]).sum(dtype=torch.int64)
        total = part if total is None else total + part
    if total is None:
        return 0.0
    return float(int(total.item()) % CHECKSUM_MODULUS)


class DesyncCheck:
    """When to compare the replicas' checksums, and what a comparison means.

    Every rank calls :meth:`due` at the same report steps and gets the same answer: the first
    report at or after each multiple of ``every`` (0: never). Rank 0 calls :meth:`compare`.
    One error per set of differing ranks: a desync does not heal, so it is not repeated at every
    check.
    """

    def __init__(self, every: int):
        self.every = every
        self._mark = 0
        self._reported: frozenset[int] = frozenset()

    def start(self, step: int) -> None:
        """The loop starts after ``step`` (0, or the checkpoint it resumed from)."""
        if self.every:
            self._mark = step // self.every

    def due(self, step: int) -> bool:
        if not self.every or step // self.every <= self._mark:
            return False
        self._mark = step // self.every
        return True

    def compare(self, step: int, checksums: list[float]) -> Finding | None:
        differ = frozenset(r for r, c in enumerate(checksums) if r and c != checksums[0])
        if not differ or differ == self._reported:
            self._reported = differ
            return None
        self._reported = differ
        ranks = ", ".join(str(r) for r in sorted(differ))
        values = ", ".join(f"rank {r} {int(c) if math.isfinite(c) else c}" for r, c in enumerate(checksums))
        return Finding("error", "desync", (
            f"parameters out of sync at step {step}: rank{'s' if len(differ) > 1 else ''} {ranks} "
            f"differ{'' if len(differ) > 1 else 's'} from rank 0 (parameter checksums: {values})"))
