"""PrefixGate audit trail: events, sinks, tamper-evident logs, tracing, alerts.

Public API for the gateway (``audit`` never imports ``gateway``)::

    from audit import AuditEvent, AuditLog, ConcentrationMonitor, build_audit
"""
from __future__ import annotations

from audit.concentration import ConcentrationMonitor
from audit.config import AuditConfigError, build_audit
from audit.event import AuditEvent, Identity, Kind, Latencies, Outcome, PolicyInfo, RouteInfo
from audit.log import AuditLog
from audit.scrub import scrub_event
from audit.summary import SummaryAggregator

__all__ = [
    "AuditConfigError", "AuditEvent", "AuditLog", "ConcentrationMonitor", "Identity", "Kind", "Latencies",
    "Outcome", "PolicyInfo", "RouteInfo", "SummaryAggregator", "build_audit", "scrub_event",
]
