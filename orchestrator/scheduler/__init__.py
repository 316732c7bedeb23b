"""The scheduler: the reconcile loop and everything it decides.

- ``loop``: :class:`Scheduler`, the tick (APScheduler, one job), the lock, ``serve``;
- ``admission``: whether a queued run may start now (GPUs, disk, the run's own state);
- ``outcomes``: settling an ended attempt: its cause, its record, what comes next;
- ``failures``: reading the evidence of a failure (exit codes, logs) into a cause;
- ``retry``: the retry policy by cause (backoff, a smaller micro-batch after CUDA OOM);
- ``repeats``: the same error again and again, seen across attempts;
- ``storage``: a full or read-only disk, told apart from a training error;
- ``watchdog``: hangs (no step for too long): stacks first, then the kill;
- ``sysmon``: the host's, the runs' processes' and the GPUs' samples;
- ``resources``: the machine's inventory (cores, GPUs through NVML).

What the loop asks of a machine goes through an executor (orchestrator/executors/); what it
asks of a plain script, through orchestrator/scripts/.
"""
