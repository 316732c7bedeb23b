"""Which of a script's checkpoint files a retry may start from (orchestrator/scripts/checkpoint_custody.py,
issue 52): not one that was there before the run (only by name, saying whose it is), not a
truncated zip nor a Trainer folder killed mid-save; and a folder's step is the one it holds, or
the one reported when it appeared (accelerate's names count saves, not steps).
"""

from __future__ import annotations

import io
import time
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from sqlalchemy.orm import Session, sessionmaker

from app.run_panels import verified_words
from db.file_versions import sha256_of
from db.models import Run
from db.queries import checkpoints_of
from db.requests import PREEXISTING, RequestRefused, request_cancel, request_resume, set_pinned
from db.states import AttemptStatus, RunStatus, transition
from db.vocabulary.settings import Settings
from orchestrator.cli.read import checkpoint_line
from orchestrator.scripts.checkpoint_custody import TRUNCATED, record_versions, resume_point, truncated_zip
from orchestrator.scripts.checkpoint_finder import CheckpointFiles
from orchestrator.scripts.checkpoint_steps import step_in_checkpoint
from tests.unit.orchestrator.scripts.script_checkpoints import (
    add_attempt,
    ended,
    look,
    report,
    rows,
    saved,
    script_run,
    workdir,
    write,
    zip_bytes,
)

__all__ = ["workdir"]  # the fixture, from the helper module


def test_a_file_that_was_there_before_the_run_started_is_not_chosen_for_a_retry(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt", resume_args=["--resume"])
    ckpt = workdir / "out" / "ckpt.pt"
    write(ckpt, b"someone else's" * 10, time.time() - 3600)  # a previous experiment's file
    with sessions() as s:
        run = s.get_one(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        record_versions(s, run, attempt, look(ckpt))
        s.commit()
        (row,) = rows(s, run_id)
        assert row.verified and not row.deleted and (row.refused_reason or "").startswith(PREEXISTING)
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
        run = s.get_one(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        saved(s, run, attempt, ckpt, good, time.time() - 20)
        write(ckpt, good[: len(good) // 2], time.time() - 10)  # the rank was killed in torch.save
        record_versions(s, run, attempt, look(ckpt))
        s.commit()
        first, second = rows(s, run_id)
        assert first.verified and first.deleted and TRUNCATED in (first.deleted_reason or "")
        assert not second.verified and second.refused_reason == TRUNCATED and not second.deleted
        record_versions(s, run, attempt, look(ckpt))  # seen again, hashed: still not verified
        s.commit()
        assert not rows(s, run_id)[1].verified
        assert resume_point(s, run, 2) is None


def truncated_zip_of(path: Path, data: bytes) -> bool:
    path.write_bytes(data)
    return truncated_zip(path)


def test_a_checkpoint_folder_holds_its_own_step_is_pinned_whole_and_put_back(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path) -> None:
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="hf_out/checkpoint-*")
    folder = workdir / "hf_out" / "checkpoint-350"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(b"w" * 300)
    (folder / "trainer_state.json").write_text('{"global_step": 350}')
    finder = CheckpointFiles(workdir, ["hf_out/checkpoint-*"])
    with sessions() as s:
        run = s.get_one(Run, run_id)
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
        saved(s, s.get_one(Run, earlier), attempt, ckpt, buf.getvalue(), time.time() - 3600, step=1500)
        s.commit()
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="out/ckpt.pt", resume_args=["--init_from=resume"])
    with sessions() as s:
        run = s.get_one(Run, run_id)
        attempt = add_attempt(s, run_id, 1, last_step=None)
        report(s, attempt, 70, time.time() - 5)
        (seen,) = look(ckpt)
        record_versions(s, run, attempt, [replace(seen, step=step_in_checkpoint(ckpt))])  # as the finder reads it
        s.commit()
        (stale,) = rows(s, run_id)
        assert stale.verified and (stale.refused_reason or "").startswith(PREEXISTING)
        whose = f"probably run {earlier}'s ('s'), which recorded the same file at step 1500"
        assert whose in (stale.refused_reason or "")
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
        record_versions(s, s.get_one(Run, other), attempt, look(workdir / "out" / "other.pt"))
        assert (rows(s, other)[0].refused_reason or "").endswith(
            "written before this run started, by no run runyard knows")


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
        run = s.get_one(Run, run_id)
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


def test_accelerate_checkpoint_folders_are_at_the_step_reported_when_they_appeared(
        sessions: sessionmaker[Session], settings: Settings, workdir: Path, tmp_path: Path) -> None:
    """Issue 52 item 9: ``checkpoints/checkpoint_2`` is accelerate's third save, at whatever step;
    read as step 2 it made "steps lost 158" and put progress back to 2/300."""
    run_id = script_run(sessions, settings, workdir, checkpoint_glob="checkpoints/checkpoint_*")
    folder = workdir / "checkpoints" / "checkpoint_2"
    with sessions() as s:
        run = s.get_one(Run, run_id)
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
