"""orchestrator/scripts/checkpoint_finder.py: the script's own checkpoint files, listed with size,
time and sha256; a file still being written is never hashed, a big file is hashed over several
scans and not again, and patterns stay inside the working directory."""

from __future__ import annotations

import hashlib
import io
import os
import time
from pathlib import Path

import pytest
import torch

from db.file_versions import CopyRefused, copy_verified, is_version, sha256_of
from orchestrator.scripts import checkpoint_finder
from orchestrator.scripts.checkpoint_finder import CheckpointFiles, CheckpointGlobError, check_glob


def sha(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def test_a_file_is_hashed_once_unchanged_for_two_looks(tmp_path: Path) -> None:
    ckpt = tmp_path / "out" / "ckpt.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(b"a" * 1000)
    files = CheckpointFiles(tmp_path, ["out/ckpt.pt"], settle_s=0)  # the settle time: its own test below
    (first,) = files.scan()
    assert (first.size, first.stable, first.sha256) == (1000, False, None)
    assert files.stable_files() == []
    (second,) = files.scan()
    assert second.stable and second.sha256 == sha(ckpt)
    assert files.stable_files() == [second]


def test_a_file_being_written_is_not_hashed(tmp_path: Path) -> None:
    ckpt = tmp_path / "snapshot.pt"
    files = CheckpointFiles(tmp_path, ["snapshot.pt"], settle_s=0)
    for size in range(1, 5):  # torch.save writing in place: it grows between looks
        with open(ckpt, "ab") as f:
            f.write(b"x" * 100)
        (seen,) = files.scan()
        assert seen.size == size * 100 and not seen.stable and seen.sha256 is None
    (done,) = files.scan()
    assert done.stable and done.sha256 == sha(ckpt)


def test_a_big_file_is_hashed_over_several_scans_then_kept(tmp_path: Path) -> None:
    ckpt = tmp_path / "checkpoints" / "step-100.pt"
    ckpt.parent.mkdir()
    ckpt.write_bytes(os.urandom(10_000))
    files = CheckpointFiles(tmp_path, ["checkpoints/*.pt"], hash_budget=3000, settle_s=0)
    digests = [files.scan()[0].sha256 for _ in range(5)]
    # Look 1 sees it, looks 2-4 hash 3000 bytes each (9000 of 10000), look 5 finishes.
    assert digests == [None, None, None, None, sha(ckpt)]
    # The digest is kept by (path, size, mtime, inode): same-size bytes written in place with
    # the old time restored are not read again (the cache, shown by the stale digest).
    st = ckpt.stat()
    with open(ckpt, "r+b") as f:
        f.write(b"\0" * 10)
    os.utime(ckpt, ns=(st.st_atime_ns, st.st_mtime_ns))
    assert files.scan()[0].sha256 == digests[-1] != sha(ckpt)


def test_a_file_changed_while_hashed_starts_over(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    ckpt.write_bytes(b"1" * 6000)
    files = CheckpointFiles(tmp_path, ["ckpt.pt"], hash_budget=2000, settle_s=0)
    files.scan()
    assert files.scan()[0].sha256 is None  # 2000 of 6000 hashed
    ckpt.write_bytes(b"2" * 6000)  # rewritten: same size, new time
    os.utime(ckpt, ns=(ckpt.stat().st_atime_ns, ckpt.stat().st_mtime_ns + 10**9))
    assert files.scan()[0].stable is False
    results = [files.scan()[0].sha256 for _ in range(3)]
    assert results == [None, None, sha(ckpt)]  # from the start: 3 x 2000 bytes


def test_matches_are_listed_newest_first_and_vanished_files_dropped(tmp_path: Path) -> None:
    for i, name in enumerate(["a.pt", "b.pt", "c.pt"]):
        path = tmp_path / "ck" / name
        path.parent.mkdir(exist_ok=True)
        path.write_bytes(b"x" * (i + 1))
        os.utime(path, (1000 + i, 1000 + i))
    files = CheckpointFiles(tmp_path, ["ck/*.pt", "ck/a.pt"], settle_s=0)
    assert [f.path.name for f in files.scan()] == ["c.pt", "b.pt", "a.pt"]  # a.pt once
    (tmp_path / "ck" / "b.pt").unlink()
    assert [f.path.name for f in files.scan()] == ["c.pt", "a.pt"]
    assert [f.path.name for f in files.stable_files()] == ["c.pt", "a.pt"]


def test_recursive_patterns_and_folders_are_not_files(tmp_path: Path) -> None:
    (tmp_path / "runs" / "x" / "step-5").mkdir(parents=True)
    (tmp_path / "runs" / "x" / "model.pt").write_bytes(b"m")
    files = CheckpointFiles(tmp_path, ["runs/**/*.pt", "runs/**/step-*"])
    assert [f.path.relative_to(tmp_path).as_posix() for f in files.scan()] == ["runs/x/model.pt"]


def test_a_symlink_out_of_the_workdir_is_left_out(tmp_path: Path) -> None:
    outside = tmp_path / "outside.pt"
    outside.write_bytes(b"secret")
    workdir = tmp_path / "work"
    workdir.mkdir()
    (workdir / "ckpt.pt").symlink_to(outside)
    (workdir / "own.pt").write_bytes(b"mine")
    assert [f.path.name for f in CheckpointFiles(workdir, ["*.pt"]).scan()] == ["own.pt"]


@pytest.mark.parametrize(("pattern", "problem"), [
    ("/etc/passwd", "workload.checkpoint_glob = '/etc/passwd' must be relative to workload.workdir"),
    ("~/ckpt.pt", "must be relative to workload.workdir"),
    ("../other/ckpt.pt", "workload.checkpoint_glob = '../other/ckpt.pt' must stay inside workload.workdir"),
    ("out/../../x.pt", "must stay inside workload.workdir"),
    ("", "workload.checkpoint_glob = '': empty; leave the key out instead"),
    (3, "not 3"),
])
def test_bad_patterns_name_the_field_and_the_value(pattern: object, problem: str, tmp_path: Path) -> None:
    found = check_glob(pattern)
    assert found is not None and problem in found
    with pytest.raises(CheckpointGlobError, match=r"workload\.checkpoint_glob"):
        CheckpointFiles(tmp_path, [pattern])  # type: ignore[list-item]
    assert check_glob("checkpoints/**/*.pt") is None


def test_a_matched_folder_is_one_checkpoint_with_a_digest_over_its_files(tmp_path: Path) -> None:
    folder = tmp_path / "hf_out" / "checkpoint-350"
    (folder / "sub").mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(os.urandom(5000))
    files = CheckpointFiles(tmp_path, ["hf_out/checkpoint-*"], hash_budget=3000)
    (first,) = files.scan()
    assert first.folder and (first.size, first.stable, first.sha256) == (5000, False, None)
    (folder / "sub" / "optimizer.pt").write_bytes(os.urandom(2000))  # the Trainer still saving
    (folder / "trainer_state.json").write_text('{"global_step": 352}')
    (grown,) = files.scan()
    assert grown.size == 5000 + 2000 + 20 and not grown.stable
    looks = [files.scan()[0] for _ in range(4)]  # stable now; 3000 bytes hashed a look
    assert [f.sha256 is not None for f in looks] == [False, False, True, True]
    done = looks[-1]
    assert done.stable and done.sha256 == sha256_of(folder) and done.step == 352
    assert is_version(folder, done.size, done.mtime)
    # Copied whole (a pin, a hand-over): the same version, the same digest.
    copy = tmp_path / "kept" / "checkpoint-350"
    copy_verified(folder, copy, done.sha256, done.mtime)
    assert is_version(copy, done.size, done.mtime) and sha256_of(copy) == done.sha256
    assert (copy / "sub" / "optimizer.pt").read_bytes() == (folder / "sub" / "optimizer.pt").read_bytes()
    # A file of it rewritten: a new version, and a copy of the recorded one is refused.
    (folder / "trainer_state.json").write_text('{"global_step": 353}')
    assert not is_version(folder, done.size, done.mtime) or sha256_of(folder) != done.sha256
    with pytest.raises(CopyRefused):
        copy_verified(folder, tmp_path / "again", done.sha256, done.mtime)
    assert not (tmp_path / "again").exists()


def test_an_empty_folder_is_not_a_checkpoint_yet(tmp_path: Path) -> None:
    (tmp_path / "hf_out" / "checkpoint-5").mkdir(parents=True)
    files = CheckpointFiles(tmp_path, ["hf_out/checkpoint-*"])
    assert files.scan() == [] and files.scan() == []


def test_a_pattern_ending_in_stars_matches_files_and_a_folder_swallows_its_files(tmp_path: Path) -> None:
    for name in ("out/a.pt", "out/sub/b.pt", "hf/checkpoint-5/model.bin", "hf/checkpoint-5/state.json"):
        (tmp_path / name).parent.mkdir(parents=True, exist_ok=True)
        (tmp_path / name).write_bytes(b"x")
    names = [f.path.relative_to(tmp_path).as_posix() for f in CheckpointFiles(tmp_path, ["out/**"]).scan()]
    assert sorted(names) == ["out/a.pt", "out/sub/b.pt"]  # files, as before: not out/ as one checkpoint
    both = CheckpointFiles(tmp_path, ["hf/checkpoint-*", "hf/**/*.bin"]).scan()
    assert [(f.path.name, f.folder) for f in both] == [("checkpoint-5", True)]


# -- a file rewritten faster than the scheduler looks (issue 30, item 8) -------------------------


def _torch_zip(step: int) -> bytes:
    """What ``torch.save({"iter_num": step, ...})`` writes: a zip archive, its end record last."""
    buf = io.BytesIO()
    torch.save({"iter_num": step, "w": torch.full((64,), float(step))}, buf)
    return buf.getvalue()


def _rewrite(path: Path, data: bytes) -> None:
    """Write over ``path`` in place, as ``torch.save(obj, path)`` does (the same inode)."""
    with open(path, "r+b" if path.exists() else "wb") as f:
        f.truncate(0)
        f.write(data)


def test_a_zip_rewritten_at_every_look_is_read_as_a_snapshot_at_most_every_interval(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """nanoGPT's ``out/ckpt.pt`` saved more often than the scheduler looks is never the same at two
    looks: before, no version was recorded until the script stopped (the recorded one fell
    thousands of steps behind). Now a complete version is read whole at most every
    SNAPSHOT_EVERY_S, with its own digest and step."""
    clock = [1000.0]
    monkeypatch.setattr(time, "monotonic", lambda: clock[0])
    ckpt = tmp_path / "out" / "ckpt.pt"
    ckpt.parent.mkdir()
    files = CheckpointFiles(tmp_path, ["out/ckpt.pt"])
    recorded = []
    for look in range(12):  # a new version before every look; the clock moves 5 s a look
        _rewrite(ckpt, _torch_zip(100 * look))
        (seen,) = files.scan()
        if seen.stable:
            recorded.append((look, seen.step, seen.sha256))
            assert seen.sha256 == sha(ckpt)
        clock[0] += 5.0
    # The first look, then one every 30 s of the clock (6 looks): never more often.
    assert [look for look, _, _ in recorded] == [0, 6]
    assert [step for _, step, _ in recorded] == [0, 600]  # each version's own step


def test_a_file_that_never_stops_changing_is_recorded_only_when_it_is_a_complete_zip(tmp_path: Path) -> None:
    ckpt = tmp_path / "ckpt.pt"
    files = CheckpointFiles(tmp_path, ["ckpt.pt"])
    for look in range(3):  # another format: its completeness cannot be told, so it waits for a quiet look
        _rewrite(ckpt, os.urandom(1000 + look))
        (seen,) = files.scan()
        assert not seen.stable and seen.sha256 is None
    whole = _torch_zip(7)
    for part in (len(whole) // 3, 2 * len(whole) // 3):  # a torch.save still writing: no end record yet
        _rewrite(ckpt, whole[:part])
        (seen,) = files.scan()
        assert not seen.stable and seen.sha256 is None
    _rewrite(ckpt, whole)
    (seen,) = files.scan()
    assert seen.stable and (seen.step, seen.sha256) == (7, sha(ckpt))


# -- a folder its framework is still writing (issue 52, item 2) ----------------------------------


class Clock:
    """The finder's monotonic clock, moved by the test: "a pause" without sleeping."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.now = 1000.0
        monkeypatch.setattr(time, "monotonic", lambda: self.now)

    def looks(self, files: CheckpointFiles, n: int, every_s: float = 1.0) -> list[bool]:
        """``n`` looks, ``every_s`` apart: whether the one match was stable at each."""
        seen = []
        for _ in range(n):
            self.now += every_s
            (match,) = files.scan()
            seen.append(match.stable)
        return seen


def test_a_trainer_folder_counts_only_once_its_trainer_state_json_is_written(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The Trainer writes a checkpoint's weights first and ``trainer_state.json`` last; in between it
    may sit still for seconds (the real one did, on 2 saves of 9). Two looks were enough to call it
    verified at 15 KB; now it counts only with its last file."""
    clock = Clock(monkeypatch)
    folder = tmp_path / "hf_out" / "checkpoint-50"
    folder.mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "training_args.bin"):  # save_model(): the weights first
        (folder / name).write_bytes(os.urandom(500))
    files = CheckpointFiles(tmp_path, ["hf_out/checkpoint-*"])
    assert clock.looks(files, 10) == [False] * 10  # ten seconds without a change: still being written
    for name in ("optimizer.pt", "scheduler.pt", "rng_state_0.pth"):
        (folder / name).write_bytes(os.urandom(300))
    assert clock.looks(files, 3) == [False] * 3
    (folder / "trainer_state.json").write_text('{"global_step": 50}')  # the last file
    assert clock.looks(files, 2) == [False, True]  # then two looks, as any file
    (done,) = files.scan()
    assert (done.sha256, done.step, done.incomplete) == (sha256_of(folder), 50, None)


def test_a_folder_left_without_its_last_file_is_reported_incomplete_once_its_writer_is_gone(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    clock = Clock(monkeypatch)
    folder = tmp_path / "hf_out" / "checkpoint-60"
    folder.mkdir(parents=True)
    (folder / "model.safetensors").write_bytes(os.urandom(500))  # the rank was killed here
    files = CheckpointFiles(tmp_path, ["hf_out/checkpoint-*"])
    assert clock.looks(files, 4) == [False] * 4
    assert files.stable_files() == []
    files.writer_gone()  # the attempt ended: nothing will finish it
    (ended,) = files.scan()
    assert ended.stable and ended.incomplete == ("no trainer_state.json, which the Hugging Face Trainer writes "
                                                 "last: its save did not finish")
    assert files.stable_files() == []  # never one a resume may use


def test_a_distributed_checkpoint_folder_counts_only_with_its_metadata(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """PyTorch Distributed Checkpoint (torchtitan's step-N/): every rank's ``.distcp`` first, the
    coordinator's ``.metadata`` last."""
    clock = Clock(monkeypatch)
    folder = tmp_path / "outputs" / "checkpoint" / "step-10"
    folder.mkdir(parents=True)
    for rank in (0, 1):
        (folder / f"__{rank}_0.distcp").write_bytes(os.urandom(400))
    files = CheckpointFiles(tmp_path, ["outputs/checkpoint/step-*"])
    assert clock.looks(files, 10) == [False] * 10
    (folder / ".metadata").write_bytes(os.urandom(50))
    assert clock.looks(files, 2) == [False, True]
    assert files.stable_files()[0].step == 10  # the step in its name


def test_a_folder_without_a_marker_counts_once_unchanged_for_the_settle_time(
        tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A folder of no known layout, and accelerate's (whose ranks write their RNG files after rank
    0's, with no barrier), count once unchanged for SETTLE_S, not at the second look."""
    clock = Clock(monkeypatch)
    plain = tmp_path / "ckpts" / "epoch-3"
    plain.mkdir(parents=True)
    (plain / "weights.bin").write_bytes(os.urandom(500))
    files = CheckpointFiles(tmp_path, ["ckpts/*"])
    assert checkpoint_finder.SETTLE_S >= 3
    assert clock.looks(files, 12, every_s=0.5) == [False] * 10 + [True] * 2  # 5 s after it was first seen so
    accelerate = tmp_path / "checkpoints" / "checkpoint_0"
    accelerate.mkdir(parents=True)
    for name in ("model.safetensors", "optimizer.bin", "scheduler.bin"):
        (accelerate / name).write_bytes(os.urandom(300))
    files = CheckpointFiles(tmp_path, ["checkpoints/checkpoint_*"])
    assert clock.looks(files, 8) == [False] * 8  # rank 0 has not written its random_states_0.pkl
    (accelerate / "random_states_0.pkl").write_bytes(os.urandom(100))
    assert clock.looks(files, 7) == [False] * 5 + [True] * 2
