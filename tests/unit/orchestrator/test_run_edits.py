"""An edit of a run's name, tags and note as a decision over plain values
(orchestrator/run_edits.py): what a person asked and what the run is called now give every problem,
or the changes with their sentences and the labels after. No database: the same rules with one,
and the events they write, are tests/unit/orchestrator/test_run_edits_stored.py's."""

from __future__ import annotations

import pytest

from orchestrator.run_edits import Change, EditRequest, Labels, edit_changes, edit_problems

NOW = Labels("baseline", ("a", "b"), "first try")


def request(name: str | None = None, add: tuple[str, ...] = (), remove: tuple[str, ...] = (),
            note: str | None = None) -> EditRequest:
    return EditRequest(name, add, remove, note)


CHANGE_ROWS = [
    # (what was asked, the request, the labels after, the sentences)
    ("nothing", request(), NOW, []),
    ("the same name and a tag the run has", request("baseline", add=("a",)), NOW, []),
    ("a new name", request("lr-sweep"), Labels("lr-sweep", ("a", "b"), "first try"),
     ["renamed 'baseline' to 'lr-sweep'"]),
    ("tags out and in, in the run's order then the asked order", request(add=("z", "c", "z"), remove=("a",)),
     Labels("baseline", ("b", "z", "c"), "first try"), ["tag 'a' removed", "tag 'z' added", "tag 'c' added"]),
    ("a note with Windows line breaks and blank ends", request(note="  two\r\nlines \n"),
     Labels("baseline", ("a", "b"), "two\nlines"), ["note set: 'two\\nlines'"]),
    ("a blank note clears it", request(note="  "), Labels("baseline", ("a", "b"), None), ["note cleared"]),
    ("the same note again", request(note="first try\n"), NOW, []),
]


@pytest.mark.parametrize(("name", "asked", "after", "says"), CHANGE_ROWS, ids=[row[0] for row in CHANGE_ROWS])
def test_what_an_edit_changes(name: str, asked: EditRequest, after: Labels, says: list[str]) -> None:
    assert edit_problems(7, NOW, asked) == []
    assert edit_changes(NOW, asked) == (after, says)


PROBLEM_ROWS = [
    # (what was asked, the request, the start of each problem, in order)
    ("a name with a space", request("my run"), ["name 'my run': use letters"]),
    ("a bad tag and a tag the run lacks", request(add=("x y",), remove=("nope",)),
     ["tag 'x y': use letters", "remove tag 'nope': run 7 has no such tag (its tags: a, b)"]),
    ("a tag both added and removed", request(add=("a",), remove=("a",)), ["tag 'a' is both added and removed"]),
    ("more tags than a run holds", request(add=tuple(f"t{i}" for i in range(19))),
     ["tags: a run holds at most 20; run 7 would have 21"]),
    ("a note with a control character", request(note="bell\a"), ["note: holds the control character(s) U+0007"]),
    ("every problem at once", request("my run", add=("x y",), note="\x00"),
     ["name 'my run'", "tag 'x y'", "note: holds"]),
]


@pytest.mark.parametrize(("name", "asked", "starts"), PROBLEM_ROWS, ids=[row[0] for row in PROBLEM_ROWS])
def test_what_refuses_an_edit(name: str, asked: EditRequest, starts: list[str]) -> None:
    problems = edit_problems(7, NOW, asked)
    assert len(problems) == len(starts) and all(p.startswith(s) for p, s in zip(problems, starts, strict=True)), \
        problems


def test_every_change_has_a_row() -> None:
    sentences = {s for row in CHANGE_ROWS for s in row[3]}
    for change in Change:
        prefix = change.value.split("{", 1)[0]
        assert any(s.startswith(prefix) for s in sentences), change
