"""Findings into alerts and deliveries: the scheduler's ``alerts`` job.

Each pass (every :data:`EVERY_S`, a job of its own beside ``tick``, ``max_instances=1``) reads
the database (:mod:`.triggers`), then for each finding:

- a new key: an ``alerts`` row (state ``open``) and one delivery per channel that takes it;
- an open key still found: sent again once the run's ``alerts.repeat_s`` has passed since the
  last send (condition triggers only: the others are one moment each);
- an open key no longer found: ``resolved`` with a message for the condition triggers whose run
  still runs, else ``closed`` without one.

Deliveries are rows; the :class:`~.delivery.DeliveryWorker` sends them. Nothing here sends, so a
channel that is down never slows the job, and the job never slows the tick.
"""

from __future__ import annotations

import datetime
import logging
import socket
import time
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

from sqlalchemy import select
from sqlalchemy.exc import IntegrityError
from sqlalchemy.orm import Session, sessionmaker

from db.models import ALERT_CLOSED, ALERT_OPEN, ALERT_RESOLVED, Alert, AlertDelivery, Run, Sweep
from db.requests import request_cancel
from db.states import ACTIVE, RunStatus
from orchestrator.alerts.delivery import PENDING, DeliveryWorker
from orchestrator.alerts.findings import Finding, RunRules, alerts_config, rules_for, run_label
from orchestrator.alerts.store import AlertSettings, AlertStore, Channel, Defaults
from orchestrator.alerts.sweep_triggers import sweep_alerts, sweep_label, sweep_of_key, sweep_rules
from orchestrator.alerts.triggers import RESOLVABLE, Evaluator
from orchestrator.ui_access import read_ui_file, url_host

if TYPE_CHECKING:
    from pathlib import Path


logger = logging.getLogger(__name__)

EVERY_S = 5.0
# On its first pass the job looks back this far (a scheduler restarted soon after a failure
# still tells it once; the alert key keeps it from being told twice).
LOOKBACK_S = 600.0
OPEN, RESOLVED, CLOSED = ALERT_OPEN, ALERT_RESOLVED, ALERT_CLOSED


def ui_base(home: Path, defaults: Defaults) -> str:
    """The UI's address for links: the configured one, else where the UI last listened."""
    if defaults.ui_url:
        return defaults.ui_url.rstrip("/")
    ui = read_ui_file(home) or {}
    host, port = ui.get("host"), ui.get("port")
    return f"http://{url_host(str(host))}:{port}" if host and port else "http://127.0.0.1:8501"


def run_link(base: str, run_id: int | None, sweep_id: int | None = None) -> str:
    """The page an alert links to: its sweep's, its run's, else the Runs list."""
    if sweep_id is not None:
        return f"{base}/sweep?id={sweep_id}"
    return f"{base}/run?run={run_id}" if run_id is not None else f"{base}/runs"


def in_quiet_hours(quiet: str, at: float) -> float | None:
    """When the quiet hours around ``at`` end (epoch seconds), or None outside them."""
    if not quiet:
        return None
    start_s, end_s = quiet.split("-")
    now = datetime.datetime.fromtimestamp(at)
    start = now.replace(hour=int(start_s[:2]), minute=int(start_s[3:]), second=0, microsecond=0)
    end = now.replace(hour=int(end_s[:2]), minute=int(end_s[3:]), second=0, microsecond=0)
    if start <= end:
        return end.timestamp() if start <= now < end else None
    if now >= start:
        return (end + datetime.timedelta(days=1)).timestamp()
    return end.timestamp() if now < end else None


def queue(session: Session, alert: Alert | None, channels: list[Channel], kind: str, trigger: str, message: str,
          run_id: int | None, now: float, not_before: float | None = None) -> list[AlertDelivery]:
    """One pending delivery per channel (the caller commits, then wakes the worker)."""
    rows = [AlertDelivery(alert_id=alert.id if alert is not None else None, run_id=run_id, channel_id=c.id,
                          channel=c.masked, kind=kind, trigger=trigger, message=message, status=PENDING, tries=0,
                          created_at=now, next_at=not_before or now) for c in channels]
    session.add_all(rows)
    return rows


class AlertEngine:
    """One pass at a time (:meth:`evaluate`); the worker sends what a pass queues."""

    def __init__(self, sessions: sessionmaker[Session], home: Path, worker: DeliveryWorker | None = None,
                 identity: Callable[[], int | None] | None = None, host: str | None = None,
                 started_at: float | None = None):
        self.sessions = sessions
        self.home = home
        self.store = AlertStore(home)
        self.worker = worker
        self.identity = identity or (lambda: None)
        self.host = host or socket.gethostname()
        self.started_at = time.time() if started_at is None else started_at
        self._horizon = self.started_at - LOOKBACK_S
        self._rules_cache: dict[tuple[str, tuple[str, ...]], RunRules] = {}  # by config hash

    def payload(self, session: Session, row: AlertDelivery) -> dict[str, Any]:
        """The signed webhook's JSON for a delivery (also the Apprise title)."""
        base = ui_base(self.home, self.store.load().defaults)
        run = session.get(Run, row.run_id) if row.run_id is not None else None
        alert = session.get(Alert, row.alert_id) if row.alert_id is not None else None
        sweep_id = sweep_of_key(alert.key if alert else None)
        sweep = session.get(Sweep, sweep_id) if sweep_id is not None else None
        about = f" - {run_label(run)}" if run else (f" - {sweep_label(sweep)}" if sweep else "")
        return {"run": {"id": run.id, "name": run.name, "status": run.status} if run else None,
                "sweep": {"id": sweep.id, "name": sweep.name, "status": sweep.status} if sweep else None,
                "trigger": row.trigger, "kind": row.kind, "message": row.message,
                "link": run_link(base, row.run_id, sweep_id), "alert": alert.key if alert else None,
                "title": f"runyard {row.kind}: {row.trigger}{about}", "at": row.created_at}

    def _rules(self, triggers: tuple[str, ...]) -> Callable[[Run], RunRules]:
        """A run's rules when ``triggers`` are on unless its [alerts] says otherwise."""
        def rules(run: Run) -> RunRules:
            key = (run.config_hash, triggers)
            if key not in self._rules_cache:
                if len(self._rules_cache) > 10_000:
                    self._rules_cache.clear()
                self._rules_cache[key] = rules_for(alerts_config(run), triggers)
            return self._rules_cache[key]
        return rules

    def evaluate(self, now: float | None = None) -> list[Alert]:
        """One pass: find, fire, repeat, resolve; returns the alerts that were sent in it."""
        now = time.time() if now is None else now
        settings = self.store.load()
        sent: list[Alert] = []
        with self.sessions() as session:
            open_alerts = {a.key: a for a in session.scalars(select(Alert).where(Alert.state == OPEN)).all()}
            open_failed = {a.run_id for a in open_alerts.values() if a.trigger == "failed" and a.run_id is not None}
            # A trigger a channel takes by its --on is looked for even when the defaults leave it
            # off; _channels then sends it only to the channels that asked for it.
            watched = settings.watched()
            evaluator = Evaluator(session, now, self._horizon, self._rules(watched))
            findings = evaluator.all(open_failed, watched, settings.defaults.day_budget_usd,
                                     self.identity(), self.started_at, self.host)
            seen: set[str] = set()
            for finding in findings:
                if finding.key in seen:
                    continue
                if finding.ongoing:
                    seen.add(finding.key)
                alert = open_alerts.get(finding.key)
                if alert is None:
                    alert = self._fire(session, finding, settings, now)
                    if alert is not None:
                        sent.append(alert)
                elif finding.trigger in RESOLVABLE and self._repeat(session, alert, finding, settings, now):
                    sent.append(alert)
            for key, alert in open_alerts.items():
                if key not in seen:
                    self._end(session, alert, settings, now)
            session.commit()
            for alert in sent:
                session.refresh(alert)
                session.expunge(alert)
        self._horizon = now - 60  # overlap: an edge written during this pass is found by the next
        if sent and self.worker is not None:
            self.worker.wake()
        return sent

    def _channels(self, session: Session, settings: AlertSettings, trigger: str, run_id: int | None,
                  sweep_id: int | None = None) -> list[Channel]:
        """The channels an alert of ``trigger`` about ``run_id`` (or ``sweep_id``) goes to: those
        the run's (the sweep's base config's) ``alerts.channels`` names (else every one), each taking
        the trigger by its ``--on`` or, without one, when the defaults and that [alerts] turn it on."""
        chosen = list(settings.channels)
        on_by_default = trigger in settings.defaults.triggers
        run = session.get(Run, run_id) if run_id is not None else None
        sweep = session.get(Sweep, sweep_id) if sweep_id is not None else None
        if run is not None:
            config = alerts_config(run)
            on_by_default = trigger in self._rules(settings.defaults.triggers)(run).triggers
        elif sweep is not None:
            config = sweep_alerts(sweep)
            on_by_default = trigger in sweep_rules(sweep, settings.defaults.triggers).triggers
        if (run is not None or sweep is not None) and config.channels:
            chosen = [c for c in chosen if str(c.id) in config.channels]
        return [c for c in chosen if c.takes(trigger, on_by_default)]

    def _not_before(self, settings: AlertSettings, trigger: str, now: float) -> float | None:
        if trigger in settings.defaults.urgent:
            return None
        return in_quiet_hours(settings.defaults.quiet_hours, now)

    def _message(self, settings: AlertSettings, finding_message: str, run_id: int | None,
                 sweep_id: int | None = None) -> str:
        return f"{finding_message} - {run_link(ui_base(self.home, settings.defaults), run_id, sweep_id)}"

    def _fire(self, session: Session, finding: Finding, settings: AlertSettings, now: float) -> Alert | None:
        if session.scalar(select(Alert.id).where(Alert.key == finding.key)) is not None:
            return None  # fired before and ended: a one-moment alert is not told again
        alert = Alert(key=finding.key, run_id=finding.run_id, trigger=finding.trigger,
                      state=OPEN if finding.ongoing else CLOSED,
                      message=finding.message, opened_at=now, sent_at=now, repeats=0,
                      resolved_at=None if finding.ongoing else now)
        try:
            with session.begin_nested():
                session.add(alert)
        except IntegrityError:  # another scheduler on the same database fired it first
            return None
        message = self._message(settings, finding.message, finding.run_id, finding.sweep_id)
        queue(session, alert, self._channels(session, settings, finding.trigger, finding.run_id, finding.sweep_id),
              "fire", finding.trigger, message, finding.run_id, now, self._not_before(settings, finding.trigger, now))
        logger.warning("alert %s: %s", finding.trigger, finding.message)
        if finding.action == "pause" and finding.run_id is not None:
            said = request_cancel(session, finding.run_id, who="its budget alert", mode="pause")
            logger.warning("run %d: %s", finding.run_id, said)
        return alert

    def _repeat(self, session: Session, alert: Alert, finding: Finding, settings: AlertSettings, now: float) -> bool:
        repeat_s = settings.defaults.repeat_s
        if alert.run_id is not None:
            run = session.get(Run, alert.run_id)
            if run is not None:
                repeat_s = alerts_config(run).repeat_s
        if repeat_s <= 0 or now - (alert.sent_at or alert.opened_at) < repeat_s:
            return False
        alert.sent_at, alert.repeats, alert.message = now, alert.repeats + 1, finding.message
        message = self._message(settings, f"still true: {finding.message}", finding.run_id)
        queue(session, alert, self._channels(session, settings, finding.trigger, finding.run_id), "repeat",
              finding.trigger, message, finding.run_id, now, self._not_before(settings, finding.trigger, now))
        return True

    def _end(self, session: Session, alert: Alert, settings: AlertSettings, now: float) -> None:
        run = session.get(Run, alert.run_id) if alert.run_id is not None else None
        live = run is not None and RunStatus(run.status) in ACTIVE
        alert.resolved_at = now
        if alert.trigger not in RESOLVABLE or not live or run is None:
            alert.state = CLOSED
            return
        attempt = alert.key.rsplit(":", 1)[-1]
        if attempt.isdigit() and run is not None:
            current = max((a.number for a in run.attempts), default=0)
            if int(attempt) != current:
                alert.state = CLOSED  # that attempt ended: nothing resolved, it is gone
                return
        alert.state = RESOLVED
        message = self._message(settings, f"resolved after {(now - alert.opened_at) / 60:.0f} min: "
                                          f"{run_label(run)} no longer {alert.trigger} ({alert.message})", run.id)
        queue(session, alert, self._channels(session, settings, alert.trigger, run.id), "resolved", alert.trigger,
              message, run.id, now, self._not_before(settings, alert.trigger, now))


def history(session: Session, run_id: int | None = None, limit: int = 200) -> list[dict[str, Any]]:
    """The newest alerts (of one run, or all) with each delivery's outcome, newest first."""
    query = select(Alert).order_by(Alert.id.desc()).limit(limit)
    if run_id is not None:
        query = query.where(Alert.run_id == run_id)
    alerts = session.scalars(query).all()
    ids = [a.id for a in alerts]
    deliveries: dict[int, list[dict[str, Any]]] = {}
    if ids:
        for d in session.scalars(select(AlertDelivery).where(AlertDelivery.alert_id.in_(ids))
                                 .order_by(AlertDelivery.id)).all():
            deliveries.setdefault(d.alert_id or 0, []).append(delivery_dict(d))
    return [{"id": a.id, "key": a.key, "run_id": a.run_id, "trigger": a.trigger, "state": a.state,
             "message": a.message, "opened_at": a.opened_at, "sent_at": a.sent_at, "repeats": a.repeats,
             "resolved_at": a.resolved_at, "deliveries": deliveries.get(a.id, [])} for a in alerts]


def delivery_dict(d: AlertDelivery) -> dict[str, Any]:
    return {"id": d.id, "channel_id": d.channel_id, "channel": d.channel, "kind": d.kind, "trigger": d.trigger,
            "status": d.status, "tries": d.tries, "error": d.error, "created_at": d.created_at,
            "done_at": d.done_at, "message": d.message}


def open_alert_runs(session: Session) -> dict[int, list[str]]:
    """Runs with an open alert, and those alerts' triggers (the Runs list marks them)."""
    out: dict[int, list[str]] = {}
    for run_id, trigger in session.execute(select(Alert.run_id, Alert.trigger).where(
            Alert.state == OPEN, Alert.run_id.is_not(None))).all():
        out.setdefault(int(run_id or 0), []).append(trigger)
    return out


def send_test(sessions: sessionmaker[Session], home: Path, channel_ids: list[int] | None = None,
              timeout_s: float = 20.0) -> list[AlertDelivery]:
    """Send a test message to each channel (or those named) now, each recorded as a delivery;
    one try each (no backoff). Returns the delivery rows with their outcome."""
    store = AlertStore(home)
    settings = store.load()
    channels = [settings.channel(i) for i in channel_ids] if channel_ids else list(settings.channels)
    engine = AlertEngine(sessions, home)
    worker = DeliveryWorker(sessions, store, payloads=engine.payload, backoff_s=())
    now = time.time()
    base = ui_base(home, settings.defaults)
    with sessions() as session:
        rows = queue(session, None, channels, "test", "test",
                     f"runyard test message: this channel works - {base}/runs", None, now, not_before=now + 1e9)
        session.commit()
        ids = [r.id for r in rows]
    return [worker.deliver(i, settings, now=True) for i in ids]

