"""docs/CONFIG.md's generator (db/vocabulary/config/reference.py): the reference is up to date, and
every field of the config is documented where it is declared.
"""

from __future__ import annotations

import typing

from pydantic import BaseModel

from db.vocabulary.config import RunConfig, reference_markdown
from tests.unit.paths import ROOT


def test_config_reference_is_up_to_date() -> None:
    """docs/CONFIG.md is generated from the field docstrings; regenerate with
    `runyard config-reference > docs/CONFIG.md`."""
    assert (ROOT / "docs" / "CONFIG.md").read_text().strip() == reference_markdown().strip()


def test_every_field_is_documented() -> None:
    def walk(model: type[BaseModel]) -> list[str]:
        missing = []
        for name, field in model.model_fields.items():
            ann = field.annotation
            sections = [t for t in (ann, *typing.get_args(ann)) if isinstance(t, type) and issubclass(t, BaseModel)]
            for section in sections:  # a section, or each of a union's (the [workload] kinds)
                missing += walk(section)
            if not sections and not field.description:
                missing.append(name)
        return missing

    assert walk(RunConfig) == []
