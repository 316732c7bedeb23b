"""Every field of the run config, by what a UI submission may put in it: the fields that name
something the ranks or runyard run or read (:data:`GUARDED_FIELDS`, each with the rule the UI
applies: orchestrator/scripts/allowed_roots.py), and the fields that cannot name one
(:data:`INERT_FIELDS`, each with the reason); docs/SECURITY.md lists the same, field by field."""

from __future__ import annotations

# Every field of RunConfig, by what a UI submission may put in it ("section.key", TOML keys).
# GUARDED_FIELDS name something the ranks or runyard run or read, each with the rule the UI
# applies; INERT_FIELDS cannot name one, each with the reason. A new field belongs in exactly
# one of the two: tests/unit/orchestrator/scripts/test_ui_fields.py walks the model and fails otherwise.
GUARDED_FIELDS: dict[str, str] = {
    "workload.script": "a file under the roots, resolved after symlinks and `..`",
    "workload.module": ("every file and folder that could provide it (each package's `__init__.py`, the "
                        "module's `.py` or a package's `__main__.py`), searched without importing anything in "
                        "`workdir`, `PYTHONPATH` and the ranks' interpreter's path, a `.py` file (or folder) under "
                        "the roots; a module built into or frozen in the interpreter (`runpy`, `os`) is refused"),
    "workload.workdir": ("a folder under the roots; unset, its default too (the script's folder, or for a module "
                         "the folder `runyard up` started in)"),
    "workload.python": ("the path as given under the roots (a virtual environment's `bin/python` is a symlink), "
                        "and resolved, an interpreter named `python`, `python3` or `python3.X`, not a program "
                        "installed beside it (`.venv/bin/torchrun`)"),
    "workload.text": "a file under the roots, resolved after symlinks and `..`",
    "workload.env": "only thread, logging and debugging variables (`OMP_*`, `NCCL_DEBUG`, `TORCH_LOGS`, ...)",
    "workload.tensorboard_dir": "relative to `workdir`, without `..`",
    "workload.checkpoint_glob": "relative to `workdir`, without `..` (for the CLI too)",
    "slurm.sbatch_args": ("`--option` or `--option=value` words, with options that name no file or program "
                          "(`--qos`, `--constraint`, `--exclusive`, ...; not `--container`, `--input`, `--bbf`)"),
    "sweep.space.choice": ("each choice of a key that sets one of the fields above (`workload.script`, "
                           "`workload.env.X`, ...) judged by that field's rule, as the trial's submit would be"),
}

_NUMBER_OR_CHOICE = "a number, a flag or a fixed choice"
INERT_FIELDS: dict[str, str] = {
    "name": "text matching a pattern; shown only",
    "tags": "labels; shown only",
    "workload.kind": "one of three names; a script run's target is guarded by script or module",
    "launch.warm_start": "a switch: how the built-in ranks start; names nothing",
    "workload.args": ("words after the script or module in the ranks' argv, never an option of python or "
                      "torchrun: what they can make the target do is bounded by the target's rule"),
    "workload.resume_args": "like args",
    "workload.stdout_metrics": "regular expressions over printed lines (checked for their groups)",
    "workload.max_steps": _NUMBER_OR_CHOICE,
    "workload.stop_signal": _NUMBER_OR_CHOICE,
    "checkpoint.best_metric": "a metric name; compared only",
    "workload.checkpoint_step_key": "a dict key looked up in the checkpoint files checkpoint_glob found; names no file",
    **dict.fromkeys((
        "workload.hidden", "workload.n_layer", "workload.n_head", "workload.n_embd", "workload.block_size",
        "launch.executor", "launch.nnodes", "launch.nproc_per_node", "launch.backend",
        "train.max_steps", "train.batch_size", "train.lr", "train.weight_decay", "train.warmup_steps",
        "train.lr_schedule", "train.min_lr", "train.clip_grad_norm", "train.precision", "train.compile",
        "train.activation_checkpointing", "train.grad_accum", "train.seed", "train.log_every", "train.eval_every",
        "train.deterministic", "parallel.strategy",
        "checkpoint.every_steps", "checkpoint.every_seconds", "checkpoint.keep_last", "checkpoint.keep_best",
        "checkpoint.best_mode", "checkpoint.async",
        "retry.max_retries", "retry.backoff_s", "retry.backoff_max_s",
        "supervision.hang_timeout_s", "supervision.hang_step_factor", "supervision.startup_timeout_s",
        "supervision.grace_s", "supervision.straggler_ratio", "supervision.straggler_window_steps",
        "supervision.straggler_sustain_s", "supervision.desync_check_every",
        "slurm.gpus_per_node", "slurm.cpus_per_task"), _NUMBER_OR_CHOICE),
    **dict.fromkeys(("slurm.partition", "slurm.account", "slurm.time_limit", "slurm.mem"),
                    "a name, time or size matching a pattern; one sbatch option each"),
    # Alerts (orchestrator/alerts): read by the scheduler's alert job only, never by the ranks.
    **dict.fromkeys(("alerts.enabled", "alerts.repeat_s", "alerts.stalled_factor", "alerts.stalled_min_s",
                     "alerts.eta_slip_ratio", "alerts.gpu_idle_percent", "alerts.gpu_idle_s", "alerts.budget_usd",
                     "alerts.budget_pause"), _NUMBER_OR_CHOICE),
    **dict.fromkeys(("alerts.on", "alerts.off"), "trigger names from a fixed list; which alerts are sent"),
    "alerts.channels": "ids of channels set up by the machine's owner (`runyard alerts add`); names no URL",
    "alerts.nonfinite_metrics": "metric names compared with the reported ones; names no file",
    # A sweep (orchestrator/sweeps): read by the scheduler's sweeps job, never by the ranks; a
    # trial's config is the base's with the space's values, each judged as its own submit.
    **dict.fromkeys(("sweep.goal", "sweep.ranks", "sweep.searcher", "sweep.max_trials", "sweep.max_concurrent",
                     "sweep.seed", "sweep.early_stop.kind", "sweep.early_stop.reduction",
                     "sweep.early_stop.min_steps", "sweep.budget.gpu_hours", "sweep.budget.usd",
                     "sweep.budget.wall_hours", "sweep.budget.max_failed", "sweep.space.int",
                     "sweep.space.uniform", "sweep.space.log_uniform", "sweep.space.points"), _NUMBER_OR_CHOICE),
    "sweep.metric": "a metric name; compared only",
}
