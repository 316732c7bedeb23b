"""[alerts]: what runyard tells about a run, and where (docs/ALERTS.md)."""

from __future__ import annotations

from pydantic import Field, field_validator

from db.vocabulary.config.base import _Section

# -- alerts (issue 28; orchestrator/alerts/) ---------------------------------------------------
# Every trigger, in the order messages and the UI list them; DEFAULT_TRIGGERS are on unless the
# global defaults (`runyard alerts defaults`, Settings) or a run's [alerts] say otherwise.
# The sweep_* triggers are a sweep's end, once each (a sweep ends once): on by default, since a
# sweep runs for hours unwatched and its end is the moment a person acts on (docs/SWEEPS.md).
TRIGGERS = ("failed", "retrying", "hang", "nonfinite", "stalled", "eta_slip", "gpu_idle", "budget", "finished",
            "scheduler", "sweep_finished", "sweep_breaker", "sweep_budget")


DEFAULT_TRIGGERS = ("failed", "retrying", "hang", "nonfinite", "stalled", "gpu_idle", "budget", "sweep_finished",
                    "sweep_breaker", "sweep_budget")


def trigger_problem(name: str) -> str | None:
    """Why ``name`` is not a trigger, or None."""
    return None if name in TRIGGERS else f"not a trigger (one of: {', '.join(TRIGGERS)})"


class AlertsConfig(_Section):
    """What runyard tells about this run, and where (docs/ALERTS.md): these keys change the global defaults."""

    enabled: bool = True
    """false: no alert about this run at all."""

    on: tuple[str, ...] = Field(default=(), strict=False, title="Triggers turned on")
    """Triggers turned on for this run beyond the defaults, e.g. `["finished", "eta_slip"]`."""

    off: tuple[str, ...] = Field(default=(), strict=False, title="Triggers turned off")
    """Triggers turned off for this run, e.g. `["gpu_idle"]`."""

    channels: tuple[str, ...] = Field(default=(), strict=False)
    """Ids of the channels (`runyard alerts ls`) this run's alerts go to, e.g. `["1", "3"]`; empty: every channel.
    An id that names no channel is refused at submit."""

    repeat_s: float = Field(default=3600.0, ge=0, allow_inf_nan=False, title="Repeat every (s)")
    """An alert still true is sent again after this many seconds (0: never again)."""

    nonfinite_metrics: tuple[str, ...] = Field(default=("loss",), strict=False, title="Watched metrics")
    """`nonfinite` fires when one of these metrics is NaN or infinite on any rank; `["*"]`: every metric."""

    stalled_factor: float = Field(default=10.0, gt=1, allow_inf_nan=False)
    """`stalled` fires when no step completed for this multiple of the run's median step time
    (and at least `stalled_min_s`) while its processes live."""

    stalled_min_s: float = Field(default=120.0, gt=0, allow_inf_nan=False)
    """See `stalled_factor`."""

    eta_slip_ratio: float = Field(default=0.25, gt=0, allow_inf_nan=False)
    """`eta_slip` fires when the run is expected to end this share of its planned duration later
    than its first steady ETA said (0.25: a 4-hour run now ending more than an hour late)."""

    gpu_idle_percent: float = Field(default=5.0, ge=0, le=100, allow_inf_nan=False, title="GPU idle below (%)")
    """`gpu_idle` fires when every GPU the run holds stays under this utilisation for `gpu_idle_s`."""

    gpu_idle_s: float = Field(default=600.0, gt=0, allow_inf_nan=False, title="GPU idle for (s)")
    """See `gpu_idle_percent`."""

    budget_usd: float = Field(default=0.0, ge=0, allow_inf_nan=False, title="Budget (USD)")
    """`budget` fires when the run's cost passes 50%, 80% and 100% of this amount. 0: no budget."""

    budget_pause: bool = False
    """true: pause the run (a checkpoint, then stop; Resume continues) when its cost reaches 100% of `budget_usd`."""

    @field_validator("channels")
    @classmethod
    def _channel_ids(cls, ids: tuple[str, ...]) -> tuple[str, ...]:
        for value in ids:
            if not value.isdigit():
                raise ValueError(f"{value!r}: not a channel id (a number that `runyard alerts ls` shows)")
        return ids

    @field_validator("on", "off")
    @classmethod
    def _known_triggers(cls, names: tuple[str, ...]) -> tuple[str, ...]:
        for name in names:
            problem = trigger_problem(name)
            if problem:
                raise ValueError(f"{name!r}: {problem}")
        return names
