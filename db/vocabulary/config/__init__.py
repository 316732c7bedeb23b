"""The run config: one pydantic model shared by the UI form, the CLI, the scheduler and the trainer.

It is read from TOML and stored as JSON on the run row (a copy in the run folder's ``config.json``
is for a person); each attempt's ranks read the attempt's own ``config.json``, the run's plus the
attempt's overrides, which the scheduler writes at launch. This module must not import torch: the
UI and the scheduler import it.

Why it lives in ``db/``: it is the schema of a stored column (``runs.config_json``) that all four
kinds of code read, the UI's form, the CLI's submit, the scheduler's launch and the ranks'
training loop. Imports point app -> orchestrator -> trainer -> db, so only the bottom layer is
importable by every one of them; and like the models beside it, it imports nothing above it.

Every field is documented where it is declared; ``docs/CONFIG.md`` is generated from these
docstrings (``runyard config-reference``) and a test keeps the two equal.

The New run page (app/form.py) is generated from the fields too: types, bounds and docstrings,
plus this declarative metadata, so a new field needs no UI edit:

- ``title``: the form's label (default: the key, in words);
- the [workload] section is one model per kind (``MlpDigitsWorkload``, ``GptCharWorkload``,
  ``ScriptWorkload``, their union ``WorkloadConfig`` chosen by ``kind``): the form shows a
  workload field for the kind whose class declares it;
- which keys of the other sections a kind's code reads is the union's too: each workload class
  names the ones it ignores (``ignores``: a key such as ``"train.activation_checkpointing"`` or a
  whole section such as ``"train"``), and :func:`kinds_reading` says which kinds read a key; the
  form shows a key for those kinds only and gives it its default for the others, and a script
  run (kind = "script") that sets it to anything else is refused (:func:`kind_problems`);
- ``json_schema_extra={"list_syntax": "shell"}``: a list written as shell words (default: comma
  separated);
- ``json_schema_extra={"common": True}`` on a section of RunConfig: shown open (default: folded);
- ``json_schema_extra={"own_form": True}``: a section the New run form leaves out, drawn by a form
  of its own (``[sweep]``: the New sweep form), or a field a form draws by its own widget
  (``[sweep.space]``: the New sweep form's space box).
"""

from __future__ import annotations

from db.vocabulary.config.alerts import DEFAULT_TRIGGERS, TRIGGERS, AlertsConfig, trigger_problem
from db.vocabulary.config.base import (
    ENV_NAME,
    INT64_MAX,
    LENIENT,
    MAX_CONFIG_BYTES,
    MODULE_PATTERN,
    PROBLEM_SEPARATOR,
    RESERVED_ENV,
    RESERVED_ENV_PREFIXES,
    SEED_MAX,
    USER_RUNYARD_ENV,
    ConfigError,
    env_name_problem,
    lenient,
    relative_path_problem,
)
from db.vocabulary.config.checkpoint import CheckpointConfig
from db.vocabulary.config.launch import (
    SLURM_NAME,
    SLURM_OWNED_OPTIONS,
    SLURM_TIME,
    LaunchConfig,
    SlurmConfig,
    sbatch_arg_problem,
)
from db.vocabulary.config.reading import (
    MAX_CONFIG_DEPTH,
    MAX_INT_DIGITS,
    apply_overrides,
    check_plain,
    config_from_json,
    deep_merge,
    field_of,
    lenient_config,
    load_config,
    parse_config,
    parse_override,
    parse_toml,
    read_config_text,
    write_config_file,
)
from db.vocabulary.config.reference import reference_markdown
from db.vocabulary.config.run import (
    RunConfig,
    compatibility_problems,
    effective_batch_change,
    kind_problems,
    plausibility_warnings,
)
from db.vocabulary.config.supervision import RetryConfig, SupervisionConfig
from db.vocabulary.config.train import ParallelConfig, TrainConfig
from db.vocabulary.config.workload import (
    BUILT_IN_KINDS,
    DEFAULT_KIND,
    WORKLOAD_KINDS,
    WORKLOADS,
    GptCharWorkload,
    MlpDigitsWorkload,
    ScriptWorkload,
    Workload,
    WorkloadConfig,
    kinds_reading,
    kinds_with_field,
    reads,
    workload_as,
    workload_class,
    workload_problems,
)

__all__ = [
    "BUILT_IN_KINDS",
    "DEFAULT_KIND",
    "DEFAULT_TRIGGERS",
    "ENV_NAME",
    "INT64_MAX",
    "LENIENT",
    "MAX_CONFIG_BYTES",
    "MAX_CONFIG_DEPTH",
    "MAX_INT_DIGITS",
    "MODULE_PATTERN",
    "PROBLEM_SEPARATOR",
    "RESERVED_ENV",
    "RESERVED_ENV_PREFIXES",
    "SEED_MAX",
    "SLURM_NAME",
    "SLURM_OWNED_OPTIONS",
    "SLURM_TIME",
    "TRIGGERS",
    "USER_RUNYARD_ENV",
    "WORKLOADS",
    "WORKLOAD_KINDS",
    "AlertsConfig",
    "CheckpointConfig",
    "ConfigError",
    "GptCharWorkload",
    "LaunchConfig",
    "MlpDigitsWorkload",
    "ParallelConfig",
    "RetryConfig",
    "RunConfig",
    "ScriptWorkload",
    "SlurmConfig",
    "SupervisionConfig",
    "TrainConfig",
    "Workload",
    "WorkloadConfig",
    "apply_overrides",
    "check_plain",
    "compatibility_problems",
    "config_from_json",
    "deep_merge",
    "effective_batch_change",
    "env_name_problem",
    "field_of",
    "kind_problems",
    "kinds_reading",
    "kinds_with_field",
    "lenient",
    "lenient_config",
    "load_config",
    "parse_config",
    "parse_override",
    "parse_toml",
    "plausibility_warnings",
    "read_config_text",
    "reads",
    "reference_markdown",
    "relative_path_problem",
    "sbatch_arg_problem",
    "trigger_problem",
    "workload_as",
    "workload_class",
    "workload_problems",
    "write_config_file",
]
