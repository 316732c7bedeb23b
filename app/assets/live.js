// A live run's chart (app/charts/live.py): the Vega-Lite spec drawn once with Vega, then changed
// in place on every refresh with only the rows that changed (Vega's view.change), so that the
// view, its zoom and its hover stay and the browser receives no history twice.
//
// This module and Vega, Vega-Lite and Vega's CSP-safe expression interpreter (app/assets/vega)
// come from the UI's own origin, served by the gate (app/server/assets.py), loaded once per page:
// the component's inline code only imports this module. The box drawn (selection "box") and the
// step alt-clicked (selection "pin") are the component's state "selection", as st.altair_chart's
// on_select reports them. A refresh applies only on top of
// the one before it; a browser that missed one says which it holds (the trigger "resync") and
// gets what it lacks; one that lost the chart (the element mounted anew) gets the whole chart.

const VENDOR_URLS = __VENDOR_URLS__;
const DEBOUNCE_MS = 150;
let loading = null;
const charts = new Map(); // key -> { seq, view, rows: [Map id -> tuple], root, pending }

function loadScript(src) {
  return new Promise((resolve, reject) => {
    const s = document.createElement("script");
    s.src = src;
    s.async = false;
    s.onload = resolve;
    s.onerror = () => reject(new Error(`could not load ${src}`));
    document.head.appendChild(s);
  });
}

function libraries() {
  if (!loading) {
    loading = globalThis.vega && globalThis.vegaLite && globalThis.vegaInterpreter ? Promise.resolve()
      : VENDOR_URLS.reduce((p, url) => p.then(() => loadScript(url)), Promise.resolve());
  }
  return loading;
}

function themed(spec, root) {
  const style = getComputedStyle(root);
  const text = style.getPropertyValue("--st-text-color").trim() || style.color || "#31333f";
  const font = style.fontFamily || "sans-serif";
  const config = { ...(spec.config || {}) };
  config.background = "transparent";
  config.font = font;
  config.axis = { labelColor: text, titleColor: text, gridColor: "rgba(128,128,128,0.2)",
    domainColor: "rgba(128,128,128,0.5)", tickColor: "rgba(128,128,128,0.5)", labelFont: font, titleFont: font,
    ...(config.axis || {}) };
  config.title = { color: text, subtitleColor: text, font, ...(config.title || {}) };
  config.view = { ...(config.view || {}), stroke: null };
  return { ...spec, config, width: "container", autosize: { type: "fit-x", contains: "padding" } };
}

function listen(view, holder, setStateValue) {
  // The selections once the pointer is up: a box is sent when it is drawn, not while dragging
  // (a rerun mid-drag would draw the chart anew under the pointer).
  let timer = null;
  let down = false;
  const send = () => {
    timer = null;
    const box = view.signal("box") || {};
    let pin = [];
    try {
      const p = view.signal("pin");
      pin = p && p.vlPoint && Array.isArray(p.vlPoint.or) ? p.vlPoint.or : [];
    } catch (e) { pin = []; }
    setStateValue("selection", { box, pin });
  };
  const later = () => {
    if (timer) clearTimeout(timer);
    timer = down ? null : setTimeout(send, DEBOUNCE_MS);
  };
  const up = () => { if (down) { down = false; later(); } };
  holder.addEventListener("pointerdown", () => { down = true; });
  window.addEventListener("pointerup", up);
  for (const name of ["box", "pin"]) {
    try { view.addSignalListener(name, later); } catch (e) { /* a chart without it */ }
  }
  return () => window.removeEventListener("pointerup", up);
}

async function draw(state, data, root, setStateValue) {
  const { vega, vegaLite, vegaInterpreter } = globalThis;
  if (state.view) state.view.finalize();
  if (state.unlisten) state.unlisten();
  root.replaceChildren();
  const holder = document.createElement("div");
  holder.style.width = "100%";
  root.appendChild(holder);
  const spec = vegaLite.compile(themed(data.spec, root)).spec;
  const runtime = vega.parse(spec, null, { ast: true });
  const view = new vega.View(runtime, { expr: vegaInterpreter.expressionInterpreter, renderer: "svg",
    container: holder, hover: true });
  state.view = view;
  state.rows = data.inserts.map(() => new Map());
  state.root = root;
  apply(state, data);
  await view.runAsync();
  state.unlisten = listen(view, holder, setStateValue);
}

function apply(state, data) {
  const { vega } = globalThis;
  data.inserts.forEach((columns, d) => {
    const rows = columns.rows.map((values) => Object.fromEntries(columns.fields.map((f, i) => [f, values[i]])));
    const held = state.rows[d];
    const gone = data.removes[d].map((id) => held.get(id)).filter((t) => t !== undefined);
    data.removes[d].forEach((id) => held.delete(id));
    rows.forEach((row, i) => held.set(data.first_ids[d] + i, row));
    if (rows.length || gone.length) state.view.change(`d${d}`, vega.changeset().remove(gone).insert(rows));
  });
  state.seq = data.seq;
  state.base = data.base;
}

async function update(component) {
  const { data, key, parentElement, setStateValue, setTriggerValue } = component;
  const root = parentElement.querySelector(".runyard-live");
  let state = charts.get(key);
  if (!state || state.root !== root || !root.isConnected || !state.view) {
    if (state && state.view) state.view.finalize(); // drawn in an element that is gone
    if (state && state.unlisten) state.unlisten();
    state = { seq: null, view: null, rows: [], root, pending: state && state.pending };
    charts.set(key, state);
  }
  if (data.seq === state.seq && data.base === state.base) {
    // The same refresh handed over again (the element rendered anew): already drawn.
  } else if (data.spec) {
    await draw(state, data, root, setStateValue);
  } else if (state.view && data.base === state.seq) {
    apply(state, data);
    await state.view.runAsync();
  } else if (data.seq !== state.asked) {
    state.asked = data.seq; // once per refresh it could not apply: the refresh it holds, if any
    setTriggerValue("resync", state.view ? state.seq : null);
  }
  root.dataset.seq = String(state.seq);
}

export default function (component) {
  const { data, key } = component;
  if (!data) return;
  const before = charts.get(key)?.pending || Promise.resolve();
  const pending = before.then(() => libraries()).then(() => update(component)).catch((e) => {
    const root = component.parentElement.querySelector(".runyard-live");
    if (root) root.textContent = `The live chart could not be drawn: ${e.message}`;
  });
  const state = charts.get(key) || { seq: null, view: null, rows: [], root: null };
  state.pending = pending;
  charts.set(key, state);
}
