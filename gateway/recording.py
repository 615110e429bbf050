"""The last step of every request: its metrics and its one audit event.

Recording may wait until the answer is sent (issue 14): while a request is
served by :class:`gateway.inference_asgi.InferenceRoutes`, :data:`AFTER_SEND`
holds a list in that request's task context and :meth:`Recorder.record`
appends the record to it. The front hands the records' audit events to the
audit worker (:meth:`Recorder.emit`, :meth:`Recorder.hand_off`) just before
the answer's last body part, and writes their metrics and concentration
observations (:meth:`Recorder.finish`) after it (issue 16: an answer that
completed at the client has its event in the worker's pipe, which outlives a
SIGKILLed gateway). Everywhere else it records at once.
"""

from __future__ import annotations

from contextvars import ContextVar

from gateway.auditing import AuditHub
from gateway.metrics import GatewayMetrics
from gateway.record import RequestRecord

__all__ = ["AFTER_SEND", "Recorder"]

#: Records of the current request to write once its answer is sent (``None``: record at once).
AFTER_SEND: ContextVar[list[RequestRecord] | None] = ContextVar("prefixgate_after_send", default=None)


class Recorder:
    """Turns a finished :class:`RequestRecord` into metrics and one audit event."""

    def __init__(self, metrics: GatewayMetrics, audit: AuditHub) -> None:
        self.metrics = metrics
        self.audit = audit

    def record(self, rec: RequestRecord) -> None:
        """Metrics + one audit event + concentration monitor for a finished request
        (deferred to the answer's end when :data:`AFTER_SEND` holds a list)."""
        pending = AFTER_SEND.get()
        if pending is not None:
            pending.append(rec)
            return
        self.audit.emit_request(rec)
        self.finish(rec)

    def emit(self, rec: RequestRecord) -> None:
        """The request's audit event (and spans), queued for the audit log; see :meth:`hand_off`."""
        self.audit.emit_request(rec)

    def hand_off(self) -> None:
        """Write the queued audit events to the audit worker's pipe now (one write)."""
        self.audit.hand_off()

    def finish(self, rec: RequestRecord) -> None:
        """The request's metrics and concentration observation (after :meth:`emit`)."""
        m = self.metrics
        m.requests.labels(rec.endpoint, str(rec.status), rec.outcome).inc()
        m.request_seconds.labels(rec.endpoint).observe((rec.t_end or rec.t0) - rec.t0)
        if rec.tenant_id:
            m.tenant_requests.labels(rec.tenant_id, rec.outcome).inc()
        if rec.replica and rec.t_first_byte is not None:
            m.first_byte_seconds.labels(rec.endpoint).observe(rec.t_first_byte - rec.t0)
            m.replica_requests.labels(rec.replica, rec.pool or "").inc()
            m.prompt_tokens.inc(rec.prompt_tokens or 0)
            m.prefix_tokens.labels("available").inc(rec.available_prefix_tokens or 0)
            m.prefix_tokens.labels("predicted").inc(rec.predicted_prefix_tokens or 0)
            if rec.delivered_prefix_tokens is not None:
                m.prefix_tokens.labels("delivered").inc(rec.delivered_prefix_tokens)
        self.audit.observe_request(rec)
