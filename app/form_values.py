"""The New run form's widget values, to and from a config: what each widget starts with
(:func:`widget_values`, from the defaults or an uploaded TOML), the bounds it may show
(:func:`widget_bounds`), and the widgets' values back as a plain nested config
(:func:`values_to_config`), converting text but never coercing numbers, so that the usual
validation judges exactly what was entered. The fields themselves are app/form.py's."""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from typing import Any

from pydantic import BaseModel

from app.form import JS_MAX_SAFE_INTEGER, KIND_KEY, FieldSpec, form_fields
from db.vocabulary.config import RunConfig, deep_merge
from db.vocabulary.config.writing import lookup


def _to_widget(spec: FieldSpec, value: Any) -> tuple[bool, Any]:
    """A config value as the widget holds it; (False, None) when the widget cannot hold it."""
    if spec.widget == "int":
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        ok = isinstance(value, int) and not isinstance(value, bool) and abs(value) <= JS_MAX_SAFE_INTEGER
        return ok, value if ok else None
    if spec.widget == "float":
        ok = isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
        return ok, float(value) if ok else None
    if spec.widget == "bool":
        return isinstance(value, bool), value
    if spec.widget == "choice":
        return value in spec.options, value
    if spec.widget == "text":
        if value is None and spec.optional:
            return True, ""
        return isinstance(value, str), value
    if spec.widget == "table":
        ok = isinstance(value, Mapping) and all(isinstance(k, str) and isinstance(v, str) for k, v in value.items())
        return ok, "\n".join(f"{k} = {v}" for k, v in value.items()) if ok else None
    if isinstance(value, (list, tuple)) and all(isinstance(item, str) for item in value):
        return True, shlex.join(value) if spec.list_syntax == "shell" else ", ".join(value)
    return False, None


def widget_values(data: Mapping[str, Any], fields: Sequence[FieldSpec]) -> tuple[dict[str, Any], list[str]]:
    """What each widget starts with, read from a config mapping (the defaults, or an uploaded TOML).

    A missing key takes the field's default. A value no widget can hold (text for a number, an
    unknown choice) also takes the default, and a note says so: the page shows it rather than
    fail to draw.

    Args:
        data: A config mapping, nested by section.
        fields: The fields to read.

    Returns:
        The widget values by key, and one note per value replaced by its default.
    """
    values: dict[str, Any] = {}
    notes: list[str] = []
    for spec in fields:
        found, raw = lookup(data, spec.key)
        ok, value = _to_widget(spec, raw) if found else (False, None)
        if not ok:
            if found:
                notes.append(f"{spec.key} = {raw!r} cannot be shown in the form; it shows the default instead")
            value = _to_widget(spec, spec.default)[1]
        values[spec.key] = value
    return values, notes


def widget_bounds(spec: FieldSpec, value: Any) -> tuple[float | None, float | None]:
    """The bounds to give a number widget that shows ``value``: a bound the value already lies
    outside (from an uploaded config) is dropped, so that the page draws and the validation
    names the value on Start."""
    low = spec.min_value if spec.min_value is None or value >= spec.min_value else None
    high = spec.max_value if spec.max_value is None or value <= spec.max_value else None
    return low, high


def config_value(spec: FieldSpec, value: Any) -> Any:
    """A widget's value as config data: text is stripped, an empty optional text is None and a
    list box is split. Numbers, booleans and choices pass through unchanged: the validation
    judges them (a float for an integer field is refused there, naming the field)."""
    if spec.widget == "text" and isinstance(value, str):
        text = value.strip()
        return None if spec.optional and not text else text
    if spec.widget == "table" and isinstance(value, str):
        return table_value(value)
    if spec.widget == "list" and isinstance(value, str):
        if spec.list_syntax == "comma":
            return [item.strip() for item in value.split(",") if item.strip()]
        try:
            return shlex.split(value)
        except ValueError:  # an unclosed quote: the validation refuses the text, naming the field
            return value
    return value


def table_value(text: str) -> dict[str, str] | str:
    """A table box's text (``NAME = value`` per line, blank lines ignored) as a mapping; the text
    itself when a line has no ``=``, for the validation to refuse naming the field."""
    table: dict[str, str] = {}
    for line in text.splitlines():
        if not line.strip():
            continue
        name, sep, value = line.partition("=")
        if not sep:
            return text
        table[name.strip()] = value.strip()
    return table


def values_to_config(values: Mapping[str, Any], model: type[BaseModel] = RunConfig) -> dict[str, Any]:
    """The config mapping for the widget values, to validate as any other config.

    Args:
        values: Widget values by field key (``{"train.lr": 0.001, ...}``); ``workload.kind``
            chooses the kind (the model's default kind when absent).
        model: The run config model the widgets were built from.

    Returns:
        A plain nested dict. A field that does not apply to the chosen kind gets its default,
        so that a value the person cannot see (left from another kind or an uploaded file) does
        not refuse the run (another kind's [workload] key at its default is dropped when the
        config is read); a field missing from ``values`` is left out.
    """
    every = form_fields(model)
    kind_spec = next(spec for spec in every if spec.key == KIND_KEY)
    kind = values.get(KIND_KEY, kind_spec.default)
    out: dict[str, Any] = {}
    for spec in every:
        if not spec.applies_to(kind):
            value = spec.default
        elif spec.key in values:
            value = config_value(spec, values[spec.key])
        else:
            continue
        node = out
        for part in spec.path[:-1]:
            node = node.setdefault(part, {})
        node[spec.path[-1]] = value
    return out


def form_config(base: Mapping[str, Any], values: Mapping[str, Any], model: type[BaseModel] = RunConfig
                ) -> dict[str, Any]:
    """The config Start sends: ``base`` (a loaded file's keys the form does not show are kept) with
    the widgets' values over it, a table the form shows taken as its box reads (a name removed in
    the box is removed)."""
    from_form = values_to_config(values, model)
    config = deep_merge(dict(base), from_form)
    for spec in form_fields(model):
        if spec.widget == "table" and spec.key in values:
            section, key = spec.path
            config[section][key] = from_form[section][key]
    return config
