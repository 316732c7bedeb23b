"""Every ``RUNYARD_*`` environment variable runyard reads, typed, in one place (pydantic-settings),
and where runyard keeps its data.

- :class:`EnvSettings`: the variables an operator sets for the CLI, the UI and the scheduler
  (``RUNYARD_HOME``, ``RUNYARD_DB_URL``, ``RUNYARD_CPU_SLOTS``, ...). Read whole and checked when
  a command starts: a bad value stops it with one line naming the variable and the value.
- :class:`RankEnv`: what the scheduler passes to every process of an attempt
  (``RUNYARD_RUN_ID``, ``RUNYARD_ATTEMPT``, ...): a protocol between two of runyard's own
  processes, not settings, so a model of its own (``trainer/context.py`` reads it in a rank).
- :class:`FaultEnv`: the fault-injection switches of runyard's own tests (``RUNYARD_FAULTS``,
  ``RUNYARD_FAULT_*``), inert unless ``RUNYARD_FAULTS=1``; ``trainer/faults.py`` reads them.
- :class:`Settings`: where the data lives, resolved from :class:`EnvSettings` (the data folder,
  by default one per user in the platform's user data directory, and the database URL, by
  default a SQLite file in it).

``docs/OPERATIONS.md`` and ``docs/SCRIPTS.md`` hold a table of each model, generated from it by
``python -m db.vocabulary.settings_doc`` (and docs/DEVELOPMENT.md one of :class:`FaultEnv`); a unit test
keeps them equal. Processes that start by the dozen and must stay light (the shim, the
torchrun wrapper, a plain script's runner) read their one or two variables without pydantic;
the values they read were checked here first, by the scheduler that started them.
"""

from __future__ import annotations

import os
import sys
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from contextvars import ContextVar
from dataclasses import dataclass
from pathlib import Path
from typing import Any, ClassVar, Literal, get_args

from pydantic import Field, SecretStr, ValidationError
from pydantic_settings import BaseSettings, EnvSettingsSource, PydanticBaseSettingsSource, SettingsConfigDict
from typing_extensions import Self

from db import DatabaseError
from db.vocabulary.layout import DB_FILE, RUNS_DIR, SCHEDULER_FILE, SCRAPE_TOKEN_FILE, TOKEN_FILE, run_dir_name

ENV_PREFIX = "RUNYARD_"
APP_NAME = "runyard"


class SettingsError(DatabaseError):
    """A ``RUNYARD_*`` variable holds a value runyard cannot use (the message names both)."""


# The environment the next model reads: os.environ, or a mapping a caller passes (tests, a child's env).
_ENVIRON: ContextVar[Mapping[str, str] | None] = ContextVar("runyard_environ", default=None)


# Models already built, by class and the RUNYARD_* variables they were built from.
_BUILT: dict[tuple[type, tuple[tuple[str, str], ...]], object] = {}


class _EnvironSource(EnvSettingsSource):
    """pydantic-settings' environment source over :data:`_ENVIRON` (else ``os.environ``). Only the
    names in capitals count (``runyard_home`` is not ``RUNYARD_HOME``, as on Linux); an empty value
    counts as unset (``RUNYARD_HOME=`` means the default)."""

    def _load_env_vars(self) -> Mapping[str, str | None]:
        environ = _ENVIRON.get()
        return {k.lower(): v for k, v in (os.environ if environ is None else environ).items()
                if k.startswith(ENV_PREFIX) and k == k.upper() and v != ""}


class _RunyardVariables(BaseSettings):
    """The base of the models below: ``RUNYARD_`` + the field's name in capitals is its variable."""

    model_config = SettingsConfigDict(env_prefix=ENV_PREFIX, case_sensitive=False, extra="ignore", frozen=True)

    @classmethod
    def settings_customise_sources(
        cls,
        settings_cls: type[BaseSettings],
        init_settings: PydanticBaseSettingsSource,
        env_settings: PydanticBaseSettingsSource,
        dotenv_settings: PydanticBaseSettingsSource,
        file_secret_settings: PydanticBaseSettingsSource,
    ) -> tuple[PydanticBaseSettingsSource, ...]:
        # Arguments, then the environment; no .env file and no secrets folder is ever read.
        return init_settings, _EnvironSource(settings_cls)

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> Self:
        """The variables of ``environ`` (default ``os.environ``), checked.

        Raises:
            SettingsError: a variable holds a value of the wrong kind or out of range.
        """
        # Building a model costs milliseconds; the same variables give the same (frozen) model, so
        # a scheduler tick or a rank's step that asks again pays only for a look at the environment.
        variables = tuple(sorted((k, v) for k, v in (os.environ if environ is None else environ).items()
                                 if k.startswith(ENV_PREFIX)))
        cached = _BUILT.get((cls, variables))
        if isinstance(cached, cls):
            return cached
        with _reading(dict(variables)):
            try:
                built = cls()
            except ValidationError as exc:
                raise SettingsError(_explain(cls, exc, dict(variables))) from None
        if len(_BUILT) >= 64:
            _BUILT.clear()
        _BUILT[(cls, variables)] = built
        return built

    @classmethod
    def variable(cls, field: str) -> str:
        """The environment variable of ``field`` (``cpu_slots`` -> ``RUNYARD_CPU_SLOTS``)."""
        if field not in cls.model_fields:
            raise KeyError(field)
        return ENV_PREFIX + field.upper()


@contextmanager
def _reading(environ: Mapping[str, str] | None) -> Iterator[None]:
    token = _ENVIRON.set(environ)
    try:
        yield
    finally:
        _ENVIRON.reset(token)


def _explain(model: type[_RunyardVariables], exc: ValidationError, environ: Mapping[str, str]) -> str:
    """One sentence per bad variable: ``RUNYARD_CPU_SLOTS = 'two': expected a whole number ...``."""
    sentences = []
    for error in exc.errors(include_url=False):
        field = str(error["loc"][0]) if error["loc"] else ""
        if field not in model.model_fields:
            sentences.append(str(error["msg"]))
            continue
        name, info = model.variable(field), model.model_fields[field]
        secret = SecretStr in (info.annotation, *get_args(info.annotation))
        shown = "(hidden)" if secret else repr(environ.get(name, ""))
        extra = info.json_schema_extra if isinstance(info.json_schema_extra, dict) else {}
        message = str(error["msg"])
        sentence = f"{name} = {shown}: {message[:1].lower()}{message[1:]}"
        sentences.append(f"{sentence} ({extra['expected']})" if "expected" in extra else sentence)
    return "; ".join(sentences)


def _expect(what: str) -> dict[str, Any]:
    """A field's ``json_schema_extra``: what a good value looks like, for the error sentence."""
    return {"expected": f"expected {what}"}


class EnvSettings(_RunyardVariables):
    """The ``RUNYARD_*`` variables an operator sets for the CLI, the UI and the scheduler."""

    SECTION: ClassVar[str] = "runyard's settings"

    home: Path | None = Field(
        None, description="The data folder: runs, logs, checkpoints, the SQLite database, the UI's token. "
        "Default: one per user, `$XDG_DATA_HOME/runyard` (`~/.local/share/runyard` on Linux, "
        "`~/Library/Application Support/runyard` on macOS); a relative path is taken from the current folder.")
    db_url: str | None = Field(
        None, description="The database, as a SQLAlchemy URL (`postgresql+psycopg://USER@HOST/runyard`). "
        "Default: the SQLite file `runyard.db` in the data folder.")
    cpu_slots: int | None = Field(
        None, ge=1, description="On a machine without GPUs: how many ranks may run at once. Default: the core count.",
        json_schema_extra=_expect("a whole number of CPU slots, at least 1"))
    script_roots: str = Field(
        "", description="The folders the UI may launch scripts from, separated by `:`. Default: the folder "
        "`runyard up` started in and the data folder (docs/SECURITY.md).")
    allowed_hosts: str = Field(
        "", description="Host names the UI answers to besides the loopback ones, separated by commas "
        "(as `--allowed-host`).")
    proxy_secret: SecretStr | None = Field(
        None, description="With `--auth proxy`: the secret the reverse proxy sends in `X-Runyard-Proxy-Secret` "
        "(at least 16 characters).")
    slurm_poll_s: float = Field(
        5.0, ge=0.2, description="Seconds between two looks at the Slurm queue (`squeue`); the controller is shared.",
        json_schema_extra=_expect("seconds, at least 0.2"))
    slurm_max_jobs: int = Field(
        16, ge=1, description="How many of runyard's jobs, pending or running, it keeps in the Slurm queue at most.",
        json_schema_extra=_expect("a whole number, at least 1"))
    slurm_python: str | None = Field(
        None, description="The Python the Slurm compute nodes run runyard with. Default: the scheduler's own "
        "(`sys.executable`), which the nodes must reach by the same path.")
    exit_retry_s: float = Field(
        30.0, ge=0, description="How long an attempt's shim retries writing its exit record on a failing disk "
        "before it gives up (exit code 75).", json_schema_extra=_expect("seconds, at least 0"))
    metrics_recent_s: float = Field(
        3600.0, ge=0, allow_inf_nan=False, description="How long after it ended a run keeps its series on the "
        "UI's Prometheus `/metrics` (docs/PROMETHEUS.md).", json_schema_extra=_expect("seconds, at least 0"))

    @property
    def proxy_secret_text(self) -> str | None:
        """``RUNYARD_PROXY_SECRET`` itself (kept out of reprs and logs as a SecretStr), or None."""
        return self.proxy_secret.get_secret_value() if self.proxy_secret is not None else None


class RankEnv(_RunyardVariables):
    """What the scheduler passes to every process of an attempt (the ranks, torchrun, the shim).

    Outside runyard (a plain ``torchrun`` launch) none is set: ``run_id`` is then None and the
    SDK reports nothing.
    """

    SECTION: ClassVar[str] = "what a rank sees"

    run_id: int | None = Field(None, ge=1, description="The run's number.")
    attempt: int = Field(1, ge=1, description="The attempt's number, 1 for the first launch.")
    run_dir: Path | None = Field(
        None, description="The run's folder. The sweeper finds an attempt's processes by it (and `RUNYARD_ATTEMPT`).")
    attempt_dir: Path | None = Field(
        None, description="This attempt's folder: logs, stacks, and `config.json`, the attempt's effective config, "
        "which the SDK reads.")
    resume_path: Path | None = Field(
        None, description="The script's own checkpoint file to resume from (with `checkpoint_glob`); unset when "
        "starting fresh.")
    resume_step: int | None = Field(None, ge=0, description="The step of the checkpoint resumed from (either kind).")
    resume_dir: Path | None = Field(None, description="The SDK's checkpoint to resume from (the SDK reads it).")
    db_url: str | None = Field(None, description="The database, for the SDK.")
    rdzv_secret: SecretStr | None = Field(
        None, description="The key of torchrun's rendezvous store, new for each attempt (never on a command line); "
        "runyard's torchrun wrapper reads it.")
    warm_room: str | None = Field(
        None, description="Blanks in the environment of torchrun's agent, room for the ranks' larger environment "
        "when they are forked from it (`launch.warm_start`); the ranks drop it.")
    wandb_shim: Literal["0", "1"] | None = Field(
        None, description="Set by you: `\"1\"` in `[workload.env]` makes `import wandb` in the ranks find "
        "runyard's stand-in (see wandb above).")



class FaultEnv(_RunyardVariables):
    """The fault-injection switches of runyard's own tests (``trainer/faults.py`` reads them).

    Every one is inert unless ``RUNYARD_FAULTS=1`` is set too: the ranks inherit the scheduler's
    environment, so a stray ``RUNYARD_FAULT_*`` left in a user's shell must not reach real
    training. Only the tests set the switch. STEP, RANK and ATTEMPTS are whole numbers;
    ``@ATTEMPTS`` limits a fault to the attempts numbered up to ATTEMPTS.
    """

    SECTION: ClassVar[str] = "fault injection (tests only)"

    faults: Literal["0", "1"] | None = Field(None, description="The switch: `1` arms the hooks below.")
    fault_step_delay_s: float | None = Field(None, ge=0, description="Every rank sleeps this long after every step.")
    fault_setup_delay_s: float | None = Field(
        None, ge=0, description="Every rank sleeps this long while setting up (a slow data load).")
    fault_save_delay: str | None = Field(
        None, description="`STEP:SECONDS`: the checkpoint writer sleeps before publishing the checkpoint of STEP; "
                          "`*:SECONDS`: before every checkpoint.")
    fault_slow_rank: str | None = Field(
        None, description="`RANK:SECONDS`: RANK sleeps this long at the start of every step (a straggler).")
    fault_perturb: str | None = Field(
        None, description="`STEP:RANK`: RANK nudges one parameter after the optimizer step of STEP (a replica "
        "out of sync).")
    fault_abort_at_exit: str | None = Field(
        None, description="`RANK`: RANK aborts (SIGABRT) after it finished its work.")
    fault_stall: str | None = Field(
        None, description="`STEP:RANK`: RANK stops making progress before STEP (a hang with one culprit).")
    fault_fsize: str | None = Field(
        None, description="`STEP:BYTES[@ATTEMPTS]`: rank 0 may not write files past BYTES from STEP on (a full disk).")
    fault_raise: str | None = Field(
        None, description="`STEP[:RANK][@ATTEMPTS]`: raise a RuntimeError (a user error) at STEP.")
    fault_cuda_oom: str | None = Field(
        None, description="`STEP:MAX_BATCH`: raise torch's CUDA out-of-memory error at STEP while the micro-batch "
        "is above MAX_BATCH.")
    fault_sigkill: str | None = Field(
        None, description="`STEP:RANK`: RANK kills itself with SIGKILL before STEP.")
    fault_exit_after_launch: Literal["0", "1"] | None = Field(
        None, description="`1`: the scheduler exits right after starting an attempt, before it commits the "
        "launcher's pid.")

    def spec(self, variable: str) -> str:
        """The value of the hook named ``variable`` (``RUNYARD_FAULT_STALL``) as written, or ""."""
        value = getattr(self, variable.removeprefix(ENV_PREFIX).lower())
        return "" if value is None else str(value)


@dataclass(frozen=True)
class Settings:
    """Locations shared by every runyard process.

    Attributes:
        home: The data folder (runs, logs, checkpoints, the SQLite database).
        db_url: The SQLAlchemy URL of the database.
        home_from_env: Whether ``RUNYARD_HOME`` chose the home (else it is the per-user default).
    """

    home: Path
    db_url: str
    home_from_env: bool = True

    @property
    def runs_dir(self) -> Path:
        return self.home / RUNS_DIR

    def run_dir(self, run_id: int) -> Path:
        return self.runs_dir / run_dir_name(run_id)

    @property
    def token_file(self) -> Path:
        """Where the UI's access token is kept."""
        return self.home / TOKEN_FILE

    @property
    def scrape_token_file(self) -> Path:
        """Where the read-only token of ``GET /metrics`` (Prometheus) is kept."""
        return self.home / SCRAPE_TOKEN_FILE

    @property
    def scheduler_file(self) -> Path:
        """The running scheduler's heartbeat file (db/vocabulary/scheduler_file.py)."""
        return self.home / SCHEDULER_FILE

    @property
    def home_source(self) -> str:
        """How the home was chosen, for messages: ``RUNYARD_HOME`` or ``the default``."""
        return "RUNYARD_HOME" if self.home_from_env else "the default data folder"


def user_data_dir(environ: Mapping[str, str] | None = None, platform: str | None = None) -> Path:
    """The platform's per-user data directory for runyard (no third-party dependency).

    Linux and other Unixes follow the XDG base directory spec (``$XDG_DATA_HOME/runyard``, else
    ``~/.local/share/runyard``); macOS uses ``~/Library/Application Support/runyard``; Windows
    ``%LOCALAPPDATA%\\runyard``.
    """
    env = os.environ if environ is None else environ
    platform = sys.platform if platform is None else platform
    home = Path(env.get("HOME") or Path.home())
    if platform == "darwin":
        return home / "Library" / "Application Support" / APP_NAME
    if platform.startswith("win"):
        local = env.get("LOCALAPPDATA") or str(home / "AppData" / "Local")
        return Path(local) / APP_NAME
    xdg = env.get("XDG_DATA_HOME", "")
    # The spec says a relative XDG_DATA_HOME is invalid and must be ignored.
    base = Path(xdg) if xdg and Path(xdg).is_absolute() else home / ".local" / "share"
    return base / APP_NAME


def _absolute(path: Path) -> Path:
    try:
        return path.resolve()
    except (OSError, RuntimeError):  # a symlink loop or an unreadable parent: db.home says what is wrong
        return Path(os.path.abspath(path))


def load_settings(environ: Mapping[str, str] | None = None, cwd: Path | None = None) -> Settings:
    """Read the settings from the environment, every ``RUNYARD_*`` variable of
    :class:`EnvSettings` checked.

    ``RUNYARD_HOME`` (a relative one is resolved against the cwd) overrides the per-user
    default :func:`user_data_dir`. ``RUNYARD_DB_URL`` overrides the database. Nothing is created
    here: whether the home is usable is checked by :mod:`db.home`.

    Raises:
        SettingsError: a ``RUNYARD_*`` variable holds a value runyard cannot use.
    """
    env = os.environ if environ is None else environ
    variables = EnvSettings.from_env(env)
    from_env = variables.home is not None
    home = variables.home.expanduser() if variables.home is not None else user_data_dir(env)
    home = _absolute(home if home.is_absolute() else (cwd or Path.cwd()) / home)
    url = variables.db_url or f"sqlite:///{home / DB_FILE}"
    return Settings(home=home, db_url=url, home_from_env=from_env)
