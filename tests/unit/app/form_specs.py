"""The New run form's fields by key, and the machine its values are validated for, as the form's
tests read them.
"""

from __future__ import annotations

from app.form import FieldSpec
from db.vocabulary.inventory import Inventory

CPU = Inventory(kind="cpu", slots=2, memory_bytes=16 * 1024**3)


def by_key(specs: list[FieldSpec]) -> dict[str, FieldSpec]:
    """``specs`` by their key ("section.name")."""
    return {spec.key: spec for spec in specs}
