"""`runyard edit`, `star`, `archive`, `rm` and the list's search, filters and sort, through click's
runner on a real SQLite database (issue 29, items 7 and 8)."""

from __future__ import annotations

import json
from pathlib import Path

from click.testing import CliRunner

from db.engine import make_engine, make_sessionmaker
from db.states import RunStatus, transition
from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli
from tests.unit.paths import ROOT

EXAMPLE = ROOT / "examples" / "digits.toml"


def run(*args: str, input: str | None = None) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args), input=input)
    return result.exit_code, result.stdout, result.stderr


def _finish(settings: Settings, run_id: int) -> None:
    sessions = make_sessionmaker(make_engine(settings.db_url))
    with sessions() as s:
        for status in (RunStatus.STARTING, RunStatus.RUNNING, RunStatus.SUCCEEDED):
            assert transition(s, run_id, status, "test")
        s.commit()


def test_edit_shows_in_show_and_ls_and_refuses_a_bad_name_with_the_rule(settings: Settings) -> None:
    run("submit", str(EXAMPLE), "--set", "name=first")
    code, out, err = run("edit", "1", "--name", "renamed", "--add-tag", "baseline", "--note", "lr too high")
    assert code == 0, err
    assert out.strip() == ("run 1: renamed 'first' to 'renamed'; tag 'baseline' added; note set: 'lr too high'")
    code, out, _ = run("show", "renamed")
    assert "run 1  renamed  QUEUED" in out and "  tags baseline" in out and "  note lr too high" in out
    code, out, _ = run("ls")
    assert out.splitlines()[1].split()[1] == "renamed" and out.splitlines()[1].endswith("baseline")
    code, _, err = run("edit", "1", "--name", "two words", "--remove-tag", "nope")
    assert code == 2  # bad input (docs/CLI.md's exit codes)
    assert "name 'two words': use letters, digits" in err and "remove tag 'nope'" in err
    assert json.loads(run("show", "1", "--json")[1])["name"] == "renamed"  # nothing changed
    code, _, err = run("edit", "1")
    assert code == 2 and "say what to change" in err


def test_ls_searches_filters_by_star_and_hides_archived_runs(settings: Settings) -> None:
    run("submit", str(EXAMPLE), "--set", "name=alpha", "--set", "train.lr=0.0003")
    run("submit", str(EXAMPLE), "--set", "name=beta")
    assert run("star", "beta")[1].strip() == "run 2 starred"
    code, _, err = run("archive", "1")
    assert code == 1 and "run 1 is QUEUED: only a finished run can be archived" in err
    _finish(settings, 1)
    assert "hidden from the list" in run("archive", "alpha")[1]

    def names(*args: str) -> list[str]:
        return [r["name"] for r in json.loads(run("ls", "--json", *args)[1])]

    assert names() == ["beta"]
    assert names("--archived") == ["beta", "alpha"]
    assert names("--archived", "--search", "lr=0.0003") == ["alpha"]
    assert names("--starred") == ["beta"]
    assert names("--archived", "--sort", "name") == ["alpha", "beta"]
    assert names("--archived", "--sort", "name", "--reverse") == ["beta", "alpha"]
    code, out, _ = run("ls", "--search", "zzz")
    assert out.strip().startswith("no runs match (search 'zzz')")
    assert run("ls")[1].splitlines()[1].startswith("   2*  beta")  # the star beside the id


def test_rm_refuses_an_active_run_asks_first_and_deletes_the_folder(settings: Settings) -> None:
    run("submit", str(EXAMPLE))
    folder = Path(json.loads(run("show", "1", "--json")[1])["run_dir"])
    code, _, err = run("rm", "1", "--yes")
    assert code == 1 and "run 1 is QUEUED: cancel it first (`runyard cancel 1`" in err
    _finish(settings, 1)
    code, out, _ = run("rm", "1", input="n\n")
    assert code == 0 and "Delete run #1 digits-ddp (SUCCEEDED)" in out and out.strip().endswith("nothing deleted")
    assert folder.is_dir()
    code, _, err = run("rm", "1")  # no answer at all
    assert code == 2 and "nothing deleted: no answer; `runyard rm 1 --yes`" in err
    code, out, _ = run("rm", "1", "--yes")
    assert code == 0 and out.strip() == f"run 1 deleted with its folder {folder}"
    assert not folder.exists() and json.loads(run("ls", "--json", "--archived")[1]) == []
