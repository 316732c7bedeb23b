// Parallel coordinates (app/charts/parallel.py), shared by the sweep page and the Runs page: one
// vertical axis per key (a sweep's space, or the config keys that differ among the selected runs)
// and one for the objective, one line per trial (or run) coloured by its objective. Dragging along
// an axis brushes a range of it; a line is selected when it lies inside every brush, and the
// numbers of the selected lines are the component's state ("selection"), which the sweep page
// filters its trial table by. Double-click an axis to clear its brush; "Clear brush" clears them
// all. The data names its lines ("noun": singular and plural, "trial" by default; a line's "label")
// and the chart ("title").
//
// Drawn in SVG with the DOM's own calls: nothing is fetched, and every text (a key, a choice) is
// set as text, never as markup.

const SVG = "http://www.w3.org/2000/svg";
const HEIGHT = 340;
const PAD = { top: 34, bottom: 30, left: 48, right: 60 };
const GRAB = 26; // the width of an axis's brushing strip, in pixels
// A brush per component instance (its key), kept across the page's reruns: the module is loaded
// once per page and called again with new data on every rerun.
const brushesByKey = new Map();
const sentByKey = new Map();

function el(name, attrs, parent) {
  const node = document.createElementNS(SVG, name);
  for (const [k, v] of Object.entries(attrs || {})) node.setAttribute(k, String(v));
  if (parent) parent.appendChild(node);
  return node;
}

// Position on an axis, 0 (bottom) to 1 (top), of a value; null for a missing one.
function unit(axis, value) {
  if (value === null || value === undefined) return null;
  if (axis.kind === "choice") {
    const i = axis.choices.indexOf(String(value));
    if (i < 0) return null;
    return axis.choices.length === 1 ? 0.5 : i / (axis.choices.length - 1);
  }
  let lo = axis.min, hi = axis.max, v = Number(value);
  if (!Number.isFinite(v)) return null;
  if (axis.kind === "log") {
    if (v <= 0 || lo <= 0) return null;
    lo = Math.log(lo); hi = Math.log(hi); v = Math.log(v);
  }
  return hi > lo ? (v - lo) / (hi - lo) : 0.5;
}

// The value at a position (0 bottom, 1 top) of a numeric axis.
function valueAt(axis, t) {
  if (axis.kind === "log") return Math.exp(Math.log(axis.min) + t * (Math.log(axis.max) - Math.log(axis.min)));
  return axis.min + t * (axis.max - axis.min);
}

function fmt(v) {
  if (typeof v !== "number") return String(v);
  if (v === 0) return "0";
  const a = Math.abs(v);
  return a >= 1e4 || a < 1e-3 ? v.toExponential(1) : String(Number(v.toPrecision(3)));
}

function ticks(axis) {
  if (axis.kind === "choice") return axis.choices.map((c, i) => [unit(axis, c), c]);
  return [0, 0.25, 0.5, 0.75, 1].map((t) => [t, fmt(valueAt(axis, t))]);
}

// The brushes as the page reads them: numeric bounds, or the choices inside.
function described(axes, brushes) {
  const out = {};
  for (const axis of axes) {
    const b = brushes[axis.key];
    if (!b) continue;
    if (axis.kind === "choice") out[axis.key] = { values: axis.choices.filter((c) => {
      const u = unit(axis, c); return u >= b[0] && u <= b[1];
    }) };
    else out[axis.key] = { from: valueAt(axis, b[0]), to: valueAt(axis, b[1]) };
  }
  return out;
}

function selectedNumbers(data, brushes) {
  const active = data.axes.map((a, i) => [i, brushes[a.key]]).filter(([, b]) => b);
  return data.trials.filter((trial) => active.every(([i, b]) => {
    const u = unit(data.axes[i], trial.values[i]);
    return u !== null && u >= b[0] - 1e-9 && u <= b[1] + 1e-9;
  })).map((trial) => trial.number);
}

export default function (component) {
  const { data, key, parentElement, setStateValue } = component;
  const root = parentElement.querySelector(".runyard-parallel");
  root.replaceChildren();
  if (!data || !data.axes || data.axes.length < 2) return;
  const brushes = Object.fromEntries(Object.entries(brushesByKey.get(key) || {})
    .filter(([k]) => data.axes.some((a) => a.key === k)));
  brushesByKey.set(key, brushes);

  const bar = document.createElement("div");
  bar.className = "runyard-parallel-bar";
  const said = document.createElement("span");
  said.className = "runyard-parallel-said";
  const clear = document.createElement("button");
  clear.type = "button";
  clear.className = "runyard-parallel-clear";
  clear.textContent = "Clear brush";
  bar.append(said, clear);
  root.appendChild(bar);

  const width = Math.max(360, root.clientWidth || parentElement.host?.clientWidth || 800);
  const [one, many] = data.noun || ["trial", "trials"];
  const svg = el("svg", { width, height: HEIGHT, viewBox: `0 0 ${width} ${HEIGHT}`, role: "img",
    "aria-label": data.title || "parallel coordinates of the sweep's trials" }, root);
  const span = HEIGHT - PAD.top - PAD.bottom;
  const step = (width - PAD.left - PAD.right) / (data.axes.length - 1);
  const xOf = (i) => PAD.left + i * step;
  const yOf = (u) => PAD.top + (1 - u) * span;

  const lines = el("g", { class: "lines" }, svg);
  const paths = data.trials.map((trial) => {
    let d = "", pen = false;
    trial.values.forEach((v, i) => {
      const u = unit(data.axes[i], v);
      if (u === null) { pen = false; return; }
      d += `${pen ? "L" : "M"}${xOf(i).toFixed(1)},${yOf(u).toFixed(1)}`;
      pen = true;
    });
    const p = el("path", { d, stroke: trial.color, class: "trial", "data-number": trial.number }, lines);
    const title = el("title", {}, p);
    title.textContent = trial.label || `${one} ${trial.number}`;
    return p;
  });

  const brushRects = {};
  data.axes.forEach((axis, i) => {
    const g = el("g", { class: "axis", "data-key": axis.key, transform: `translate(${xOf(i)},0)` }, svg);
    el("line", { x1: 0, x2: 0, y1: PAD.top, y2: PAD.top + span, class: "axis-line" }, g);
    for (const [t, label] of ticks(axis)) {
      if (t === null) continue;
      el("line", { x1: -4, x2: 0, y1: yOf(t), y2: yOf(t), class: "tick" }, g);
      const text = el("text", { x: -7, y: yOf(t) + 3, class: "tick-label" }, g);
      text.textContent = label;
    }
    const name = el("text", { x: 0, y: PAD.top - 14, class: "axis-name" + (axis.objective ? " objective" : "") }, g);
    name.textContent = axis.label;
    brushRects[axis.key] = el("rect", { x: -GRAB / 4, width: GRAB / 2, y: 0, height: 0, class: "brush" }, g);
    const strip = el("rect", { x: -GRAB / 2, width: GRAB, y: PAD.top - 4, height: span + 8, class: "grab",
      "data-key": axis.key }, g);
    strip.addEventListener("pointerdown", (e) => startBrush(e, axis, strip));
    strip.addEventListener("dblclick", () => { delete brushes[axis.key]; redraw(); send(); });
  });

  function tOf(e, strip) {
    const box = strip.getBoundingClientRect();
    const y = e.clientY - box.top - 4; // the strip reaches 4 px past both ends of the axis
    return Math.min(1, Math.max(0, 1 - y / span));
  }

  function startBrush(e, axis, strip) {
    e.preventDefault();
    const t0 = tOf(e, strip);
    strip.setPointerCapture(e.pointerId);
    const move = (m) => {
      const t1 = tOf(m, strip);
      brushes[axis.key] = [Math.min(t0, t1), Math.max(t0, t1)];
      redraw();
    };
    const up = (u) => {
      strip.removeEventListener("pointermove", move);
      strip.removeEventListener("pointerup", up);
      move(u);
      const b = brushes[axis.key];
      if (b && b[1] - b[0] < 0.01) delete brushes[axis.key]; // a click, not a drag: no brush
      redraw();
      send();
    };
    strip.addEventListener("pointermove", move);
    strip.addEventListener("pointerup", up);
  }

  function redraw() {
    const any = Object.keys(brushes).length > 0;
    const chosen = new Set(selectedNumbers(data, brushes));
    data.trials.forEach((trial, i) => {
      paths[i].classList.toggle("dimmed", any && !chosen.has(trial.number));
    });
    for (const axis of data.axes) {
      const b = brushes[axis.key], r = brushRects[axis.key];
      r.setAttribute("y", b ? yOf(b[1]) : 0);
      r.setAttribute("height", b ? Math.max(1, yOf(b[0]) - yOf(b[1])) : 0);
    }
    said.textContent = any ? `${chosen.size} of ${data.trials.length} ${many} in the brush`
      : "Drag along an axis to brush a range; double-click an axis to clear its brush";
    clear.disabled = !any;
  }

  // The selection to the page, only when it changed (each change reruns the page).
  function send() {
    const any = Object.keys(brushes).length > 0;
    const value = any ? { numbers: selectedNumbers(data, brushes), brushes: described(data.axes, brushes) } : null;
    const text = JSON.stringify(value);
    if (sentByKey.get(key) === text) return;
    sentByKey.set(key, text);
    setStateValue("selection", value);
  }

  clear.addEventListener("click", () => {
    for (const k of Object.keys(brushes)) delete brushes[k];
    redraw();
    send();
  });
  redraw();
  if (sentByKey.has(key)) send(); // trials that entered or left a brush since the last run
}
