"""The metric registry (db/vocabulary/metric_registry.py): labels, units and number formats per key.

    pytest tests/unit/test_metric_registry.py
"""

from __future__ import annotations

import math
import re

import pytest

from db.vocabulary import metric_registry as registry
from tests.unit.paths import ROOT


@pytest.mark.parametrize(("key", "value", "text"), [
    ("lr", 0.001, "1e-3"),
    ("lr", 3e-4, "3e-4"),
    ("lr", 0.00012345, "1.23e-4"),
    ("mfu", 0.45, "45%"),
    ("mfu", 0.4567, "45.7%"),
    ("eval_accuracy", 0.9731, "97.3%"),
    ("step_time", 0.0123, "12.3 ms"),
    ("data_wait_s", 0.0005, "0.5 ms"),
    ("mem_peak_mib", 2048.0, "2,048 MiB"),
    ("mem_rss_mib", 56.78, "56.78 MiB"),
    ("samples_per_s", 12345.6, "12,346 samples/s"),
    ("tokens_per_s", 1.5e6, "1,500,000 tokens/s"),
    ("util_percent", 95.0, "95%"),
    ("mem_used_bytes", 2**31, "2 GiB"),
    ("loss", 2.345678, "2.346"),
    ("loss_scale", 65536.0, "65,536"),
])
def test_format_value_in_the_displayed_unit(key: str, value: float, text: str) -> None:
    assert registry.format_value(key, value) == text


def test_unknown_key_passes_through() -> None:
    assert registry.label("train/my_metric") == "train/my_metric"
    assert registry.unit("train/my_metric") == ""
    assert registry.axis_title("train/my_metric") == "train/my_metric"
    assert registry.format_value("train/my_metric", 0.123456) == "0.1235"
    assert registry.scaled("train/my_metric", 7.0) == 7.0


def test_missing_and_nan_values() -> None:
    assert registry.format_value("step_time", None) == "–"
    assert registry.format_value("step_time", math.nan) == "NaN"


def test_axis_titles_name_the_unit() -> None:
    assert registry.axis_title("step_time") == "Step time (ms)"
    assert registry.axis_title("mem_rss_mib") == "Process RSS (MiB)"
    assert registry.axis_title("mfu") == "MFU (%)"
    assert registry.axis_title("tokens_per_s") == "Token throughput (tokens/s)"
    assert registry.axis_title("loss") == "Loss"
    assert registry.format_number("mfu", 0.45) == "45"  # in a column titled "MFU (%)"


def test_shares_are_never_offered_a_log_axis() -> None:
    assert not registry.spec_for("eval_accuracy").log_ok and not registry.spec_for("mfu").log_ok
    assert registry.spec_for("loss").log_ok and registry.spec_for("my/metric").log_ok


def test_d3_formats_match_the_python_ones() -> None:
    assert registry.d3_format("lr") == ".3~e" and registry.axis_format("lr") == "~e"
    assert registry.axis_format("loss") is None


def test_registry_covers_every_key_runyard_reports() -> None:
    """The trainer's and the system monitor's keys, read from their source, all have an entry."""
    root = ROOT
    trainer = (root / "trainer" / "reporting" / "monitoring.py").read_text()
    # The system monitor's series, and the GPU readings it takes (resources.py's GpuSampler).
    sysmon = "".join((root / "orchestrator" / "scheduler" / name).read_text() for name in ("sysmon.py", "resources.py"))
    reported = set(re.findall(r'"((?:mem|eval)_\w+|step_time|data_wait_s|compute_s|samples_per_s|tokens_per_s|'
                              r'mfu|loss_scale|grad_norm|lr|pre_sync_s)"', trainer))
    reported |= set(re.findall(r'"(\w+_(?:percent|bytes|bps|w|c|mhz))"', sysmon))
    assert {"step_time", "mfu", "mem_rss_mib", "pre_sync_s", "util_percent", "rss_bytes"} <= reported
    assert reported - set(registry.known_keys()) == set()
