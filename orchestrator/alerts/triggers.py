"""What is true of the runs now, read from the database alone: one :class:`Finding` per alert key.

Each trigger reads what the scheduler, the ranks and the system monitor already store: the run
status history (``failed``, ``retrying``, ``finished``), the attempts (``hang``, ``stalled``),
the hang's stack event (the hung rank's top frames), the metric store (``nonfinite``,
``eta_slip``), the system metrics (``gpu_idle``), the attempts' time at the run's price
(``budget``) and the heartbeat rows (``scheduler``). A finding names the run (id, name, link),
what happened and what runyard did, in one line.

Edge triggers (``retrying``, ``hang``, ``finished``, ``scheduler``) are found for a while after
their moment (:data:`EDGE_WINDOW_S`) so that a pass missed does not lose them; their alert key
makes each fire once. Condition triggers (``nonfinite``, ``stalled``, ``eta_slip``,
``gpu_idle``) are found while they hold: their alert repeats and then resolves.
"""

from __future__ import annotations

import datetime
import math
import re
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from sqlalchemy import func, select
from sqlalchemy.orm import Session

from db import metricstore
from db.models import Attempt, Event, MetricName, MetricPoint, Run, RunStatusHistory, SchedulerHeartbeat, SystemMetric
from db.states import ACTIVE, RunStatus
from db.vocabulary.causes import Cause
from db.vocabulary.config import RetryConfig, SupervisionConfig
from db.vocabulary.cost import ETA_WINDOW, cost_usd, eta_estimate
from orchestrator.alerts.findings import Finding, RunRules, duration, first_line, run_label, section
from orchestrator.alerts.sweep_triggers import sweep_ends
from orchestrator.scripts.checkpoint_custody import starting_checkpoint

# An edge (a status change, a hang) is looked for this long after it happened.
EDGE_WINDOW_S = 600.0
# The hang alert waits this long for the stack dump (it carries the hung rank's frames).
HANG_STACKS_WAIT_S = 40.0
BUDGET_SHARES = (50, 80, 100)
# Triggers whose alert says when it stopped being true; the others end silently.
RESOLVABLE = frozenset({"nonfinite", "stalled", "eta_slip", "gpu_idle"})
FRAMES = re.compile(r"top of rank (\d+)'s stack: ([^;]+)")


def _attempt_at(session: Session, run_id: int, at: float) -> Attempt | None:
    """The run's newest attempt started at or before ``at``."""
    return session.scalars(select(Attempt).where(Attempt.run_id == run_id, Attempt.started_at <= at + 1e-6)
                           .order_by(Attempt.number.desc()).limit(1)).first()


def _failure(attempt: Attempt | None) -> str:
    if attempt is None:
        return "no attempt"
    parts = [attempt.cause or "UNKNOWN"]
    if attempt.failed_rank is not None:
        parts.append(f"on rank {attempt.failed_rank}")
    text = " ".join(parts)
    exc = first_line(attempt.exception)
    return f"{text}: {exc}" if exc else text


class Evaluator:
    """Finds the conditions of every trigger; ``rules`` gives a run's rules from its config."""

    def __init__(self, session: Session, now: float, horizon: float, rules: Callable[[Run], RunRules]):
        self.session = session
        self.now = now
        self.horizon = max(horizon, now - EDGE_WINDOW_S)
        self.rules = rules
        self._rules: dict[int, RunRules] = {}

    def rules_of(self, run: Run) -> RunRules:
        if run.id not in self._rules:
            self._rules[run.id] = self.rules(run)
        return self._rules[run.id]

    def wants(self, run: Run, trigger: str) -> bool:
        return trigger in self.rules_of(run).triggers

    # -- edges in the status history ------------------------------------------------------

    def _history(self, to: RunStatus) -> list[tuple[Run, RunStatusHistory]]:
        rows = self.session.execute(
            select(Run, RunStatusHistory).join(RunStatusHistory, RunStatusHistory.run_id == Run.id)
            .where(RunStatusHistory.to_status == to.value, RunStatusHistory.at >= self.horizon)
            .order_by(RunStatusHistory.id)).all()
        return [(run, row) for run, row in rows]

    def failed(self, open_runs: set[int]) -> list[Finding]:
        """A run that ended FAILED: found while it stays FAILED (its alert stays open)."""
        out = []
        recent = (func.coalesce(Run.ended_at, Run.updated_at) >= self.horizon) | Run.id.in_(sorted(open_runs))
        runs = self.session.scalars(select(Run).where(Run.status == RunStatus.FAILED.value, recent)).all()
        for run in runs:
            if not self.wants(run, "failed"):
                continue
            attempt = _attempt_at(self.session, run.id, self.now)
            number = attempt.number if attempt else 0
            did = run.status_reason or "not retried"
            if attempt is not None and attempt.cause and did.startswith(f"{attempt.cause}: "):
                did = did[len(attempt.cause) + 2:]  # the cause is said already
            max_retries = RetryConfig.model_validate(section(run, "retry")).max_retries
            out.append(Finding(
                key=f"run:{run.id}:failed:{number}", trigger="failed", run_id=run.id,
                title=f"runyard: {run_label(run)} failed",
                message=f"{run_label(run)} failed: {_failure(attempt)}; runyard stopped it after attempt {number} "
                        f"(retries used {run.retries_used} of {max_retries}; {did})"))
        return out

    def retrying(self) -> list[Finding]:
        out = []
        for run, row in self._history(RunStatus.RETRYING):
            if not self.wants(run, "retrying"):
                continue
            attempt = _attempt_at(self.session, run.id, row.at)
            if attempt is None:
                continue
            max_retries = RetryConfig.model_validate(section(run, "retry")).max_retries
            # What the next attempt starts from, as the scheduler will choose it: runyard's own
            # checkpoint, a script's version or a fork's origin (not only a script's version).
            checkpoint = starting_checkpoint(self.session, run, attempt.number + 1)
            start = f"from the checkpoint of step {checkpoint.step}" if checkpoint else "from the start (no checkpoint)"
            used = self.session.scalar(select(func.count()).select_from(RunStatusHistory).where(
                RunStatusHistory.run_id == run.id, RunStatusHistory.to_status == RunStatus.RETRYING.value,
                RunStatusHistory.id <= row.id)) or 0
            newest = self.session.scalar(select(func.max(Attempt.number)).where(Attempt.run_id == run.id))
            out.append(Finding(
                key=f"run:{run.id}:retrying:{attempt.number}", trigger="retrying", run_id=run.id,
                ongoing=run.status == RunStatus.RETRYING.value and newest == attempt.number,
                title=f"runyard: {run_label(run)} retrying",
                message=f"{run_label(run)} attempt {attempt.number} failed: {_failure(attempt)}; runyard retries it "
                        f"(retry {used} of {max_retries}) {start}"))
        return out

    def finished(self) -> list[Finding]:
        out = []
        for run, row in self._history(RunStatus.SUCCEEDED):
            if not self.wants(run, "finished"):
                continue
            attempts = self.session.scalars(select(Attempt).where(Attempt.run_id == run.id)).all()
            cost = cost_usd([(a.started_at, a.ended_at) for a in attempts], run.price_usd_per_hour, self.now)
            latest = metricstore.latest(self.session, run.id)
            shown = ", ".join(f"{k} {v['0']:.4g}" for k, v in latest.items()
                              if k in ("loss", "eval_loss", "accuracy", "eval_accuracy") and "0" in v)
            took = (run.ended_at or row.at) - (run.started_at or run.created_at)
            out.append(Finding(
                key=f"run:{run.id}:finished:{len(attempts)}", trigger="finished", run_id=run.id, ongoing=False,
                title=f"runyard: {run_label(run)} succeeded",
                message=f"{run_label(run)} SUCCEEDED after {duration(took)}, {len(attempts)} attempt(s), "
                        f"${cost:.2f}" + (f"; final {shown}" if shown else "")))
        return out

    # -- attempts ---------------------------------------------------------------------------

    def hang(self) -> list[Finding]:
        out = []
        rows = self.session.execute(select(Run, Attempt).join(Attempt, Attempt.run_id == Run.id).where(
            Attempt.hang_detected_at.is_not(None), Attempt.hang_detected_at >= self.horizon)).all()
        for run, attempt in rows:
            if not self.wants(run, "hang"):
                continue
            detected = attempt.hang_detected_at or self.now
            stacks = self.session.scalars(select(Event).where(
                Event.run_id == run.id, Event.attempt == attempt.number, Event.kind == "stacks",
                Event.at >= detected - 1).order_by(Event.id.desc()).limit(1)).first()
            if stacks is None and self.now - detected < HANG_STACKS_WAIT_S:
                continue  # the dump is still being taken: the alert carries its frames
            if attempt.cause == Cause.USER_ERROR.value:
                continue  # the stacks found a rank inside its exception handler: a failure, told as one
            since = attempt.progress_at or attempt.first_step_at or attempt.started_at
            frames = FRAMES.search(stacks.message) if stacks is not None else None
            rank = attempt.failed_rank
            if frames:
                where = f"rank {frames[1]} hung; top of its stack: {frames[2].strip()}"
            elif rank is not None:
                where = f"rank {rank} hung"
            else:
                where = "no single rank is named by the stacks"
            out.append(Finding(
                key=f"run:{run.id}:hang:{attempt.number}", trigger="hang", run_id=run.id, ongoing=False,
                title=f"runyard: {run_label(run)} hung",
                message=f"{run_label(run)} attempt {attempt.number} hung: no progress for {duration(detected - since)} "
                        f"after step {attempt.last_step or 0}; {where}; runyard saved every rank's stacks in "
                        f"{Path(attempt.dir) / 'stacks'} and killed the attempt"))
        return out

    def _running(self) -> list[tuple[Run, Attempt]]:
        """Active runs and their running attempt."""
        rows = self.session.execute(select(Run, Attempt).join(Attempt, Attempt.run_id == Run.id).where(
            Run.status.in_([s.value for s in ACTIVE]), Attempt.status == "RUNNING")).all()
        newest: dict[int, tuple[Run, Attempt]] = {}
        for run, attempt in rows:
            if run.id not in newest or attempt.number > newest[run.id][1].number:
                newest[run.id] = (run, attempt)
        return list(newest.values())

    def nonfinite(self, running: list[tuple[Run, Attempt]]) -> list[Finding]:
        out = []
        for run, attempt in running:
            if not self.wants(run, "nonfinite"):
                continue
            watched = self.rules_of(run).config.nonfinite_metrics
            bad: list[str] = []
            for name, ranks in metricstore.latest(self.session, run.id).items():
                if "*" not in watched and name not in watched:
                    continue
                ranks_bad = sorted((r for r, v in ranks.items() if not math.isfinite(v)), key=int)
                if ranks_bad:
                    values = {("NaN" if math.isnan(ranks[r]) else str(ranks[r])) for r in ranks_bad}
                    bad.append(f"{name} {'/'.join(sorted(values))} on rank(s) {', '.join(ranks_bad)}")
            if bad:
                out.append(Finding(
                    key=f"run:{run.id}:nonfinite:{attempt.number}", trigger="nonfinite", run_id=run.id,
                    title=f"runyard: {run_label(run)} went non-finite",
                    message=f"{run_label(run)} attempt {attempt.number}: {'; '.join(bad)} at step "
                            f"{attempt.last_step or 0}; runyard keeps it running (cancel or pause it to stop)"))
        return out

    def stalled(self, running: list[tuple[Run, Attempt]]) -> list[Finding]:
        out = []
        for run, attempt in running:
            if run.status != RunStatus.RUNNING.value or not self.wants(run, "stalled"):
                continue
            if attempt.first_step_at is None or attempt.hang_detected_at is not None or attempt.phase \
                    or attempt.signal_sent:
                continue
            cfg = self.rules_of(run).config
            since = attempt.progress_at or attempt.first_step_at
            if self.now - since <= cfg.stalled_min_s:
                continue
            times = [v for _, v, _ in metricstore.recent(self.session, run.id, "step_time", attempt=attempt.number,
                                                         rank=0, limit=50) if math.isfinite(v)]
            threshold = max(cfg.stalled_min_s, cfg.stalled_factor * statistics.median(times)) if times \
                else cfg.stalled_min_s
            if self.now - since <= threshold:
                continue
            hang_s = SupervisionConfig.model_validate(section(run, "supervision")).hang_timeout_s
            out.append(Finding(
                key=f"run:{run.id}:stalled:{attempt.number}", trigger="stalled", run_id=run.id,
                title=f"runyard: {run_label(run)} stalled",
                message=f"{run_label(run)} attempt {attempt.number}: no new step for {duration(self.now - since)} "
                        f"after step {attempt.last_step or 0} (threshold {duration(threshold)}) while its processes "
                        f"live; runyard's hang watchdog acts after {duration(hang_s)} or more"))
        return out

    def gpu_idle(self, running: list[tuple[Run, Attempt]]) -> list[Finding]:
        out = []
        for run, attempt in running:
            if not self.wants(run, "gpu_idle"):
                continue
            cfg = self.rules_of(run).config
            start = self.now - cfg.gpu_idle_s
            if attempt.started_at > start:
                continue
            rows = self.session.execute(select(SystemMetric.device, SystemMetric.at, SystemMetric.max).where(
                SystemMetric.run_id == run.id, SystemMetric.key == "util_percent",
                SystemMetric.device.like("gpu%"), SystemMetric.at >= start)).all()
            if not rows or min(at for _, at, _ in rows) > start + 60 or max(at for _, at, _ in rows) < self.now - 60:
                continue  # the window is not covered (the monitor was not sampling): nothing to judge
            if any(peak >= cfg.gpu_idle_percent for _, _, peak in rows):
                continue
            devices = sorted({d for d, _, _ in rows})
            out.append(Finding(
                key=f"run:{run.id}:gpu_idle:{attempt.number}", trigger="gpu_idle", run_id=run.id,
                title=f"runyard: {run_label(run)} GPUs idle",
                message=f"{run_label(run)} holds {', '.join(devices)}, all under {cfg.gpu_idle_percent:g}% "
                        f"utilisation for {duration(cfg.gpu_idle_s)}; runyard keeps them assigned (cancel or "
                        "pause the run to free them)"))
        return out

    def _points(self, run_id: int, attempt: int, newest: bool) -> list[tuple[int, float]]:
        """(step, wall time) of rank 0's loss, or of the metric the run reports (progress_key)."""
        key = metricstore.progress_key(self.session, run_id, attempt)
        name_id = self.session.scalar(select(MetricName.id).where(MetricName.name == key)) if key else None
        if name_id is None:
            return []
        P = MetricPoint
        order = P.step.desc() if newest else P.step.asc()
        return [(int(s), float(t)) for s, t in self.session.execute(
            select(P.step, P.wall_time).where(P.run_id == run_id, P.name_id == name_id, P.attempt == attempt,
                                              P.rank == 0).order_by(order).limit(ETA_WINDOW)).all()]

    def eta_slip(self, running: list[tuple[Run, Attempt]]) -> list[Finding]:
        out = []
        for run, attempt in running:
            if run.status != RunStatus.RUNNING.value or not self.wants(run, "eta_slip") or not run.max_steps:
                continue
            first_attempt = self.session.scalar(select(func.min(Attempt.number)).where(Attempt.run_id == run.id))
            first = self._points(run.id, first_attempt or 1, newest=False)
            if len(first) < ETA_WINDOW:
                continue  # no steady ETA yet
            first_eta = eta_estimate(first, run.max_steps)
            current = eta_estimate(self._points(run.id, attempt.number, newest=True), run.max_steps)
            if first_eta is None or current is None:
                continue
            planned_end = max(t for _, t in first) + first_eta.seconds
            planned = planned_end - (run.started_at or run.created_at)
            expected_end = self.now + current.seconds
            if planned <= 0 or (expected_end - planned_end) / planned <= self.rules_of(run).config.eta_slip_ratio:
                continue
            out.append(Finding(
                key=f"run:{run.id}:eta_slip", trigger="eta_slip", run_id=run.id,
                title=f"runyard: {run_label(run)} is late",
                message=f"{run_label(run)} now ends in {duration(current.seconds)}, "
                        f"{duration(expected_end - planned_end)} later than its first steady ETA "
                        f"({duration(planned)} in all); runyard keeps it running"))
        return out

    def budget(self, running_runs: list[Run]) -> list[Finding]:
        out = []
        for run in running_runs:
            cfg = self.rules_of(run).config
            if cfg.budget_usd <= 0 or not self.wants(run, "budget"):
                continue
            attempts = self.session.execute(select(Attempt.started_at, Attempt.ended_at)
                                            .where(Attempt.run_id == run.id)).all()
            cost = cost_usd([(s, e) for s, e in attempts], run.price_usd_per_hour, self.now)
            for share in BUDGET_SHARES:
                if cost < cfg.budget_usd * share / 100:
                    continue
                pause = share == 100 and cfg.budget_pause
                did = "runyard pauses it (a checkpoint, then stop; Resume continues)" if pause else \
                    "runyard keeps it running"
                out.append(Finding(
                    key=f"run:{run.id}:budget:{share}", trigger="budget", run_id=run.id,
                    title=f"runyard: {run_label(run)} at {share}% of its budget",
                    message=f"{run_label(run)} has cost ${cost:.2f}, {share}% of its ${cfg.budget_usd:.2f} budget; "
                            f"{did}",
                    action="pause" if pause else ""))
        return out

    def day_budget(self, amount: float) -> list[Finding]:
        if amount <= 0:
            return []
        midnight = datetime.datetime.fromtimestamp(self.now).replace(hour=0, minute=0, second=0, microsecond=0)
        start = midnight.timestamp()
        rows = self.session.execute(select(Attempt.started_at, Attempt.ended_at, Run.price_usd_per_hour)
                                    .join(Run, Run.id == Attempt.run_id)
                                    .where((Attempt.ended_at.is_(None)) | (Attempt.ended_at >= start))).all()
        cost = sum(cost_usd([(max(s, start), e)], price, self.now) for s, e, price in rows)
        day = midnight.date().isoformat()
        return [Finding(key=f"day:{day}:budget:{share}", trigger="budget", run_id=None,
                        title=f"runyard: today's cost at {share}% of the day's budget",
                        message=f"runyard's runs have cost ${cost:.2f} today ({day}), {share}% of the day's "
                                f"${amount:.2f} budget; runyard keeps them running")
                for share in BUDGET_SHARES if cost >= amount * share / 100]

    def scheduler(self, me: int | None, started_at: float, host: str) -> list[Finding]:
        """The scheduler came back: the newest earlier heartbeat of this host, and how long ago."""
        if me is None or self.now - started_at > EDGE_WINDOW_S:
            return []
        before = self.session.execute(select(SchedulerHeartbeat.beat_at).where(
            SchedulerHeartbeat.id != me, SchedulerHeartbeat.host == host, SchedulerHeartbeat.beat_at < started_at)
            .order_by(SchedulerHeartbeat.beat_at.desc()).limit(1)).scalar()
        if before is None or started_at - before < 30:
            return []
        counts = dict(self.session.execute(select(Run.status, func.count()).group_by(Run.status)).all())
        active = sum(counts.get(s.value, 0) for s in ACTIVE)
        found = (f"{active} active run(s) re-adopted or settled, {counts.get('QUEUED', 0)} queued, "
                 f"{counts.get('RETRYING', 0)} waiting to retry")
        return [Finding(key=f"scheduler:{me}", trigger="scheduler", run_id=None, ongoing=False,
                        title=f"runyard: the scheduler on {host} is back",
                        message=f"runyard's scheduler on {host} is back after {duration(started_at - before)} down "
                                f"(last heartbeat {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(before))}); "
                                f"it found {found}")]

    def all(self, open_failed: set[int], default_triggers: tuple[str, ...], day_budget_usd: float,
            me: int | None, started_at: float, host: str) -> list[Finding]:
        running = self._running()
        found = [*self.failed(open_failed), *self.retrying(), *self.hang(), *self.finished(),
                 *self.nonfinite(running), *self.stalled(running), *self.gpu_idle(running),
                 *self.eta_slip(running), *self.budget([run for run, _ in running]),
                 *sweep_ends(self.session, self.horizon, self.now, default_triggers)]
        if "budget" in default_triggers:
            found += self.day_budget(day_budget_usd)
        if "scheduler" in default_triggers:
            found += self.scheduler(me, started_at, host)
        return found
