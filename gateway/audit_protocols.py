"""What :class:`gateway.auditing.AuditHub` needs of an audit log and of the concentration monitor
(typing protocols; moved out of :mod:`gateway.auditing` in session 17, which re-exports them)."""

from __future__ import annotations

from collections.abc import Iterable
from typing import Protocol

from audit.event import AuditEvent

__all__ = ["AuditEventLog", "AlertMonitor"]


class AuditEventLog(Protocol):
    """What the hub needs of an audit log: :class:`audit.log.AuditLog` (inline) or
    :class:`audit.remote.RemoteAuditLog` (the worker process). A log that also has
    ``emit_request_row(row)`` gets request rows (:mod:`audit.request_event`) instead of
    built events, and one with ``worker_metrics_text`` (bytes) adds it to the admin metrics."""

    @property
    def accepting(self) -> bool:
        """False while the log refuses events (spill full): the gateway answers 503."""

    @property
    def dropped(self) -> int:
        """Events lost (must stay 0)."""

    def emit(self, event: AuditEvent, exclude: Iterable[str] = ()) -> None:
        """Hand one event to the sinks (never waits on a sink)."""

    async def start(self) -> None:
        """Start the sinks (or the worker process)."""

    async def close(self, timeout_s: float = 10.0) -> None:
        """Flush every sink and write the final signed checkpoint."""


class AlertMonitor(Protocol):
    """What the hub and the build need of the concentration monitor:
    :class:`audit.concentration.ConcentrationMonitor`, or
    :class:`gateway.shared_alerts.PublishingMonitor` around it (``state.backend: redis``)."""

    def observe(self, pool: str, replica: str, prefill_tokens: int, prompt_tokens: int, cached_tokens: int,
                now: float) -> None:
        """Record one routed request (tokens; ``now``: monotonic seconds)."""

    def active_alerts(self) -> list[dict[str, object]]:
        """Active alerts for the policy input."""

    def set_pool_members(self, pool: str, replicas: Iterable[str]) -> None:
        """Declare the replicas of ``pool``."""
