"""[workload]: what runs (a built-in workload or a script) and its model settings."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, ValidationInfo, model_validator

from db.vocabulary.config.base import (
    INT64_MAX,
    MODULE_PATTERN,
    PROBLEM_SEPARATOR,
    _Section,
    env_name_problem,
    field_kinds,
    lenient,
    relative_path_problem,
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
