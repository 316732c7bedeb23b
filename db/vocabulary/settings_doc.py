"""The tables of the ``RUNYARD_*`` variables in the docs, generated from the models of
:mod:`db.vocabulary.settings` (:class:`~db.vocabulary.settings.EnvSettings` in docs/OPERATIONS.md,
:class:`~db.vocabulary.settings.RankEnv` in docs/SCRIPTS.md, :class:`~db.vocabulary.settings.FaultEnv` in
docs/DEVELOPMENT.md), between two marker lines.

    python -m db.vocabulary.settings_doc          # rewrite the tables
    python -m db.vocabulary.settings_doc --check  # exit 1, naming the file, when a table differs from its model

``tests/unit/db/vocabulary/test_settings.py`` fails when a table is out of date.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path
from typing import Any, Literal, get_args, get_origin

import annotated_types
from pydantic import SecretStr
from pydantic.fields import FieldInfo

from db.vocabulary.settings import EnvSettings, FaultEnv, RankEnv, _RunyardVariables

DOCS = Path(__file__).resolve().parents[2] / "docs"
# Each model's table and the document it lives in.
TABLES: dict[type[_RunyardVariables], str] = {EnvSettings: "OPERATIONS.md", RankEnv: "SCRIPTS.md",
                                               FaultEnv: "DEVELOPMENT.md"}
_TYPES: dict[Any, str] = {Path: "path", int: "whole number", float: "number", str: "text", bool: "true/false",
                          SecretStr: "text (kept secret)"}


def begin_marker(model: type[_RunyardVariables]) -> str:
    return (f"<!-- BEGIN {model.__name__}: generated from db/vocabulary/settings.py by "
            "`python -m db.vocabulary.settings_doc` -->")


def end_marker(model: type[_RunyardVariables]) -> str:
    return f"<!-- END {model.__name__} -->"


def _type(info: FieldInfo) -> str:
    args = [a for a in get_args(info.annotation) if a is not type(None)] or [info.annotation]
    base = args[0]
    if get_origin(base) is Literal:
        text = " or ".join(f"`{v}`" for v in get_args(base))
    else:
        text = _TYPES.get(base, getattr(base, "__name__", str(base)))
    for bound in info.metadata:
        if isinstance(bound, annotated_types.Ge):
            text += f", at least {bound.ge}"
    return text


def _default(info: FieldInfo) -> str:
    value = info.default
    return "unset" if value is None or value == "" else f"`{value}`"


def table(model: type[_RunyardVariables]) -> str:
    """The markdown table of ``model``: variable, type, default, meaning."""
    rows = ["| Variable | Type | Default | Meaning |", "| --- | --- | --- | --- |"]
    for field, info in model.model_fields.items():
        meaning = (info.description or "").replace("|", "\\|")
        rows.append(f"| `{model.variable(field)}` | {_type(info)} | {_default(info)} | {meaning} |")
    return "\n".join(rows)


def with_table(text: str, model: type[_RunyardVariables]) -> str:
    """``text`` (a document) with the table between ``model``'s markers replaced by the model's own.

    Raises:
        ValueError: the document lacks the markers.
    """
    begin, end = begin_marker(model), end_marker(model)
    if begin not in text or end not in text:
        raise ValueError(f"the document has no {begin!r} ... {end!r} lines to put the table of {model.__name__} in")
    head, rest = text.split(begin, 1)
    _, tail = rest.split(end, 1)
    return f"{head}{begin}\n{table(model)}\n{end}{tail}"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m db.vocabulary.settings_doc", description=__doc__.split("\n\n")[0])
    parser.add_argument("--check", action="store_true", help="change nothing; exit 1 when a table is out of date")
    args = parser.parse_args(argv)
    stale = []
    for model, name in TABLES.items():
        path = DOCS / name
        text = path.read_text()
        wanted = with_table(text, model)
        if wanted != text:
            stale.append(path)
            if not args.check:
                path.write_text(wanted)
    for path in stale:
        print(f"{path}: {'out of date' if args.check else 'rewritten'}", file=sys.stderr)
    return 1 if stale and args.check else 0


if __name__ == "__main__":
    sys.exit(main())
