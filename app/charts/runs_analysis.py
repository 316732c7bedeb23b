"""The Runs table as an analysis tool: a filter on the runs' numbers (``best loss < 0.01, steps >=
1000``) and the runs grouped by a config value or by tag, each group with its count and its best
loss. Plain rows in (db.compare.runs_list's summaries, db.run_list.run_configs' flattened
configs), plain values out; app/views/runs.py draws them.

A filter is clauses joined by ``,`` or ``and``, each a field, a comparison (``<``, ``>``, ``<=``,
``>=``, ``=``) and a number: ``$`` before a cost, ``%`` after a progress, ``s``/``m``/``h``/``d``
after a duration are allowed, and commas between thousands (``1,000``); any other comma in a number
(a decimal comma, ``0,01``) makes it no number, said, never read as something else. A comma joins
two clauses only where a field's name follows it. A run matches when it matches every clause; a run without the
field's value (no loss yet) matches none. A bad filter raises :class:`FilterError`, whose message
names every wrong clause and the fields there are.
"""

from __future__ import annotations

import dataclasses
import operator
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from app.charts.values import is_number, value_text

NOT_SET = "not set"  # the group of the runs whose config lacks the key (or runs without a tag)
NO_GROUPING = "no grouping"
BY_TAG = "tag"
OPERATORS: dict[str, Callable[[float, float], bool]] = {
    "<=": operator.le, ">=": operator.ge, "<": operator.lt, ">": operator.gt, "==": operator.eq, "=": operator.eq,
}
# A comma joins clauses where a field's name follows it; "and" always does.
SEPARATOR = re.compile(r",(?=\s*[A-Za-z_])|\band\b", re.IGNORECASE)
THOUSANDS = re.compile(r"^[1-9]\d{0,2}(,\d{3})+(\.\d+)?$")  # 1,000 and 12,345.5; not 0,010 nor 1,5
CLAUSE = re.compile(r"^(?P<field>[A-Za-z_][A-Za-z_ .]*?)\s*(?P<op><=|>=|==|<|>|=)\s*(?P<value>.*)$")
DURATION_UNITS = {"s": 1.0, "m": 60.0, "h": 3600.0, "d": 86400.0}
EXAMPLE = "best loss < 0.01"


class FilterError(ValueError):
    """A filter that cannot be read (the message says which clause, why, and the fields there are)."""


def _your_cost(r: Mapping[str, Any]) -> Any:
    return ((r.get("cost") or {}).get("yours") or {}).get("usd")


def _percent(r: Mapping[str, Any]) -> Any:
    p = r.get("progress")
    return None if p is None else 100.0 * p


# The fields a filter compares: a name -> (its value in a run's summary, its unit: "" a plain
# number, "usd", "percent", "duration"). Names are the table's column titles.
FIELDS: dict[str, tuple[Callable[[Mapping[str, Any]], Any], str]] = {
    "best loss": (lambda r: r.get("best_loss"), ""),
    "headline": (lambda r: r.get("headline_value"), ""),
    "steps": (lambda r: r.get("step"), ""),
    "progress": (_percent, "percent"),
    "duration": (lambda r: r.get("elapsed_s"), "duration"),
    "cost": (lambda r: r.get("cost_usd"), "usd"),
    "your cost": (_your_cost, "usd"),
    "projected": (lambda r: r.get("cost_projected_usd"), "usd"),
    "attempts": (lambda r: r.get("attempt_count"), ""),
}
# Other names a person may type for a field (the column's header, the database's key).
ALIASES = {"loss": "best loss", "headline metric": "headline", "step": "steps", "elapsed": "duration",
           "cloud ref": "cost", "cloud ref.": "cost", "cost usd": "cost", "attempt": "attempts",
           "attempt count": "attempts", "headline value": "headline", "projected cost": "projected"}


@dataclass(frozen=True)
class Clause:
    """One comparison: ``field`` (a key of :data:`FIELDS`) ``op`` ``value`` (in the field's unit:
    seconds, dollars, percent); ``said``: the number as the person typed it (``2h``, ``$1.5``,
    ``50%``), what the page echoes."""

    field: str
    op: str
    value: float
    said: str = dataclasses.field(default="", compare=False)  # not compared: 1,000 and 1000 are one clause

    def matches(self, run: Mapping[str, Any]) -> bool:
        got = FIELDS[self.field][0](run)
        return is_number(got) and OPERATORS[self.op](float(got), self.value)

    def __str__(self) -> str:
        return f"{self.field} {'=' if self.op == '==' else self.op} {self.said or repr(self.value)}"


def fields_text() -> str:
    return ", ".join(FIELDS)


def _number(text: str, unit: str) -> float | None:
    """``text`` as a number in ``unit`` (``$1.5``, ``50%``, ``2h``, ``1,000``); None when it is
    none (a comma other than between thousands: ``0,01``)."""
    text = "".join(text.split()).replace("_", "")
    scale = 1.0
    if unit == "usd":
        text = text.removeprefix("$").strip()
    elif unit == "percent":
        text = text.removesuffix("%").strip()
    elif unit == "duration" and text[-1:].lower() in DURATION_UNITS:
        scale, text = DURATION_UNITS[text[-1].lower()], text[:-1].strip()
    if "," in text:
        if THOUSANDS.match(text) is None:
            return None
        text = text.replace(",", "")
    try:
        value = float(text) * scale
    except ValueError:
        return None
    return value if is_number(value) else None


def _field_name(text: str) -> str | None:
    name = " ".join(text.replace("_", " ").lower().split())
    name = ALIASES.get(name, name)
    return name if name in FIELDS else None


def parse_filter(text: str) -> list[Clause]:
    """The clauses of a filter (none for an empty one).

    Raises:
        FilterError: A clause is not ``field comparison number``, names no field, or compares
            with something that is not a number; every wrong clause is named, with the fields.
    """
    clauses: list[Clause] = []
    problems: list[str] = []
    for part in SEPARATOR.split(text):
        if not (part := part.strip()):
            continue
        m = CLAUSE.match(part)
        if m is None:
            problems.append(f"“{part}” is not a comparison: write a field, then <, >, <= or >=, then a number "
                            f"(“{EXAMPLE}”)")
            continue
        name = _field_name(m["field"])
        if name is None:
            problems.append(f"“{m['field'].strip()}” is no field to filter on")
            continue
        value = _number(m["value"], FIELDS[name][1])
        if value is None:
            said = m["value"].strip()
            problems.append(f"“{part}”: {'nothing' if not said else '“' + said + '”'} is not a number"
                            + {"usd": " (a cost in dollars: cost < 1.5)", "percent": " (progress >= 50%)",
                               "duration": " (duration > 2h, or seconds)"}.get(FIELDS[name][1], ""))
            continue
        clauses.append(Clause(name, m["op"], value, "".join(m["value"].split())))
    if problems:
        raise FilterError("; ".join(problems) + f". The fields: {fields_text()}.")
    return clauses


def filtered(runs: Sequence[dict[str, Any]], clauses: Sequence[Clause]) -> list[dict[str, Any]]:
    """The runs that match every clause, in their order."""
    return [r for r in runs if all(c.matches(r) for c in clauses)]


def unread_note(read: int, limit: int) -> str:
    """What the filter and the groups do not see, when the list read as many runs as it reads
    (``limit``: the newest that match the search and the choices; older runs' numbers unread)."""
    return (f" The filter and the groups see only these {read} newest runs that match: older ones are not read "
            "(narrow the search, the statuses or the tags to reach them)." if read >= limit else "")


@dataclass
class Group:
    """The runs that share a value of the key grouped by: ``label`` says the value (or
    :data:`NOT_SET`), ``runs`` in the list's order, ``best_loss`` the lowest among them."""

    label: str
    runs: list[dict[str, Any]] = field(default_factory=list)

    @property
    def best_loss(self) -> float | None:
        known = [r["best_loss"] for r in self.runs if is_number(r.get("best_loss"))]
        return min(known, default=None)


def _order(group: Group, values: Mapping[str, Any]) -> tuple[int, float, str]:
    """Numbers in their order first, then texts, then the runs without a value."""
    if group.label == NOT_SET:
        return (2, 0.0, "")
    value = values.get(group.label)
    if is_number(value):
        return (0, float(value), "")
    return (1, 0.0, group.label.lower())


def grouped(runs: Sequence[dict[str, Any]], configs: Mapping[int, Mapping[str, Any]], by: str) -> list[Group]:
    """The runs in groups by ``by``: a flattened config key (``train.lr``), or :data:`BY_TAG` (a
    run is in the group of each of its tags). Numbers in order, then texts, then :data:`NOT_SET`;
    one group of every run for :data:`NO_GROUPING`."""
    if by == NO_GROUPING:
        return [Group("all runs", list(runs))]
    groups: dict[str, Group] = {}
    values: dict[str, Any] = {}
    for r in runs:
        if by == BY_TAG:
            labels = [str(t) for t in r.get("tags") or []] or [NOT_SET]
        else:
            config = configs.get(r["id"], {})
            if by in config and config[by] is not None:
                labels = [value_text(config[by])]
                values[labels[0]] = config[by]
            else:
                labels = [NOT_SET]
        for label in labels:
            groups.setdefault(label, Group(label)).runs.append(r)
    return sorted(groups.values(), key=lambda g: _order(g, values))


def group_keys(configs: Sequence[Mapping[str, Any]]) -> list[str]:
    """What the runs may be grouped by: the config keys whose value differs among ``configs``
    first, then the rest, each part sorted (``name`` and ``tags`` left out: the name is the run's
    own, and tags have their own choice)."""
    keys = sorted({k for c in configs for k in c} - {"name", "tags", "note"})
    differ = [k for k in keys if len({value_text(c.get(k, NOT_SET)) for c in configs}) > 1]
    return differ + [k for k in keys if k not in differ]
