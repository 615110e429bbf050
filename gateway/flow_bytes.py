"""Bytes one tenant's queued requests hold while they wait in flow control's queue (session 12, review R12-2).

A request waiting in its tenant's flow queue keeps its parsed body, prompt text and prefix chains
alive (about its body's length, up to ``limits.max_body_bytes`` each); the per-tenant body budget
(``limits.max_buffered_body_bytes_per_tenant``) counts a body only while it is being read, and
``flow.tenant_max_queued_requests`` bounds the count, not the bytes. :class:`QueuedBytes` sums, per
tenant, the body length of each request while it waits (taken when it is queued, given back when it
leaves the queue however it leaves: released to a replica, refused, timed out, cancelled) against
``flow.tenant_max_queued_bytes``: a request that would pass it is refused with the 429 ``queue_full``
of a full queue (:meth:`gateway.flow.FlowControl.release`). A tenant with nothing queued may always
queue one request, whatever its size (it is bounded by ``limits.max_body_bytes``).

Event-loop thread only (no locks).
"""

from __future__ import annotations

__all__ = ["QueuedBytes"]


class QueuedBytes:
    """Per tenant, the body bytes of its requests waiting in the flow queue, bounded by ``limit`` (bytes)."""

    __slots__ = ("limit", "_held")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self._held: dict[str, int] = {}

    def take(self, tenant_id: str, n: int) -> bool:
        """Count ``n`` more bytes for ``tenant_id``; False (nothing counted) when its queued requests
        already hold some and ``n`` more would pass :attr:`limit`."""
        held = self._held.get(tenant_id, 0)
        if held and held + n > self.limit:
            return False
        self._held[tenant_id] = held + n
        return True

    def give_back(self, tenant_id: str, n: int) -> None:
        """``n`` bytes taken for ``tenant_id`` leave the queue (exactly once per successful :meth:`take`)."""
        left = self._held.get(tenant_id, 0) - n
        if left > 0:
            self._held[tenant_id] = left
        else:
            self._held.pop(tenant_id, None)

    def held(self, tenant_id: str) -> int:
        """Bytes ``tenant_id``'s queued requests hold now."""
        return self._held.get(tenant_id, 0)

    def total(self) -> int:
        """Bytes all tenants' queued requests hold now."""
        return sum(self._held.values())
