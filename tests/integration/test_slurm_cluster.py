"""The test Slurm cluster works the way the Slurm executor uses it: one batch job per attempt,
one srun task per node inside it, signals by scancel and by --signal, status from squeue --json,
requeue with the same job id and an appended log. Facts in docs/SLURM_NOTES.md.

Run against tests/services/slurm.sh: ``eval "$(tests/services/slurm.sh start /tmp/s)"``, then
``pytest -m slurm``. About 30 s: a --signal warning arrives on the controller's 30-s check, so a
job that waits for one is submitted first (``warned_job``) and checked last, the others run meanwhile.
"""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.slurm_cluster import SlurmCluster

pytestmark = pytest.mark.slurm

# The batch script of an attempt, in miniature: it records what it sees under $1, traps USR2 (the
# executor's "checkpoint and stop" signal), runs one task per node with srun and waits for it
# through any signal it traps (bash's `wait` returns >128 when a trapped signal interrupts it).
BATCH = r"""#!/bin/bash
out="$1"
trap 'echo "batch USR2" >> "$out/events"' USR2
env | grep '^SLURM_' | sort > "$out/batch.env"
scontrol show hostnames "$SLURM_JOB_NODELIST" > "$out/hosts"
echo "start restart=${SLURM_RESTART_COUNT:-none}"
srun --ntasks-per-node=1 -N "$SLURM_JOB_NUM_NODES" bash -c '
  trap "echo task USR2 >> $0/events" USR2
  trap "echo task TERM >> $0/events; exit 143" TERM
  env | grep "^SLURM_" | sort > "$0/.task.$SLURM_NODEID.env"
  mv "$0/.task.$SLURM_NODEID.env" "$0/task.$SLURM_NODEID.env"  # whole when it appears: the tests wait for it
  while :; do sleep 0.1; done' "$out" &
step=$!
while :; do wait "$step"; rc=$?; kill -0 "$step" 2>/dev/null || break; done
echo "srun exit $rc" >> "$out/events"
"""


def _env_file(path: Path) -> dict[str, str]:
    return dict(line.split("=", 1) for line in path.read_text().splitlines() if "=" in line)


def _events(out: Path) -> list[str]:
    path = out / "events"
    return path.read_text().splitlines() if path.exists() else []


WARNED = r"""#!/bin/bash
trap 'echo "batch USR2 $(date +%s.%N)" >> "$1/events"' USR2
echo "start $(date +%s.%N)" >> "$1/events"
while :; do sleep 0.2; done
"""


@pytest.fixture(scope="module", autouse=True)
def warned_job(slurm: SlurmCluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[int, Path]]:
    """A job submitted before the module's tests, whose --signal=B:USR2 warning is due 2 s after it
    starts (-t 1, 58 s ahead); the controller sends it at its next time-limit check, within 30 s."""
    out = tmp_path_factory.mktemp("warned")
    (out / "warned.sh").write_text(WARNED)
    job_id = slurm.sbatch("--job-name=runyard-warned", "--time=1", "--signal=B:USR2@58", "--output=/dev/null",
                          str(out / "warned.sh"), str(out))
    yield job_id, out
    slurm.run("scancel", str(job_id), check=False)


@pytest.fixture
def attempt_dir(tmp_path: Path) -> Path:
    (tmp_path / "batch.sh").write_text(BATCH)
    return tmp_path


@pytest.fixture
def jobs(slurm: SlurmCluster) -> Iterator[list[int]]:
    """Job ids a test submitted; cancelled at its end, whatever happened."""
    ids: list[int] = []
    yield ids
    if ids:
        slurm.run("scancel", *map(str, ids), check=False)


def test_batch_job_signals_and_status_as_the_executor_sees_them(
        slurm: SlurmCluster, attempt_dir: Path, jobs: list[int]) -> None:
    name = f"runyard-test-{uuid.uuid4().hex[:8]}"
    log = attempt_dir / "slurm-%j.out"
    # The executor's options; the --signal warning itself is test_signal_warning_reaches_the_batch_shell's.
    job_id = slurm.sbatch(f"--job-name={name}", "--time=2", "--signal=B:USR2@5", "--open-mode=append",
                          f"--output={log}", str(attempt_dir / "batch.sh"), str(attempt_dir))
    jobs.append(job_id)

    job = slurm.wait_state(job_id, "RUNNING")
    assert (job["name"], job["nodes"], job["batch_host"]) == (name, "localhost", "localhost")
    assert job["state_reason"] == "None"
    assert job["standard_output"] == str(log)  # the pattern, not expanded
    plain = slurm.run("squeue", "-h", "-j", str(job_id), "-o", "%i|%j|%T|%r|%N").stdout.strip()
    assert plain == f"{job_id}|{name}|RUNNING|None|localhost"

    task_env = slurm.wait_for("the srun task", lambda: (attempt_dir / "task.0.env").exists() or None)
    assert task_env
    task = _env_file(attempt_dir / "task.0.env")
    assert (task["SLURM_JOB_ID"], task["SLURM_NODEID"], task["SLURM_PROCID"], task["SLURM_STEP_ID"]) == (
        str(job_id), "0", "0", "0")
    assert task["SLURM_JOB_NODELIST"] == "localhost"
    batch = _env_file(attempt_dir / "batch.env")
    assert batch["SLURM_JOB_NAME"] == name and "SLURM_RESTART_COUNT" not in batch
    assert (attempt_dir / "hosts").read_text().split() == ["localhost"]

    # scancel --batch reaches the batch shell only: its trap runs, the srun task sees nothing.
    slurm.run("scancel", "--signal=USR2", "--batch", str(job_id))
    slurm.wait_for("the batch trap of scancel's USR2", lambda: "batch USR2" in _events(attempt_dir) or None, 10)
    slurm.wait_for("srun to go on after the trap", lambda: (attempt_dir / "task.0.env").exists() or None)
    assert "task USR2" not in _events(attempt_dir) and not any(e.startswith("srun exit") for e in _events(attempt_dir))

    # scancel: SIGTERM to every process of the job (tasks too), SIGKILL after KillWait.
    slurm.run("scancel", str(job_id))
    ended = slurm.wait_state(job_id, "CANCELLED", timeout=15)
    assert ended["state_reason"] == "None"
    assert "task TERM" in _events(attempt_dir)
    # slurmstepd writes the job's cancel line beside the step's, and may do so after the state
    # reads CANCELLED (CI 36 read the file between the two): wait for it.
    cancelled = f"JOB {job_id} ON localhost CANCELLED AT"
    output_file = Path(str(log).replace("%j", str(job_id)))
    slurm.wait_for("slurmstepd's cancel line", lambda: cancelled in output_file.read_text() or None, 10)
    assert "start restart=none" in output_file.read_text()
    # squeue forgets a finished job MinJobAge (2 s) after its end, at the controller's next purge.
    slurm.wait_for("squeue to forget the job", lambda: slurm.job(job_id) is None, 20)


def test_exit_code_of_a_failed_or_killed_batch_script(slurm: SlurmCluster, jobs: list[int]) -> None:
    failed = slurm.sbatch("--output=/dev/null", "--wrap=exit 3")
    killed = slurm.sbatch("--output=/dev/null", "--wrap=sleep 0.5; kill -9 $$")
    jobs.extend([failed, killed])
    f = slurm.wait_state(failed, "FAILED")
    k = slurm.wait_state(killed, "FAILED")
    # exit_code is the raw wait status: exit 3 -> 3 << 8; killed by SIGKILL -> 9, and a batch
    # script ended by a signal is reported as JobLaunchFailure, not as a launch that failed.
    assert (f["exit_code"], f["state_reason"]) == (3 << 8, "NonZeroExitCode")
    assert (k["exit_code"], k["state_reason"]) == (9, "JobLaunchFailure")


def test_requeue_keeps_the_job_id_and_appends_to_the_output(
        slurm: SlurmCluster, attempt_dir: Path, jobs: list[int]) -> None:
    log = attempt_dir / "slurm-%j.out"
    job_id = slurm.sbatch("--job-name=runyard-requeue", "--time=2", "--open-mode=append", f"--output={log}",
                          str(attempt_dir / "batch.sh"), str(attempt_dir))
    jobs.append(job_id)
    slurm.wait_state(job_id, "RUNNING")
    slurm.wait_for("the srun task", lambda: (attempt_dir / "task.0.env").exists() or None)

    slurm.run("scontrol", "requeue", str(job_id))
    # PENDING (BeginTime) for AuthInfo's cred_expire (10 s here, 120 s by default), then RUNNING
    # again under the same id, SLURM_RESTART_COUNT=1.
    pending = slurm.wait_state(job_id, "PENDING", timeout=10)
    assert pending["restart_cnt"] == 1
    job = slurm.wait_state(job_id, "RUNNING", timeout=30)
    assert job["job_id"] == job_id
    output = Path(str(log).replace("%j", str(job_id)))
    slurm.wait_for("the second start", lambda: "start restart=1" in output.read_text() or None, 10)
    text = output.read_text()
    assert text.index("start restart=none") < text.index(f"JOB {job_id} ON localhost CANCELLED AT")
    assert "DUE TO JOB REQUEUE" in text and text.index("DUE TO JOB REQUEUE") < text.index("start restart=1")


def test_sacct_is_off_without_slurmdbd(slurm: SlurmCluster) -> None:
    proc = slurm.run("sacct", "-n", "-X", "-o", "JobID,State,ExitCode", check=False)
    assert proc.returncode == 1
    assert proc.stderr.strip() == "Slurm accounting storage is disabled"


def test_signal_warning_reaches_the_batch_shell(slurm: SlurmCluster, warned_job: tuple[int, Path]) -> None:
    job_id, out = warned_job  # submitted before the other tests; its warning came while they ran
    slurm.wait_for("the --signal=B:USR2@58 warning",
                   lambda: any(e.startswith("batch USR2") for e in _events(out)) or None, 40)
    start = float(_events(out)[0].split()[1])
    warned = float(next(e for e in _events(out) if e.startswith("batch USR2")).split()[2])
    assert 0 < warned - start < 35, _events(out)
    assert slurm.job(job_id)["job_state"] == "RUNNING"  # type: ignore[index]
