"""A run's tags and note (db/vocabulary/config/labels.py; issue 52, item 13): one rule for each,
whichever path they come by. A config's ``tags`` follow the rule of ``runyard edit --add-tag``,
while a config runyard stored before the rule still opens; a note holds no control character (a
NUL is stored by SQLite and refused by PostgreSQL): it is refused before anything is written.
"""

from __future__ import annotations

import json

import pytest
from click.testing import CliRunner
from sqlalchemy import select
from sqlalchemy.orm import Session, sessionmaker

from db.models import Event
from db.vocabulary.config import ConfigError, config_from_json, parse_config
from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli
from orchestrator.run_edits import EditRefused, edit_run
from orchestrator.submission import submit
from tests.unit.orchestrator.fake_runs import CPU2
from tests.unit.paths import ROOT

EXAMPLE = str(ROOT / "examples" / "digits.toml")


def run(*args: str) -> tuple[int, str, str]:
    result = CliRunner().invoke(cli, list(args))
    return result.exit_code, result.stdout, result.stderr


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
