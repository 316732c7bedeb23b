"""One sweep (``/sweep?id=N``): its state and why, budget spent and left, ETA, best trial, and the
buttons `runyard sweep` has (Pause, Resume, Cancel, the limits); the parallel coordinates, whose
brush filters the trial table below them; a Promote button for a trial stopped early; parameter
importance; the objective against each parameter; the best value so far over trials and GPU time;
and every trial's curve of the sweep's metric.

The header refreshes itself while the sweep runs; the charts and the table are drawn once per
page run (any click, or a reload). Everything is read from db/sweeps/queries.py's
``sweep_detail`` (app/sweep_data.py); the buttons make the CLI's requests (db/sweeps/requests.py).
"""

from __future__ import annotations

import math
from typing import Any

import pandas as pd
import streamlit as st

from app import data, style, sweep_data
from app.charts import parallel
from app.charts import sweep as charts
from app.charts.metric import unvalidated
from app.panels.coordinates import parallel_component
from db.sweeps.states import SWEEP_TERMINAL, SweepStatus
from db.vocabulary.config.sweep import MAX_TRIALS

style.apply()

SWEEPS_PAGE = "views/sweeps.py"
TERMINAL_VALUES = {s.value for s in SWEEP_TERMINAL}


def sweep_id_from_url() -> int | None:
    text = (st.query_params.get("id") or "").strip().lstrip("#")
    return int(text) if text.isascii() and text.isdigit() else None


def rung_text(t: dict[str, Any]) -> str:
    if t["rung"] is None:
        return "–"
    step = t["rungs"].get(t["rung"], {}).get("step")
    return f"{t['rung']} (step {step})" if step is not None else str(t["rung"])


def state_text(t: dict[str, Any]) -> str:
    """A trial's state as the table says it: PRUNED as "stopped early at step N"."""
    if t["status"] == "PRUNED":
        return f"stopped early at step {t['stopped_at']}" if t["stopped_at"] is not None else "stopped early"
    if t["status"] == "REFUSED":
        return f"REFUSED: {t['error']}"
    return str(t["status"])


def trial_frame(trials: list[dict[str, Any]], space: dict[str, dict[str, Any]]) -> pd.DataFrame:
    """The trial table: number, run link, state, rung reached, objective, its value at the deepest
    rung, the step it stopped at, promotions, then one column per key of the space."""
    frame = pd.DataFrame({
        "trial": [t["number"] for t in trials],
        "run": [f"run?run={t['run_id']}" if t["run_id"] is not None else None for t in trials],
        "state": [state_text(t) for t in trials],
        "rung": [rung_text(t) for t in trials],
        "objective": [t["objective"] for t in trials],
        "value": [t["value"] for t in trials],
        "stopped at": [t["stopped_at"] for t in trials],
        "promoted": [t["promoted"] for t in trials],
    })
    for key, dim in space.items():
        values = [t["params"].get(key) for t in trials]
        frame[key] = [None if v is None else str(v) for v in values] if dim.get("choice") is not None else values
    return frame


def header(sweep_id: int) -> None:
    """Title, state and why, the numbers, and the actions; refreshed while the sweep is active."""
    d = sweep_data.sweep(sweep_id)
    if d is None:
        return
    st.title(f"Sweep #{d['id']} {d['name']}")
    st.markdown(f"{style.sweep_badge(d['status'])} {style.plain(d['status_reason'] or '')}")
    best = d["best"]
    c1, c2, c3, c4, c5 = st.columns(5)
    c1.metric(f"Best {d['metric']}", sweep_data.value_text(best["value"] if best else None),
              help=f"{d['goal']}; the deepest trained trial first, then the best value there")
    c2.metric("Trials", f"{d['trial_count']} / {d['max_trials']}", help=sweep_data.by_state_text(d["by_status"]))
    c3.metric("Spent", f"{d['spent']['gpu_hours']:.3g} GPU-h", help=sweep_data.spent_text(d))
    c4.metric("Left", sweep_data.left_text(d), help="What [sweep.budget] has left; 0 there means no limit")
    c5.metric("Ends", sweep_data.eta_words(d), help="The trials left at the mean time of those that ended, "
                                                   f"{d['max_concurrent']} at a time")
    if best is not None and best["run_id"] is not None:
        st.markdown(f"Best trial: **{best['number']}** ([run #{best['run_id']}](run?run={best['run_id']})), "
                    f"`runyard sweep best {d['id']}` prints its config. "
                    f"{d['searcher']} over {style.plain(', '.join(d['space']))}; "
                    f"{d['max_concurrent']} trial(s) at a time.")
    actions(d)


def actions(d: dict[str, Any]) -> None:
    """Pause or Resume, Cancel (after a confirm), Limits…; disabled, saying why, on a data folder
    that cannot be written; none once the sweep has ended."""
    if d["status"] in TERMINAL_VALUES:
        st.caption("This sweep has ended: its trials are runs (Resume, Fork and Compare apply), and a trial "
                   "stopped early can still be promoted below.")
        return
    viewing = data.read_only_reason()
    with st.container(horizontal=True, key=f"sweep-actions-{d['id']}"):
        if d["status"] == SweepStatus.RUNNING.value:
            if st.button("Pause", icon=":material/pause:", key=f"sweep-pause-{d['id']}", disabled=bool(viewing),
                         help=viewing or "Start and promote no trial until resumed; the trials training go on"):
                said(*sweep_data.pause(d["id"]))
        elif st.button("Resume", icon=":material/play_arrow:", key=f"sweep-resume-{d['id']}",
                       disabled=bool(viewing), help=viewing or "Start and promote trials again"):
            said(*sweep_data.resume(d["id"]))
        if viewing:
            st.button("Cancel", key=f"sweep-cancel-off-{d['id']}", disabled=True, help=viewing)
            st.button("Limits…", key=f"sweep-limits-off-{d['id']}", disabled=True, help=viewing)
            return
        with st.popover("Cancel", icon=":material/stop:", key=f"sweep-cancel-menu-{d['id']}"):
            st.markdown(f"Cancel sweep #{d['id']}? Its trials still training are cancelled (each finishes its "
                        "step, checkpoints and stops); the trials stopped early keep their checkpoints.")
            if st.button("Cancel sweep", type="primary", icon=":material/stop:", key=f"sweep-cancel-{d['id']}"):
                said(*sweep_data.cancel(d["id"]))
        limits_menu(d)


def limits_menu(d: dict[str, Any]) -> None:
    """Limits…: max_trials and max_concurrent, saved together (as `runyard sweep edit`)."""
    with (st.popover("Limits…", icon=":material/tune:", key=f"sweep-limits-menu-{d['id']}",
                     help="How many trials in all, and at once, while it runs"),
          st.form(f"sweep-limits-{d['id']}", border=False)):
        trials = st.number_input("max_trials", min_value=1, max_value=MAX_TRIALS, value=int(d["max_trials"]),
                                 key=f"sweep-max-trials-{d['id']}", help="The most trials it starts in all")
        at_once = st.number_input("max_concurrent", min_value=1, max_value=1024, value=int(d["max_concurrent"]),
                                  key=f"sweep-max-concurrent-{d['id']}",
                                  help="The most trials training at once; fewer than now stops none")
        if st.form_submit_button("Save", type="primary", icon=":material/save:"):
            new_trials = int(trials) if int(trials) != d["max_trials"] else None
            new_at_once = int(at_once) if int(at_once) != d["max_concurrent"] else None
            if new_trials is None and new_at_once is None:
                st.toast("Nothing changed.")
            else:
                said(*sweep_data.edit(d["id"], new_trials, new_at_once))


def said(ok: bool, sentence: str) -> None:
    """Show what a request did (or why not) and draw the page again with the new state."""
    st.toast(style.plain(sentence), icon=None if ok else ":material/error:")
    if ok:
        st.rerun()


def trials_section(d: dict[str, Any]) -> None:
    """The parallel coordinates and, filtered by their brush, the trial table and Promote."""
    st.subheader("Trials")
    space = d["sweep"].get("space", {})
    trials = [t for t in d["trials"] if t["run_id"] is not None or t["status"] == "REFUSED"]
    result = parallel_component()(data=parallel.parallel_data(space, trials, d["metric"], d["goal"]),
                                  key=f"sweep-parallel-{d['id']}", default={"selection": None},
                                  on_selection_change=lambda: None, height=390)
    chosen = parallel.selected_numbers(result.get("selection"), [t["number"] for t in trials])
    shown = trials if chosen is None else [t for t in trials if t["number"] in set(chosen)]
    if chosen is not None:
        brushed = style.plain(parallel.brush_words(result.get("selection")))
        st.caption(f"{len(shown)} of {len(trials)} trials in the brush ({brushed}); **Clear brush** in the chart "
                   "shows them all.")
    frame = trial_frame(shown, space)
    statuses = [t["status"] for t in shown]
    st.dataframe(
        frame.style.apply(lambda _: [style.status_css(s) for s in statuses], subset=["state"]),
        hide_index=True,
        column_config={
            "run": st.column_config.LinkColumn("run", display_text=r"run\?run=(\d+)", help="Open the trial's run"),
            "rung": st.column_config.TextColumn("rung", help="The newest rung it was judged at"),
            "objective": st.column_config.NumberColumn("objective", format="%.5g",
                                                       help=f"{d['metric']} at the trial's end"),
            "value": st.column_config.NumberColumn("value", format="%.5g",
                                                   help="Its objective, else its value at its deepest rung"),
            "stopped at": st.column_config.NumberColumn("stopped at", help="The step a trial stopped early at"),
            "promoted": st.column_config.NumberColumn("promoted", help="Times it was continued after a stop"),
        },
        key=f"sweep-trials-{d['id']}",
    )
    promote_menu(d, shown)


def promote_menu(d: dict[str, Any], shown: list[dict[str, Any]]) -> None:
    """Promote: continue a trial stopped early from its checkpoint (`runyard sweep promote`)."""
    pruned = [t for t in shown if t["status"] == "PRUNED"]
    if not pruned:
        return
    viewing = data.read_only_reason()
    with st.container(horizontal=True, vertical_alignment="bottom"):
        number = st.selectbox("Stopped early", [t["number"] for t in pruned], key=f"sweep-promote-pick-{d['id']}",
                              format_func=lambda n: f"trial {n}", width=200)
        if st.button(f"Promote trial {number}", icon=":material/trending_up:", key=f"sweep-promote-{d['id']}",
                     disabled=bool(viewing) or number is None,
                     help=viewing or "It continues from its newest verified checkpoint: its steps so far are kept, "
                                     "not trained or counted again"):
            assert number is not None
            said(*sweep_data.promote_trial(d["id"], number))


def analysis_section(d: dict[str, Any]) -> None:
    """Importance, the objective against each parameter, the best so far, the trials' curves."""
    space = d["sweep"].get("space", {})
    valued = [t for t in d["trials"] if t["value"] is not None and math.isfinite(t["value"])]
    st.subheader("What mattered")
    # The first fit in a UI process also imports scikit-learn (4.5-8 s on a loaded 2-core
    # machine, bench/bench_sweep.py): say so rather than leave the page blank meanwhile.
    with st.spinner("Fitting the importance (the first time in this UI, loading scikit-learn takes a few seconds)"):
        shares = sweep_data.importance(d)
    if any(shares.values()):
        st.altair_chart(unvalidated(charts.importance_chart(shares)), width="stretch")
        st.caption("Each key's share of a random forest's importance, fitted to the trials' values against their "
                   "settings (a log_uniform key on its log scale); it says which settings moved the objective, not "
                   "which way.")
    else:
        st.info(f"Parameter importance needs at least 4 trials with a value of {style.plain(d['metric'])} that "
                f"differ: {len(valued)} so far.")
    if valued:
        st.altair_chart(unvalidated(charts.objective_by_param_chart(valued, space, d["metric"])))
        finished = charts.best_so_far(d["trials"], d["goal"])
        if finished["best"].notna().any():
            st.altair_chart(unvalidated(charts.best_so_far_chart(finished, d["metric"])))
    curves_section(d)


def curves_section(d: dict[str, Any]) -> None:
    runs = tuple((t["number"], t["run_id"]) for t in d["trials"] if t["run_id"] is not None)
    if not runs:
        return
    ranks = str(d["sweep"].get("ranks", "rank0"))
    curves = sweep_data.trial_curves(runs, d["metric"], ranks)
    frame = charts.curves_frame(curves, d["trials"], d["goal"])
    if frame.empty:
        st.info(f"No trial has logged {style.plain(d['metric'])} yet: its curves appear with the first points.")
        return
    st.altair_chart(unvalidated(charts.curves_chart(frame, d["metric"], d["rungs"])), width="stretch")
    st.caption(f"{'Rank 0' if ranks == 'rank0' else 'The mean over ranks'}, at most "
               f"{sweep_data.points_per_trial(len(runs))} points a trial; bright is a better objective, grey none "
               "yet; dashed rules are the rungs.")


sweep_id = sweep_id_from_url()
detail = sweep_data.sweep(sweep_id) if sweep_id is not None else None
if detail is None:
    st.title("Sweep")
    said_id = style.plain(st.query_params.get("id") or "")
    st.info(f"No sweep {'#' + said_id + ' ' if said_id else ''}here: open one from the **Sweeps** page.")
    st.page_link(SWEEPS_PAGE, label="Sweeps", icon=":material/tune:")
    st.stop()
assert detail is not None and sweep_id is not None
st.fragment(run_every=None if detail["status"] in TERMINAL_VALUES else 3)(header)(sweep_id)
trials_section(detail)
analysis_section(detail)
