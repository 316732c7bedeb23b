"""The run config: one pydantic model shared by the UI form, the CLI, the scheduler and the trainer.

It is read from TOML, stored as JSON on the run row and written to ``config.json`` in the run
directory; the trainer reads only that file. This module must not import torch: the UI and the
scheduler import it.

Why it lives in ``db/``: it is the schema of a stored column (``runs.config_json``) that all four
kinds of code read, the UI's form, the CLI's submit, the scheduler's launch and the ranks'
training loop. Imports point app -> orchestrator -> trainer -> db, so only the bottom layer is
importable by every one of them; and like the models beside it, it imports nothing above it.

Every field is documented where it is declared; ``docs/CONFIG.md`` is generated from these
docstrings (``runyard config-reference``) and a test keeps the two equal.

The New run page (app/form.py) is generated from the fields too: types, bounds and docstrings,
plus this declarative metadata, so a new field needs no UI edit:

- ``title``: the form's label (default: the key, in words);
- ``json_schema_extra={"kinds": [...]}``: the workload kinds the field applies to (default: all);
  the form shows it for those kinds only and gives it its default for the others, and a script
  run (kind = "script") that sets it to anything else is refused (:func:`kind_problems`);
- ``json_schema_extra={"list_syntax": "shell"}``: a list written as shell words (default: comma
  separated);
- ``json_schema_extra={"common": True}`` on a section of RunConfig: shown open (default: folded).
"""

from __future__ import annotations

import copy
import datetime
import functools
import hashlib
import json
import os
import re
import sys
from collections.abc import Mapping
from pathlib import Path, PurePosixPath
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, ValidationInfo, field_validator, model_validator
from pydantic_core import ErrorDetails

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover
    import tomli as tomllib


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
# The workloads runyard ships. A field marked with these kinds only is not passed to a script
# (kind = "script"): the script has its own loop, optimizer and flags, and would silently ignore it.
BUILT_IN_KINDS = ["mlp-digits", "gpt-char"]
_BUILT_IN: dict[str, Any] = {"kinds": BUILT_IN_KINDS}
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


def _pattern_help(loc: tuple[Any, ...]) -> str | None:
    """The words a field gives for its pattern (``json_schema_extra={"pattern_help": ...}``)."""
    model: Any = RunConfig
    for part in loc[:-1]:
        info = model.model_fields.get(part) if isinstance(part, str) else None
        model = info.annotation if info is not None else None
        if not (isinstance(model, type) and issubclass(model, BaseModel)):
            return None
    info = model.model_fields.get(loc[-1]) if loc and isinstance(loc[-1], str) else None
    extra = info.json_schema_extra if info is not None else None
    hint = extra.get("pattern_help") if isinstance(extra, dict) else None
    return str(hint) if hint else None


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
        kinds = field_kinds(type(section), name)
        value = getattr(section, name)
        if (kinds is None or kind in kinds) and implausible(value):
            warnings.append(f"{key} = {value!r}: {why}")
    return warnings


def field_kinds(model: type[BaseModel], name: str) -> list[str] | None:
    """The workload kinds a field applies to (its ``json_schema_extra={"kinds": [...]}``); None:
    every kind. The New run form (app/form.py) reads the same metadata, so what the form hides
    for a kind and what :func:`kind_problems` refuses for it cannot disagree."""
    extra = model.model_fields[name].json_schema_extra
    kinds = extra.get("kinds") if isinstance(extra, dict) else None
    return [str(k) for k in kinds] if isinstance(kinds, list) else None


class _Section(BaseModel):
    # strict: TOML and JSON give real types, so "yes" is not a bool and 1e3 is not an int (an int
    # where a float is wanted is fine). Tuples opt out below: TOML and JSON give lists.
    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, validate_default=True, strict=True
    )


class WorkloadConfig(_Section):
    """What to train."""

    kind: Literal["mlp-digits", "gpt-char", "script"] = Field(default="mlp-digits", title="Workload")
    """`mlp-digits`: an MLP classifier on scikit-learn's bundled 8x8 digits data set (1797
    images, no download). `gpt-char`: a character-level GPT on a text file (default: the Python
    standard library's own sources). `script`: your own torchrun-ready script (`script`, `args`)."""

    hidden: int = Field(
        default=256, ge=8, le=65536, title="Hidden width", json_schema_extra={"kinds": ["mlp-digits"]}
    )
    """Width of the MLP's two hidden layers (mlp-digits)."""

    script: str | None = Field(default=None, json_schema_extra={"kinds": ["script"]})
    """Path of the training script to launch under torchrun (kind = "script"); a relative path
    is resolved against the directory `runyard submit` runs in. It needs no change: runyard reads
    its printed lines, TensorBoard files, wandb calls and checkpoint files (docs/SCRIPTS.md); `import
    runyard` (the SDK) adds per-rank metrics and checkpoints of runyard's own. Submitted from the
    UI, it must lie under the allowed roots (`RUNYARD_SCRIPT_ROOTS`, else the folder `runyard up`
    started in and the data folder), resolved after symlinks."""

    module: str | None = Field(
        default=None, max_length=200, pattern=MODULE_PATTERN, title="Module (python -m)",
        json_schema_extra={"kinds": ["script"], "pattern_help": "a dotted module name such as pkg.train"},
    )
    """Instead of `script`: a module to run as `python -m MODULE` (e.g. `pkg.train`), found
    from `workdir` first, then the interpreter's own path (kind = "script"). Submitted from the
    UI, every file that could provide it must be a `.py` under the allowed roots, none in the
    standard library, site-packages or runyard's packages (so not `timeit`, `runpy`, `torch.*`)."""

    args: tuple[str, ...] = Field(
        default=(), strict=False, title="Script arguments",
        json_schema_extra={"kinds": ["script"], "list_syntax": "shell"},
    )
    """Command-line arguments passed to the script (kind = "script")."""

    workdir: str | None = Field(default=None, title="Working directory", json_schema_extra={"kinds": ["script"]})
    """The folder the ranks run in, where the script's relative paths (`data/`, `out/`,
    `configurator.py`) are found (kind = "script"). Default: the folder `runyard submit` ran in;
    from the UI, the script's own folder. A relative path is resolved against the folder
    `runyard submit` runs in; from the UI, it must lie under the allowed roots."""

    env: dict[str, str] = Field(
        default_factory=dict, title="Environment variables", json_schema_extra={"kinds": ["script"]}
    )
    """Environment variables for the ranks, as a table (`[workload.env]`, `OMP_NUM_THREADS =
    "8"`), over the environment `runyard up` started with (kind = "script"). Names runyard sets
    itself (`RANK`, `MASTER_PORT`, `CUDA_VISIBLE_DEVICES`, `RUNYARD_*` but `RUNYARD_WANDB_SHIM`)
    are refused. Without `OMP_NUM_THREADS` here, it is the machine's cores divided by the ranks."""

    python: str | None = Field(default=None, title="Python interpreter", json_schema_extra={"kinds": ["script"]})
    """The interpreter the ranks run (kind = "script"): a `python` executable or a virtual
    environment's folder (its `bin/python`), so a script with its own dependencies runs with
    them. It must have torch. Default: runyard's own interpreter. Submitted from the UI, it must
    lie under the allowed roots and be an interpreter (`python`, `python3`, `python3.X`)."""

    max_steps: int = Field(default=0, ge=0, le=INT64_MAX, title="Total steps",
                           json_schema_extra={"kinds": ["script"]})
    """The step the script ends at, for progress and ETA (kind = "script"). 0: the total the
    script reports (`RUNYARD {"total": N}`), else unknown."""

    checkpoint_glob: str | None = Field(default=None, title="Checkpoint files",
                                        json_schema_extra={"kinds": ["script"]})
    """The checkpoint files the script writes itself, relative to `workdir` (e.g.
    `out/ckpt.pt`, `snapshot.pt`, `checkpoints/*.pt`): runyard lists them with size, time and
    sha256 (a file rewritten in place is a new version; the one it replaced is marked
    overwritten), at the step it holds (below), and the next attempt (a
    retry, a resume, a fork) gets the chosen one, checked to be still that version, as
    `RUNYARD_RESUME_PATH`, at its place under `workdir`, with `resume_args`. Pinning one copies
    it into the run's folder. With it, a plain script can be paused (kind = "script").
    A pattern may match folders (Hugging Face's `hf_out/checkpoint-*`): each folder is one
    checkpoint (its files' total size, a digest over them, copied whole when pinned). The step of
    each is the one it holds: `trainer_state.json`'s `global_step`, a `torch.save` dict's
    `global_step` (Lightning), `iter_num` (nanoGPT), `step` or `iteration` (read without running
    any of its code), else a number in its name (`checkpoint-350`, `epoch=3-step=300.ckpt`,
    `ckpt_000350.pt`), else the step the script had reported when it saved."""

    checkpoint_step_key: str | None = Field(
        default=None, min_length=1, max_length=100, title="Step key in checkpoints",
        json_schema_extra={"kinds": ["script"]},
    )
    """The top-level key of the script's `torch.save` dict that holds its step, when it is none of
    `global_step`, `iter_num`, `step`, `iteration` (e.g. `STEPS_RUN`); needs `checkpoint_glob`
    (kind = "script")."""

    resume_args: tuple[str, ...] = Field(
        default=(), strict=False, title="Resume arguments",
        json_schema_extra={"kinds": ["script"], "list_syntax": "shell"},
    )
    """Arguments appended to `args` only when an attempt resumes from one of the script's
    checkpoints (e.g. `--init_from=resume`; kind = "script"). Needs `checkpoint_glob`."""

    tensorboard_dir: str | None = Field(default=None, title="TensorBoard folder",
                                        json_schema_extra={"kinds": ["script"]})
    """The folder the script writes TensorBoard event files to, relative to `workdir` or
    absolute; its
    scalars become the run's metrics, each tag on its own step counter (kind = "script").
    Default: any `runs/`, `lightning_logs/` or `tb/` folder under `workdir`."""

    stdout_metrics: dict[str, str] = Field(
        default_factory=dict, title="Metrics from printed lines", json_schema_extra={"kinds": ["script"]}
    )
    """For a script that only prints: metric name -> regular expression with the named groups
    `step` and `value`, matched against each line the ranks print (`[workload.stdout_metrics]`,
    `loss = 'iter (?P<step>\\d+): loss (?P<value>[\\d.]+)'`; kind = "script")."""

    stop_signal: Literal["SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2"] = Field(
        default="SIGTERM", title="Stop signal", json_schema_extra={"kinds": ["script"]})
    """The signal a pause or a cancel sends the script's ranks first; SIGKILL follows after
    `supervision.grace_s` (kind = "script"). Pick the one the script stops cleanly on:
    SIGTERM for runyard's SDK and for a script with its own handler; SIGINT for Lightning outside
    Slurm (its graceful shutdown on KeyboardInterrupt, which `OnExceptionCheckpoint` turns into
    a checkpoint; its SIGTERM handler only sets a flag) and for a script that catches
    KeyboardInterrupt; none saves a Hugging Face `Trainer`, nanoGPT or the DDP tutorial (they
    resume from their last periodic save). SIGTERM, SIGINT and SIGHUP go to torchrun's agent too,
    which passes them on; SIGUSR1 and SIGUSR2 go to the ranks alone. Local executor only."""

    text: str | None = Field(default=None, title="Text file", json_schema_extra={"kinds": ["gpt-char"]})
    """Text file to train gpt-char on (default: the Python standard library's sources): a
    readable regular file of at most 256 MiB, read as UTF-8 (every rank holds it in memory); a
    relative path is resolved against the directory `runyard submit` runs in. Submitted from the
    UI, it must lie under the allowed roots, like `script`."""

    n_layer: int = Field(
        default=4, ge=1, le=96, title="Transformer blocks (n_layer)", json_schema_extra={"kinds": ["gpt-char"]}
    )
    """gpt-char: transformer blocks."""

    n_head: int = Field(
        default=4, ge=1, le=128, title="Attention heads (n_head)", json_schema_extra={"kinds": ["gpt-char"]}
    )
    """gpt-char: attention heads per block; must divide n_embd."""

    n_embd: int = Field(
        default=128, ge=8, le=16384, title="Embedding width (n_embd)", json_schema_extra={"kinds": ["gpt-char"]}
    )
    """gpt-char: embedding width."""

    block_size: int = Field(
        default=128, ge=8, le=8192, title="Context length (block_size)", json_schema_extra={"kinds": ["gpt-char"]}
    )
    """gpt-char: context length in characters."""

    @model_validator(mode="after")
    def _kind_fields(self, info: ValidationInfo) -> WorkloadConfig:
        if not lenient(info) and (problems := workload_problems(self)):
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self


def workload_problems(w: WorkloadConfig) -> list[str]:
    """The [workload] settings that contradict each other, every one of them (a form answers once)."""
    problems: list[str] = []
    if w.kind == "script" and not (w.script or w.module):
        problems.append("workload.script (or workload.module) is required when workload.kind = 'script'")
    if w.script and w.module:
        problems.append(f"workload.script = {w.script!r} and workload.module = {w.module!r}: give one of them")
    if w.kind != "script":
        for name, info in type(w).model_fields.items():
            if field_kinds(type(w), name) == ["script"] and getattr(w, name) != info.get_default(
                    call_default_factory=True):
                problems.append(f"workload.{name} is only for kind = 'script' (kind is {w.kind!r})")
    if w.checkpoint_step_key and not w.checkpoint_glob:
        problems.append(f"workload.checkpoint_step_key = {w.checkpoint_step_key!r} needs "
                        "workload.checkpoint_glob (the files it is read from)")
    if w.resume_args and not w.checkpoint_glob:
        problems.append(f"workload.resume_args = {list(w.resume_args)!r} needs workload.checkpoint_glob "
                        "(the files a resume starts from)")
    for name, value in w.env.items():
        if problem := env_name_problem(name):
            problems.append(f"workload.env.{name} = {value!r}: {problem}")
    if w.checkpoint_glob is not None and (problem := relative_path_problem(
            "workload.checkpoint_glob", w.checkpoint_glob)):
        problems.append(problem)
    if w.n_embd % w.n_head:
        problems.append(f"workload.n_embd = {w.n_embd} must be a multiple of workload.n_head = {w.n_head}")
    return problems


class LaunchConfig(_Section):
    """How torchrun starts the ranks, and where."""

    executor: Literal["local", "slurm"] = Field(default="local", title="Where it runs (executor)")
    """`local`: torchrun on this machine, started by the scheduler. `slurm`: one Slurm batch job
    per attempt, one `srun` task per node running torchrun (settings in `[slurm]`)."""

    nnodes: int = Field(default=1, ge=1, le=1024, title="Nodes (nnodes)")
    """Nodes, one torchrun agent each, joined by torchrun's c10d rendezvous. With the local
    executor every node is an agent on this machine (a rehearsal of a multi-node config: the
    world is the same, the network is loopback); with Slurm, nodes of the allocation."""

    nproc_per_node: int = Field(default=2, ge=1, le=1024, title="Ranks per node (nproc_per_node)")
    """Ranks per node: one per GPU on a GPU machine, CPU slots otherwise. Locally, nnodes x
    nproc_per_node must not exceed the devices this machine has."""

    backend: Literal["auto", "gloo", "nccl"] = "auto"
    """Process-group backend: `auto` picks nccl when CUDA is available, else gloo."""

    @property
    def world_size(self) -> int:
        """Ranks in all: nnodes x nproc_per_node."""
        return self.nnodes * self.nproc_per_node


# sbatch options runyard sets itself for every attempt (a second value would fight its own).
SLURM_OWNED_OPTIONS = frozenset({
    "--job-name", "-J", "--output", "-o", "--error", "-e", "--open-mode", "--signal", "--nodes", "-N",
    "--ntasks", "-n", "--ntasks-per-node", "--chdir", "-D", "--parsable", "--wrap", "--requeue",
    "--no-requeue", "--array", "-a", "--export", "--partition", "-p", "--account", "-A", "--time", "-t",
    "--gpus-per-node", "--cpus-per-task", "-c", "--mem", "--kill-on-invalid-dep", "--wait", "-W",
})
SLURM_TIME = r"^(\d+-\d{1,2}(:\d{2}(:\d{2})?)?|\d+(:\d{2}(:\d{2})?)?)$"
SLURM_NAME = r"^[A-Za-z0-9][A-Za-z0-9._-]*$"


def sbatch_arg_problem(arg: str) -> str | None:
    """Why ``arg`` cannot be one of ``slurm.sbatch_args``, or None.

    Each item is one argv word handed to ``sbatch`` (never shell text): a long option with its
    value (``--qos=high``), a flag (``--exclusive``), or the value of the option before it.
    """
    if not arg or any(c in arg for c in "\n\r\x00"):
        return "empty, or holds a line break or NUL"
    option = arg.split("=", 1)[0]
    if option in SLURM_OWNED_OPTIONS:
        return (f"{option} is set by runyard itself (job name, logs, signal, nodes, or a [slurm] field: use "
                "that field instead)")
    if arg.startswith("-") and not arg.startswith("--"):
        return "use the long form of the option (--qos=high, not -q high): runyard checks options by name"
    return None


class SlurmConfig(_Section):
    """Slurm settings, used when `launch.executor = "slurm"`: each maps to one `sbatch` option."""

    partition: str | None = Field(
        default=None, max_length=128, pattern=SLURM_NAME,
        json_schema_extra={"pattern_help": "a partition name: letters, digits, '.', '_', '-'"})
    """`sbatch --partition`; unset: the cluster's default partition."""

    account: str | None = Field(default=None, max_length=128, pattern=SLURM_NAME,
                                json_schema_extra={"pattern_help": "an account name: letters, digits, '.', '_', '-'"})
    """`sbatch --account`; unset: your default account."""

    time_limit: str | None = Field(
        default=None, max_length=32, pattern=SLURM_TIME,
        json_schema_extra={"pattern_help": "Slurm's time format: minutes (90), HH:MM:SS (01:30:00) or D-HH:MM "
                                           "(1-12:00)"})
    """`sbatch --time` of each attempt: `90`, `01:30:00`, `1-12:00`. Slurm sends the warning
    signal before it; runyard checkpoints, and resubmits from that checkpoint without spending a
    retry. Unset: the partition's limit."""

    gpus_per_node: int = Field(default=0, ge=0, le=1024, title="GPUs per node")
    """`sbatch --gpus-per-node`; 0 asks for none (a CPU job). Usually equal to
    `launch.nproc_per_node`."""

    cpus_per_task: int = Field(default=0, ge=0, le=4096, title="CPUs per node task")
    """`sbatch --cpus-per-task` of the one task per node (torchrun and all its ranks); 0: the
    partition's default."""

    mem: str | None = Field(default=None, max_length=16, pattern=r"^[1-9][0-9]*[KMGT]?$",
                            json_schema_extra={"pattern_help": "a size such as 64G or 512000M"})
    """`sbatch --mem` per node: `64G`, `512000M`."""

    sbatch_args: tuple[str, ...] = Field(default=(), strict=False, title="More sbatch options")
    """More `sbatch` options, one argv word each (`["--qos=high", "--exclusive"]`), never shell
    text. Options runyard sets itself (job name, output, signal, nodes and the fields above) are
    refused. Submitted from the UI, only scheduling options that name no file or program
    (`--qos=high`, `--constraint=a100`, `--exclusive`, ...), each with its value after `=`."""

    @field_validator("sbatch_args")
    @classmethod
    def _sbatch_args(cls, value: tuple[str, ...]) -> tuple[str, ...]:
        problems = [f"{arg!r}: {why}" for arg in value if (why := sbatch_arg_problem(arg))]
        if problems:
            raise ValueError("; ".join(problems))
        return value


class TrainConfig(_Section):
    """The training loop."""

    max_steps: int = Field(default=300, ge=1, le=INT64_MAX, json_schema_extra=_BUILT_IN)
    """Optimizer steps to run; the run succeeds when the last one completes."""

    batch_size: int = Field(default=64, ge=1, le=INT64_MAX, json_schema_extra=_BUILT_IN)
    """Samples per step per rank (the global batch is batch_size x ranks)."""

    lr: float = Field(default=0.001, gt=0, allow_inf_nan=False, title="Learning rate", json_schema_extra=_BUILT_IN)
    """Learning rate of the Adam optimizer."""

    weight_decay: float = Field(default=0.0, ge=0, allow_inf_nan=False, json_schema_extra=_BUILT_IN)
    """AdamW weight decay (0: plain Adam). AdamW is fused on CUDA."""

    warmup_steps: int = Field(default=0, ge=0, le=INT64_MAX, json_schema_extra=_BUILT_IN)
    """Linear learning-rate warm-up from 0 over this many steps."""

    lr_schedule: Literal["constant", "cosine"] = Field(
        default="constant", title="Learning-rate schedule", json_schema_extra=_BUILT_IN
    )
    """After warm-up: keep `lr`, or decay it along a cosine to `min_lr` at max_steps."""

    min_lr: float = Field(
        default=0.0, ge=0, allow_inf_nan=False, title="Minimum learning rate", json_schema_extra=_BUILT_IN
    )
    """Floor of the cosine schedule."""

    clip_grad_norm: float = Field(default=0.0, ge=0, allow_inf_nan=False, json_schema_extra=_BUILT_IN)
    """Clip the global gradient norm to this value (0: no clipping; the norm is reported anyway)."""

    precision: Literal["fp32", "bf16", "fp16"] = Field(default="fp32", json_schema_extra=_BUILT_IN)
    """Autocast precision of the forward pass; fp16 adds a GradScaler whose scale is reported."""

    compile: bool = Field(default=False, json_schema_extra=_BUILT_IN)
    """torch.compile the model: the whole model under DDP or one rank, each block under FSDP.
    The first steps are slower while it compiles."""

    activation_checkpointing: bool = Field(default=False, json_schema_extra={"kinds": ["gpt-char"]})
    """Recompute each block's activations in the backward pass to save memory (gpt-char)."""

    grad_accum: int = Field(
        default=1, ge=1, le=INT64_MAX, title="Gradient accumulation (micro-batches)", json_schema_extra=_BUILT_IN
    )
    """Micro-batches of `batch_size` accumulated per optimizer step (DDP skips the gradient
    all-reduce on all but the last). The effective per-rank batch is batch_size x grad_accum."""

    seed: int = Field(default=0, ge=0, le=SEED_MAX, json_schema_extra=_BUILT_IN)
    """Seed of every random generator; all ranks use the same model seed."""

    log_every: int = Field(default=10, ge=1, le=INT64_MAX, json_schema_extra=_BUILT_IN)
    """Report per-rank training metrics every this many steps."""

    eval_every: int = Field(default=100, ge=0, le=INT64_MAX, json_schema_extra=_BUILT_IN)
    """Evaluate on the held-out split every this many steps (0: only at the end)."""

    deterministic: bool = Field(default=False, json_schema_extra=_BUILT_IN)
    """Use torch's deterministic algorithms (and seeded data order), so that a resumed run
    repeats the uninterrupted one bit for bit; may be slower on GPU."""


class CheckpointConfig(_Section):
    """When checkpoints are written and which are kept."""

    model_config = ConfigDict(
        frozen=True, extra="forbid", use_attribute_docstrings=True, validate_default=True, populate_by_name=True,
        strict=True,
    )

    every_steps: int = Field(default=100, ge=0, le=INT64_MAX, title="Save every (steps)")
    """Save every this many steps (0: not by steps). A final checkpoint is always written at the
    end of the run."""

    every_seconds: float = Field(default=0.0, ge=0, allow_inf_nan=False, title="Save every (seconds)")
    """Also save when this many seconds passed since the last save (0: not by time)."""

    keep_last: int = Field(default=3, ge=0, le=INT64_MAX)
    """Keep the newest this many checkpoints (0: keep all)."""

    keep_best: int = Field(default=1, ge=0, le=INT64_MAX)
    """Also keep the best this many by `best_metric`."""

    best_metric: str = Field(default="eval_loss", min_length=1)
    """Metric that ranks checkpoints for `keep_best` (any reported metric name)."""

    best_mode: Literal["min", "max"] = "min"
    """Whether a lower (`min`) or higher (`max`) `best_metric` is better."""

    async_save: bool = Field(default=True, alias="async", title="Write in the background (async)")
    """Write in a background thread, which also copies the state to CPU memory while the next
    step's forward and backward run (the loop waits only if the copy is not done by the next
    optimizer step); `false` writes synchronously, for debugging. Key: `async`."""


class ParallelConfig(_Section):
    """How the model is spread over the ranks."""

    strategy: Literal["ddp", "fsdp"] = Field(default="ddp", json_schema_extra={"kinds": ["gpt-char"]})
    """`ddp`: every rank holds the whole model. `fsdp`: FSDP2 (`fully_shard` per block, then the
    root) with sharded checkpoints (gpt-char)."""


class RetryConfig(_Section):
    """What happens when an attempt fails."""

    max_retries: int = Field(default=3, ge=0, le=INT64_MAX)
    """New attempts after failures, counted over the whole run. Preemptions (a SIGTERM that
    runyard did not send) do not count. Errors that would recur stop the run at once."""

    backoff_s: float = Field(default=5.0, ge=0, allow_inf_nan=False)
    """Wait before the first retry; doubled for each further retry, with jitter."""

    backoff_max_s: float = Field(default=300.0, ge=0, allow_inf_nan=False)
    """Upper bound of the wait between attempts."""


class SupervisionConfig(_Section):
    """How the scheduler watches a running attempt."""

    hang_timeout_s: float = Field(default=300.0, gt=0, allow_inf_nan=False)
    """An attempt with no completed step for max(hang_timeout_s, hang_step_factor x p95 step
    time) is hung: the stacks of every rank are saved, then it is killed and retried."""

    hang_step_factor: float = Field(default=20.0, gt=0, allow_inf_nan=False)
    """See hang_timeout_s: slow steps raise the threshold so a slow run is not called hung."""

    startup_timeout_s: float = Field(default=600.0, gt=0, allow_inf_nan=False)
    """An attempt whose first step has not completed this long after launch is hung (start-up:
    imports, rendezvous, data loading, compilation); the same allowance covers the final save
    and tear-down after the last step."""

    grace_s: float = Field(default=30.0, ge=0, allow_inf_nan=False)
    """On cancel, pause or preemption the ranks get SIGTERM, finish the step and the next
    (the ranks agree to stop one step late, at the same step), write a checkpoint and exit;
    after this many seconds they get SIGKILL."""

    straggler_ratio: float = Field(default=1.2, ge=0, allow_inf_nan=False)
    """A rank whose time to the gradient sync (its own work between two DDP gradient all-reduces:
    data wait, optimizer, forward, backward up to the first gradient bucket) stays above this
    multiple of the other ranks' median (and by 5 ms or more) over `straggler_window_steps`
    steps, and for that many steps again and `straggler_sustain_s` seconds, is reported once as a
    straggler (a warning event). 0: off; otherwise above 1. Not measured under FSDP."""

    straggler_window_steps: int = Field(default=20, ge=1, le=INT64_MAX)
    """Steps the straggler check takes medians over, and how many steps a rank must stay slow."""

    straggler_sustain_s: float = Field(default=30.0, ge=0, allow_inf_nan=False)
    """Seconds a rank must also stay slow before it is called a straggler (and fine again before
    the episode ends). On a busy machine which rank is slow moves every few seconds; a slow device
    or a rank's slow data loader stays."""

    desync_check_every: int = Field(default=100, ge=0, le=INT64_MAX)
    """Every this many steps the ranks compare a checksum of their parameters (exact: the raw
    bits summed as integers), carried in the metrics all-gather. DDP replicas must agree bit for
    bit; a rank that differs from rank 0 is reported as an error event. 0: off. Skipped under
    FSDP, where every rank holds a different shard."""

    @field_validator("straggler_ratio")
    @classmethod
    def _off_or_above_one(cls, ratio: float) -> float:
        if 0 < ratio <= 1:
            raise ValueError("must be 0 (off) or above 1")
        return ratio


# -- alerts (issue 28; orchestrator/alerts/) ---------------------------------------------------
# Every trigger, in the order messages and the UI list them; DEFAULT_TRIGGERS are on unless the
# global defaults (`runyard alerts defaults`, Settings) or a run's [alerts] say otherwise.
TRIGGERS = ("failed", "retrying", "hang", "nonfinite", "stalled", "eta_slip", "gpu_idle", "budget", "finished",
            "scheduler")
DEFAULT_TRIGGERS = ("failed", "retrying", "hang", "nonfinite", "stalled", "gpu_idle", "budget")


def trigger_problem(name: str) -> str | None:
    """Why ``name`` is not a trigger, or None."""
    return None if name in TRIGGERS else f"not a trigger (one of: {', '.join(TRIGGERS)})"


class AlertsConfig(_Section):
    """What runyard tells about this run, and where (docs/ALERTS.md): these keys change the global defaults."""

    enabled: bool = True
    """false: no alert about this run at all."""

    on: tuple[str, ...] = Field(default=(), strict=False, title="Triggers turned on")
    """Triggers turned on for this run beyond the defaults, e.g. `["finished", "eta_slip"]`."""

    off: tuple[str, ...] = Field(default=(), strict=False, title="Triggers turned off")
    """Triggers turned off for this run, e.g. `["gpu_idle"]`."""

    channels: tuple[str, ...] = Field(default=(), strict=False)
    """Ids of the channels (`runyard alerts ls`) this run's alerts go to, e.g. `["1", "3"]`; empty: every channel."""

    repeat_s: float = Field(default=3600.0, ge=0, allow_inf_nan=False, title="Repeat every (s)")
    """An alert still true is sent again after this many seconds (0: never again)."""

    nonfinite_metrics: tuple[str, ...] = Field(default=("loss",), strict=False, title="Watched metrics")
    """`nonfinite` fires when one of these metrics is NaN or infinite on any rank; `["*"]`: every metric."""

    stalled_factor: float = Field(default=10.0, gt=1, allow_inf_nan=False)
    """`stalled` fires when no step completed for this multiple of the run's median step time
    (and at least `stalled_min_s`) while its processes live."""

    stalled_min_s: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    """See `stalled_factor`."""

    eta_slip_ratio: float = Field(default=0.25, gt=0, allow_inf_nan=False)
    """`eta_slip` fires when the run is expected to end this share of its planned duration later
    than its first steady ETA said (0.25: a 4-hour run now ending more than an hour late)."""

    gpu_idle_percent: float = Field(default=5.0, ge=0, le=100, allow_inf_nan=False, title="GPU idle below (%)")
    """`gpu_idle` fires when every GPU the run holds stays under this utilisation for `gpu_idle_s`."""

    gpu_idle_s: float = Field(default=600.0, gt=0, allow_inf_nan=False, title="GPU idle for (s)")
    """See `gpu_idle_percent`."""

    budget_usd: float = Field(default=0.0, ge=0, allow_inf_nan=False, title="Budget (USD)")
    """`budget` fires when the run's cost passes 50%, 80% and 100% of this amount. 0: no budget."""

    budget_pause: bool = False
    """true: pause the run (a checkpoint, then stop; Resume continues) when its cost reaches 100% of `budget_usd`."""

    @field_validator("channels")
    @classmethod
    def _channel_ids(cls, ids: tuple[str, ...]) -> tuple[str, ...]:
        for value in ids:
            if not value.isdigit():
                raise ValueError(f"{value!r}: not a channel id (a number that `runyard alerts ls` shows)")
        return ids

    @field_validator("on", "off")
    @classmethod
    def _known_triggers(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            problem = trigger_problem(name)
            if problem:
                raise ValueError(f"{name!r}: {problem}")
        return names


class RunConfig(_Section):
    """A training run."""

    @model_validator(mode="after")
    def _compatible(self, info: ValidationInfo) -> RunConfig:
        """Options a workload cannot honour are refused up front, not ignored (all of them at once)."""
        if not lenient(info) and (problems := compatibility_problems(self)):
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self

    name: str = Field(
        default="run", min_length=1, max_length=100, pattern=r"^[A-Za-z0-9][A-Za-z0-9._-]*$",
        json_schema_extra={"pattern_help": "letters, digits, '.', '_' and '-', starting with a letter or digit "
                                           "(no spaces)"},
    )
    """Name shown in the dashboard: letters, digits, `.`, `_`, `-`; not unique."""

    tags: tuple[str, ...] = Field(default=(), strict=False)
    """Free-form labels for filtering the runs list."""

    # "common": the New run page shows these sections open, the others folded.
    workload: WorkloadConfig = Field(default=WorkloadConfig(), json_schema_extra={"common": True})
    launch: LaunchConfig = Field(default=LaunchConfig(), json_schema_extra={"common": True})
    train: TrainConfig = Field(default=TrainConfig(), json_schema_extra={"common": True})
    parallel: ParallelConfig = Field(default=ParallelConfig(), json_schema_extra={"common": True})
    checkpoint: CheckpointConfig = CheckpointConfig()
    retry: RetryConfig = RetryConfig()
    supervision: SupervisionConfig = SupervisionConfig()
    slurm: SlurmConfig = SlurmConfig()
    alerts: AlertsConfig = AlertsConfig()

    def as_dict(self) -> dict[str, Any]:
        """The config as plain data, with the TOML key names."""
        return self.model_dump(mode="json", by_alias=True)

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
    if c.launch.executor == "slurm" and c.workload.stop_signal != "SIGTERM":
        problems.append(f"workload.stop_signal = {c.workload.stop_signal!r} is for launch.executor = 'local'; "
                        "on Slurm a pause or cancel sends SIGTERM (scancel --signal=TERM)")
    if c.launch.executor != "slurm" and c.slurm != SlurmConfig():
        changed = sorted(c.slurm.model_dump(exclude_defaults=True))
        problems.append(f"slurm.{changed[0]} is set but launch.executor = {c.launch.executor!r}: the [slurm] "
                        "settings apply to launch.executor = 'slurm' only")
    return problems


def _location(loc: tuple[Any, ...]) -> str:
    return ".".join(str(part) for part in loc) or "(top level)"


# Strict types refuse what lax parsing would have guessed; say how to write it instead.
_STRICT_HINTS = {
    "int_type": " (a whole number, written without a decimal point or exponent: 1000, not 1e3 or 1000.0)",
    "bool_type": " (true or false, without quotes)",
    "float_type": " (a number, without quotes)",
}


def _describe(err: ErrorDetails) -> list[str]:
    field = _location(err["loc"])
    if err["type"] == "value_error" and isinstance(err["input"], dict):  # checks across fields, one per line
        messages = err["msg"].removeprefix("Value error, ").split(PROBLEM_SEPARATOR)
        return [f"{field}: {message}" if err["loc"] else message for message in messages]
    if err["type"] == "extra_forbidden":
        return [f"{field}: unknown key (value {err['input']!r}); check the spelling against docs/CONFIG.md"]
    if err["type"] == "string_pattern_mismatch" and (hint := _pattern_help(err["loc"])):
        return [f"{field} = {err['input']!r}: use {hint}"]
    message = err["msg"].removeprefix("Value error, ")
    return [f"{field} = {err['input']!r}: {message}{_STRICT_HINTS.get(err['type'], '')}"]


def _problems(exc: ValidationError) -> list[str]:
    return [problem for err in exc.errors() for problem in _describe(err)]


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
            kinds = field_kinds(model, name)
            value = getattr(section, name)
            if kinds is None or kind in kinds or value == info.get_default(call_default_factory=True):
                continue
            key = f"{section_name}.{info.alias or name}"
            what = (info.title or name.replace("_", " ")).lower()
            where = "the built-in workloads" if sorted(kinds) == sorted(BUILT_IN_KINDS) else " and ".join(kinds)
            problems.append(f"{key} = {value!r} applies to {where} only; a script sets its own {what}")
    return problems


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
            locs = [tuple(err["loc"]) for err in exc.errors()]
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
        return tomllib.loads(text)
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


def parse_override(item: str) -> tuple[list[str], Any]:
    """Parse one ``--set key.path=value`` override; the value is read as a TOML value, or as a
    plain string when it is not one."""
    if "=" not in item:
        raise ConfigError([f"--set {_shorten(item)!r}: expected key=value, for example train.lr=0.0005"])
    key, raw = item.split("=", 1)
    key = key.strip()
    if not key or any(not part for part in key.split(".")):
        raise ConfigError([f"--set {_shorten(item)!r}: empty key"])
    try:
        value = _loads(f"v = {raw}", f"--set {key}={_shorten(raw)}")["v"]
    except tomllib.TOMLDecodeError:
        value = raw
    check_plain(value, f"--set {key}")
    return key.split("."), value


def deep_merge(base: dict[str, Any], changes: dict[str, Any]) -> dict[str, Any]:
    """``base`` with ``changes`` merged in, table by table (neither is modified)."""
    out = json.loads(json.dumps(base))
    for key, value in changes.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def apply_overrides(data: dict[str, Any], overrides: list[str]) -> dict[str, Any]:
    """Return a copy of ``data`` with ``--set`` overrides applied."""
    out = json.loads(json.dumps(data))
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
    return RunConfig.model_validate_json(text)


def write_config_file(path: Path, config: RunConfig) -> None:
    """Write ``config`` as indented JSON to ``path``, whole or not at all (a file beside it,
    renamed over it): what :func:`config_from_json` reads back."""
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(json.dumps(config.as_dict(), indent=2))
    os.replace(tmp, path)


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
        "Generated from `db/config.py` by `runyard config-reference`; a test keeps it equal.",
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
            if isinstance(ann, type) and issubclass(ann, BaseModel):
                continue
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
    return "\n".join(lines)


def field_of(problem: str) -> str:
    """The dotted field a problem message names (``"train.lr = -1: ..."`` -> ``"train.lr"``);
    empty when it names none."""
    head = problem.split(" = ", 1)[0] if " = " in problem.split(":", 1)[0] else problem.split(":", 1)[0]
    head = head.strip()
    return head if head and " " not in head else ""
