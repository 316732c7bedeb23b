"""Writing a config as TOML, the inverse of reading it (db/vocabulary/config/reading.py): a value as
a ``--set key=value`` override takes it (a fork's changes, app/fork_changes.py), and a whole config
as a file `runyard submit` reads back to the same config (a sweep's best trial, `runyard sweep
best`); and a dotted key's value in config data (the New run form, a sweep's space)."""

from __future__ import annotations

import json
import math
import re
from collections.abc import Mapping
from typing import Any

_BARE_KEY = re.compile(r"^[A-Za-z0-9_-]+$")


def lookup(data: Mapping[str, Any], key: str) -> tuple[bool, Any]:
    """Whether the config data ``data`` has ``key`` (``"train.lr"``), and what it holds there."""
    node: Any = data
    for part in key.split("."):
        if not isinstance(node, Mapping) or part not in node:
            return False, None
        node = node[part]
    return True, node


def toml_value(value: Any, key: str = "value") -> str:
    """``value`` written as a TOML value, as a ``--set key=value`` override reads it back
    (:func:`db.vocabulary.config.parse_override`).

    Raises:
        ValueError: for None (TOML has no null), naming ``key``.
    """
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, int):
        return str(value)
    if isinstance(value, float):
        if math.isnan(value):
            return "nan"
        return repr(value) if math.isfinite(value) else ("inf" if value > 0 else "-inf")
    if isinstance(value, str):
        return json.dumps(value, ensure_ascii=False)  # a JSON string is a TOML basic string
    if isinstance(value, (list, tuple)):
        return "[" + ", ".join(toml_value(item, key) for item in value) + "]"
    if isinstance(value, Mapping):
        pairs = (f"{json.dumps(str(k))} = {toml_value(v, f'{key}.{k}')}" for k, v in value.items())
        return "{ " + ", ".join(pairs) + " }"
    raise ValueError(f"{key}: {value!r} cannot be written as a TOML value; give it a value instead of leaving it empty")


def toml_key(key: str) -> str:
    """A TOML key: bare where it can be, quoted otherwise (``"train.lr"``)."""
    return key if _BARE_KEY.match(key) else json.dumps(key, ensure_ascii=False)


def toml_document(data: Mapping[str, Any], table: str = "") -> str:
    """A config's plain data (``RunConfig.as_dict()``) as a TOML file: the top-level keys, then a
    ``[table]`` for each section (and for a table inside one, ``[workload.env]``). A key that holds
    None is left out: TOML has no null, and the config reads an absent key as its default."""
    lines = [f"{toml_key(k)} = {toml_value(v, f'{table}{k}')}" for k, v in data.items()
             if v is not None and not isinstance(v, Mapping)]
    for k, v in data.items():
        if isinstance(v, Mapping):
            name = f"{table}{toml_key(k)}"
            body = toml_document(v, f"{name}.")
            lines += ["", f"[{name}]", *([body] if body else [])]
    return "\n".join(lines).strip("\n")
