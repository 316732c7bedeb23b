"""The New sweep page (app/views/new_sweep.py): the [sweep] fields come from the model, a pasted
sweep file fills the form and its space, a bad space key is refused naming it with nothing started,
the preview is `runyard sweep preview`'s, and Start starts the sweep.
"""

from __future__ import annotations

import json
import typing
from pathlib import Path

import pytest
from click.testing import CliRunner
from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest

from db.models import Run, Sweep
from db.vocabulary.config import RunConfig
from db.vocabulary.config.sweep import SweepConfig
from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli
from tests.unit.app.pages import as_read, no_exception, open_page, refusals, sessions, settings, start

__all__ = ["sessions", "settings"]  # the fixtures, from the helper module

PAGE = "views/new_sweep.py"
SPACE = "new_sweep:sweep.space"
SWEEP_FILE = """name = "lr-search"
[workload]
kind = "mlp-digits"
[launch]
nproc_per_node = 1
[train]
max_steps = 90
eval_every = 10
[checkpoint]
every_steps = 10
[sweep]
metric = "eval_loss"
searcher = "random"
max_trials = 9
max_concurrent = 2
seed = 7
[sweep.space]
"train.lr" = {log_uniform = [1e-4, 1e-1]}
"workload.hidden" = {choice = [32, 64]}
[sweep.early_stop]
reduction = 3
min_steps = 10
"""


def sweeps(sessions: sessionmaker[Session]) -> list[Sweep]:
    with sessions() as s:
        return list(s.scalars(select(Sweep)).all())


def paste(at: AppTest, text: str) -> AppTest:
    at.text_area(key="new_sweep_pasted").input(text)
    return next(b for b in at.button if b.label == "Fill the form").click().run()


def preview_shown(at: AppTest) -> list[str]:
    """The preview's lines as the page shows them."""
    (shown,) = [as_read(i.value) for i in at.info if i.value.startswith("**Preview**")]
    return [line.removeprefix("- ") for line in shown.split("\n\n", 1)[1].split("\n")]


def test_the_sweep_fields_come_from_the_model(settings: Settings) -> None:
    at = open_page(PAGE)
    no_exception(at)
    assert at.title[0].value == "New sweep"
    assert at.selectbox(key="new_sweep:sweep.searcher").options == ["grid", "random", "tpe"]
    assert at.number_input(key="new_sweep:sweep.max_trials").value == 3
    assert at.number_input(key="new_sweep:sweep.budget.max_failed").value == 3
    assert at.toggle(key="new_sweep:sweep.early_stop").value is False  # [sweep.early_stop]: optional, off
    assert at.number_input(key="new_sweep:sweep.early_stop.reduction").value == 3
    # The base config is New run's form, under keys of its own.
    assert at.number_input(key="new_sweep:train.max_steps").value == 270
    assert str(at.text_area(key=SPACE).value).startswith('"train.lr"')
    assert not at.error


class LongerSweep(SweepConfig):
    patience: int = Field(default=2, ge=0, le=50)
    """Rungs a trial may stay below the cut before it is stopped."""


class RunConfigWithPatience(RunConfig):
    sweep: LongerSweep | None = Field(default=None, json_schema_extra={"own_form": True})


def test_a_field_added_to_the_sweep_model_appears_on_the_page(settings: Settings,
                                                              monkeypatch: pytest.MonkeyPatch) -> None:
    """No UI edit: the page draws whatever the [sweep] model declares."""
    monkeypatch.setattr("db.vocabulary.config.RunConfig", RunConfigWithPatience)
    at = open_page(PAGE)
    no_exception(at)
    patience = at.number_input(key="new_sweep:sweep.patience")
    assert (patience.label, patience.value, patience.min, patience.max) == ("Patience", 2, 0, 50)
    assert patience.help.startswith("Rungs a trial may stay below the cut before it is stopped.")


def test_a_pasted_sweep_file_fills_the_form_and_its_space(settings: Settings) -> None:
    at = paste(open_page(PAGE), SWEEP_FILE)
    no_exception(at)
    assert any("Form filled from the pasted TOML" in m.value for m in at.success)
    assert at.text_input(key="new_sweep:name").value == "lr-search"
    assert at.number_input(key="new_sweep:sweep.max_trials").value == 9
    assert at.number_input(key="new_sweep:sweep.seed").value == 7
    assert at.toggle(key="new_sweep:sweep.early_stop").value is True
    assert at.number_input(key="new_sweep:sweep.early_stop.min_steps").value == 10
    assert at.text_area(key=SPACE).value == ('"train.lr" = {log_uniform = [0.0001, 0.1]}\n'
                                             '"workload.hidden" = {choice = [32, 64]}\n')


def test_a_bad_space_key_is_refused_naming_it_and_nothing_starts(settings: Settings,
                                                                 sessions: sessionmaker[Session]) -> None:
    at = open_page(PAGE)
    at.text_area(key=SPACE).input('"train.lr" = {log_uniform = [1e-4, 1e-1]}\n"train.nope" = {int = [1, 4]}\n').run()
    no_exception(at)
    # Checked as it is typed: the problem under the box, and no preview.
    shown = [as_read(e.value) for e in at.error]
    assert [e for e in shown if e.startswith('sweep.space."train.nope"')], shown
    assert any(i.value.startswith("**No preview**") for i in at.info)
    start(at)
    no_exception(at)
    assert any('sweep.space."train.nope"' in e for e in refusals(at, summarised=False))
    assert sweeps(sessions) == []
    with sessions() as s:
        assert s.scalars(select(Run)).all() == []


def test_the_preview_is_runyard_sweep_previews(settings: Settings, tmp_path: Path) -> None:
    at = paste(open_page(PAGE), SWEEP_FILE)
    no_exception(at)
    path = tmp_path / "sweep.toml"
    path.write_text(SWEEP_FILE)
    result = CliRunner().invoke(cli, ["sweep", "preview", str(path)])
    assert result.exit_code == 0, result.output
    assert preview_shown(at) == [line.strip() for line in result.output.strip().split("\n")]
    assert preview_shown(at)[:3] == ["9 trial(s), 2 at a time, 90 steps each at most (1 rank(s) a trial)",
                                     "rung 0 at step 10: 9 trial(s) reach it", "rung 1 at step 30: 3 trial(s) reach it"]


def test_start_starts_the_sweep(settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = paste(open_page(PAGE), SWEEP_FILE)
    start(at)
    no_exception(at)
    assert not at.error
    (sweep,) = sweeps(sessions)
    assert (sweep.name, sweep.status, sweep.max_trials, sweep.max_concurrent, sweep.seed) == (
        "lr-search", "RUNNING", 9, 2, 7)
    section = json.loads(sweep.sweep_json)
    assert list(section["space"]) == ["train.lr", "workload.hidden"]
    assert section["early_stop"]["min_steps"] == 10
    assert json.loads(sweep.base_json)["train"]["max_steps"] == 90
    assert typing.cast(list[int], json.loads(sweep.rungs_json)) == [10, 30]


def test_a_paste_not_yet_in_the_form_fills_it_and_starts_nothing_then_starts(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    """What is pasted is applied, or Start refuses and says why (issue 52 item 6): never the form's
    own sweep beside a paste it does not hold."""
    at = open_page(PAGE)
    at.text_area(key="new_sweep_pasted").input(SWEEP_FILE)
    start(at)
    no_exception(at)
    assert any("pasted TOML was not in the form yet" in w.value for w in at.warning)
    assert sweeps(sessions) == [] and at.text_input(key="new_sweep:name").value == "lr-search"
    start(at)
    assert [s.name for s in sweeps(sessions)] == ["lr-search"]


def test_add_a_key_writes_a_range_around_its_value_into_the_space(settings: Settings) -> None:
    at = open_page(PAGE)
    at.text_area(key=SPACE).input("")
    at.selectbox(key="new_sweep_add_key").set_value("train.batch_size")
    at.selectbox(key="new_sweep_add_kind").set_value("int")
    next(b for b in at.button if b.label == "Add to the space").click().run()
    no_exception(at)
    assert at.text_area(key=SPACE).value == '"train.batch_size" = {int = [32, 128]}\n'
    assert not at.error  # a space the base takes
