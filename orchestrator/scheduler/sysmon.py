"""The system monitor: the machine, each running attempt's processes and the GPUs, every 2 s.

The scheduler runs ``SystemMonitor.job`` as its own APScheduler job beside the tick (``sysmon``,
every ``SAMPLE_S``, ``max_instances=1``, ``coalesce=True``): a slow or failing sample never
delays or breaks supervision. Samples stay in memory; when a 10-s window closes, one row per
series (min, mean, max, count) goes to ``system_metrics``, so a run with 8 GPUs costs about
100 rows per 10 s. Nothing is recorded while no attempt runs. A run's rows live as long as the
run; rows of no run (the host) are deleted after ``retention_s`` (30 days).

What is sampled (psutil, and NVML through nvidia-ml-py when it is installed and finds a driver):

- ``host``: CPU %, memory used and total, disk read/write and network sent/received bytes/s;
- ``procs``: each running attempt's process tree (the shim, torchrun, the ranks and their
  workers): CPU % and RSS of the whole tree (``rank`` null) and of each rank's processes (by
  the ``RANK`` torchrun gave them);
- ``gpu<N>``: utilization %, memory used and total, power and its limit (W), temperature (C),
  SM clock (MHz), volatile uncorrected ECC errors; a key the GPU does not support is skipped.
  A GPU is tagged with the run the scheduler gave it (the attempt's ``devices_json``) and the
  rank whose ``LOCAL_RANK`` indexes that list.

Beside the samples, each job reads the energy of the running attempts' devices through the
scheduler's energy meter (orchestrator/scheduler/energy.py), into their tallies (db/energy/).
"""

from __future__ import annotations

import json
import logging
import math
import socket
import time
from collections.abc import Callable
from dataclasses import dataclass
from types import ModuleType
from typing import Any, cast

import psutil
from sqlalchemy import CursorResult, delete, insert, select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Run, SystemMetric
from db.states import AttemptStatus
from orchestrator.executors.processes import attempt_processes
from orchestrator.scheduler.energy import EnergyMeter
from orchestrator.scheduler.resources import GpuSampler

logger = logging.getLogger(__name__)

SAMPLE_S = 2.0
WINDOW_S = 10.0
# Rows kept for the next write while the database refuses them (locked, full disk): about
# ten minutes of a busy 8-GPU machine; older ones are dropped.
PENDING_MAX_ROWS = 10_000
ERROR_LOG_EVERY_S = 60.0
# Rows of no run (the host, a GPU no run was given) are kept this long; a run's rows live as
# long as the run. Old ones are deleted at most once per PRUNE_EVERY_S.
HOST_RETENTION_S = 30 * 86_400.0
PRUNE_EVERY_S = 3_600.0
# An attempt's process tree is walked again at most this often (psutil finds children by
# reading every process's /proc/<pid>/stat), and at once when one of its processes is gone.
TREE_REFRESH_S = 10.0

# (device, run_id, rank, key): one series.
Series = tuple[str, int | None, int | None, str]


@dataclass(frozen=True)
class RunningAttempt:
    """What the monitor needs of one running attempt."""

    run_id: int
    number: int
    run_dir: str
    pid: int | None
    pid_create_time: float | None
    devices: tuple[int, ...]


@dataclass
class _Tracked:
    """A process seen before: psutil's CPU % is measured between two calls on the same object."""

    proc: psutil.Process
    rank: int | None
    local_rank: int | None
    primed: bool = False


def _alive(proc: psutil.Process) -> bool:
    try:
        alive: bool = proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE  # psutil's values are Any
        return alive
    except psutil.Error:
        return False


def _env_int(env: dict[str, str], name: str) -> int | None:
    value = env.get(name, "")
    return int(value) if value.isdigit() else None


class SystemMonitor:
    """Samples with ``sample()``, aggregates in memory, writes one row per series per window.

    Args:
        sessions: where the running attempts are read and the aggregates written.
        host: the host name the rows are tagged with (default: this machine's).
        clock: the time samples are stamped with (tests pass a fake one to close windows
            without waiting); rates use the monotonic clock.
        nvml: the ``pynvml`` module; default: imported when installed.
        window_s: the aggregation window.
        retention_s: how long rows of no run are kept (a run's rows stay with the run).
        energy: the scheduler's energy meter, which reads the running attempts' devices at each
            sample (orchestrator/scheduler/energy.py); None: no energy is read.
    """

    def __init__(
        self,
        sessions: sessionmaker[Session],
        *,
        host: str | None = None,
        clock: Callable[[], float] = time.time,
        nvml: ModuleType | None = None,
        window_s: float = WINDOW_S,
        retention_s: float = HOST_RETENTION_S,
        energy: EnergyMeter | None = None,
    ):
        self.sessions = sessions
        self.host = host or socket.gethostname()
        self.clock = clock
        self.window_s = window_s
        self.retention_s = retention_s
        self._pruned_at = -math.inf
        self.energy = energy
        self._gpu = GpuSampler(nvml)
        self._tracked: dict[tuple[int, float], _Tracked] = {}
        self._trees: dict[tuple[int, int], tuple[float, list[psutil.Process]]] = {}
        self._io_last: tuple[float, dict[str, float]] | None = None
        self._window_at: float | None = None
        self._samples: dict[Series, list[float]] = {}
        self._pending: list[dict[str, Any]] = []
        self._failed_writes = 0  # windows in a row whose rows could not be written
        self._last_error_log = -math.inf
        self._cpu_last = _cpu_busy_total(psutil.cpu_times())

    # -- the job --------------------------------------------------------------------------

    def job(self) -> None:
        """``sample()`` for the scheduler: errors are logged (at most once a minute), never raised."""
        try:
            self.sample()
        except Exception:
            now = time.monotonic()
            if now - self._last_error_log >= ERROR_LOG_EVERY_S:
                self._last_error_log = now
                logger.exception("system sample failed; trying again in %.0f s", SAMPLE_S)
        if self.energy is not None:
            self.energy.job()  # its own errors are its own: logged there, never raised

    def sample(self) -> None:
        """Take one sample; write the previous window's aggregates when a new window begins."""
        at = self.clock()
        window_at = math.floor(at / self.window_s) * self.window_s
        if self._window_at is not None and window_at != self._window_at:
            self.flush()
        values = self._host()  # always read: CPU % and the rates measure since the last read
        attempts = self._running_attempts()
        if not attempts:
            self._tracked, self._trees = {}, {}
            return
        owners: dict[int, tuple[int, int | None]] = {}
        seen: set[tuple[int, float]] = set()
        for attempt in attempts:
            local_ranks = self._attempt_processes(attempt, values, seen)
            for local_rank, gpu in enumerate(attempt.devices):
                owners[gpu] = (attempt.run_id, local_ranks.get(local_rank))
        self._tracked = {k: v for k, v in self._tracked.items() if k in seen}  # forget the processes gone
        running = {(a.run_id, a.number) for a in attempts}
        self._trees = {k: v for k, v in self._trees.items() if k in running}
        values.update(self._gpus(owners))
        self._window_at = window_at
        for series, value in values.items():
            self._samples.setdefault(series, []).append(float(value))

    def flush(self) -> None:
        """Aggregate the open window into rows and write them (with any left from a failed write)."""
        if self._samples and self._window_at is not None:
            for (device, run_id, rank, key), values in self._samples.items():
                self._pending.append({
                    "at": self._window_at, "host": self.host, "device": device, "run_id": run_id, "rank": rank,
                    "key": key, "min": min(values), "mean": sum(values) / len(values), "max": max(values),
                    "count": len(values),
                })
        self._samples = {}
        self._window_at = None
        if not self._pending:
            return
        try:
            with self.sessions() as session:
                session.execute(insert(SystemMetric), self._pending)
                self._prune(session, self._pending[-1]["at"])
                session.commit()
        except IntegrityError as exc:  # a run deleted since the sample: these rows can never go in
            logger.warning("dropped %d system metric rows: %s", len(self._pending), exc)
        except Exception as exc:  # noqa: BLE001 - the rows are dropped, the monitor goes on
            del self._pending[:-PENDING_MAX_ROWS]
            if not self._failed_writes:  # once while it lasts (a full disk: not every 10 s), then its end
                logger.warning("could not write %d system metric rows (kept for the next windows until they can "
                               "be): %s", len(self._pending), str(exc).splitlines()[0] if str(exc) else exc)
            self._failed_writes += 1
            return
        if self._failed_writes:
            logger.warning("system metric rows written again after %d window(s) that could not be",
                           self._failed_writes)
        self._failed_writes = 0
        self._pending = []

    def _prune(self, session: Session, now: float) -> None:
        """Delete rows of no run older than the retention, at most once per PRUNE_EVERY_S."""
        if now - self._pruned_at < PRUNE_EVERY_S:
            return
        self._pruned_at = now
        # Session.execute is typed to return a Result; for a DELETE it is a CursorResult (rowcount).
        gone = cast(CursorResult[Any], session.execute(
            delete(SystemMetric).where(SystemMetric.run_id.is_(None), SystemMetric.at < now - self.retention_s)
        )).rowcount
        if gone:
            logger.info("deleted %d system metric rows older than %.0f days", gone, self.retention_s / 86_400)

    def close(self) -> None:
        """Write the open window and let go of NVML (the scheduler calls this when it stops)."""
        try:
            self.flush()
        finally:
            self._gpu.close()

    # -- host ---------------------------------------------------------------------------------

    def _host(self) -> dict[Series, float]:
        values: dict[Series, float] = {}
        # Measured here between two samples: psutil.cpu_percent() keeps its last reading per
        # thread, and APScheduler runs the job on any thread of its pool.
        busy, total = _cpu_busy_total(psutil.cpu_times())
        if total > self._cpu_last[1]:
            values[("host", None, None, "cpu_percent")] = min(
                100.0, max(0.0, 100.0 * (busy - self._cpu_last[0]) / (total - self._cpu_last[1])))
        self._cpu_last = (busy, total)
        memory = psutil.virtual_memory()
        values[("host", None, None, "mem_used_bytes")] = memory.total - memory.available
        values[("host", None, None, "mem_total_bytes")] = memory.total
        counters: dict[str, float] = {}
        disk = psutil.disk_io_counters()
        if disk is not None:  # None where the kernel exposes no disks (some containers)
            counters["disk_read_bps"], counters["disk_write_bps"] = disk.read_bytes, disk.write_bytes
        net = psutil.net_io_counters()
        if net is not None:
            counters["net_sent_bps"], counters["net_recv_bps"] = net.bytes_sent, net.bytes_recv
        now = time.monotonic()
        if self._io_last is not None:
            then, previous = self._io_last
            elapsed = now - then
            for key, total in counters.items():
                delta = total - previous.get(key, total)
                if elapsed > 0 and delta >= 0:  # a negative delta is a counter reset: skip it
                    values[("host", None, None, key)] = delta / elapsed
        self._io_last = (now, counters)
        return values

    # -- processes ----------------------------------------------------------------------------

    def _running_attempts(self) -> list[RunningAttempt]:
        with self.sessions() as session:
            rows = session.execute(
                select(Attempt.run_id, Attempt.number, Run.run_dir, Attempt.pid, Attempt.pid_create_time,
                       Attempt.devices_json)
                .join(Run, Run.id == Attempt.run_id)
                .where(Attempt.status == AttemptStatus.RUNNING.value)
                .order_by(Attempt.run_id)
            ).all()
        attempts = []
        for run_id, number, run_dir, pid, create_time, devices_json in rows:
            try:
                devices = tuple(int(d) for d in json.loads(devices_json or "[]"))
            except (ValueError, TypeError):
                devices = ()  # a hand-edited row: the GPUs are still sampled, just not tagged
            attempts.append(RunningAttempt(run_id, number, run_dir, pid, create_time, devices))
        return attempts

    def _attempt_processes(
        self, attempt: RunningAttempt, values: dict[Series, float], seen: set[tuple[int, float]]
    ) -> dict[int, int]:
        """Add the attempt's tree and per-rank CPU % and RSS to ``values``; return LOCAL_RANK -> RANK.

        Only the launcher's tree is walked (finding orphans means reading every process's
        environment: the tick does that when it matters, not this 2-s sampler).
        """
        procs = self._tree(attempt)
        tree_cpu: float | None = None
        tree_rss = 0.0
        rank_cpu: dict[int, float] = {}
        rank_rss: dict[int, float] = {}
        local_ranks: dict[int, int] = {}
        for proc in procs:
            tracked = self._track(proc, seen)
            if tracked is None:
                continue
            try:
                with tracked.proc.oneshot():
                    cpu = tracked.proc.cpu_percent(interval=None)
                    rss = float(tracked.proc.memory_info().rss)
            except psutil.Error:
                continue
            primed, tracked.primed = tracked.primed, True  # the first reading of a process means nothing
            tree_rss += rss
            if primed:
                tree_cpu = (tree_cpu or 0.0) + cpu
            if tracked.rank is None:
                continue
            rank_rss[tracked.rank] = rank_rss.get(tracked.rank, 0.0) + rss
            if primed:
                rank_cpu[tracked.rank] = rank_cpu.get(tracked.rank, 0.0) + cpu
            if tracked.local_rank is not None:
                local_ranks.setdefault(tracked.local_rank, tracked.rank)
        if procs:
            values[("procs", attempt.run_id, None, "rss_bytes")] = tree_rss
            if tree_cpu is not None:
                values[("procs", attempt.run_id, None, "cpu_percent")] = tree_cpu
        for rank, rss in rank_rss.items():
            values[("procs", attempt.run_id, rank, "rss_bytes")] = rss
        for rank, cpu in rank_cpu.items():
            values[("procs", attempt.run_id, rank, "cpu_percent")] = cpu
        return local_ranks

    def _tree(self, attempt: RunningAttempt) -> list[psutil.Process]:
        """The attempt's processes as last walked, walked again every ``TREE_REFRESH_S`` or
        as soon as one of them has ended."""
        key, now = (attempt.run_id, attempt.number), time.monotonic()
        cached = self._trees.get(key)
        if cached is not None and now - cached[0] < TREE_REFRESH_S and all(_alive(p) for p in cached[1]):
            return cached[1]
        procs = [p for p in attempt_processes(attempt.run_dir, attempt.number, attempt.pid, attempt.pid_create_time,
                                              orphans=False) if _alive(p)]  # not a zombie not yet reaped
        self._trees[key] = (now, procs)
        return procs

    def _track(self, proc: psutil.Process, seen: set[tuple[int, float]]) -> _Tracked | None:
        try:
            key = (proc.pid, proc.create_time())
        except psutil.Error:
            return None
        seen.add(key)
        tracked = self._tracked.get(key)
        if tracked is None:
            try:
                env = proc.environ()
            except (psutil.Error, OSError):
                env = {}
            tracked = _Tracked(proc, _env_int(env, "RANK"), _env_int(env, "LOCAL_RANK"))
            self._tracked[key] = tracked
        return tracked

    # -- GPUs -----------------------------------------------------------------------------------

    def _gpus(self, owners: dict[int, tuple[int, int | None]]) -> dict[Series, float]:
        """Each GPU's readings (orchestrator/scheduler/resources.py), tagged with the run and the
        rank it was given to."""
        values: dict[Series, float] = {}
        for index, readings in self._gpu.read().items():
            run_id, rank = owners.get(index, (None, None))
            for key, value in readings.items():
                values[(f"gpu{index}", run_id, rank, key)] = float(value)
        return values


def _cpu_busy_total(times: Any) -> tuple[float, float]:
    """Busy and total CPU seconds of all cores, counted the way psutil.cpu_percent counts them
    (guest time is already in user time on Linux; idle and I/O wait are not busy)."""
    total = sum(times) - getattr(times, "guest", 0.0) - getattr(times, "guest_nice", 0.0)
    return total - times.idle - getattr(times, "iowait", 0.0), total
