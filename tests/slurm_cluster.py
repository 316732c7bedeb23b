"""A Slurm cluster for the tests that need one (the ``slurm`` fixture).

The cluster comes from the environment variable ``RUNYARD_TEST_SLURM``: the path of its
``slurm.conf``. ``tests/services/slurm.sh start DIR`` starts a throwaway single-node cluster on
loopback and prints the variable for eval; ``.ci/run`` does that. The fixture puts the path in
``SLURM_CONF`` for the whole session, so ``sbatch``/``squeue``/``scancel``/``scontrol``/``srun``
run by the tests, and by the code they test, reach that cluster.

Skipping is explicit, never silent (the rule tests/databases.py follows for PostgreSQL):

- without ``RUNYARD_TEST_SLURM`` the tests that use ``slurm`` are skipped with a one-line reason;
- with ``RUNYARD_TEST_SLURM_REQUIRED=1`` (CI) a missing or unreachable cluster FAILS them.

Field notes on how this Slurm (22.05, Debian 12) behaves: docs/SLURM_NOTES.md.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, TypeVar

import pytest

CLUSTER_ENV = "RUNYARD_TEST_SLURM"
REQUIRED_ENV = "RUNYARD_TEST_SLURM_REQUIRED"
CLIENTS = ("sbatch", "squeue", "scancel", "scontrol", "srun", "sinfo")

T = TypeVar("T")


class SlurmUnavailable(RuntimeError):
    """A Slurm cluster was asked for but there is none to use."""


@dataclass(frozen=True)
class SlurmCluster:
    """A running Slurm cluster, reached through its ``slurm.conf``."""

    conf: Path

    def env(self, **extra: str) -> dict[str, str]:
        """This process's environment with ``SLURM_CONF`` pointing at the cluster (and ``extra``)."""
        return {**os.environ, "SLURM_CONF": str(self.conf), **extra}

    def run(self, *argv: str, check: bool = True, timeout: float = 30) -> subprocess.CompletedProcess[str]:
        """Run a Slurm client command against the cluster; text output captured.

        Raises:
            AssertionError: ``check`` and the command exited non-zero (the message has its output).
        """
        proc = subprocess.run(argv, env=self.env(), capture_output=True, text=True, timeout=timeout)
        if check and proc.returncode != 0:
            said = proc.stderr.strip() or proc.stdout.strip()
            raise AssertionError(f"{' '.join(argv)} exited {proc.returncode}: {said}")
        return proc

    def sbatch(self, *argv: str) -> int:
        """``sbatch --parsable ARGV...`` (options, then the script and its arguments, or ``--wrap``);
        returns the job id."""
        out = self.run("sbatch", "--parsable", *argv).stdout.strip()
        return int(out.split(";")[0])  # "<id>" or "<id>;<cluster>"

    def jobs(self) -> list[dict[str, Any]]:
        """Every job the controller still knows (``squeue --json``: it ignores -j/-t filters)."""
        return list(json.loads(self.run("squeue", "--json").stdout)["jobs"])

    def job(self, job_id: int) -> dict[str, Any] | None:
        """Job ``job_id`` as ``squeue --json`` shows it, or ``None`` once squeue forgot it."""
        return next((j for j in self.jobs() if j["job_id"] == job_id), None)

    def wait_for(self, what: str, probe: Callable[[], T | None], timeout: float = 30, every: float = 0.25) -> T:
        """Poll ``probe`` until it returns something truthy; fail naming ``what`` after ``timeout`` s."""
        deadline = time.monotonic() + timeout
        while True:
            got = probe()
            if got:
                return got
            if time.monotonic() > deadline:
                raise AssertionError(f"timed out after {timeout} s waiting for {what}")
            time.sleep(every)

    def wait_state(self, job_id: int, *states: str, timeout: float = 30) -> dict[str, Any]:
        """Wait until job ``job_id`` is in one of ``states`` (``job_state`` of squeue --json)."""
        def probe() -> dict[str, Any] | None:
            job = self.job(job_id)
            return job if job is not None and job["job_state"] in states else None
        return self.wait_for(f"job {job_id} to be {'/'.join(states)}", probe, timeout)


def cluster_from_env() -> SlurmCluster:
    """The cluster named by ``RUNYARD_TEST_SLURM``, checked to answer.

    Raises:
        SlurmUnavailable: the variable is unset, names no file, a client is missing, or the
            controller does not answer; the message says which.
    """
    conf = os.environ.get(CLUSTER_ENV)
    if not conf:
        raise SlurmUnavailable(f"${CLUSTER_ENV} is not set (the path of a slurm.conf; "
                               "tests/services/slurm.sh start DIR prints it)")
    if not Path(conf).is_file():
        raise SlurmUnavailable(f"${CLUSTER_ENV}={conf}: no such file")
    missing = [c for c in CLIENTS if shutil.which(c) is None]
    if missing:
        raise SlurmUnavailable(f"Slurm clients not found on PATH: {', '.join(missing)} (apt-get install -y slurm-wlm)")
    cluster = SlurmCluster(Path(conf))
    try:
        proc = cluster.run("sinfo", "-h", "-o", "%t", check=False, timeout=15)
    except subprocess.TimeoutExpired:
        raise SlurmUnavailable(f"the cluster of ${CLUSTER_ENV}={conf} did not answer sinfo in 15 s") from None
    if proc.returncode != 0:
        reason = (proc.stderr.strip() or proc.stdout.strip()).splitlines()[:1]
        raise SlurmUnavailable(f"the cluster of ${CLUSTER_ENV}={conf} does not answer: {' '.join(reason)}")
    return cluster


@pytest.fixture(scope="session")
def slurm() -> Iterator[SlurmCluster]:
    """The test Slurm cluster, with ``SLURM_CONF`` set for the session; skips without one, or FAILS
    where ``RUNYARD_TEST_SLURM_REQUIRED=1``."""
    required = os.environ.get(REQUIRED_ENV, "") not in ("", "0")
    try:
        cluster = cluster_from_env()
    except SlurmUnavailable as exc:
        if required:
            pytest.fail(f"${REQUIRED_ENV}=1 asks for Slurm but {exc}", pytrace=False)
        pytest.skip(f"Slurm test not run: {exc}")
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("SLURM_CONF", str(cluster.conf))
        yield cluster
