"""Property tests over the run config: no input gets past submit unless it also passes every
later validation, and no input makes `runyard submit` print a traceback.

Random values of random types go into every field (and random keys beside them), through the
real validation (`orchestrator.submission.validate`), `--set` overrides and the round trips a
config makes: to the JSON on the run row and in config.json (read back by the trainer at launch
with `RunConfig.model_validate_json`) and back to a mapping (what `runyard fork` validates).
Then random TOML text and bytes go through the real `runyard submit` (click's CliRunner) into a
real SQLite database.
"""

from __future__ import annotations

import json
import math
import sqlite3
import typing
from pathlib import Path
from typing import Any

import pytest
from click.testing import CliRunner
from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from pydantic import BaseModel
from sqlalchemy.orm import Session, sessionmaker

from db.models import Run
from db.vocabulary.config import ConfigError, RunConfig, apply_overrides, config_from_json, parse_config
from db.vocabulary.inventory import Inventory
from db.vocabulary.settings import Settings
from orchestrator.cli.group import cli
from orchestrator.submission import submit, validate

CPU = Inventory(kind="cpu", slots=2, memory_bytes=16 * 1024**3)

SECTIONS: dict[str, list[str]] = {
    name: list(field.annotation.model_fields)
    for name, field in RunConfig.model_fields.items()
    if isinstance(field.annotation, type) and issubclass(field.annotation, BaseModel)
}
SECTIONS["checkpoint"].append("async")  # the TOML name of async_save
TOP_LEVEL = [name for name in RunConfig.model_fields if name not in SECTIONS]

# Values at and just past the bounds, and the literals that lax parsing used to accept.
EDGES = [0, 1, -1, 2, 8, 2**31, 2**32 - 1, 2**32, 2**63 - 1, 2**63, 2**64, 10**20, 1e3, 0.5, -0.0, 1e308,
         math.inf, math.nan, True, False, "yes", "true", "1", "1e3", "", " ", "gpt-char", "mlp-digits", "script",
         "fsdp", "ddp", "bf16", "fp16", "fp32", "cosine", "gloo", "nccl", "auto", "max", "min", "eval_loss",
         "/dev/zero", ".", "/nonexistent/x.txt", "examples/digits.toml", "train.py", "a\x00b", "name-1"]

scalars = st.one_of(
    st.sampled_from(EDGES),
    st.booleans(),
    st.integers(min_value=-(2**70), max_value=2**70),
    st.floats(allow_nan=True, allow_infinity=True),
    st.text(max_size=12),
)
values = st.recursive(
    scalars,
    lambda inner: st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3),
    max_leaves=6,
)


def typed(annotation: Any) -> st.SearchStrategy[Any]:
    """Values of the field's own type, over a range far wider than its bounds: most random
    values of a random type are refused early, these reach the bounds and the cross-field checks."""
    args = typing.get_args(annotation)
    if annotation is bool:
        return st.booleans()
    if annotation is int:
        return st.integers(min_value=-2, max_value=300) | st.integers(min_value=-(2**65), max_value=2**65) | \
            st.sampled_from([2**32 - 1, 2**32, 2**63 - 1, 2**63])
    if annotation is float:
        return st.floats(allow_nan=True, allow_infinity=True) | st.integers(min_value=-5, max_value=10**6)
    if typing.get_origin(annotation) is typing.Literal:
        return st.sampled_from(args)
    if typing.get_origin(annotation) is tuple:
        return st.lists(st.text(max_size=6), max_size=3)
    return st.text(max_size=12) | st.none()


def section(model: type[BaseModel], wild: bool) -> st.SearchStrategy[dict[str, Any]]:
    fields = {field.alias or name: typed(field.annotation) | values if wild else typed(field.annotation)
              for name, field in model.model_fields.items()}
    known = st.fixed_dictionaries({}, optional=fields)
    if not wild:
        return known
    return known | st.dictionaries(st.sampled_from(sorted(fields)) | st.text(max_size=8), values, max_size=5)


def _bounds(field: Any) -> dict[str, Any]:
    found: dict[str, Any] = {}
    for meta in field.metadata:
        for attr in ("ge", "gt", "le", "lt"):
            if getattr(meta, attr, None) is not None:
                found[attr] = getattr(meta, attr)
    return found


def valid_value(name: str, field: Any) -> st.SearchStrategy[Any]:
    """A value inside the field's declared type and bounds (cross-field rules may still refuse)."""
    annotation, bounds = field.annotation, _bounds(field)
    likely = {"nproc_per_node": st.integers(1, 3), "backend": st.sampled_from(["auto", "gloo", "nccl"]),
              "best_metric": st.sampled_from(["eval_loss", "loss", ""])}
    if name in likely:  # mostly what this 2-slot CPU machine accepts, sometimes not
        return likely[name]
    if annotation is int:
        low = bounds.get("ge", bounds.get("gt", -1) + 1)
        high = bounds.get("le", 2**63 - 1)
        # The bounds, and one past each: refused by a declared bound, or (if one was forgotten)
        # 2^63 overflowing the 64-bit INSERT.
        return (st.integers(min_value=low, max_value=min(high, low + 300))
                | st.sampled_from([low, high, low - 1, high + 1]))
    if annotation is float:
        low = bounds.get("ge", bounds.get("gt", 0.0))
        return st.floats(min_value=low, max_value=1e6, exclude_min="gt" in bounds) | st.just(1e308)
    if name == "name":
        return st.sampled_from(["run", "A.b_c-1", "x" * 100])
    if name in ("script", "text"):
        return st.none()
    return typed(annotation)


def section_model(name: str) -> type[BaseModel]:
    """The model of the config's section ``name`` (``[train]``: TrainConfig)."""
    model = RunConfig.model_fields[name].annotation
    assert isinstance(model, type) and issubclass(model, BaseModel), name
    return model


def tame_mapping() -> st.SearchStrategy[dict[str, Any]]:
    top = {name: valid_value(name, RunConfig.model_fields[name]) for name in TOP_LEVEL}
    tables = {
        name: st.fixed_dictionaries({}, optional={
            field.alias or key: valid_value(key, field)
            for key, field in section_model(name).model_fields.items()
        })
        for name in SECTIONS
    }
    return st.fixed_dictionaries({}, optional={**top, **tables})


@st.composite
def perturbed(draw: st.DrawFn) -> dict[str, Any]:
    """A mapping of valid values with (usually) one field set to anything at all."""
    data = draw(tame_mapping())
    if draw(st.booleans()):
        name = draw(st.sampled_from(sorted(SECTIONS)))
        key = draw(st.sampled_from(SECTIONS[name]))
        data.setdefault(name, {})[key] = draw(values | typed(int) | typed(float))
    return data


def wild_mapping() -> st.SearchStrategy[dict[str, Any]]:
    """Any value of any type anywhere, and unknown keys."""
    top = {name: typed(RunConfig.model_fields[name].annotation) | values for name in TOP_LEVEL}
    tables = {name: section(section_model(name), True) | values for name in SECTIONS}
    return st.fixed_dictionaries({}, optional={**top, **tables, "bogus": values})


configs = wild_mapping() | perturbed()
override_keys = st.one_of(
    st.sampled_from([f"{s}.{f}" for s, fields in SECTIONS.items() for f in fields] + TOP_LEVEL),
    st.text(max_size=15),
)
overrides = st.lists(st.builds(lambda k, v: f"{k}={v}", override_keys, st.text(max_size=12) | st.sampled_from(
    [str(e) for e in EDGES] + ['"gpt-char"', "[1, 2]", "{a = 1}", "1e3", "true", "yes", "99999999999999999999"])),
    max_size=4)


def assert_survives_every_later_validation(config: RunConfig) -> None:
    """What a queued config goes through after submit: stored as JSON, read back at launch,
    re-validated as a mapping by fork, checked against the machine again by the scheduler."""
    stored = config.to_json()
    assert config_from_json(stored) == config  # the trainer's read of config.json
    again = parse_config(json.loads(stored))  # runyard fork re-validates the stored mapping
    assert again == config
    assert validate(json.loads(stored), CPU).to_json() == stored
    json.loads(stored)  # canonical JSON: no NaN or Infinity tokens
    assert "NaN" not in stored and "Infinity" not in stored


@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=configs, sets=overrides)
def test_any_mapping_is_refused_with_config_error_or_is_queued_and_survives_every_later_validation(
    sessions: sessionmaker[Session], settings: Settings, data: dict[str, Any], sets: list[str]
) -> None:
    try:
        config = validate(apply_overrides(data, sets), CPU)
    except ConfigError as exc:
        assert exc.problems and all(isinstance(p, str) and p for p in exc.problems)  # noqa: PT017 - a property: refused or queued, both allowed
        event("refused")
        return
    event("accepted")
    run_id = submit(sessions, settings, config, CPU)  # the real INSERT into SQLite
    with sessions() as session:
        stored = session.get_one(Run, run_id).config_json
    assert config_from_json(stored) == config
    assert_survives_every_later_validation(config)


def test_every_number_field_at_and_past_its_bounds_is_refused_or_queued_whole(
    sessions: sessionmaker[Session], settings: Settings
) -> None:
    """The edges, exhaustively (the random search above rarely lands on one exact field's)."""
    tried = accepted = 0
    for name in SECTIONS:
        for key, field in section_model(name).model_fields.items():
            if field.annotation not in (int, float):
                continue
            bounds = _bounds(field)
            low = bounds.get("ge", bounds.get("gt", 0))
            high = bounds.get("le", 2**63 - 1)
            edges = [low - 1, low, high, high + 1, 2**63 - 1, 2**63, 2**64, -(2**63) - 1]
            if field.annotation is float:
                edges += [low + 1e-9, 1e308, math.inf, -math.inf, math.nan, -0.0]
            for value in edges:
                tried += 1
                try:
                    config = validate({name: {field.alias or key: value}}, CPU)
                except ConfigError as exc:
                    assert any(f"{name}.{field.alias or key}" in p for p in exc.problems), exc.problems  # noqa: PT017 - a property: refused or queued, both allowed
                    continue
                accepted += 1
                run_id = submit(sessions, settings, config, CPU)  # the real 64-bit INSERT
                with sessions() as session:
                    assert config_from_json(session.get_one(Run, run_id).config_json) == config
                assert_survives_every_later_validation(config)
    assert tried > 150 and accepted > 50  # the edges were really tried, both ways


def _toml_value(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf") if math.isinf(value) else repr(value)
    if isinstance(value, int):
        return str(value)
    if isinstance(value, list):
        return "[" + ", ".join(_toml_value(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{" + ", ".join(f"{json.dumps(k)} = {_toml_value(v)}" for k, v in value.items()) + "}"
    return json.dumps(value)  # a basic string; a lone surrogate makes TOML the parser refuse it


def toml_text(data: dict[str, Any]) -> str:
    lines = []
    tables = {k: v for k, v in data.items() if isinstance(v, dict) and k in SECTIONS}
    for key, value in data.items():
        if key not in tables:
            lines.append(f"{json.dumps(key)} = {_toml_value(value)}")
    for name, table in tables.items():
        lines.append(f"[{name}]")
        lines += [f"{json.dumps(k)} = {_toml_value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


config_files = st.one_of(
    configs.map(toml_text).map(str.encode),
    st.text(max_size=200).map(lambda t: t.encode("utf-8", errors="surrogatepass")),
    st.binary(max_size=200),
)


def _runs(settings_: Settings) -> int:
    con = sqlite3.connect(settings_.home / "runyard.db")
    try:
        return con.execute("SELECT count(*) FROM runs").fetchone()[0]
    finally:
        con.close()


@pytest.fixture
def config_dir(tmp_path: Path) -> Path:
    folder = tmp_path / "configs"
    folder.mkdir()
    return folder


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(content=config_files, sets=overrides)
def test_submit_of_any_file_exits_0_or_2_without_a_traceback(
    settings: Settings, config_dir: Path, content: bytes, sets: list[str]
) -> None:
    path = config_dir / "run.toml"
    path.write_bytes(content)
    before = _runs(settings) if (settings.home / "runyard.db").exists() else 0
    args = ["submit", str(path)]
    for item in sets:
        args += ["--set", item]
    result = CliRunner().invoke(cli, args)
    output = result.stdout + result.stderr
    assert "Traceback" not in output
    assert result.exception is None or isinstance(result.exception, SystemExit), repr(result.exception)
    assert result.exit_code in (0, 2), output
    after = _runs(settings)
    event(f"exit {result.exit_code}")
    if result.exit_code == 2:
        assert after == before and "nothing was queued" in result.stderr
        return
    assert after == before + 1
    con = sqlite3.connect(settings.home / "runyard.db")
    try:
        (stored,) = con.execute("SELECT config_json FROM runs WHERE id = ?", (int(result.stdout),)).fetchone()
    finally:
        con.close()
    assert_survives_every_later_validation(config_from_json(stored))
