"""The last step of every request: its metrics and its one audit event.

Ending a request may wait until the answer is sent (issue 14): while a
request is served by :class:`gateway.inference_asgi.InferenceRoutes`,
:data:`AFTER_SEND` holds a list in that request's task context;
:func:`after_send` appends work to it (the pipeline's end of a plain answer)
and :meth:`Recorder.record` queues the request's audit event at once; its metrics
and concentration observation (:meth:`Recorder.finish`) run with the request's
deferred end (gateway/pipeline.py).
Just before the answer's last body part the front runs the work deferred so
far (so a plain answer's end has produced its record) and hands the queued
audit events to the audit worker (:meth:`Recorder.hand_off`); the rest runs
right after that part was handed to the server, with no await in between
(issue 16: an answer that completed at the client has its event in the
worker's pipe, which outlives a SIGKILLed gateway). Everywhere else the work
runs at once.
"""

from __future__ import annotations

from collections.abc import Callable
from contextvars import ContextVar
from typing import Any

from gateway.auditing import AuditHub
from gateway.metrics import GatewayMetrics
from gateway.record import RequestRecord

__all__ = ["AFTER_SEND", "Recorder", "after_send"]

#: Work of the current request to run once its answer is sent (``None``: run it at once).
AFTER_SEND: ContextVar[list[Callable[[], None]] | None] = ContextVar("prefixgate_after_send", default=None)


def after_send(work: Callable[[], None]) -> bool:
    """Defer ``work`` until the current request's answer is sent: True when deferred, False when
    no front defers (the caller runs it now)."""
    pending = AFTER_SEND.get()
    if pending is None:
        return False
    pending.append(work)
    return True


#: Distinct label sets the request tally holds before it is handed to the counters anyway.
TALLY_MAX = 1024


class Recorder:
    """Turns a finished :class:`RequestRecord` into metrics and one audit event.

    The request counters (requests, per tenant, per replica, prompt and prefix tokens) are tallied
    per label set, one dict lookup and a few additions per request, and handed to the counters when
    a registry is read (:meth:`gateway.metrics.CounterBatch.on_flush`; issue 14, session 12: seven
    ``labels`` lookups and increments per request cost ~5 µs), or when :data:`TALLY_MAX` label sets
    are pending. The latency histograms are observed per request."""

    def __init__(self, metrics: GatewayMetrics, audit: AuditHub) -> None:
        self.metrics = metrics
        self.audit = audit
        #: (endpoint, status, outcome, tenant, replica or None, pool) -> [requests, prompt, available,
        #: predicted, delivered tokens, requests with delivered tokens]; replica None: not routed
        self._tally: dict[tuple[Any, ...], list[int]] = {}
        self._hists: dict[str, tuple[Any, Any]] = {}  # endpoint -> (request_seconds, first_byte_seconds) children
        metrics.batch.on_flush(self.flush_tally)

    def record(self, rec: RequestRecord) -> None:
        """The finished request's one audit event, queued now. Its metrics and concentration
        observation are the caller's next step (:meth:`finish`: the pipeline runs it with the
        request's giving back, after the answer when :data:`AFTER_SEND` holds a list; issue 14,
        session 14: one deferred step per request, not one per part)."""
        self.audit.emit_request(rec)

    def hand_off(self) -> None:
        """Write the queued audit events to the audit worker's pipe now (one write)."""
        self.audit.hand_off()

    def finish(self, rec: RequestRecord) -> None:
        """The request's metrics and concentration observation (after its audit event)."""
        endpoint = rec.endpoint
        hists = self._hists.get(endpoint)
        if hists is None:  # the two latency children of an endpoint, looked up once (session 14)
            m = self.metrics
            if len(self._hists) >= TALLY_MAX:
                self._hists.clear()
            hists = self._hists[endpoint] = (m.request_seconds.labels(endpoint), m.first_byte_seconds.labels(endpoint))
        hists[0].observe((rec.t_end or rec.t0) - rec.t0)
        replica = rec.replica
        routed = bool(replica) and rec.t_first_byte is not None
        if routed:
            hists[1].observe(rec.t_first_byte - rec.t0)  # type: ignore[operator]
        key = (endpoint, rec.status, rec.outcome, rec.tenant_id, replica if routed else None, rec.pool)
        tally = self._tally.get(key)
        if tally is None:
            if len(self._tally) >= TALLY_MAX:
                self.flush_tally()
            tally = self._tally[key] = [0, 0, 0, 0, 0, 0]
        tally[0] += 1
        if routed:
            tally[1] += rec.prompt_tokens or 0
            tally[2] += rec.available_prefix_tokens or 0
            tally[3] += rec.predicted_prefix_tokens or 0
            if rec.delivered_prefix_tokens is not None:
                tally[4] += rec.delivered_prefix_tokens
                tally[5] += 1
        self.audit.observe_request(rec)

    def flush_tally(self) -> None:
        """Hand the tallied request counts to the counters (through the metrics' counter batch)."""
        if not self._tally:
            return
        tally, self._tally = self._tally, {}
        m = self.metrics
        for (endpoint, status, outcome, tenant, replica, pool), (n, prompt, available, predicted, delivered,
                                                                  n_delivered) in tally.items():
            m.requests.labels(endpoint, str(status), outcome).inc(n)
            if tenant:
                m.tenant_requests.labels(tenant, outcome).inc(n)
            if replica is not None:
                m.replica_requests.labels(replica, pool or "").inc(n)
                m.prompt_tokens.inc(prompt)
                m.prefix_tokens.labels("available").inc(available)
                m.prefix_tokens.labels("predicted").inc(predicted)
                if n_delivered:
                    m.prefix_tokens.labels("delivered").inc(delivered)
