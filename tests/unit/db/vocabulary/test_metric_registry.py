"""The metric registry (db/vocabulary/metric_registry.py): labels, units and number formats per key,
and a share a script logged as a percentage already (nanoGPT's ``mfu`` x 100) not multiplied again."""

from __future__ import annotations

import csv
import io
import math
import re
import time

import pandas as pd
import pytest
from click.testing import CliRunner
from sqlalchemy.orm import Session, sessionmaker

from app.charts.metric import displayed
from db.metricstore import write_points
from db.models import Attempt
from db.vocabulary import metric_registry
from db.vocabulary import metric_registry as registry
from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli
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


EXAMPLE = str(ROOT / "examples" / "digits.toml")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_a_share_logged_in_percent_is_not_multiplied_again(settings: Settings,
                                                           sessions: sessionmaker[Session]) -> None:
    """nanoGPT logs ``mfu`` x 100 (``wandb.log({"mfu": running_mfu*100})``, ``mfu 38.20%``);
    runyard's trainer a fraction. A value beyond ±1 is no fraction: shown as it is."""
    assert metric_registry.format_value("mfu", 0.382) == "38.2%"  # runyard's own fraction
    assert metric_registry.format_value("mfu", 38.2) == "38.2%"  # a script's percentage
    assert metric_registry.format_value("mfu", -100.0) == "-100%"  # nanoGPT's first iterations
    assert metric_registry.format_value("eval_accuracy", 97.5) == "97.5%"
    assert metric_registry.format_value("util_percent", 50.0) == "50%"  # stored in percent: unchanged
    # A chart judges the run's whole series: 0.9 beside 38.2 is 0.9%, not 90%.
    frame = pd.DataFrame({"value": [0.9, 38.2], "lo": [0.9, 38.2], "hi": [0.9, 38.2], "smooth": [0.9, 38.2]})
    assert displayed(frame, "mfu")["value"].tolist() == [0.9, 38.2]
    assert displayed(frame.iloc[:1], "mfu")["value"].tolist() == [90.0]
    run("submit", EXAMPLE)
    with sessions() as s:
        s.add(Attempt(run_id=1, number=1, status="SUCCEEDED", dir="/x", started_at=time.time()))
        s.flush()
        write_points(s.connection(), [dict(run_id=1, attempt=1, rank=0, step=10, key="mfu", value=38.2,
                                           wall_time=110.0)])
        s.commit()
    code, out, _ = run("metrics", "1", "--csv")
    (row,) = csv.DictReader(io.StringIO(out))
    assert code == 0 and float(row["value"]) * float(row["display_scale"]) == pytest.approx(38.2)
