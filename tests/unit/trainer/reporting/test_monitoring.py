"""The ``Monitor`` a training loop reports through (trainer/reporting/monitoring.py): a report's way
to rank 0, which checks run and why not, values not waited for, and the per-interval training
metrics (tests/unit/trainer/reporting/test_control.py has the collective that carries the
reports).
"""

from __future__ import annotations

import time
from pathlib import Path

import psutil
import pytest
import torch
from torch import nn

from db.vocabulary.checks import parse_checks
from db.vocabulary.config import SupervisionConfig
from trainer.context import RunContext
from trainer.reporting.control import ControlChannel
from trainer.reporting.health import PreSyncClock
from trainer.reporting.monitoring import Interval, Monitor, memory_metrics
from trainer.reporting.reporter import MetricReporter

CPU = torch.device("cpu")


# -- the exchange, the stop flag, the metrics -----------------------------------------------------


def unmanaged(tmp_path: Path) -> RunContext:
    return RunContext(run_id=None, attempt=1, db_url=None, run_dir=tmp_path, attempt_dir=tmp_path)


def test_a_report_carries_memory_and_reaches_rank_0_with_its_step(tmp_path: Path) -> None:
    monitor = Monitor(SupervisionConfig(), 0, 1, CPU, MetricReporter(unmanaged(tmp_path), 0, 1), ControlChannel())
    got = []
    monitor.log(10, {"loss": 2.5}, then=lambda step, per_rank: got.append((step, per_rank)))
    monitor.close()
    [(step, per_rank)] = got
    assert step == 10 and list(per_rank) == [0]
    assert per_rank[0]["loss"] == 2.5 and per_rank[0]["mem_rss_mib"] > 0


def test_rank_0_records_at_its_first_log_which_checks_run_on_one_rank(tmp_path: Path,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    monitor = Monitor(SupervisionConfig(), 0, 1, CPU, MetricReporter(unmanaged(tmp_path), 0, 1), ControlChannel())
    monitor.watch(nn.Linear(2, 1))
    with caplog.at_level("INFO", logger="trainer.reporting.monitoring"):
        monitor.log(10, {"loss": 2.5})
        monitor.log(20, {"loss": 2.0})
        monitor.close()
    recorded = [r.getMessage() for r in caplog.records if r.getMessage().startswith("checks: ")]
    assert recorded == ["checks: stragglers not checked: one rank, nothing to compare; "
                        "desyncs not checked: one rank, nothing to compare"]  # once, at the first log
    assert parse_checks(recorded[0].removeprefix("checks: ")) == {
        "stragglers": "one rank, nothing to compare", "desyncs": "one rank, nothing to compare"}


@pytest.mark.parametrize(("supervision", "wrap", "expected"), [
    ({}, None, {"stragglers": "the script did not call run.watch(model)",
                "desyncs": "the script did not call run.watch(model)"}),
    ({}, "plain", {"stragglers": "the model is not wrapped in DistributedDataParallel", "desyncs": None}),
    ({"straggler_ratio": 0, "desync_check_every": 0}, "plain",
     {"stragglers": "supervision.straggler_ratio is 0", "desyncs": "supervision.desync_check_every is 0"}),
])
def test_which_checks_run_on_two_ranks_says_why_not(tmp_path: Path, supervision: dict, wrap: str | None,
                                                    expected: dict) -> None:
    """Without a process group (DDP itself is tried in tests/integration/test_monitoring.py)."""
    monitor = Monitor(SupervisionConfig(**supervision), 0, 2, CPU, MetricReporter(unmanaged(tmp_path), 0, 2),
                      ControlChannel())
    if wrap == "plain":
        monitor.watch(nn.Linear(2, 1))
    assert parse_checks(monitor.checks) == expected


def test_tensor_values_are_not_waited_for_and_reach_rank_0_a_step_later(tmp_path: Path) -> None:
    """A loss still on the device is fetched without a sync: its exchange is launched at the
    channel's agreement of the next step (not of its own), at the next log, or at close()."""
    channel = ControlChannel()
    monitor = Monitor(SupervisionConfig(), 0, 1, CPU, MetricReporter(unmanaged(tmp_path), 0, 1), channel)
    got: list[tuple[int, dict[str, float]]] = []
    then = lambda step, per_rank: got.append((step, per_rank[0]))  # noqa: E731

    monitor.log(1, {"loss": torch.tensor(2.5), "lr": 0.1}, then=then)
    channel.agree()  # the end of step 1: the device may still be computing it
    assert got == []
    channel.agree()  # the end of step 2
    assert [(s, v["loss"], v["lr"]) for s, v in got] == [(1, 2.5, 0.1)]

    monitor.log(2, {"loss": torch.tensor([1.5])}, then=then)
    monitor.log(3, {"loss": torch.tensor(0.5, dtype=torch.bfloat16)}, then=then)  # launches step 2's
    assert [s for s, _ in got] == [1, 2]
    monitor.close()  # launches and reads step 3's
    assert [(s, v["loss"]) for s, v in got] == [(1, 2.5), (2, 1.5), (3, 0.5)]
    assert all(v["mem_rss_mib"] > 0 for _, v in got)
    with pytest.raises(ValueError, match="'loss': a tensor of 2 elements"):
        monitor.log(4, {"loss": torch.ones(2)})


def test_interval_report_splits_the_step_and_derives_throughput_and_mfu() -> None:
    iv = Interval(started=time.perf_counter() - 1.0, steps=4, data_wait=0.2, excluded=0.2,
                  loss=torch.tensor(10.0), grad_norm=torch.tensor(2.0))
    m = iv.report(lr=0.1, samples_per_step=32, flops_per_sample=1e6, peak_flops=1e9, tokens_per_sample=64)
    assert m["loss"] == 2.5 and m["grad_norm"] == 0.5 and m["lr"] == 0.1
    assert m["step_time"] == pytest.approx(0.2, abs=0.01)  # (1 s - 0.2 s evaluation) / 4 steps
    assert m["data_wait_s"] == pytest.approx(0.05)
    assert m["compute_s"] == pytest.approx(m["step_time"] - 0.05)
    assert m["samples_per_s"] == pytest.approx(32 / m["step_time"])
    assert m["tokens_per_s"] == pytest.approx(64 * m["samples_per_s"])
    assert m["mfu"] == pytest.approx(1e6 * m["samples_per_s"] / 1e9)
    plain = Interval(steps=1, loss=1.0, grad_norm=1.0).report(0.1, 8, 1e6, None)
    assert "mfu" not in plain and "tokens_per_s" not in plain and "loss_scale" not in plain


def test_memory_is_the_resident_set_on_cpu() -> None:
    m = memory_metrics(CPU, psutil.Process())
    assert set(m) == {"mem_rss_mib"} and m["mem_rss_mib"] > 10


@pytest.mark.gpu
def test_memory_and_sync_clock_on_cuda() -> None:
    device = torch.device("cuda", 0)
    x = torch.randn(1024, 1024, device=device)
    m = memory_metrics(device, psutil.Process())
    assert set(m) == {"mem_allocated_mib", "mem_reserved_mib", "mem_peak_mib"} and m["mem_allocated_mib"] >= 4
    clock = PreSyncClock(device)
    x @ x
    clock.bucket_launched(last=True)
    clock.bucket_reduced()
    (t,) = clock.take()
    assert t >= 0


@pytest.mark.gpu
def test_a_loss_on_the_gpu_reaches_rank_0_through_pinned_memory(tmp_path: Path) -> None:
    device = torch.device("cuda", 0)
    channel = ControlChannel()
    monitor = Monitor(SupervisionConfig(), 0, 1, device, MetricReporter(unmanaged(tmp_path), 0, 1), channel)
    got: list[dict[str, float]] = []
    x = torch.randn(2048, 2048, device=device)
    for step in range(1, 4):
        loss = (x @ x).mean()  # still being computed when it is logged
        monitor.log(step, {"loss": loss}, then=lambda _, per_rank: got.append(per_rank[0]))
        channel.agree()
    monitor.close()
    assert len(got) == 3 and got[-1]["loss"] == pytest.approx(loss.item(), rel=1e-6)
    assert got[-1]["mem_allocated_mib"] >= 16
