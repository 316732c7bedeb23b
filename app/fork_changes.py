"""What a fork changes: the settings that differ between the run it forks and the New run form's
values, and the same as the ``key=value`` overrides a fork request takes (values written as TOML,
read back by :func:`db.vocabulary.config.parse_override`). No Streamlit here."""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any

from app.form import KIND_KEY, form_fields
from db.vocabulary.config import RunConfig
from db.vocabulary.config.writing import toml_value


def _other_kinds_keys(changed: Mapping[str, Any]) -> set[str]:
    """The [workload] keys of the kinds ``changed`` is not: no settings of its run (the form
    gives them their defaults, a config stored from the flat model of before holds them)."""
    every = form_fields(RunConfig)
    kind_spec = next(spec for spec in every if spec.key == KIND_KEY)
    kind = (changed.get(kind_spec.section) or {}).get("kind", kind_spec.default)
    return {spec.key for spec in every if spec.section == kind_spec.section and not spec.applies_to(kind)}


def config_changes(source: Mapping[str, Any], changed: Mapping[str, Any],
                   prefix: str = "", skip: set[str] | None = None) -> list[tuple[str, Any, Any]]:
    """Every setting that differs between two config mappings, as (dotted key, source value,
    changed value), in the order of ``changed``. A table the form shows as one box
    (``launch.env``) is one setting; a key missing on one side reads as None there; another
    workload kind's key than ``changed``'s is none of its settings."""
    tables = {spec.key for spec in form_fields(RunConfig) if spec.widget == "table"}
    skip = _other_kinds_keys(changed) if skip is None else skip
    out: list[tuple[str, Any, Any]] = []
    for name in [*changed, *(k for k in source if k not in changed)]:
        key = f"{prefix}{name}"
        old, new = source.get(name), changed.get(name)
        if key in skip:
            continue
        if isinstance(old, Mapping) and isinstance(new, Mapping) and key not in tables:
            out += config_changes(old, new, f"{key}.", skip)
        elif old != new:
            out.append((key, old, new))
    return out


def overrides_for(source: Mapping[str, Any], changed: Mapping[str, Any]) -> list[str]:
    """The ``key=value`` overrides that turn ``source`` into ``changed`` (what a fork request
    takes), values written as TOML.

    Raises:
        ValueError: for a setting emptied (None), which an override cannot express.
    """
    return [f"{key}={toml_value(new, key)}" for key, _, new in config_changes(source, changed)]
