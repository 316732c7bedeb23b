"""Where everything lives on disk: the one owner of every path and file name of the data folder.

The scheduler, the launcher shim, the ranks, the UI and the CLI all read and write these files;
they agree because they take the names from here and nowhere else::

    $RUNYARD_HOME/
        runyard.db            the SQLite database (unless RUNYARD_DB_URL names another)
        migrate.lock          held while migrations run (db/engine.py)
        scheduler.lock        held by the one running scheduler
        scheduler.json        the scheduler's heartbeat file, inventory included (db/vocabulary/scheduler_file.py)
        token                 the UI's access token, mode 0600 (orchestrator/ui_access.py)
        scrape_token          the read-only token of GET /metrics, mode 0600 (app/server/prometheus.py)
        ui.json               where the running UI listens (for `runyard token`)
        alerts.json           alert channels (URLs, webhook secrets) and defaults, mode 0600 (orchestrator/alerts)
        settings.toml         the owner's settings, a table per concern ([cost]: your price), mode 0600
                              (db/vocabulary/settings_file.py)
        runs/run-000042/
            config.json       the run config as submitted, for a person: runyard reads the database's
                              copy (runs.config_json), and this file only as the mark that the folder
                              is whole (orchestrator/scheduler/storage.py's run_dir_deleted)
            checkpoints/step-<N>/{state.pt, manifest.json}   a whole state, written by rank 0
            checkpoints/step-<N>/{__<rank>_0.distcp, .metadata, unsharded.pt, manifest.json}
                              a sharded (FSDP) state: each rank's shards and DCP's metadata, and
                              what is not sharded (trainer/checkpoint/sharded.py)
            checkpoints/superseded/attempt-<n>/step-<N>/   a lineage abandoned by a resume
            checkpoints/script/<id>/<file>   a copy of a script's own checkpoint file (pinned, or
                              kept aside before runyard put an older version back for a resume)
            attempts/<n>/
                config.json   the attempt's effective config (the run's, plus its overrides): what
                              its ranks read
                launch.json   the shim's pid and create time, then torchrun's (orchestrator/executors/shim.py)
                exit.json     torchrun's exit code, written by the shim when it ends
                launcher.log  torchrun's own output (its failure summary is read from here)
                ranks/        torchrun --log-dir: each rank's stdout/stderr and error file, and a
                              ranks.json mapping local to global ranks (ranks/node-<n>/ per node
                              when a local run has several nodes)
                stopped.json  the ranks stopped gracefully (SIGTERM), with the step
                finished/rank-<r>.json   rank r's work is durable (metrics flushed, last save done)
                stacks/       stack dumps (SIGUSR1 faulthandler files rank-<r>.txt, py-spy output, or
                              rank-<r>-not-taken.txt: why a plain script rank's stack was not taken)

Nothing here imports anything but the standard library: every process may use it.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

# -- the data folder -------------------------------------------------------------------------
DB_FILE = "runyard.db"
MIGRATE_LOCK_FILE = "migrate.lock"
SCHEDULER_LOCK_FILE = "scheduler.lock"
SCHEDULER_FILE = "scheduler.json"
TOKEN_FILE = "token"  # noqa: S105 - the token file's name, not a secret
SCRAPE_TOKEN_FILE = "scrape_token"  # noqa: S105 - the file's name, not a secret
UI_FILE = "ui.json"
ALERTS_FILE = "alerts.json"
SETTINGS_FILE = "settings.toml"
RUNS_DIR = "runs"

# -- a run's folder --------------------------------------------------------------------------
CONFIG_FILE = "config.json"
CHECKPOINTS_DIR = "checkpoints"
SUPERSEDED_DIR = "superseded"
SCRIPT_COPIES_DIR = "script"
ATTEMPTS_DIR = "attempts"
# The wandb stand-in's step counter per rank, kept across attempts (orchestrator/scripts/shims/wandb
# spells it too, as STATE_DIR: it runs in the script's interpreter, without runyard).
WANDB_SHIM_DIR = "wandb-shim"
CPU_PEAK_FILE = "cpu_peak.json"  # this host's measured CPU FLOP/s, kept for the run's retries (trainer/techniques.py)

# -- a checkpoint's folder -------------------------------------------------------------------
STATE_FILE = "state.pt"
UNSHARDED_FILE = "unsharded.pt"  # a sharded checkpoint's part that is not sharded
MANIFEST_FILE = "manifest.json"
STEP_DIR = re.compile(r"step-(0|[1-9][0-9]*)")

# -- an attempt's folder ---------------------------------------------------------------------
LAUNCH_RECORD = "launch.json"
EXIT_FILE = "exit.json"
FAILURE_FILE = "failure.json"  # the agent's first sight of a failed rank (trainer/agent/torchrun.py)
LAUNCHER_LOG = "launcher.log"
RANK_LOG_DIR = "ranks"
RANK_MAP_FILE = "ranks.json"  # beside torchrun's local-rank log folders: {"<local rank>": <global rank>}
STOPPED_FILE = "stopped.json"
FINISHED_DIR = "finished"
STACKS_DIR = "stacks"


def run_dir_name(run_id: int) -> str:
    """``run-000042``: the folder of run 42 under ``runs/``."""
    return f"run-{run_id:06d}"


def step_dir_name(step: int) -> str:
    """``step-200``: the folder of the checkpoint taken after step 200."""
    return f"step-{step}"


@dataclass(frozen=True)
class RunPaths:
    """The files of one run, under ``root`` (``runs/run-000042``)."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def checkpoints(self) -> Path:
        return self.root / CHECKPOINTS_DIR

    @property
    def cpu_peak(self) -> Path:
        return self.root / CPU_PEAK_FILE

    def attempt(self, number: int) -> AttemptPaths:
        return AttemptPaths(self.root / ATTEMPTS_DIR / str(number))

    def script_copy(self, checkpoint_id: int, name: str) -> Path:
        """Where the copy of a script's own checkpoint file (checkpoint row ``checkpoint_id``, file
        name ``name``) lives, out of the script's reach: ``checkpoints/script/<id>/<name>``."""
        return self.checkpoints / SCRIPT_COPIES_DIR / str(checkpoint_id) / name


def superseded_dir(checkpoints: Path, attempt: int) -> Path:
    """Where a resume into attempt ``attempt`` moves the newer checkpoints it abandons."""
    return checkpoints / SUPERSEDED_DIR / f"attempt-{attempt}"


@dataclass(frozen=True)
class AttemptPaths:
    """The files of one attempt, under ``root`` (``runs/run-000042/attempts/3``)."""

    root: Path

    @property
    def config(self) -> Path:
        return self.root / CONFIG_FILE

    @property
    def exit_file(self) -> Path:
        return self.root / EXIT_FILE

    @property
    def failure_file(self) -> Path:
        return self.root / FAILURE_FILE

    @property
    def launcher_log(self) -> Path:
        return self.root / LAUNCHER_LOG

    @property
    def ranks(self) -> Path:
        return self.root / RANK_LOG_DIR

    @property
    def stopped(self) -> Path:
        return self.root / STOPPED_FILE

    @property
    def finished(self) -> Path:
        return self.root / FINISHED_DIR

    @property
    def stacks(self) -> Path:
        return self.root / STACKS_DIR
