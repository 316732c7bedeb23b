"""New run: the run config as a form (or a TOML upload), validated before anything is queued.

The form is drawn from the config model (app/form.py): one widget per field of RunConfig, for
the chosen workload kind. This page only draws what that describes.
"""

from __future__ import annotations

from typing import Any

import streamlit as st

from app import data, form
from db.config import ConfigError, RunConfig, deep_merge, field_of, parse_toml

# Widgets per row in a section.
COLUMNS = 3

st.title("New run")

uploaded = st.file_uploader("Start from a TOML config (optional)", type=["toml"])
base: dict[str, Any] = RunConfig().as_dict()
if uploaded is not None:
    try:
        raw = parse_toml(uploaded.getvalue().decode())
        base = {**base, **{k: ({**base.get(k, {}), **v} if isinstance(v, dict) else v) for k, v in raw.items()}}
        st.caption(f"Form filled from {uploaded.name}; change anything before starting.")
    except (ConfigError, UnicodeDecodeError) as exc:
        st.error(f"{uploaded.name}: {exc}")

errors: dict[str, list[str]] = st.session_state.get("new_run_errors", {})


def field_errors(field: str) -> None:
    for message in errors.get(field, []):
        st.error(message, icon=":material/error:")


def widget(spec: form.FieldSpec, value: Any) -> Any:
    """Draw the widget ``spec`` describes, starting at ``value``; returns what it holds."""
    if spec.widget in ("int", "float"):
        low, high = form.widget_bounds(spec, value)
        return st.number_input(spec.label, value=value, min_value=low, max_value=high, step=spec.step,
                               format=spec.number_format, key=spec.key, help=spec.help)
    if spec.widget == "bool":
        return st.checkbox(spec.label, value=value, key=spec.key, help=spec.help)
    if spec.widget == "choice":
        return st.selectbox(spec.label, spec.options, index=spec.options.index(value), key=spec.key, help=spec.help)
    if spec.widget == "table":
        return st.text_area(spec.label, value=value, placeholder=spec.placeholder, key=spec.key, help=spec.help)
    return st.text_input(spec.label, value=value, max_chars=spec.max_chars, placeholder=spec.placeholder,
                         key=spec.key, help=spec.help)


every_field = form.form_fields(RunConfig)
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
    started = st.form_submit_button("Start", type="primary", icon=":material/play_arrow:")

for message in errors.get("", []):
    st.error(message)

if started:
    # Keys the form does not show (from an uploaded TOML) are kept.
    config_data = deep_merge(base, form.values_to_config(values, RunConfig))
    try:
        config = data.validate_config(config_data)
    except ConfigError as exc:
        shown = {spec.key for s in sections for spec in s.fields} | {s.name for s in sections if s.name}
        grouped: dict[str, list[str]] = {}
        for problem in exc.problems:
            field = field_of(problem)
            grouped.setdefault(field if field in shown else "", []).append(problem)
        st.session_state["new_run_errors"] = grouped
        st.rerun()
    st.session_state["new_run_errors"] = {}
    run_id = data.submit_run(config)
    st.switch_page("views/run.py", query_params={"run": str(run_id)})
