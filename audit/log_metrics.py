"""The Prometheus metrics an :class:`audit.log.AuditLog` exports (events emitted, dropped, delivered; spill bytes;
sink up; accepting) and those of the gateway side of the audit worker process (:class:`WorkerLogMetrics`)."""

from __future__ import annotations

from typing import Any

from prometheus_client import CollectorRegistry, Counter, Gauge


class AuditLogMetrics:
    """The Prometheus metrics of one :class:`audit.log.AuditLog` (labelled by sink name only, never by tenant)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.emitted = Counter("prefixgate_audit_events_emitted", "Audit events accepted by emit()", registry=registry)
        self.dropped = Counter(
            "prefixgate_audit_events_dropped", "Audit events lost (must stay 0)", ["sink"], registry=registry
        )
        self.scrubbed = Counter(
            "prefixgate_audit_fields_scrubbed", "Event fields refused by the scrubber", ["reason"], registry=registry
        )
        self.spill_bytes = Gauge(
            "prefixgate_audit_spill_bytes", "Undelivered bytes in the spill file", ["sink"], registry=registry
        )
        self.sink_up = Gauge("prefixgate_audit_sink_up", "1 if the sink took the last batch", ["sink"], registry=registry)
        self.accepting = Gauge("prefixgate_audit_accepting", "1 if the gateway may accept requests", registry=registry)
        self.delivered = Counter(
            "prefixgate_audit_events_delivered", "Events handed to a sink", ["sink"], registry=registry
        )
        self.slow_sends = Counter(
            "prefixgate_audit_slow_sends", "Sends still running after slow_send_s (batch moved to the spill)",
            ["sink"], registry=registry
        )
        self._children: dict[tuple[str, str], Any] = {}

    def child(self, metric: str, sink: str) -> Any:
        """``getattr(self, metric).labels(sink)``, made once per (metric, sink) (session 11: ``labels`` takes
        a lock and builds a key each call, ~1-2 us, and the delivery loop asked for two per batch per sink
        and the spill for one per spilled event)."""
        kid = self._children.get((metric, sink))
        if kid is None:
            kid = self._children[(metric, sink)] = getattr(self, metric).labels(sink)
        return kid


class WorkerLogMetrics:
    """Gateway-side metrics of the audit worker (:class:`audit.remote.RemoteAuditLog`: backlog, up, restarts,
    drops; moved from :mod:`audit.remote` in session 17)."""

    def __init__(self, registry: CollectorRegistry) -> None:
        self.backlog = Gauge("prefixgate_audit_worker_backlog_bytes",
                             "Audit bytes sent to the audit worker and not yet acknowledged", registry=registry)
        self.up = Gauge("prefixgate_audit_worker_up", "1 while the audit worker process runs", registry=registry)
        self.restarts = Counter("prefixgate_audit_worker_restarts", "Audit worker process restarts", registry=registry)
        self.dropped = Counter("prefixgate_audit_worker_events_dropped",
                               "Audit events lost before reaching the worker (must stay 0)", registry=registry)
