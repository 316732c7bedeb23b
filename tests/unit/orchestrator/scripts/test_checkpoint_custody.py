"""A script's own checkpoint files as checkpoint rows (orchestrator/scripts/checkpoint_custody.py):
versions of a file rewritten in place (the plan, without a database, then recorded), pinning by
copy, the checks before an attempt starts from one, a file adopted through the SDK, and forks;
what is refused is test_checkpoint_custody_refusals.py's.
"""

from __future__ import annotations

import time
from pathlib import Path

import pytest
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

import orchestrator.scheduler.attempts as attempts_module
import orchestrator.scripts.checkpoint_custody as sc
from db.file_versions import sha256_of
from db.models import Checkpoint, Event, Run
from db.requests import checkpoints_dir, request_resume, set_pinned
from db.states import AttemptStatus, RunStatus, transition
from db.vocabulary.config import parse_config
from db.vocabulary.settings import Settings
from orchestrator.scripts.checkpoint_custody import Known, _keep_aside, plan_versions, record_versions, resume_point
from orchestrator.scripts.checkpoint_finder import CheckpointFile
from orchestrator.submission import fork
from tests.unit.orchestrator.scripts.script_checkpoints import (
    CPU2,
    add_attempt,
    look,
    report,
    rows,
    saved,
    script_run,
    workdir,
    write,
)
from trainer.checkpoint.history import AdoptedFile, CheckpointHistory

__all__ = ["workdir"]  # the fixtures, from the helper module


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


def test_versions_get_the_attempts_step_and_the_old_one_is_marked_overwritten(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    ckpt = workdir / "out" / "ckpt.pt"
    now = time.time()
    with sessions() as s:
        run = s.get_one(Run, run_id)
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
    assert first.deleted and (first.deleted_reason or "").startswith("overwritten by the script at ")
    assert (second.step, second.deleted, second.sha256) == (499, False, sha256_of(ckpt))


def test_pinning_copies_the_file_out_of_the_scripts_reach(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    ckpt = workdir / "out" / "ckpt.pt"
    with sessions() as s:
        run = s.get_one(Run, run_id)
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
        run = s.get_one(Run, run_id)
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
        run = s.get_one(Run, run_id)
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
        assert first.deleted and "overwritten" in (first.deleted_reason or "")
        assert (second.source, second.step, second.verified, second.sha256) == ("script", 200, True, sha256_of(ckpt))
        chosen = resume_point(s, s.get_one(Run, run_id), 2)
        assert chosen is not None and (chosen.path, chosen.step) == (str(ckpt), 200)


def test_a_retry_of_a_fork_before_its_own_save_starts_from_the_forks_origin(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    parent_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt")
    ckpt = workdir / "out" / "ckpt.pt"
    with sessions() as s:
        run = s.get_one(Run, parent_id)
        attempt = add_attempt(s, parent_id, 1, last_step=None)
        saved(s, run, attempt, ckpt, b"p" * 100, time.time() - 20, step=100)
        s.commit()
        (origin,) = rows(s, parent_id)
    fork_id = fork(sessions, settings, parent_id, None, [], CPU2, checkpoint_id=origin.id)
    with sessions() as s:
        child = s.get_one(Run, fork_id)
        assert child.parent_checkpoint_id == origin.id
        chosen = resume_point(s, child, 2)  # attempt 1 failed before the fork saved anything
        assert chosen is not None and (chosen.checkpoint_id, chosen.step) == (origin.id, 100)


def test_a_retry_of_a_fork_of_runyards_own_checkpoint_starts_from_it(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    parent_id = script_run(sessions, settings, workdir)
    child_id = script_run(sessions, settings, workdir)
    with sessions() as s:
        parent = s.get_one(Run, parent_id)
        own = Checkpoint(run_id=parent_id, attempt=1, step=40, path=f"{checkpoints_dir(parent)}/step-40/state.pt",
                         bytes=1, sha256="", params_digest="", metrics_json="{}", blocked_s=0.0, total_s=0.0,
                         created_at=time.time(), verified=True, pinned=True, deleted=False)
        s.add(own)
        s.flush()
        child = s.get_one(Run, child_id)
        child.parent_checkpoint_id = own.id
        assert attempts_module.resume_point(s, child, 2) == (f"{checkpoints_dir(parent)}/step-40", 40)


def test_when_the_chosen_version_cannot_be_put_in_place_the_resume_args_are_left_out(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt", resume_args=["--resume"])
    ckpt = workdir / "out" / "ckpt.pt"
    with sessions() as s:
        run = s.get_one(Run, run_id)
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
        run = s.get_one(Run, run_id)
        for data in (b"first", b"second"):
            ckpt.write_bytes(data)
            _keep_aside(s, run, 2, ckpt)
    asides = sorted(p.read_bytes() for p in (workdir / "out").glob("ckpt.pt.before-attempt-2*"))
    assert asides == [b"first", b"second"] and not ckpt.exists()
