"""The Run page's system section (app/system.py): its charts' axes titled and scaled by the metric
registry, and its panels drawn by Streamlit's AppTest from rows of a real SQLite database: host,
process and GPU panels, and the newest window's summary."""

from __future__ import annotations

import io
import json
from collections.abc import Iterator

import pandas as pd
import pyarrow as pa
import pytest
import streamlit as st
from sqlalchemy.orm import Session, sessionmaker
from streamlit.testing.v1 import AppTest

from app import system
from app.system import summary_line
from db.models import SystemMetric
from db.requests import create_run
from db.sysmetrics import latest_window
from db.vocabulary.config import RunConfig
from db.vocabulary.cost import Price
from db.vocabulary.settings import Settings
from tests.unit.apptest import new_app

START = 1_000_000.0  # a window boundary: samples at START, +2, ... +8 fall in one window


# -- the Run page's system section --------------------------------------------------------------


def _panel_app(run_id: int) -> None:
    from app.system import system_panels  # noqa: PLC0415 - AppTest.from_function runs this function's source alone

    system_panels(run_id)


@pytest.fixture
def app_caches(settings: Settings) -> Iterator[None]:
    st.cache_resource.clear()
    st.cache_data.clear()
    yield
    st.cache_resource.clear()
    st.cache_data.clear()


def add_rows(sessions: sessionmaker[Session], run_id: int, gpus: dict[int, int] | None = None) -> None:
    """Three windows of host and process rows for ``run_id``; GPU rows for ``gpus`` (index -> rank)."""
    with sessions() as s:
        for w in range(3):
            at = START + 10 * w

            def row(device: str, key: str, value: float, run: int | None = None, rank: int | None = None,
                    at: float = at) -> None:
                s.add(SystemMetric(at=at, host="testhost", device=device, run_id=run, rank=rank, key=key,
                                   min=value * 0.9, mean=value, max=value * 1.1, count=5))

            for key, value in [("cpu_percent", 50.0), ("mem_used_bytes", 8e9), ("mem_total_bytes", 16e9),
                               ("disk_read_bps", 1e6), ("disk_write_bps", 2e6), ("net_sent_bps", 3e5),
                               ("net_recv_bps", 4e5)]:
                row("host", key, value)
            for rank in (None, 0, 1):
                row("procs", "cpu_percent", 99.0, run_id, rank)
                row("procs", "rss_bytes", 5e8, run_id, rank)
            for index, rank in (gpus or {}).items():
                for key, value in [("util_percent", 90.0), ("mem_used_bytes", 40e9), ("mem_total_bytes", 80e9),
                                   ("power_w", 500.0), ("power_limit_w", 700.0), ("temp_c", 60.0),
                                   ("sm_clock_mhz", 1980.0), ("ecc_uncorrected", 0.0)]:
                    row(f"gpu{index}", key, value, run_id, rank)
        s.commit()


def _chart_titles(at: AppTest) -> list[str]:
    titles = []
    for chart in at.get("vega_lite_chart"):
        spec = json.loads(chart.proto.spec)
        titles.append(spec.get("title") or next(layer["title"] for layer in spec.get("layer", []) if "title" in layer))
    return titles


def _chart_frame(at: AppTest, title: str) -> pd.DataFrame:
    for chart, chart_title in zip(at.get("vega_lite_chart"), _chart_titles(at), strict=True):
        if chart_title == title:
            return pa.ipc.open_stream(io.BytesIO(chart.proto.datasets[0].data.data)).read_all().to_pandas()
    raise AssertionError(f"no chart titled {title!r}")


def _run(sessions: sessionmaker[Session], settings: Settings) -> int:
    config = RunConfig.model_validate({"name": "panel"})
    with sessions() as s:
        run = create_run(s, config, settings.runs_dir, Price(usd_per_hour=1.0, unit="cpu-hour"))
        s.commit()
        return run.id


def test_panels_for_a_cpu_run_say_no_gpu_and_draw_processes_and_host(
    sessions: sessionmaker[Session], settings: Settings, app_caches: None
) -> None:
    run_id = _run(sessions, settings)
    add_rows(sessions, run_id)
    at = AppTest.from_function(_panel_app, args=(run_id,), default_timeout=30).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("no GPU" in i.value for i in at.info)
    # (AppTest lists a two-column grid column by column)
    assert sorted(_chart_titles(at)) == ["Disk", "Host CPU", "Host memory", "Network", "Process CPU",
                                         "Process memory (RSS)"]
    cpu = _chart_frame(at, "Process CPU")
    assert sorted(cpu["series"].unique()) == ["all processes", "rank 0", "rank 1"]
    assert len(cpu) == 3 * 3  # three windows of three series


def test_panels_for_a_gpu_run_draw_per_gpu_charts(
    sessions: sessionmaker[Session], settings: Settings, app_caches: None
) -> None:
    run_id = _run(sessions, settings)
    add_rows(sessions, run_id, gpus={2: 0, 3: 1})
    at = AppTest.from_function(_panel_app, args=(run_id,), default_timeout=30).run()
    assert not at.exception, [e.value for e in at.exception]
    assert not at.info
    titles = _chart_titles(at)
    assert sorted(titles[:5]) == ["GPU memory", "GPU power", "GPU temperature", "GPU utilization", "SM clock"]
    assert len(titles) == 5 + 2 + 4  # then the processes and the host
    util = _chart_frame(at, "GPU utilization")
    assert sorted(util["series"].unique()) == ["gpu2 · rank 0", "gpu3 · rank 1"]
    power = _chart_frame(at, "GPU power")
    assert set(power["what"]) == {"power", "limit"}
    memory = _chart_frame(at, "GPU memory")
    assert memory.loc[memory["what"] == "total", "mean"].max() == pytest.approx(80e9 / 2**30)


def test_panels_without_any_rows_say_so(sessions: sessionmaker[Session], settings: Settings, app_caches: None) -> None:
    run_id = _run(sessions, settings)
    at = AppTest.from_function(_panel_app, args=(run_id,), default_timeout=30).run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("no GPU" in i.value for i in at.info)
    assert any("No system samples" in c.value for c in at.caption)
    assert not at.get("vega_lite_chart")


def test_the_run_page_summarizes_the_newest_window_and_draws_charts_on_demand(
    sessions: sessionmaker[Session], settings: Settings, app_caches: None
) -> None:
    """The Run page shows the newest window in one line; the charts only once asked for."""
    run_id = _run(sessions, settings)
    add_rows(sessions, run_id, gpus={2: 0, 3: 1})
    with sessions() as s:
        latest = latest_window(s, run_id)
        assert latest_window(s, run_id + 1) is None
    assert latest is not None and latest["at"] == START + 20 and latest["gpus"] == 2
    line = summary_line(latest)
    assert "GPU utilization 90%, memory 37.3 / 75 GiB (mean of 2 GPU(s))" in line
    assert "processes 99% of one core, 0.5 GiB RSS" in line and "host CPU 50%" in line
    assert "No system samples" in summary_line(None)

    at = new_app()
    at.query_params["run"] = str(run_id)
    at.switch_page("views/run.py").run()
    assert not at.exception, [e.value for e in at.exception]
    assert any("GPU utilization 90%" in c.value for c in at.caption)
    assert not [t for t in _chart_titles(at) if t.startswith("GPU")]  # no system chart yet
    at.segmented_control(key="section").set_value("System").run()  # the Run page's System section
    at.toggle(key=f"system-{run_id}").set_value(True).run()
    assert not at.exception, [e.value for e in at.exception]
    assert {"GPU utilization", "GPU memory", "Host CPU"} <= set(_chart_titles(at))


def test_system_chart_axes_are_titled_and_scaled_by_the_registry() -> None:
    rows = pd.DataFrame([{"at": 1000.0 + 10 * i, "host": "h", "device": "gpu0", "run_id": 1, "rank": 0, "key": key,
                          "min": v, "mean": v, "max": v, "count": 5, "series": "gpu0", "what": what}
                         for i in range(3) for key, v, what in (("mem_used_bytes", 2.0 * 2**30, "used"),
                                                                ("util_percent", 90.0, ""))])
    util = system.band_line(rows[rows["key"] == "util_percent"], "GPU utilization", "util_percent")
    assert util is not None
    assert '"title": "GPU utilization (%)"' in json.dumps(util.to_dict())
    memory = system.used_vs_total(rows[rows["key"] == "mem_used_bytes"], "GPU memory", "mem_used_bytes", "Memory (GiB)")
    assert memory is not None
    spec = memory.to_dict()
    assert spec["encoding"]["y"]["title"] == "Memory (GiB)"
    assert {row["mean"] for data in spec["datasets"].values() for row in data} == {2.0}  # bytes shown in GiB
