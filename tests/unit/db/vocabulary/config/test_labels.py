"""Issue 52, item 13: one rule for each thing a person types, whichever path it comes by.

- ``[alerts] channels`` must name channels that exist (the error lists them), at submit from the
  CLI and the UI, and in a fork;
- a config's ``tags`` follow the rule of ``runyard edit --add-tag`` (one rule, both paths), while
  a config runyard stored before the rule still opens;
- a note holds no control character (a NUL is stored by SQLite and refused by PostgreSQL): it is
  refused before anything is written; names and tags cannot hold one at all;
- a share logged as a percentage already (nanoGPT's ``mfu`` x 100) is not multiplied again.
"""

from __future__ import annotations

import csv
import io
import json
import time

import pandas as pd
import pytest
from click.testing import CliRunner
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from app.charts.metric import displayed
from db.metricstore import write_points
from db.models import Attempt, Event
from db.vocabulary import metric_registry
from db.vocabulary.config import ConfigError, config_from_json, parse_config
from db.vocabulary.settings import Settings
from orchestrator.alerts.store import AlertStore
from orchestrator.cli.group import cli
from orchestrator.run_edits import EditRefused, edit_run
from orchestrator.submission import submit, validate
from tests.unit.orchestrator.fake_runs import CPU2
from tests.unit.paths import ROOT

EXAMPLE = str(ROOT / "examples" / "digits.toml")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


def test_alert_channels_of_a_config_must_exist(settings: Settings, sessions: sessionmaker[Session]) -> None:
    code, _, err = run("submit", EXAMPLE, "--set", 'alerts.channels=["99"]')
    assert code == 2 and "alerts.channels = ['99']: no channel 99; there are no channels yet" in err
    store = AlertStore(settings.home)
    store.add("json://hooks.example.com/a")
    store.add("ntfy://ntfy.sh/runs")
    with pytest.raises(ConfigError) as refused:  # the UI's path: validate with the data folder
        validate({"alerts": {"channels": ["1", "99"]}}, CPU2, channels=store.config_problems)
    assert str(refused.value).count("no channel") == 1
    assert ("alerts.channels = ['1', '99']: no channel 99; the channels: 1: json://hooks.example.com/***; "
            "2: ntfy://ntfy.sh/*** (`runyard alerts ls`)") in str(refused.value)
    with pytest.raises(ConfigError, match="no channel 99"):  # and submit itself, whoever validated before
        submit(sessions, settings, parse_config({"alerts": {"channels": ["99"]}}), CPU2, channels=store.config_problems)
    code, out, err = run("submit", EXAMPLE, "--set", 'alerts.channels=["2"]')
    assert code == 0 and out.strip() == "1", err
    # A channel written before hosts were checked (by hand here) cannot be named by a new run.
    data = json.loads(store.path.read_text())
    data["channels"].append({"id": 3, "url": "json://2852039166/", "on": [], "secret": None, "allow": []})
    store.path.write_text(json.dumps(data))
    code, _, err = run("submit", EXAMPLE, "--set", 'alerts.channels=["3"]')
    assert code == 2 and "channel 3 cannot be used" in err and "169.254.169.254, a cloud metadata address" in err


BAD_TAGS = [
    ("markup", ["<b>tag</b>"], "tag '<b>tag</b>': use letters, digits"),
    ("a space", ["two words"], "tag 'two words'"),
    ("a line break", ["tag\n"], "tag 'tag\\n'"),
    ("41 characters", ["t" * 41], "at most 40 characters"),
    ("10,000 tags", [f"t{i}" for i in range(10_000)], "a run holds at most 20 tags, not 10000"),
]


@pytest.mark.parametrize(("tags", "said"), [c[1:] for c in BAD_TAGS], ids=[c[0] for c in BAD_TAGS])
def test_config_tags_follow_the_rule_of_edit_add_tag(settings: Settings, sessions: sessionmaker[Session],
                                                    tags: list[str], said: str) -> None:
    with pytest.raises(ConfigError) as refused:
        parse_config({"tags": tags})
    text = str(refused.value)
    assert "tags = [" in text and said in text and len(text) < 2000  # 10,000 tags are not all printed back
    config = parse_config({"name": "tagged"})
    run_id = submit(sessions, settings, config, CPU2)
    with sessions() as s, pytest.raises(EditRefused) as edited:  # the same rule, the same words
        edit_run(s, run_id, add_tags=tags[:21])
    assert ("a run holds at most 20" if len(tags) > 20 else said) in str(edited.value)


def test_a_config_stored_with_tags_before_the_rule_still_opens() -> None:
    stored = parse_config({"name": "old"}).as_dict() | {"tags": ["<b>kept</b>"]}
    assert config_from_json(json.dumps(stored)).tags == ("<b>kept</b>",)


@pytest.mark.parametrize("note", ["a\x00b", "colour \x1b[31mred", "back\x08space", "bytes \udcff"],
                         ids=["NUL", "escape", "backspace", "not UTF-8"])
def test_a_control_character_in_a_note_is_refused_before_anything_is_written(
        settings: Settings, sessions: sessionmaker[Session], note: str) -> None:
    run("submit", EXAMPLE)
    code, _, err = run("edit", "1", "--note", note, "--add-tag", "kept-out")
    assert code == 2 and "note: holds the control character(s) U+" in err, err
    with sessions() as s:
        assert s.scalars(select(Event).where(Event.kind == "edit")).all() == []
    shown = json.loads(run("show", "1", "--json")[1])
    assert (shown["note"], shown["tags"]) == (None, [])
    code, _, err = run("edit", "1", "--note", "line one\n\tline two")  # line breaks and tabs are text
    assert code == 0 and json.loads(run("show", "1", "--json")[1])["note"] == "line one\n\tline two", err


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
