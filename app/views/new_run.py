"""New run: the run config as a form (or a TOML upload or paste), validated before anything is queued.

The form is drawn from the config model (app/form.py): one widget per field of RunConfig, for
the chosen workload kind. This page only draws what that describes.

A fork opens this page as ``/new?fork=RUN&checkpoint=ID`` (the Run page's Fork…): the form holds
that run's config at that checkpoint, the changes against it are listed above Start, and Start
queues the fork (a new run that starts from the checkpoint) once those changes were shown.

A pasted TOML is what runs: the paste box is part of the form, so Start (and Update estimate)
carry its text; text the form does not hold yet fills the form instead of starting, and the page
says so (docs/UI.md, "New run").
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import config_form, data, form, form_values, run_actions, style
from app.config_form import FormKeys
from app.fork_changes import config_changes, overrides_for
from db.requests import RequestRefused
from db.vocabulary.config import (
    ConfigError,
    RunConfig,
    deep_merge,
    effective_batch_change,
    plausibility_warnings,
)
from orchestrator.format import estimate_text
from orchestrator.submission import refusals_before_start

style.apply()

st.title("New run")

every_field = form.form_fields(RunConfig)
# The form's first run is one a person can watch: 3,000 steps of mlp-digits on 2 CPU ranks train
# for about a minute after a ~15 s start-up (300, the config's default, ended 4 s after its first point).
FIRST_RUN_STEPS = 3000
DEFAULTS: dict[str, Any] = deep_merge(RunConfig().as_dict(), {"train": {"max_steps": FIRST_RUN_STEPS}})
KEYS = FormKeys("new_run")
# The fork the form was filled for (app.data.fork_source), and the changes last shown for it.
FORK_KEY, SHOWN_KEY = "new_run_fork", "new_run_fork_shown"


def load_toml(text: str, name: str) -> bool:
    """Fill the form from a TOML config (app.config_form.load_toml): a file's missing keys take the
    config's defaults, as with `runyard submit` (not the form's first run's)."""
    return config_form.load_toml(KEYS, every_field, RunConfig().as_dict(), text, name)


def fork_of_query() -> dict[str, Any] | None:
    """The fork this page was opened for (``?fork=RUN&checkpoint=ID``), filling the form the first
    time; None without those parameters (a fork left behind is forgotten)."""
    run, checkpoint = st.query_params.get("fork"), st.query_params.get("checkpoint")
    held: dict[str, Any] | None = st.session_state.get(FORK_KEY)
    if not run or not checkpoint:
        if held is not None:  # the person came back without the fork's address: a fresh form
            forget_fork()
        return None
    if held is not None and (str(held["run"]), str(held["checkpoint"])) == (run, checkpoint):
        return held
    try:
        if not (run.isdigit() and checkpoint.isdigit()):
            raise RequestRefused(f"fork={run!r}, checkpoint={checkpoint!r}: both must be ids; open Fork… on a "
                                 "run's page")
        source = data.fork_source(int(run), int(checkpoint))
    except RequestRefused as exc:
        st.error(f"Not a fork: {style.plain(exc)}", icon=":material/error:")
        return None
    config_form.fill(KEYS, source["config"], every_field)
    st.session_state[FORK_KEY] = source
    st.session_state.pop(SHOWN_KEY, None)
    return source


def forget_fork() -> None:
    """Back to a fresh form: the fork's values, base and parameters dropped."""
    for key in [FORK_KEY, SHOWN_KEY, KEYS.base, KEYS.errors, *(spec.key for spec in every_field)]:
        st.session_state.pop(key, None)
    for param in ("fork", "checkpoint"):
        st.query_params.pop(param, None)


def show_fork_changes(source: dict[str, Any], applied: dict[str, Any]) -> list[str]:
    """List what the form changes against the fork's source (above Start); returns the changes
    as ``key=value`` overrides of the source run's config, [] when there are none yet."""
    changes = config_changes(source["config"], applied)
    if changes:
        st.info(f"**Changes against run #{source['run']} at step {source['step']}** ({len(changes)}):\n\n"
                + "\n".join(f"- {style.plain(key)}: {style.plain(repr(old))} → {style.plain(repr(new))}"
                            for key, old, new in changes),
                icon=":material/difference:")
        note = effective_batch_change(source["config"], applied)
        if note:
            st.warning(style.plain(note[0].upper() + note[1:]), icon=":material/warning:")
    else:
        st.info(f"**No changes yet against run #{source['run']} at step {source['step']}**: change a value, then "
                "press Update estimate (or Start) to see the changes listed here.", icon=":material/difference:")
    try:
        return overrides_for(source["base"], applied)
    except ValueError as exc:
        st.error(style.plain(exc), icon=":material/error:")
        return []


fork = fork_of_query()
if fork is not None:
    st.info(f"**Fork of run #{fork['run']} {style.plain(fork['name'])} from its checkpoint at step {fork['step']}.** "
            "The form holds that run's config at that checkpoint; change what you want, check the changes above Start, "
            "then Start.", icon=":material/call_split:")
    st.button("Discard the fork (a fresh form)", icon=":material/close:", on_click=forget_fork)
previously_shown = st.session_state.get(SHOWN_KEY)

top = config_form.opening(KEYS, "Start from a TOML config (optional)", load_toml, RunConfig, every_field,
                          DEFAULTS)
base, errors, initial, sections = top.base, top.errors, top.initial, top.sections

with st.form("new_run"):
    config_form.paste_box(KEYS, 'name = "gpt"\n[workload]\nkind = "gpt-char"', load_toml)
    values: dict[str, Any] = dict(top.chosen)
    values |= config_form.draw_sections(KEYS, sections, initial, errors, skip=(form.KIND_KEY, form.EXECUTOR_KEY))
    config_form.refusals_and_warnings(KEYS, errors)
    # Time and cost before Start, for the values as last applied (a form sends its values on a
    # button: "Update estimate" applies the edits without starting); a fork trains from its
    # checkpoint's step. None for a run Start would refuse: it would price a run that never starts.
    as_applied: dict[str, Any] | None = None
    estimate: str | None = None
    would_refuse: list[str] = []
    try:
        as_applied = deep_merge(base, form_values.values_to_config(values, RunConfig))
        would_refuse = refusals_before_start(as_applied, data.inventory())
        if not would_refuse and not errors:
            estimate = estimate_text(data.start_estimate(as_applied, from_step=fork["step"] if fork else 0))
    except (TypeError, ValueError):  # a value the validation at Start will name
        pass
    if estimate:
        st.info(f"**Estimate**: {style.plain(estimate)}", icon=":material/calculate:")
    elif errors or would_refuse:
        why = ("fix the problems above first" if errors else
               "as set, Start would refuse it:\n\n" + "\n".join(f"- {style.plain(p)}" for p in would_refuse))
        st.info(f"**No estimate**: {why}", icon=":material/block:")
    overrides: list[str] = []
    if fork is not None and as_applied is not None:
        overrides = show_fork_changes(fork, as_applied)
        st.session_state[SHOWN_KEY] = overrides
        if st.session_state.pop("new_run_fork_unseen", False):
            st.warning("**Check the changes above**, then press Start again to fork.", icon=":material/warning:")
    # A row as wide as its buttons (fixed columns cut "Update estimate" at 800 px).
    with st.container(horizontal=True):
        started = st.form_submit_button("Start", type="primary", icon=":material/play_arrow:",
                                        on_click=config_form.on_start, args=(KEYS, load_toml),
                                        disabled=data.read_only_reason() is not None, help=data.read_only_reason())
        st.form_submit_button("Update estimate", icon=":material/calculate:", on_click=config_form.on_start,
                              args=(KEYS, load_toml),
                              help="Apply the values above to the estimate" + (" and the changes" if fork else "")
                                   + " without starting")

if not config_form.start_was_held(KEYS, started) and started:
    config_data = form_values.form_config(base, values, RunConfig)
    try:
        config = data.validate_fork(fork["base"], config_data) if fork else data.validate_config(config_data)
    except ConfigError as exc:
        config_form.refuse(KEYS, exc, {spec.key for s in sections for spec in s.fields}
                           | {s.name for s in sections if s.name}, values)
    config_form.ask_once(KEYS, plausibility_warnings(config), values)
    if fork is not None and overrides != previously_shown:  # the changes as Start sent them, not seen yet
        st.session_state["new_run_fork_unseen"] = True
        st.rerun()
    config_form.started(KEYS)
    if fork is None:
        run_id = data.submit_run(config)
    else:
        try:
            run_id = data.fork_run(fork["run"], -1, overrides, checkpoint_id=fork["checkpoint"])
        except (ConfigError, RequestRefused) as exc:
            st.error(f"Not forked: {style.plain(exc)}", icon=":material/error:")
            st.stop()
        forget_fork()
    run_actions.open_run(run_id)
