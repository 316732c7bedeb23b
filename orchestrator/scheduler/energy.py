"""The energy meter: each attempt's devices read at its start, at every system-metrics tick and at
its end, and the tallies kept per attempt and device (db/energy/).

What is read, per device the attempt holds (only those: a run on GPUs 0 and 1 of eight counts two):

- a GPU: NVML's cumulative energy counter (``nvmlDeviceGetTotalEnergyConsumption``, millijoules
  since the driver loaded, Volta and newer): *measured*. Where NVML says it is not supported, its
  power reading (``nvmlDeviceGetPowerUsage``, milliwatts) times the seconds between two readings:
  *estimated* (never the board's TDP);
- a machine without GPU: each CPU package's RAPL counter
  (``/sys/class/powercap/intel-rapl:<N>/energy_uj``, wrapping at ``max_energy_range_uj``) times
  the attempt's share of the CPU slots: *measured*. Unreadable (root only on most kernels since
  CVE-2020-8694): *not measured*, and why, in words;
- an attempt under Slurm: not measured (its nodes' devices are not this machine's).

The scheduler's loop reads an attempt at its launch (:meth:`EnergyMeter.start`) and when it settles
it (:meth:`EnergyMeter.end`); the system monitor's job (orchestrator/scheduler/sysmon.py) reads every
running local attempt of this host every 2 s (:meth:`EnergyMeter.job`). Each reading goes on from
the stored one (db/vocabulary/energy.py's ``advance``), so a scheduler that takes an attempt over
continues where the last one stopped: a counter covers the gap, power x time says it cannot.
"""

from __future__ import annotations

import json
import logging
import math
import re
import socket
import threading
import time
from collections.abc import Callable
from pathlib import Path
from types import ModuleType
from typing import Any

from sqlalchemy import select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker

from db.energy import load_tallies, save_tallies
from db.lease import on_this_host
from db.models import Attempt, Run
from db.states import AttemptStatus
from db.vocabulary.energy import Method, Reading, advance, unread_until
from db.vocabulary.inventory import Inventory

logger = logging.getLogger(__name__)

POWERCAP = Path("/sys/class/powercap")
ERROR_LOG_EVERY_S = 60.0
# An attempt's newest reading older than this at its end: no scheduler read it meanwhile (the
# monitor reads every 2 s), so its end is not read (EnergyMeter.read's ``last``).
STALE_END_S = 30.0
# The loop waits at most this long for the monitor's reading of the devices to finish.
LOCK_WAIT_S = 2.0
_PACKAGE = re.compile(r"^intel-rapl:\d+$")  # a package's zone; intel-rapl:0:0 and the like are parts of it


class NvmlEnergy:
    """Each GPU's energy counter, or its power where the counter is not supported, through NVML
    (started on the first read, kept until :meth:`close`).

    Args:
        nvml: the ``pynvml`` module (tests: a stand-in exposing the same functions); default:
            imported when installed.
    """

    def __init__(self, nvml: ModuleType | None = None):
        self._nvml = nvml
        self._handles: list[Any] | None = None
        self._why_not = ""

    def read(self, index: int) -> Reading:
        """GPU ``index`` read once: its counter (measured), else its power (estimated), else why not."""
        device = f"gpu{index}"
        nvml = self.ready()
        if nvml is None or self._handles is None:
            return Reading(device, Method.NOT_MEASURED, note=self._why_not)
        if not 0 <= index < len(self._handles):
            return Reading(device, Method.NOT_MEASURED, note=f"GPU {index}: not among NVML's {len(self._handles)}")
        handle, error = self._handles[index], getattr(nvml, "NVMLError", Exception)
        try:
            return Reading(device, Method.MEASURED, nvml.nvmlDeviceGetTotalEnergyConsumption(handle) / 1000.0)
        except error as exc:  # NVMLError_NotSupported before Volta, and on some boards
            logger.debug("gpu%d: no energy counter: %s", index, exc)
        try:
            return Reading(device, Method.ESTIMATED, nvml.nvmlDeviceGetPowerUsage(handle) / 1000.0)
        except error as exc:
            return Reading(device, Method.NOT_MEASURED, note=f"GPU {index}: NVML reads neither its energy nor its "
                                                             f"power ({exc})")

    def close(self) -> None:
        """Let go of NVML."""
        if self._handles and self._nvml is not None:
            try:
                self._nvml.nvmlShutdown()
            except Exception as exc:  # noqa: BLE001 - shutting down: nothing to do about it
                logger.debug("nvmlShutdown: %s", exc)
        self._handles = None

    def ready(self) -> ModuleType | None:
        """NVML, started on first use (its handles of every GPU); None, with the reason kept, without it."""
        if self._handles is not None:
            return self._nvml
        if self._why_not:
            return None
        if self._nvml is None:
            try:
                import pynvml  # noqa: PLC0415 - optional: nvidia-ml-py, the [gpu] extra
            except ImportError:
                self._why_not = "no NVML (nvidia-ml-py is not installed)"
                return None
            self._nvml = pynvml
        try:
            self._nvml.nvmlInit()
            self._handles = [self._nvml.nvmlDeviceGetHandleByIndex(i) for i in range(self._nvml.nvmlDeviceGetCount())]
        except Exception as exc:  # noqa: BLE001 - NVMLError_LibraryNotFound without a driver, and the like
            self._why_not = f"NVML unavailable ({exc})"
            return None
        return self._nvml


def rapl_readings(root: Path, share: float, note: str) -> list[Reading]:
    """Each CPU package's RAPL counter under ``root`` (``/sys/class/powercap``) in joules, with its
    wrap-around range; one not-measured reading saying why when none can be read."""
    packages = sorted(p for p in root.glob("intel-rapl:*") if _PACKAGE.match(p.name)) if root.is_dir() else []
    found, why = [], f"no RAPL package under {root}"
    for package in packages:
        try:
            value = int((package / "energy_uj").read_text()) / 1e6
            wrap = int((package / "max_energy_range_uj").read_text()) / 1e6
        except PermissionError:
            why = f"{package / 'energy_uj'} is readable by root only (since CVE-2020-8694)"
            continue
        except (OSError, ValueError) as exc:
            why = f"{package / 'energy_uj'} unreadable ({exc})"
            continue
        found.append(Reading(f"rapl:{package.name.split(':')[1]}", Method.MEASURED, value, wrap, share, note))
    if found:
        return found
    return [Reading("none", Method.NOT_MEASURED, note=f"no GPU energy counter and no readable RAPL: {why}")]


class EnergyMeter:
    """Reads the devices of attempts and keeps their tallies (see the module's docstring).

    Args:
        sessions: where the monitor's job reads the running attempts and writes their tallies.
        inventory: what this machine has (GPUs, else CPU slots).
        host: this scheduler's host: only the attempts its schedulers launched are read.
        nvml: the ``pynvml`` module (tests: a stand-in); default: imported when installed.
        powercap: where RAPL's zones are (tests: a folder of their own).
        clock: the time readings are stamped with.
    """

    def __init__(self, sessions: sessionmaker[Session], inventory: Inventory, *, host: str | None = None,
                 nvml: ModuleType | None = None, powercap: Path = POWERCAP, clock: Callable[[], float] = time.time):
        self.sessions = sessions
        self.inventory = inventory
        self.host = host or socket.gethostname()
        self.powercap = powercap
        self.clock = clock
        self._nvml = NvmlEnergy(nvml)
        # The loop's thread (start, end) and the monitor's (job) read the same devices (NVML starts once).
        self._lock = threading.Lock()
        self._last_error_log = -math.inf

    def readings(self, executor: str, devices: list[int], nproc: int) -> list[Reading]:
        """What an attempt on ``devices`` (GPU indices) with ``nproc`` slots reads now."""
        if executor != "local":
            return [Reading("none", Method.NOT_MEASURED, note=f"runs under {executor}: its nodes are not read here")]
        if self.inventory.kind == "gpu":
            if not devices:
                return [Reading("none", Method.NOT_MEASURED, note="holds no GPU")]
            return [self._nvml.read(index) for index in devices]
        slots = max(1, self.inventory.slots)
        share = min(1.0, nproc / slots)
        return rapl_readings(self.powercap, share, f"{min(nproc, slots)} of {slots} CPU slots")

    def read(self, session: Session, attempt: Attempt, nproc: int, *, last: bool = False) -> None:
        """Read ``attempt``'s devices and add what they used to its tallies (the caller commits).

        ``last``: the reading at its end. When its newest tally is older than ``STALE_END_S`` no
        scheduler read it for a while (it may have ended long before this settles it): its devices
        are not read, and the time since is said to be not covered, instead of charging it whatever
        they did meanwhile (idle draw, another program).
        """
        tallies = load_tallies(session, attempt.id)
        now = self.clock()
        if last and tallies and now - max(t.read_at for t in tallies.values()) > STALE_END_S:
            save_tallies(session, attempt.id, [unread_until(t, now) for t in tallies.values()])
            return
        # The devices only, never held while the database is waited for; and never waited for
        # longer than LOCK_WAIT_S by the loop (a monitor stuck in a driver call): the next reading
        # of a counter covers the time anyway.
        if not self._lock.acquire(timeout=LOCK_WAIT_S):
            raise TimeoutError(f"the devices are being read elsewhere for more than {LOCK_WAIT_S:g} s")
        try:
            now = self.clock()
            found = self.readings(attempt.executor, _devices(attempt.devices_json), nproc)
        finally:
            self._lock.release()
        save_tallies(session, attempt.id, [advance(tallies.get(r.device), r, now, attempt.started_at) for r in found])

    def warm(self) -> None:
        """Start NVML now (the scheduler calls this before its first tick), not in the tick's launch."""
        if self.inventory.kind == "gpu":
            self._guarded(self._nvml.ready, "starting NVML")

    def start(self, session: Session, run: Run, attempt: Attempt) -> None:
        """The attempt's first reading, before its launch (committed: the monitor reads it next)."""
        self._in_savepoint(session, run, attempt, last=False)
        session.commit()

    def end(self, session: Session, run: Run, attempt: Attempt) -> None:
        """The attempt's last reading, once its processes are gone (committed with its settling)."""
        self._in_savepoint(session, run, attempt, last=True)

    def _in_savepoint(self, session: Session, run: Run, attempt: Attempt, *, last: bool) -> None:
        """A reading of the loop's, in a savepoint of its own: a statement of it that fails
        (PostgreSQL aborts the whole transaction on one) costs the reading, never the launch or the
        settling it is part of."""
        def read() -> None:
            with session.begin_nested():
                self.read(session, attempt, run.nproc, last=last)
        self._guarded(read, f"run {run.id}: attempt {attempt.number}")

    def job(self) -> None:
        """The monitor's reading of every running local attempt of this host; errors logged, never raised."""
        def read_all() -> None:
            with self.sessions() as session:
                for attempt, nproc in session.execute(
                    select(Attempt, Run.nproc).join(Run, Run.id == Attempt.run_id)
                    .where(Attempt.status == AttemptStatus.RUNNING.value, Attempt.executor == "local",
                           on_this_host(self.host))
                ).all():
                    self.read(session, attempt, nproc)
                    session.commit()  # each attempt's own: no write lock held while the next is read
        self._guarded(read_all, "the running attempts")

    def close(self) -> None:
        """Let go of NVML (the scheduler calls this when it stops)."""
        self._nvml.close()

    def _guarded(self, step: Callable[[], object], what: str) -> None:
        """A reading that fails costs its figure, never the scheduler's work (logged once a minute)."""
        try:
            step()
        except Exception as exc:
            now = time.monotonic()
            if now - self._last_error_log >= ERROR_LOG_EVERY_S:
                self._last_error_log = now
                if isinstance(exc, SQLAlchemyError):  # a storage fault: the loop says so in one line of its own
                    logger.warning("energy of %s not saved: %s", what, str(exc).splitlines()[0])
                else:
                    logger.exception("energy reading failed for %s", what)


def _devices(devices_json: str | None) -> list[int]:
    try:
        return [int(d) for d in json.loads(devices_json or "[]")]
    except (TypeError, ValueError):
        return []  # a hand-edited row: its GPUs cannot be named
