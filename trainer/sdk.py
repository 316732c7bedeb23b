"""The SDK for your own torchrun script: a few lines give it per-rank metrics in the dashboard,
verified checkpoints, graceful stops and one-click resume.

    import runyard

    run = runyard.init()                       # after (or instead of) init_process_group
    run.watch(ddp_model)                       # optional: straggler and desync checks
    state = {"model": model, "optimizer": opt}
    start = run.load_checkpoint(state)         # the step to continue after (0 when fresh)
    for step in range(start + 1, max_steps + 1):
        loss = train_step(...)
        run.log(step, loss=loss.item())        # every rank, the same steps and keys
        if step % 100 == 0 or run.should_stop():
            run.save_checkpoint(step, state)
        if run.should_stop():                  # SIGTERM: cancel, pause or preemption
            break
    run.finish()

Outside runyard (a plain ``torchrun train.py``) the same calls work: metrics go to the log,
checkpoints to ``./checkpoints``, and nothing is written to a database.

The built-in workloads (trainer/workloads/) run on this same ``Run``. They also use what a
script may: ``run.checkpoint_due(step)`` (the ``[checkpoint]`` schedule: every N steps, every T
seconds by the ranks' agreed clocks), ``save_checkpoint(..., defer_snapshot=True)`` with
``run.before_update()`` before ``optimizer.step()`` (the snapshot copied while the next step
runs), plain numbers in the state (a data position, in a dict) and metrics kept with each
checkpoint (``checkpoint.best_metric`` picks the best ones to keep).
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import psutil
import torch
import torch.distributed as dist

from db.vocabulary.config import CheckpointConfig, RunConfig, SupervisionConfig, config_from_json
from trainer.checkpoint import Checkpointer
from trainer.context import RunContext, context_from_env
from trainer.process import distributed, pdeathsig
from trainer.process.lifecycle import (
    STOP_FLAG,
    StopSignal,
    register_stack_dumps,
    self_stat,
    write_finished,
    write_stopped,
)
from trainer.reporting.control import ControlChannel
from trainer.reporting.monitoring import Monitor
from trainer.reporting.reporter import MetricReporter

logger = logging.getLogger(__name__)


class Run:
    """A handle on this process's place in a runyard run. Create it with :func:`init`.

    Args:
        ctx: Where this process belongs (run, attempt, folders, resume point).
        checkpoint_config: The ``[checkpoint]`` section (async writes, schedule, retention).
        supervision: The ``[supervision]`` section (straggler and desync checks).
        config: The whole run config when known: checkpoints keep its hash, and a resume from
            another config's checkpoint (a fork) says so.
    """

    def __init__(self, ctx: RunContext, checkpoint_config: CheckpointConfig,
                 supervision: SupervisionConfig | None = None, *, config: RunConfig | None = None):
        self.ctx = ctx
        self.config = config
        self.info = distributed.current()
        self.rank = self.info.rank
        self.world_size = self.info.world_size
        self.reporter = MetricReporter(ctx, self.rank, self.world_size)
        # One control channel for the process, made here and handed to each part that needs the
        # ranks to agree: the stop signal's flag, the checkpointer's time-based flag and the
        # monitor's metrics all ride in its one small collective per step.
        self.channel = ControlChannel()
        self._stop = StopSignal(self.channel)
        self._stop.install()
        self._monitor = Monitor(supervision or SupervisionConfig(), self.rank, self.world_size, self.info.device,
                                self.reporter, self.channel)
        self._stacks = register_stack_dumps(ctx.attempt_dir, self.rank)
        self._checkpoints = Checkpointer(ctx, self.info, checkpoint_config, self.channel, self.reporter.writer,
                                         run_config=config)
        self._last_step = 0
        self._stopping = False
        self._agreed: Mapping[str, bool] = {}
        self._unread: set[str] = set()  # who has not read the newest agreement: "stop", "due"
        # The step each reader last read an agreement at: once the script reports steps (log,
        # save_checkpoint, checkpoint_due or should_stop(step)), a reader asks anew only when
        # the step moved on, so every call within a step gets the same answer.
        self._read_at: dict[str, int] = {}
        self._steps_reported = False
        self._progress_step = 0  # the step the progress mark was last moved to
        self._finished = False

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def managed(self) -> bool:
        """True when the scheduler launched this process (metrics go to the dashboard)."""
        return self.ctx.managed

    @property
    def device(self) -> torch.device:
        """Where this rank computes: its CUDA device under NCCL (or once the script used CUDA),
        else the CPU."""
        return self.info.device

    # -- metrics ------------------------------------------------------------------------------

    def watch(self, model: torch.nn.Module) -> None:
        """Optional, once, before training: check the ranks' health on ``model`` (your DDP model).

        Adds a DDP communication hook that times each rank's way to the gradient all-reduce
        (``pre_sync_s``; a rank that stays slower than the others is reported as a straggler)
        and compares a checksum of the replicas' parameters every
        ``supervision.desync_check_every`` steps. Both ride in :meth:`log`'s all-gather.
        """
        self._monitor.watch(model)

    def log(self, step: int, **metrics: float | torch.Tensor) -> None:
        """Report this rank's metrics at ``step`` (its memory is added).

        Collective: every rank calls it at the same steps with the same keys. One small
        all-gather, which nobody waits for, brings them to rank 0; it is read during the next
        step and written off the training thread. The stop flag rides along, so the next
        :meth:`should_stop` costs nothing. One-element tensors (``loss=loss.detach()``) are
        fine and cheaper than ``loss.item()``: they are copied to the host without waiting
        for the GPU, and read a step later. Metrics that only rank 0 computes go to
        :meth:`log_rank0`.
        """
        self._monitor.log(step, metrics, then=None if self.managed else self._print)
        self._step_reported(step)

    def log_rank0(self, step: int, **metrics: float | torch.Tensor) -> None:
        """Report metrics that rank 0 alone computes at ``step`` (an evaluation under
        ``if rank == 0:``, as nanoGPT does): written for rank 0, nothing (no NaN) for the others.

        Not collective: call it on rank 0 only (elsewhere it does nothing). It is not a step
        report for :meth:`should_stop`, whose steps must stay the same on every rank. Tensors
        are read at once (``.item()``).
        """
        if self.rank != 0:
            return
        values = {key: float(value.item()) if isinstance(value, torch.Tensor) else float(value)
                  for key, value in metrics.items()}
        if self.managed:
            self.reporter.log_main(step, **values)
        else:
            logger.info("step %d (rank 0): %s", step,
                        "  ".join(f"{k} {v:.4g}" for k, v in sorted(values.items())))

    def _print(self, step: int, gathered: dict[int, dict[str, float]]) -> None:
        """Outside runyard, rank 0 prints what it gathered (rank 0's value / rank 1's ...)."""
        logger.info("step %d: %s", step, "  ".join(
            f"{k} " + "/".join(f"{per[k]:.4g}" for per in gathered.values()) for k in sorted(gathered[0])))

    # -- checkpoints --------------------------------------------------------------------------

    def save_checkpoint(self, step: int, state: dict[str, Any],
                        metrics: Mapping[str, float | torch.Tensor] | None = None, *,
                        defer_snapshot: bool = False) -> None:
        """Save ``state`` (modules and optimizers are saved as their state dicts) at ``step``.

        Collective (every rank's RNG state is gathered). The training thread only waits for a
        copy to CPU memory; rank 0 writes in the background, atomically, with a manifest.
        ``state["model"]`` must be the model: its parameters' digest identifies the checkpoint.
        ``metrics`` (numbers, or one-element tensors) are kept with it; ``checkpoint.best_metric``
        among them decides which checkpoints retention keeps as the best.

        With ``defer_snapshot=True`` even the copy happens in the background, while your next
        step's forward and backward run: nothing in ``state`` may change until
        :meth:`before_update`, which you call before ``optimizer.step()``.
        """
        self._checkpoints.save(step, state, metrics, defer_snapshot=defer_snapshot)
        self._step_reported(step)

    def adopt_checkpoint(self, path: str | os.PathLike[str], step: int) -> None:
        """Make a checkpoint file the script saved itself (``torch.save(ckpt, "out/ckpt.pt")``) the
        run's checkpoint at ``step``, instead of saving the same state twice.

        Call it on the rank that wrote the file (rank 0 usually; elsewhere it does nothing), after
        the file is completely written. Not collective. Rank 0 hashes the file on the calling
        thread (about a second a GB, from the page cache) and records it like
        ``[workload] checkpoint_glob`` would (``source = "script"``): listed with size, time and
        sha256, pinnable (the file is then copied out of the script's reach), and a file rewritten
        in place is a new version. On a retry or a resume from it, :attr:`resume_path` names the
        file to load (``RUNYARD_RESUME_PATH``) and :attr:`resume_step` its step; the script loads
        it itself (:meth:`load_checkpoint` is for checkpoints saved with :meth:`save_checkpoint`).

        Raises:
            CheckpointError: the file changed while it was hashed (still being written).
        """
        self._checkpoints.adopt(Path(path).resolve(), step)
        self._step_reported(step)

    @property
    def resume_path(self) -> Path | None:
        """The script's own checkpoint file this attempt starts from (a retry, a resume or a fork
        of a run whose checkpoints are files the script wrote: :meth:`adopt_checkpoint` or
        ``[workload] checkpoint_glob``), or None. Load it as the script always does."""
        return self.ctx.resume_path

    @property
    def resume_step(self) -> int | None:
        """The step runyard recorded for :attr:`resume_path` (None when starting fresh)."""
        return self.ctx.resume_step if self.ctx.resume_path is not None else None

    def load_checkpoint(self, state: dict[str, Any] | None = None) -> int:
        """Restore the checkpoint the scheduler chose for this attempt, if any.

        Objects in ``state`` that have ``load_state_dict`` (model, optimizer, scheduler) are
        loaded in place; other keys are updated with the saved values. A damaged checkpoint is
        refused and the one before it is loaded; every rank's RNG states are restored.

        Returns:
            The step of the checkpoint (continue with the step after it), or 0 when there is
            nothing to resume.
        """
        self.reporter.marks({"data": time.time()})  # what came before: data and model (db/vocabulary/phases.py)
        step = self._checkpoints.resume(state or {})
        self.reporter.marks({"checkpoint": time.time()})
        self._last_step = max(self._last_step, step)
        self._monitor.begin(step)  # what came before (building, loading) was not a step
        return step

    def checkpoint_due(self, step: int, *, last: bool = False) -> bool:
        """Whether to save a checkpoint of ``step``, by the ``[checkpoint]`` schedule: at the
        ``last`` step, every ``checkpoint.every_steps``, when ``checkpoint.every_seconds`` have
        passed since the last save (by the ranks' agreed clocks), and on a stop.

        Collective, once per step after the step's work, like :meth:`should_stop`: the two
        share one agreement of the ranks per step, whichever is called first makes it.
        """
        self._step_reported(step)
        if self._stopping:
            return True
        agreed = self._agreement("due")
        return self._stopping or self._checkpoints.due(step, agreed, last)

    def prepare_checkpoint(self, state: dict[str, Any]) -> None:
        """Optional, on a GPU: once ``state``'s tensors exist (after the first optimizer step),
        pin in the background the CPU memory that checkpoints are copied into, so that the
        first save does not wait for it (about a second for a 1.5 GB state)."""
        self._checkpoints.prepare(state)

    def before_update(self) -> None:
        """After :meth:`save_checkpoint` with ``defer_snapshot=True``: call it before
        ``optimizer.step()`` (or anything else that edits the saved tensors). It waits, if
        needed, until the snapshot is copied; cheap otherwise."""
        self._checkpoints.before_update()

    def wait_for_checkpoint(self) -> None:
        """Block until the checkpoint being written in the background (if any) is durable: before
        the script reads the checkpoint folder itself, say. Not collective.

        Raises:
            CheckpointError: that write failed.
        """
        self._checkpoints.wait()

    # -- stopping -----------------------------------------------------------------------------

    def should_stop(self, step: int | None = None) -> bool:
        """True on every rank once any rank got SIGTERM (cancel, pause, preemption): save a
        checkpoint and leave the loop.

        Collective: every rank calls it at the same points (it sends one small all-reduce that
        nobody waits for, or reads the flag that rode in :meth:`log`). The answer is what the
        ranks had one step ago, the same on every rank; once true it stays true. Within a step
        every call gives the same answer, so ``if step % 100 == 0 or run.should_stop(): save``
        then ``if run.should_stop(): break`` saves the step it stops at. The step is the one
        last reported to the run (:meth:`log`, :meth:`save_checkpoint`, :meth:`checkpoint_due`)
        or ``step`` when given: a script that logs only every N steps passes it, or it asks
        anew only at the steps it reports. A script that reports no step at all gets a new
        agreement at every call.
        """
        if step is not None:
            self._step_reported(step)
        if not self._stopping:
            self._agreement("stop")
        return self._stopping

    def _step_reported(self, step: int) -> None:
        """The script says ``step`` is done: the scheduler's progress mark (heartbeat, ETA) moves
        to it, once a step whichever call says it first (a step number that goes back, as an
        epoch-local one does, moves it too)."""
        if step != self._progress_step:
            self._progress_step = step
            self.reporter.progress(step)
        self._last_step = max(self._last_step, step)
        self._steps_reported = True

    def _agreement(self, reader: str) -> Mapping[str, bool]:
        """The ranks' newest agreement on the channel's flags, for ``reader`` ("stop" or "due"):
        the one the other reader made and this one has not read yet; else, once the script
        reports steps, the one this reader read while the step has not moved on since; else a
        new one (collective). So a loop that asks both once per step makes one collective per
        step, and asking again within a step gives the same answer."""
        fresh = reader not in self._unread
        if fresh and self._steps_reported and reader in self._read_at:
            fresh = self._last_step > self._read_at[reader]
        self._read_at[reader] = self._last_step
        if fresh:
            self._agreed = self.channel.agree()
            self._stopping = self._stopping or self._agreed[STOP_FLAG]
            self._unread = {"stop", "due"}
        self._unread.discard(reader)
        return self._agreed

    def finish(self) -> None:
        """Wait for the last checkpoint to be durable and flush the metrics. Call it once at the end."""
        if self._finished:
            return
        self._finished = True
        try:
            self._monitor.close()  # the last log's exchange: its metrics get written
            self.reporter.finishing()
            self._checkpoints.close()  # the last checkpoint is durable (or this raises)
            if self.is_main and (self._stopping or self._stop.received_at is not None):
                write_stopped(self.ctx.attempt_dir, self._last_step, self._checkpoints.last_saved,
                              self._stop.received_at)
        finally:
            self.reporter.close()
            self._stacks.close()
        # Only now, with everything durable: the scheduler reads this note as "the work is done".
        if self.managed:
            write_finished(self.ctx.attempt_dir, self.rank, self._last_step)

    def close(self) -> None:
        """After a failure, instead of :meth:`finish`: wait for a checkpoint being written and
        flush the metrics, without the collectives (a failed rank may have left them) and
        without the notes that say the work is done."""
        if self._finished:
            return
        self._finished = True
        try:
            self.reporter.finishing()
            self._checkpoints.close()
        finally:
            self.reporter.close()
            self._stacks.close()


def process_started() -> float:
    """When this process was created (wall-clock seconds): the end of the launch phase.

    The kernel's start time (clock ticks since boot, ``/proc/self/stat``) against
    ``CLOCK_BOOTTIME`` now, to a tick (10 ms). psutil's ``create_time`` adds the ticks to the boot
    time ``/proc/stat`` gives in whole seconds: up to a second early (0.89 s on one boot), which
    moved that much of every start-up from the ``launch`` phase to ``import``. psutil's where
    ``/proc`` does not say.
    """
    try:
        (ticks,) = self_stat(22)  # starttime
        since = time.clock_gettime(time.CLOCK_BOOTTIME) - ticks / os.sysconf("SC_CLK_TCK")
    except (OSError, ValueError, IndexError, AttributeError):
        return float(psutil.Process().create_time())
    return time.time() - since


def init(backend: str = "auto", *, config: RunConfig | None = None, marks: Mapping[str, float] | None = None) -> Run:
    """Join runyard's run (or run locally) and return the handle.

    Initialises the default process group from torchrun's environment when the script has not
    done so (``backend``: auto picks nccl with CUDA, else gloo).

    Args:
        backend: The process group's backend, when this call makes the group.
        config: The run's config (``python -m trainer`` passes the attempt's); by default it is
            read from the run's folder when runyard launched this process.
        marks: When start-up phases ended before this call (``python -m trainer`` passes
            ``imported`` and ``joined``; db/vocabulary/phases.py), wall-clock seconds.
    """
    # Under runyard the rank dies with torchrun's agent. trainer/process/script_runner.py already armed
    # it for a script the scheduler launched; arming twice is harmless.
    pdeathsig.arm_under_agent()
    ctx = context_from_env()
    if not os.environ.get("RUNYARD_RUN_DIR"):
        ctx = RunContext(run_id=None, attempt=1, db_url=None, run_dir=Path.cwd(),
                         attempt_dir=Path.cwd() / "runyard-logs")
    startup = {"spawned": process_started(), **(marks or {})}
    if "WORLD_SIZE" in os.environ and int(os.environ["WORLD_SIZE"]) > 1 and not dist.is_initialized():
        distributed.setup(backend)
        startup["joined"] = time.time()
    config_file = ctx.config_file
    if config is None and ctx.managed and config_file.exists():
        config = config_from_json(config_file.read_text())
    checkpoint_config = config.checkpoint if config is not None else CheckpointConfig()
    supervision = config.supervision if config is not None else SupervisionConfig()
    run = Run(ctx, checkpoint_config, supervision, config=config)
    run.reporter.marks(startup)
    logger.info("runyard %s: rank %d/%d, run %s attempt %d, started %s", "managed" if ctx.managed else "local",
                run.rank, run.world_size, ctx.run_id, ctx.attempt, time.strftime("%H:%M:%S"))
    return run
