"""[launch] and [slurm]: how torchrun starts the ranks, and where."""

from __future__ import annotations

from typing import Literal

from pydantic import Field, field_validator

from db.vocabulary.config.base import _Section


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

    warm_start: bool = Field(default=True, title="Warm start")
    """The built-in workloads: torchrun's agent imports torch and the trainer once and forks
    each rank from itself, instead of every rank importing them anew (about 2 s of CPU per rank
    on a small machine). A rank looks the same from outside (its environment, command line and
    logs). `false` starts every rank as a fresh interpreter. Scripts always start fresh."""

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
