"""Keeping custody of a run's processes: adoption of a launch whose pid was never committed, and
the sweep that makes sure no two attempts of a run ever live together.

Two rules, applied by the scheduler (orchestrator/scheduler/loop.py):

- An attempt whose launcher ended is settled only when nothing of its run lives any more: every
  process carrying the run's RUNYARD_RUN_DIR (ranks orphaned by a killed agent, a script's own
  subprocesses) gets SIGKILL first, and the attempt waits while one survives (a process stuck in
  the kernel). Until then it still holds its devices, so no other run is given GPUs that a
  survivor still uses.
- The next attempt of a run starts only after the same sweep.
"""

from __future__ import annotations

import logging
import time
from pathlib import Path

from sqlalchemy.orm import Session

from db.models import Attempt, Event, Run
from db.vocabulary.layout import LAUNCH_RECORD
from orchestrator.executors.processes import end_processes, is_alive, read_launch_record

logger = logging.getLogger(__name__)

# How long a sweep waits for SIGKILLed processes to disappear before it reports survivors.
SWEEP_WAIT_S = 2.0
# Later looks at known survivors only check (the tick must not wait on them every time).
RECHECK_WAIT_S = 0.2


class Sweeper:
    """The scheduler's sweeps and adoptions; remembers which survivors it already reported."""

    def __init__(self) -> None:
        # (run id, attempt number) whose processes outlived SIGKILL, already told with an event.
        self._lingering: set[tuple[int, int]] = set()

    def adopt_from_record(self, session: Session, run: Run, attempt: Attempt) -> None:
        """For an attempt row without a pid (the scheduler that launched it died before
        committing it): the shim wrote its own pid and create time before it started torchrun,
        so adopt from that record, alive or not (a dead one is then settled as vanished, after
        the sweep). Without a record nothing changes."""
        record = read_launch_record(Path(attempt.dir))
        if record is None:
            return
        attempt.pid, attempt.pid_create_time = int(record["shim_pid"]), float(record["shim_create_time"])
        alive = is_alive(attempt.pid, attempt.pid_create_time)
        message = (f"attempt {attempt.number}: its launcher's pid was never committed (the scheduler stopped during "
                   f"the launch); adopted pid {attempt.pid} from {Path(attempt.dir) / LAUNCH_RECORD}"
                   + ("" if alive else ", which has already ended"))
        session.add(Event(run_id=run.id, attempt=attempt.number, at=time.time(), kind="launch", message=message))
        logger.info("run %d: %s", run.id, message)

    def swept(self, session: Session, run: Run, number: int, root_pid: int | None, root_create: float | None) -> bool:
        """SIGKILL every process of the run (by its environment, plus the launcher's tree) and
        wait for them; True when none is left.

        Survivors get one warning event per attempt (naming each: pid, command line, state);
        later calls only look again, briefly.
        """
        reported = (run.id, number) in self._lingering
        sweep = end_processes(run.run_dir, root_pid, root_create, wait_s=RECHECK_WAIT_S if reported else SWEEP_WAIT_S)
        if sweep.clean:
            self._lingering.discard((run.id, number))
            return True
        if not reported:
            self._lingering.add((run.id, number))
            message = (f"attempt {number}: {len(sweep.survivors)} process(es) still alive {SWEEP_WAIT_S:.0f} s after "
                       f"SIGKILL: {'; '.join(sweep.survivors)[:1500]}; the run waits until they are gone")
            session.add(Event(run_id=run.id, attempt=number, at=time.time(), level="warning", kind="exit",
                              message=message))
            logger.warning("run %d: %s", run.id, message)
        return False
