"""The whole run config (every section) and the checks across sections."""

from __future__ import annotations

import hashlib
import json
from collections.abc import Mapping
from typing import Any

from pydantic import BaseModel, Field, ValidationInfo, field_validator, model_validator

from db.vocabulary.config.alerts import AlertsConfig
from db.vocabulary.config.base import PROBLEM_SEPARATOR, _Section, lenient
from db.vocabulary.config.checkpoint import CheckpointConfig
from db.vocabulary.config.labels import NAME_HELP, NAME_MAX, NAME_PATTERN, tags_problems
from db.vocabulary.config.launch import LaunchConfig, SlurmConfig
from db.vocabulary.config.supervision import RetryConfig, SupervisionConfig
from db.vocabulary.config.sweep import SweepConfig
from db.vocabulary.config.train import ParallelConfig, TrainConfig
from db.vocabulary.config.workload import (
    BUILT_IN_KINDS,
    STORED,
    MlpDigitsWorkload,
    ScriptWorkload,
    WorkloadConfig,
    kinds_reading,
)

# Values that are allowed but rarely meant: the New run page asks before it starts such a run,
# and `runyard submit` prints the warning. (field, test, why)
_IMPLAUSIBLE: tuple[tuple[str, Any, str], ...] = (
    ("train.lr", lambda v: v > 1.0, "a learning rate above 1 usually diverges (typical: 1e-5 to 1e-2)"),
    ("train.lr", lambda v: v < 1e-7, "a learning rate below 1e-7 barely moves the weights"),
    ("train.weight_decay", lambda v: v > 1.0, "weight decay above 1 shrinks the weights faster than they learn"),
    ("train.min_lr", lambda v: v > 1.0, "a minimum learning rate above 1 usually diverges"),
    ("train.batch_size", lambda v: v > 65536, "a per-rank batch this large rarely fits in memory"),
    ("train.grad_accum", lambda v: v > 1024, "more than 1024 accumulation steps makes each step very slow"),
    ("supervision.hang_timeout_s", lambda v: v < 10, "a hang timeout under 10 s kills healthy runs that pause to "
                                                     "evaluate or save"),
    ("retry.max_retries", lambda v: v > 100, "more than 100 retries keeps a broken run going for a long time"),
)


def plausibility_warnings(config: RunConfig) -> list[str]:
    """Settings that are valid but rarely meant, each naming the field and the value; only for
    fields that apply to the run's workload kind."""
    kind = config.workload.kind
    warnings = []
    for key, implausible, why in _IMPLAUSIBLE:
        section_name, name = key.split(".")
        section = getattr(config, section_name)
        kinds = kinds_reading(key)
        value = getattr(section, name)
        if (kinds is None or kind in kinds) and implausible(value):
            warnings.append(f"{key} = {value!r}: {why}")
    return warnings


class RunConfig(_Section):
    """A training run."""

    @model_validator(mode="after")
    def _compatible(self, info: ValidationInfo) -> RunConfig:
        """Options a workload cannot honour are refused up front, not ignored (all of them at once)."""
        if not lenient(info) and (problems := compatibility_problems(self)):
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self

    name: str = Field(
        default="run", min_length=1, max_length=NAME_MAX, pattern=NAME_PATTERN,
        json_schema_extra={"pattern_help": NAME_HELP},
    )
    """Name shown in the dashboard: letters, digits, `.`, `_`, `-`; not unique."""

    tags: tuple[str, ...] = Field(default=(), strict=False)
    """Labels for filtering the runs list, the same rule as `runyard edit --add-tag`: each
    letters, digits and `. _ : / + = -`, starting with a letter or digit, at most 40 characters;
    at most 20 a run."""

    @field_validator("tags")
    @classmethod
    def _tags(cls, tags: tuple[str, ...], info: ValidationInfo) -> tuple[str, ...]:
        """The rule of a tag added later (db/vocabulary/config/labels.py); a config runyard stored
        before the rule (the ``STORED`` context) still opens."""
        if not (info.context and info.context.get(STORED)) and (problems := tags_problems(tags)):
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return tags

    # "common": the New run page shows these sections open, the others folded.
    workload: WorkloadConfig = Field(default=MlpDigitsWorkload(), json_schema_extra={"common": True})
    launch: LaunchConfig = Field(default=LaunchConfig(), json_schema_extra={"common": True})
    train: TrainConfig = Field(default=TrainConfig(), json_schema_extra={"common": True})
    parallel: ParallelConfig = Field(default=ParallelConfig(), json_schema_extra={"common": True})
    checkpoint: CheckpointConfig = CheckpointConfig()
    retry: RetryConfig = RetryConfig()
    supervision: SupervisionConfig = SupervisionConfig()
    slurm: SlurmConfig = SlurmConfig()
    alerts: AlertsConfig = AlertsConfig()
    # A form of its own (the New sweep form): the New run form leaves it out (app/form.py).
    sweep: SweepConfig | None = Field(default=None, json_schema_extra={"own_form": True})
    """`[sweep]`: this file is a sweep (`runyard sweep start FILE`), the rest of it the base of
    every trial; a run's own config has none."""

    def as_dict(self) -> dict[str, Any]:
        """The config as plain data, with the TOML key names (no ``sweep`` key unless it has
        one: a run's stored config, its hash and its ``config.json`` are what they were)."""
        data = self.model_dump(mode="json", by_alias=True)
        if data.get("sweep") is None:
            del data["sweep"]
        return data

    def base(self) -> RunConfig:
        """This config without its ``[sweep]`` section: a sweep's base, what each trial varies."""
        return self.model_copy(update={"sweep": None})

    def to_json(self) -> str:
        """The canonical JSON form stored on the run row and in ``config.json``."""
        return json.dumps(self.as_dict(), sort_keys=True)

    def config_hash(self) -> str:
        """sha256 of the canonical JSON form."""
        return hashlib.sha256(self.to_json().encode()).hexdigest()


def compatibility_problems(c: RunConfig) -> list[str]:
    """The options of different sections that cannot go together, every one of them."""
    kind = c.workload.kind
    problems: list[str] = []
    if kind == "mlp-digits" and c.train.activation_checkpointing:
        problems.append("train.activation_checkpointing = true is for gpt-char; mlp-digits has no blocks")
    if kind != "gpt-char" and c.parallel.strategy == "fsdp":
        problems.append(f"parallel.strategy = 'fsdp' is supported by gpt-char, not {kind!r}")
    if c.parallel.strategy == "fsdp" and c.train.precision == "fp16":
        problems.append("train.precision = 'fp16' with parallel.strategy = 'fsdp' is not supported; use 'bf16'")
    if c.launch.executor == "slurm" and isinstance(c.workload, ScriptWorkload) and c.workload.stop_signal != "SIGTERM":
        problems.append(f"workload.stop_signal = {c.workload.stop_signal!r} is for launch.executor = 'local'; "
                        "on Slurm a pause or cancel sends SIGTERM (scancel --signal=TERM)")
    if c.launch.executor != "slurm" and c.slurm != SlurmConfig():
        changed = sorted(c.slurm.model_dump(exclude_defaults=True))
        problems.append(f"slurm.{changed[0]} is set but launch.executor = {c.launch.executor!r}: the [slurm] "
                        "settings apply to launch.executor = 'slurm' only")
    return problems


def effective_batch_change(before: Mapping[str, Any], after: Mapping[str, Any]) -> str | None:
    """What a fork (or a resume on other settings) changes in the samples per optimizer step.

    Args:
        before: The config the checkpoint was trained with, as plain data (``RunConfig.as_dict``).
        after: The config that continues from it, the same way.

    Returns:
        A sentence when ranks x ``train.batch_size`` x ``train.grad_accum`` differ (with the
        ``train.grad_accum`` that would keep it, when one does), else None. None for scripts,
        whose batch runyard does not know.
    """
    def batch(config: Mapping[str, Any]) -> tuple[int, int, int]:
        launch, train = config.get("launch") or {}, config.get("train") or {}
        ranks = int(launch.get("nnodes", LaunchConfig().nnodes)) * int(launch.get("nproc_per_node",
                                                                               LaunchConfig().nproc_per_node))
        return ranks, int(train.get("batch_size", TrainConfig().batch_size)), int(train.get("grad_accum",
                                                                                            TrainConfig().grad_accum))

    if (after.get("workload") or {}).get("kind") == "script":
        return None
    (r0, b0, a0), (r1, b1, a1) = batch(before), batch(after)
    old, new = r0 * b0 * a0, r1 * b1 * a1
    if old == new:
        return None
    text = (f"the effective batch (ranks x train.batch_size x train.grad_accum) changes from {r0} x {b0} x {a0} "
            f"= {old} to {r1} x {b1} x {a1} = {new} samples per step")
    if old % (r1 * b1) == 0:
        text += f"; train.grad_accum = {old // (r1 * b1)} would keep {old}"
    return text


def kind_problems(config: RunConfig) -> list[str]:
    """Every field set to a value other than its default for a workload kind it does not apply
    to, for a script run (kind = "script"): a script never reads runyard's training settings, so
    a ``train.lr`` given for it would be silently ignored. One problem per field, each naming
    the field and the value."""
    kind = config.workload.kind
    if kind != "script":
        return []
    problems: list[str] = []
    for section_name in RunConfig.model_fields:
        section = getattr(config, section_name)
        if not isinstance(section, BaseModel):
            continue
        model = type(section)
        for name, info in model.model_fields.items():
            key = f"{section_name}.{info.alias or name}"
            kinds = kinds_reading(key)
            value = getattr(section, name)
            if kinds is None or kind in kinds or value == info.get_default(call_default_factory=True):
                continue
            what = (info.title or name.replace("_", " ")).lower()
            where = "the built-in workloads" if sorted(kinds) == sorted(BUILT_IN_KINDS) else " and ".join(kinds)
            problems.append(f"{key} = {value!r} applies to {where} only; a script sets its own {what}")
    return problems
