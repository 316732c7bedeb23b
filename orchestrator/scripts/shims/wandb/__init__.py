"""A stand-in for ``wandb`` that hands a script's metrics to runyard instead of W&B's servers.

With ``RUNYARD_WANDB_SHIM=1`` the launcher puts the folder that holds this package first on the
ranks' ``PYTHONPATH``, so ``import wandb`` in an unchanged script finds it. It implements what
training scripts call: ``wandb.init`` (returning a run with ``log``, ``finish``, ``config``,
``summary``, ``name``, ``id``), ``wandb.log``, ``wandb.finish``, ``wandb.config``, ``wandb.run``,
``wandb.watch`` and ``wandb.define_metric`` (no-ops), and accepts ``wandb.Table``,
``wandb.Image`` and the other media types without recording them.

Each committed step becomes one line of runyard's line protocol on stdout,
``RUNYARD {"step": 12, "rank": 1, "loss": 0.5}`` (the rank from the ``RANK`` variable torchrun
sets), so these metrics reach the database through the same collector as every other line.
Steps follow wandb's rules: without ``step`` each ``log`` call commits the current step and
moves to the next; with ``step`` the values gather at that step until a later step is logged or
``commit=True``; ``commit=False`` merges into the next commit; a step below the current one is
ignored with a warning. Nested dicts become ``outer/inner`` keys; values that are not numbers
(tables, images, strings) are skipped with one warning per key.

The standard library only: this runs inside the script's own interpreter.
"""

from __future__ import annotations

import atexit
import json
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

__version__ = "0.0.0+runyard"
PROTOCOL_PREFIX = "RUNYARD "  # orchestrator/scripts/log_lines.py reads these lines
_RESERVED = ("step", "rank", "total")

__all__ = ["Api", "Artifact", "Audio", "Config", "Error", "Histogram", "Html", "Image", "Object3D", "Run", "Settings",
           "Summary", "Table", "Video", "alert", "config", "define_metric", "finish", "init", "log", "login", "run",
           "save", "summary", "watch"]


class Error(Exception):
    """What wandb raises for a misuse (``wandb.log`` before ``wandb.init``)."""


def _warn(message: str) -> None:
    print(f"runyard wandb shim: {message}", file=sys.stderr, flush=True)


class Config:
    """``wandb.config``: attribute and item access, ``update``, ``setdefaults``, ``as_dict``."""

    def __init__(self, values: Mapping[str, Any] | None = None):
        object.__setattr__(self, "_values", {})
        if values:
            self.update(values)

    def update(self, values: Any = None, allow_val_change: bool | None = None, **more: Any) -> None:
        """Merge a dict, an ``argparse.Namespace`` or keyword arguments."""
        if values is not None and not isinstance(values, Mapping):
            values = vars(values)  # argparse.Namespace and other plain objects
        self._values.update(values or {})
        self._values.update(more)

    def setdefaults(self, values: Mapping[str, Any]) -> None:
        for key, value in values.items():
            self._values.setdefault(key, value)

    def as_dict(self) -> dict[str, Any]:
        return dict(self._values)

    def get(self, key: str, default: Any = None) -> Any:
        return self._values.get(key, default)

    def keys(self) -> Any:
        return self._values.keys()

    def items(self) -> Any:
        return self._values.items()

    def __getattr__(self, key: str) -> Any:
        try:
            return self._values[key]
        except KeyError:
            raise AttributeError(key) from None

    def __setattr__(self, key: str, value: Any) -> None:
        self._values[key] = value

    def __getitem__(self, key: str) -> Any:
        return self._values[key]

    def __setitem__(self, key: str, value: Any) -> None:
        self._values[key] = value

    def __contains__(self, key: object) -> bool:
        return key in self._values

    def __iter__(self) -> Iterator[str]:
        return iter(self._values)

    def __len__(self) -> int:
        return len(self._values)

    def __repr__(self) -> str:
        return f"Config({self._values!r})"


class Summary(Config):
    """``run.summary``: the newest value of each key, settable by the script."""

    def __repr__(self) -> str:
        return f"Summary({self.as_dict()!r})"


class _Media:
    """Tables, images and the other media: accepted so scripts run, never recorded."""

    def __init__(self, *args: Any, **kwargs: Any):
        self.args, self.kwargs = args, kwargs

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return lambda *args, **kwargs: None  # add_data, add_file, ...


class Table(_Media):
    pass


class Image(_Media):
    pass


class Histogram(_Media):
    pass


class Audio(_Media):
    pass


class Video(_Media):
    pass


class Html(_Media):
    pass


class Object3D(_Media):
    pass


class Artifact(_Media):
    pass


class Settings(_Media):
    pass


def _number(value: Any) -> float | None:
    """A float for an int, float, bool, numpy scalar or one-element tensor; None otherwise."""
    if isinstance(value, (str, bytes, _Media)):
        return None
    if isinstance(value, (int, float)):
        return float(value)
    if hasattr(value, "item") and hasattr(value, "__float__"):
        try:
            return float(value)
        except (TypeError, ValueError, RuntimeError):
            return None
    return None


def _flatten(data: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    for key, value in data.items():
        name = f"{prefix}{key}"
        if isinstance(value, Mapping):
            yield from _flatten(value, f"{name}/")
        else:
            yield name, value


class Run:
    """What ``wandb.init`` returns."""

    def __init__(self, project: str | None, name: str | None, run_id: str | None, config: Config,
                 rank: int, out: Any = None):
        self.project = project or "runyard"
        self.id = run_id or os.environ.get("RUNYARD_RUN_ID") or f"runyard-{os.getpid()}"
        self.name = name or (f"run-{os.environ['RUNYARD_RUN_ID']}" if os.environ.get("RUNYARD_RUN_ID") else self.id)
        self.config = config
        self.summary = Summary()
        self.rank = rank
        self.dir = os.getcwd()
        self.url: str | None = None
        self.entity: str | None = None
        self.group: str | None = None
        self.job_type: str | None = None
        self.tags: tuple[str, ...] = ()
        self.notes: str | None = None
        self.disabled = False
        self.offline = True
        self._out = out
        self._step = 0
        self._pending: dict[str, float] = {}
        self._warned: set[str] = set()
        self._finished = False

    @property
    def step(self) -> int:
        return self._step

    def log(self, data: Mapping[str, Any], step: int | None = None, commit: bool | None = None,
            sync: bool | None = None) -> None:
        """Record ``data`` at ``step`` (wandb's rules: see the module docstring)."""
        if self._finished:
            _warn("log() after finish() is ignored")
            return
        if not isinstance(data, Mapping):
            raise TypeError(f"wandb.log takes a dict, not {type(data).__name__}")
        if step is not None:
            if isinstance(step, bool) or not isinstance(step, int) or step < 0:
                raise TypeError(f"step must be an integer >= 0, not {step!r}")
            if step < self._step:
                self._warn_once(f"step:{step}", f"step {step} is below the current step {self._step}: "
                                                "these values are ignored (as wandb does)")
                return
            if step > self._step:
                self._commit()
                self._step = step
            commit = False if commit is None else commit
        elif commit is None:
            commit = True
        for key, value in _flatten(data):
            if key in _RESERVED:  # the protocol's own words; the step is already the step
                self._warn_once(key, f"{key!r} is not recorded as a metric (runyard's line protocol uses the name)")
                continue
            number = _number(value)
            if number is None:
                self._warn_once(key, f"{key!r} is a {type(value).__name__}, not a number: not recorded")
                continue
            self._pending[key] = number
        if commit:
            self._commit()
            self._step += 1

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _warn(message)

    def _commit(self) -> None:
        if not self._pending:
            return
        line = {"step": self._step, "rank": self.rank, **self._pending}
        out = self._out or sys.stdout
        # json writes NaN and Infinity as the bare words Python's json reads back.
        print(PROTOCOL_PREFIX + json.dumps(line, separators=(",", ":")), file=out, flush=True)
        self.summary.update(self._pending)
        self._pending = {}

    def finish(self, exit_code: int | None = None, quiet: bool | None = None) -> None:
        """Commit what is pending; later ``log`` calls are ignored."""
        if not self._finished:
            self._commit()
            self._finished = True

    def watch(self, *args: Any, **kwargs: Any) -> None:
        return None

    def define_metric(self, *args: Any, **kwargs: Any) -> None:
        return None

    def save(self, *args: Any, **kwargs: Any) -> bool:
        return True

    def log_artifact(self, *args: Any, **kwargs: Any) -> None:
        return None

    def use_artifact(self, *args: Any, **kwargs: Any) -> Artifact:
        return Artifact(*args, **kwargs)

    def alert(self, *args: Any, **kwargs: Any) -> None:
        return None

    def log_code(self, *args: Any, **kwargs: Any) -> None:
        return None

    def mark_preempting(self) -> None:
        return None

    def __enter__(self) -> Run:
        return self

    def __exit__(self, *exc: object) -> None:
        finish()


# wandb's module-level API is module state by design (wandb.run, wandb.config); the shim keeps
# its state in the same places so scripts that read them see what they expect.
run: Run | None = None
config = Config()
summary = Summary()


def init(project: str | None = None, entity: str | None = None, name: str | None = None, config: Any = None,
         id: str | None = None, reinit: Any = None, **kwargs: Any) -> Run:
    """Start the run (or return the current one, as wandb does without ``reinit``)."""
    global run, summary
    module = sys.modules[__name__]
    if run is not None and not run._finished and not reinit:
        if config is not None:
            run.config.update(config)
        return run
    if run is not None:
        run.finish()
    module_config: Config = module.config
    if config is not None:
        module_config.update(config)
    rank = int(os.environ.get("RANK") or 0)
    run = Run(project, name, id, module_config, rank)
    run.entity = entity
    summary = run.summary
    atexit.register(run.finish)
    return run


def _current() -> Run:
    if run is None:
        raise Error("You must call wandb.init() before wandb.log()")
    return run


def log(data: Mapping[str, Any], step: int | None = None, commit: bool | None = None, sync: bool | None = None) -> None:
    """``run.log`` of the current run."""
    _current().log(data, step=step, commit=commit)


def finish(exit_code: int | None = None, quiet: bool | None = None) -> None:
    """Finish the current run; ``wandb.run`` is None afterwards."""
    global run
    if run is not None:
        run.finish(exit_code)
        run = None


def watch(*args: Any, **kwargs: Any) -> None:
    return None


def unwatch(*args: Any, **kwargs: Any) -> None:
    return None


def define_metric(*args: Any, **kwargs: Any) -> None:
    return None


def save(*args: Any, **kwargs: Any) -> bool:
    return True


def login(*args: Any, **kwargs: Any) -> bool:
    return True


def alert(*args: Any, **kwargs: Any) -> None:
    return None


def setup(*args: Any, **kwargs: Any) -> None:
    return None


class Api(_Media):
    """The public API client: nothing to query under runyard."""
