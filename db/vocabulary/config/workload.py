"""[workload]: what runs (a built-in workload or a script) and its model settings.

One model per kind, each with its own fields only; :data:`WorkloadConfig` is their union,
chosen by ``kind`` (``"mlp-digits"`` when absent). A field of another kind in a config a person
writes is refused, naming the kind it belongs to, unless it holds its default (the form sends
every field); a config runyard stored (before the union: one flat model, every kind's fields)
loads whatever they hold, since no run ever read another kind's fields.

The union is also the one place that says which keys of the other sections a kind's code reads:
each class names the ones it ignores (``ignores``: the built-in workloads' [train] and [parallel]
keys it has no use for; all of them for a script). Those take their defaults for it: the New run
form hides them (app/form.py), and a script run that sets one is refused
(:func:`~db.vocabulary.config.run.kind_problems`), both through :func:`kinds_reading`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Annotated, Any, ClassVar, Literal, TypeVar

from pydantic import BeforeValidator, Discriminator, Field, ValidationInfo, model_validator

from db.vocabulary.config.base import (
    INT64_MAX,
    MODULE_PATTERN,
    PROBLEM_SEPARATOR,
    _Section,
    env_name_problem,
    lenient,
    relative_path_problem,
)


class Workload(_Section):
    """What to train: `kind` chooses the workload (default: "mlp-digits"), and only that kind's
    keys apply; a key of another kind is refused unless it holds its default."""

    # The keys of the other sections ("train.lr"), or whole sections ("train"), that this kind's
    # code never reads: they keep their defaults for it (see the module's docstring).
    ignores: ClassVar[tuple[str, ...]] = ()

    @model_validator(mode="after")
    def _kind_fields(self, info: ValidationInfo) -> Workload:
        if not lenient(info) and (problems := workload_problems(self)):
            raise ValueError(PROBLEM_SEPARATOR.join(problems))
        return self


class MlpDigitsWorkload(Workload):
    """kind = "mlp-digits": an MLP classifier on scikit-learn's bundled 8x8 digits data set."""

    # An MLP has no blocks to recompute, nor to shard with FSDP.
    ignores: ClassVar[tuple[str, ...]] = ("train.activation_checkpointing", "parallel.strategy")

    kind: Literal["mlp-digits"] = Field(default="mlp-digits", title="Workload")
    """`mlp-digits`: an MLP classifier on scikit-learn's bundled 8x8 digits data set (1797
    images, no download)."""

    hidden: int = Field(default=256, ge=8, le=65536, title="Hidden width")
    """Width of the MLP's two hidden layers (mlp-digits)."""


class GptCharWorkload(Workload):
    """kind = "gpt-char": a character-level GPT on a text file."""

    kind: Literal["gpt-char"] = Field(default="gpt-char", title="Workload")
    """`gpt-char`: a character-level GPT on a text file (default: the Python standard library's
    own sources)."""

    text: str | None = Field(default=None, title="Text file")
    """Text file to train gpt-char on (default: the Python standard library's sources): a
    readable regular file of at most 256 MiB, read as UTF-8 (every rank holds it in memory); a
    relative path is resolved against the directory `runyard submit` runs in. Submitted from the
    UI, it must lie under the allowed roots, like `script`."""

    n_layer: int = Field(default=4, ge=1, le=96, title="Transformer blocks (n_layer)")
    """gpt-char: transformer blocks."""

    n_head: int = Field(default=4, ge=1, le=128, title="Attention heads (n_head)")
    """gpt-char: attention heads per block; must divide n_embd."""

    n_embd: int = Field(default=128, ge=8, le=16384, title="Embedding width (n_embd)")
    """gpt-char: embedding width."""

    block_size: int = Field(default=128, ge=8, le=8192, title="Context length (block_size)")
    """gpt-char: context length in characters."""


class ScriptWorkload(Workload):
    """kind = "script": your own torchrun-ready script or module, launched as it is."""

    # A script has its own loop, optimizer and flags: it would silently ignore runyard's.
    ignores: ClassVar[tuple[str, ...]] = ("train", "parallel")

    kind: Literal["script"] = Field(default="script", title="Workload")
    """`script`: your own torchrun-ready script (`script`, `args`)."""

    script: str | None = Field(default=None)
    """Path of the training script to launch under torchrun (kind = "script"); a relative path
    is resolved against the directory `runyard submit` runs in. It needs no change: runyard reads
    its printed lines, TensorBoard files, wandb calls and checkpoint files (docs/SCRIPTS.md); `import
    runyard` (the SDK) adds per-rank metrics and checkpoints of runyard's own. Submitted from the
    UI, it must lie under the allowed roots (`RUNYARD_SCRIPT_ROOTS`, else the folder `runyard up`
    started in and the data folder), resolved after symlinks."""

    module: str | None = Field(
        default=None, max_length=200, pattern=MODULE_PATTERN, title="Module (python -m)",
        json_schema_extra={"pattern_help": "a dotted module name such as pkg.train"},
    )
    """Instead of `script`: a module to run as `python -m MODULE` (e.g. `pkg.train`), found
    from `workdir` first, then the interpreter's own path (kind = "script"). Submitted from the
    UI, every file that could provide it must be a `.py` under the allowed roots, none in the
    standard library, site-packages or runyard's packages (so not `timeit`, `runpy`, `torch.*`)."""

    args: tuple[str, ...] = Field(
        default=(), strict=False, title="Script arguments",
        json_schema_extra={"list_syntax": "shell"},
    )
    """Command-line arguments passed to the script (kind = "script")."""

    workdir: str | None = Field(default=None, title="Working directory")
    """The folder the ranks run in, where the script's relative paths (`data/`, `out/`,
    `configurator.py`) are found (kind = "script"). Default: the folder `runyard submit` ran in;
    from the UI, the script's own folder. A relative path is resolved against the folder
    `runyard submit` runs in; from the UI, it must lie under the allowed roots."""

    env: dict[str, str] = Field(
        default_factory=dict, title="Environment variables"
    )
    """Environment variables for the ranks, as a table (`[workload.env]`, `OMP_NUM_THREADS =
    "8"`), over the environment `runyard up` started with (kind = "script"). Names runyard sets
    itself (`RANK`, `MASTER_PORT`, `CUDA_VISIBLE_DEVICES`, `RUNYARD_*` but `RUNYARD_WANDB_SHIM`)
    are refused. Without `OMP_NUM_THREADS` here, it is the machine's cores divided by the ranks."""

    python: str | None = Field(default=None, title="Python interpreter")
    """The interpreter the ranks run (kind = "script"): a `python` executable or a virtual
    environment's folder (its `bin/python`), so a script with its own dependencies runs with
    them. It must have torch. Default: runyard's own interpreter. Submitted from the UI, it must
    lie under the allowed roots and be an interpreter (`python`, `python3`, `python3.X`)."""

    max_steps: int = Field(default=0, ge=0, le=INT64_MAX, title="Total steps")
    """The step the script ends at, for progress and ETA (kind = "script"). 0: the total the
    script reports (`RUNYARD {"total": N}`), else unknown."""

    checkpoint_glob: str | None = Field(default=None, title="Checkpoint files")
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
        default=None, min_length=1, max_length=100, title="Step key in checkpoints")
    """The top-level key of the script's `torch.save` dict that holds its step, when it is none of
    `global_step`, `iter_num`, `step`, `iteration` (e.g. `STEPS_RUN`); needs `checkpoint_glob`
    (kind = "script")."""

    resume_args: tuple[str, ...] = Field(
        default=(), strict=False, title="Resume arguments",
        json_schema_extra={"list_syntax": "shell"},
    )
    """Arguments appended to `args` only when an attempt resumes from one of the script's
    checkpoints (e.g. `--init_from=resume`; kind = "script"). Needs `checkpoint_glob`."""

    tensorboard_dir: str | None = Field(default=None, title="TensorBoard folder")
    """The folder the script writes TensorBoard event files to, relative to `workdir` or
    absolute; its
    scalars become the run's metrics, each tag on its own step counter (kind = "script").
    Default: any `runs/`, `lightning_logs/` or `tb/` folder under `workdir`."""

    stdout_metrics: dict[str, str] = Field(
        default_factory=dict, title="Metrics from printed lines"
    )
    """For a script that only prints: metric name -> regular expression with the named groups
    `step` and `value`, matched against each line the ranks print (`[workload.stdout_metrics]`,
    `loss = 'iter (?P<step>\\d+): loss (?P<value>[\\d.]+)'`; kind = "script")."""

    stop_signal: Literal["SIGTERM", "SIGINT", "SIGHUP", "SIGUSR1", "SIGUSR2"] = Field(
        default="SIGTERM", title="Stop signal")
    """The signal a pause or a cancel sends the script's ranks first; SIGKILL follows after
    `supervision.grace_s` (kind = "script"). Pick the one the script stops cleanly on:
    SIGTERM for runyard's SDK and for a script with its own handler; SIGINT for Lightning outside
    Slurm (its graceful shutdown on KeyboardInterrupt; its SIGTERM handler only sets a flag: it
    resumes from its last `ModelCheckpoint` save, and `OnExceptionCheckpoint`, which saves from
    the exception handler, can deadlock several ranks: docs/frameworks.md) and for a script that
    catches KeyboardInterrupt; none saves a Hugging Face `Trainer`, nanoGPT or the DDP tutorial
    (they resume from their last periodic save). SIGTERM, SIGINT and SIGHUP go to torchrun's agent too,
    which passes them on; SIGUSR1 and SIGUSR2 go to the ranks alone. Local executor only."""



# The kinds, in the order the form offers them; the first is the default.
WORKLOADS: tuple[type[Workload], ...] = (MlpDigitsWorkload, GptCharWorkload, ScriptWorkload)


def kind_of(model: type[Workload]) -> str:
    """The ``kind`` a workload class stands for."""
    return str(model.model_fields["kind"].default)


WORKLOAD_KINDS: tuple[str, ...] = tuple(kind_of(model) for model in WORKLOADS)
DEFAULT_KIND = WORKLOAD_KINDS[0]


def workload_class(kind: str) -> type[Workload] | None:
    """The workload class for ``kind``, or None for an unknown kind."""
    return next((model for model in WORKLOADS if kind_of(model) == kind), None)


def kinds_with_field(name: str) -> list[str]:
    """The kinds that have the field ``name`` (empty: no kind has it)."""
    return [kind_of(model) for model in WORKLOADS if name in model.model_fields]


# The workloads runyard ships: the kinds that read runyard's training settings.
BUILT_IN_KINDS = [kind_of(MlpDigitsWorkload), kind_of(GptCharWorkload)]


def reads(model: type[Workload], key: str) -> bool:
    """Whether workload ``model``'s code reads ``key`` (``"train.lr"``), a key of another section."""
    return key not in model.ignores and key.split(".", 1)[0] not in model.ignores


def kinds_reading(key: str, workloads: Sequence[type[Workload]] = WORKLOADS) -> list[str] | None:
    """The kinds among ``workloads`` whose code reads ``key`` of another section (``"train.lr"``);
    None when every one of them does. What the New run form shows for a kind and what
    :func:`~db.vocabulary.config.run.kind_problems` refuses for it both come from here."""
    kinds = [kind_of(model) for model in workloads if reads(model, key)]
    return None if len(kinds) == len(workloads) else kinds


def _plain(value: Any) -> Any:
    return list(value) if isinstance(value, tuple) else value


# Read once (every stored config passes through _kind_and_own_fields): each kind's own keys, and
# the defaults the other kinds give the keys it does not have, as JSON and TOML hold them.
_OWN_KEYS = {kind_of(model): frozenset(model.model_fields) for model in WORKLOADS}
_OTHER_DEFAULTS = {
    kind_of(own): {name: [_plain(m.model_fields[name].get_default(call_default_factory=True))
                          for m in WORKLOADS if m is not own and name in m.model_fields]
                   for model in WORKLOADS if model is not own for name in model.model_fields}
    for own in WORKLOADS
}


STORED = "stored"
"""The validation context key :func:`~db.vocabulary.config.reading.config_from_json` sets: the
config is one runyard stored, not one a person wrote."""


def _kind_and_own_fields(data: Any, info: ValidationInfo) -> Any:
    """The kind made explicit (``"mlp-digits"`` when absent), and the keys of other kinds left
    out where they cannot matter: a config a person wrote may hold another kind's keys at their
    defaults (the form sends every field); a stored one (the ``STORED`` context) any value, since
    the one flat model of before kept every kind's fields and never read another kind's (an
    mlp-digits run stored with ``n_layer = 8`` trained an MLP, and must still open). A key of
    another kind set to anything else in a written config stays, for the kind's model to refuse
    (the reading names the kind it is for)."""
    if not isinstance(data, dict):
        return data
    kind = data.get("kind", DEFAULT_KIND)
    own = _OWN_KEYS.get(kind) if isinstance(kind, str) else None
    if own is None:
        return data  # the union names the kinds there are
    others = _OTHER_DEFAULTS[kind]
    stored = bool(info.context and info.context.get(STORED))
    return {"kind": kind} | {name: value for name, value in data.items()
                             if name in own or name not in others
                             or (not stored and _plain(value) not in others[name])}


WorkloadConfig = Annotated[
    MlpDigitsWorkload | GptCharWorkload | ScriptWorkload,
    Discriminator("kind"),
    BeforeValidator(_kind_and_own_fields),
]
"""The [workload] section: one model per kind, chosen by ``kind``."""


_W = TypeVar("_W", bound=Workload)


def workload_as(w: WorkloadConfig, model: type[_W]) -> _W:
    """``w`` as the workload ``model`` stands for, for code that only runs for that kind (the
    gpt-char trainer, a script's launch).

    Raises:
        TypeError: naming both kinds, when ``w`` is of another kind (a caller's mistake).
    """
    if not isinstance(w, model):
        raise TypeError(f"workload.kind = {w.kind!r}: this needs kind = {kind_of(model)!r}")
    return w


def workload_problems(w: Workload) -> list[str]:
    """The [workload] settings that contradict each other, every one of them (a form answers once)."""
    if isinstance(w, GptCharWorkload):
        if w.n_embd % w.n_head:
            return [f"workload.n_embd = {w.n_embd} must be a multiple of workload.n_head = {w.n_head}"]
        return []
    if not isinstance(w, ScriptWorkload):
        return []
    problems: list[str] = []
    if not (w.script or w.module):
        problems.append("workload.script (or workload.module) is required when workload.kind = 'script'")
    if w.script and w.module:
        problems.append(f"workload.script = {w.script!r} and workload.module = {w.module!r}: give one of them")
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
    return problems
