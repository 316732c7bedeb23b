"""The request verbs (orchestrator/cli/requests.py), through click's runner on a real SQLite
database: `runyard submit` prints the id and queues nothing it refuses (exit 2 naming the field),
`runyard cancel`, and an unknown run named clearly.
"""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

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
