"""Open connections per source IP of one listener (``server.max_connections_per_source``, R3-6).

A mixin of the guarded protocol classes of :mod:`gateway.http_guard` (moved out of it, issue 14,
to keep that module under the size bound): one more connection from a source already holding
``guard_max_connections_per_source`` gets **503** ``too_many_connections`` (``Connection: close``)
before any byte is read, and is closed. A Unix-socket peer is not counted.
"""

from __future__ import annotations

import asyncio

from gateway import send_buffer
from gateway.body_guard import refusal_bytes

__all__ = ["SourceCap"]


class SourceCap:
    """Counts each connection against its source IP in ``guard_source_counts`` (a dict per
    protocol class, i.e. per listener; set by :func:`gateway.http_guard.guarded_protocol`)."""

    guard_max_connections_per_source: int | None = None
    #: open connections per source IP of this listener (a fresh dict per guarded protocol class)
    guard_source_counts: dict[str, int] = {}
    guard_source: str | None = None
    #: ``server.client_send_buffer_bytes`` (bytes, or None: kernel default), set by gateway/server.py
    guard_client_send_buffer_bytes: int | None = None

    def guard_admit_source(self, transport: asyncio.Transport) -> bool:
        """Bound the socket's send buffer (gateway/send_buffer.py, R7b-4); count this connection
        against its source IP; False (answered 503 and closed) above the cap."""
        send_buffer.apply_to_transport(transport, self.guard_client_send_buffer_bytes)
        cap = self.guard_max_connections_per_source
        peer = transport.get_extra_info("peername")
        if cap is None or not isinstance(peer, tuple) or not peer:
            return True
        source = str(peer[0])
        counts = self.guard_source_counts
        held = counts.get(source, 0)
        if held >= cap:
            transport.write(refusal_bytes(503, "too_many_connections",
                                          f"too many open connections from this address (limit {cap}); retry later"))
            transport.close()
            return False
        counts[source] = held + 1
        self.guard_source = source
        return True

    def guard_release_source(self) -> None:
        """Give this connection's count back (idempotent)."""
        source, self.guard_source = self.guard_source, None
        if source is not None:
            counts = self.guard_source_counts
            left = counts.get(source, 1) - 1
            if left > 0:
                counts[source] = left
            else:
                counts.pop(source, None)
