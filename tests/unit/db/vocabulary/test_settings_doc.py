"""The docs' tables of the RUNYARD_* variables (db/vocabulary/settings_doc.py): generated from the
models, and `python -m db.vocabulary.settings_doc` rewrites a stale one, which `--check` reports.
"""

from __future__ import annotations

from pathlib import Path

import pytest

import db.vocabulary.settings_doc as doc
from db.vocabulary.settings import _RunyardVariables
from db.vocabulary.settings_doc import DOCS, TABLES, main, with_table


@pytest.mark.parametrize("model", list(TABLES))
def test_the_docs_tables_are_generated_from_the_models(model: type[_RunyardVariables]) -> None:
    """Regenerate with `python -m db.vocabulary.settings_doc`."""
    text = (DOCS / TABLES[model]).read_text()
    assert with_table(text, model) == text
    for field in model.model_fields:
        assert f"| `{model.variable(field)}` |" in text


def test_the_doc_script_rewrites_a_stale_table_and_check_says_so(tmp_path: Path, monkeypatch) -> None:
    for name in TABLES.values():
        (tmp_path / name).write_text((DOCS / name).read_text().replace("The run's number.", "stale"))
    monkeypatch.setattr(doc, "DOCS", tmp_path)
    assert main(["--check"]) == 1
    assert "stale" in (tmp_path / "SCRIPTS.md").read_text()  # --check changes nothing
    assert main([]) == 0
    assert main(["--check"]) == 0
    assert (tmp_path / "SCRIPTS.md").read_text() == (DOCS / "SCRIPTS.md").read_text()
