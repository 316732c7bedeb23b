"""The Slurm executor and the two programs it submits.

- ``executor``: :class:`SlurmExecutor`, one batch job per attempt;
- ``commands``: ``sbatch``, ``squeue``, ``scancel``, ``sacct``, ``scontrol`` and their parsing;
- ``job``: the batch program, on the allocation's first node;
- ``node``: the node program, one ``srun`` task per node, running torchrun.
"""
