"""The search space against its base config: which keys it may set and with which values, a grid's
points in their fixed order, and a trial's config (the base with the trial's values).

The ``[sweep]`` model checks each dimension on its own (db/vocabulary/config/sweep.py); here each
is judged against the base: the key must be a setting the base config has (for its workload kind),
and every value the dimension can give (its bounds, each choice) must be one that key takes, which
the config model itself says by validating the base with it. Every problem names the key.
"""

from __future__ import annotations

import json
import math
from collections.abc import Mapping
from typing import Any

from db.vocabulary.config import ConfigError, RunConfig, parse_config
from db.vocabulary.config.labels import NAME_MAX, TAGS_MAX
from db.vocabulary.config.sweep import Dimension, SweepConfig
from db.vocabulary.config.writing import lookup

# The keys a trial's length and its checkpoints come from: the rungs are computed from them once,
# so a sweep that stops trials early cannot vary them.
RUNG_KEYS = ("train.max_steps", "workload.max_steps", "checkpoint.every_steps")
# The most combinations a grid may have (each is a trial; max_trials takes the first ones).
MAX_GRID = 1_000_000


def space_label(key: str) -> str:
    """A key of the space as a problem names it: ``sweep.space."train.lr"``."""
    return f'sweep.space."{key}"'


def with_values(data: Mapping[str, Any], params: Mapping[str, Any]) -> dict[str, Any]:
    """A copy of the config data ``data`` with each key of ``params`` set to its value."""
    out: dict[str, Any] = json.loads(json.dumps(data))
    for key, value in params.items():
        *tables, name = key.split(".")
        node = out
        for part in tables:
            node = node.setdefault(part, {})
        node[name] = value
    return out


def probe_values(d: Dimension) -> list[Any]:
    """The values a dimension is judged by against its key: its bounds, or every choice."""
    values = d.values_of(d.kind) or []
    return list(values) if d.kind == "choice" else [values[0], values[-1]]


def key_problems(base: RunConfig, key: str, d: Dimension) -> list[str]:
    """What the base config says against ``key`` and the values of ``d``: a key it does not have,
    a table rather than a setting, a value the key refuses (its type, its bounds)."""
    data = base.as_dict()
    found, current = lookup(data, key)
    if not found:
        return [f"{space_label(key)}: {key} is not a key of the base config (workload.kind = "
                f"{base.workload.kind!r}; docs/CONFIG.md lists them)"]
    if isinstance(current, Mapping):
        return [f"{space_label(key)}: {key} is a table of settings; name one of its keys"]
    problems = []
    for value in probe_values(d):
        try:
            parse_config(with_values(data, {key: value}))
        except ConfigError as exc:
            mine = [p for p in exc.problems if p.startswith(key)] or exc.problems
            problems += [f"{space_label(key)} {d.kind} value {value!r}: {p}" for p in mine]
    return problems


def grid_values(d: Dimension) -> list[Any] | None:
    """A dimension's values in a grid, in order: its choices, its whole numbers, or ``points``
    values of its range (log-spaced for ``log_uniform``); None for a range without ``points``."""
    values = d.values_of(d.kind) or []
    if d.kind == "choice":
        return list(values)
    if d.kind == "int":
        return list(range(values[0], values[1] + 1))
    if d.points is None:
        return None
    low, high, n = float(values[0]), float(values[1]), d.points
    if d.kind == "log_uniform":
        step = (math.log(high) - math.log(low)) / (n - 1)
        return [low, *(math.exp(math.log(low) + i * step) for i in range(1, n - 1)), high]
    return [low, *(low + i * (high - low) / (n - 1) for i in range(1, n - 1)), high]


def grid_size(sweep: SweepConfig) -> int:
    """How many points a grid of the space has (0 when a range has no ``points``)."""
    size = 1
    for d in sweep.space.values():
        values = grid_values(d)
        size *= len(values) if values is not None else 0
    return size


def grid_point(sweep: SweepConfig, number: int) -> dict[str, Any] | None:
    """The grid's point ``number`` (0-based) in its fixed order: the keys as written, the first
    changing slowest; None past the last point."""
    axes = [(key, grid_values(d) or []) for key, d in sweep.space.items()]
    if number >= math.prod(len(values) for _, values in axes):
        return None
    point: dict[str, Any] = {}
    for key, values in reversed(axes):
        number, index = divmod(number, len(values))
        point[key] = values[index]
    return {key: point[key] for key, _ in axes}


def space_problems(base: RunConfig, sweep: SweepConfig) -> list[str]:
    """Every problem of the space against the base config (each naming the key), a grid that
    cannot be made, and a base whose name or tags leave no room for a trial's."""
    problems = [p for key, d in sweep.space.items() for p in key_problems(base, key, d)]
    if sweep.early_stop is not None:
        problems += [f"{space_label(key)}: a sweep with [sweep.early_stop] cannot vary {key}: its rungs come from it"
                     for key in sweep.space if key in RUNG_KEYS]
    if sweep.searcher == "grid":
        ranges = [key for key, d in sweep.space.items() if grid_values(d) is None]
        problems += [f"{space_label(key)}: searcher = \"grid\" needs `points` for a {sweep.space[key].kind} range "
                     "(how many values of it the grid takes)" for key in ranges]
        if not ranges and grid_size(sweep) > MAX_GRID:
            problems.append(f"sweep.space: a grid of {grid_size(sweep):,} points is more than {MAX_GRID:,}; take fewer "
                            "values, or searcher = \"random\"")
    if len(base.tags) >= TAGS_MAX:
        problems.append(f"tags: {len(base.tags)} tags leave no room for the tag each trial gets (sweep:<id>); at most "
                        f"{TAGS_MAX - 1} in a sweep file")
    return problems


def trial_name(sweep_name: str, number: int) -> str:
    """A trial's run name: the sweep's name and the trial's number, ``lr-search-t3``."""
    suffix = f"-t{number}"
    return f"{sweep_name[:NAME_MAX - len(suffix)]}{suffix}"


def sweep_tag(sweep_id: int) -> str:
    """The tag every trial of sweep ``sweep_id`` carries (`runyard ls --tag sweep:3`)."""
    return f"sweep:{sweep_id}"


def trial_data(base: Mapping[str, Any], params: Mapping[str, Any], sweep_id: int, sweep_name: str,
               number: int) -> dict[str, Any]:
    """Trial ``number``'s config as data: the base (without ``[sweep]``) with the trial's values,
    its name and its sweep's tag."""
    data = with_values(base, params)
    data["name"] = trial_name(sweep_name, number)
    data["tags"] = [*data.get("tags", []), sweep_tag(sweep_id)]
    return data
