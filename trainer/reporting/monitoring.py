"""Per-rank training metrics and the ranks' health checks, in the one control collective per step.

A training loop (built-in workload or SDK) reports through :class:`Monitor`. At every log step
each rank contributes its metrics, its memory, its times to the gradient sync and, every
``supervision.desync_check_every`` steps, a checksum of its parameters to an all-gather on the
process's :class:`~trainer.reporting.control.ControlChannel`, which also carries the stop flag. It is
launched asynchronously and read during the next step, so nobody waits for it; then rank 0 hands
the rows to its database writer and runs the straggler and desync checks (trainer/reporting/health.py),
writing what it finds as Event rows. Values still on the device (the loss) are copied to the
host without waiting and exchanged a step later, so a metric every step costs no device
synchronisation; between log steps nothing here costs a collective.
"""

from __future__ import annotations

import contextlib
import logging
import math
import statistics
import time
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import psutil
import torch
from torch import nn

from db.vocabulary.checks import CHECKS_EVENT, checks_message
from trainer.reporting.health import (
    DesyncCheck,
    Finding,
    PreSyncClock,
    StragglerCheck,
    params_checksum,
    timed_allreduce,
)

if TYPE_CHECKING:
    from sqlalchemy import Connection

    from db.vocabulary.config import SupervisionConfig
    from trainer.reporting.control import ControlChannel
    from trainer.reporting.reporter import MetricReporter

logger = logging.getLogger(__name__)

MIB = float(2**20)
EVENT_RECORD = "health_event"  # the database writer's record kind for findings


def memory_metrics(device: torch.device, process: psutil.Process) -> dict[str, float]:
    """This rank's memory in MiB: CUDA's allocator counters on a GPU (host-side, no sync), else the
    process's resident set size."""
    if device.type == "cuda":
        return {
            "mem_allocated_mib": torch.cuda.memory_allocated(device) / MIB,
            "mem_reserved_mib": torch.cuda.memory_reserved(device) / MIB,
            "mem_peak_mib": torch.cuda.max_memory_allocated(device) / MIB,
        }
    return {"mem_rss_mib": process.memory_info().rss / MIB}


@dataclass
class Interval:
    """Sums over the steps since the last report. Loss and gradient norm stay tensors on the
    device, in the report too: :meth:`Monitor.log` fetches them without waiting."""

    steps: int = 0
    started: float = field(default_factory=time.perf_counter)
    data_wait: float = 0.0
    excluded: float = 0.0
    loss: torch.Tensor | float = 0.0
    grad_norm: torch.Tensor | float = 0.0
    reported_at: float | None = None

    def next(self) -> Interval:
        """The interval after this reported one. It starts when this one was measured, so what
        the loop does between (reporting it, a checkpoint) counts in the next one's step time:
        the step times add up to the wall time."""
        return Interval(started=self.reported_at if self.reported_at is not None else time.perf_counter())

    def _mean(self, total: torch.Tensor | float) -> torch.Tensor:
        """A per-step mean (no tensor operation when the interval is one step, as at
        ``log_every = 1``)."""
        total = torch.as_tensor(total)
        return total if self.steps == 1 else total / self.steps

    def report(self, lr: float, samples_per_step: int, flops_per_sample: float, peak_flops: float | None,
               scaler: torch.amp.GradScaler | None = None, tokens_per_sample: int | None = None
               ) -> dict[str, float | torch.Tensor]:
        """One rank's training metrics for the interval (see the metric table in docs/HOW_IT_WORKS.md); ``loss``
        and ``grad_norm`` are 0-d tensors where the training computed them.

        ``step_time`` is the wall time per step since the last report, less ``excluded`` time
        (evaluation); ``data_wait_s`` the part spent waiting for the next batch and
        ``compute_s`` the rest (forward, backward, gradient sync, optimizer, reporting).
        """
        self.reported_at = time.perf_counter()
        step_time = (self.reported_at - self.started - self.excluded) / self.steps
        data_wait = self.data_wait / self.steps
        samples_per_s = samples_per_step / step_time
        metrics: dict[str, float | torch.Tensor] = {
            "loss": self._mean(self.loss), "lr": lr, "grad_norm": self._mean(self.grad_norm),
            "step_time": step_time, "data_wait_s": data_wait, "compute_s": step_time - data_wait,
            "samples_per_s": samples_per_s,
        }
        if tokens_per_sample:
            metrics["tokens_per_s"] = samples_per_s * tokens_per_sample
        if peak_flops:
            metrics["mfu"] = flops_per_sample * samples_per_s / peak_flops
        if scaler is not None:
            metrics["loss_scale"] = scaler.get_scale()
        return metrics


@dataclass
class _PendingLog:
    """One :meth:`Monitor.log` call: its host values now, its device values on their way."""

    step: int
    steps: int  # steps since the previous log
    at: float  # wall time of the log call, the rows' time
    values: dict[str, float]
    then: Callable[[int, dict[int, dict[str, float]]], None] | None
    checksum: float | None  # the parameters' checksum, when the desync check is due
    fresh: bool = True  # the control channel has not agreed since
    _keys: list[str] = field(default_factory=list)
    _fetched: torch.Tensor | None = None
    _copied: torch.cuda.Event | None = None

    def fetch(self, tensors: dict[str, torch.Tensor]) -> None:
        """Start copying ``tensors`` (0-d, on one device or several) to the host."""
        self._keys = list(tensors)
        by_device: dict[torch.device, list[torch.Tensor]] = {}
        for t in tensors.values():
            by_device.setdefault(t.device, []).append(t)
        if len(by_device) > 1:  # mixed devices (a script's own tensors): read them now
            self.values.update((k, float(t.item())) for k, t in tensors.items())
            self._keys = []
            return
        stacked = torch.stack([t.to(torch.float64) for t in tensors.values()])
        if stacked.is_cuda:  # into pinned memory, so the copy does not block; the event says when
            self._fetched = torch.empty(stacked.shape, dtype=stacked.dtype, pin_memory=True)
            self._fetched.copy_(stacked, non_blocking=True)
            self._copied = torch.cuda.Event()
            self._copied.record()
        else:
            self._fetched = stacked

    def resolve(self) -> None:
        """Wait for the copy (normally over long ago) and add the values."""
        if self._fetched is None:
            return
        if self._copied is not None:
            self._copied.synchronize()
        self.values.update(zip(self._keys, self._fetched.tolist(), strict=True))
        self._fetched = self._copied = None


class Monitor:
    """Reports a training loop's metrics and checks the ranks' health.

    Args:
        supervision: The ``[supervision]`` section (straggler and desync settings).
        rank: This process's global rank.
        world_size: Number of ranks.
        device: Where this rank computes (memory metrics).
        reporter: The metric reporter; its writer (rank 0) records the findings.
        channel: The process's control channel: it carries the exchange, and the monitor adds
            its hooks to it (the straggler clock pauses while the channel waits; a log whose
            values were on the device is launched at the channel's next agreement).
    """

    def __init__(self, supervision: SupervisionConfig, rank: int, world_size: int, device: torch.device,
                 reporter: MetricReporter, channel: ControlChannel):
        self.rank = rank
        self.world_size = world_size
        self.device = device
        self.reporter = reporter
        self.straggler_ratio = supervision.straggler_ratio if world_size > 1 else 0.0
        sv = supervision
        self._straggler = None if rank != 0 or not self.straggler_ratio else StragglerCheck(
            world_size, sv.straggler_ratio, sv.straggler_window_steps, sv.straggler_sustain_s)
        self._desync = DesyncCheck(supervision.desync_check_every if world_size > 1 else 0)
        self._process = psutil.Process()
        self._params: list[torch.Tensor] = []
        self.clock: PreSyncClock | None = None
        self._last_step = 0
        self.channel = channel
        channel.add_wait_guard(self.outside_step)
        channel.add_before_agree(self._agreeing)
        self._pending: _PendingLog | None = None  # a log whose device values are on their way
        # Why the straggler and desync checks do not run, until watch() says otherwise; rank 0
        # records which checks run at its first log (a "checks" event), so that the Run page
        # says "not checked" instead of "none found" where they did not.
        self._unchecked: dict[str, str] = (
            {"stragglers": "one rank, nothing to compare", "desyncs": "one rank, nothing to compare"}
            if world_size == 1 else
            {"stragglers": "the script did not call run.watch(model)",
             "desyncs": "the script did not call run.watch(model)"})
        if not self.straggler_ratio and world_size > 1:
            self._unchecked["stragglers"] = "supervision.straggler_ratio is 0"
        if not supervision.desync_check_every and world_size > 1:
            self._unchecked["desyncs"] = "supervision.desync_check_every is 0"
        self._checks_recorded = rank != 0
        writer = reporter.writer
        if writer is not None and reporter.ctx.run_id is not None:
            writer.register(EVENT_RECORD, self._write_findings)

    @property
    def checks(self) -> str:
        """Which of the straggler and desync checks run (db/vocabulary/checks.py's message), as rank 0
        records it at the first log."""
        return checks_message(self._unchecked)

    def watch(self, runner: nn.Module) -> None:
        """Measure ``runner`` (what runs forward: DDP, FSDP or plain), before its first step.

        A DDP model gets a communication hook that times each step's way to the gradient sync
        (straggler check), and its parameters are checksummed (desync check). Under FSDP every
        rank holds a different shard and forward and backward interleave with all-gathers and
        reduce-scatters, so there is nothing to compare and no span free of collective waits:
        both checks are off, and the log says so.
        """
        if self.world_size == 1:
            return
        module = runner.module if isinstance(runner, nn.parallel.DistributedDataParallel) else runner
        params = list(module.parameters())
        if any(_is_sharded(p) for p in params):
            if self.rank == 0:
                logger.info("straggler and desync checks are off: the parameters are sharded (FSDP)")
            self._unchecked = {k: "the parameters are sharded (FSDP)" for k in ("stragglers", "desyncs")}
            return
        self._params = params
        if self._desync.every:
            self._unchecked.pop("desyncs", None)
        if not isinstance(runner, nn.parallel.DistributedDataParallel):
            if self.straggler_ratio:
                self._unchecked["stragglers"] = "the model is not wrapped in DistributedDataParallel"
        elif self.straggler_ratio:
            clock = PreSyncClock(self.device)
            try:
                runner.register_comm_hook((clock, runner.process_group), timed_allreduce)
            except RuntimeError as exc:  # the script registered its own hook
                logger.warning("straggler check off: %s", exc)
                self._unchecked["stragglers"] = "the script registered its own DDP communication hook"
                return
            self.clock = clock
            self._unchecked.pop("stragglers", None)

    def begin(self, step: int) -> None:
        """The loop starts after ``step`` (0, or the resumed checkpoint's)."""
        self._last_step = step
        self._desync.start(step)
        if self.clock is not None:
            self.clock.restart()

    @contextlib.contextmanager
    def outside_step(self) -> Iterator[None]:
        """Around a collective of runyard's own: its wait is not this rank's work."""
        if self.clock is None:
            yield
            return
        self.clock.pause()
        try:
            yield
        finally:
            self.clock.resume()

    def log(self, step: int, metrics: Mapping[str, float | torch.Tensor],
            then: Callable[[int, dict[int, dict[str, float]]], None] | None = None) -> None:
        """Collective: every rank calls it at the same steps with the same keys.

        Adds memory (and ``pre_sync_s``, the median time to the gradient sync of the interval's
        steps, when measured) to ``metrics`` and launches the exchange. When it has been read
        (during the next step, or at :meth:`close`), rank 0 queues every rank's values for the
        database, stamped with this moment's wall time, runs the checks and calls
        ``then(step, per_rank)``.

        Values may be one-element tensors (a loss still on the GPU): they are not waited for
        here. Their copy to the host starts now and is read at the control channel's next
        agreement after this step's (the end of the next step, when the device has long
        finished this one), or at the next :meth:`log` or :meth:`close`, whichever comes first;
        the exchange is launched then. So a metric every step costs no device synchronisation.
        """
        self._launch_pending()  # at most one log waits for its values
        if not self._checks_recorded:
            self._checks_recorded = True
            self._record(Finding("info", CHECKS_EVENT, self.checks))
        values: dict[str, float] = {}
        tensors: dict[str, torch.Tensor] = {}
        for key, value in metrics.items():
            if isinstance(value, torch.Tensor):
                if value.numel() != 1:
                    raise ValueError(f"metric {key!r}: a tensor of {value.numel()} elements; log a number")
                tensors[key] = value.detach().reshape(())
            else:
                values[key] = value
        values.update(memory_metrics(self.device, self._process))
        if self.clock is not None:
            times = self.clock.take()
            values["pre_sync_s"] = statistics.median(times) if times else math.nan
        checking = bool(self._params) and self._desync.due(step)
        pending = _PendingLog(
            step=step, steps=step - self._last_step, at=time.time(), values=values, then=then,
            checksum=params_checksum(self._params) if checking else None,
        )
        self._last_step = step
        if tensors:
            pending.fetch(tensors)
            self._pending = pending
        else:
            self._launch(pending)

    def _agreeing(self) -> None:
        """The control channel is about to agree (once per step, on every rank): a log waiting
        for its values since an earlier step is launched now."""
        pending = self._pending
        if pending is not None:
            if pending.fresh:  # the agreement of the log's own step: the device is still on it
                pending.fresh = False
            else:
                self._launch_pending()

    def _launch_pending(self) -> None:
        pending, self._pending = self._pending, None
        if pending is not None:
            with self.outside_step():
                pending.resolve()
            self._launch(pending)

    def _launch(self, log: _PendingLog) -> None:
        keys = sorted(log.values)
        row = [log.values[k] for k in keys] + [math.nan if log.checksum is None else log.checksum]

        def received(table: list[list[float]]) -> None:
            if self.rank == 0:
                # Each row ends with the checksum, which zip leaves out.
                per_rank = {r: dict(zip(keys, got, strict=False)) for r, got in enumerate(table)}
                checksums = [got[-1] for got in table] if log.checksum is not None else None
                self._check(log.step, log.steps, per_rank, checksums, log.at)
                self.reporter.write(log.step, per_rank, log.at)
                if log.then is not None:
                    log.then(log.step, per_rank)

        self.channel.gather(row, received)

    def _check(self, step: int, steps: int, per_rank: dict[int, dict[str, float]],
               checksums: list[float] | None, at: float) -> None:
        """Rank 0: the straggler and desync checks on what the ranks reported."""
        findings: list[Finding] = []
        if self._straggler is not None and "pre_sync_s" in per_rank[0]:
            findings += self._straggler.update(step, steps, [per_rank[r]["pre_sync_s"] for r in sorted(per_rank)], at)
        if checksums is not None:
            found = self._desync.compare(step, checksums)
            findings += [found] if found is not None else []
        for finding in findings:
            self._record(finding)

    def close(self) -> None:
        """After the loop's last step: launch a log still waiting for its values, and read the
        last exchange (its metrics get written). After a failure, skip it: a rank that failed
        may never have joined that exchange."""
        self._launch_pending()
        self.channel.close()

    # -- findings (rank 0) --------------------------------------------------------------------

    def _record(self, finding: Finding) -> None:
        level = {"error": logging.ERROR, "warning": logging.WARNING}.get(finding.level, logging.INFO)
        logger.log(level, "%s: %s", finding.kind, finding.message)
        writer = self.reporter.writer
        if writer is not None and self.reporter.ctx.run_id is not None:
            writer.put(EVENT_RECORD, {"at": time.time(), "level": finding.level, "kind": finding.kind,
                                      "message": finding.message})

    def _write_findings(self, conn: Connection, records: list[dict[str, Any]]) -> None:
        """Database writer thread: the findings as Event rows of this attempt."""
        from sqlalchemy import insert  # noqa: PLC0415 - on the writer thread: the other ranks never load SQLAlchemy

        from db.models import Event  # noqa: PLC0415 - on the writer thread: the other ranks never load SQLAlchemy

        ctx = self.reporter.ctx
        conn.execute(insert(Event), [{"run_id": ctx.run_id, "attempt": ctx.attempt, **r} for r in records])


def _is_sharded(p: torch.Tensor) -> bool:
    try:
        from torch.distributed.tensor import DTensor  # noqa: PLC0415 - optional in torch, and 1-2 s to import
    except ImportError:  # pragma: no cover - torch without DTensor has no FSDP2 either
        return False
    return isinstance(p, DTensor)
