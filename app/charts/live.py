"""A live run's chart sent to the browser a refresh at a time: the spec once, then only the rows
that changed. A components v2 component (its code is app/assets/live.js) draws the Vega-Lite
spec with Vega itself (vendored under app/assets/vega; both served by the UI's gate,
app/server/assets.py: the page fetches nothing from elsewhere) and keeps the view across the
live refreshes, changing its datasets in place (Vega's ``view.change``) instead of drawing the
chart anew.

What a refresh sends (:func:`refresh`): the chart is built as before (app/charts/metric.py), its
spec split from its data (:func:`split`: the datasets named ``d0``, ``d1``... in order and
Altair's per-build view names made stable, so that the same chart gives the same spec). While
the spec and the generation (the series' rollup level and attempt count) are those of what the
browser drew, each dataset is compared, row by row, with the rows it was sent: the rows it does
not hold yet are sent (new buckets, a grown last bucket, the rank mean and the smoothed value at
the end, the hover read-out's last step) with the ids of the rows they replace. Anything else (the
first refresh, another spec, a new level or attempt, a browser that lost what it drew, more than
half the rows changed) sends the whole chart again.

No Streamlit here: app/chart_widgets.py mounts the component and keeps :class:`Drawn` in the
session.
"""

from __future__ import annotations

import hashlib
import json
import math
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import altair as alt
import pandas as pd

from app.server import assets

NAME = "runyard.live_chart"  # the component's name, unique in the app
# A Vega-Lite chart like Streamlit's own, for whatever finds the page's charts by their test id
# (the browser tests, bench/bench_render.py); drawn in the page itself (not a shadow root) for that.
HTML = '<div class="runyard-live" data-testid="stVegaLiteChart"></div>'
CSS = ".runyard-live { width: 100%; min-height: 300px; }"
_VIEW_NAME = re.compile(r"^view_[0-9a-f]+_\d+$")

Row = tuple[Any, ...]  # one row of a dataset, its values in the order of the dataset's fields
Table = tuple[list[str], list[Row]]  # a dataset: its fields and its rows


def js_code() -> str:
    """The component's inline code: an import of its code from the UI's origin (app/assets/live.js,
    served by the gate: app/server/assets.py), once per page, so that the message each refresh
    carries stays small; each refresh is handed to it."""
    # An address on the page's origin: the inline code runs as a blob: module, which resolves no path.
    return (f"const code = import(new URL({json.dumps(assets.url(assets.CODE))}, document.baseURI).href);\n"
            "export default function (component) { code.then((m) => m.default(component)); }\n")


@dataclass
class Drawn:
    """What one browser's component holds of one chart: the spec's hash, the generation, and per
    dataset each row it was sent (by its contents) with the id it was sent under."""

    spec_hash: str
    generation: str
    ids: list[dict[tuple[Any, ...], int]] = field(default_factory=list)
    next_id: int = 0
    seq: int = 0  # the refreshes sent: the browser applies one only on top of the one before it


@dataclass(frozen=True)
class Update:
    """One refresh's message to the component: ``spec`` on a full send (else None), per dataset
    the rows to insert (their ids run from ``first_ids[i]``) and the ids to remove; ``base`` is
    the ``seq`` it applies on top of (None: on nothing, a full send)."""

    seq: int
    base: int | None
    spec: dict[str, Any] | None
    fields: list[list[str]]
    inserts: list[list[Row]]
    first_ids: list[int]
    removes: list[list[int]]

    @property
    def full(self) -> bool:
        return self.spec is not None

    def message(self) -> dict[str, Any]:
        """The component's ``data``: plain JSON, each dataset's rows as columns' names and rows
        of values (the names once, not once per row)."""
        return {"seq": self.seq, "base": self.base, "spec": self.spec, "first_ids": self.first_ids,
                "inserts": [columnar(f, rows) for f, rows in zip(self.fields, self.inserts, strict=True)],
                "removes": self.removes}

    def rows(self, dataset: int) -> list[dict[str, Any]]:
        """The rows inserted into ``dataset``, as dicts (for reading, not sending)."""
        return [dict(zip(self.fields[dataset], row, strict=True)) for row in self.inserts[dataset]]

    @property
    def rows_sent(self) -> int:
        return sum(len(rows) for rows in self.inserts)


SIGNIFICANT = 7  # digits a drawn value keeps: a tooltip shows 4, a line moves by less than a pixel
EXACT = frozenset({"x", "step"})  # the x axis (wall time in epoch ms needs every digit), and steps


def _short(value: Any) -> Any:
    if isinstance(value, float) and math.isfinite(value) and not value.is_integer():
        return float(f"{value:.{SIGNIFICANT}g}")
    return value


def columnar(fields: list[str], rows: Sequence[Row]) -> dict[str, Any]:
    """``rows`` as ``{"fields": [...], "rows": [[...], ...]}``, the values drawn on the y axis to
    :data:`SIGNIFICANT` digits (JSON writes a computed mean with 17)."""
    exact = [f in EXACT for f in fields]
    out = [[v if keep else _short(v) for v, keep in zip(r, exact, strict=True)] for r in rows]
    return {"fields": fields, "rows": out}


def _renamed(node: Any, names: Mapping[str, str]) -> Any:
    """``node`` with every dataset and view name in ``names`` replaced."""
    if isinstance(node, dict):
        out: dict[str, Any] = {}
        for k, v in node.items():
            if k == "name" and isinstance(v, str) and v in names:
                out[k] = names[v]
            elif k == "views" and isinstance(v, list):
                out[k] = [names.get(x, x) if isinstance(x, str) else x for x in v]
            else:
                out[k] = _renamed(v, names)
        return out
    if isinstance(node, list):
        return [_renamed(v, names) for v in node]
    return node


def _view_names(node: Any, found: list[str]) -> list[str]:
    if isinstance(node, dict):
        name = node.get("name")
        if isinstance(name, str) and _VIEW_NAME.match(name) and name not in found:
            found.append(name)
        for v in node.values():
            _view_names(v, found)
    elif isinstance(node, list):
        for v in node:
            _view_names(v, found)
    return found


def _table(frame: pd.DataFrame) -> Table:
    """A frame's fields and rows, as Altair would send them (NaN as null) but as tuples: Altair's
    own conversion makes a dict of every row first, the most of what a chart's refresh cost."""
    fields = [str(c) for c in frame.columns]
    columns = []
    for c in frame.columns:
        values = frame[c].tolist()
        if frame[c].dtype.kind == "f":
            values = [None if v != v else v for v in values]  # NaN: v != v
        columns.append(values)
    return fields, list(zip(*columns, strict=True)) if columns else []


def split(chart: alt.LayerChart) -> tuple[dict[str, Any], list[Table]]:
    """The spec of ``chart`` without its data (each layer's frame a dataset named ``d0``, ``d1``...
    in order, left empty; Altair's view names ``view_<hash>_<n>`` renamed ``v0``, ``v1``...),
    and each dataset's rows. ``chart`` itself is left as it was."""
    frames: list[pd.DataFrame] = []
    layers = []
    for layer in chart.layer:
        data = getattr(layer, "data", alt.Undefined)
        if isinstance(data, pd.DataFrame):
            at = next((i for i, f in enumerate(frames) if f is data), None)
            if at is None:
                frames.append(data)
                at = len(frames) - 1
            layer = layer.copy(deep=False)
            layer.data = alt.NamedData(name=f"d{at}")
        layers.append(layer)
    top = chart.copy(deep=False)
    top.layer = layers
    spec = top.to_dict(validate=False)
    datasets = spec.pop("datasets", {})  # a layer's data that was not a frame: as Altair sent it
    names = {old: f"d{len(frames) + i}" for i, old in enumerate(datasets)}
    names |= {old: f"v{i}" for i, old in enumerate(_view_names(spec, []))}
    bare = _renamed(spec, names)
    tables = [_table(f) for f in frames]
    for rows in datasets.values():
        fields = list(rows[0]) if rows else []
        tables.append((fields, [tuple(r.get(f) for f in fields) for r in rows]))
    bare["datasets"] = {f"d{i}": [] for i in range(len(tables))}
    return bare, tables


def spec_hash(bare: Mapping[str, Any]) -> str:
    return hashlib.sha256(json.dumps(bare, sort_keys=True, default=str).encode()).hexdigest()


def _full(bare: dict[str, Any], digest: str, generation: str, data: Sequence[Table],
          seq: int) -> tuple[Update, Drawn]:
    drawn = Drawn(spec_hash=digest, generation=generation, seq=seq)
    first_ids = []
    for _, rows in data:
        first_ids.append(drawn.next_id)
        drawn.ids.append({r: drawn.next_id + i for i, r in enumerate(rows)})
        drawn.next_id += len(rows)
    update = Update(seq=seq, base=None, spec=bare, fields=[f for f, _ in data], inserts=[list(r) for _, r in data],
                    first_ids=first_ids, removes=[[] for _ in data])
    return update, drawn


@dataclass
class Sent:
    """What one browser was sent of one chart: the newest :class:`Drawn` and the few before it,
    so that a browser that missed a refresh (a rerun cut short before its message left) and asks
    again with the ``seq`` it holds gets only what it lacks, not the whole chart."""

    drawn: Drawn | None = None
    before: dict[int, Drawn] = field(default_factory=dict)
    keep: int = 3

    def record(self, drawn: Drawn) -> None:
        if self.drawn is not None and drawn.seq > self.drawn.seq:
            self.before[self.drawn.seq] = self.drawn
        else:
            self.before.clear()  # a full send from nothing: the seqs start again
        self.drawn = drawn
        for seq in sorted(self.before)[:-self.keep]:
            del self.before[seq]

    def rewind(self, held: Any) -> None:
        """The browser holds the refresh ``held`` (its ``seq``; anything else: nothing it can
        name): the next refresh builds on that one if it was kept, else sends the whole chart."""
        if self.drawn is not None and held == self.drawn.seq:
            return
        self.drawn = self.before.get(held) if isinstance(held, int) else None
        self.before.clear()


def refresh(drawn: Drawn | None, chart: alt.LayerChart, generation: str) -> tuple[Update, Drawn]:
    """What to send for ``chart`` to a browser that holds ``drawn`` (None: nothing), and what
    it holds then. ``generation`` names what the rows were fetched as (the series' level and
    attempts): another one sends everything again."""
    bare, data = split(chart)
    digest = spec_hash({**bare, "fields": [f for f, _ in data]})
    seq = drawn.seq + 1 if drawn is not None else 1
    if drawn is None or drawn.spec_hash != digest or drawn.generation != generation or len(drawn.ids) != len(data):
        return _full(bare, digest, generation, data, seq)
    inserts: list[list[Row]] = []
    first_ids: list[int] = []
    removes: list[list[int]] = []
    ids: list[dict[tuple[Any, ...], int]] = []
    next_id, changed, held = drawn.next_id, 0, 0
    for (_, rows), before in zip(data, drawn.ids, strict=True):
        now = set(rows)
        gone = [i for row, i in before.items() if row not in now]
        new = [r for r in dict.fromkeys(rows) if r not in before]
        kept = {row: i for row, i in before.items() if row in now}
        first_ids.append(next_id)
        kept |= {r: next_id + i for i, r in enumerate(new)}
        next_id += len(new)
        inserts.append(new)
        removes.append(gone)
        ids.append(kept)
        changed += len(new) + len(gone)
        held += len(before)
    if changed > max(held, 1) // 2 + 1 and held > 0 and changed > 64:  # most of it changed: the whole chart is as cheap
        return _full(bare, digest, generation, data, seq)
    update = Update(seq=seq, base=drawn.seq, spec=None, fields=[f for f, _ in data], inserts=inserts,
                    first_ids=first_ids, removes=removes)
    return update, Drawn(spec_hash=digest, generation=generation, ids=ids, next_id=next_id, seq=seq)
