"""New sweep: a sweep file as a form (or a TOML upload or paste), checked before anything starts.

The base of every trial is drawn as New run draws a run config (app/form.py, app/config_form.py);
the ``[sweep]`` section's fields come from its model the same way (a field added to SweepConfig
appears here with no edit), its optional sections (``[sweep.early_stop]``) behind a switch; the
space, keyed by the base config's keys, is TOML in a box of its own, checked at every change with
each problem naming its key. Before Start, the arithmetic of `runyard sweep preview`
(orchestrator/sweeps/preview.py) for the values as last applied; Start starts the sweep as
`runyard sweep start` does (orchestrator/sweeps/submission.py) and opens its page
(``/sweep?id=N``). Nothing starts while anything is refused.

A pasted or uploaded sweep file fills the whole form, the space box too; a paste the form does not
hold yet fills it instead of starting, and the page says so (app/config_form.py).
"""

from __future__ import annotations

import typing
from typing import Any

import streamlit as st

from app import config_form, data, form, form_values, style
from app.config_form import FormKeys
from db.vocabulary.config import ConfigError, RunConfig, deep_merge, parse_toml, plausibility_warnings
from db.vocabulary.config.sweep import KINDS
from db.vocabulary.config.writing import toml_key, toml_value
from orchestrator.sweeps.preview import preview_in, preview_lines
from orchestrator.sweeps.submission import start_sweep, validate_sweep

style.apply()

st.title("New sweep")

KEYS = FormKeys("new_sweep", widgets="new_sweep:")  # its own widget keys: New run's values stay New run's
SPACE = "sweep.space"  # the space box's field: the problems of the space's keys are shown under it
SPACE_KEY = KEYS.widget(SPACE)
SWEEP_MODEL = next(m for m in typing.get_args(RunConfig.model_fields["sweep"].annotation) if m is not type(None))
sweep_sections = form.form_sections(SWEEP_MODEL, prefix="sweep", title="Sweep")
sweep_fields = [spec for section in sweep_sections for spec in section.fields]
every_field = form.form_fields(RunConfig) + sweep_fields
# A first sweep a person can watch: examples/sweep.toml's base (mlp-digits, evaluated and saved
# every 10 steps), three learning rates to try, and a search of the learning rate.
DEFAULTS: dict[str, Any] = deep_merge(RunConfig().as_dict(), {
    "name": "sweep", "train": {"max_steps": 270, "eval_every": 10}, "checkpoint": {"every_steps": 10},
    "sweep": {"max_trials": 3}})
DEFAULT_SPACE = '"train.lr" = {log_uniform = [1e-4, 1e-1]}\n'
SPACE_HELP = ("One line a key of the base config, quoted, and its values: "
              '`"train.lr" = {log_uniform = [1e-4, 1e-1]}`, `{uniform = [0.0, 0.1]}`, `{int = [16, 128]}` or '
              '`{choice = [32, 64, 128]}`; a grid needs `points = N` beside a range (docs/SWEEPS.md, "Writing a '
              'space").')


def space_text(space: Any) -> str:
    """A space (a file's ``[sweep.space]``) as the box's lines."""
    if not isinstance(space, dict):
        return ""
    return "".join(f"{toml_key(str(key))} = {dimension_text(dim, f'{SPACE}.{key}')}\n" for key, dim in space.items())


def dimension_text(dim: Any, key: str) -> str:
    """One dimension as the box writes it: ``{log_uniform = [0.0001, 0.1]}``."""
    if not isinstance(dim, dict):
        return toml_value(dim, key)
    return "{" + ", ".join(f"{toml_key(str(k))} = {toml_value(v, f'{key}.{k}')}" for k, v in dim.items()) + "}"


def from_file(raw: dict[str, Any]) -> list[str]:
    """What a sweep file fills beyond the fields: the space box, and each optional section's switch
    (on when the file has it); returns the file's problems that no field shows."""
    section = raw.get("sweep")
    if not isinstance(section, dict):
        return ["sweep: the file has no [sweep] section: the form holds its base config, the sweep's settings at "
                "their defaults and the space as the box had it"]
    try:
        st.session_state[SPACE_KEY] = space_text(section.get("space"))
    except ValueError as exc:
        return [f"{SPACE}: {exc}"]
    for optional in (s for s in sweep_sections if s.optional):
        st.session_state[KEYS.widget(optional.name)] = isinstance(section.get(optional.name.split(".")[-1]), dict)
    return []


def load_toml(text: str, name: str) -> bool:
    """Fill the form from a sweep file (app.config_form.load_toml): missing keys take the config's
    defaults, as with `runyard sweep start`."""
    return config_form.load_toml(KEYS, every_field, RunConfig().as_dict(), text, name, more=from_file)


def add_to_space() -> None:
    """Append the chosen key with a range around its value (a choice's options for a choice) to the box."""
    key, kind = st.session_state.get("new_sweep_add_key"), st.session_state.get("new_sweep_add_kind")
    spec = next((s for s in every_field if s.key == key), None)
    if spec is None or kind is None:
        return
    value = st.session_state.get(KEYS.widget(spec.key), spec.default)
    values: list[Any]
    if kind == "choice":
        values = list(spec.options) if spec.options else [True, False] if spec.widget == "bool" else [value]
    elif spec.widget == "int":
        values = [max(1, int(value) // 2), max(2, int(value) * 2)]
    else:
        number = float(value) if isinstance(value, (int, float)) and value > 0 else 1.0
        values = [number / 10, number * 10]
    line = f"{toml_key(spec.key)} = {dimension_text({kind: values}, spec.key)}\n"
    text = st.session_state.get(SPACE_KEY, "")
    st.session_state[SPACE_KEY] = text + ("" if not text or text.endswith("\n") else "\n") + line


def sweep_values(values: dict[str, Any], switched_on: dict[str, bool]) -> dict[str, Any]:
    """The ``[sweep]`` section as the widgets hold it (an optional section switched off is None)."""
    out: dict[str, Any] = {}
    for spec in sweep_fields:
        if spec.key not in values or not switched_on.get(spec.section, True):
            continue
        node = out
        for part in spec.path[1:-1]:
            node = node.setdefault(part, {})
        node[spec.path[-1]] = form_values.config_value(spec, values[spec.key])
    return out | {name.split(".")[-1]: None for name, on in switched_on.items() if not on}


def sweep_file(base: dict[str, Any], values: dict[str, Any], switched_on: dict[str, bool],
               text: str) -> tuple[dict[str, Any], list[str]]:
    """The sweep file the form holds: the base with the fields' values, ``[sweep]`` with the
    section's and the space box's (keys of a loaded file the form does not show kept); and the
    box's problem when it is no TOML."""
    config = form_values.form_config(base, {k: v for k, v in values.items() if not k.startswith("sweep.")})
    section = deep_merge(dict(base.get("sweep") or {}), sweep_values(values, switched_on))
    try:
        section["space"], problems = parse_toml(text), []
    except ConfigError as exc:
        section["space"], problems = {}, [f"{SPACE}: {p}" for p in exc.problems]
    return config | {"sweep": section}, problems


def checked(file: dict[str, Any], box_problems: list[str]) -> tuple[RunConfig | None, ConfigError | None]:
    """The sweep file checked as `runyard sweep start` checks it, its files held to the UI's roots."""
    try:
        config = validate_sweep(file, data.inventory(), roots=data.launch_roots(), channels=data.alert_channels())
    except ConfigError as exc:
        return None, ConfigError(box_problems + [p for p in exc.problems if not (box_problems and
                                                                              p.startswith(f"{SPACE}:"))],
                                 exc.warnings)
    return (None, ConfigError(box_problems)) if box_problems else (config, None)


def open_sweep(sweep_id: int) -> None:
    """Open the new sweep's page."""
    st.switch_page("views/sweep.py", query_params={"id": str(sweep_id)})


top = config_form.opening(KEYS, "Start from a sweep file (optional)", load_toml, RunConfig, every_field,
                          DEFAULTS)
base, errors, initial, sections = top.base, top.errors, top.initial, top.sections

# The space is outside the form: each change is checked at once (inside an st.form nothing reruns).
st.subheader("Search space", help=SPACE_HELP)
if SPACE_KEY not in st.session_state:
    st.session_state[SPACE_KEY] = DEFAULT_SPACE
text = st.text_area("The keys to search", key=SPACE_KEY, height=120, help=SPACE_HELP,
                    placeholder='"train.lr" = {log_uniform = [1e-4, 1e-1]}')
space_problems = st.container()
with st.popover("Add a key…", icon=":material/add:"):
    searchable = [s.key for s in form.form_fields(RunConfig, top.chosen[form.KIND_KEY])
                  if s.widget in ("int", "float", "choice", "bool")]
    st.selectbox("Key of the base config", searchable, key="new_sweep_add_key")
    st.selectbox("Values", KINDS, key="new_sweep_add_kind",
                 help="log_uniform and uniform: a range of numbers; int: whole numbers; choice: a list")
    st.button("Add to the space", on_click=add_to_space, icon=":material/add:")

with st.form("new_sweep"):
    config_form.paste_box(KEYS, 'name = "lr"\n[sweep]\nmetric = "eval_loss"\n[sweep.space]\n'
                                '"train.lr" = {log_uniform = [1e-4, 1e-1]}', load_toml)
    values: dict[str, Any] = dict(top.chosen)
    values |= config_form.draw_sections(KEYS, sections, initial, errors, skip=(form.KIND_KEY, form.EXECUTOR_KEY))
    switched_on: dict[str, bool] = {}
    for section in sweep_sections:
        with st.container() if section.common else st.expander(section.title, expanded=section.optional):
            if section.optional:  # a section that may be left out: on when the base holds it
                if KEYS.widget(section.name) not in st.session_state:
                    st.session_state[KEYS.widget(section.name)] = isinstance(
                        (base.get("sweep") or {}).get(section.name.split(".")[-1]), dict)
                switched_on[section.name] = st.toggle(section.title, key=KEYS.widget(section.name), help=section.help)
            values |= config_form.draw_section(KEYS, section, section.fields, initial, errors)
    config_form.refusals_and_warnings(KEYS, errors)
    file, box_problems = sweep_file(base, values, switched_on, text)
    config, refused = checked(file, box_problems)
    # The arithmetic before Start, for the values as last applied ("Update preview" applies them).
    if config is not None:
        st.info("**Preview** (as `runyard sweep preview` counts it):\n\n" + "\n".join(
            f"- {style.plain(line.strip())}" for line in preview_lines(preview_in(data.sessions(), config,
                                                                                  data.inventory()))),
                icon=":material/calculate:")
    else:
        st.info("**No preview**: as set, Start would refuse it (the problems are listed at Start).",
                icon=":material/block:")
    with st.container(horizontal=True):
        started = st.form_submit_button("Start", type="primary", icon=":material/play_arrow:",
                                        on_click=config_form.on_start, args=(KEYS, load_toml),
                                        disabled=data.read_only_reason() is not None, help=data.read_only_reason())
        st.form_submit_button("Update preview", icon=":material/calculate:", on_click=config_form.on_start,
                              args=(KEYS, load_toml), help="Apply the values above to the preview without starting")

with space_problems:  # under the box, as typed
    for problem in (refused.problems if refused is not None else []):
        if problem.startswith(SPACE):
            st.error(style.plain(problem), icon=":material/error:")

if not config_form.start_was_held(KEYS, started) and started:
    if refused is not None:
        config_form.refuse(KEYS, refused, {spec.key for s in sections for spec in s.fields} | set(values)
                           | {s.name for s in [*sections, *sweep_sections] if s.name}, values)
    assert config is not None
    config_form.ask_once(KEYS, plausibility_warnings(config.base()), values)
    config_form.started(KEYS)
    open_sweep(start_sweep(data.sessions(), config))
