"""The Runs list: which runs it shows (statuses, search words, tags, starred, archived), in which
order, and the tags there are to filter by. Each run as :mod:`db.run_summary` summarises it."""

from __future__ import annotations

import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import or_, select
from sqlalchemy.orm import Session

from db.models import Run
from db.run_summary import _RUN_COLUMNS, AnyRow, _run_summaries

# What the Runs list and `runyard ls --sort` order by: a name -> the summary field it reads.
LIST_SORTS: dict[str, str] = {
    "id": "id", "name": "name", "status": "status", "created": "created_at", "step": "step",
    "progress": "progress", "elapsed": "elapsed_s", "cost": "cost_usd", "projected": "cost_projected_usd",
    "attempts": "attempt_count", "best_loss": "best_loss", "headline": "headline_value", "starred": "starred",
}
@dataclass(frozen=True)
class RunFilter:
    """Which runs a list shows.

    Attributes:
        statuses: Only these statuses (all when empty).
        search: Words that must all match (case-insensitive): each a part of the run's name, one
            of its tags, its note or a config value; ``key=value`` matches a config value exactly
            (``train.lr=0.001``, or the last part of the key alone: ``lr=0.001``).
        tags: Only runs with at least one of these tags (all when empty).
        starred: Only starred runs.
        archived: Show archived runs too (hidden otherwise).
    """

    statuses: tuple[str, ...] = ()
    search: str = ""
    tags: tuple[str, ...] = ()
    starred: bool = False
    archived: bool = False


def _like(text: str) -> str:
    """``text`` as a LIKE pattern that matches it anywhere, its wildcards escaped."""
    return "%" + text.replace("\\", "\\\\").replace("%", "\\%").replace("_", "\\_") + "%"


def _search_terms(search: str) -> list[tuple[str | None, str]]:
    """The search words as (config key or None, text), lower case."""
    terms: list[tuple[str | None, str]] = []
    for word in search.split():
        key, eq, value = word.partition("=")
        terms.append((key.lower(), value.lower()) if eq and key and value else (None, word.lower()))
    return terms


def _matches(row: AnyRow, terms: list[tuple[str | None, str]]) -> bool:
    """Whether the run ``row`` (with its config_json) matches every search term."""
    config = {k.lower(): v for k, v in flatten(json.loads(row.config_json)).items()}
    values = [str(v).lower() for v in config.values()]
    tags = [str(t).lower() for t in json.loads(row.tags_json or "[]")]
    for key, text in terms:
        if key is not None:
            found = [v for k, v in config.items() if k == key or k.endswith("." + key)]
            if not any(_equal(v, text) for v in found):
                return False
        elif not (text in row.name.lower() or any(text in t for t in tags) or text in (row.note or "").lower()
                  or any(text in v for v in values)):
            return False
    return True


def _equal(value: Any, text: str) -> bool:
    """A config value equals a search's text: as text, or as a number (``1e-3`` = ``0.001``), or
    one element of a list."""
    if isinstance(value, list):
        return any(_equal(v, text) for v in value)
    if str(value).lower() == text:
        return True
    if isinstance(value, (int, float)) and not isinstance(value, bool):
        try:
            return float(text) == float(value)
        except ValueError:
            return False
    return False


def sort_runs(runs: list[dict[str, Any]], sort: str, descending: bool) -> list[dict[str, Any]]:
    """``runs`` (summaries) ordered by ``LIST_SORTS[sort]``, those without a value last either
    way, ties newest first.

    Raises:
        ValueError: ``sort`` is not a key of :data:`LIST_SORTS` (the message lists them).
    """
    if sort not in LIST_SORTS:
        raise ValueError(f"sort {sort!r}: use one of {', '.join(LIST_SORTS)}")
    field = LIST_SORTS[sort]
    with_value = [r for r in runs if r.get(field) is not None and r.get(field) == r.get(field)]  # NaN: no value
    without = [r for r in runs if r not in with_value]

    def key(r: dict[str, Any]) -> Any:
        value = r[field]
        return value.lower() if isinstance(value, str) else value

    ordered = sorted(sorted(with_value, key=lambda r: -r["id"]), key=key, reverse=descending)
    return ordered + without


def list_runs(session: Session, statuses: list[str] | None = None, limit: int = 200,
              now: float | None = None, *, where: RunFilter | None = None, sort: str = "id",
              descending: bool = True) -> list[dict[str, Any]]:
    """The newest matching runs, ordered as asked (db.compare.runs_list adds the summary metric
    columns, and sorts by them too).

    Reads a fixed number of statements whatever the number of runs (see :func:`_run_summaries`):
    the Runs page calls this every two seconds per open tab.

    Args:
        session: Where to read.
        statuses: Only runs in these statuses (all when None or empty); added to ``where``'s.
        limit: The most runs: the newest ``limit`` that match, then sorted.
        now: The time running attempts are counted up to (default: the wall clock).
        where: Which runs (:class:`RunFilter`; default: every run not archived).
        sort: A key of :data:`LIST_SORTS` (``best_loss`` and ``headline`` need db.compare.runs_list).
        descending: Largest first (newest first for ``id``).

    Raises:
        ValueError: ``sort`` is not a key of :data:`LIST_SORTS` (the message lists them).
    """
    where = where or RunFilter()
    wanted = [*where.statuses, *(statuses or [])]
    terms = _search_terms(where.search)
    columns = (*_RUN_COLUMNS, Run.config_json) if terms else _RUN_COLUMNS
    q = select(*columns).order_by(Run.id.desc())
    if wanted:
        q = q.where(Run.status.in_(wanted))
    if not where.archived:
        q = q.where(Run.archived.is_(False))
    if where.starred:
        q = q.where(Run.starred.is_(True))
    if where.tags:
        q = q.where(or_(*(Run.tags_json.like(_like(json.dumps(t)), escape="\\") for t in where.tags)))
    for key, text in terms:  # narrowed in SQL; exactly (values only, not keys) below
        pattern = _like(text if key is None else json.dumps(key.rsplit(".", 1)[-1]) + ":")  # a key as JSON spells it
        q = q.where(Run.config_json.ilike(pattern, escape="\\") if key is not None else or_(
            Run.name.ilike(pattern, escape="\\"), Run.tags_json.ilike(pattern, escape="\\"),
            Run.note.ilike(pattern, escape="\\"), Run.config_json.ilike(pattern, escape="\\")))
    rows: Sequence[AnyRow]
    if terms or where.tags:
        rows = [r for r in session.execute(q).all()
                if (not terms or _matches(r, terms))
                and (not where.tags or set(where.tags) & set(json.loads(r.tags_json or "[]")))][:limit]
    else:
        rows = session.execute(q.limit(limit)).all()
    now = time.time() if now is None else now
    summaries = _run_summaries(session, rows, now)
    return summaries if sort == "id" and descending else sort_runs(summaries, sort, descending)


def flatten(config: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    """A nested config as ``{"section.key": value}``; a value that is not a dict (a list, an
    empty dict) is kept whole."""
    flat: dict[str, Any] = {}
    for key, value in config.items():
        path = f"{prefix}{key}"
        if isinstance(value, Mapping) and value:
            flat.update(flatten(value, f"{path}."))
        else:
            flat[path] = value
    return flat


def run_tags(session: Session) -> list[str]:
    """Every tag some run has, sorted (the Runs list's tag filter)."""
    tags: set[str] = set()
    for (text,) in session.execute(select(Run.tags_json).distinct()):
        tags.update(json.loads(text or "[]"))
    return sorted(tags)


def run_configs(session: Session, run_ids: Sequence[int] | None = None, limit: int = 200) -> dict[int, dict[str, Any]]:
    """Each run's config, flattened (``{"train.lr": 0.001, ...}``), by run id, in one statement: what
    the Runs page groups by and draws its parallel coordinates from. ``run_ids`` None: the newest
    ``limit`` runs (the keys there are to group by). An id of no run is left out."""
    q = select(Run.id, Run.config_json)
    if run_ids is None:
        q = q.order_by(Run.id.desc()).limit(limit)
    elif not run_ids:
        return {}
    else:
        q = q.where(Run.id.in_(list(run_ids)))
    return {row.id: flatten(json.loads(row.config_json or "{}")) for row in session.execute(q).all()}
