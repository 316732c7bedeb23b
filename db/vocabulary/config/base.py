"""What every section shares: the error type, the limits, the strict base model and the field metadata helpers."""

from __future__ import annotations

import re
from pathlib import PurePosixPath
from typing import Any

from pydantic import BaseModel, ConfigDict, ValidationInfo, field_validator


class ConfigError(ValueError):
    """A run config that cannot be accepted. ``problems`` lists every problem, each naming the
    field and the value; ``warnings`` the settings that are valid but rarely meant
    (:func:`plausibility_warnings`) among the fields that were judged, so that a form shows
    everything about a submit at once."""

    def __init__(self, problems: list[str], warnings: list[str] | None = None):
        self.problems = problems
        self.warnings = list(warnings or [])
        super().__init__("invalid run config:\n" + "\n".join(f"  - {p}" for p in problems))


# A model validator that finds several problems raises them as one ValueError, one per line
# (pydantic keeps one error per validator); :func:`parse_config` lists them one by one.
PROBLEM_SEPARATOR = "\n"


# The validation context under which the checks across fields are skipped (:func:`lenient_config`).
LENIENT = "runyard-lenient"


def lenient(info: ValidationInfo) -> bool:
    """Whether a validator runs for :func:`lenient_config` (its checks across fields skipped)."""
    return isinstance(info.context, dict) and bool(info.context.get(LENIENT))


# Integers are stored as 64-bit columns; a larger one could not even be inserted.
INT64_MAX = 2**63 - 1


# numpy's legacy seeding (used by the data order) takes 32-bit seeds.
SEED_MAX = 2**32 - 1


# A config is a few kilobytes; reading more is a mistake (or /dev/zero).
MAX_CONFIG_BYTES = 1 << 20


# A module for `python -m`: dotted identifiers.
MODULE_PATTERN = r"^[A-Za-z_][A-Za-z0-9_]*(\.[A-Za-z_][A-Za-z0-9_]*)*$"


ENV_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*$")


# What runyard and torchrun set for the ranks themselves: a script's env table must not change it.
RESERVED_ENV = frozenset({
    "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "GROUP_RANK", "ROLE_RANK", "ROLE_WORLD_SIZE",
    "MASTER_ADDR", "MASTER_PORT", "CUDA_VISIBLE_DEVICES", "CUDA_DEVICE_ORDER", "GLOO_SOCKET_IFNAME",
    "NCCL_SOCKET_IFNAME",
    "PYTHONUNBUFFERED",
})


RESERVED_ENV_PREFIXES = ("RUNYARD_", "TORCHELASTIC_", "TORCH_ELASTIC_")


# The RUNYARD_* variable a script's env table may set: the wandb stand-in (orchestrator/scripts).
USER_RUNYARD_ENV = frozenset({"RUNYARD_WANDB_SHIM"})


def env_name_problem(name: str) -> str | None:
    """Why ``name`` cannot be set in ``[workload.env]``, or None."""
    if not ENV_NAME.match(name):
        return "not a variable name (letters, digits and _, not starting with a digit)"
    if name in USER_RUNYARD_ENV:
        return None
    if name in RESERVED_ENV or name.startswith(RESERVED_ENV_PREFIXES):
        return "runyard sets this variable for the ranks itself"
    return None


def relative_path_problem(field: str, pattern: str) -> str | None:
    """The problem with a path (or glob) that must stay inside the working directory, or None."""
    if not pattern.strip():
        return f"{field} = {pattern!r}: empty; leave the key out instead"
    path = PurePosixPath(pattern)
    if path.is_absolute() or pattern.startswith("~"):
        return f"{field} = {pattern!r} must be relative to workload.workdir"
    if ".." in path.parts:
        return f"{field} = {pattern!r} must stay inside workload.workdir (no '..')"
    return None


NUL_PROBLEM = "holds a NUL character, which no path, argument, environment value or name can"


def _holds_nul(value: Any) -> bool:
    if isinstance(value, str):
        return "\x00" in value
    if isinstance(value, (tuple, list)):
        return any(_holds_nul(v) for v in value)
    if isinstance(value, dict):
        return any(_holds_nul(k) or _holds_nul(v) for k, v in value.items())
    return False


class _Section(BaseModel):
    # strict: TOML and JSON give real types, so "yes" is not a bool and 1e3 is not an int (an int
    # where a float is wanted is fine). Tuples opt out below: TOML and JSON give lists.
    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, validate_default=True, strict=True
    )

    @field_validator("*", mode="after")
    @classmethod
    def _no_nul(cls, value: Any) -> Any:
        """No text of a config holds a NUL: the operating system refuses it in every path, argument
        and environment value, and Python raises ValueError where it meets one (a path's
        ``is_file()``), after the config was accepted (TOML allows ``"\u0000"``)."""
        if _holds_nul(value):
            raise ValueError(NUL_PROBLEM)
        return value
