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

from app import data, form, form_values, run_actions, style
from app.fork_changes import config_changes, overrides_for
from db.requests import RequestRefused
from db.vocabulary.config import (
    ConfigError,
    RunConfig,
    deep_merge,
    effective_batch_change,
    field_of,
    parse_config,
    parse_toml,
    plausibility_warnings,
)
from orchestrator.format import estimate_text
from orchestrator.submission import refusals_before_start

style.apply()

# Widgets per row in a section.
COLUMNS = 3

st.title("New run")

every_field = form.form_fields(RunConfig)
# The form's first run is one a person can watch: 3,000 steps of mlp-digits on 2 CPU ranks train
# for about a minute after a ~15 s start-up (300, the config's default, ended 4 s after its first point).
FIRST_RUN_STEPS = 3000
DEFAULTS: dict[str, Any] = deep_merge(RunConfig().as_dict(), {"train": {"max_steps": FIRST_RUN_STEPS}})
BASE_KEY, LOADED_KEY, ERRORS_KEY, WARNED_KEY = "new_run_base", "new_run_loaded", "new_run_errors", "new_run_warned"
# The fork the form was filled for (app.data.fork_source), and the changes last shown for it.
FORK_KEY, SHOWN_KEY = "new_run_fork", "new_run_fork_shown"
# The paste box, the text the form was last filled from, and a press of Start that filled it instead.
PASTED_KEY, APPLIED_KEY, HELD_KEY = "new_run_pasted", "new_run_paste_applied", "new_run_paste_held"
PASTED_NAME = "the pasted TOML"


def fill(base: dict[str, Any]) -> list[str]:
    """Set every widget to ``base``'s value (in the session state, before the widgets are drawn:
    a widget with a key ignores a new ``value=``); returns the notes on values no widget holds."""
    values, notes = form_values.widget_values(base, every_field)
    for key, value in values.items():
        st.session_state[key] = value
    st.session_state[BASE_KEY] = base
    st.session_state[ERRORS_KEY] = {}
    return notes


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
    fill(source["config"])
    st.session_state[FORK_KEY] = source
    st.session_state.pop(SHOWN_KEY, None)
    return source


def forget_fork() -> None:
    """Back to a fresh form: the fork's values, base and parameters dropped."""
    for key in [FORK_KEY, SHOWN_KEY, BASE_KEY, ERRORS_KEY, *(spec.key for spec in every_field)]:
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


def load_toml(text: str, name: str) -> bool:
    """Fill the form from a TOML config: every widget takes the file's value (set in the session
    state before the widgets are drawn: a widget with a key ignores a new ``value=``), keys the
    form does not show are kept for Start, and every problem of the file is listed with its key.
    Returns whether the form was filled (False: the text is no TOML, the form is unchanged)."""
    try:
        raw = parse_toml(text)
    except ConfigError as exc:
        st.session_state[LOADED_KEY] = (name, exc.problems, False)
        return False
    problems: list[str] = []
    try:
        parse_config(raw)
    except ConfigError as exc:
        problems = list(exc.problems)
    # A file's missing keys take the config's defaults, as with `runyard submit` (not the form's first run's).
    base = deep_merge(RunConfig().as_dict(), raw)
    notes = fill(base)
    st.session_state[LOADED_KEY] = (name, problems + notes, True)
    return True


def on_upload() -> None:
    uploaded = st.session_state.get("new_run_upload")
    if uploaded is None:
        return
    try:
        text = uploaded.getvalue().decode()
    except UnicodeDecodeError as exc:
        st.session_state[LOADED_KEY] = (uploaded.name, [f"not UTF-8 text: {exc}"], False)
        return
    load_toml(text, uploaded.name)


def on_paste() -> None:
    """Fill the form from the paste box ("Fill the form"); text that is no TOML is never taken as
    applied, so Start keeps refusing it until it is fixed or cleared."""
    text = st.session_state.get(PASTED_KEY, "")
    if load_toml(text, PASTED_NAME):
        st.session_state[APPLIED_KEY] = text


def on_start() -> None:
    """Before Start (or Update estimate) reads the form: a paste the form was not filled from fills
    it now, and Start is held (:data:`HELD_KEY`) so the person sees what the paste put there. An
    empty box, or the text last applied, leaves the form as the person set it."""
    text = st.session_state.get(PASTED_KEY, "")
    if text.strip() and text != st.session_state.get(APPLIED_KEY):
        on_paste()
        st.session_state[HELD_KEY] = True


fork = fork_of_query()
if fork is not None:
    st.info(f"**Fork of run #{fork['run']} {style.plain(fork['name'])} from its checkpoint at step {fork['step']}.** "
            "The form holds that run's config at that checkpoint; change what you want, check the changes above Start, "
            "then Start.", icon=":material/call_split:")
    st.button("Discard the fork (a fresh form)", icon=":material/close:", on_click=forget_fork)
previously_shown = st.session_state.get(SHOWN_KEY)

upload, _ = st.columns(2)
with upload:
    st.file_uploader("Start from a TOML config (optional)", type=["toml"], key="new_run_upload",
                     on_change=on_upload)
loaded = st.session_state.get(LOADED_KEY)
if loaded is not None:
    name, problems, filled = loaded
    if filled and not problems:
        st.success(f"Form filled from {style.plain(name)}; change anything before starting.", icon=":material/check:")
    elif filled:
        st.warning(f"Form filled from {style.plain(name)}, with {len(problems)} problem(s) to fix "
                   "before Start:\n\n"
                   + "\n".join(f"- {style.plain(p)}" for p in problems), icon=":material/warning:")
    else:
        st.error(f"{style.plain(name)} was not loaded:\n\n"
                 + "\n".join(f"- {style.plain(p)}" for p in problems), icon=":material/error:")
base: dict[str, Any] = st.session_state.get(BASE_KEY, DEFAULTS)

# The refusals of the last Start, each with the value it refused: one whose field now holds
# another value (changed, or reset by leaving the page) is not shown any more.
stored: dict[str, tuple[list[str], Any]] = st.session_state.get(ERRORS_KEY, {})
errors: dict[str, list[str]] = {
    field: messages for field, (messages, value) in stored.items()
    if not field or field not in st.session_state or st.session_state[field] == value}


def field_errors(field: str) -> None:
    for message in errors.get(field, []):
        st.error(style.plain(message), icon=":material/error:")


def widget(spec: form.FieldSpec, value: Any) -> Any:
    """Draw the widget ``spec`` describes, starting at ``value`` unless it already holds one
    (the person's, or a loaded file's); returns what it holds."""
    held = spec.key in st.session_state
    start: dict[str, Any] = {} if held else {"value": value}
    if spec.widget in ("int", "float"):
        low, high = form_values.widget_bounds(spec, st.session_state[spec.key] if held else value)
        return st.number_input(spec.label, **start, min_value=low, max_value=high, step=spec.step,
                               format=spec.number_format, key=spec.key, help=spec.help)
    if spec.widget == "bool":
        return st.checkbox(spec.label, **start, key=spec.key, help=spec.help)
    if spec.widget == "choice":
        index: dict[str, Any] = {} if held else {"index": spec.options.index(value)}
        return st.selectbox(spec.label, spec.options, **index, key=spec.key, help=spec.help)
    if spec.widget == "table":
        return st.text_area(spec.label, **start, placeholder=spec.placeholder, key=spec.key, help=spec.help)
    return st.text_input(spec.label, **start, max_chars=spec.max_chars, placeholder=spec.placeholder,
                         key=spec.key, help=spec.help)


initial, notes = form_values.widget_values(base, every_field)
for note in notes:
    st.warning(style.plain(note), icon=":material/warning:")

# The kind is chosen outside the form: a change redraws the page at once with that kind's fields
# (inside an st.form nothing reruns before Start).
kind_spec = next(spec for spec in every_field if spec.key == form.KIND_KEY)
executor_spec = next(spec for spec in every_field if spec.key == form.EXECUTOR_KEY)
kind_column, executor_column = st.columns(2)
with kind_column:
    kind = widget(kind_spec, initial[form.KIND_KEY])
    field_errors(form.KIND_KEY)
with executor_column:  # the [slurm] section is shown for a Slurm run only
    executor = widget(executor_spec, initial[form.EXECUTOR_KEY])
    field_errors(form.EXECUTOR_KEY)
sections = [s for s in form.form_sections(RunConfig, kind) if s.name != form.SLURM_SECTION or executor == "slurm"]

with st.form("new_run"):
    # The paste box is in the form: its text reaches the server with every press of the form's
    # buttons, so Start can never run the form's values while a paste sits unapplied beside them.
    # (In a form of its own the text stayed in the browser unless "Fill the form" was pressed; as a
    # text area and a button outside any form, the press could arrive while the text's rerun ran,
    # and nothing happened, CI 19.)
    with st.expander("…or paste TOML", expanded=bool(st.session_state.get(PASTED_KEY))):
        st.text_area("TOML", key=PASTED_KEY, height=160, label_visibility="collapsed",
                     placeholder='name = "gpt"\n[workload]\nkind = "gpt-char"')
        st.form_submit_button("Fill the form", on_click=on_paste)
    values: dict[str, Any] = {form.KIND_KEY: kind, form.EXECUTOR_KEY: executor}
    for section in sections:
        fields = [spec for spec in section.fields if spec.key not in (form.KIND_KEY, form.EXECUTOR_KEY)]
        if not fields:
            continue
        # A folded section opens when one of its fields was refused, so the error is seen.
        refused = any(errors.get(key) for key in [section.name, *(spec.key for spec in fields)])
        box = st.container() if section.common else st.expander(section.title, expanded=refused)
        with box:
            if section.common and section.name:
                st.subheader(section.title, help=section.help)
            elif section.name:
                st.caption(section.help)
            if section.name:  # problems across a section's fields (n_embd vs n_head) name the section
                field_errors(section.name)
            # One row of columns at a time, so that an error under one field moves only its row.
            for row in range(0, len(fields), COLUMNS):
                for column, spec in zip(st.columns(COLUMNS), fields[row:row + COLUMNS], strict=False):
                    with column:
                        values[spec.key] = widget(spec, initial[spec.key])
                        field_errors(spec.key)
    # Every refusal above Start, so none is missed in a folded section.
    if errors:
        count = sum(len(m) for m in errors.values())
        st.error(f"**Not started: {count} problem(s).**\n\n"
                 + "\n".join(f"- {style.plain(m)}" for messages in errors.values() for m in messages),
                 icon=":material/error:")
    # The warnings of the last Start, shown with its refusals: a person fixes everything in one go,
    # and a warning seen beside the refusals is not asked about again once they are fixed.
    warned = [text for text, value in st.session_state.get(WARNED_KEY, [])
              if (key := field_of(text)) not in st.session_state or st.session_state[key] == value]
    if warned:
        st.warning(("**Also check** (the refusals above first):\n\n" if errors else
                    "**Check before starting** (press Start again to start anyway):\n\n")
                   + "\n".join(f"- {style.plain(w)}" for w in warned), icon=":material/warning:")
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
        started = st.form_submit_button("Start", type="primary", icon=":material/play_arrow:", on_click=on_start,
                                        disabled=data.read_only_reason() is not None, help=data.read_only_reason())
        st.form_submit_button("Update estimate", icon=":material/calculate:", on_click=on_start,
                              help="Apply the values above to the estimate" + (" and the changes" if fork else "")
                                   + " without starting")

if st.session_state.pop(HELD_KEY, False):
    if started:
        st.warning("**Not started**: the pasted TOML was not in the form yet. The form now holds it (or says "
                   "above why it could not): check it, then press Start.", icon=":material/warning:")
elif started:
    # Keys the form does not show (from an uploaded TOML) are kept; a table the form shows is
    # taken as it reads (a name removed in the box is removed).
    from_form = form_values.values_to_config(values, RunConfig)
    config_data = deep_merge(base, from_form)
    for spec in every_field:
        if spec.widget == "table" and spec.key in values:
            table_section, table_key = spec.path
            config_data[table_section][table_key] = from_form[table_section][table_key]
    try:
        config = data.validate_fork(fork["base"], config_data) if fork else data.validate_config(config_data)
    except ConfigError as exc:
        shown = {spec.key for s in sections for spec in s.fields} | {s.name for s in sections if s.name}
        grouped: dict[str, list[str]] = {}
        for problem in exc.problems:
            field = field_of(problem)
            grouped.setdefault(field if field in shown else "", []).append(problem)
        st.session_state[ERRORS_KEY] = {field: (messages, values.get(field)) for field, messages in grouped.items()}
        st.session_state[WARNED_KEY] = [(w, values.get(field_of(w))) for w in exc.warnings]
        st.rerun()
    st.session_state[ERRORS_KEY] = {}
    # Valid but rarely meant (lr = 50): asked once (each warning names its field and value, so the
    # same list is the same question; one already shown beside refusals is not asked again).
    warnings = plausibility_warnings(config)
    if warnings and [text for text, _ in st.session_state.get(WARNED_KEY, [])] != warnings:
        st.session_state[WARNED_KEY] = [(w, values.get(field_of(w))) for w in warnings]
        st.rerun()
    if fork is not None and overrides != previously_shown:  # the changes as Start sent them, not seen yet
        st.session_state["new_run_fork_unseen"] = True
        st.rerun()
    st.session_state.pop(WARNED_KEY, None)
    st.session_state.pop(LOADED_KEY, None)
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
