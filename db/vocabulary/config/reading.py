"""Reading a config: TOML, --set overrides, JSON, validation with every problem named."""

from __future__ import annotations

import copy
import datetime
import functools
import json
import os
import sys
import typing
from pathlib import Path
from typing import Any

from pydantic import BaseModel, ValidationError
from pydantic_core import ErrorDetails

from db.vocabulary.config.base import LENIENT, MAX_CONFIG_BYTES, PROBLEM_SEPARATOR, ConfigError
from db.vocabulary.config.run import RunConfig, compatibility_problems, kind_problems
from db.vocabulary.config.workload import (
    BUILT_IN_KINDS,
    STORED,
    WORKLOAD_KINDS,
    kinds_with_field,
    workload_class,
    workload_problems,
)

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


def _models(annotation: Any) -> list[type[BaseModel]]:
    """The models a field holds: its own type, or each member of a union (the [workload] kinds)."""
    return [t for t in (annotation, *typing.get_args(annotation)) if isinstance(t, type) and issubclass(t, BaseModel)]


def _pattern_help(loc: tuple[Any, ...]) -> str | None:
    """The words a field gives for its pattern (``json_schema_extra={"pattern_help": ...}``)."""
    models: list[type[BaseModel]] = [RunConfig]
    for part in loc:
        infos = [info for model in models if isinstance(part, str) and (info := model.model_fields.get(part))]
        if not infos:
            return None
        if part == loc[-1]:
            extra = infos[0].json_schema_extra
            hint = extra.get("pattern_help") if isinstance(extra, dict) else None
            return str(hint) if hint else None
        models = [model for info in infos for model in _models(info.annotation)]
    return None


def _plain_loc(err: ErrorDetails) -> tuple[Any, ...]:
    """Where an error is, as a dotted TOML key would say it: without the kind pydantic puts after
    ``workload`` (``workload.gpt-char.n_head`` is ``workload.n_head``), and at ``workload.kind``
    when the kind itself is unknown."""
    loc = tuple(err["loc"])
    if loc[:1] == ("workload",):
        if err["type"] in ("union_tag_invalid", "union_tag_not_found"):
            return ("workload", "kind")
        if len(loc) > 1 and loc[1] in WORKLOAD_KINDS:
            return ("workload", *loc[2:])
    return loc


def _location(loc: tuple[Any, ...]) -> str:
    """A dotted TOML key; a table's own key that holds a dot quoted, as TOML writes it
    (``sweep.space."train.lr"``)."""
    return ".".join(f'"{part}"' if "." in str(part) else str(part) for part in loc) or "(top level)"


# Strict types refuse what lax parsing would have guessed; say how to write it instead.
_STRICT_HINTS = {
    "int_type": " (a whole number, written without a decimal point or exponent: 1000, not 1e3 or 1000.0)",
    "bool_type": " (true or false, without quotes)",
    "float_type": " (a number, without quotes)",
}


# A value is shown in a problem up to this many characters (a list of 10,000 tags is not).
SHOWN_MAX = 200


def _shown(value: Any) -> str:
    """``repr(value)``, cut to :data:`SHOWN_MAX` characters with the number of items said."""
    text = repr(value)
    if len(text) <= SHOWN_MAX:
        return text
    items = f", {len(value)} items" if isinstance(value, (list, tuple, dict)) else ""
    return f"{text[:SHOWN_MAX]}... ({len(text)} characters{items})"


def _describe(err: ErrorDetails) -> list[str]:
    loc = _plain_loc(err)
    field = _location(loc)
    if err["type"] == "value_error" and isinstance(err["input"], dict):  # checks across fields, one per line
        messages = err["msg"].removeprefix("Value error, ").split(PROBLEM_SEPARATOR)
        return [f"{field}: {message}" if loc else message for message in messages]
    if err["type"] == "value_error" and isinstance(err["input"], (list, tuple)):  # each item's problem, one per line
        messages = err["msg"].removeprefix("Value error, ").split(PROBLEM_SEPARATOR)
        return [f"{field} = {_shown(err['input'])}: {message}" for message in messages]
    if err["type"] in ("union_tag_invalid", "union_tag_not_found") and loc == ("workload", "kind"):
        kind = err["input"].get("kind") if isinstance(err["input"], dict) else None
        kinds = ", ".join(repr(k) for k in WORKLOAD_KINDS[:-1]) + f" or {WORKLOAD_KINDS[-1]!r}"
        return [f"workload.kind = {kind!r}: Input should be {kinds}"]
    if err["type"] == "extra_forbidden" and len(err["loc"]) == 3 and err["loc"][0] == "workload" and (
            owners := kinds_with_field(str(loc[-1]))):
        return [_other_kinds_field(str(loc[-1]), err["input"], str(err["loc"][1]), owners)]
    if err["type"] == "extra_forbidden":
        return [f"{field}: unknown key (value {err['input']!r}); check the spelling against docs/CONFIG.md"]
    if err["type"] == "string_pattern_mismatch" and (hint := _pattern_help(loc)):
        return [f"{field} = {_shown(err['input'])}: use {hint}"]
    message = err["msg"].removeprefix("Value error, ")
    return [f"{field} = {_shown(err['input'])}: {message}{_STRICT_HINTS.get(err['type'], '')}"]


def _other_kinds_field(name: str, value: Any, kind: str, owners: list[str]) -> str:
    """The problem with ``workload.<name>``, a field of the kinds ``owners``, set for ``kind``."""
    if kind == "script" and not set(owners) - set(BUILT_IN_KINDS):  # the wording of kind_problems
        model = workload_class(owners[0])
        title = model.model_fields[name].title if model is not None else None
        where = "the built-in workloads" if sorted(owners) == sorted(BUILT_IN_KINDS) else " and ".join(owners)
        return (f"workload.{name} = {value!r} applies to {where} only; a script sets its own "
                f"{(title or name.replace('_', ' ')).lower()}")
    where = " or ".join(f"kind = {owner!r}" for owner in owners)
    return f"workload.{name} is only for {where} (kind is {kind!r}); it is set to {value!r}"


def _problems(exc: ValidationError) -> list[str]:
    return [problem for err in exc.errors() for problem in _describe(err)]


def parse_config(data: dict[str, Any]) -> RunConfig:
    """Validate a config mapping.

    Raises:
        ConfigError: listing every problem, each with the field and the value, including the
            settings that do not apply to the run's workload kind (:func:`kind_problems`).
    """
    check_plain(data)
    try:
        config = RunConfig.model_validate(data)
    except ValidationError as exc:
        raise ConfigError(_problems(exc) + _beyond_the_first_failure(data, _problems(exc))) from None
    problems = kind_problems(config)
    if problems:
        raise ConfigError(problems)
    return config


def _beyond_the_first_failure(data: dict[str, Any], found: list[str]) -> list[str]:
    """The checks across fields that pydantic did not reach (a section that failed hides the
    checks of the config around it), judged on :func:`lenient_config`; a problem that names a key
    replaced by its default is left out (it would judge the default, not the person's value)."""
    judged = lenient_config(data)
    if judged is None:
        return []
    config, dropped = judged
    candidates = [f"workload: {p}" for p in workload_problems(config.workload)]
    candidates += compatibility_problems(config) + kind_problems(config)
    return [p for p in candidates if p not in found and not any(key in p for key in dropped)]


def _drop(data: dict[str, Any], loc: tuple[Any, ...]) -> str | None:
    """Remove the key ``loc`` names from ``data`` (in the deepest table on its path); the dotted
    key removed, or None."""
    node: Any = data
    for i, part in enumerate(loc):
        if not isinstance(node, dict) or part not in node:
            return None
        if i == len(loc) - 1 or not isinstance(node[part], dict):
            del node[part]
            return _location(loc[:i + 1])
        node = node[part]
    return None


def lenient_config(data: dict[str, Any]) -> tuple[RunConfig, set[str]] | None:
    """``data`` as a config as far as it can be judged when :func:`parse_config` refused it: the
    checks across fields skipped, and every key that is wrong on its own (or unknown) replaced by
    its default. The caller judges what this config still says (its paths, the machine's limits,
    the plausibility warnings) so that a submit gets every problem in one answer rather than the
    schema's first and the rest on the next try.

    Returns:
        The config and the dotted keys that were replaced; None when even that does not validate.
    """
    current = copy.deepcopy(data)  # the caller's data stays as it is
    dropped: set[str] = set()
    for _ in range(4):  # a key dropped can only uncover errors in a key above it
        try:
            return RunConfig.model_validate(current, context={LENIENT: True}), dropped
        except ValidationError as exc:
            locs = [_plain_loc(err) for err in exc.errors()]
        removed = {key for loc in locs if (key := _drop(current, loc)) is not None}
        if not removed:
            return None
        dropped |= removed
    return None


MAX_CONFIG_DEPTH = 32
"""Deepest nesting of tables and arrays a config may have; a real one is three or four deep."""


MAX_INT_DIGITS = 40
"""Most digits an integer in a config may have; any real setting fits in 20."""


def _shorten(text: str, limit: int = 40) -> str:
    """``text`` cut to ``limit`` characters, saying how long it was."""
    return text if len(text) <= limit else f"{text[:limit]}... ({len(text)} characters)"


def check_plain(data: Any, where: str = "") -> None:
    """Refuse what parsed TOML may hold but a run config cannot store: nesting deeper than
    :data:`MAX_CONFIG_DEPTH`, integers longer than :data:`MAX_INT_DIGITS` digits and TOML
    dates/times (a config is stored as JSON). Walks without recursion, so depth itself is safe.

    Raises:
        ConfigError: naming the key and the (shortened) value.
    """
    stack: list[tuple[str, Any, int]] = [(where, data, 0)]
    while stack:
        key, value, depth = stack.pop()
        name = key or "(top level)"
        if depth > MAX_CONFIG_DEPTH:
            raise ConfigError([f"{name}: nested more than {MAX_CONFIG_DEPTH} deep; "
                               "a run config is a few levels of tables"])
        if isinstance(value, dict):
            stack.extend((f"{key}.{k}" if key else str(k), v, depth + 1) for k, v in value.items())
        elif isinstance(value, list):
            stack.extend((f"{key}[{i}]", v, depth + 1) for i, v in enumerate(value))
        elif isinstance(value, (datetime.datetime, datetime.date, datetime.time)):
            raise ConfigError([f"{name} = {_shorten(value.isoformat())}: a TOML date/time is not a "
                               "setting runyard knows; quote it to make it a string"])
        elif isinstance(value, int) and not isinstance(value, bool) and abs(value) >= 10**MAX_INT_DIGITS:
            raise ConfigError([f"{name}: an integer of more than {MAX_INT_DIGITS} digits; "
                               "use a number the setting can take"])


def _deep_key(text: str) -> str:
    """The key of the first ``key = value`` line whose brackets nest past :data:`MAX_CONFIG_DEPTH`,
    or "" (to name the key when tomllib itself ran out of stack)."""
    for line in text.splitlines():
        key, eq, value = line.partition("=")
        if eq and value.count("[") + value.count("{") > MAX_CONFIG_DEPTH:
            return key.strip()
    return ""


def _loads(text: str, what: str) -> dict[str, Any]:
    """``tomllib.loads`` with the failures that are not TOMLDecodeError turned into ConfigError."""
    try:
        data: dict[str, Any] = tomllib.loads(text)  # tomli (under 3.10) is checked as untyped
        return data
    except RecursionError:
        raise ConfigError([f"{_deep_key(text) or what}: nested more than {MAX_CONFIG_DEPTH} deep; "
                           "a run config is a few levels of tables"]) from None
    except ValueError as exc:  # TOMLDecodeError, or int() past sys.get_int_max_str_digits()
        if isinstance(exc, tomllib.TOMLDecodeError):
            raise
        raise ConfigError([f"{what}: an integer of more than {MAX_INT_DIGITS} digits; "
                           "use a number the setting can take"]) from None


def parse_toml(text: str) -> dict[str, Any]:
    """Parse TOML text into a mapping, turning syntax errors, too-deep nesting, overlong
    integers and dates/times into a ConfigError."""
    try:
        data = _loads(text, "config")
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError([f"not valid TOML: {exc}"]) from None
    check_plain(data)
    return data


def key_parts(key: str) -> list[str] | None:
    """A dotted key's parts, one in double quotes kept whole as TOML keeps it (``sweep.space."train.lr"``:
    a key of the space); None for an empty part or a quote left open."""
    parts: list[str] = []
    current, quoted, opened = "", False, False
    for char in key:
        if char == '"':
            quoted, opened = not quoted, True
        elif char == "." and not quoted:
            parts.append(current if opened else current.strip())
            current, opened = "", False
        else:
            current += char
    parts.append(current if opened else current.strip())
    return None if quoted or not all(parts) else parts


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse one ``--set key.path=value`` override; the value is read as a TOML value, or as a
    plain string when it is not one. A part of the key in double quotes is one key
    (``sweep.space."train.lr"={uniform = [0.1, 1]}``)."""
    if "=" not in item:
        raise ConfigError([f"--set {_shorten(item)!r}: expected key=value, for example train.lr=0.0005"])
    key, raw = item.split("=", 1)
    key = key.strip()
    path = key_parts(key)
    if not key or path is None:
        raise ConfigError([f"--set {_shorten(item)!r}: an empty key, or a quote left open"])
    try:
        value = _loads(f"v = {raw}", f"--set {key}={_shorten(raw)}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    check_plain(value, f"--set {key}")
    return path, value


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in, table by table (neither is modified)."""
    out: dict[str, Any] = json.loads(json.dumps(base))
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with ``--set`` overrides applied."""
    out: dict[str, Any] = json.loads(json.dumps(data))
    for item in overrides:
        path, value = parse_override(item)
        node = out
        for part in path[:-1]:
            child = node.setdefault(part, {})
            if not isinstance(child, dict):
                raise ConfigError([f"--set {item!r}: {part} is not a table"])
            node = child
        node[path[-1]] = value
    return out


def read_config_text(path: str | Path) -> str:
    """The text of a config file: a regular file of at most 1 MiB of UTF-8.

    Raises:
        ConfigError: naming the file and what is wrong with it.
    """
    p = Path(path)
    try:
        if not p.is_file():  # a directory, /dev/zero or a FIFO would be read forever or not at all
            what = "a directory" if p.is_dir() else "not a regular file" if p.exists() else "no such file"
            raise ConfigError([f"cannot read {p}: {what}"])
        with open(p, "rb") as f:
            data = f.read(MAX_CONFIG_BYTES + 1)
    except OSError as exc:
        raise ConfigError([f"cannot read {p}: {exc.strerror}"]) from None
    if len(data) > MAX_CONFIG_BYTES:
        raise ConfigError([f"{p}: larger than {MAX_CONFIG_BYTES // 1024} KiB; a run config is a few lines of TOML"])
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ConfigError([f"{p}: not UTF-8 text (byte 0x{data[exc.start]:02x} at offset {exc.start}); "
                           "save the file as UTF-8"]) from None


def load_config(path: str | Path, overrides: list[str] | None = None) -> RunConfig:
    """Read, override and validate a TOML run config file."""
    return parse_config(apply_overrides(parse_toml(read_config_text(path)), overrides or []))


@functools.lru_cache(maxsize=1024)
def config_from_json(text: str) -> RunConfig:
    """Load a config stored by :meth:`RunConfig.to_json`.

    Parsed once per distinct text (74 us a parse; the scheduler reads every active run's config
    several times a tick): the models are frozen, so the one instance is shared. Its few dict
    fields (``workload.env``, ``workload.stdout_metrics``) must not be changed in place."""
    return RunConfig.model_validate_json(text, context={STORED: True})


def write_config_file(path: Path, config: RunConfig) -> None:
    """Write ``config`` as indented JSON to ``path``, whole or not at all (a file beside it,
    renamed over it): what :func:`config_from_json` reads back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(config.as_dict(), indent=2))
    os.replace(tmp, path)


def field_of(problem: str) -> str:
    """The dotted field a problem message names (``"train.lr = -1: ..."`` -> ``"train.lr"``);
    empty when it names none."""
    head = problem.split(" = ", 1)[0] if " = " in problem.split(":", 1)[0] else problem.split(":", 1)[0]
    head = head.strip()
    return head if head and " " not in head else ""
