"""orchestrator/scripts/tensorboard_events.py over event files that torch's real SummaryWriter
writes: each tag keeps its own steps, reading is incremental across calls and new files, the rank
comes from the writer's pid or a rank folder, and past logdirs import whole."""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

pytest.importorskip("tensorboard")  # the `scripts` extra; ./dev.sh installs it

from torch.utils.tensorboard import SummaryWriter

from orchestrator.scripts import Sample
from orchestrator.scripts.tensorboard_events import (
    EventFiles,
    default_dirs,
    find_event_files,
    import_logdir,
    parse_file_name,
    rank_of_file,
)


class Clock:
    """A monotonic clock the test moves (the folder search runs every rescan_s)."""

    def __init__(self) -> None:
        self.now = 0.0

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def writer(tmp_path: Path) -> Iterator[SummaryWriter]:
    w = SummaryWriter(str(tmp_path / "runs" / "exp"))
    yield w
    w.close()


def by_key(samples: list[Sample]) -> dict[str, list[tuple[int, float]]]:
    out: dict[str, list[tuple[int, float]]] = {}
    for s in samples:
        out.setdefault(s.key, []).append((s.step, s.value))
    return out


def test_each_tag_keeps_its_own_step_counter(tmp_path: Path, writer: SummaryWriter) -> None:
    for step in range(0, 30, 10):
        writer.add_scalar("train/loss", 1.0 / (step + 1), step)
    for epoch in range(2):
        writer.add_scalar("eval/acc", 0.5 + epoch / 4, epoch)  # values exact in float32, as stored
    writer.add_text("notes", "not a scalar", 0)
    writer.add_histogram("weights", __import__("numpy").arange(5.0), 0)
    writer.flush()
    samples = EventFiles([tmp_path / "runs"]).poll()
    assert by_key(samples) == {"train/loss": [(0, 1.0), (10, pytest.approx(1 / 11)), (20, pytest.approx(1 / 21))],
                               "eval/acc": [(0, 0.5), (1, 0.75)]}
    assert all(s.rank == 0 and abs(s.wall_time - time.time()) < 60 for s in samples)


def test_reading_resumes_where_it_stopped_and_finds_new_files(tmp_path: Path, writer: SummaryWriter) -> None:
    clock = Clock()
    files = EventFiles([tmp_path / "runs"], rescan_s=5.0, clock=clock)
    assert files.poll() == []  # nothing written yet (the folder may not even exist)
    writer.add_scalar("loss", 3.0, 1)
    writer.flush()
    clock.now += 5
    assert by_key(files.poll()) == {"loss": [(1, 3.0)]}
    writer.add_scalar("loss", 2.0, 2)
    writer.flush()
    assert by_key(files.poll()) == {"loss": [(2, 2.0)]}  # only the new event
    assert files.poll() == []
    second = SummaryWriter(str(tmp_path / "runs" / "other"))
    second.add_scalar("lr", 0.1, 7)
    second.close()
    assert files.poll() == []  # the folders are searched again only every rescan_s
    clock.now += 5
    assert by_key(files.poll()) == {"lr": [(7, pytest.approx(0.1))]}
    assert files.newest_step == 7 and files.grew_at is not None


def test_a_poll_reads_at_most_max_events(tmp_path: Path, writer: SummaryWriter) -> None:
    for step in range(50):
        writer.add_scalar("loss", float(step), step)
    writer.flush()
    files = EventFiles([tmp_path / "runs"], max_events=20)
    got, polls = [], 0
    while True:
        batch = files.poll()
        polls += 1
        assert len(batch) <= 20
        got += batch
        if not files.behind:
            break
    assert [s.step for s in got] == list(range(50)) and polls == 3  # 51 events with the file header


def test_files_of_earlier_attempts_are_not_read_again(tmp_path: Path) -> None:
    old = SummaryWriter(str(tmp_path / "runs" / "attempt1"))
    old.add_scalar("loss", 9.0, 100)
    old.close()
    for path in find_event_files([tmp_path / "runs"]):
        os.utime(path, (time.time() - 3600, time.time() - 3600))
    new = SummaryWriter(str(tmp_path / "runs" / "attempt2"))
    new.add_scalar("loss", 1.0, 0)
    new.close()
    samples = EventFiles([tmp_path / "runs"], since=time.time() - 60).poll()
    assert by_key(samples) == {"loss": [(0, 1.0)]}


def test_add_scalars_become_tag_slash_name(tmp_path: Path, writer: SummaryWriter) -> None:
    writer.add_scalars("loss", {"train": 1.0, "val": 2.0}, 3)
    writer.flush()
    samples = EventFiles([tmp_path / "runs"]).poll()
    assert sorted((s.key, s.step, s.value) for s in samples) == [("loss/train", 3, 1.0), ("loss/val", 3, 2.0)]


def test_new_style_scalars_are_read(tmp_path: Path, writer: SummaryWriter) -> None:
    writer.add_scalar("tensor/loss", 0.25, 4, new_style=True)
    writer.add_scalar("tensor/loss", 0.125, 5, new_style=True)  # the second has no metadata of its own
    writer.flush()
    assert by_key(EventFiles([tmp_path / "runs"]).poll()) == {"tensor/loss": [(4, 0.25), (5, 0.125)]}


def test_the_rank_comes_from_the_writers_pid_or_a_rank_folder(tmp_path: Path) -> None:
    w = SummaryWriter(str(tmp_path / "runs" / "exp"))
    w.add_scalar("loss", 1.0, 0)
    w.close()
    (path,) = find_event_files([tmp_path / "runs"])
    assert parse_file_name(path.name).pid == os.getpid()  # type: ignore[union-attr]
    assert rank_of_file(path) == 0
    assert rank_of_file(path, {os.getpid(): 3}) == 3
    files = EventFiles([tmp_path / "runs"], pid_ranks={os.getpid(): 1})
    assert {s.rank for s in files.poll()} == {1}
    per_rank = tmp_path / "tb" / "rank_2" / "events.out.tfevents.1700000000.host.99.0"
    per_rank.parent.mkdir(parents=True)
    per_rank.touch()
    assert rank_of_file(per_rank, {os.getpid(): 3}, root=tmp_path / "tb") == 2


@pytest.mark.parametrize(("name", "expected"), [
    ("events.out.tfevents.1795496310.vm.314.0", (1795496310, "vm", 314)),
    ("events.out.tfevents.1795496310.node-3.cluster.local.4242.1", (1795496310, "node-3.cluster.local", 4242)),
    ("events.out.tfevents.1795496310.gpu1.77.3.v2", (1795496310, "gpu1", 77)),
    ("events.out.tfevents.1795496310.gpu1.77.3.mysuffix", (1795496310, "gpu1", 77)),
    ("events.out.tfevents.1795496310.gpu1", None),
    ("stdout.log", None),
])
def test_event_file_names(name: str, expected: tuple | None) -> None:
    parsed = parse_file_name(name)
    assert (None if parsed is None else (parsed.created, parsed.host, parsed.pid)) == expected


def test_default_folders_are_found_a_few_levels_down(tmp_path: Path) -> None:
    for folder in ("runs", "project/lightning_logs", "a/b/tb", "a/b/c/runs", ".hidden/runs", "venv/runs",
                   "node_modules/x/runs", "data"):
        (tmp_path / folder).mkdir(parents=True)
    (tmp_path / "venv" / "pyvenv.cfg").touch()
    found = [p.relative_to(tmp_path).as_posix() for p in default_dirs(tmp_path)]
    assert found == ["a/b/tb", "project/lightning_logs", "runs"]  # a/b/c/runs is four levels down


def test_import_logdir_reads_every_file(tmp_path: Path) -> None:
    for name, rank_dir in (("a", "rank0"), ("b", "rank1")):
        w = SummaryWriter(str(tmp_path / "logdir" / rank_dir / name))
        for step in range(3):
            w.add_scalar(f"{name}/loss", float(step), step * 100)
        w.close()
    samples = list(import_logdir(tmp_path / "logdir"))
    assert sorted((s.rank, s.key, s.step) for s in samples) == [
        (0, "a/loss", 0), (0, "a/loss", 100), (0, "a/loss", 200), (1, "b/loss", 0), (1, "b/loss", 100),
        (1, "b/loss", 200)]


def test_a_record_cut_in_half_is_read_once_it_is_whole(tmp_path: Path, writer: SummaryWriter) -> None:
    writer.add_scalar("loss", 1.0, 1)
    writer.add_scalar("loss", 2.0, 2)
    writer.flush()
    (path,) = find_event_files([tmp_path / "runs"])
    whole = path.read_bytes()
    path.write_bytes(whole[:-7])  # the writer's last record, as a reader may see it mid-write
    files = EventFiles([tmp_path / "runs"])
    assert by_key(files.poll()) == {"loss": [(1, 1.0)]}
    path.write_bytes(whole)
    assert by_key(files.poll()) == {"loss": [(2, 2.0)]}


def test_lightnings_steps_from_zero_are_read_one_higher(tmp_path: Path) -> None:
    """Lightning's TensorBoardLogger logs its first step at 0 and writes hparams.yaml beside its event
    file from the start: its steps are read one higher, so that step N is the Nth optimizer step, as
    its checkpoints (global_step) and every other writer count. A plain SummaryWriter's stay as given."""
    lightning = tmp_path / "lightning_logs" / "version_0"
    lightning.mkdir(parents=True)
    (lightning / "hparams.yaml").write_text("{}\n")
    plain = tmp_path / "runs" / "exp"
    for folder in (lightning, plain):
        w = SummaryWriter(str(folder))
        for step in range(3):
            w.add_scalar("train_loss", float(step), step)
        w.close()
    live = by_key(EventFiles([tmp_path / "lightning_logs"]).poll())
    assert live == {"train_loss": [(1, 0.0), (2, 1.0), (3, 2.0)]}
    assert by_key(EventFiles([tmp_path / "runs"]).poll()) == {"train_loss": [(0, 0.0), (1, 1.0), (2, 2.0)]}
    assert by_key(list(import_logdir(tmp_path / "lightning_logs")))["train_loss"] == [(1, 0.0), (2, 1.0), (3, 2.0)]
