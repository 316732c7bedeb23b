"""Parallel coordinates with brushing, shared by the sweep page and the Runs page: a Streamlit
components v2 component whose code is parallel.js beside this module (no library, nothing
fetched), and the plain data it draws.

The sweep page (:func:`parallel_data`): one axis per key of the sweep's space (a log scale for
``log_uniform``, the choices in order for ``choice``, the range for ``uniform`` and ``int``) and
one for the objective; one line per trial, coloured by its value (:func:`objective_colors`). The
Runs page (:func:`runs_parallel_data`): one axis per config key that differs among the selected
runs (numbers on their range, on a log scale over more than two decades, the rule of every log axis,
app/charts/values.py; anything else as choices) and one
for the best loss; one line per run. The pages mount it (app/views/sweep.py, app/views/runs.py:
this module, like every chart builder, has no Streamlit). Dragging along an axis brushes a range;
the component's state is the selection, ``{"numbers": [line numbers], "brushes": {key: range}}``,
or None without a brush, which :func:`selected_numbers` reads (a trial's number, a run's id).

Component v2 loads inline code as a ``blob:`` module: the UI's Content-Security-Policy allows
``blob:`` scripts for it (app/server/gate.py says why that lets nothing new in).
"""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

from app.charts.values import is_number, spans_decades, value_text

NAME = "runyard.parallel_coordinates"  # the component's name, unique in the app
HTML = '<div class="runyard-parallel"></div>'
OBJECTIVE = "objective"  # the objective axis's key in the component's data (no config key is one word)
# Viridis at five stops, dark (worst) to bright yellow (best): a contrast on the light and the dark theme.
VIRIDIS = ("#440154", "#3b528b", "#21918c", "#5ec962", "#fde725")
MISSING_COLOR = "#9e9e9e"  # a trial without a value yet
ABSENT = "—"  # db.compare.ABSENT: a key one run's config does not have (not imported: no database here)

CSS = """
.runyard-parallel { font: 11px sans-serif; color: var(--st-text-color, #31333f); }
.runyard-parallel-bar { display: flex; gap: 1em; align-items: center; margin-bottom: 2px; }
.runyard-parallel-said { opacity: 0.75; }
.runyard-parallel-clear { font: inherit; padding: 2px 8px; border-radius: 4px; cursor: pointer;
  border: 1px solid rgba(128, 128, 128, 0.5); background: transparent; color: inherit; }
.runyard-parallel-clear:disabled { opacity: 0.4; cursor: default; }
.runyard-parallel svg { display: block; overflow: visible; }
.runyard-parallel .trial { fill: none; stroke-width: 1.6; opacity: 0.85; }
.runyard-parallel .trial.dimmed { stroke: #9e9e9e; opacity: 0.15; }
.runyard-parallel .axis-line, .runyard-parallel .tick { stroke: currentColor; opacity: 0.6; }
.runyard-parallel .tick-label { fill: currentColor; text-anchor: end; font-size: 10px; }
.runyard-parallel .axis-name { fill: currentColor; text-anchor: middle; font-weight: 600; }
.runyard-parallel .axis-name.objective { text-decoration: underline; }
.runyard-parallel .brush { fill: rgba(255, 75, 75, 0.25); stroke: #ff4b4b; }
.runyard-parallel .grab { fill: transparent; cursor: ns-resize; }
"""


def js_code() -> str:
    """The component's code (parallel.js, beside this module)."""
    return (Path(__file__).resolve().parent / "parallel.js").read_text()


def _hex(rgb: Sequence[float]) -> str:
    return "#" + "".join(f"{round(c):02x}" for c in rgb)


def gradient(t: float) -> str:
    """The colour at ``t`` (0 worst, 1 best) of :data:`VIRIDIS`."""
    t = min(1.0, max(0.0, t))
    i = min(len(VIRIDIS) - 2, int(t * (len(VIRIDIS) - 1)))
    f = t * (len(VIRIDIS) - 1) - i
    a, b = (tuple(int(c[k:k + 2], 16) for k in (1, 3, 5)) for c in (VIRIDIS[i], VIRIDIS[i + 1]))
    return _hex([x + (y - x) * f for x, y in zip(a, b, strict=True)])


def objective_colors(values: Sequence[float | None], goal: str) -> list[str]:
    """Each trial's colour: its value's place between the worst and the best value (bright is
    better, whichever the goal); grey without one."""
    known = [v for v in values if v is not None and math.isfinite(v)]
    lo, hi = (min(known), max(known)) if known else (0.0, 0.0)
    out = []
    for v in values:
        if v is None or not math.isfinite(v):
            out.append(MISSING_COLOR)
            continue
        t = 0.5 if hi == lo else (v - lo) / (hi - lo)
        out.append(gradient(t if goal == "maximize" else 1.0 - t))
    return out


def _axis(key: str, dimension: Mapping[str, Any], values: Sequence[Any]) -> dict[str, Any]:
    """One axis: its kind and range (or choices), from the space's dimension and the values seen."""
    kind = next((k for k in ("log_uniform", "uniform", "int", "choice") if dimension.get(k) is not None), "uniform")
    if kind == "choice":
        return {"key": key, "label": key, "kind": "choice", "choices": [str(c) for c in dimension["choice"]]}
    bounds = [float(b) for b in dimension[kind]]
    seen = [float(v) for v in values if isinstance(v, int | float) and math.isfinite(v)]
    return {"key": key, "label": key, "kind": "log" if kind == "log_uniform" else "linear",
            "min": min([*bounds, *seen]), "max": max([*bounds, *seen])}


def parallel_data(space: Mapping[str, Mapping[str, Any]], trials: Sequence[Mapping[str, Any]], metric: str,
                  goal: str) -> dict[str, Any]:
    """What the component draws: ``axes`` (each key of ``space``, then the objective) and
    ``trials`` (``number``, ``values`` per axis, None where missing, ``color``). A trial's
    objective is its ``value`` (db/sweeps/queries.py: at its end, else at its deepest rung)."""
    keys = list(space)
    axes = [_axis(k, space[k], [t["params"].get(k) for t in trials]) for k in keys]
    values = [t["value"] if t["value"] is not None and math.isfinite(t["value"]) else None for t in trials]
    known = [v for v in values if v is not None]
    axes.append({"key": OBJECTIVE, "label": f"{metric} ({goal})", "kind": "linear", "objective": True,
                 "min": min(known, default=0.0), "max": max(known, default=1.0)})
    colors = objective_colors(values, goal)
    rows = []
    for t, value, color in zip(trials, values, colors, strict=True):
        params = [t["params"].get(k) for k in keys]
        shown = [str(p) if a["kind"] == "choice" and p is not None else p for a, p in zip(axes, params, strict=False)]
        rows.append({"number": t["number"], "values": [*shown, value], "color": color})
    return {"axes": axes, "trials": rows}


def _config_axis(key: str, values: Sequence[Any]) -> dict[str, Any]:
    """An axis for a config key from the values the runs have: numbers on their range (a log scale
    when all are positive and span more than two decades), anything else as its choices, sorted."""
    known = [v for v in values if v is not None]
    if known and all(is_number(v) for v in known):
        lo, hi = float(min(known)), float(max(known))
        return {"key": key, "label": key, "kind": "log" if lo > 0 and spans_decades(known) else "linear",
                "min": lo, "max": hi}
    return {"key": key, "label": key, "kind": "choice", "choices": sorted({value_text(v) for v in known})}


def drawn_keys(diff: Sequence[tuple[str, Sequence[Any]]], most: int) -> list[tuple[str, Sequence[Any]]]:
    """The keys of ``diff`` worth an axis, at most ``most``: those with two values or more among
    the runs that have one (a key only some configs have, at one value, says nothing an axis can
    show), the ones most runs have first, then in ``diff``'s order."""
    def known(values: Sequence[Any]) -> list[Any]:
        return [v for v in values if v is not None and not (isinstance(v, str) and v == ABSENT)]

    worth = [(key, values) for key, values in diff if len({value_text(v) for v in known(values)}) > 1]
    return sorted(worth, key=lambda kv: -len(known(kv[1])))[:most]


def runs_parallel_data(runs: Sequence[Mapping[str, Any]], diff: Sequence[tuple[str, Sequence[Any]]],
                       metric: str = "best loss") -> dict[str, Any]:
    """What the component draws for the Runs page's selected runs: an axis per key of ``diff``
    (db.compare.config_diff over the runs' configs: each key with one value per run, ``absent``
    where a run lacks it), then one for ``metric`` (each run's ``best_loss``, lower is better);
    one line per run (``number``: its id), coloured by its loss."""
    axes = [_config_axis(key, [None if v == ABSENT else v for v in values]) for key, values in diff]
    losses = [r["best_loss"] if is_number(r.get("best_loss")) else None for r in runs]
    known = [v for v in losses if v is not None]
    lo, hi = min(known, default=0.0), max(known, default=1.0)
    kind = "log" if lo > 0 and spans_decades(known) else "linear"
    axes.append({"key": OBJECTIVE, "label": metric, "kind": kind, "objective": True, "min": lo, "max": hi})
    colors = objective_colors(losses, "minimize")
    lines = []
    for i, (r, loss, color) in enumerate(zip(runs, losses, colors, strict=True)):
        values = [values_of[i] for _, values_of in diff]
        shown = [None if v is None or v == ABSENT else v if a["kind"] != "choice" else value_text(v)
                 for a, v in zip(axes, values, strict=False)]
        lines.append({"number": r["id"], "label": f"run #{r['id']} {r['name']}", "values": [*shown, loss],
                      "color": color})
    return {"axes": axes, "trials": lines, "noun": ["run", "runs"],
            "title": "parallel coordinates of the selected runs"}


def selected_numbers(selection: Any, numbers: Sequence[int]) -> list[int] | None:
    """The trial numbers a brush selects, among ``numbers`` (trials since gone are dropped);
    None without a brush."""
    if not isinstance(selection, Mapping) or not isinstance(selection.get("numbers"), list):
        return None
    chosen = {n for n in selection["numbers"] if isinstance(n, int)}
    return [n for n in numbers if n in chosen]


def brush_words(selection: Any) -> str:
    """The brushes in words: ``train.lr 0.001 to 0.01; workload.hidden 64, 128``."""
    if not isinstance(selection, Mapping) or not isinstance(selection.get("brushes"), Mapping):
        return ""
    parts = []
    for key, b in selection["brushes"].items():
        name = "the objective" if key == OBJECTIVE else str(key)
        if isinstance(b, Mapping) and "values" in b:
            parts.append(f"{name} in {', '.join(map(str, b['values'])) or 'none'}")
        elif isinstance(b, Mapping):
            parts.append(f"{name} {b.get('from', 0):.4g} to {b.get('to', 0):.4g}")
    return "; ".join(parts)
