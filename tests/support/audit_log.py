"""An in-memory stand-in for :class:`audit.log.AuditLog` behind :class:`gateway.auditing.AuditHub`.

``AuditHub(ListLog())`` lets a test read every audit event the gateway emitted
(request and operator events) without sinks on disk.
"""
from __future__ import annotations

from typing import Any

__all__ = ["ListLog"]


class ListLog:
    """In-memory audit log: the subset of :class:`audit.log.AuditLog` the hub uses.
    ``events`` holds every emitted event, oldest first; it always accepts and never drops."""

    accepting = True
    dropped = 0

    def __init__(self) -> None:
        self.events: list[Any] = []

    def emit(self, event: Any) -> None:
        """Keep ``event`` (an :class:`audit.event.AuditEvent` or operator event)."""
        self.events.append(event)

    async def start(self) -> None:
        return None

    async def close(self) -> None:
        return None
