"""Read queries over the system monitor's 10-s aggregates (``system_metrics``): plain dicts for
the UI and the CLI, never ORM objects."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from sqlalchemy import BigInteger, Select, cast, func, select
from sqlalchemy.orm import Session

from db.models import SystemMetric

if TYPE_CHECKING:
    from typing_extensions import Unpack  # Select[Unpack[tuple[Any, ...]]]: any columns

WINDOW_S = 10.0  # the monitor's aggregation window (orchestrator.scheduler.sysmon.WINDOW_S)

_COLUMNS = ("at", "host", "device", "run_id", "rank", "key", "min", "mean", "max", "count")


def system_series(
    session: Session,
    *,
    run_id: int | None = None,
    host_only: bool = False,
    since: float | None = None,
    until: float | None = None,
    host: str | None = None,
    bucket_s: float | None = None,
) -> list[dict[str, Any]]:
    """System metric rows, oldest first within each series.

    Args:
        session: an open session.
        run_id: only this run's rows (its processes, and the GPUs it held).
        host_only: only the machine-wide rows (device ``host``); with ``run_id``, those of the
            hosts the run ran on, while it ran.
        since: only windows that start at or after this time (epoch s).
        until: only windows that start at or before this time (epoch s).
        host: only rows of this host.
        bucket_s: merge the 10-s windows into buckets this long (a whole multiple of 10 s), so a
            long run's chart gets a few hundred points: min of mins, count-weighted mean, max of
            maxes.

    Returns:
        Dicts with ``at`` (window or bucket start, epoch s), ``host``, ``device``, ``run_id``,
        ``rank``, ``key``, ``min``, ``mean``, ``max`` and ``count`` (samples in it).
    """
    m = SystemMetric
    conditions = []
    if host_only:
        conditions.append(m.device == "host")
        if run_id is not None:
            span = run_span(session, run_id)
            if span is None:
                return []
            hosts = session.scalars(select(m.host).where(m.run_id == run_id).distinct()).all()
            conditions += [m.host.in_(hosts), m.at >= span[0], m.at <= span[1]]
    elif run_id is not None:
        conditions.append(m.run_id == run_id)
    if since is not None:
        conditions.append(m.at >= since)
    if until is not None:
        conditions.append(m.at <= until)
    if host is not None:
        conditions.append(m.host == host)

    query: Select[Unpack[tuple[Any, ...]]]  # of either branch's columns
    if bucket_s is not None and bucket_s > WINDOW_S:
        width = int(bucket_s)
        # Integer floor division on whole seconds: window starts are multiples of 10 s, so the
        # CAST is exact (PostgreSQL rounds a float CAST, SQLite truncates).
        bucket = (cast(m.at, BigInteger) // width) * width
        query = (
            select(bucket.label("at"), m.host, m.device, m.run_id, m.rank, m.key,
                   func.min(m.min), func.sum(m.mean * m.count) / func.sum(m.count), func.max(m.max),
                   func.sum(m.count))
            .where(*conditions)
            .group_by(m.host, m.device, m.run_id, m.rank, m.key, bucket)
            .order_by(m.host, m.device, m.run_id, m.rank, m.key, bucket)
        )
    else:
        query = (
            select(m.at, m.host, m.device, m.run_id, m.rank, m.key, m.min, m.mean, m.max, m.count)
            .where(*conditions)
            .order_by(m.host, m.device, m.run_id, m.rank, m.key, m.at)
        )
    return [_row(values) for values in session.execute(query).all()]


def _row(values: Any) -> dict[str, Any]:
    row = dict(zip(_COLUMNS, values, strict=True))
    row["at"] = float(row["at"])
    row["mean"] = float(row["mean"])
    row["count"] = int(row["count"])
    return row


def run_span(session: Session, run_id: int) -> tuple[float, float] | None:
    """When the monitor saw the run: the first window's start and the last window's end."""
    first, last = session.execute(
        select(func.min(SystemMetric.at), func.max(SystemMetric.at)).where(SystemMetric.run_id == run_id)
    ).one()
    if first is None:
        return None
    return float(first), float(last) + WINDOW_S


def latest_window(session: Session, run_id: int) -> dict[str, Any] | None:
    """The run's newest 10-s window at a glance, without reading its history: the mean GPU
    utilization and memory over its GPUs, its processes' CPU % and RSS, and the host's CPU %
    (None where not sampled). None if the run has no samples."""
    m = SystemMetric
    at = session.scalar(select(func.max(m.at)).where(m.run_id == run_id))
    if at is None:
        return None
    rows = session.execute(select(m.host, m.device, m.rank, m.key, m.mean).where(m.run_id == run_id, m.at == at)).all()
    hosts = {h for h, _, _, _, _ in rows}
    host_cpu = session.execute(
        select(func.avg(m.mean)).where(m.host.in_(hosts), m.device == "host", m.key == "cpu_percent", m.at == at)
    ).scalar()

    def mean_of(device_prefix: str, key: str, rank_is_none: bool = False) -> float | None:
        values = [v for _, d, r, k, v in rows
                  if d.startswith(device_prefix) and k == key and (r is None or not rank_is_none)]
        return sum(values) / len(values) if values else None

    gpus = {d for _, d, _, _, _ in rows if d.startswith("gpu")}
    return {
        "at": float(at), "gpus": len(gpus),
        "gpu_util_percent": mean_of("gpu", "util_percent"),
        "gpu_mem_used_bytes": mean_of("gpu", "mem_used_bytes"),
        "gpu_mem_total_bytes": mean_of("gpu", "mem_total_bytes"),
        "procs_cpu_percent": mean_of("procs", "cpu_percent", rank_is_none=True),
        "procs_rss_bytes": mean_of("procs", "rss_bytes", rank_is_none=True),
        "host_cpu_percent": None if host_cpu is None else float(host_cpu),
    }


def gpu_devices(session: Session, run_id: int) -> list[dict[str, Any]]:
    """The GPUs a run used, by host and NVML index: ``[{"host", "device", "rank"}]``.

    ``rank`` is the rank seen on it (None while no rank process was found for it).
    """
    rows = session.execute(
        select(SystemMetric.host, SystemMetric.device, SystemMetric.rank)
        .where(SystemMetric.run_id == run_id, SystemMetric.device.like("gpu%"))
        .distinct()
    ).all()
    found: dict[tuple[str, str], int | None] = {}
    for host, device, rank in rows:
        if found.get((host, device)) is None:
            found[(host, device)] = rank
    return [
        {"host": host, "device": device, "rank": rank}
        for (host, device), rank in sorted(found.items(), key=lambda item: (item[0][0], _device_index(item[0][1])))
    ]


def _device_index(device: str) -> int:
    match = re.fullmatch(r"gpu(\d+)", device)
    return int(match.group(1)) if match else -1
