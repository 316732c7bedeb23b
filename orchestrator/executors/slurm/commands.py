"""Slurm's commands as runyard uses them: ``sbatch``, ``squeue``, ``scancel``, ``sacct``,
``scontrol``, each an argv list with a timeout (never a shell), and the parsing of what they say.

What Slurm can tell, and how much to believe it (see docs/DESIGN.md, "Slurm"):

- ``squeue`` lists the jobs still in the controller's memory: pending, running, completing, and
  finished ones for ``MinJobAge`` seconds (300 by default) after they end. One call a tick covers
  every job (``--json`` where this Slurm has it, the plain format otherwise).
- ``sacct`` knows how a job ended long after, but only where accounting (slurmdbd) runs; often
  it does not. :func:`sacct_state` says ``None`` then, and the exit marker the batch program
  writes is what settles the job.
- A failed or timed-out ``squeue`` says nothing about the jobs: their last known state stays,
  with its age shown, and nothing is concluded from the silence.
"""

from __future__ import annotations

import json
import logging
import os
import pwd
import re
import shutil
import subprocess
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass

logger = logging.getLogger(__name__)

# Seconds a Slurm client command may take before runyard gives up on it this tick.
COMMAND_TIMEOUT_S = 30.0
# squeue's plain format when --json is not there: fields runyard reads, separated by "|".
PLAIN_FORMAT = "%i|%j|%T|%r|%N"
# A job id as sbatch --parsable prints it ("1234" or "1234;cluster").
_JOB_ID = re.compile(r"^(\d+)(?:;\S+)?$")
# A job in these states has no process yet: it waits for its allocation.
QUEUED_JOB_STATES = ("PENDING", "CONFIGURING")
# States in which a job holds or waits for an allocation (squeue's long names).
ACTIVE_STATES = frozenset({"PENDING", "CONFIGURING", "RUNNING", "COMPLETING", "SUSPENDED", "REQUEUED",
                           "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING", "SIGNALING", "STAGE_OUT", "STOPPED",
                           "RESV_DEL_HOLD", "SPECIAL_EXIT"})


# Reasons a pending job gives when Slurm will never start it as submitted (it would pend for
# ever): more nodes, time or resources than the partition allows, or an account or QOS it may
# not use.
NEVER_STARTS = frozenset({"PartitionNodeLimit", "PartitionTimeLimit", "BadConstraints", "InvalidAccount",
                          "InvalidQOS", "AccountNotAllowed", "QOSMaxNodePerJobLimit", "QOSMaxWallDurationPerJobLimit",
                          "QOSMaxGRESPerJob", "QOSMaxCpuPerJobLimit"})


class SlurmError(RuntimeError):
    """A Slurm command failed; the message holds the command and what it printed."""


@dataclass(frozen=True)
class JobStatus:
    """One job as ``squeue`` or ``sacct`` shows it."""

    job_id: str
    name: str
    state: str  # PENDING, RUNNING, COMPLETED, FAILED, CANCELLED, TIMEOUT, NODE_FAIL, PREEMPTED...
    reason: str  # why it pends (Resources, Priority), or "None"
    nodes: str  # the node list ("" while pending)
    exit_code: int | None = None  # sacct's, when it knows
    cancelled_by: str | None = None  # who cancelled it, where accounting says ("CANCELLED by 1000")


def command_path(name: str) -> str:
    """The full path of a Slurm client command.

    Raises:
        SlurmError: it is not installed (the message says which command and what to do).
    """
    found = shutil.which(name)
    if found is None:
        raise SlurmError(f"{name} not found on PATH: install Slurm's client commands (Debian: slurm-client) on "
                         "the machine that runs the scheduler, or use launch.executor = 'local'")
    return found


def run_command(argv: Sequence[str], env: Mapping[str, str] | None = None,
                timeout: float = COMMAND_TIMEOUT_S) -> str:
    """Run a Slurm command (argv, no shell) and return its stdout.

    Raises:
        SlurmError: it is missing, failed, or took longer than ``timeout``.
    """
    args = [command_path(argv[0]), *argv[1:]]
    try:
        done = subprocess.run(args, env=dict(env) if env is not None else None, capture_output=True, text=True,
                              timeout=timeout, check=False, stdin=subprocess.DEVNULL)
    except subprocess.TimeoutExpired:
        raise SlurmError(f"{' '.join(argv[:2])}... did not answer in {timeout:.0f} s (is slurmctld up?)") from None
    except OSError as exc:
        raise SlurmError(f"{argv[0]} could not be started: {exc}") from None
    if done.returncode != 0:
        said = (done.stderr or done.stdout).strip().splitlines()
        raise SlurmError(f"{argv[0]} exited {done.returncode}: {said[-1] if said else 'no message'}")
    return done.stdout


def parse_job_id(stdout: str) -> str:
    """The job id in ``sbatch --parsable``'s output.

    Raises:
        SlurmError: the output holds no job id.
    """
    line = stdout.strip().splitlines()[-1] if stdout.strip() else ""
    m = _JOB_ID.match(line.strip())
    if m is None:
        raise SlurmError(f"sbatch printed no job id: {stdout.strip()[:200]!r}")
    return m.group(1)


def _text(value: object) -> str:
    """A squeue JSON field as text: Slurm 23+ wraps some in lists or {"set", "number"} objects."""
    if isinstance(value, list):
        return ",".join(_text(v) for v in value)
    if isinstance(value, dict):
        if "number" in value and value.get("set", True):
            return str(value["number"])
        return ""
    return "" if value is None else str(value)


def wait_status_code(status: int) -> int:
    """A raw wait status (what squeue --json gives as a job's ``exit_code``) as an exit code:
    the code, or minus the signal that killed it."""
    return -(status & 0x7F) if status & 0x7F else status >> 8


def parse_squeue_json(stdout: str) -> dict[str, JobStatus]:
    """``squeue --json``'s jobs by id (Slurm 21.08 to 25.x shapes). A finished job's
    ``exit_code`` is the batch program's wait status; it is kept only for a finished job."""
    data = json.loads(stdout)
    jobs: dict[str, JobStatus] = {}
    for job in data.get("jobs", []):
        job_id = _text(job.get("job_id"))
        state = _text(job.get("job_state")).split(",")[0]
        raw = _text(job.get("exit_code"))
        code = wait_status_code(int(raw)) if raw.isdigit() and state not in ACTIVE_STATES else None
        jobs[job_id] = JobStatus(job_id=job_id, name=_text(job.get("name")), state=state,
                                 reason=_text(job.get("state_reason")) or "None", nodes=_text(job.get("nodes")),
                                 exit_code=code)
    return jobs


def canceller(state: str) -> str | None:
    """Who cancelled a job, from sacct's State (``CANCELLED by 1000``): the user's name where this
    machine knows the uid, else ``uid 1000``; None when the state names no one."""
    m = re.fullmatch(r"CANCELLED by (\d+)", state.strip())
    if m is None:
        return None
    try:
        return f"{pwd.getpwuid(int(m.group(1))).pw_name} (uid {m.group(1)})"
    except KeyError:
        return f"uid {m.group(1)}"


def parse_squeue_plain(stdout: str) -> dict[str, JobStatus]:
    """``squeue --noheader --format=%i|%j|%T|%r|%N``'s jobs by id."""
    jobs: dict[str, JobStatus] = {}
    for line in stdout.splitlines():
        parts = line.strip().split("|")
        if len(parts) != 5 or not parts[0]:
            continue
        job_id, name, state, reason, nodes = parts
        jobs[job_id] = JobStatus(job_id=job_id, name=name, state=state, reason=reason, nodes=nodes)
    return jobs


class Slurm:
    """The cluster as seen from the scheduler's machine: SLURM_CONF and the rest of the
    environment are the scheduler's own."""

    def __init__(self, env: Mapping[str, str] | None = None):
        self.env = dict(os.environ if env is None else env)
        self._json: bool | None = None  # whether squeue --json works here (found on first use)
        self._sacct: bool | None = None  # whether accounting answers (found on first use)

    def sbatch(self, argv: Sequence[str], env: Mapping[str, str]) -> str:
        """Submit; returns the job id. ``argv`` is sbatch's options and the batch program."""
        return parse_job_id(run_command(["sbatch", "--parsable", *argv], env=env))

    def squeue(self, job_ids: Iterable[str] | None = None, name: str | None = None) -> dict[str, JobStatus]:
        """This user's jobs the controller still holds, finished ones included (until
        ``MinJobAge`` purges them), by id; filtered here by ``job_ids`` and ``name`` (asking squeue
        for a job it has forgotten is an error, and ``--json`` ignores the filters anyway).

        Raises:
            SlurmError: squeue failed; nothing may be concluded about any job.
        """
        base = ["squeue", "--me"] + ([f"--name={name}"] if name else [])
        jobs: dict[str, JobStatus] | None = None
        if self._json is not False:
            try:
                jobs = parse_squeue_json(run_command([*base, "--json"], env=self.env))
                self._json = True
            except (SlurmError, ValueError) as exc:
                if self._json:  # it worked before: this is a real failure, not a missing feature
                    raise SlurmError(str(exc)) from None
                logger.info("squeue --json not usable here (%s); using the plain format", exc)
                self._json = False
        if jobs is None:
            jobs = parse_squeue_plain(run_command([*base, "--states=all", "--noheader", f"--format={PLAIN_FORMAT}"],
                                                  env=self.env))
        # squeue --json ignores its filters (22.05 prints every job it holds): filter here.
        if name is not None:
            jobs = {k: v for k, v in jobs.items() if v.name == name}
        if job_ids is None:
            return jobs
        wanted = set(job_ids)
        return {k: v for k, v in jobs.items() if k in wanted}

    def sacct_state(self, job_id: str) -> JobStatus | None:
        """How a job ended according to accounting; None where accounting is off or silent."""
        if self._sacct is False:
            return None
        try:
            out = run_command(["sacct", "--noheader", "--parsable2", "--allocations", f"--jobs={job_id}",
                               "--format=JobID,JobName,State,Reason,NodeList,ExitCode"], env=self.env)
        except SlurmError as exc:
            if self._sacct is None:
                logger.info("sacct not usable here (%s): jobs settle from their exit markers", exc)
                self._sacct = False
            return None
        self._sacct = True
        for line in out.splitlines():
            parts = line.split("|")
            if len(parts) >= 6 and parts[0] == job_id:
                state = parts[2].split()[0] if parts[2] else ""
                code = parts[5].split(":")[0] if parts[5] else ""
                return JobStatus(job_id=job_id, name=parts[1], state=state, reason=parts[3], nodes=parts[4],
                                 exit_code=int(code) if code.isdigit() else None,
                                 cancelled_by=canceller(parts[2]))
        return None

    def scancel(self, job_id: str, signal_name: str | None = None, batch: bool = False, full: bool = False) -> None:
        """Cancel a job, or send it a signal (to its steps; ``batch``: to the batch program;
        ``full``: to both)."""
        argv = ["scancel"]
        if signal_name:
            argv.append(f"--signal={signal_name}")
        if batch:
            argv.append("--batch")
        if full:
            argv.append("--full")
        run_command([*argv, job_id], env=self.env)
