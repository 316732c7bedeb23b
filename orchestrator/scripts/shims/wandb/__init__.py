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

The step a metric is recorded at, in this order:

1. ``define_metric("val/*", step_metric="trainer/global_step")`` (Hugging Face's and
   Lightning's loggers declare one for ``"*"``; nanoGPT-style scripts for their eval keys): a
   matching key is recorded at the value of its step metric, from the same ``log`` call or the
   last one that logged it.
2. A ``log`` call without ``step=`` that holds a step-like key (:data:`STEP_KEYS`: ``iter``,
   ``iter_num``, ``step``, ``global_step``, ``train/global_step``, ``trainer/global_step``): its
   other keys are recorded at that step (nanoGPT's ``wandb.log({"iter": iter_num, ...})``).
3. ``step=``, else wandb's own counter. A step metric or step-like key is not a metric itself.

Lightning's ``trainer/global_step`` counts from 0 and is recorded one higher (:data:`FROM_ZERO`).
Frameworks that check for wandb before they use it find what they look for: a distribution's
metadata beside this package (``wandb-0.12.10+runyard.dist-info``: Lightning's ``WandbLogger``
requires ``wandb>=0.12.10``), ``wandb.wandb_run.Run`` and ``wandb.sdk.lib.RunDisabled``; and for
Hugging Face's ``WandbCallback``, ``wandb.sdk.lib.config_util.ConfigError``, ``termwarn`` and a
run's ``_label``.

wandb's counter continues across the attempts of a run, as a resumed W&B run's does: each rank
keeps its next step in ``$RUNYARD_RUN_DIR/wandb-shim/rank-<r>.json`` (``db/vocabulary/layout.py``'s
``WANDB_SHIM_DIR``), so a retry's counter-stepped values do not land on the first attempt's steps.

The standard library only: this runs inside the script's own interpreter.
"""

from __future__ import annotations

import atexit
import fnmatch
import json
import os
import sys
from collections.abc import Iterator, Mapping
from typing import Any

__version__ = "0.12.10+runyard"  # as its distribution says (wandb-*.dist-info beside it)
PROTOCOL_PREFIX = "RUNYARD "  # orchestrator/scripts/log_lines.py reads these lines
_RESERVED = ("step", "rank", "total")
# Keys a script logs its own step under (rule 2 of the module docstring).
STEP_KEYS = ("iter", "iter_num", "step", "global_step", "train/global_step", "trainer/global_step")
# Lightning's WandbLogger logs ``trainer/global_step`` from 0 (its first step at 0, while its
# checkpoint after 20 steps holds global_step 20): recorded one higher, so that step N is the Nth
# optimizer step, as for its checkpoints and every other writer (Hugging Face's
# ``train/global_step`` is counted after the step already).
FROM_ZERO = {"trainer/global_step": 1}
# Where each rank's counter is kept between attempts, under $RUNYARD_RUN_DIR (db/vocabulary/layout.py: WANDB_SHIM_DIR).
STATE_DIR = "wandb-shim"

__all__ = ["Api", "Artifact", "Audio", "Config", "Error", "Histogram", "Html", "Image", "Object3D", "Run", "Settings",
           "Summary", "Table", "Video", "alert", "config", "define_metric", "finish", "init", "log", "login", "run",
           "save", "summary", "termwarn", "watch"]


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
        self._state = _state_file(rank)
        self._step = _saved_step(self._state)
        self._pending: dict[str, float] = {}
        self._warned: set[str] = set()
        self._finished = False
        self._step_metrics: dict[str, str] = {}  # key pattern -> its step metric (define_metric)
        self._last: dict[str, int] = {}  # the last value logged of each step metric

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
        if step is not None and (isinstance(step, bool) or not isinstance(step, int) or step < 0):
            raise TypeError(f"step must be an integer >= 0, not {step!r}")
        values = self._numbers(data)
        steps = {k: v for k, v in values.items() if k in self._step_metrics.values() or k in STEP_KEYS}
        for key, value in steps.items():
            if value >= 0 and value == int(value):
                self._last[key] = int(value) + FROM_ZERO.get(key, 0)
        own = self._own_steps(values, steps, explicit=step is not None)
        for at, found in sorted(own.items()):
            self._line(at, found)
        rest = {k: v for k, v in values.items() if k not in steps and not any(k in f for f in own.values())}
        if step is not None:
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
        self._pending.update(rest)
        if commit:
            counted = bool(self._pending)
            self._commit()
            self._step += 1
            if counted:
                self._save_step()

    def _numbers(self, data: Mapping[str, Any]) -> dict[str, float]:
        out: dict[str, float] = {}
        for key, value in _flatten(data):
            number = _number(value)
            if number is None:
                self._warn_once(key, f"{key!r} is a {type(value).__name__}, not a number: not recorded")
                continue
            out[key] = number
        return out

    def _own_steps(self, values: dict[str, float], steps: dict[str, float],
                   explicit: bool) -> dict[int, dict[str, float]]:
        """The values that go at a step of their own (rules 1 and 2), by step."""
        out: dict[int, dict[str, float]] = {}
        logged_step = next((self._last[k] for k in STEP_KEYS if k in steps and k in self._last
                            and self._last[k] == steps[k] + FROM_ZERO.get(k, 0)), None)
        for key, value in values.items():
            if key in steps:
                continue
            metric = self._step_metric(key)
            if metric is not None and metric in self._last:
                out.setdefault(self._last[metric], {})[key] = value
            elif metric is None and logged_step is not None and not explicit:
                out.setdefault(logged_step, {})[key] = value
            elif key in _RESERVED:
                self._warn_once(key, f"{key!r} is not recorded as a metric (runyard's line protocol uses the name)")
        return out

    def _step_metric(self, key: str) -> str | None:
        """The step metric ``define_metric`` gave ``key`` (an exact name first, then a pattern)."""
        if key in self._step_metrics:
            return self._step_metrics[key]
        for pattern, metric in self._step_metrics.items():
            if fnmatch.fnmatchcase(key, pattern) and key != metric:
                return metric
        return None

    def _line(self, step: int, values: Mapping[str, float]) -> None:
        if not values:
            return
        line = {"step": step, "rank": self.rank, **values}
        out = self._out or sys.stdout
        print(PROTOCOL_PREFIX + json.dumps(line, separators=(",", ":")), file=out, flush=True)
        self.summary.update(values)

    def _save_step(self) -> None:
        """Keep the counter for the run's next attempt (best effort: a read-only folder loses it)."""
        if self._state is None:
            return
        try:
            os.makedirs(os.path.dirname(self._state), exist_ok=True)
            tmp = f"{self._state}.tmp"
            with open(tmp, "w") as f:
                json.dump({"next_step": self._step}, f)
            os.replace(tmp, self._state)
        except OSError:
            self._state = None

    def _warn_once(self, key: str, message: str) -> None:
        if key not in self._warned:
            self._warned.add(key)
            _warn(message)

    def _commit(self) -> None:
        # json writes NaN and Infinity as the bare words Python's json reads back.
        self._line(self._step, self._pending)
        self._pending = {}

    def finish(self, exit_code: int | None = None, quiet: bool | None = None) -> None:
        """Commit what is pending; later ``log`` calls are ignored."""
        if not self._finished:
            self._commit()
            self._finished = True

    def watch(self, *args: Any, **kwargs: Any) -> None:
        return None

    def define_metric(self, name: str, step_metric: str | None = None, *args: Any, **kwargs: Any) -> None:
        """Record ``name`` (a key or a ``*`` pattern) at the value of ``step_metric``."""
        if isinstance(name, str) and isinstance(step_metric, str) and step_metric:
            self._step_metrics[name] = step_metric

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

    def _label(self, *args: Any, **kwargs: Any) -> None:
        """wandb's telemetry label (Hugging Face's WandbCallback calls it): nothing to record."""
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


def define_metric(name: str, step_metric: str | None = None, *args: Any, **kwargs: Any) -> None:
    """``run.define_metric`` of the current run (before ``init``: nothing, as there is no run)."""
    if run is not None:
        run.define_metric(name, step_metric, *args, **kwargs)


def _state_file(rank: int) -> str | None:
    run_dir = os.environ.get("RUNYARD_RUN_DIR")
    return os.path.join(run_dir, STATE_DIR, f"rank-{rank}.json") if run_dir else None


def _saved_step(path: str | None) -> int:
    """The counter an earlier attempt of the run left, else 0."""
    if path is None:
        return 0
    try:
        with open(path) as f:
            step = json.load(f).get("next_step", 0)
    except (OSError, ValueError, AttributeError):
        return 0
    return step if isinstance(step, int) and not isinstance(step, bool) and step >= 0 else 0


def save(*args: Any, **kwargs: Any) -> bool:
    return True


def login(*args: Any, **kwargs: Any) -> bool:
    return True


def alert(*args: Any, **kwargs: Any) -> None:
    return None


def termwarn(message: str, repeat: bool = True, **kwargs: Any) -> None:
    """wandb's warning to the terminal (Hugging Face's WandbCallback uses it): to stderr."""
    print(f"wandb: WARNING {message}", file=sys.stderr, flush=True)


def setup(*args: Any, **kwargs: Any) -> None:
    return None


class Api(_Media):
    """The public API client: nothing to query under runyard."""
