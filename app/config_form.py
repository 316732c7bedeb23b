"""What the config forms share (New run, New sweep): a field's widget, the sections drawn with
their refusals, the refusals of a Start kept beside the values they refused, and a TOML file
uploaded or pasted that fills the form.

A pasted TOML is what runs (docs/UI.md, "New run"): the paste box is part of the form, so Start
carries its text; text the form does not hold yet fills the form instead of starting, and the page
says so. Each form keeps its state in the session under names of its own (:class:`FormKeys`), and
its widgets' keys may carry a prefix, so the two pages never share a value.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import streamlit as st
from pydantic import BaseModel

from app import form, form_values, style
from db.vocabulary.config import ConfigError, deep_merge, field_of, parse_config, parse_toml

# Widgets per row in a section.
COLUMNS = 3
PASTED_NAME = "the pasted TOML"


@dataclass(frozen=True)
class FormKeys:
    """Where one form keeps its state in the session.

    Attributes:
        page: The prefix of its own state's keys (``new_run``: ``new_run_base``, ``new_run_pasted``...).
        widgets: The prefix of its widgets' keys (``""``: a field's widget is keyed by its config key).
    """

    page: str
    widgets: str = ""

    @property
    def base(self) -> str:
        """The config the form was filled from (its keys the form does not show are kept for Start)."""
        return f"{self.page}_base"

    @property
    def loaded(self) -> str:
        """The file last loaded: its name, its problems and whether it filled the form."""
        return f"{self.page}_loaded"

    @property
    def errors(self) -> str:
        """The refusals of the last Start, by field, with the values refused."""
        return f"{self.page}_errors"

    @property
    def warned(self) -> str:
        """The warnings of the last Start, with the values they were about."""
        return f"{self.page}_warned"

    @property
    def pasted(self) -> str:
        """The paste box."""
        return f"{self.page}_pasted"

    @property
    def applied(self) -> str:
        """The text the form was last filled from."""
        return f"{self.page}_paste_applied"

    @property
    def held(self) -> str:
        """A press of Start that filled the form from the paste instead."""
        return f"{self.page}_paste_held"

    @property
    def upload(self) -> str:
        """The file uploader."""
        return f"{self.page}_upload"

    def widget(self, key: str) -> str:
        """The widget key of config key ``key``."""
        return self.widgets + key


Loader = Callable[[dict[str, Any]], list[str]]  # a file's data -> its problems (filling what the fields do not)


def fill(keys: FormKeys, base: dict[str, Any], fields: Sequence[form.FieldSpec]) -> list[str]:
    """Set every widget to ``base``'s value (in the session state, before the widgets are drawn:
    a widget with a key ignores a new ``value=``); returns the notes on values no widget holds."""
    values, notes = form_values.widget_values(base, fields)
    for key, value in values.items():
        st.session_state[keys.widget(key)] = value
    st.session_state[keys.base] = base
    st.session_state[keys.errors] = {}
    return notes


def load_toml(keys: FormKeys, fields: Sequence[form.FieldSpec], defaults: dict[str, Any], text: str, name: str,
              more: Loader | None = None) -> bool:
    """Fill the form from a TOML config: every widget takes the file's value, keys the form does not
    show are kept for Start (missing ones take ``defaults``), and every problem of the file is listed
    with its key (``more``: what else the page fills from it, and its problems). Returns whether the
    form was filled (False: the text is no TOML, the form is unchanged)."""
    try:
        raw = parse_toml(text)
    except ConfigError as exc:
        st.session_state[keys.loaded] = (name, exc.problems, False)
        return False
    problems: list[str] = []
    try:
        parse_config(raw)
    except ConfigError as exc:
        problems = list(exc.problems)
    notes = fill(keys, deep_merge(defaults, raw), fields)
    extra = more(raw) if more is not None else []
    st.session_state[keys.loaded] = (name, problems + [p for p in extra if p not in problems] + notes, True)
    return True


def on_upload(keys: FormKeys, load: Callable[[str, str], bool]) -> None:
    uploaded = st.session_state.get(keys.upload)
    if uploaded is None:
        return
    try:
        text = uploaded.getvalue().decode()
    except UnicodeDecodeError as exc:
        st.session_state[keys.loaded] = (uploaded.name, [f"not UTF-8 text: {exc}"], False)
        return
    load(text, uploaded.name)


def on_paste(keys: FormKeys, load: Callable[[str, str], bool]) -> None:
    """Fill the form from the paste box ("Fill the form"); text that is no TOML is never taken as
    applied, so Start keeps refusing it until it is fixed or cleared."""
    text = st.session_state.get(keys.pasted, "")
    if load(text, PASTED_NAME):
        st.session_state[keys.applied] = text


def on_start(keys: FormKeys, load: Callable[[str, str], bool]) -> None:
    """Before Start (or Update estimate) reads the form: a paste the form was not filled from fills
    it now, and Start is held (``keys.held``) so the person sees what the paste put there. An empty
    box, or the text last applied, leaves the form as the person set it."""
    text = st.session_state.get(keys.pasted, "")
    if text.strip() and text != st.session_state.get(keys.applied):
        on_paste(keys, load)
        st.session_state[keys.held] = True


def uploader(keys: FormKeys, label: str, load: Callable[[str, str], bool]) -> None:
    """The file uploader, and what the last file (uploaded or pasted) did to the form."""
    column, _ = st.columns(2)
    with column:
        st.file_uploader(label, type=["toml"], key=keys.upload, on_change=on_upload, args=(keys, load))
    loaded = st.session_state.get(keys.loaded)
    if loaded is None:
        return
    name, problems, filled = loaded
    if filled and not problems:
        st.success(f"Form filled from {style.plain(name)}; change anything before starting.", icon=":material/check:")
    elif filled:
        st.warning(f"Form filled from {style.plain(name)}, with {len(problems)} problem(s) to fix before Start:\n\n"
                   + "\n".join(f"- {style.plain(p)}" for p in problems), icon=":material/warning:")
    else:
        st.error(f"{style.plain(name)} was not loaded:\n\n"
                 + "\n".join(f"- {style.plain(p)}" for p in problems), icon=":material/error:")


def paste_box(keys: FormKeys, placeholder: str, load: Callable[[str, str], bool]) -> None:
    """The paste box and its "Fill the form", inside the page's st.form: its text reaches the server
    with every press of the form's buttons, so Start can never run the form's values while a paste
    sits unapplied beside them. (In a form of its own the text stayed in the browser unless "Fill the
    form" was pressed; as a text area and a button outside any form, the press could arrive while
    the text's rerun ran, and nothing happened, CI 19.)"""
    with st.expander("…or paste TOML", expanded=bool(st.session_state.get(keys.pasted))):
        st.text_area("TOML", key=keys.pasted, height=160, label_visibility="collapsed", placeholder=placeholder)
        st.form_submit_button("Fill the form", on_click=on_paste, args=(keys, load))


def start_was_held(keys: FormKeys, started: bool) -> bool:
    """Whether the press of Start filled the form from a paste instead (then it says so)."""
    if not st.session_state.pop(keys.held, False):
        return False
    if started:
        st.warning("**Not started**: the pasted TOML was not in the form yet. The form now holds it (or says "
                   "above why it could not): check it, then press Start.", icon=":material/warning:")
    return True


def current_errors(keys: FormKeys) -> dict[str, list[str]]:
    """The refusals of the last Start, each with the value it refused: one whose field now holds
    another value (changed, or reset by leaving the page) is not shown any more."""
    stored: dict[str, tuple[list[str], Any]] = st.session_state.get(keys.errors, {})
    return {field: messages for field, (messages, value) in stored.items()
            if not field or keys.widget(field) not in st.session_state
            or st.session_state[keys.widget(field)] == value}


def field_errors(errors: dict[str, list[str]], field: str) -> None:
    for message in errors.get(field, []):
        st.error(style.plain(message), icon=":material/error:")


def widget(spec: form.FieldSpec, value: Any, key: str) -> Any:
    """Draw the widget ``spec`` describes under ``key``, starting at ``value`` unless it already
    holds one (the person's, or a loaded file's); returns what it holds."""
    held = key in st.session_state
    start: dict[str, Any] = {} if held else {"value": value}
    if spec.widget in ("int", "float"):
        low, high = form_values.widget_bounds(spec, st.session_state[key] if held else value)
        return st.number_input(spec.label, **start, min_value=low, max_value=high, step=spec.step,
                               format=spec.number_format, key=key, help=spec.help)
    if spec.widget == "bool":
        return st.checkbox(spec.label, **start, key=key, help=spec.help)
    if spec.widget == "choice":
        index: dict[str, Any] = {} if held else {"index": spec.options.index(value)}
        return st.selectbox(spec.label, spec.options, **index, key=key, help=spec.help)
    if spec.widget == "table":
        return st.text_area(spec.label, **start, placeholder=spec.placeholder, key=key, help=spec.help)
    return st.text_input(spec.label, **start, max_chars=spec.max_chars, placeholder=spec.placeholder, key=key,
                         help=spec.help)


def kind_and_executor(keys: FormKeys, every_field: Sequence[form.FieldSpec], initial: dict[str, Any],
                      errors: dict[str, list[str]]) -> tuple[str, str]:
    """The workload kind and the executor, chosen outside the form: a change redraws the page at
    once with that kind's fields and the [slurm] section (inside an st.form nothing reruns before
    Start)."""
    chosen = []
    for column, key in zip(st.columns(2), (form.KIND_KEY, form.EXECUTOR_KEY), strict=True):
        with column:
            chosen.append(widget(next(s for s in every_field if s.key == key), initial[key], keys.widget(key)))
            field_errors(errors, key)
    return chosen[0], chosen[1]


@dataclass(frozen=True)
class Opening:
    """What the top of a config form leaves for the rest of it.

    Attributes:
        base: The config the form was filled from (or the page's defaults).
        errors: The refusals of the last Start still shown, by field.
        initial: What each widget starts with, from ``base``.
        chosen: The workload kind and the executor, by key.
        sections: The run config's sections for them ([slurm] for a Slurm run only).
    """

    base: dict[str, Any]
    errors: dict[str, list[str]]
    initial: dict[str, Any]
    chosen: dict[str, Any]
    sections: list[form.SectionSpec]


def opening(keys: FormKeys, label: str, load: Callable[[str, str], bool], model: type[BaseModel],
            every_field: Sequence[form.FieldSpec], defaults: dict[str, Any]) -> Opening:
    """The top of a config form for the run config ``model`` (the page's: it reads the model anew
    each run) and its fields: the uploader and what the last file did, a note for each value no
    widget can show, and the kind and executor chosen outside the form."""
    uploader(keys, label, load)
    base: dict[str, Any] = st.session_state.get(keys.base, defaults)
    errors = current_errors(keys)
    initial, notes = form_values.widget_values(base, every_field)
    for note in notes:
        st.warning(style.plain(note), icon=":material/warning:")
    kind, executor = kind_and_executor(keys, every_field, initial, errors)
    sections = [s for s in form.form_sections(model, kind) if s.name != form.SLURM_SECTION or executor == "slurm"]
    return Opening(base, errors, initial, {form.KIND_KEY: kind, form.EXECUTOR_KEY: executor}, sections)


def draw_section(keys: FormKeys, section: form.SectionSpec, fields: Sequence[form.FieldSpec],
                 initial: dict[str, Any], errors: dict[str, list[str]]) -> dict[str, Any]:
    """One section's fields, a row of columns at a time (an error under one field moves only its
    row), problems across its fields (n_embd vs n_head) above them; returns their values by key."""
    if section.common and section.name:
        st.subheader(section.title, help=section.help)
    elif section.name:
        st.caption(section.help)
    if section.name:
        field_errors(errors, section.name)
    values = {}
    for row in range(0, len(fields), COLUMNS):
        for column, spec in zip(st.columns(COLUMNS), fields[row:row + COLUMNS], strict=False):
            with column:
                values[spec.key] = widget(spec, initial[spec.key], keys.widget(spec.key))
                field_errors(errors, spec.key)
    return values


def draw_sections(keys: FormKeys, sections: Sequence[form.SectionSpec], initial: dict[str, Any],
                  errors: dict[str, list[str]], skip: Sequence[str] = ()) -> dict[str, Any]:
    """Every section (a common one open, the others folded until one of their fields is refused),
    their fields but ``skip``; returns the widgets' values by config key."""
    values: dict[str, Any] = {}
    for section in sections:
        fields = [spec for spec in section.fields if spec.key not in skip]
        if not fields:
            continue
        refused = any(errors.get(key) for key in [section.name, *(spec.key for spec in fields)])
        with st.container() if section.common else st.expander(section.title, expanded=refused):
            values |= draw_section(keys, section, fields, initial, errors)
    return values


def refusals_and_warnings(keys: FormKeys, errors: dict[str, list[str]]) -> None:
    """Every refusal above Start, so none is missed in a folded section; and the warnings of the
    last Start, shown with its refusals: a person fixes everything in one go, and a warning seen
    beside the refusals is not asked about again once they are fixed."""
    if errors:
        count = sum(len(m) for m in errors.values())
        st.error(f"**Not started: {count} problem(s).**\n\n"
                 + "\n".join(f"- {style.plain(m)}" for messages in errors.values() for m in messages),
                 icon=":material/error:")
    warned = [text for text, value in st.session_state.get(keys.warned, [])
              if keys.widget(key := field_of(text)) not in st.session_state
              or st.session_state[keys.widget(key)] == value]
    if warned:
        st.warning(("**Also check** (the refusals above first):\n\n" if errors else
                    "**Check before starting** (press Start again to start anyway):\n\n")
                   + "\n".join(f"- {style.plain(w)}" for w in warned), icon=":material/warning:")


def refuse(keys: FormKeys, exc: ConfigError, shown: set[str], values: dict[str, Any]) -> None:
    """Keep a Start's refusals by the field they name (``""``: one no field shown names) with the
    values refused, and its warnings, then draw the page again with them."""
    grouped: dict[str, list[str]] = {}
    for problem in exc.problems:
        field = field_of(problem)
        grouped.setdefault(field if field in shown else "", []).append(problem)
    st.session_state[keys.errors] = {field: (messages, values.get(field)) for field, messages in grouped.items()}
    st.session_state[keys.warned] = [(w, values.get(field_of(w))) for w in exc.warnings]
    st.rerun()


def ask_once(keys: FormKeys, warnings: list[str], values: dict[str, Any]) -> None:
    """Valid but rarely meant (lr = 50): asked once (each warning names its field and value, so the
    same list is the same question; one already shown beside refusals is not asked again)."""
    st.session_state[keys.errors] = {}
    if warnings and [text for text, _ in st.session_state.get(keys.warned, [])] != warnings:
        st.session_state[keys.warned] = [(w, values.get(field_of(w))) for w in warnings]
        st.rerun()


def started(keys: FormKeys) -> None:
    """Forget what the last Start and file left, once one started."""
    st.session_state.pop(keys.warned, None)
    st.session_state.pop(keys.loaded, None)
