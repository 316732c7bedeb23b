"""Starting and stopping an attempt, as the reconcile loop (orchestrator/scheduler/loop.py) decides.

Starting is three steps, each its own function: :func:`prepare` wins the run (a conditional
UPDATE to STARTING: of several schedulers, only the one whose UPDATE moved the run goes on), ends
the earlier attempt's leftovers, places the starting point and writes the attempt's row, committed
before anything is launched (a scheduler that dies right after the launch finds the row and
re-adopts the processes instead of launching the run twice); :func:`environment` builds what the
ranks are told; :func:`launch` writes the attempt's config and hands the request to the executor.
The attempt's config (the run's, plus its overrides) is derived once, in :func:`prepare`.

Stopping (:func:`stop`) is a cancel or a pause: SIGTERM, or a script's ``workload.stop_signal``
(the ranks finish the step and checkpoint), then SIGKILL after the grace period.
"""

from __future__ import annotations

import json
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db.models import Attempt, Checkpoint, Event, Run
from db.states import AttemptStatus, RunStatus, SignalSent, StopReason, attempt_transition, hold, transition
from db.vocabulary.causes import Cause
from db.vocabulary.config import RunConfig, config_from_json, write_config_file
from db.vocabulary.inventory import Inventory
from db.vocabulary.layout import RunPaths
from orchestrator.executors.base import Executor, ExecutorError, LaunchRequest, executor_for
from orchestrator.executors.launcher import free_port, rank_env
from orchestrator.executors.local import stop_signal
from orchestrator.scheduler.admission import current_attempt
from orchestrator.scheduler.failures import Failure
from orchestrator.scheduler.outcomes import next_overrides, record_end, retry_or_fail, with_overrides
from orchestrator.scheduler.storage import deleted_message, disk_detail, run_dir_deleted, storage_fault
from orchestrator.scripts import checkpoint_custody
from trainer.context import RunContext
from trainer.process.store_secret import SECRET_VAR, new_secret

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Prepared:
    """An attempt whose row is committed, ready to launch."""

    run: Run
    attempt: Attempt
    config: RunConfig  # the attempt's: the run's, plus its overrides
    executor: Executor
    devices: list[int]
    resuming: bool  # a script's own checkpoint is handed over: its resume_args follow its args


def prepare(session: Session, run: Run, devices: list[int], executors: dict[str, Executor], inventory: Inventory,
            scheduler_id: int | None) -> Prepared | None:
    """Win ``run`` and write its next attempt's row (owned by ``scheduler_id``), committed; None
    when another scheduler won it, an earlier attempt's process outlived SIGKILL (the run waits:
    the event says so), the run failed for want of its executor, or the transition was refused."""
    expect = RunStatus(run.status)  # read again if an earlier run's lost race rolled back (expired) it
    if expect not in (RunStatus.QUEUED, RunStatus.RETRYING) or not hold(session, run.id, expect):
        return None  # another scheduler launched it meanwhile: its processes must not be swept below
    previous = current_attempt(session, run)
    number = (previous.number if previous else 0) + 1
    if previous is not None and not executor_for(executors, previous.executor).sweep(session, run, previous.number,
                                                                                      None):
        return None
    try:
        executor = executor_for(executors, run.executor)
    except ExecutorError as exc:
        transition(session, run.id, RunStatus.FAILED, str(exc), expect=expect)
        return None
    run_config = config_from_json(run.config_json)
    overrides = next_overrides(run_config, previous)
    config = with_overrides(run_config, overrides)
    # The starting point first: placing a script's checkpoint copies files (gigabytes), and the
    # write lock must not be held meanwhile, so what was written so far is committed and the
    # run's rows are written after. A crash or a refused transition after a copy leaves at most
    # an orphan copy or a file moved aside (checkpoint_custody's docstring).
    session.commit()
    resume_dir, resume_step = resume_point(session, run, number)
    script_resume = checkpoint_custody.resume_point(session, run, number) if resume_dir is None else None
    if not transition(session, run.id, RunStatus.STARTING, f"launching attempt {number}", expect=expect):
        session.rollback()
        return None
    local = executor.name == "local"
    attempt = Attempt(
        run_id=run.id, number=number, status=AttemptStatus.RUNNING.value,
        dir=str(RunPaths(Path(run.run_dir)).attempt(number).root), port=free_port() if local else None,
        devices_json=json.dumps(devices), device_kind=inventory.device_label if local else "slurm",
        executor=executor.name, started_at=time.time(), resume_dir=resume_dir,
        resume_step=script_resume.step if script_resume is not None else resume_step,
        resume_path=script_resume.path if script_resume is not None else None,
        overrides_json=json.dumps(overrides), scheduler_id=scheduler_id,
    )
    run.retry_at = None
    run.resume_checkpoint_id = None  # the request is consumed by this attempt
    run.start_fresh = False
    session.add(attempt)
    # Commit before launching: a scheduler that dies right after the launch finds the row
    # and re-adopts the processes instead of launching the run a second time.
    session.commit()
    resuming = script_resume.with_args if script_resume is not None else False
    return Prepared(run, attempt, config, executor, devices, resuming)


def resume_point(session: Session, run: Run, number: int) -> tuple[str | None, int | None]:
    """Where attempt ``number`` starts when runyard's own checkpoint applies: its folder and step
    (checkpoint_custody.starting_checkpoint chooses); (None, None) from scratch or when a script's
    own file applies (checkpoint_custody.resume_point places it). The trainer verifies it and falls
    back to an older checkpoint in the same folder if it is refused."""
    chosen = checkpoint_custody.starting_checkpoint(session, run, number)
    if chosen is None or chosen.source == checkpoint_custody.SCRIPT:
        return None, None
    return str(Path(chosen.path).parent), chosen.step


def environment(prepared: Prepared, db_url: str, inventory: Inventory) -> dict[str, str]:
    """What the attempt's processes are told beyond the scheduler's own environment: the run
    context (trainer/context.py), the stores' secret, the devices, and the workload's variables."""
    run, attempt = prepared.run, prepared.attempt
    env = RunContext(
        run_id=run.id, attempt=attempt.number, db_url=db_url, run_dir=Path(run.run_dir),
        attempt_dir=Path(attempt.dir), resume_dir=Path(attempt.resume_dir) if attempt.resume_dir is not None else None,
        resume_step=attempt.resume_step,
        resume_path=Path(attempt.resume_path) if attempt.resume_path is not None else None,
    ).to_env()
    # A fresh secret per attempt, under which every key of its stores lies: another local
    # account can reach the stores' loopback ports, but cannot name a key (trainer/process/store_secret.py).
    # It travels in the environment only (owner-readable), never on a command line.
    env[SECRET_VAR] = new_secret()
    if inventory.kind == "gpu" and prepared.executor.name == "local":  # Slurm gives its jobs their GPUs
        env["CUDA_VISIBLE_DEVICES"] = ",".join(str(d) for d in prepared.devices)
        # The devices are NVML's indices (orchestrator/scheduler/resources.py), which follow the
        # PCI bus; CUDA's own default order puts the fastest first, another order on mixed GPUs.
        env["CUDA_DEVICE_ORDER"] = "PCI_BUS_ID"
    return {**rank_env(prepared.config, os.environ), **env}


def launch(session: Session, prepared: Prepared, env: dict[str, str]) -> None:
    """Write the attempt's config (its ranks read it: trainer/context.py) and hand the attempt to
    its executor; a launch that fails is the attempt's failure (on the storage: the retry
    policy's; otherwise the run fails with it). Commits."""
    run, attempt, number = prepared.run, prepared.attempt, prepared.attempt.number
    longest_save = session.scalar(select(func.max(Checkpoint.total_s)).where(Checkpoint.run_id == run.id))
    # A script's ranks move into workload.workdir themselves (trainer/process/script_runner.py): a
    # user's trainer.py there must not shadow runyard's packages in the shim and torchrun.
    request = LaunchRequest(run_id=run.id, number=number, config=prepared.config, attempt_dir=Path(attempt.dir),
                            cwd=Path(run.run_dir), env=env, port=attempt.port or 0, resuming=prepared.resuming,
                            devices=prepared.devices,
                            checkpoint_s=float(longest_save) if longest_save is not None else None)
    try:
        write_config_file(RunPaths(Path(run.run_dir)).attempt(number).config, prepared.config)
        what = prepared.executor.submit(request, attempt)
    except (OSError, ExecutorError) as exc:
        _launch_failed(session, prepared, exc)
        session.commit()
        return
    session.add(Event(run_id=run.id, attempt=number, at=time.time(), kind="launch",
                      message=f"attempt {number} launched: {what}"))
    session.commit()
    logger.info("run %d: attempt %d launched (%s)", run.id, number, what)


def _launch_failed(session: Session, prepared: Prepared, exc: OSError | ExecutorError) -> None:
    run, attempt = prepared.run, prepared.attempt
    if isinstance(exc, OSError) and launch_failed_on_storage(session, run, attempt, exc, time.time(),
                                                             prepared.config):
        # The storage, not runyard: one line, no traceback; the retry policy has the run.
        logger.warning("run %d: attempt %d: %s", run.id, attempt.number, attempt.reason)
        return
    logger.exception("run %d: launch failed", run.id)
    why = f"launch failed: {exc}"
    attempt.cause, attempt.exception = Cause.LAUNCH_FAILED.value, why
    attempt_transition(attempt, AttemptStatus.FAILED, why)
    transition(session, run.id, RunStatus.FAILED, why)


def launch_failed_on_storage(session: Session, run: Run, attempt: Attempt, exc: OSError, now: float,
                             config: RunConfig) -> bool:
    """A launch that failed because the storage refused a write (a read-only or full run folder)
    is a ``DISK`` failure of the attempt, handed to the retry policy like any other (the retry
    waits until the folder is writable: orchestrator/scheduler/admission.py); a deleted run folder ends the
    run. ``config``: the attempt's. Returns False when ``exc`` is not a storage fault (the caller
    fails the launch)."""
    run_dir = Path(run.run_dir)
    fault = storage_fault(exc, attempt.dir)
    if fault is None and not run_dir_deleted(run_dir):
        return False
    record_end(session, attempt, None, now)
    if fault is None:
        failure = Failure(Cause.RUN_DIR_DELETED, None, deleted_message(run_dir), "")
    else:
        text = f"launch failed: [Errno {fault.errno}] {fault.strerror}: '{fault.path}'"
        failure = Failure(Cause.DISK, None, text, "", detail=disk_detail(text, Path(attempt.dir)))
    attempt_transition(attempt, AttemptStatus.FAILED)
    attempt.cause, attempt.exception, attempt.reason = failure.cause.value, failure.exception, failure.summary()
    retry_or_fail(session, run, attempt, failure, now, config)
    return True


def stop(session: Session, run: Run, attempt: Attempt, executor: Executor, grace_s: float) -> None:
    """Cancel or pause: SIGTERM, or a script's ``workload.stop_signal`` (the ranks finish the
    step and checkpoint), SIGKILL after grace."""
    now = time.time()
    if attempt.signal_sent is None:
        # Every attempt of the run, not only the newest: an older one's orphan must not outlive
        # the cancel (none should exist; this makes sure).
        executor.end_older(run, attempt)
        if not executor.terminate(run, attempt):
            return  # launched a moment ago and torchrun is not up yet: try again next tick
        sent = graceful_signal(run)
        attempt.signal_sent, attempt.signal_sent_at = sent.value, now
        attempt.stop_reason = StopReason(run.stop_mode or StopReason.CANCEL).value
        session.add(Event(run_id=run.id, attempt=attempt.number, at=now, kind="signal",
                          message=f"{attempt.stop_reason}: {sent.value} sent; the ranks checkpoint and exit; "
                                  f"SIGKILL in {grace_s:.0f} s if still running"))
    elif attempt.signal_sent != SignalSent.SIGKILL and now - (attempt.signal_sent_at or now) > grace_s:
        executor.kill(run, attempt)
        executor.end_older(run, attempt)
        first = attempt.signal_sent
        attempt.signal_sent, attempt.signal_sent_at = SignalSent.SIGKILL.value, now
        session.add(Event(run_id=run.id, attempt=attempt.number, at=now, level="warning", kind="signal",
                          message=f"still running {grace_s:.0f} s after {first}: SIGKILL sent"))


def graceful_signal(run: Run) -> SignalSent:
    """The first signal of a pause or a cancel, as recorded on the attempt."""
    return SignalSent(stop_signal(run).name)
