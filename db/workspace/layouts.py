"""How one person arranged the Run page's charts, kept across browser sessions (issue 56 item 7):
the curves pinned on the Overview, the Metrics sections they opened or closed, and the chart they
opened full width. One row of ``panel_layouts`` per person and scope (db/models.py:
``PanelLayout``), its layout as JSON; plain data in and out, no ORM object leaves this module.

A layout names metrics and sections, never a run: a new run opens as the last one was left (W&B
keeps a project's workspace layout the same way). The scope says what a layout holds for
(:data:`RUNS_SCOPE`: every run of the data folder); a stored layout that cannot be read is taken
as no layout (the defaults), never an error on the page.
"""

from __future__ import annotations

import json
import time
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import select
from sqlalchemy.orm import Session

from db.models import PanelLayout

RUNS_SCOPE = "runs"  # the layout every Run page of the data folder opens with
PERSON_MAX, NAME_MAX, NAMES_MAX = 255, 200, 500  # a person's key; a metric or section name; names kept


@dataclass(frozen=True)
class Layout:
    """One person's panel layout.

    Attributes:
        pinned: The metric names pinned on the Overview, in the order chosen; None until the
            person pins (the page then shows the loss and the headline metric).
        sections: Section name -> whether the person left it open; a section missing here opens
            as the page decides (every one, or the first few of a run with many metrics).
        full: The metric whose chart is open full width in its section, or None.
    """

    pinned: tuple[str, ...] | None = None
    sections: dict[str, bool] = field(default_factory=dict)
    full: str | None = None

    def to_json(self) -> str:
        return json.dumps({"pinned": None if self.pinned is None else list(self.pinned),
                           "sections": dict(sorted(self.sections.items())), "full": self.full}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | None) -> Layout:
        """The layout ``text`` holds; what is not a layout's (another shape, a wrong type, an
        over-long name) is dropped, so a damaged row gives the defaults for that part only, and
        at most :data:`NAMES_MAX` pins and sections are kept."""
        try:
            raw: Any = json.loads(text) if text else {}
        except ValueError:
            raw = {}
        if not isinstance(raw, dict):
            raw = {}
        pinned = raw.get("pinned")
        sections = raw.get("sections")
        full = raw.get("full")
        return cls(
            pinned=tuple(_names(pinned)) if isinstance(pinned, list) else None,
            sections=dict([(k, v) for k, v in sections.items() if _name(k) and isinstance(v, bool)][:NAMES_MAX])
            if isinstance(sections, dict) else {},
            full=full if _name(full) else None,
        )


def _name(value: object) -> bool:
    return isinstance(value, str) and 0 < len(value) <= NAME_MAX


def _names(values: list[Any]) -> list[str]:
    return list(dict.fromkeys(v for v in values if _name(v)))[:NAMES_MAX]


def read_layout(session: Session, person: str, scope: str = RUNS_SCOPE) -> Layout:
    """``person``'s layout for ``scope``; the defaults (``Layout()``) when they have none."""
    text = session.scalar(select(PanelLayout.layout_json).where(PanelLayout.person == person[:PERSON_MAX],
                                                                 PanelLayout.scope == scope))
    return Layout.from_json(text)


def save_layout(session: Session, person: str, layout: Layout, scope: str = RUNS_SCOPE,
                now: float | None = None) -> None:
    """Keep ``layout`` as ``person``'s for ``scope`` (replacing the one before); the caller commits."""
    row = session.get(PanelLayout, (person[:PERSON_MAX], scope))
    text = Layout.from_json(layout.to_json()).to_json()  # held to the same bounds as what is read
    at = time.time() if now is None else now
    if row is None:
        session.add(PanelLayout(person=person[:PERSON_MAX], scope=scope, layout_json=text, updated_at=at))
    else:
        row.layout_json, row.updated_at = text, at
