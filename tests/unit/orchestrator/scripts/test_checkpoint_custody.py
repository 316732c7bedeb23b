"""A script's own checkpoint files as checkpoint rows: versions of a file rewritten in place, the
checks before an attempt starts from one, pinning by copy, pause and rerun of script runs."""

from __future__ import annotations

import io
import os
import time
import traceback
import zipfile
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

import orchestrator.scheduler.attempts as attempts_module
import orchestrator.scripts.checkpoint_custody as sc
import orchestrator.submission as submission
from app.run_panels import verified_words
from db.file_versions import sha256_of
from db.metricstore import write_points
from db.models import Attempt, Checkpoint, Event, Run
from db.queries import checkpoints_of
from db.requests import (
    PREEXISTING,
    RequestRefused,
    checkpoints_dir,
    request_cancel,
    request_rerun,
    request_resume,
    set_pinned,
)
from db.states import AttemptStatus, RunStatus, transition
from db.vocabulary.config import parse_config
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings
from orchestrator.cli.read import checkpoint_line
from orchestrator.scheduler.loop import Scheduler
from orchestrator.scheduler.outcomes import settle
from orchestrator.scripts.checkpoint_custody import (
    TRUNCATED,
    Known,
    _keep_aside,
    plan_versions,
    record_versions,
    resume_point,
    truncated_zip,
)
from orchestrator.scripts.checkpoint_finder import CheckpointFile, CheckpointFiles
from orchestrator.scripts.checkpoint_steps import step_in_checkpoint
from orchestrator.submission import fork, submit
from trainer.checkpoint.history import AdoptedFile, CheckpointHistory
from trainer.checkpoint.manager import CheckpointManager
from trainer.checkpoint.writing import SaveResult
from trainer.context import RunContext, context_from_env

CPU2 = Inventory(kind="cpu", slots=2)


def file(path: str, size: int, mtime: float, sha: str | None = "ab" * 32, stable: bool = True) -> CheckpointFile:
    return CheckpointFile(Path(path), size, mtime, sha, stable)


def known(id: int, origin: str, size: int, mtime: float, *, path: str | None = None, verified: bool = True,
          pinned: bool = False) -> Known:
    return Known(id, origin, path or origin, size, mtime, verified, pinned)


# -- versions (pure) -------------------------------------------------------------------------


def test_a_file_rewritten_in_place_is_a_new_version_and_supersedes_the_old_one() -> None:
    plan = plan_versions([known(1, "/w/out/ckpt.pt", 100, 10.0)], [file("/w/out/ckpt.pt", 120, 20.0)])
    assert [str(f.path) for f in plan.new] == ["/w/out/ckpt.pt"]
    assert [row for row, _ in plan.overwritten] == [1]


def test_the_same_version_is_recorded_once_and_verified_when_its_hash_is_known() -> None:
    plan = plan_versions([known(1, "/w/s.pt", 100, 10.0, verified=False)], [file("/w/s.pt", 100, 10.0)])
    assert plan.new == [] and plan.overwritten == []
    assert plan.verified == [(1, "ab" * 32)]


def test_a_file_still_being_written_is_not_recorded() -> None:
    plan = plan_versions([], [file("/w/s.pt", 50, 30.0, sha=None, stable=False)])
    assert plan.new == []


def test_a_pinned_version_is_not_superseded_its_bytes_are_a_copy() -> None:
    pinned = known(1, "/w/out/ckpt.pt", 100, 10.0, path="/runs/run-1/checkpoints/script/1/ckpt.pt", pinned=True)
    plan = plan_versions([pinned], [file("/w/out/ckpt.pt", 120, 20.0)])
    assert len(plan.new) == 1 and plan.overwritten == []


def test_a_file_the_script_deleted_is_marked_removed() -> None:
    plan = plan_versions([known(1, "/w/ckpts/a.pt", 100, 10.0), known(2, "/w/ckpts/b.pt", 100, 11.0)],
                         [file("/w/ckpts/b.pt", 100, 11.0)])
    assert plan.removed == [1]


# -- with a database ---------------------------------------------------------------------------


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    folder = tmp_path / "work"
    (folder / "out").mkdir(parents=True)
    (folder / "train.py").write_text("print('hi')\n")
    return folder


def script_run(sessions: sessionmaker[Session], settings: Settings, workdir: Path, **workload: object) -> int:
    config = parse_config({"name": "s", "workload": {"kind": "script", "script": str(workdir / "train.py"),
                                                     "workdir": str(workdir), **workload}})
    return submit(sessions, settings, config, CPU2)


def add_attempt(session: Session, run_id: int, number: int, last_step: int | None,
                status: AttemptStatus = AttemptStatus.RUNNING) -> Attempt:
    attempt = Attempt(run_id=run_id, number=number, status=status.value, dir="/tmp/none", started_at=time.time() - 60,
                      last_step=last_step)
    session.add(attempt)
    session.flush()
    return attempt


def report(session: Session, attempt: Attempt, step: int, at: float) -> None:
    """The script reported ``step`` at ``at`` (a printed line runyard read)."""
    points = [{"run_id": attempt.run_id, "attempt": attempt.number, "rank": 0, "step": step, "key": "loss",
               "value": 1.0, "wall_time": at}]
    write_points(session.connection(), points)


def write(path: Path, data: bytes, mtime: float) -> None:
    path.write_bytes(data)
    os.utime(path, (mtime, mtime))


def saved(session: Session, run: Run, attempt: Attempt, ckpt: Path, data: bytes, at: float,
          step: int | None = None) -> None:
    """The script reported ``step`` (if given) a second before it wrote ``data`` to ``ckpt`` at
    ``at``; runyard then looked at the file."""
    if step is not None:
        report(session, attempt, step, at - 1)
    write(ckpt, data, at)
    record_versions(session, run, attempt, look(ckpt))


def look(path: Path) -> list[CheckpointFile]:
    st = path.stat()
    return [CheckpointFile(path, st.st_size, st.st_mtime, sha256_of(path), True)]


def rows(session: Session, run_id: int) -> list[Checkpoint]:
    return list(session.scalars(select(Checkpoint).where(Checkpoint.run_id == run_id).order_by(Checkpoint.id)))


def test_versions_get_the_attempts_step_and_the_old_one_is_marked_overwritten(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    ckpt = workdir / "out" / "ckpt.pt"
    now = time.time()
    with sessions() as s:
        run = s.get(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        report(s, attempt, 249, now - 11)
        write(ckpt, b"v1" * 100, now - 10)
        report(s, attempt, 250, now - 9)  # read after the save: not done at the save
        assert record_versions(s, run, attempt, look(ckpt)) == 1
        assert record_versions(s, run, attempt, look(ckpt)) == 0  # the same version, seen again
        report(s, attempt, 499, now - 6)
        write(ckpt, b"v2" * 120, now - 5)
        record_versions(s, run, attempt, look(ckpt))
        s.commit()
        first, second = rows(s, run_id)
    assert (first.step, first.source, first.origin, first.verified) == (249, "script", str(ckpt), True)
    assert first.deleted and first.deleted_reason.startswith("overwritten by the script at ")
    assert (second.step, second.deleted, second.sha256) == (499, False, sha256_of(ckpt))


def test_pinning_copies_the_file_out_of_the_scripts_reach(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    ckpt = workdir / "out" / "ckpt.pt"
    with sessions() as s:
        run = s.get(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=100)
        saved(s, run, attempt, ckpt, b"old" * 50, time.time() - 10)
        s.commit()
        row = rows(s, run_id)[0]
        set_pinned(s, run_id, 0, True, checkpoint_id=row.id)
        s.commit()
        copy = Path(row.path)
        assert copy != ckpt and copy.is_relative_to(Path(run.run_dir)) and row.pinned
        assert sha256_of(copy) == row.sha256 and copy.stat().st_mtime == pytest.approx(row.file_mtime)
        write(ckpt, b"new" * 70, time.time())  # the script writes over its file: the pinned copy stays
        record_versions(s, run, attempt, look(ckpt))
        s.commit()
        old, new = rows(s, run_id)
        assert not old.deleted and sha256_of(copy) == old.sha256 and new.origin == str(ckpt)


def test_resume_checks_the_file_and_falls_back_to_the_newest_intact_version(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    ckpt = workdir / "out" / "ckpt.pt"
    with sessions() as s:
        run = s.get(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        saved(s, run, attempt, ckpt, b"a" * 100, time.time() - 20, step=100)
        saved(s, run, attempt, ckpt, b"b" * 200, time.time() - 10, step=200)
        s.commit()
        older, newer = rows(s, run_id)
        # A resume names the older version, whose bytes the script overwrote (it was not pinned).
        older.deleted = False
        run.resume_checkpoint_id = older.id
        chosen = resume_point(s, run, 2)
        assert chosen is not None and (chosen.checkpoint_id, chosen.step, chosen.path) == (newer.id, 200, str(ckpt))
        events = [e.message for e in s.scalars(select(Event).where(Event.run_id == run_id, Event.kind == "resume"))]
        assert any("was overwritten by the script; starting from the newest recorded version" in m for m in events)
        # Half-written now: neither version is the file on disk, so nothing is handed over.
        with ckpt.open("ab") as f:
            f.write(b"partial")
        run.resume_checkpoint_id = None
        assert resume_point(s, run, 2) is None


def test_resume_from_a_pinned_older_version_puts_it_back_and_keeps_the_newer_one(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt", resume_args=["--resume"])
    ckpt = workdir / "out" / "ckpt.pt"
    with sessions() as s:
        run = s.get(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        saved(s, run, attempt, ckpt, b"a" * 100, time.time() - 20, step=100)
        s.commit()
        older = rows(s, run_id)[0]
        set_pinned(s, run_id, 0, True, checkpoint_id=older.id)
        saved(s, run, attempt, ckpt, b"b" * 200, time.time() - 10, step=200)
        attempt.status = AttemptStatus.FAILED.value
        transition(s, run_id, RunStatus.STARTING, "t")
        transition(s, run_id, RunStatus.FAILED, "t")
        s.commit()
        assert request_resume(s, run_id, checkpoint_id=older.id) == 100
        chosen = resume_point(s, run, 2)
        s.commit()
        newer = rows(s, run_id)[1]
        assert chosen is not None and chosen.path == str(ckpt) and chosen.step == 100
        assert ckpt.read_bytes() == b"a" * 100  # the chosen version is where the script looks
        assert Path(newer.path) != ckpt and Path(newer.path).read_bytes() == b"b" * 200  # kept in the run's folder


def test_pause_of_a_plain_script_without_a_checkpoint_source_is_refused(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    plain = script_run(sessions, settings, workdir)
    with_glob = script_run(sessions, settings, workdir, checkpoint_glob="snapshot.pt")
    with sessions() as s:
        for run_id in (plain, with_glob):
            transition(s, run_id, RunStatus.STARTING, "t")
            transition(s, run_id, RunStatus.RUNNING, "t")
        with pytest.raises(RequestRefused, match=r"no checkpoint source.*workload\.checkpoint_glob.*SDK"):
            request_cancel(s, plain, mode="pause")
        assert s.get(Run, plain).status == "RUNNING"
        message = request_cancel(s, with_glob, mode="pause")
        assert "snapshot.pt" in message and s.get(Run, with_glob).status == "PAUSING"
        assert "cancel requested" in request_cancel(s, plain)  # cancel stays possible


def test_rerun_queues_a_finished_script_run_without_a_checkpoint(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    with sessions() as s:
        transition(s, run_id, RunStatus.STARTING, "t")
        with pytest.raises(RequestRefused, match="only a finished run can be rerun"):
            request_rerun(s, run_id)
        transition(s, run_id, RunStatus.FAILED, "t")
        assert str(workdir) in request_rerun(s, run_id)
        run = s.get(Run, run_id)
        assert run.status == "QUEUED" and run.start_fresh and run.resume_checkpoint_id is None
        assert resume_point(s, run, 2) is None


def test_a_file_adopted_through_the_sdk_is_a_script_checkpoint_a_retry_starts_from(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir)
    ckpt = workdir / "out" / "ckpt.pt"
    history = CheckpointHistory(run_id, 1, parse_config({}).checkpoint, manager=None)  # type: ignore[arg-type]
    with sessions() as s:
        add_attempt(s, run_id, 1, last_step=300, status=AttemptStatus.FAILED)
        for step, data in ((100, b"a" * 10), (200, b"b" * 20)):
            write(ckpt, data, time.time() - 300 + step)
            st = ckpt.stat()
            history.adopted(s.connection(), [AdoptedFile(str(ckpt), step, st.st_size, st.st_mtime, sha256_of(ckpt),
                                                         0.01, time.time())])
        s.commit()
        first, second = rows(s, run_id)
        assert first.deleted and "overwritten" in first.deleted_reason
        assert (second.source, second.step, second.verified, second.sha256) == ("script", 200, True, sha256_of(ckpt))
        chosen = resume_point(s, s.get(Run, run_id), 2)
        assert chosen is not None and (chosen.path, chosen.step) == (str(ckpt), 200)


def test_the_ranks_get_the_resume_path_and_its_step() -> None:
    env = RunContext(run_id=1, attempt=2, db_url="sqlite://", run_dir=Path("/r"), attempt_dir=Path("/r/a/2"),
                     resume_step=200, resume_path=Path("/w/out/ckpt.pt")).to_env()
    assert (env["RUNYARD_RESUME_PATH"], env["RUNYARD_RESUME_STEP"]) == ("/w/out/ckpt.pt", "200")
    assert "RUNYARD_RESUME_DIR" not in env
    back = context_from_env(env)
    assert (back.resume_path, back.resume_step, back.resume_dir) == (Path("/w/out/ckpt.pt"), 200, None)


# -- what a retry must not start from, and where the file work happens -------------------------


def zip_bytes(payload: bytes) -> bytes:
    """What torch.save writes by default: a zip archive."""
    buf = io.BytesIO()
    with zipfile.ZipFile(buf, "w") as z:
        z.writestr("archive/data.pkl", payload)
    return buf.getvalue()


def test_a_file_that_was_there_before_the_run_started_is_not_chosen_for_a_retry(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt", resume_args=["--resume"])
    ckpt = workdir / "out" / "ckpt.pt"
    write(ckpt, b"someone else's" * 10, time.time() - 3600)  # a previous experiment's file
    with sessions() as s:
        run = s.get(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        record_versions(s, run, attempt, look(ckpt))
        s.commit()
        (row,) = rows(s, run_id)
        assert row.verified and not row.deleted and row.refused_reason.startswith(PREEXISTING)
        assert resume_point(s, run, 2) is None  # a retry starts from scratch
        assert "has been recorded yet" in request_cancel(s, run_id, mode="pause")  # nor does a pause count it
        # A person may still choose it explicitly.
        attempt.status = AttemptStatus.FAILED.value
        s.commit()
        s.refresh(run)
        transition(s, run_id, RunStatus.FAILED, "t")
        request_resume(s, run_id, checkpoint_id=row.id)
        chosen = resume_point(s, run, 2)
        assert chosen is not None and chosen.checkpoint_id == row.id


def test_a_truncated_zip_is_refused_and_not_handed_over(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    ckpt = workdir / "out" / "ckpt.pt"
    good = zip_bytes(b"weights" * 100)
    assert not truncated_zip_of(workdir / "x.pt", good) and truncated_zip_of(workdir / "y.pt", good[: len(good) // 2])
    with sessions() as s:
        run = s.get(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        saved(s, run, attempt, ckpt, good, time.time() - 20)
        write(ckpt, good[: len(good) // 2], time.time() - 10)  # the rank was killed in torch.save
        record_versions(s, run, attempt, look(ckpt))
        s.commit()
        first, second = rows(s, run_id)
        assert first.verified and first.deleted and TRUNCATED in first.deleted_reason
        assert not second.verified and second.refused_reason == TRUNCATED and not second.deleted
        record_versions(s, run, attempt, look(ckpt))  # seen again, hashed: still not verified
        s.commit()
        assert not rows(s, run_id)[1].verified
        assert resume_point(s, run, 2) is None


def truncated_zip_of(path: Path, data: bytes) -> bool:
    path.write_bytes(data)
    return truncated_zip(path)


def test_a_retry_of_a_fork_before_its_own_save_starts_from_the_forks_origin(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    parent_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    ckpt = workdir / "out" / "ckpt.pt"
    with sessions() as s:
        run = s.get(Run, parent_id)
        attempt = add_attempt(s, parent_id, 1, last_step=None)
        saved(s, run, attempt, ckpt, b"p" * 100, time.time() - 20, step=100)
        s.commit()
        (origin,) = rows(s, parent_id)
    fork_id = fork(sessions, settings, parent_id, None, [], CPU2, checkpoint_id=origin.id)
    with sessions() as s:
        child = s.get(Run, fork_id)
        assert child.parent_checkpoint_id == origin.id
        chosen = resume_point(s, child, 2)  # attempt 1 failed before the fork saved anything
        assert chosen is not None and (chosen.checkpoint_id, chosen.step) == (origin.id, 100)


def test_a_retry_of_a_fork_of_runyards_own_checkpoint_starts_from_it(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    parent_id = script_run(sessions, settings, workdir)
    child_id = script_run(sessions, settings, workdir)
    with sessions() as s:
        parent = s.get(Run, parent_id)
        own = Checkpoint(run_id=parent_id, attempt=1, step=40, path=f"{checkpoints_dir(parent)}/step-40/state.pt",
                         bytes=1, sha256="", params_digest="", metrics_json="{}", blocked_s=0.0, total_s=0.0,
                         created_at=time.time(), verified=True, pinned=True, deleted=False)
        s.add(own)
        s.flush()
        child = s.get(Run, child_id)
        child.parent_checkpoint_id = own.id
        assert attempts_module.resume_point(s, child, 2) == (f"{checkpoints_dir(parent)}/step-40", 40)


def test_when_the_chosen_version_cannot_be_put_in_place_the_resume_args_are_left_out(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt", resume_args=["--resume"])
    ckpt = workdir / "out" / "ckpt.pt"
    with sessions() as s:
        run = s.get(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        saved(s, run, attempt, ckpt, b"a" * 100, time.time() - 20)
        s.commit()
        older = rows(s, run_id)[0]
        set_pinned(s, run_id, 0, True, checkpoint_id=older.id)
        write(ckpt, b"b" * 200, time.time() - 10)
        s.commit()
        run.resume_checkpoint_id = older.id

        def no_space(*_: object, **__: object) -> None:
            raise OSError(28, "No space left on device")

        monkeypatch.setattr(sc, "copy_verified", no_space)
        chosen = resume_point(s, run, 2)
        assert chosen is not None and chosen.path == older.path and not chosen.with_args
        events = [e.message for e in s.scalars(select(Event).where(Event.run_id == run_id, Event.kind == "resume"))]
        assert any("without workload.resume_args" in m for m in events)


def test_an_unrecorded_file_moved_aside_never_replaces_an_earlier_one(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    ckpt = workdir / "out" / "ckpt.pt"
    with sessions() as s:
        run = s.get(Run, run_id)
        for data in (b"first", b"second"):
            ckpt.write_bytes(data)
            _keep_aside(s, run, 2, ckpt)
    asides = sorted(p.read_bytes() for p in (workdir / "out").glob("ckpt.pt.before-attempt-2*"))
    assert asides == [b"first", b"second"] and not ckpt.exists()


def test_the_starting_point_is_placed_before_the_attempts_rows_are_written(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def no_launch(*_: object, **__: object) -> list[str]:
        raise OSError("not launched in this test")

    order: list[str] = []

    def spy(name: str, real: object) -> object:
        def wrapped(*args: object, **kwargs: object) -> object:
            order.append(name)
            return real(*args, **kwargs)  # type: ignore[operator]
        return wrapped

    monkeypatch.setattr(attempts_module.checkpoint_custody, "resume_point",
                        spy("resume_point", attempts_module.checkpoint_custody.resume_point))
    monkeypatch.setattr(attempts_module, "transition", spy("transition", attempts_module.transition))
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    with sessions() as s:
        Scheduler(sessions, settings, CPU2, command=no_launch)._start_attempt(s, s.get(Run, run_id), [])
        attempt = s.scalars(select(Attempt).where(Attempt.run_id == run_id)).one()
    assert attempt.number == 1 and order[:2] == ["resume_point", "transition"]
    # A fork copies the parent's file before the fork's row is inserted.
    ckpt = workdir / "out" / "ckpt.pt"
    with sessions() as s:
        run = s.get(Run, run_id)
        saved(s, run, attempt, ckpt, b"v" * 10, time.time())
        s.commit()
        (row,) = rows(s, run_id)
    order.clear()
    monkeypatch.setattr(submission, "pin_script_copy", spy("copy", submission.pin_script_copy))
    monkeypatch.setattr(submission, "create_run", spy("create_run", submission.create_run))
    submission.fork(sessions, settings, run_id, None, [], CPU2, checkpoint_id=row.id)
    assert order == ["copy", "create_run"]


def test_a_pause_while_the_script_rewrites_its_file_says_the_next_recorded_version_counts(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    ckpt = workdir / "out" / "ckpt.pt"
    with sessions() as s:
        run = s.get(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        saved(s, run, attempt, ckpt, b"a" * 100, time.time() - 20)
        s.commit()
        assert "as written at step" in request_cancel(s, run_id, mode="pause")
        s.rollback()
        write(ckpt, b"b" * 50, time.time())  # being written: not recorded yet
        assert "is being rewritten" in request_cancel(s, run_id, mode="pause")


def test_a_checkpoint_folder_holds_its_own_step_is_pinned_whole_and_put_back(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="hf_out/checkpoint-*")
    folder = workdir / "hf_out" / "checkpoint-350"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * 300)
    (folder / "trainer_state.json").write_text('{"global_step": 350}')
    finder = CheckpointFiles(workdir, ["hf_out/checkpoint-*"])
    with sessions() as s:
        run = s.get(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        report(s, attempt, 360, time.time())  # the script went on after saving
        for _ in range(2):
            record_versions(s, run, attempt, finder.scan())
        s.commit()
        (row,) = rows(s, run_id)
        assert (row.step, row.bytes, row.verified, row.sha256) == (350, 300 + 20, True, sha256_of(folder))
        set_pinned(s, run_id, 0, True, checkpoint_id=row.id)
        s.commit()
        assert Path(row.path).is_dir() and Path(row.path) != folder and sha256_of(row.path) == row.sha256
        for f in folder.iterdir():  # the Trainer's save_total_limit removed it
            f.unlink()
        folder.rmdir()
        attempt.status = AttemptStatus.FAILED.value
        s.commit()
        chosen = resume_point(s, run, 2)
        s.commit()
    assert chosen is not None and (chosen.path, chosen.step) == (str(folder), 350)
    assert (folder / "model.safetensors").read_bytes() == b"w" * 300


def test_keep_best_by_a_metric_no_checkpoint_carries_is_said_with_the_names_seen(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir)
    root = tmp = workdir / "ckpts"
    config = parse_config({"checkpoint": {"keep_last": 1, "keep_best": 1, "best_metric": "eval_loss"}}).checkpoint
    history = CheckpointHistory(run_id, 1, config, CheckpointManager(root, async_save=False))
    with sessions() as s:
        add_attempt(s, run_id, 1, last_step=300)
        for step in (100, 200, 300):
            history.record(s.connection(), [SaveResult(step, tmp / f"step-{step}", 1, "0", "0", 0.0, 0.0,
                                                       {"val_loss": 1.0 / step, "train_loss": 2.0})])
        s.commit()
        said = list(s.scalars(select(Event.message).where(Event.run_id == run_id, Event.kind == "checkpoint")))
    assert said == ["checkpoint.keep_best = 1 keeps nothing by checkpoint.best_metric = 'eval_loss': no checkpoint "
                    "carries it; the metrics the checkpoints carry: 'train_loss', 'val_loss' (set "
                    "checkpoint.best_metric to one of them)"]


# -- issue 52: whose a file is, complete folders, a failed load, accelerate's names ------------


def ended(s: Session, run_id: int, attempt: Attempt, tmp_path: Path, *, last_step: int, code: int = 1,
          stop: str | None = None) -> Run:
    """Settle ``attempt`` of a RUNNING (or, with ``stop``, stopping) run as the scheduler does when
    its processes are gone, with exit ``code``; the run as it is then."""
    attempt.dir = str(tmp_path / "attempts" / str(attempt.number))
    Path(attempt.dir).mkdir(parents=True, exist_ok=True)
    attempt.last_step, attempt.stop_reason = last_step, stop
    run = s.get(Run, run_id)
    for status in (RunStatus.STARTING, RunStatus.RUNNING, *((RunStatus.PAUSING,) if stop else ())):
        if run.status != status.value:
            transition(s, run_id, status, "t")
    settle(s, run, attempt, {"exit_code": code, "ended_at": time.time()})
    s.commit()
    return run


def test_a_file_that_predates_the_run_is_resumed_from_only_by_name_and_says_whose_it_is(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path, tmp_path: Path) -> None:
    """Issue 52 item 1: a nanoGPT run paused at step 70, before its first own save, was resumed from
    another run's ckpt.pt at iteration 1500 (and lost "0 steps")."""
    ckpt = workdir / "out" / "ckpt.pt"
    earlier = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    with sessions() as s:  # an earlier run in the same folder saved ckpt.pt at iteration 1500
        attempt = add_attempt(s, earlier, 1, last_step=1500, status=AttemptStatus.SUCCEEDED)
        attempt.started_at = time.time() - 7200
        buf = io.BytesIO()
        torch.save({"iter_num": 1500}, buf)  # nanoGPT's checkpoint at iteration 1500
        saved(s, s.get(Run, earlier), attempt, ckpt, buf.getvalue(), time.time() - 3600, step=1500)
        s.commit()
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt", resume_args=["--init_from=resume"])
    with sessions() as s:
        run = s.get(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        report(s, attempt, 70, time.time() - 5)
        (stale,) = look(ckpt)
        record_versions(s, run, attempt, [replace(stale, step=step_in_checkpoint(ckpt))])  # as the finder reads it
        s.commit()
        (stale,) = rows(s, run_id)
        assert stale.verified and stale.refused_reason.startswith(PREEXISTING)
        assert f"probably run {earlier}'s ('s'), which recorded the same file at step 1500" in stale.refused_reason
        run = ended(s, run_id, attempt, tmp_path, last_step=70, code=0, stop="pause")
        assert run.status == "PAUSED"
        assert (attempt.last_checkpoint_step, attempt.steps_lost) == (None, 70)  # steps lost from its own only
        with pytest.raises(RequestRefused) as refused:
            request_resume(s, run_id)  # the newest: none of its own
        said = str(refused.value)
        assert f"run {run_id} has no verified checkpoint of its own to start from" in said
        assert f"`runyard resume {run_id} --checkpoint {stale.id}`" in said and f"probably run {earlier}'s" in said
        with pytest.raises(RequestRefused, match="no verified checkpoint of its own at step 1500"):
            request_resume(s, run_id, step=1500)
        assert request_resume(s, run_id, checkpoint_id=stale.id) == 1500  # a person named it
        s.commit()
        detail = checkpoints_of(s, run_id)
    assert f"probably run {earlier}'s" in checkpoint_line(detail[0])  # runyard show
    assert verified_words(detail[0]).startswith("yes; not this run's own: existed before the run started")
    with sessions() as s:  # a file nobody recorded says so
        other = script_run(sessions, settings, workdir, checkpoint_glob="out/other.pt")
        write(workdir / "out" / "other.pt", b"x" * 10, time.time() - 60)
        attempt = add_attempt(s, other, 1, last_step=None)
        record_versions(s, s.get(Run, other), attempt, look(workdir / "out" / "other.pt"))
        assert rows(s, other)[0].refused_reason.endswith("written before this run started, by no run runyard knows")


def test_a_trainer_folder_killed_mid_save_is_refused_and_the_retry_starts_from_the_one_before(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    """Issue 52 item 2: the Trainer's checkpoint-50 with its weights but no trainer_state.json (a
    rank killed mid-save) was verified, handed to every retry, and the run FAILED on it."""
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="hf_out/checkpoint-*")
    whole, broken = workdir / "hf_out" / "checkpoint-40", workdir / "hf_out" / "checkpoint-50"
    for folder in (whole, broken):
        folder.mkdir(parents=True)
        (folder / "model.safetensors").write_bytes(b"w" * 300)
        (folder / "training_args.bin").write_bytes(b"a" * 30)
    (whole / "trainer_state.json").write_text('{"global_step": 40}')
    finder = CheckpointFiles(workdir, ["hf_out/checkpoint-*"])
    with sessions() as s:
        run = s.get(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        for _ in range(3):
            record_versions(s, run, attempt, finder.scan())
        finder.writer_gone()  # the attempt ended (ScriptWatch.finish)
        for _ in range(2):
            record_versions(s, run, attempt, finder.scan())
        attempt.status = AttemptStatus.FAILED.value
        s.commit()
        by_step = {c.step: c for c in rows(s, run_id)}
        assert by_step[40].verified and by_step[40].refused_reason is None
        assert not by_step[50].verified and by_step[50].refused_reason == (
            "incomplete: no trainer_state.json, which the Hugging Face Trainer writes last: its save did not finish")
        chosen = resume_point(s, run, 2)
    assert chosen is not None and (chosen.path, chosen.step) == (str(whole), 40)


def unloadable(path: Path) -> str:
    """What torch.load raised on ``path``, as the rank's traceback."""
    try:
        torch.load(path, weights_only=True)
    except Exception:  # noqa: BLE001 - whatever a broken file makes torch.load raise
        return traceback.format_exc()
    raise AssertionError(f"{path} loaded")


def failed_to_load(attempt: Attempt, tmp_path: Path, path: Path) -> None:
    """The attempt's rank 0 died in torch.load(path): its stderr, as torchrun keeps it."""
    stderr = tmp_path / "attempts" / str(attempt.number) / "ranks" / "r_1" / "attempt_0" / "0" / "stderr.log"
    stderr.parent.mkdir(parents=True)
    stderr.write_text(f"[rank0]: loading {path}\n" + unloadable(path))


def test_a_retry_that_fails_loading_its_checkpoint_falls_back_to_the_version_before(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path, tmp_path: Path) -> None:
    """Issue 52 item 2: a version that merely looked complete was handed to every retry, which
    failed in the script's load each time, and the run FAILED as the user's repeated error."""
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="ckpts/*.pt", resume_args=["--resume"])
    (workdir / "ckpts").mkdir()
    older, newer = workdir / "ckpts" / "step_100.pt", workdir / "ckpts" / "step_200.pt"
    buf = io.BytesIO()
    torch.save({"step": 200}, buf, _use_new_zipfile_serialization=False)  # a format with no end to check
    with sessions() as s:
        run = s.get(Run, run_id)
        first = add_attempt(s, run_id, 1, last_step=None)
        first.started_at = time.time() - 120
        torch.save({"step": 100}, older)
        saved(s, run, first, older, older.read_bytes(), time.time() - 60, step=100)
        saved(s, run, first, newer, buf.getvalue()[:-20], time.time() - 30, step=200)  # cut short, unseen
        s.commit()
        assert [c.verified for c in rows(s, run_id)] == [True, True]
        ended(s, run_id, first, tmp_path, last_step=205, code=1)
        assert run.status == "RETRYING"
        chosen = resume_point(s, run, 2)
        assert chosen is not None and chosen.path == str(newer)
        second = add_attempt(s, run_id, 2, last_step=None)
        second.started_at, second.resume_path, second.resume_step = time.time(), chosen.path, chosen.step
        failed_to_load(second, tmp_path, newer)
        run = ended(s, run_id, second, tmp_path, last_step=None, code=1)
        by_step = {c.step: c for c in rows(s, run_id)}
        assert run.status == "RETRYING", run.status_reason
        assert second.cause == "USER_ERROR"
        assert by_step[200].refused_reason.startswith("attempt 2 failed loading it: ")
        assert f"the next attempt starts from the version before it, checkpoint {by_step[100].id}" in run.status_reason
        chosen = resume_point(s, run, 3)
        assert chosen is not None and (chosen.path, chosen.step) == (str(older), 100)
        with pytest.raises(RequestRefused):
            request_resume(s, run_id, step=200)  # never again by step


def test_accelerate_checkpoint_folders_are_at_the_step_reported_when_they_appeared(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path, tmp_path: Path) -> None:
    """Issue 52 item 9: ``checkpoints/checkpoint_2`` is accelerate's third save, at whatever step;
    read as step 2 it made "steps lost 158" and put progress back to 2/300."""
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="checkpoints/checkpoint_*")
    folder = workdir / "checkpoints" / "checkpoint_2"
    with sessions() as s:
        run = s.get(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        report(s, attempt, 150, time.time() - 30)  # the loop's metric line at step 150, then save_state()
        folder.mkdir(parents=True)
        for name in ("model.safetensors", "optimizer.bin", "scheduler.bin", "random_states_0.pkl"):
            write(folder / name, b"s" * 50, time.time() - 20)
        finder = CheckpointFiles(workdir, ["checkpoints/checkpoint_*"], settle_s=0.0)
        for _ in range(2):
            record_versions(s, run, attempt, finder.scan())
        s.commit()
        (row,) = rows(s, run_id)
        assert row.step == 150 and row.verified
        ended(s, run_id, attempt, tmp_path, last_step=160, code=1)
        assert (attempt.last_checkpoint_step, attempt.steps_lost) == (150, 10)
        chosen = resume_point(s, run, 2)
        assert chosen is not None and chosen.step == 150
