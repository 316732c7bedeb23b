"""A rank's process plumbing: how a process of runyard's joins its run, dies with its parent, stops
and ends.

- ``distributed``: the process group set up and torn down, its store under the attempt's secret;
- ``store_secret``: that secret, and a rendezvous that unpickles nothing but its own state;
- ``pdeathsig``: the parent-death signal (a rank dies with torchrun's agent);
- ``lifecycle``: SIGTERM's graceful stop, SIGUSR1's stack dumps, the notes a rank leaves, the end
  without the interpreter's finalisation;
- ``process_exit``: the exit code ``python`` would give, and what its shutdown does, short of
  finalising;
- ``script_runner``: a user's script in each rank (``python -m trainer.process.script_runner``).

``script_runner.py`` may run under a script's own interpreter, where runyard is not installed: it
then loads ``pdeathsig.py``, ``store_secret.py`` and ``process_exit.py`` from beside its own file,
so these four stay together in this folder, and those three import only the standard library
(torch where a run has a secret). Importing this package imports nothing.
"""
