"""docs/CONFIG.md, generated from the fields (`runyard config-reference`)."""

from __future__ import annotations

import json
import typing
from typing import Any

from pydantic import BaseModel

from db.vocabulary.config.run import RunConfig
from db.vocabulary.config.sweep import Dimension, SweepConfig
from db.vocabulary.config.workload import Workload, kind_of


def _constraint_text(meta: Any) -> str:
    symbols = {"ge": ">=", "gt": ">", "le": "<=", "lt": "<", "min_length": "min length", "max_length": "max length"}
    for attr, symbol in symbols.items():
        if getattr(meta, attr, None) is not None:
            return f"{symbol} {getattr(meta, attr)}"
    if getattr(meta, "pattern", None):
        return f"matches `{meta.pattern}`"
    return str(meta)


def reference_markdown() -> str:
    """The config reference (docs/CONFIG.md), generated from the field docstrings."""
    lines = [
        "# Run config reference",
        "",
        "Generated from `db/vocabulary/config/` by `runyard config-reference`; a test keeps it equal.",
        "Unknown keys are rejected. Every value can be overridden on the command line with",
        "`runyard submit CONFIG.toml --set section.key=value`. Types are strict: `true`/`false` for",
        "booleans, whole numbers for integers (`1000`, not `1e3`); an integer is fine for a float.",
        "",
    ]

    def table(model: type[BaseModel], prefix: str) -> None:
        lines.append("| key | type | default | meaning |")
        lines.append("| --- | --- | --- | --- |")
        for name, field in model.model_fields.items():
            ann = field.annotation
            if any(isinstance(t, type) and issubclass(t, BaseModel) for t in (ann, *typing.get_args(ann))):
                continue  # a section, or one of several (the [workload] kinds)
            type_name = str(ann).replace("typing.", "").replace("<class '", "").replace("'>", "")
            constraints = ", ".join(_constraint_text(m) for m in field.metadata if type(m).__name__ != "Strict")
            if constraints:
                type_name += f", {constraints}"
            default = field.get_default(call_default_factory=True)
            default = json.dumps(list(default) if isinstance(default, tuple) else default)
            desc = (field.description or "").replace("\n", " ").replace("|", "\\|")
            lines.append(f"| `{prefix}{field.alias or name}` | {type_name} | `{default}` | {desc} |")
        lines.append("")

    lines.append("## top level")
    lines.append("")
    table(RunConfig, "")
    for name, field in RunConfig.model_fields.items():
        ann = field.annotation
        if isinstance(ann, type) and issubclass(ann, BaseModel):
            lines.append(f"## [{name}]")
            lines.append("")
            lines.append((ann.__doc__ or "").strip())
            lines.append("")
            table(ann, "")
        elif name == "workload":  # one model per kind (a union): a table for each
            lines.append(f"## [{name}]")
            lines.append("")
            lines.append(" ".join((Workload.__doc__ or "").split()))
            lines.append("")
            for model in typing.get_args(ann):
                lines.append(f"### kind = \"{kind_of(model)}\"")
                lines.append("")
                lines.append(" ".join((model.__doc__ or "").split()))
                lines.append("")
                table(model, "")
        elif name == "sweep":
            sweep_tables(lines, table)
    return "\n".join(lines)


def sweep_tables(lines: list[str], table: typing.Callable[[type[BaseModel], str], None]) -> None:
    """The [sweep] section and its tables: its own keys, a dimension of [sweep.space], then each
    table of its own ([sweep.early_stop], [sweep.budget])."""
    lines += ["## [sweep]", "", " ".join((SweepConfig.__doc__ or "").split()), ""]
    table(SweepConfig, "")
    lines += ["### [sweep.space]", "", " ".join((SweepConfig.model_fields["space"].description or "").split()),
              " ".join((Dimension.__doc__ or "").split()), ""]
    table(Dimension, "")
    for name, field in SweepConfig.model_fields.items():
        models = [t for t in (field.annotation, *typing.get_args(field.annotation))
                  if isinstance(t, type) and issubclass(t, BaseModel)]
        if models and name != "space":
            lines += [f"### [sweep.{name}]", "", " ".join((models[0].__doc__ or "").split()), ""]
            table(models[0], "")
