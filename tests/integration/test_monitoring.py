"""Per-rank training metrics and the ranks' health checks end to end: 2-rank mlp-digits runs under
the real scheduler (2 gloo ranks on CPU). A rank slowed by a sleep is reported once as a
straggler; a replica nudged after an optimizer step is reported as out of sync; a normal run
raises neither; every rank reports its step split, memory and time to the gradient sync."""

from __future__ import annotations

import csv
import io
import re
from collections import defaultdict

import pytest

from tests.integration.conftest import Product

pytestmark = pytest.mark.slow

COMMON = ("train.max_steps=100", "train.eval_every=0", "checkpoint.every_steps=0", "supervision.desync_check_every=40")


def finished(product: Product, run_id: int) -> dict:
    detail = product.wait_status(run_id, "SUCCEEDED", "FAILED", "CANCELLED")
    assert detail["status"] == "SUCCEEDED", detail["status_reason"]
    return detail


def events(detail: dict, kind: str) -> list[dict]:
    return [e for e in detail["events"] if e["kind"] == kind]


def points(product: Product, run_id: int) -> dict[tuple[int, str], list[float]]:
    """(rank, key) -> values in step order, from `runyard metrics --csv`."""
    out: dict[tuple[int, str], list[tuple[int, float]]] = defaultdict(list)
    for row in csv.DictReader(io.StringIO(product.cli("metrics", str(run_id), "--csv").stdout)):
        out[(int(row["rank"]), row["key"])].append((int(row["step"]), float(row["value"])))
    return {key: [v for _, v in sorted(series)] for key, series in out.items()}


def test_a_slow_rank_is_reported_once_as_a_straggler(product: Product) -> None:
    product.env["RUNYARD_FAULT_SLOW_RANK"] = "1:0.03"
    # 1 s instead of the default 30 s that a rank must stay slow: this run lasts a few seconds.
    run_id = product.submit(*COMMON, "supervision.straggler_sustain_s=1", "name=straggler")
    product.start_scheduler()
    detail = finished(product, run_id)

    (straggler,) = events(detail, "straggler")
    assert straggler["level"] == "warning" and straggler["attempt"] == 1
    found = re.match(r"rank (\d) is a straggler: ([\d.]+)x the median", straggler["message"])
    assert found, straggler["message"]
    assert int(found[1]) == 1 and float(found[2]) > 1.2
    assert events(detail, "desync") == []
    series = points(product, run_id)
    slow, fast = series[(1, "pre_sync_s")], series[(0, "pre_sync_s")]
    assert min(slow[2:]) > 0.03 > max(fast[2:])  # the sleep counts on rank 1 only


def test_a_perturbed_replica_is_reported_as_desync_and_a_normal_run_has_no_straggler(product: Product) -> None:
    product.env["RUNYARD_FAULT_PERTURB"] = "50:1"
    run_id = product.submit(*COMMON, "name=desync")
    product.start_scheduler()
    detail = finished(product, run_id)

    (desync,) = events(detail, "desync")  # checked at 40 (equal) and 80 (rank 1 differs)
    assert desync["level"] == "error"
    assert "at step 80: rank 1 differs from rank 0" in desync["message"]
    assert events(detail, "straggler") == []
    assert detail["rank_checks"] == {"stragglers": None, "desyncs": None}  # what the Run page says ran

    series = points(product, run_id)
    for rank in (0, 1):
        for key in ("loss", "lr", "grad_norm", "step_time", "data_wait_s", "compute_s", "samples_per_s", "mfu",
                    "mem_rss_mib", "pre_sync_s"):
            assert len(series[(rank, key)]) == 10, (rank, key)  # every 10 steps
        assert all(v >= 0 for v in series[(rank, "data_wait_s")])
        assert all(v > 0 for v in series[(rank, "compute_s")])
        assert all(v > 0 for v in series[(rank, "pre_sync_s")])
        assert all(v > 50 for v in series[(rank, "mem_rss_mib")])
        assert all(0 < v < 1 for v in series[(rank, "mfu")])
        assert all(s == pytest.approx(d + c) for s, d, c in zip(
            series[(rank, "step_time")], series[(rank, "data_wait_s")], series[(rank, "compute_s")], strict=True))
        assert set(series[(rank, "lr")]) == {0.001}
        assert all(v > 0 for v in series[(rank, "grad_norm")])
    # MFU against one peak on every rank (rank 0 measures it): MFU per sample/s is the same.
    per_throughput = {rank: [m / t for m, t in zip(series[(rank, "mfu")], series[(rank, "samples_per_s")],
                                                    strict=True)] for rank in (0, 1)}
    assert per_throughput[0] == pytest.approx(per_throughput[1], rel=1e-9)
