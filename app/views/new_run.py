"""New run: the run config as a form (or a TOML upload), validated before anything is queued.

The form is drawn from the config model (app/form.py): one widget per field of RunConfig, for
the chosen workload kind. This page only draws what that describes.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import data, form
from db.config import ConfigError, RunConfig, deep_merge, field_of, parse_config, parse_toml, plausibility_warnings
from orchestrator.format import estimate_text

# Widgets per row in a section.
COLUMNS = 3

st.title("New run")

every_field = form.form_fields(RunConfig)
# The form's first run is one a person can watch: 3,000 steps of mlp-digits on 2 CPU ranks train
# for about a minute after a ~15 s start-up (300, the config's default, ended 4 s after its first point).
FIRST_RUN_STEPS = 3000
DEFAULTS: dict[str, Any] = deep_merge(RunConfig().as_dict(), {"train": {"max_steps": FIRST_RUN_STEPS}})
BASE_KEY, LOADED_KEY, ERRORS_KEY, WARNED_KEY = "new_run_base", "new_run_loaded", "new_run_errors", "new_run_warned"


def load_toml(text: str, name: str) -> None:
    """Fill the form from a TOML config: every widget takes the file's value (set in the session
    state before the widgets are drawn: a widget with a key ignores a new ``value=``), keys the
    form does not show are kept for Start, and every problem of the file is listed with its key."""
    try:
        raw = parse_toml(text)
    except ConfigError as exc:
        st.session_state[LOADED_KEY] = (name, exc.problems, False)
        return
    problems: list[str] = []
    try:
        parse_config(raw)
    except ConfigError as exc:
        problems = list(exc.problems)
    # A file's missing keys take the config's defaults, as with `runyard submit` (not the form's first run's).
    base = deep_merge(RunConfig().as_dict(), raw)
    values, notes = form.widget_values(base, every_field)
    for key, value in values.items():
        st.session_state[key] = value
    st.session_state[BASE_KEY] = base
    st.session_state[LOADED_KEY] = (name, problems + notes, True)
    st.session_state[ERRORS_KEY] = {}


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
    load_toml(st.session_state.get("new_run_pasted", ""), "the pasted TOML")


upload, paste = st.columns(2)
with upload:
    st.file_uploader("Start from a TOML config (optional)", type=["toml"], key="new_run_upload",
                     on_change=on_upload)
with paste:
    with st.expander("…or paste TOML"):
        st.text_area("TOML", key="new_run_pasted", height=160, label_visibility="collapsed",
                     placeholder='name = "gpt"\n[workload]\nkind = "gpt-char"')
        st.button("Fill the form", on_click=on_paste)
loaded = st.session_state.get(LOADED_KEY)
if loaded is not None:
    name, problems, filled = loaded
    if filled and not problems:
        st.success(f"Form filled from {name}; change anything before starting.", icon=":material/check:")
    elif filled:
        st.warning(f"Form filled from {name}, with {len(problems)} problem(s) to fix before Start:\n\n"
                   + "\n".join(f"- {p}" for p in problems), icon=":material/warning:")
    else:
        st.error(f"{name} was not loaded:\n\n" + "\n".join(f"- {p}" for p in problems), icon=":material/error:")
base: dict[str, Any] = st.session_state.get(BASE_KEY, DEFAULTS)

# The refusals of the last Start, each with the value it refused: one whose field now holds
# another value (changed, or reset by leaving the page) is not shown any more.
stored: dict[str, tuple[list[str], Any]] = st.session_state.get(ERRORS_KEY, {})
errors: dict[str, list[str]] = {
    field: messages for field, (messages, value) in stored.items()
    if not field or field not in st.session_state or st.session_state[field] == value}


def field_errors(field: str) -> None:
    for message in errors.get(field, []):
        st.error(message, icon=":material/error:")


def widget(spec: form.FieldSpec, value: Any) -> Any:
    """Draw the widget ``spec`` describes, starting at ``value`` unless it already holds one
    (the person's, or a loaded file's); returns what it holds."""
    held = spec.key in st.session_state
    start: dict[str, Any] = {} if held else {"value": value}
    if spec.widget in ("int", "float"):
        low, high = form.widget_bounds(spec, st.session_state[spec.key] if held else value)
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


initial, notes = form.widget_values(base, every_field)
for note in notes:
    st.warning(note, icon=":material/warning:")

# The kind is chosen outside the form: a change redraws the page at once with that kind's fields
# (inside an st.form nothing reruns before Start).
kind_spec = next(spec for spec in every_field if spec.key == form.KIND_KEY)
kind = widget(kind_spec, initial[form.KIND_KEY])
field_errors(form.KIND_KEY)
sections = form.form_sections(RunConfig, kind)

with st.form("new_run"):
    values: dict[str, Any] = {form.KIND_KEY: kind}
    for section in sections:
        fields = [spec for spec in section.fields if spec.key != form.KIND_KEY]
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
                 + "\n".join(f"- {m}" for messages in errors.values() for m in messages), icon=":material/error:")
    warned = st.session_state.get(WARNED_KEY)
    if warned and not errors:
        st.warning("**Check before starting** (press Start again to start anyway):\n\n"
                   + "\n".join(f"- {w}" for w in warned[1]), icon=":material/warning:")
    # Time and cost before Start, for the values as last applied (a form sends its values on a
    # button: "Update estimate" applies the edits without starting).
    try:
        as_applied = deep_merge(base, form.values_to_config(values, RunConfig))
        estimate: str | None = estimate_text(data.start_estimate(as_applied))
    except (TypeError, ValueError):  # a value the validation at Start will name
        estimate = None
    if estimate:
        st.info(f"**Estimate**: {estimate}", icon=":material/calculate:")
    # A row as wide as its buttons (fixed columns cut "Update estimate" at 800 px).
    with st.container(horizontal=True):
        started = st.form_submit_button("Start", type="primary", icon=":material/play_arrow:")
        st.form_submit_button("Update estimate", icon=":material/calculate:",
                              help="Apply the values above to the estimate without starting")

if started:
    # Keys the form does not show (from an uploaded TOML) are kept; a table the form shows is
    # taken as it reads (a name removed in the box is removed).
    from_form = form.values_to_config(values, RunConfig)
    config_data = deep_merge(base, from_form)
    for spec in every_field:
        if spec.widget == "table" and spec.key in values:
            table_section, table_key = spec.path
            config_data[table_section][table_key] = from_form[table_section][table_key]
    try:
        config = data.validate_config(config_data)
    except ConfigError as exc:
        shown = {spec.key for s in sections for spec in s.fields} | {s.name for s in sections if s.name}
        grouped: dict[str, list[str]] = {}
        for problem in exc.problems:
            field = field_of(problem)
            grouped.setdefault(field if field in shown else "", []).append(problem)
        st.session_state[ERRORS_KEY] = {field: (messages, values.get(field)) for field, messages in grouped.items()}
        st.rerun()
    st.session_state[ERRORS_KEY] = {}
    # Valid but rarely meant (lr = 50): asked once for this exact config.
    warnings = plausibility_warnings(config)
    if warnings and (st.session_state.get(WARNED_KEY) or ("",))[0] != config.config_hash():
        st.session_state[WARNED_KEY] = (config.config_hash(), warnings)
        st.rerun()
    st.session_state.pop(WARNED_KEY, None)
    st.session_state.pop(LOADED_KEY, None)
    run_id = data.submit_run(config)
    st.switch_page("views/run.py", query_params={"run": str(run_id)})
