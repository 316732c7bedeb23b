"""Sweeps: a search over a run config whose trials are ordinary runs, decided by runyard outside
the ranks (docs/SWEEPS.md). Each decision is a pure function over plain values, applied by one
small function:

- ``space``: the search space against its base config, a grid's points, a trial's config;
- ``searchers``: what trial n tries (grid, random, TPE through Optuna's ask/tell, imported lazily);
- ``asha``: the rungs, the cut and promotion (asynchronous successive halving);
- ``objective``: the objective's value at a step, read from the metric store, and which metrics a
  built-in workload records;
- ``budget``: what the sweep may still spend, and the breaker;
- ``preview``: the arithmetic before Start (trials, rungs, full-run equivalents, GPU-hours, cost);
- ``submission``: a sweep file checked on this machine and started;
- ``trials``: a new trial made, and what the searcher is told of each;
- ``rungs``: the values trials reached at the rungs, judged as they pass;
- ``reconcile``: one pass over a sweep, the scheduler's ``sweeps`` job.

The rows are db/sweeps/'s; the CLI's verbs orchestrator/cli/sweeps.py.
"""
