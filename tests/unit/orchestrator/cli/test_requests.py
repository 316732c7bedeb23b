"""The CLI's requests and reports, through click's runner on a real SQLite database."""

from __future__ import annotations

import csv
import io
import json
import time
from pathlib import Path

from click.testing import CliRunner

from db.engine import make_engine, make_sessionmaker
from db.metricstore import write_points
from db.models import Attempt
from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli
from tests.unit.paths import ROOT

EXAMPLE = ROOT / "examples" / "digits.toml"


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_submit_prints_the_id_and_ls_shows_it(settings: Settings) -> None:
    code, out, _ = run("submit", str(EXAMPLE), "--set", "name=first")
    assert code == 0 and out.strip() == "1"
    code, out, _ = run("submit", str(EXAMPLE), "--json")
    assert json.loads(out) == {"id": 2}
    code, out, _ = run("ls", "--json")
    runs = json.loads(out)
    assert [(r["id"], r["name"], r["status"]) for r in runs] == [(2, "digits-ddp", "QUEUED"), (1, "first", "QUEUED")]
    code, out, _ = run("ls")
    assert "first" in out and "QUEUED" in out and "0/300" in out


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


def test_bad_config_exits_2_names_the_field_and_queues_nothing(settings: Settings, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text('name = "x"\n[train]\nmax_steps = 0\nlearning_rate = 0.1\n')
    code, _, err = run("submit", str(bad))
    assert code == 2
    assert "train.max_steps = 0" in err and "train.learning_rate" in err and "nothing was queued" in err
    assert json.loads(run("ls", "--json")[1]) == []


def test_unparseable_toml_exits_2(settings: Settings, tmp_path: Path) -> None:
    bad = tmp_path / "bad.toml"
    bad.write_text("name = \n[train")
    code, _, err = run("submit", str(bad))
    assert code == 2 and "not valid TOML" in err


def test_too_many_ranks_exits_2(settings: Settings, monkeypatch) -> None:
    monkeypatch.setenv("RUNYARD_CPU_SLOTS", "2")
    code, _, err = run("submit", str(EXAMPLE), "--set", "launch.nproc_per_node=16")
    if "GPU" in err:  # on a GPU machine the limit is the GPU count
        assert code == 2
        return
    assert code == 2 and "launch.nproc_per_node = 16" in err and "2 CPU slots" in err
    assert json.loads(run("ls", "--json")[1]) == []


def test_cancel_a_queued_run(settings: Settings) -> None:
    run("submit", str(EXAMPLE))
    code, out, _ = run("cancel", "1")
    assert code == 0 and "cancel requested" in out
    assert json.loads(run("show", "1", "--json")[1])["status"] == "CANCELLED"


def test_unknown_run_is_a_clear_error(settings: Settings) -> None:
    code, _, err = run("show", "42")
    assert code == 1 and "no run with id 42" in err and "runyard ls" in err


def test_db_upgrade_is_idempotent(settings: Settings) -> None:
    assert run("db", "upgrade")[0] == 0
    assert run("db", "upgrade")[0] == 0


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
