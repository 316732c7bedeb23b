"""Alerts: runyard tells people about their runs where they already look (docs/ALERTS.md).

- :mod:`.store`: the channels and the global defaults, in ``alerts.json`` (mode 0600) in the
  data folder; secrets never leave it (shown masked everywhere else).
- :mod:`.triggers`: what is true of the runs now, read from the database (status history,
  attempts, events, metrics, system metrics, cost): one :class:`~.findings.Finding` per alert key;
- :mod:`.findings`: what a finding is, the rules a run's alerts follow (read from its stored
  config) and the wording the findings share.
- :mod:`.engine`: findings into alerts (fire once, repeat after an interval, resolve) and
  deliveries; orchestrator/scheduler/alert_job.py registers it on the scheduler beside the tick.
- :mod:`.hosts`: every spelling of a host read as the resolver reads it, and which addresses a
  channel may not reach (metadata, link-local, unspecified): checked when a channel is added and sent.
- :mod:`.channels`: sending one message: Apprise URLs, and runyard's signed webhook (the target
  resolved once, the connection pinned to that address, link-local and metadata addresses refused).
- :mod:`.delivery`: the worker thread that sends queued deliveries, retries with backoff and
  records every outcome; the scheduler's tick never waits for it.
"""

from __future__ import annotations

from orchestrator import OrchestratorError


class AlertsError(OrchestratorError):
    """A channel, a rule or a delivery that cannot be accepted; the message names the value."""


class RefusedValue(AlertsError):
    """A value given for a channel or a default that cannot be accepted (bad input: a URL, a
    trigger, a secret, a channel id); the CLI exits with code 2 for it."""
