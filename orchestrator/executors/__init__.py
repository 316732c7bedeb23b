"""Launching an attempt and watching its processes, here or on a Slurm cluster.

- ``base``: the executor interface the scheduler's reconcile loop talks to;
- ``local``: torchrun on this machine, under the exit-code shim (``shim``), started by
  ``launcher`` (torchrun's argv, the ranks' environment, the new session);
- ``processes``: liveness by pid and create time, exit and launch records, signals;
- ``sweeper``: ends every process of a run before its attempt is settled;
- ``stacks``: every rank's stacks (faulthandler, py-spy);
- ``logs``: where an attempt's launcher and per-rank logs are;
- ``slurm``: one batch job per attempt (the executor, Slurm's commands, the batch program and
  the node program).

This package imports nothing of the scheduler's: the loop decides, an executor does.
"""
