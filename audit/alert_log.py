"""Log lines of concentration alerts, rate-bounded per alert (S24-newcomer-8, session 25 fixops).

A concentration alert (:class:`audit.concentration.ConcentrationMonitor`) is an audit event and a
metric; an operator tailing the gateway's log also gets one line per change: a WARNING when an
alert is raised, an INFO when it clears, on the logger :data:`LOGGER_NAME`. A line names the alert
id, its kind, pool, replica id, tenant id (an attributed alert) and figures: the replica's share
(``share``, the larger of its request and prefill-token shares), the pool's normalised HHI
(``hhi``) or the window's prefix-cache hit rate (``hit_rate``), the threshold and the window
(seconds). Only ids and numbers: never prompt text.

Rate bound: per alert id, the first change of an interval of ``interval_s`` seconds is logged
at once; further changes of that id in the same interval are counted, not logged, and at the end
of the interval one summary line says how many raises and clears were not logged and the state
the alert is in now (WARNING if raised, INFO if cleared), so the log never ends on a stale state.
A flapping alert thus writes at most two lines per ``interval_s``; the number of alert ids is
bounded by the configured pools, replicas and ``attribution_max_tenants`` per episode. The end of
an interval is a timer on the running event loop; with no loop running (unit tests, tools), the
summaries that are due are written at the next change of any alert, or by :meth:`AlertLogLines.flush`.

The project's other bound on repeated log lines, :class:`gateway.log_aggregate.RepeatedLineFilter`,
matches fixed uvicorn messages without arguments and names the connection's peer; it lives in
``gateway/``, which ``audit/`` does not import, and it does not report the state a summary ends
in: hence this small per-id bound.
"""
from __future__ import annotations

import asyncio
import logging
import time
from collections.abc import Callable, Mapping

from audit.event import Outcome

__all__ = ["AlertLogLines", "describe", "LOGGER_NAME", "DEFAULT_INTERVAL_S"]

LOGGER_NAME = "prefixgate.audit.concentration"
#: seconds: the rate bound's interval per alert id (the monitor's default window)
DEFAULT_INTERVAL_S = 60.0
_FIGURE = {"replica_concentration": "share", "pool_concentration": "hhi", "cache_miss_spike": "hit_rate"}


def describe(alert: Mapping[str, object], window_s: float) -> str:
    """The fields of one alert as ``key=value`` text (ids and numbers only).

    ``alert``: the ``alert`` mapping of a ``kind="alert"`` audit event (``alert_id``,
    ``alert_kind``, ``pool``, ``value``, ``threshold``, optional ``replica`` and ``tenant_id``);
    ``window_s``: the monitor's window, seconds.
    """
    kind = str(alert.get("alert_kind"))
    parts = [f"id={alert.get('alert_id')}", f"kind={kind}", f"pool={alert.get('pool')}"]
    if alert.get("replica") is not None:
        parts.append(f"replica={alert['replica']}")
    if alert.get("tenant_id") is not None:
        parts.append(f"tenant={alert['tenant_id']}")
    parts += [f"{_FIGURE.get(kind, 'value')}={alert.get('value')}", f"threshold={alert.get('threshold')}",
              f"window_s={window_s:g}"]
    return " ".join(parts)


class _Interval:
    __slots__ = ("until", "raised", "cleared", "last", "scheduled")

    def __init__(self, until: float) -> None:
        self.until = until  # monotonic s: the end of this interval
        self.raised = 0  # changes counted, not logged, in it
        self.cleared = 0
        self.last: tuple[Outcome, Mapping[str, object]] | None = None  # the latest change not logged
        self.scheduled = False


class AlertLogLines:
    """One log line per alert change, at most one plus one summary per alert id and ``interval_s``.

    ``window_s``: the monitor's window (seconds, named in each line); ``interval_s``: seconds
    (> 0) of the rate bound (module doc); ``clock``: monotonic seconds; ``logger``: default
    ``logging.getLogger(LOGGER_NAME)``. Raises ``ValueError`` when ``interval_s`` <= 0.
    """

    def __init__(self, window_s: float, interval_s: float = DEFAULT_INTERVAL_S,
                 clock: Callable[[], float] = time.monotonic, logger: logging.Logger | None = None) -> None:
        if not interval_s > 0:
            raise ValueError("interval_s must be > 0")
        self.window_s = window_s
        self.interval_s = interval_s
        self._clock = clock
        self._log = logger or logging.getLogger(LOGGER_NAME)
        self._intervals: dict[str, _Interval] = {}

    def note(self, outcome: Outcome, alert: Mapping[str, object]) -> None:
        """Log one raise (WARNING) or clear (INFO) of ``alert`` (an alert event's ``alert`` mapping),
        or count it when its id already logged a line in the current interval."""
        now = self._clock()
        self.flush(now)
        key = str(alert.get("alert_id"))
        got = self._intervals.get(key)
        if got is not None and now < got.until:
            if outcome is Outcome.RAISED:
                got.raised += 1
            else:
                got.cleared += 1
            got.last = (outcome, alert)
            if not got.scheduled:
                got.scheduled = self._schedule(key, got.until - now)
            return
        self._intervals[key] = _Interval(now + self.interval_s)
        word = "raised" if outcome is Outcome.RAISED else "cleared"
        level = logging.WARNING if outcome is Outcome.RAISED else logging.INFO
        self._log.log(level, "concentration alert %s: %s", word, describe(alert, self.window_s))

    def flush(self, now: float | None = None) -> None:
        """Write the summary of every interval that ended (``now``: monotonic s, default the clock)
        with changes not logged, and forget the ended intervals without any."""
        now = self._clock() if now is None else now
        for key in [k for k, v in self._intervals.items() if v.until <= now]:
            self._end(key, now)

    def close(self) -> None:
        """Write now the summary of every interval with changes not logged yet, ended or not, and forget
        every interval (the gateway's stop, :meth:`gateway.auditing.AuditHub.close`; session 25,
        S25-fixops-4: else the last line could say "raised" of an alert that cleared since)."""
        now = self._clock()
        for key in list(self._intervals):
            self._end(key, now)
        self._intervals.clear()

    def _schedule(self, key: str, delay_s: float) -> bool:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return False
        loop.call_later(max(0.0, delay_s), self._due, key)
        return True

    def _due(self, key: str) -> None:
        got = self._intervals.get(key)
        if got is not None:
            got.scheduled = False
            now = self._clock()
            if got.until <= now:
                self._end(key, now)
            else:  # a summary already moved the interval on: end that one at its time
                got.scheduled = self._schedule(key, got.until - now)

    def _end(self, key: str, now: float) -> None:
        got = self._intervals.pop(key)
        if got.last is None:
            return
        outcome, alert = got.last
        word = "raised" if outcome is Outcome.RAISED else "cleared"
        level = logging.WARNING if outcome is Outcome.RAISED else logging.INFO
        self._log.log(level, "concentration alert %s (%d raised, %d cleared in the last %g s not logged: "
                      "rate bound): %s", word, got.raised, got.cleared, self.interval_s,
                      describe(alert, self.window_s))
        self._intervals[key] = _Interval(now + self.interval_s)  # the summary is this interval's line
