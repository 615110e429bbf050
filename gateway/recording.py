"""The last step of every request: its metrics and its one audit event."""

from __future__ import annotations

from gateway.auditing import AuditHub
from gateway.metrics import GatewayMetrics
from gateway.record import RequestRecord

__all__ = ["Recorder"]


class Recorder:
    """Turns a finished :class:`RequestRecord` into metrics and one audit event."""

    def __init__(self, metrics: GatewayMetrics, audit: AuditHub) -> None:
        self.metrics = metrics
        self.audit = audit

    def record(self, rec: RequestRecord) -> None:
        """Metrics + one audit event + concentration monitor for a finished request."""
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
        self.audit.record_request(rec)
