"""The reading verbs (orchestrator/cli/read.py), through click's runner on a real SQLite database:
`runyard show` (its JSON fields, its costs, the latest metrics as the Run page shows them, when a
run ends and on what basis, and when it ended, a queued run's start estimate, as `runyard ls` says
it too) and `runyard metrics` (one CSV row a point, each key with its label and display unit).
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import re
import time

import pytest
from click.testing import CliRunner

from db.engine import make_engine, make_sessionmaker
from db.metricstore import write_points
from db.models import Attempt
from db.states import RunStatus, transition
from db.vocabulary.inventory import Inventory
from db.vocabulary.scheduler_file import SchedulerFile
from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli
from orchestrator.cli.read import end_cell
from tests.unit.paths import ROOT

EXAMPLE = ROOT / "examples" / "digits.toml"
# A start time as shown: the time of day, with the date when it falls on another day (a test just
# before midnight).
AT = r"(?:\w{3} \d\d \w{3} )?\d\d:\d\d"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_show_json_has_the_documented_fields(settings: Settings) -> None:
    run("submit", str(EXAMPLE))
    code, out, _ = run("show", "1", "--json")
    assert code == 0
    detail = json.loads(out)
    for key in ("id", "name", "status", "step", "max_steps", "attempts", "metrics", "checkpoints", "cost_usd", "eta_s"):
        assert key in detail, key
    assert detail["status"] == "QUEUED" and detail["attempts"] == [] and detail["checkpoints"] == []
    # by name as well as by id
    assert json.loads(run("show", "digits-ddp", "--json")[1])["id"] == 1


def test_metrics_csv_has_one_row_per_point(settings: Settings, sessions) -> None:
    run("submit", str(EXAMPLE))
    with sessions() as s:
        s.add(Attempt(run_id=1, number=1, status="SUCCEEDED", dir="/x", started_at=time.time()))
        s.flush()
        write_points(s.connection(), [dict(run_id=1, attempt=1, rank=r, step=st, key="loss", value=1.0 / st,
                                           wall_time=100.0 + st) for st in (10, 20) for r in (0, 1)])
        s.commit()
    code, out, _ = run("metrics", "1", "--csv")
    assert code == 0
    rows = list(csv.DictReader(io.StringIO(out)))
    assert [(r["attempt"], r["rank"], r["step"], r["key"]) for r in rows] == [
        ("1", "0", "10", "loss"), ("1", "1", "10", "loss"), ("1", "0", "20", "loss"), ("1", "1", "20", "loss")]
    assert float(rows[0]["value"]) == 0.1 and float(rows[0]["time"]) == 110.0


def test_show_json_reports_cost_fields(settings: Settings) -> None:
    run("submit", str(EXAMPLE))
    detail = json.loads(run("show", "1", "--json")[1])
    for key in ("cost_usd", "cost_wasted_usd", "cost_projected_usd", "eta_s", "goodput"):
        assert key in detail


def test_metrics_csv_names_each_key_with_its_label_and_display_unit(settings: Settings, sessions) -> None:
    """The raw key and value stay machine-readable; label, display_unit and display_scale say how
    the dashboard shows them (value x display_scale in display_unit)."""
    run("submit", str(EXAMPLE))
    with sessions() as s:
        s.add(Attempt(run_id=1, number=1, status="SUCCEEDED", dir="/x", started_at=time.time()))
        s.flush()
        write_points(s.connection(), [dict(run_id=1, attempt=1, rank=0, step=10, key=k, value=v, wall_time=110.0)
                                      for k, v in (("step_time", 0.0125), ("mfu", 0.45), ("my/metric", 3.0))])
        s.commit()
    code, out, _ = run("metrics", "1", "--csv")
    assert code == 0
    header = out.splitlines()[0].split(",")
    assert header == ["attempt", "rank", "step", "key", "value", "time", "superseded", "label", "display_unit",
                      "display_scale"]
    rows = {r["key"]: r for r in csv.DictReader(io.StringIO(out))}
    step_time = rows["step_time"]
    assert (step_time["label"], step_time["display_unit"]) == ("Step time", "ms")
    assert float(step_time["value"]) * float(step_time["display_scale"]) == 12.5  # seconds as stored, ms shown
    assert (rows["mfu"]["label"], rows["mfu"]["display_unit"], rows["mfu"]["display_scale"]) == ("MFU", "%", "100")
    assert (rows["my/metric"]["label"], rows["my/metric"]["display_unit"], rows["my/metric"]["display_scale"]) == (
        "my/metric", "", "1")


def test_show_prints_the_latest_metrics_as_the_run_page_does(settings: Settings) -> None:
    """The metric registry's labels, units and formats, not raw keys and stored values."""
    run("submit", str(EXAMPLE))
    engine = make_engine(settings.db_url)
    try:
        with make_sessionmaker(engine)() as s:
            write_points(s.connection(), [
                dict(run_id=1, attempt=1, rank=rank, step=10, key=key, value=value, wall_time=time.time())
                for rank in (0, 1) for key, value in (("step_time", 0.0123), ("eval_accuracy", 0.875))])
            s.commit()
    finally:
        engine.dispose()
    code, out, _ = run("show", "1")
    assert code == 0
    lines = out[out.index("latest metrics:"):].splitlines()[1:]
    assert any(line.split() == ["Step", "time", "(ms)", "r0=12.3", "r1=12.3"] for line in lines), lines
    assert any(line.split() == ["Eval", "accuracy", "(%)", "r0=87.5", "r1=87.5"] for line in lines), lines


def test_show_names_your_cost_and_the_cloud_reference_apart(settings: Settings, sessions) -> None:
    """`runyard show --json` carries both cost lines under names that say which is which (the flat
    keys stay the cloud reference), and the text prints them on two named lines."""
    run("submit", str(EXAMPLE))
    with sessions() as s:
        s.add(Attempt(run_id=1, number=1, status="SUCCEEDED", dir="/x", started_at=1000.0, ended_at=4600.0))
        s.commit()
    detail = json.loads(run("show", "1", "--json")[1])
    yours, cloud = detail["cost"]["yours"], detail["cost"]["cloud_reference"]
    assert yours["usd"] is None and "no electricity tariff set" in yours["reason"]
    assert cloud["usd"] == detail["cost_usd"] > 0 and cloud["unit"] == detail["price_unit"]
    run("settings", "set", "cost.electricity_usd_per_kwh=0.30", "cost.hardware_usd_per_gpu=8760",
        "cost.hardware_life_years=1")
    detail = json.loads(run("show", "1", "--json")[1])
    yours = detail["cost"]["yours"]
    # No energy measured here: the hardware part alone, the machine's $2/h shared by the run's slots.
    assert yours["usd"] == yours["hardware_usd"] == round(2.0 * yours["devices"], 6)
    assert yours["energy_usd"] is None and yours["energy_method"] == "not measured"
    text = run("show", "1")[1]
    assert "  your cost: $" in text and "energy not measured" in text
    assert f"  cloud reference: ${cloud['usd']:,.4f} ({cloud['unit']})" in text


def test_show_says_when_a_run_ends_on_what_basis_and_when_it_ended(settings: Settings) -> None:
    """A running run: "ends at" with its ETA, "cost so far", and the ETA's basis (in --json too);
    once it succeeded: "ended at" its end and "cost", with no basis."""
    run("submit", str(EXAMPLE))  # 300 steps
    now = time.time()
    engine = make_engine(settings.db_url)
    try:
        with make_sessionmaker(engine)() as s:
            for status in ("STARTING", "RUNNING"):
                transition(s, 1, RunStatus(status), "t")
            s.add(Attempt(run_id=1, number=1, status="RUNNING", dir="/tmp/a", started_at=now - 20,
                          first_step_at=now - 15, last_step=150))
            write_points(s.connection(), [dict(run_id=1, attempt=1, rank=0, step=step, key="loss", value=1.0,
                                               wall_time=now - 15 + step / 10) for step in range(10, 151, 10)])
            s.commit()
        code, out, _ = run("show", "1")
        assert code == 0 and "  ends at " in out and "  your cost: " in out
        assert "  eta basis: from the last 140 steps' pace over 14 s (10 steps/s), evaluation and checkpoint " \
               "pauses included" in out
        assert json.loads(run("show", "1", "--json")[1])["eta_basis"].startswith("from the last 140 steps' pace")
        with make_sessionmaker(engine)() as s:
            transition(s, 1, RunStatus.SUCCEEDED, "done")
            s.commit()
        code, out, _ = run("show", "1")
        assert code == 0 and "  ended at " in out and "  cloud reference: $" in out
        assert "ends at" not in out and "cost so far" not in out and "eta basis" not in out
    finally:
        engine.dispose()


def test_ls_and_show_say_when_a_queued_run_starts(settings: Settings, sessions) -> None:
    # Run 1 fills the 2 CPU slots the scheduler published, 200 steps to go at 5 steps/s; run 2 waits.
    SchedulerFile(settings.scheduler_file).write({"inventory": Inventory(kind="cpu", slots=2).to_json()})
    run("submit", str(EXAMPLE))
    run("submit", str(EXAMPLE), "--set", "name=behind")
    now = time.time()
    with sessions() as s:
        for status in (RunStatus.STARTING, RunStatus.RUNNING):
            assert transition(s, 1, status, "test")
        s.add(Attempt(run_id=1, number=1, status="RUNNING", dir="/x", started_at=now - 30, first_step_at=now - 25,
                      progress_at=now, last_step=100))
        s.flush()
        write_points(s.connection(), [dict(run_id=1, attempt=1, rank=0, step=st, key="loss", value=1.0,
                                           wall_time=now - (100 - st) / 5) for st in range(10, 101, 10)])
        s.commit()
    start = json.loads(run("show", "2", "--json")[1])["start_estimate"]
    assert start["after_run"] == 1 and start["at"] == pytest.approx(now + 200 / 5, abs=1)
    assert start["basis"] == "after run 1 ends, by that run's predicted end"
    assert json.loads(run("show", "1", "--json")[1])["start_estimate"] is None  # not queued
    listed = run("ls")[1].splitlines()
    row = next(i for i, line in enumerate(listed) if "behind" in line)
    assert re.fullmatch(rf" {{7}}starts ≈ {AT}, after run 1", listed[row + 1]), listed
    assert re.search(rf"^  starts ≈ {AT} \(in \d+s\): after run 1 ends", run("show", "2")[1], re.M)


def test_ls_fits_an_end_on_another_day_in_its_column() -> None:
    """`runyard ls`'s ENDS column: the time today, the weekday and time within the week, the date later."""
    now = dt.datetime(2026, 12, 2, 15, 0).timestamp()
    assert end_cell("RUNNING", 3600.0, now) == "16:00"
    assert end_cell("RUNNING", 20 * 3600.0, now) == "Thu 11:00"
    assert end_cell("RUNNING", 10 * 86400.0, now) == "12 Dec"
    assert end_cell("SUCCEEDED", 0.0, now) == "–"


def test_show_says_how_each_attempt_ended_never_exit_none(settings: Settings) -> None:
    """An attempt without an exit code says why: still running, or killed (issue 56, item 2)."""
    run("submit", str(EXAMPLE))
    engine = make_engine(settings.db_url)
    try:
        with make_sessionmaker(engine)() as s:
            now = time.time()
            s.add_all([
                Attempt(run_id=1, number=1, status="CRASHED", dir="a/1", started_at=now - 60, ended_at=now - 30,
                        cause="UNKNOWN"),
                Attempt(run_id=1, number=2, status="FAILED", dir="a/2", started_at=now - 30, ended_at=now - 20,
                        exit_code=-9, cause="OOM", failed_rank=1, steps_lost=5),
                Attempt(run_id=1, number=3, status="RUNNING", dir="a/3", started_at=now - 10)])
            s.commit()
    finally:
        engine.dispose()
    code, out, _ = run("show", "1")
    assert code == 0
    assert "None" not in out, out
    lines = {line.split()[0]: line for line in out.splitlines() if re.match(r"\s+#\d ", line)}
    assert "no exit code (killed or vanished)" in lines["#1"]
    assert "no rank named, steps lost unknown" in out
    assert "exit -9 (SIGKILL)" in lines["#2"] and "rank 1, steps lost 5" in out
    assert "still running" in lines["#3"]
