"""A run's name, tags and note: one rule each, for a config (``name``, ``tags``) and for a later
edit (``runyard edit``, the Run page's Edit…, orchestrator/run_edits.py) alike.

Names and tags are plain ASCII words, so no control character can be in them; a note is free
text, and control characters other than a line break and a tab are refused in it: a NUL cannot
be stored by PostgreSQL at all (SQLite keeps it, so the same note would work on one database and
fail on the other), and the others rewrite the terminal that ``runyard show`` prints them to.
"""

from __future__ import annotations

import re
import unicodedata
from collections.abc import Sequence

NAME_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"
NAME_MAX = 100
NAME_HELP = "letters, digits, '.', '_' and '-', starting with a letter or digit (no spaces)"
NAME_RULE = f"letters, digits, '.', '_' and '-', starting with a letter or digit, at most {NAME_MAX} characters"
TAG_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9._:/+=-]*$"
TAG_MAX, TAGS_MAX, NOTE_MAX = 40, 20, 4000
TAG_RULE = (f"letters, digits and . _ : / + = -, starting with a letter or digit, at most {TAG_MAX} characters "
            "(no spaces or commas)")
# fullmatch, not match: "$" also matches before a final line break ("name\n").
_NAME = re.compile(NAME_PATTERN.strip("^$"))
_TAG = re.compile(TAG_PATTERN.strip("^$"))
_NOTE_KEEPS = frozenset("\n\t")


def name_problem(name: str) -> str | None:
    """Why ``name`` cannot be a run's name, or None."""
    if not name or len(name) > NAME_MAX or not _NAME.fullmatch(name):
        return f"name {name!r}: use {NAME_RULE}"
    return None


def tag_problem(tag: str) -> str | None:
    """Why ``tag`` cannot be one of a run's tags, or None."""
    if not tag or len(tag) > TAG_MAX or not _TAG.fullmatch(tag):
        return f"tag {tag!r}: use {TAG_RULE}"
    return None


def tags_problems(tags: Sequence[str]) -> list[str]:
    """Every problem with a run's whole list of tags: each bad tag (the first five), and more
    than :data:`TAGS_MAX` of them."""
    bad = [p for t in dict.fromkeys(tags) if (p := tag_problem(t))]
    problems = bad[:5] + ([f"and {len(bad) - 5} more tags like these"] if len(bad) > 5 else [])
    if len(set(tags)) > TAGS_MAX:
        problems.append(f"a run holds at most {TAGS_MAX} tags, not {len(set(tags))}")
    return problems


def control_characters(text: str) -> list[str]:
    """The control characters in ``text`` (but a line break and a tab), and the halves of a
    character that is not text at all (bytes that were not UTF-8, read as surrogates), each as
    ``U+XXXX``, in order, once each."""
    found = (c for c in text if c not in _NOTE_KEEPS and unicodedata.category(c) in ("Cc", "Cs"))
    return [f"U+{ord(c):04X}" for c in dict.fromkeys(found)]


def note_problem(note: str) -> str | None:
    """Why ``note`` (already stripped) cannot be a run's note, or None."""
    if len(note) > NOTE_MAX:
        return f"note: {len(note)} characters; at most {NOTE_MAX}"
    if bad := control_characters(note):
        return (f"note: holds the control character(s) {', '.join(bad)}; a note is text (line breaks and tabs "
                "are kept)")
    return None
