"""What each metric key means to a person: a label, a unit and how to write its numbers.

Plain data and formatting functions (no torch, no streamlit): the dashboard's charts and tables
and the CLI's CSV read the same entries. Values are stored as the trainer and the system monitor
report them (seconds, bytes, fractions); an entry's ``scale`` turns a stored value into the
displayed unit (``step_time`` 0.0123 s -> 12.3 ms, ``mfu`` 0.45 -> 45 %). A key with no entry is
shown as itself, without a unit and unscaled.

A share runyard stores as a fraction (``mfu``, ``eval_accuracy``) may come from a script that
logged it as a percentage already (nanoGPT logs ``mfu`` x 100): a fraction is never beyond ±1, so
a value beyond ±1 is shown as the percentage it is, not multiplied again (:func:`display_scale`;
a chart judges a run's whole series by this rule).

    >>> format_value("lr", 0.001), format_value("mfu", 0.45), format_value("mfu", 38.2), axis_title("step_time")
    ('1e-3', '45%', '38.2%', 'Step time (ms)')
"""

from __future__ import annotations

import math
from collections.abc import Collection, Iterable
from dataclasses import dataclass

NUMBER, SCIENTIFIC, PERCENT = "number", "scientific", "percent"
MIB_PER_GIB = 1024.0


@dataclass(frozen=True)
class MetricSpec:
    """How one metric key is shown."""

    label: str  # the person's name for it: "Step time"
    unit: str = ""  # the displayed unit after ``scale``: "ms", "MiB", "%"; "" for none
    scale: float = 1.0  # displayed number = stored value x scale
    style: str = NUMBER  # NUMBER (4 significant digits), SCIENTIFIC (1e-3) or PERCENT (of a fraction)
    log_ok: bool = True  # whether a log y axis is offered (never for bounded shares like accuracy)


def _ms(label: str) -> MetricSpec:
    return MetricSpec(label, "ms", 1000.0)


def _mib(label: str) -> MetricSpec:
    return MetricSpec(label, "MiB")


def _gib(label: str) -> MetricSpec:
    return MetricSpec(label, "GiB", 1.0 / 2**30)


def _mbps(label: str) -> MetricSpec:
    return MetricSpec(label, "MB/s", 1e-6)


def _share(label: str, scale: float = 100.0) -> MetricSpec:
    """A share shown in percent: ``scale`` 100 for a stored fraction, 1 for a stored percent."""
    return MetricSpec(label, "%", scale, PERCENT, log_ok=False)


def _registry() -> dict[str, MetricSpec]:
    """Every key runyard itself reports: trainer/reporting/monitoring.py, the built-in workloads'
    evaluations, and orchestrator/scheduler/sysmon.py's system series (keyed by their own names)."""
    return {
        # training (trainer/reporting/monitoring.py Interval.report, memory_metrics; workloads' evaluation)
        "loss": MetricSpec("Loss"),
        "eval_loss": MetricSpec("Eval loss"),
        "eval_accuracy": _share("Eval accuracy"),
        "lr": MetricSpec("Learning rate", style=SCIENTIFIC),
        "grad_norm": MetricSpec("Gradient norm"),
        "step_time": _ms("Step time"),
        "data_wait_s": _ms("Data wait per step"),
        "compute_s": _ms("Compute per step"),
        "pre_sync_s": _ms("Time to gradient sync"),
        "samples_per_s": MetricSpec("Throughput", "samples/s"),
        "tokens_per_s": MetricSpec("Token throughput", "tokens/s"),
        "mfu": _share("MFU"),
        "loss_scale": MetricSpec("Loss scale"),
        "mem_allocated_mib": _mib("GPU memory allocated"),
        "mem_reserved_mib": _mib("GPU memory reserved"),
        "mem_peak_mib": _mib("GPU memory peak"),
        "mem_rss_mib": _mib("Process RSS"),
        "epoch": MetricSpec("Epoch"),
        # system (orchestrator/scheduler/sysmon.py): GPUs, the run's processes, the host
        "util_percent": _share("GPU utilization", 1.0),
        "mem_used_bytes": _gib("Memory used"),
        "mem_total_bytes": _gib("Memory total"),
        "power_w": MetricSpec("Power", "W"),
        "power_limit_w": MetricSpec("Power limit", "W"),
        "temp_c": MetricSpec("Temperature", "°C"),
        "sm_clock_mhz": MetricSpec("SM clock", "MHz"),
        "ecc_uncorrected": MetricSpec("Uncorrected ECC errors"),
        "cpu_percent": MetricSpec("CPU", "%"),  # a process tree may use several cores: over 100
        "rss_bytes": _gib("Memory (RSS)"),
        "disk_read_bps": _mbps("Disk read"),
        "disk_write_bps": _mbps("Disk write"),
        "net_sent_bps": _mbps("Network sent"),
        "net_recv_bps": _mbps("Network received"),
    }


# A run's loss, under the names runyard and common scripts log it, first found first.
LOSS_KEYS = ("loss", "train_loss", "train/loss")
# A workload's headline metric: the first of these a run logged (the Run page's Overview curve
# beside the loss, the Runs list's "headline" column).
HEADLINE_KEYS = ("eval_accuracy", "accuracy", "eval_loss", "val_loss", "perplexity", "tokens_per_s", "samples_per_s")


def loss_key(keys: Collection[str]) -> str | None:
    """The run's loss among the metric keys it logged (:data:`LOSS_KEYS`), or None."""
    return next((k for k in LOSS_KEYS if k in keys), None)


def headline_key(keys: Collection[str]) -> str | None:
    """The run's headline metric among the keys it logged (:data:`HEADLINE_KEYS`, never its
    loss), or None."""
    loss = loss_key(keys)
    return next((k for k in HEADLINE_KEYS if k in keys and k != loss), None)


def known_keys() -> list[str]:
    """The keys with an entry, in the registry's order."""
    return list(_registry())


def spec_for(key: str) -> MetricSpec:
    """The entry for ``key``; for an unknown key (a script's own metric) the key itself as the
    label, no unit, no scaling."""
    return _registry().get(key) or MetricSpec(key)


def label(key: str) -> str:
    """The person's name for ``key``: "Step time"; an unknown key as it is."""
    return spec_for(key).label


def unit(key: str) -> str:
    """The displayed unit of ``key`` ("ms", "MiB", "%"), "" for none or an unknown key."""
    return spec_for(key).unit


def axis_title(key: str) -> str:
    """A chart axis or column title: "Step time (ms)", "Loss", or an unknown key as it is."""
    spec = spec_for(key)
    return f"{spec.label} ({spec.unit})" if spec.unit else spec.label


def display_scale(key: str, values: Iterable[float | None] = ()) -> float:
    """The factor from stored ``values`` of ``key`` to its displayed unit: the entry's ``scale``,
    but 1 for a share stored as a fraction (scale 100) when one of ``values`` is beyond ±1: no
    fraction is, so they were logged as a percentage already (nanoGPT's ``mfu`` x 100)."""
    spec = spec_for(key)
    if spec.style == PERCENT and spec.scale == 100.0 and any(
            v is not None and math.isfinite(v) and abs(v) > 1 for v in values):
        return 1.0
    return spec.scale


def scaled(key: str, value: float) -> float:
    """``value`` as stored, in the displayed unit of ``key`` (:func:`display_scale`)."""
    return value * display_scale(key, (value,))


def format_number(key: str, value: float | None) -> str:
    """``value`` (as stored) in the displayed unit of ``key``, without the unit: lr 0.001 ->
    "1e-3", mfu 0.45 -> "45", step_time 0.0123 -> "12.3"; None -> "–", NaN -> "NaN"."""
    if value is None:
        return "–"
    if math.isnan(value):
        return "NaN"
    spec = spec_for(key)
    shown = value * display_scale(key, (value,))
    if spec.style == SCIENTIFIC:
        return _scientific(shown)
    if spec.style == PERCENT:
        return f"{shown:.3g}" if abs(shown) < 10 else _trimmed(f"{shown:.1f}")
    return _general(shown)


def format_value(key: str, value: float | None) -> str:
    """``value`` (as stored) with its unit: "1e-3", "45%", "12.3 ms", "1,024 MiB"; an unknown
    key's value in 4 significant digits; None -> "–"."""
    number = format_number(key, value)
    spec = spec_for(key)
    if value is None or math.isnan(value) or not spec.unit:
        return number
    return f"{number}%" if spec.unit == "%" else f"{number} {spec.unit}"


def d3_format(key: str) -> str:
    """The d3-format string for ``key``'s displayed numbers in a Vega-Lite axis or tooltip:
    "~e" (1e-3) for scientific entries, 4 significant digits otherwise."""
    return ".3~e" if spec_for(key).style == SCIENTIFIC else ",.4~g"


def axis_format(key: str) -> str | None:
    """The d3-format for ``key``'s axis labels: "~e" (1e-3) for scientific entries, None for
    Vega's default (it picks the digits from the tick spacing)."""
    return "~e" if spec_for(key).style == SCIENTIFIC else None


def _scientific(value: float) -> str:
    """1e-3 style: at most 3 significant digits, no padded exponent (Python writes 1e-03)."""
    if value == 0:
        return "0"
    mantissa, exponent = f"{value:.2e}".split("e")
    mantissa = mantissa.rstrip("0").rstrip(".")
    return f"{mantissa}e{int(exponent)}"


def _trimmed(text: str) -> str:
    return text.rstrip("0").rstrip(".") if "." in text else text


def _general(value: float) -> str:
    """4 significant digits, thousands separated, no trailing zeros: 12.3, 1,024, 0.000123."""
    if value != 0 and (abs(value) >= 1e7 or abs(value) < 1e-4):
        return _scientific(value)
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    return f"{value:.4g}"
