"""Prometheus: ``GET /metrics`` on the UI's port, for the machine's own monitoring.

The UI server (app/server/asgi.py) puts :class:`MetricsRoute` in front of the gate (app/server/gate.py): a
request for ``/metrics`` is answered here and never reaches the gate or Streamlit; every other
request passes through untouched. ``/metrics`` takes its own credential, a read-only scrape
token (``Authorization: Bearer TOKEN``): ``runyard token --scrape`` prints it (created 0600 in
the data folder beside the UI's token on first use), ``runyard token --scrape --rotate``
replaces it alone, and nothing else ends it. The UI's token, its session cookie and ``?token=``
open nothing here, and the scrape token opens nothing of the UI (the gate knows only the UI's).
The Host and Origin rules of the UI apply as they do to every request (DNS rebinding).

Each scrape reads the database once, in one session (:class:`RunyardCollector`, a custom
collector: no process-wide gauges that would keep the labels of runs long gone). Only active
runs (not ended) and runs that ended within the last ``RUNYARD_METRICS_RECENT_S`` seconds
(default an hour) get series, so labels stay bounded. Every number is the one the Runs page,
the Run page and ``runyard show`` give: the run summaries of db/run_summary.py (step, ETA, cost),
its goodput, and the pace the ETA projects with (db/vocabulary/cost.py's :func:`~db.vocabulary.cost.recent_pace`).

Series (``run_id`` on every ``runyard_run_*`` one):

- ``runyard_run_info{run_id,name,executor}`` 1;
- ``runyard_run_state{run_id,state}`` 1 for the run's state, 0 for each other state;
- ``runyard_run_step``, ``runyard_run_steps_per_second`` (while it runs),
  ``runyard_run_eta_seconds`` (while it runs with a total of steps; 0 once succeeded),
  ``runyard_run_goodput_ratio``, ``runyard_run_cost_dollars`` (the cloud reference),
  ``runyard_run_your_cost_dollars`` (your cost, once a tariff is set: docs/COSTS.md),
  ``runyard_run_last_step_timestamp_seconds`` (epoch seconds of the newest step);
- ``runyard_run_energy_joules_total{run_id,method}``: the energy the run's devices used so far
  (db/vocabulary/energy.py: ``method`` is measured, estimated or not measured (part of it read),
  the run's weakest), a counter; none while nothing was measured;
- ``runyard_run_restarts_total{run_id,cause}``: attempts launched after an attempt that ended
  with ``cause`` (db/vocabulary/causes.py), a counter;
- ``runyard_queue_runs{state}``: how many runs of the database are in each state;
- ``runyard_gpu_assigned_info{gpu_uuid,run_id}`` 1 for each GPU of this machine a running local
  attempt holds (the UUIDs the scheduler published on its heartbeat), so DCGM-exporter's series
  join to runs;
- ``runyard_alerts_firing{trigger}``: open alerts per trigger (:func:`firing_alerts`);
- the sweeps' (``runyard_sweep_*{sweep,...}``, ``runyard_sweeps{state}``): app/server/sweep_series.py.
"""

from __future__ import annotations

import functools
import json
import logging
import socket
import time
from collections.abc import Callable, Iterable, Mapping
from itertools import pairwise
from pathlib import Path
from typing import Any

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, generate_latest
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric
from prometheus_client.registry import Collector
from sqlalchemy import func, or_, select
from sqlalchemy.exc import SQLAlchemyError
from sqlalchemy.orm import Session, sessionmaker
from starlette.concurrency import run_in_threadpool
from starlette.datastructures import Headers
from starlette.responses import PlainTextResponse, Response

from app.server.access import AccessPolicy, FailedLogins, Verdict, token_matches
from app.server.sweep_series import read_sweeps, sweep_families
from db import DatabaseError, efficiency, metricstore, queries, run_summary
from db.engine import make_engine, make_read_only_engine, make_sessionmaker, sqlite_path
from db.lease import on_this_host
from db.models import ALERT_OPEN, Alert, Attempt, Run
from db.states import TERMINAL, AttemptStatus, RunStatus
from db.vocabulary.cost import recent_pace
from db.vocabulary.energy import JOULES_PER_KWH
from db.vocabulary.inventory import Inventory
from db.vocabulary.scheduler_file import read_scheduler_file
from db.vocabulary.settings import EnvSettings, Settings
from orchestrator.ui_access import TokenSource

logger = logging.getLogger(__name__)

METRICS_PATH = "/metrics"
# How long after it ended a run keeps its series: RUNYARD_METRICS_RECENT_S (db/vocabulary/settings.py).
DEFAULT_RECENT_S: float = EnvSettings.model_fields["metrics_recent_s"].default
_HEADERS = {"Cache-Control": "no-store", "X-Content-Type-Options": "nosniff"}


def firing_alerts(session: Session) -> dict[str, int]:
    """The alerts open now (fired, not resolved nor closed), counted by trigger (``{"hang": 1}``):
    ``runyard_alerts_firing``; runyard's own alerts (the scheduler's) count too."""
    rows = session.execute(select(Alert.trigger, func.count()).where(Alert.state == ALERT_OPEN)
                           .group_by(Alert.trigger)).all()
    return {trigger: int(n) for trigger, n in rows}


def _gauge(name: str, doc: str, labels: list[str]) -> GaugeMetricFamily:
    return GaugeMetricFamily(name, doc, labels=labels)


class RunyardCollector(Collector):
    """The series of one scrape, read from the database in one session.

    Args:
        sessions: The database's sessions; ``None`` while there is no database yet (a SQLite
            file not created: reading would create an empty one), when only zeros are given.
        heartbeat_file: The scheduler's heartbeat file (its inventory names the GPUs' UUIDs).
        recent_s: How long after it ended a run keeps its series.
        host: This machine's name: GPUs are named for the attempts its schedulers launched.
        clock: The wall clock (epoch seconds).
    """

    def __init__(self, sessions: Callable[[], sessionmaker[Session] | None], heartbeat_file: Path | None,
                 recent_s: float = DEFAULT_RECENT_S, host: str | None = None,
                 clock: Callable[[], float] = time.time) -> None:
        self.sessions = sessions
        self.heartbeat_file = heartbeat_file
        self.recent_s = recent_s
        self.host = host or socket.gethostname()
        self.clock = clock

    def collect(self) -> Iterable[Metric]:
        now = self.clock()
        maker = self.sessions()
        if maker is None:
            return [*_families([], {}, [], {}, {}), *sweep_families([], {})]
        with maker() as session:
            return self._read(session, now)

    # -- the one read ------------------------------------------------------------------------

    def _read(self, session: Session, now: float) -> list[Metric]:
        terminal = [s.value for s in TERMINAL]
        runs = list(session.scalars(
            select(Run).where(or_(Run.status.not_in(terminal), Run.ended_at >= now - self.recent_s))
            .order_by(Run.id)))
        summaries = run_summary.run_summaries(session, runs, now)
        ids = [r.id for r in runs]
        attempts: dict[int, list[Any]] = {run_id: [] for run_id in ids}
        if ids:
            for a in session.execute(
                select(Attempt.run_id, Attempt.number, Attempt.cause, Attempt.first_step_at, Attempt.progress_at)
                .where(Attempt.run_id.in_(ids)).order_by(Attempt.run_id, Attempt.number)
            ):
                attempts[a.run_id].append(a)
        # The pace the ETA projects with: rank 0's newest points of a live run's newest attempt (its
        # loss, or the metric it reports: metricstore.progress_key).
        live = [(r.id, attempts[r.id][-1].number, 0) for r in runs
                if attempts[r.id] and RunStatus(r.status) not in TERMINAL]
        points = metricstore.recent_progress(session, live, limit=run_summary.ETA_POINTS)
        pace = {key[0]: recent_pace([(int(s), float(t)) for s, _, t in pts]) for key, pts in points.items()}
        goodput = {r.id: efficiency.goodput(session, r, queries.attempts_of(session, r.id), now) for r in runs}
        counts = dict(session.execute(select(Run.status, func.count()).group_by(Run.status)).all())
        gpus = self._gpus(session)
        alerts = firing_alerts(session)
        extra = {run_id: {"attempts": attempts[run_id], "pace": pace.get(run_id), "goodput": goodput[run_id]}
                 for run_id in ids}
        sweeps, sweep_counts = read_sweeps(session, now, self.recent_s)
        return [*_families(summaries, extra, gpus, alerts, counts), *sweep_families(sweeps, sweep_counts)]

    def _gpus(self, session: Session) -> list[tuple[str, int]]:
        """(GPU UUID, run id) for each GPU a running local attempt launched on this host holds."""
        record = read_scheduler_file(self.heartbeat_file) if self.heartbeat_file is not None else None
        published = (record or {}).get("inventory")
        try:
            uuids = Inventory.from_json(published).gpu_uuids if isinstance(published, dict) else ()
        except (KeyError, TypeError, ValueError):
            uuids = ()
        if not uuids:
            return []
        held = []
        for run_id, devices_json in session.execute(
            select(Attempt.run_id, Attempt.devices_json)
            .where(Attempt.status == AttemptStatus.RUNNING.value, Attempt.executor == "local",
                   on_this_host(self.host))
            .order_by(Attempt.run_id)
        ):
            try:
                devices = [int(d) for d in json.loads(devices_json or "[]")]
            except (ValueError, TypeError):
                continue  # a hand-edited row: its GPUs cannot be named
            held += [(uuids[d], run_id) for d in devices if 0 <= d < len(uuids)]
        return held


def _families(summaries: list[dict[str, Any]], extra: dict[int, dict[str, Any]], gpus: list[tuple[str, int]],
              alerts: Mapping[str, int], counts: Mapping[str, int]) -> list[Metric]:
    """The metric families of one scrape: ``summaries`` are db/run_summary.py's run summaries and
    ``extra`` what else was read of each run (its attempts, pace and goodput), by run id."""
    info = _gauge("runyard_run_info", "A run with series here (active, or ended recently): its name and executor.",
                  ["run_id", "name", "executor"])
    state = _gauge("runyard_run_state", "1 for the run's state, 0 for the others.", ["run_id", "state"])
    step = _gauge("runyard_run_step", "The run's newest step (its current lineage).", ["run_id"])
    rate = _gauge("runyard_run_steps_per_second",
                  "Steps per second over the newest progress points (the pace the ETA projects with), "
                  "while the run runs.", ["run_id"])
    eta = _gauge("runyard_run_eta_seconds", "Seconds until the run's last step at its recent pace (0 once succeeded).",
                 ["run_id"])
    goodput = _gauge("runyard_run_goodput_ratio",
                     "Productive step time over the time the run held its devices or waited to retry (0-1).",
                     ["run_id"])
    cost = _gauge("runyard_run_cost_dollars", "The cloud reference: the run's device time so far at the list price it "
                  "was submitted at, in US dollars.", ["run_id"])
    yours = _gauge("runyard_run_your_cost_dollars", "Your cost so far: the run's energy x your tariff x PUE plus your "
                   "hardware's amortisation (settings.toml), in US dollars; absent until a tariff is set.", ["run_id"])
    restarts = CounterMetricFamily("runyard_run_restarts_total",
                                   "Attempts launched after an attempt that ended with this cause.",
                                   labels=["run_id", "cause"])
    energy = CounterMetricFamily("runyard_run_energy_joules_total",
                                 "Energy the run's devices used so far (measured: a counter; estimated: power x time).",
                                 labels=["run_id", "method"])
    last = _gauge("runyard_run_last_step_timestamp_seconds", "When the run's newest step completed (epoch seconds).",
                  ["run_id"])
    for s in summaries:
        run_id = str(s["id"])
        more = extra[s["id"]]
        info.add_metric([run_id, s["name"], s["executor"]], 1)
        for st in RunStatus:
            state.add_metric([run_id, st.value], 1 if s["status"] == st.value else 0)
        step.add_metric([run_id], s["step"])
        if more["pace"] is not None:
            rate.add_metric([run_id], more["pace"])
        if s["eta_s"] is not None:
            eta.add_metric([run_id], s["eta_s"])
        if more["goodput"] is not None:
            goodput.add_metric([run_id], more["goodput"])
        cost.add_metric([run_id], s["cost_usd"])
        used = s.get("energy") or {}
        if used.get("kwh") is not None:
            energy.add_metric([run_id, used["method"]], used["kwh"] * JOULES_PER_KWH)
        if s["cost"]["yours"]["usd"] is not None:
            yours.add_metric([run_id], s["cost"]["yours"]["usd"])
        by_cause: dict[str, int] = {}
        run_attempts = more["attempts"]
        for before, _after in pairwise(run_attempts):
            if before.cause is not None:
                by_cause[before.cause] = by_cause.get(before.cause, 0) + 1
        for cause, n in sorted(by_cause.items()):
            restarts.add_metric([run_id, cause], n)
        stepped = [a for a in run_attempts if a.first_step_at is not None]
        if stepped:
            newest = stepped[-1]
            last.add_metric([run_id], newest.progress_at or newest.first_step_at)
    queue = _gauge("runyard_queue_runs", "Runs of the database in each state.", ["state"])
    for st in RunStatus:
        queue.add_metric([st.value], counts.get(st.value, 0))
    assigned = _gauge("runyard_gpu_assigned_info",
                      "1 for each GPU (by NVML UUID, DCGM-exporter's UUID label) that a running attempt holds.",
                      ["gpu_uuid", "run_id"])
    for uuid, holder in gpus:
        assigned.add_metric([uuid, str(holder)], 1)
    firing = _gauge("runyard_alerts_firing", "Alerts open now, by trigger.", ["trigger"])
    for trigger, n in sorted(alerts.items()):
        firing.add_metric([trigger], n)
    return [info, state, step, rate, eta, goodput, cost, yours, energy, restarts, last, queue, assigned, firing]


# -- the route -----------------------------------------------------------------------------------

Scope = Any
ASGIApp = Callable[[Scope, Any, Any], Any]


def _bearer(headers: Headers) -> str | None:
    """The credential of ``Authorization: Bearer T`` (Prometheus' ``authorization`` setting)."""
    scheme, _, credential = headers.get("authorization", "").partition(" ")
    if scheme.lower() != "bearer":
        return None
    return credential.strip() or None


class MetricsRoute:
    """An ASGI app that answers ``GET /metrics`` itself and passes everything else to ``app``.

    Args:
        app: The gate in front of Streamlit (app/server/gate.py).
        policy: The UI's access policy: its Host and Origin rules apply here too.
        token: The scrape token in force (re-read when ``runyard token --scrape --rotate``
            replaces its file); nothing is accepted while there is none.
        registry: What a scrape renders (a registry holding :class:`RunyardCollector`).
    """

    def __init__(self, app: ASGIApp, policy: AccessPolicy, token: TokenSource, registry: CollectorRegistry) -> None:
        self.app = app
        self.policy = policy
        self.token = token
        self.registry = registry
        self.failed = FailedLogins()

    async def __call__(self, scope: Scope, receive: Any, send: Any) -> None:
        if scope["type"] != "http" or scope["path"] != METRICS_PATH:
            await self.app(scope, receive, send)
            return
        headers = Headers(scope=scope)
        verdict = self._check(scope, headers)
        if not verdict.allowed:
            logger.info("refused %s (Host %r): %s", METRICS_PATH, headers.get("host"), verdict.reason)
            extra = {"WWW-Authenticate": 'Bearer realm="runyard metrics"'} if verdict.status == 401 else {}
            await PlainTextResponse(f"{verdict.reason}\n", status_code=verdict.status,
                                    headers={**_HEADERS, **extra})(scope, receive, send)
            return
        if scope.get("method") not in ("GET", "HEAD"):
            await PlainTextResponse(f"{METRICS_PATH} answers GET only\n", status_code=405,
                                    headers={**_HEADERS, "Allow": "GET, HEAD"})(scope, receive, send)
            return
        try:
            body = await run_in_threadpool(generate_latest, self.registry)
        except (SQLAlchemyError, DatabaseError) as exc:
            reason = str(exc).splitlines()[0] if str(exc) else type(exc).__name__
            logger.warning("%s: the database cannot be read: %s", METRICS_PATH, reason)
            await PlainTextResponse("the database cannot be read now; see the UI's log\n", status_code=503,
                                    headers=_HEADERS)(scope, receive, send)
            return
        await Response(body, media_type=CONTENT_TYPE_LATEST, headers=_HEADERS)(scope, receive, send)

    def _check(self, scope: Scope, headers: Headers) -> Verdict:
        host = headers.get("host")
        scheme = "https" if scope.get("scheme") == "https" else "http"
        for verdict in (self.policy.check_host(host), self.policy.check_origin(headers.get("origin"), host, scheme)):
            if not verdict.allowed:
                return verdict
        if headers.get("sec-fetch-site", "").lower() == "cross-site":
            return Verdict(False, 403, "requests sent by pages of other sites are refused")
        client = (scope.get("client") or ("?",))[0]
        offered = _bearer(headers)
        if offered is None:
            return Verdict(False, 401, f"{METRICS_PATH} needs the scrape token: Authorization: Bearer TOKEN, "
                                       "with the token `runyard token --scrape` prints")
        token = self.token.current()
        if token_matches(token, offered):  # before the rate limit: guesses never lock out the scraper
            return Verdict(True)
        if token is None:
            return self.failed.refuse(client, 401, "no scrape token has been made yet: run `runyard token --scrape` "
                                                   "on the machine that runs runyard")
        return self.failed.refuse(client, 401, "wrong scrape token (`runyard token --scrape` prints the one in force)")


def metrics_route(app: ASGIApp, policy: AccessPolicy, settings: Settings, writable: bool = True,
                  recent_s: float = DEFAULT_RECENT_S) -> MetricsRoute:
    """``app`` behind :class:`MetricsRoute`, reading ``settings``' database (read-only where
    the data folder cannot be written, as the UI does)."""
    db_file = sqlite_path(settings.db_url)

    @functools.cache  # the one engine, made at the first scrape that reads
    def engine_sessions() -> sessionmaker[Session]:
        return make_sessionmaker((make_engine if writable else make_read_only_engine)(settings.db_url))

    def sessions() -> sessionmaker[Session] | None:
        if db_file is not None and not db_file.exists():
            return None  # nothing has created the database yet: reading would create an empty file
        return engine_sessions()

    registry = CollectorRegistry(auto_describe=False)
    registry.register(RunyardCollector(sessions, settings.scheduler_file, recent_s))
    return MetricsRoute(app, policy, TokenSource(settings.scrape_token_file), registry)
