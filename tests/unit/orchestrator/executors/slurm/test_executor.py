"""The Slurm executor (orchestrator/executors/slurm/executor.py): sbatch's options, and what a job
that left the queue means, on a real SQLite database with a fake ``Slurm`` (the command layer)
that answers as Slurm 22.05 does (docs/SLURM_NOTES.md), with the batch program's reading of
slurmstepd's stop line (orchestrator/executors/slurm/job.py). The real cluster is
tests/integration/test_slurm.py's.
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Attempt, Event, Run
from db.requests import create_run
from db.states import AttemptStatus, RunStatus
from db.vocabulary.causes import Cause
from db.vocabulary.config import RetryConfig, RunConfig, parse_config
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from orchestrator.executors.base import LaunchRequest, Liveness
from orchestrator.executors.local import LocalExecutor
from orchestrator.executors.slurm import executor as executor_module
from orchestrator.executors.slurm.commands import JobStatus, Slurm, SlurmError, canceller
from orchestrator.executors.slurm.executor import SlurmExecutor, sbatch_options, warning_lead_s
from orchestrator.executors.slurm.job import stop_line
from orchestrator.format import where_short, where_text
from orchestrator.scheduler.loop import Scheduler
from orchestrator.scheduler.outcomes import settle
from orchestrator.scheduler.retry import AttemptOutcome, decide
from tests.unit.orchestrator.fake_runs import CPU2


def test_sbatch_options_map_each_field_and_keep_runyard_s_own(tmp_path: Path) -> None:
    config = parse_config({"launch": {"executor": "slurm", "nnodes": 2, "nproc_per_node": 4},
                           "slurm": {"partition": "gpu", "account": "lab", "time_limit": "04:00:00",
                                     "gpus_per_node": 4, "cpus_per_task": 32, "mem": "200G",
                                     "sbatch_args": ["--qos=high", "--exclusive"]}})
    request = LaunchRequest(run_id=7, number=2, config=config, attempt_dir=tmp_path / "a", cwd=tmp_path, env={},
                            port=0, resuming=False)
    argv = sbatch_options(request, "runyard-r7-a2-abcdef", warning_lead_s(45.0))
    assert argv[:9] == ["--job-name=runyard-r7-a2-abcdef", f"--chdir={tmp_path}", f"--output={tmp_path}/a/launcher.log",
                        "--open-mode=append", "--signal=B:USR2@90", "--nodes=2", "--ntasks-per-node=1", "--no-requeue",
                        "--export=ALL"]
    assert argv[9:] == ["--partition=gpu", "--account=lab", "--time=04:00:00", "--gpus-per-node=4",
                        "--cpus-per-task=32", "--mem=200G", "--qos=high", "--exclusive"]
    assert warning_lead_s(None) == 90 and warning_lead_s(300.0) == 330  # the measured save, plus 30 s


class FakeSlurm(Slurm):
    """Answers as Slurm would: ``queue`` is what squeue shows, ``accounting`` what sacct knows
    (None: accounting off); ``down`` makes squeue fail."""

    def __init__(self) -> None:
        super().__init__()
        self.queue: dict[str, JobStatus] = {}
        self.accounting: dict[str, JobStatus] | None = None
        self.down = False
        self.cancelled: list[tuple[str, str | None]] = []

    def squeue(self, job_ids: Iterable[str] | None = None, name: str | None = None) -> dict[str, JobStatus]:
        if self.down:
            raise SlurmError("squeue exited 1: slurm_load_jobs error: Unable to contact slurm controller")
        return {k: v for k, v in self.queue.items() if name is None or v.name == name}

    def sacct_state(self, job_id: str) -> JobStatus | None:
        return None if self.accounting is None else self.accounting.get(job_id)

    def scancel(self, job_id: str, signal_name: str | None = None, batch: bool = False, full: bool = False) -> None:
        self.cancelled.append((job_id, signal_name))


def slurm_attempt(sessions: sessionmaker[Session], settings: Settings) -> tuple[int, int]:
    config = RunConfig.model_validate({"name": "s", "launch": {"executor": "slurm"}})
    with sessions() as s:
        run = create_run(s, config, settings.runs_dir, Price(usd_per_hour=1.0, unit="slurm"))
        run.status = RunStatus.RUNNING.value
        s.flush()
        attempt = Attempt(run_id=run.id, number=1, status=AttemptStatus.RUNNING.value, executor="slurm", job_id="42",
                          dir=str(Path(run.run_dir) / "attempts" / "1"), started_at=0.0, job_state="PENDING")
        s.add(attempt)
        s.commit()
        return run.id, attempt.id


def look(sessions: sessionmaker[Session], ids: tuple[int, int], executor: SlurmExecutor) -> Liveness:
    with sessions() as s:
        run, attempt = s.get_one(Run, ids[0]), s.get_one(Attempt, ids[1])
        executor._tried_at = -1e18  # poll now
        executor.poll([attempt])
        seen = executor.observe(s, run, attempt)
        s.commit()
        return seen.liveness


def test_a_job_in_the_queue_is_alive_and_its_state_kept(sessions: sessionmaker[Session], settings: Settings) -> None:
    fake = FakeSlurm()
    executor = SlurmExecutor(home=str(settings.home), slurm=fake)
    ids = slurm_attempt(sessions, settings)
    fake.queue["42"] = JobStatus("42", "n", "PENDING", "Priority", "")
    assert look(sessions, ids, executor) is Liveness.ALIVE
    with sessions() as s:  # waiting for its allocation: no hang watch, no start-up clock, no cost yet
        attempt = s.get_one(Attempt, ids[1])
        assert executor.queued(attempt) and attempt.started_at == 0.0
    fake.queue["42"] = JobStatus("42", "n", "RUNNING", "None", "node[01-02]")
    assert look(sessions, ids, executor) is Liveness.ALIVE
    with sessions() as s:
        attempt = s.get_one(Attempt, ids[1])
        assert (attempt.job_state, attempt.job_nodes) == ("RUNNING", "node[01-02]") and attempt.job_state_at
        assert not executor.queued(attempt) and attempt.started_at == attempt.job_state_at  # starts with its nodes
        (started,) = s.scalars(select(Event.message).where(Event.kind == "slurm")).all()
    assert started.startswith("Slurm job 42 started on node[01-02] after")
    fake.down = True  # the controller does not answer: nothing is concluded, the last state stays
    assert look(sessions, ids, executor) is Liveness.ALIVE
    with sessions() as s:
        assert s.get_one(Attempt, ids[1]).job_state == "RUNNING"


def test_a_job_gone_without_a_marker_is_unknown_not_failed(sessions: sessionmaker[Session], settings: Settings,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    fake = FakeSlurm()
    executor = SlurmExecutor(home=str(settings.home), slurm=fake)
    ids = slurm_attempt(sessions, settings)
    assert look(sessions, ids, executor) is Liveness.UNSETTLED  # not in the queue, no marker, no accounting
    assert look(sessions, ids, executor) is Liveness.UNSETTLED
    with sessions() as s:
        assert s.get_one(Attempt, ids[1]).job_state == "UNKNOWN"
        events = s.scalars(select(Event.message).where(Event.kind == "slurm")).all()
    assert len(events) == 1 and "without an exit marker" in events[0]  # said once
    # The marker appears (a shared filesystem showed it late): it settles the attempt.
    with sessions() as s:
        folder = Path(s.get_one(Attempt, ids[1]).dir)
    folder.mkdir(parents=True)
    (folder / "exit.json").write_text(json.dumps({"exit_code": 0, "ended_at": 1.0, "job_id": "42"}))
    assert look(sessions, ids, executor) is Liveness.ENDED
    (folder / "exit.json").unlink()
    monkeypatch.setattr(executor_module, "UNKNOWN_GIVE_UP_S", 0.0)  # no word for too long: lost
    assert look(sessions, ids, executor) is Liveness.VANISHED


def test_accounting_settles_a_lost_node_as_a_node_failure(sessions: sessionmaker[Session], settings: Settings) -> None:
    fake = FakeSlurm()
    fake.accounting = {"42": JobStatus("42", "n", "NODE_FAIL", "None", "node02", exit_code=1)}
    executor = SlurmExecutor(home=str(settings.home), slurm=fake)
    ids = slurm_attempt(sessions, settings)
    with sessions() as s:
        run, attempt = s.get_one(Run, ids[0]), s.get_one(Attempt, ids[1])
        executor.poll([attempt])
        seen = executor.observe(s, run, attempt)
        assert seen.liveness is Liveness.ENDED and seen.exited and seen.exited["slurm_state"] == "NODE_FAIL"
        settle(s, run, attempt, seen.exited)
        s.commit()
        assert attempt.cause == Cause.NODE_FAIL.value and "NODE_FAIL" in (attempt.reason or "")
        assert run.status == RunStatus.RETRYING.value and attempt.retry_counted  # retried with backoff, counted


def test_preempted_again_without_progress_spends_a_retry() -> None:
    first = AttemptOutcome(1, Cause.PREEMPTED, None, 120)
    free = decide(first, [], 0, RetryConfig(max_retries=1), {"batch_size": 8})
    assert free.retry and not free.counted
    again = decide(AttemptOutcome(2, Cause.PREEMPTED, None, 120), [first], 0, RetryConfig(max_retries=1),
                   {"batch_size": 8})
    assert again.retry and again.counted and "no progress" in again.reason
    stop = decide(AttemptOutcome(3, Cause.PREEMPTED, None, 120), [first], 1, RetryConfig(max_retries=1),
                  {"batch_size": 8})
    assert not stop.retry and "slurm.time_limit" in stop.reason


def test_where_a_run_runs_in_words() -> None:
    slurm = {"launch": {"executor": "slurm", "nnodes": 2, "nproc_per_node": 4}}
    pending = {"job_id": "42", "job_state": "PENDING", "job_reason": "Resources", "job_nodes": None,
               "job_state_at": 100.0, "ended_at": None}
    assert where_text(slurm, pending, now=112.0) == (
        "On Slurm: job 42 · 2 node(s) x 4 rank(s) · PENDING (Resources: waiting for nodes to free up) · "
        "status read 12s ago")
    running = {**pending, "job_state": "RUNNING", "job_reason": "None", "job_nodes": "gpu[01-02]"}
    assert where_text(slurm, running, now=101.0) == (
        "On Slurm: job 42 · 2 node(s) x 4 rank(s) · RUNNING · nodes gpu[01-02] · status read 1s ago")
    assert where_text(slurm, None) == "On Slurm: 2 node(s) x 4 rank(s); not submitted yet"
    assert where_text({"launch": {"nproc_per_node": 2}}, None) is None  # a plain local run: nothing to say
    assert "one torchrun agent per node on loopback" in (where_text({"launch": {"nnodes": 2}}, None) or "")
    assert where_short("slurm", "42", "PENDING") == "slurm 42 PENDING" and where_short("local", None, None) == "local"


class QueueingSlurm(FakeSlurm):
    """A cluster that takes every job and keeps it pending."""

    def __init__(self) -> None:
        super().__init__()
        self.submitted: list[list[str]] = []

    def sbatch(self, argv: Sequence[str], env: Mapping[str, str]) -> str:
        self.submitted.append(list(argv))
        job_id = str(100 + len(self.submitted))
        name = next(a.split("=", 1)[1] for a in argv if a.startswith("--job-name="))
        self.queue[job_id] = JobStatus(job_id, name, "PENDING", "Priority", "")
        return job_id


def test_runyard_keeps_at_most_slurm_max_jobs_in_the_queue(sessions: sessionmaker[Session], settings: Settings,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("RUNYARD_SLURM_MAX_JOBS", "2")
    fake = QueueingSlurm()
    executors = {"local": LocalExecutor(), "slurm": SlurmExecutor(home=str(settings.home), slurm=fake)}
    config = RunConfig.model_validate({"name": "s", "launch": {"executor": "slurm", "nproc_per_node": 8}})
    with sessions() as s:  # 8 ranks each: far more than this machine's 2 slots, which do not apply
        ids = [create_run(s, config, settings.runs_dir, Price(usd_per_hour=1.0, unit="slurm")).id for _ in range(3)]
        s.commit()
    scheduler = Scheduler(sessions, settings, CPU2, executors=executors)  # type: ignore[arg-type]
    try:
        scheduler.tick()
        scheduler.tick()
    finally:
        scheduler.close()
    assert len(fake.submitted) == 2
    with sessions() as s:
        runs = [s.get_one(Run, i) for i in ids]
        assert [r.status for r in runs] == ["STARTING", "STARTING", "QUEUED"]
        assert "at most 2 job(s) in the Slurm queue" in (runs[2].status_reason or "")
        attempt = s.scalars(select(Attempt).where(Attempt.run_id == ids[0])).one()
        assert (attempt.executor, attempt.job_id, attempt.job_state) == ("slurm", "101", "PENDING")


# -- a person's scancel is a cancel, not a preemption (issue 25, item 8) --------------------------

# What slurmstepd writes into the batch output (our launcher log) as it stops the batch program,
# as Slurm 22.05's src/slurmd/slurmstepd/req.c words it; the STEP line comes from runyard's own
# `scancel --signal=TERM` to the steps and must be ignored.
STEP_LINE = "slurmstepd-localhost: error: *** STEP 42.0 ON localhost CANCELLED AT 2026-11-26T20:59:58 ***\n"

CANCEL_LINES = {
    "scancel": "slurmstepd-localhost: error: *** JOB 42 ON localhost CANCELLED AT 2026-11-26T21:00:01 ***\n",
    "time limit": ("slurmstepd-localhost: error: *** JOB 42 ON localhost CANCELLED AT 2026-11-26T21:00:01 DUE TO "
                   "TIME LIMIT ***\n"),
    "preemption": ("slurmstepd-localhost: error: *** JOB 42 ON localhost CANCELLED AT 2026-11-26T21:00:01 DUE TO "
                   "PREEMPTION ***\n"),
}


def test_the_batch_program_reads_slurmstepd_s_stop_line_for_its_own_job(tmp_path: Path) -> None:
    log = tmp_path / "launcher.log"
    log.write_text("[runyard] job 42: 1 node(s)\n" + STEP_LINE + "srun: Job step aborted\n")
    assert stop_line(log, "42") is None  # runyard's own SIGTERM to the steps: no JOB line
    log.write_text(log.read_text() + CANCEL_LINES["scancel"])
    assert stop_line(log, "42") == {"at": "2026-11-26T21:00:01", "node": "localhost", "due_to": None}
    assert stop_line(log, "43") is None  # another job's line (a requeued id's old output) is not ours
    log.write_text(CANCEL_LINES["time limit"])
    assert stop_line(log, "42") == {"at": "2026-11-26T21:00:01", "node": "localhost", "due_to": "TIME LIMIT"}
    assert stop_line(tmp_path / "missing.log", "42") is None


def _ended_by_sigterm(sessions: sessionmaker[Session], ids: tuple[int, int], stop: str | None,
                      warned: bool = False) -> Path:
    """The attempt's folder as job.py leaves it after SIGTERM: the ranks saved at step 57 and wrote
    ``stopped.json``, the launcher log holds slurmstepd's line, the marker what job.py saw."""
    with sessions() as s:
        attempt = s.get_one(Attempt, ids[1])
        attempt.last_step, attempt.job_state = 57, "RUNNING"
        folder = Path(attempt.dir)
        s.commit()
    folder.mkdir(parents=True)
    (folder / "stopped.json").write_text(json.dumps({"step": 57, "checkpoint_step": 57}))
    (folder / "launcher.log").write_text(STEP_LINE + (CANCEL_LINES[stop] if stop else ""))
    marker = {"exit_code": 0, "pid": None, "started_at": 0.0, "ended_at": 1.0, "job_id": "42", "warned": warned,
              "terminated": stop is not None, "slurm_stop": stop_line(folder / "launcher.log", "42")}
    (folder / "exit.json").write_text(json.dumps(marker))
    return folder


def _settle_seen(sessions: sessionmaker[Session], ids: tuple[int, int], executor: SlurmExecutor) -> tuple[Run, Attempt]:
    with sessions() as s:
        run, attempt = s.get_one(Run, ids[0]), s.get_one(Attempt, ids[1])
        executor._tried_at = -1e18
        executor.poll([attempt])
        seen = executor.observe(s, run, attempt)
        assert seen.liveness is Liveness.ENDED
        settle(s, run, attempt, seen.exited)
        s.commit()
    with sessions() as s:
        run, attempt = s.get_one(Run, ids[0]), s.get_one(Attempt, ids[1])
        s.expunge_all()
        return run, attempt


def test_a_person_s_scancel_ends_the_run_cancelled_with_who_and_when(sessions: sessionmaker[Session],
                                                                    settings: Settings) -> None:
    fake = FakeSlurm()
    fake.accounting = {"42": JobStatus("42", "n", "CANCELLED", "None", "localhost", 0, cancelled_by="alice (uid 1000)")}
    executor = SlurmExecutor(home=str(settings.home), slurm=fake)
    ids = slurm_attempt(sessions, settings)
    _ended_by_sigterm(sessions, ids, "scancel")

    run, attempt = _settle_seen(sessions, ids, executor)

    assert run.status == RunStatus.CANCELLED.value  # not RETRYING: nothing is resubmitted
    assert attempt.status == AttemptStatus.CANCELLED.value and attempt.cause is None
    assert "cancelled outside runyard: Slurm job 42 was cancelled with scancel by alice (uid 1000) at " \
           "2026-11-26T21:00:01" in (attempt.reason or "")
    assert "at step 57" in (attempt.reason or "") and f"runyard resume {run.id}" in (attempt.reason or "")
    assert not fake.cancelled  # runyard sent nothing itself


def test_without_accounting_the_scancel_is_still_a_cancel_with_its_time(sessions: sessionmaker[Session],
                                                                       settings: Settings) -> None:
    executor = SlurmExecutor(home=str(settings.home), slurm=FakeSlurm())
    ids = slurm_attempt(sessions, settings)
    _ended_by_sigterm(sessions, ids, "scancel")

    run, attempt = _settle_seen(sessions, ids, executor)

    assert run.status == RunStatus.CANCELLED.value
    assert "cancelled with scancel at 2026-11-26T21:00:01 (on localhost)" in (attempt.reason or "")


@pytest.mark.parametrize(("stop", "warned", "said"), [
    ("time limit", True, "Slurm's warning signal"),  # USR2 came first, then the limit's SIGTERM
    ("preemption", False, "SIGTERM from outside runyard"),
    (None, True, "Slurm's warning signal"),  # USR2 alone: job.py forwarded SIGTERM to the steps
])
def test_slurm_s_own_stops_still_resubmit_without_a_retry(sessions: sessionmaker[Session], settings: Settings,
                                                          stop: str | None, warned: bool, said: str) -> None:
    executor = SlurmExecutor(home=str(settings.home), slurm=FakeSlurm())
    ids = slurm_attempt(sessions, settings)
    _ended_by_sigterm(sessions, ids, stop, warned=warned)

    run, attempt = _settle_seen(sessions, ids, executor)

    assert run.status == RunStatus.RETRYING.value and attempt.cause == Cause.PREEMPTED.value
    assert said in (attempt.reason or "") and not attempt.retry_counted


def test_a_job_that_left_no_marker_and_ended_cancelled_is_a_person_s_cancel(
        sessions: sessionmaker[Session], settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    # KillWait's SIGKILL can end job.py before it writes the marker; squeue still shows the state
    # (the wait for a late marker is cut to nothing here).
    monkeypatch.setattr(executor_module, "MARKER_WAIT_S", 0.0)
    fake = FakeSlurm()
    fake.queue["42"] = JobStatus("42", "n", "CANCELLED", "None", "localhost", exit_code=-15)
    executor = SlurmExecutor(home=str(settings.home), slurm=fake)
    ids = slurm_attempt(sessions, settings)
    with sessions() as s:
        s.get_one(Attempt, ids[1]).job_state = "RUNNING"
        s.commit()

    run, attempt = _settle_seen(sessions, ids, executor)

    assert run.status == RunStatus.CANCELLED.value
    assert "Slurm job 42 ended CANCELLED in Slurm (a scancel outside runyard)" in (attempt.reason or "")


def test_sacct_s_state_names_who_cancelled() -> None:
    assert canceller("CANCELLED by 0") == "root (uid 0)"
    assert canceller("CANCELLED by 4000000") == "uid 4000000"
    assert canceller("CANCELLED") is None and canceller("TIMEOUT") is None
