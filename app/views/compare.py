"""Compare: several runs side by side. A summary table (status, steps, wall time, the final and
best value of each chosen metric), the config keys that differ, each run's energy with its two
cost lines (your cost, the cloud reference: never added), and one chart per metric with the runs
overlaid (the mean over ranks along each run's lineage), each run in one colour throughout: on the
Run page's x axes (step, wall time, time since each run started), smoothed by its EMA when asked,
and on a log y axis by its rule (values spanning more than two decades) until a person chooses.
The first ``FIRST_CHARTS`` charts are drawn at once, each other metric's when its section is
opened (or all, when asked), and a finished run's series and summary are kept once read: ten
runs of twenty metrics stay quick to answer. A Run page's "Add to Compare" opens this page with
its run added to the runs last compared in this browser session.

The choice lives in the URL (``/compare?runs=3,5&metrics=loss,eval_accuracy``) so a comparison
can be linked; the Runs page's "Compare" button opens it that way. Each run's metric comes from
the metric store already downsampled (at most MAX_POINTS buckets per rank: the resolution the
summary's best values are read at too).
"""

from __future__ import annotations

from typing import Any

import pandas as pd
import streamlit as st

from app import data, style
from app.charts import compare as cc
from app.charts.metric import X_AXES, X_RELATIVE, X_STEP, X_WALL, unvalidated
from app.run_actions import COMPARED
from db.compare import MAX_POINTS, MAX_RUNS, MetricSummary, config_diff, higher_is_better
from db.states import TERMINAL_VALUES
from db.vocabulary import metric_registry

style.apply()

PREFERRED = ("loss", "eval_loss", "eval_accuracy")  # the metrics shown first when the URL names none
FIRST_CHARTS = 4  # charts drawn at once; each further metric's when its section is opened


def ids_from_url(text: str | None) -> tuple[list[int], list[str]]:
    """The run ids in ``?runs=3,5`` and the parts that are not ids."""
    parts = [p.strip().lstrip("#") for p in (text or "").split(",") if p.strip()]
    ids = [p for p in parts if p.isascii() and p.isdigit()]  # "²".isdigit() is true, int("²") an error
    return [int(p) for p in ids], [p for p in parts if p not in ids]


def pick_runs(runs: list[dict[str, Any]]) -> list[int]:
    """The runs multiselect, from the URL's ``runs`` (else the two newest), kept in the URL."""
    labels = {r["id"]: cc.run_label(r) for r in runs}
    wanted, bad = ids_from_url(st.query_params.get("runs"))
    unknown = [str(i) for i in wanted if i not in labels] + bad
    if unknown:
        st.warning(f"runs={style.plain(st.query_params.get('runs'))}: {style.plain(', '.join(unknown))} is not "
                   f"one of the {len(runs)} newest runs; pick runs below or on the Runs page.")
    default = [i for i in wanted if i in labels][:MAX_RUNS] if "runs" in st.query_params else sorted(
        r["id"] for r in runs[:2])
    chosen = st.multiselect("Runs", list(labels), default=default, format_func=lambda i: labels[i],
                            max_selections=MAX_RUNS, placeholder="pick two or more runs",
                            help=f"Up to {MAX_RUNS} runs; each keeps its colour on every chart and table.")
    st.query_params["runs"] = ",".join(map(str, chosen))
    st.session_state[COMPARED] = chosen  # a Run page's "Add to Compare" adds its run to these
    return chosen


def pick_metrics(keys: list[str]) -> list[str]:
    """The metrics multiselect, from the URL's ``metrics`` (else loss and the eval metrics, or a
    run without them its first few)."""
    wanted = [k for k in (st.query_params.get("metrics") or "").split(",") if k in keys]
    default = wanted if "metrics" in st.query_params else [k for k in PREFERRED if k in keys] or keys[:FIRST_CHARTS]
    chosen = st.multiselect("Metrics", keys, default=default, placeholder="pick metrics to chart",
                            format_func=metric_registry.label,
                            help=f"One chart and two table columns per metric (the first {FIRST_CHARTS} charts drawn "
                                 "at once, the others when opened). Best is the minimum, or the maximum "
                                 "for accuracy-like names (acc, accuracy, top1, f1, auc, score, reward, mfu…) "
                                 "and rates (…_per_s).")
    st.query_params["metrics"] = ",".join(chosen)
    return chosen


def finished(run: dict[str, Any]) -> bool:
    """Whether a run's points no longer change (until a resume, which ends it again later)."""
    return run["status"] in TERMINAL_VALUES and run.get("ended_at") is not None


@st.cache_data(max_entries=64, show_spinner=False)
def finished_summaries(run_ids: tuple[int, ...], keys: tuple[str, ...],
                       ended_at: tuple[float, ...]) -> dict[tuple[int, str], MetricSummary]:
    """The summaries of finished runs, kept by their ends as :func:`finished_mean` keeps a series."""
    return data.metric_summaries(run_ids, keys)


def summary(runs: list[dict[str, Any]], keys: list[str], colors: list[str]) -> None:
    st.subheader("Summary")
    ids = tuple(r["id"] for r in runs)
    metrics = (finished_summaries(ids, tuple(keys), tuple(r["ended_at"] for r in runs))
               if all(finished(r) for r in runs) else data.metric_summaries(ids, tuple(keys)))
    st.table(cc.styled_summary(style.plain_frame(cc.summary_frame(runs, keys, metrics)), colors))
    st.caption("Values are the mean over ranks at a step, along each run's lineage (steps abandoned by a resume "
               "do not count). Final: at the run's last step. Best: " +
               ", ".join(f"{style.plain(metric_registry.label(k))}: {cc.best_word(higher_is_better(k))}"
                         for k in keys) +
               ", with its step (for a run of more than 1,000 logged steps, the best mean of a bucket of steps, "
               "as the chart draws it). Wall time: start to end (or now).")


def costs(runs: list[dict[str, Any]], colors: list[str]) -> None:
    """Each run's energy and its two cost lines, a table of their own (the summary is as wide as
    an 800 px window allows)."""
    st.subheader("Energy and cost")
    st.table(cc.styled_summary(style.plain_frame(cc.cost_frame(runs)), colors))
    st.caption("Your cost: energy x your tariff x PUE + your hardware's amortisation (Settings; — until a tariff "
               "is set). Cloud ref.: device time at the list price the run was submitted at. Both over every "
               "attempt, never added together (docs/COSTS.md).")


def differences(runs: list[dict[str, Any]]) -> None:
    st.subheader("Config differences")
    if len(runs) < 2:
        st.info("One run: nothing to diff. Add another run above to see which settings differ.")
        return
    diff = config_diff([r["config"] for r in runs])
    if not diff:
        st.info("These runs have the same config (their names aside).")
        return
    st.table(style.plain_frame(cc.diff_frame(diff, [f"#{r['id']} {r['name']}" for r in runs])).style.hide(axis="index"))


@st.cache_data(max_entries=2000, show_spinner=False)
def finished_mean(run_id: int, key: str, ended_at: float) -> pd.DataFrame:
    """A finished run's rank mean of ``key``, kept: its points no longer change. Kept by run,
    metric and the run's end (a resumed run ends again, later), so a person who changes the x
    axis or opens one more chart waits for no read of what they saw already."""
    return fresh_mean(run_id, key)


def fresh_mean(run_id: int, key: str) -> pd.DataFrame:
    """A run's rank mean of ``key`` along its lineage, from the metric store (cached 2 s: a live run grows)."""
    series = data.metric_series_full(run_id, key, MAX_POINTS)
    return cc.rank_mean(series.rows, data.lineage_cutoffs(data.run_attempts(run_id)))


def chart_frame(run: dict[str, Any], key: str, label: str, x_axis: str, smoothing: float) -> pd.DataFrame:
    mean = finished_mean(run["id"], key, run["ended_at"]) if finished(run) else fresh_mean(run["id"], key)
    return cc.placed(mean, x_axis, run.get("started_at"), smoothing).assign(run=label)


def chart_options(count: int) -> tuple[str, float, bool]:
    """The x axis and the smoothing of every chart (the Run page's choices: its X axis and its
    EMA), and whether every chosen metric's chart is drawn (past the first ``FIRST_CHARTS``)."""
    row = st.container(horizontal=True, vertical_alignment="bottom", gap="medium")
    x_axis = row.segmented_control("X axis", X_AXES, default=X_STEP, key="compare-x",
                                   help="Step; wall time (the clock); or relative time: since each run started, "
                                        "so runs of different days line up") or X_STEP
    smoothing = row.popover("Smoothing", icon=":material/tune:").slider(
        "EMA weight", 0.0, 0.99, 0.0, 0.01, key="compare-ema",
        help="Weight of the running average, as on the Run page: the smoothed line is drawn over the faint values")
    every = count > FIRST_CHARTS and row.toggle(
        f"Draw all {count} charts", key="compare-all",
        help=f"The first {FIRST_CHARTS} charts are drawn at once and each other metric when its section is opened, "
             "so that many metrics keep the page quick to answer; this draws them all")
    return x_axis, smoothing, every


def metric_chart(runs: list[dict[str, Any]], key: str, labels: list[str], colors: list[str], x_axis: str,
                 smoothing: float) -> None:
    """One metric's chart, every run overlaid, with its Log y switch (its data read only now)."""
    frames = [chart_frame(r, key, label, x_axis, smoothing) for r, label in zip(runs, labels, strict=True)]
    lacking = [label for f, label in zip(frames, labels, strict=True) if f.empty]
    frame = pd.concat(frames)
    x_title = {X_STEP: "step", X_WALL: "wall time"}.get(x_axis, "")
    if x_axis == X_RELATIVE:
        frame, x_title = cc.relative_x(frame)
    # The Run page's rule until a person chooses: a log axis once the values span two decades.
    log_y = st.toggle("Log y", value=cc.log_by_rule(key, frame), key=f"compare-log-{key}",
                      disabled=not metric_registry.spec_for(key).log_ok,
                      help=f"A log scale for the {style.plain(metric_registry.label(key))} chart only; "
                           "on by itself when its values span more than two decades")
    chart = cc.overlay_chart(frame, key, labels, colors, log_y=log_y, x_axis=x_axis, x_title=x_title,
                             smoothing=smoothing > 0)
    st.altair_chart(unvalidated(chart), width="stretch")
    if lacking:
        st.caption(f"No {style.plain(metric_registry.label(key))} in {style.plain(', '.join(lacking))}.")


def charts(runs: list[dict[str, Any]], keys: list[str], colors: list[str]) -> None:
    """The first ``FIRST_CHARTS`` metrics' charts, then each other metric in a closed section
    whose chart is read and drawn when a person opens it (or all at once, when asked): twenty
    metrics of ten runs drawn in one script run kept the page from answering for seconds."""
    st.subheader("Charts")
    labels = [cc.run_label(r) for r in runs]
    st.markdown(cc.legend_html(labels, colors), unsafe_allow_html=True)
    x_axis, smoothing, every = chart_options(len(keys))
    drawn, waiting = (keys, []) if every else (keys[:FIRST_CHARTS], keys[FIRST_CHARTS:])
    columns = st.columns(2)
    for i, key in enumerate(drawn):
        with columns[i % 2]:
            metric_chart(runs, key, labels, colors, x_axis, smoothing)
    if not waiting:
        return
    st.caption(f"{len(waiting)} more {'chart' if len(waiting) == 1 else 'charts'}: each is drawn when its section "
               f"is opened, or all with **Draw all {len(keys)} charts** above.")
    columns = st.columns(2)
    for i, key in enumerate(waiting):
        with columns[i % 2]:
            section = st.expander(style.plain(metric_registry.label(key)), key=f"compare-open-{key}",
                                  on_change="rerun")
            if section.open:
                with section:
                    metric_chart(runs, key, labels, colors, x_axis, smoothing)


st.title("Compare runs")
all_runs = data.list_runs()
if not all_runs:
    st.info("No runs yet. Start one on the **New run** page; once two have run, compare them here.")
    st.page_link("views/new_run.py", label="New run", icon=":material/add_circle:")
    st.stop()
chosen = pick_runs(all_runs)
if not chosen:
    st.info("Pick two or more runs above, or select their rows on the **Runs** page and press **Compare**.")
    st.stop()
runs = data.compare_runs(tuple(chosen))
if isinstance(runs, str):  # a run deleted since the list was read
    st.error(style.plain(runs))
    st.stop()
keys = sorted({k for run_id in chosen for k in data.metric_keys(run_id)})
metrics = pick_metrics(keys) if keys else []
if len(chosen) == 1:
    st.info("One run chosen: add another above to compare. Its summary and charts are shown alone.")
colors = [cc.run_colors(chosen)[i] for i in chosen]
summary(runs, metrics, colors)
differences(runs)
costs(runs, colors)
if not keys:
    st.info("None of these runs has reported a metric yet: the charts appear with the first points.")
elif not metrics:
    st.info("Pick one or more metrics above to chart them.")
else:
    charts(runs, metrics, colors)
