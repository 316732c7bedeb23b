"""The New run page (app/views/new_run.py): the form's defaults and fields by workload kind, every
refusal at once and the warnings asked about once, a pasted TOML, and what Start queues.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from pydantic import Field
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest

from db import queries
from db.models import Run
from db.vocabulary.config import RunConfig, TrainConfig
from db.vocabulary.settings import Settings
from tests.unit.app.pages import as_read, no_exception, open_page, queued_runs, refusals, sessions, settings, start

__all__ = ["sessions", "settings"]  # the fixtures, from the helper module


def test_new_run_form_shows_the_defaults(settings: Settings) -> None:
    at = open_page("views/new_run.py")
    no_exception(at)
    assert at.title[0].value == "New run"
    assert at.number_input(key="launch.nproc_per_node").value == 2
    # The first run is one a person can watch (about a minute), not over 4 s after its first point.
    assert at.number_input(key="train.max_steps").value == 3000
    assert at.number_input(key="train.lr").value == pytest.approx(0.001)
    assert not at.error


def test_the_slurm_fields_appear_for_a_slurm_run_and_reach_its_config(settings: Settings,
                                                                     sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    assert not [k for k in ("slurm.partition", "slurm.time_limit") if k in at.session_state]  # local: none shown
    at.selectbox(key="launch.executor").set_value("slurm").run()
    no_exception(at)
    at.text_input(key="slurm.partition").set_value("gpu")
    at.text_input(key="slurm.time_limit").set_value("01:30:00")
    at.number_input(key="launch.nnodes").set_value(2)
    start(at)
    no_exception(at)
    assert not refusals(at)
    with sessions() as s:
        (config_json,) = s.scalars(select(Run.config_json)).all()
    config = json.loads(config_json)
    assert config["launch"]["executor"] == "slurm" and config["launch"]["nnodes"] == 2
    assert (config["slurm"]["partition"], config["slurm"]["time_limit"]) == ("gpu", "01:30:00")


def test_negative_learning_rate_is_rejected_and_nothing_queued(settings: Settings,
                                                                sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    at.number_input(key="train.lr").set_value(-1.0)
    start(at)
    no_exception(at)
    errors = refusals(at)
    assert len(errors) == 1
    assert errors[0].startswith("train.lr = -1.0")
    assert "greater than 0" in errors[0]
    assert queued_runs(sessions) == []


def test_an_implausible_value_is_asked_about_once_then_started(settings: Settings,
                                                                sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    at.number_input(key="train.lr").set_value(50.0)
    start(at)
    no_exception(at)
    (warning,) = [as_read(w.value) for w in at.warning if "Check before starting" in w.value]
    assert "press Start again" in warning and "train.lr = 50.0: a learning rate above 1 usually diverges" in warning
    assert queued_runs(sessions) == []
    start(at)
    assert [r["name"] for r in queued_runs(sessions)] == ["run"]


def test_a_name_with_a_space_is_refused_in_words(settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    at.text_input(key="name").input("my run")
    start(at)
    (error,) = refusals(at)
    assert error == ("name = 'my run': use letters, digits, '.', '_' and '-', starting with a letter or digit "
                     "(no spaces)")
    assert "pattern" not in error


def test_too_many_ranks_is_rejected_and_nothing_queued(settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    at.number_input(key="launch.nproc_per_node").set_value(64)
    start(at)
    no_exception(at)
    errors = refusals(at)
    assert len(errors) == 1
    assert errors[0].startswith("launch.nproc_per_node = 64")
    assert "this machine has only" in errors[0]
    assert queued_runs(sessions) == []


def test_every_problem_is_reported_at_once(settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    at.text_input(key="name").set_value("bad name!")
    at.number_input(key="train.lr").set_value(-1.0)
    at.number_input(key="launch.nproc_per_node").set_value(64)
    start(at)
    no_exception(at)
    errors = " | ".join(refusals(at))
    for field in ("name = 'bad name!'", "train.lr = -1.0", "launch.nproc_per_node = 64"):
        assert field in errors
    assert queued_runs(sessions) == []


@pytest.mark.both_dbs  # the UI's data layer (app/data.py) on PostgreSQL too
def test_valid_form_queues_one_run_and_opens_it(settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    at.text_input(key="name").set_value("form-run")
    at.text_input(key="tags").set_value("ui, smoke")
    at.number_input(key="launch.nproc_per_node").set_value(1)
    at.number_input(key="train.max_steps").set_value(50)
    at.number_input(key="train.lr").set_value(0.002)
    start(at)
    no_exception(at)
    assert not at.error

    runs = queued_runs(sessions)
    assert len(runs) == 1
    assert runs[0]["name"] == "form-run"
    assert runs[0]["status"] == "QUEUED"
    with sessions() as s:
        config = queries.run_detail(s, runs[0]["id"])["config"]
    assert config["tags"] == ["ui", "smoke"]
    assert config["launch"]["nproc_per_node"] == 1
    assert config["train"]["max_steps"] == 50
    assert config["train"]["lr"] == pytest.approx(0.002)
    assert (Path(settings.run_dir(runs[0]["id"])) / "config.json").is_file()

    # The page switched to the new run.
    assert at.query_params["run"] == str(runs[0]["id"])
    assert f"#{runs[0]['id']} form-run" in at.markdown[0].value
    assert "QUEUED" in at.markdown[0].value


def test_errors_clear_after_a_corrected_submit(settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    at.number_input(key="train.lr").set_value(-1.0)
    start(at)
    assert at.error
    at.number_input(key="train.lr").set_value(0.001)
    at.number_input(key="launch.nproc_per_node").set_value(1)
    start(at)
    no_exception(at)
    assert len(queued_runs(sessions)) == 1
    at.switch_page("views/new_run.py").run()
    assert not at.error


PASTED = 'name = "pasted"\n[launch]\nnproc_per_node = 1\n[train]\nmax_steps = 40\nlr = 0.005\n'


def paste(at: AppTest, text: str) -> None:
    """Type ``text`` into the paste box (part of the form: it is sent with the next press)."""
    at.text_area(key="new_run_pasted").input(text)


def press(at: AppTest, label: str) -> AppTest:
    return next(b for b in at.button if b.label == label).click().run()


def test_a_pasted_toml_is_what_starts_never_the_forms_defaults(settings: Settings,
                                                                sessions: sessionmaker[Session]) -> None:
    """Start with a paste the form does not hold yet: the form is filled from it and nothing starts
    (the page says so); the next Start queues what was pasted. Before, the form's defaults (run,
    2 ranks, 3000 steps) were queued and the paste silently dropped."""
    at = open_page("views/new_run.py")
    paste(at, PASTED)
    start(at)
    no_exception(at)
    assert queued_runs(sessions) == []
    assert any("Not started" in w.value and "pasted TOML was not in the form" in w.value for w in at.warning)
    assert at.text_input(key="name").value == "pasted" and at.number_input(key="train.max_steps").value == 40
    start(at)
    (run,) = queued_runs(sessions)
    with sessions() as s:
        config = queries.run_detail(s, run["id"])["config"]
    assert (config["name"], config["launch"]["nproc_per_node"], config["train"]["max_steps"]) == ("pasted", 1, 40)
    assert config["train"]["lr"] == pytest.approx(0.005)


def test_a_paste_applied_with_fill_the_form_keeps_the_persons_later_edits(settings: Settings,
                                                                          sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    paste(at, PASTED)
    press(at, "Fill the form")
    assert any("Form filled from the pasted TOML" in m.value for m in at.success)
    at.text_input(key="name").set_value("edited")
    start(at)
    no_exception(at)
    (run,) = queued_runs(sessions)
    assert run["name"] == "edited"  # the same paste is not applied again over the edit
    with sessions() as s:
        assert queries.run_detail(s, run["id"])["config"]["train"]["max_steps"] == 40


def test_a_paste_that_is_not_toml_refuses_every_start_until_it_is_fixed_or_cleared(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    paste(at, 'name = "half\n[train\n')
    for _ in range(2):
        start(at)
        no_exception(at)
        assert any("the pasted TOML was not loaded" in as_read(e.value) for e in at.error)
        assert queued_runs(sessions) == []
    paste(at, "")
    start(at)
    assert [r["name"] for r in queued_runs(sessions)] == ["run"]  # what the form shows, the box empty


def test_new_run_form_shows_the_chosen_kinds_fields_and_queues_a_gpt_char_run(
        settings: Settings, sessions: sessionmaker[Session]) -> None:
    at = open_page("views/new_run.py")
    keys = {w.key for w in at.number_input} | {w.key for w in at.selectbox}
    assert "workload.hidden" in keys and not keys & {"workload.n_layer", "parallel.strategy"}
    at.selectbox(key="workload.kind").set_value("gpt-char").run()
    no_exception(at)
    keys = {w.key for w in at.number_input} | {w.key for w in at.selectbox}
    assert {"workload.n_layer", "workload.n_embd", "parallel.strategy", "train.precision"} <= keys
    assert "workload.hidden" not in keys
    assert at.number_input(key="workload.n_layer").label == "Transformer blocks (n_layer)"
    at.number_input(key="workload.n_layer").set_value(2)
    at.number_input(key="train.grad_accum").set_value(2)
    at.number_input(key="launch.nproc_per_node").set_value(1)
    at.checkbox(key="train.compile").check()
    next(b for b in at.button if "Start" in b.label).click().run()
    no_exception(at)
    assert not at.error
    (run,) = queued_runs(sessions)
    with sessions() as s:
        config = queries.run_detail(s, run["id"])["config"]
    assert (config["workload"]["kind"], config["workload"]["n_layer"]) == ("gpt-char", 2)
    assert (config["train"]["grad_accum"], config["train"]["compile"]) == (2, True)


class TrainWithSmoothing(TrainConfig):
    label_smoothing: float = Field(default=0.0, ge=0, le=1, allow_inf_nan=False)
    """Share of the target probability spread over the other classes."""


class RunConfigWithSmoothing(RunConfig):
    """A RunConfig with a field the page has never heard of."""

    train: TrainWithSmoothing = Field(default=TrainWithSmoothing(), json_schema_extra={"common": True})


def test_a_field_added_to_the_config_appears_on_the_new_run_page(
        settings: Settings, monkeypatch: pytest.MonkeyPatch) -> None:
    """No UI edit: the page draws whatever RunConfig declares."""
    monkeypatch.setattr("db.vocabulary.config.RunConfig", RunConfigWithSmoothing)
    at = open_page("views/new_run.py")
    no_exception(at)
    smoothing = at.number_input(key="train.label_smoothing")
    assert (smoothing.label, smoothing.value, smoothing.min, smoothing.max) == ("Label smoothing", 0.0, 0.0, 1.0)
    assert smoothing.help.startswith("Share of the target probability spread over the other classes.")


def test_a_submit_answers_once_with_every_refusal_and_the_warnings(
        settings: Settings, sessions: sessionmaker[Session], tmp_path_factory: pytest.TempPathFactory) -> None:
    """Issue 29, item 11: the model's checks across fields (all of them, not the first), the refused
    path and the learning-rate warning come in the one answer to Start; once the refusals are fixed,
    the next Start queues the run (the warning was seen beside them, and is not asked again)."""
    outside = tmp_path_factory.mktemp("elsewhere") / "input.txt"  # beside the home, not in it
    outside.write_text("to be or not to be\n" * 1000)
    at = open_page("views/new_run.py")
    at.selectbox(key="workload.kind").set_value("gpt-char").run()
    at.number_input(key="workload.n_embd").set_value(100)
    at.number_input(key="workload.n_head").set_value(3)
    at.text_input(key="workload.text").input(str(outside))
    at.number_input(key="train.lr").set_value(50.0)
    at.selectbox(key="parallel.strategy").set_value("fsdp")
    at.selectbox(key="train.precision").set_value("fp16")
    start(at)
    no_exception(at)
    errors = refusals(at)
    joined = " | ".join(errors)
    assert "workload.n_embd = 100 must be a multiple of workload.n_head = 3" in joined
    assert "train.precision = 'fp16' with parallel.strategy = 'fsdp' is not supported" in joined
    assert f"workload.text = {str(outside)!r}: {outside.resolve()} is outside" in joined
    (warning,) = [as_read(w.value) for w in at.warning if "train.lr" in w.value]
    assert "Also check" in warning and "train.lr = 50.0: a learning rate above 1 usually diverges" in warning
    assert queued_runs(sessions) == []

    inside = settings.home / "input.txt"
    inside.write_text(outside.read_text())
    at.number_input(key="workload.n_head").set_value(4)
    at.text_input(key="workload.text").input(str(inside))
    at.selectbox(key="train.precision").set_value("bf16")
    at.selectbox(key="parallel.strategy").set_value("ddp")
    start(at)
    no_exception(at)
    assert not refusals(at)
    assert [r["name"] for r in queued_runs(sessions)] == ["run"]  # one Start, no second question about lr
