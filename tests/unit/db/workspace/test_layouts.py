"""A person's panel layout (db/workspace/layouts.py) on SQLite and PostgreSQL: kept per person and
scope, replaced whole by the next save, read back the same from a new session; a stored layout
that is damaged gives the defaults for the damaged part only, and one of many names keeps at most
NAMES_MAX of its pins and of its sections."""

from __future__ import annotations

import pytest
from sqlalchemy.orm import Session, sessionmaker

from db.models import PanelLayout
from db.workspace.layouts import NAME_MAX, NAMES_MAX, RUNS_SCOPE, Layout, read_layout, save_layout

pytestmark = pytest.mark.both_dbs


def test_a_layout_is_read_back_per_person_and_replaced_by_the_next_save(sessions: sessionmaker[Session]) -> None:
    alice = Layout(pinned=("train/loss", "val/acc"), sections={"sys": False, "train": True}, full="val/acc")
    with sessions() as s:
        assert read_layout(s, "alice") == Layout()  # nobody saved anything: the defaults
        save_layout(s, "alice", alice)
        save_layout(s, "bob", Layout(pinned=("loss",)))
        s.commit()
    with sessions() as s:  # a new session (a new browser session reads the same)
        assert read_layout(s, "alice") == alice
        assert read_layout(s, "bob") == Layout(pinned=("loss",))
        assert read_layout(s, "alice", scope="another") == Layout()
        save_layout(s, "alice", Layout(sections={"sys": True}))
        s.commit()
    with sessions() as s:
        assert read_layout(s, "alice") == Layout(sections={"sys": True})
        assert s.query(PanelLayout).filter_by(person="alice", scope=RUNS_SCOPE).count() == 1


def test_a_damaged_layout_gives_the_defaults_for_what_is_damaged(sessions: sessionmaker[Session]) -> None:
    with sessions() as s:
        for person, text in [("a", "not json"), ("b", "[1, 2]"),
                             ("c", '{"pinned": ["loss", 3, "loss"], "sections": {"sys": "yes", "val": false}, '
                                   '"full": 7}'),
                             ("d", '{"pinned": "loss", "full": "' + "x" * (NAME_MAX + 1) + '"}')]:
            s.add(PanelLayout(person=person, scope=RUNS_SCOPE, layout_json=text, updated_at=0.0))
        s.commit()
    with sessions() as s:
        assert read_layout(s, "a") == Layout() and read_layout(s, "b") == Layout()
        assert read_layout(s, "c") == Layout(pinned=("loss",), sections={"val": False})
        assert read_layout(s, "d") == Layout()


def test_json_round_trip_keeps_an_empty_pin_list_apart_from_none() -> None:
    assert Layout.from_json(Layout(pinned=()).to_json()).pinned == ()
    assert Layout.from_json(Layout().to_json()).pinned is None


def test_pins_and_sections_are_capped_at_names_max() -> None:
    names = [f"m{i}" for i in range(NAMES_MAX + 20)]
    text = Layout(pinned=tuple(names), sections=dict.fromkeys(names, False)).to_json()
    read = Layout.from_json(text)
    assert len(read.pinned or ()) == NAMES_MAX and len(read.sections) == NAMES_MAX
    assert Layout.from_json(read.to_json()) == read  # what is kept is a layout as it would be saved
