"""Open connections per source IP of one listener (``server.max_connections_per_source``, R3-6).

A mixin of the guarded protocol classes of :mod:`gateway.http_guard` (moved out of it, issue 14,
to keep that module under the size bound): one more connection from a source already holding
``guard_max_connections_per_source`` gets **503** ``too_many_connections`` (``Connection: close``)
before any byte is read, and is closed. A Unix-socket peer is not counted.

The cap is off by default; :func:`uncapped_listener_warnings` names each listener that then binds a
non-loopback address, for one start-up WARNING each (session 25, S24-review-4): Envoy logs the same
kind of line at start when no downstream connection limit is configured (its overload manager's
``envoy.resource_monitors.downstream_connections``); nginx ``limit_conn`` and HAProxy stick tables
(``src_conn_cur``) are off until configured too, because a per-address cap throttles every client
behind one NAT or one L4 load balancer that does not pass client addresses (docs/security.md).
"""

from __future__ import annotations

import asyncio
import ipaddress
from collections.abc import Iterable

from gateway import send_buffer
from gateway.body_guard import refusal_bytes

__all__ = ["SourceCap", "is_loopback_host", "uncapped_listener_warnings"]


def is_loopback_host(host: str) -> bool:
    """True for ``localhost`` and a loopback IP literal (``127.0.0.0/8``, ``::1``, and ``127.0.0.0/8`` as an
    IPv4-mapped IPv6 address, ``::ffff:127.0.0.1``: RFC 4291 section 2.5.5.2); False for the wildcard
    (``0.0.0.0``, ``::``, ``""``), any other address and any other host name (it may resolve anywhere)."""
    if host.strip().lower() == "localhost":
        return True
    try:
        addr = ipaddress.ip_address(host.strip("[]"))
    except ValueError:
        return False
    # Python 3.11's IPv6Address.is_loopback is False for a mapped 127.x address (S26-review26-10)
    mapped = getattr(addr, "ipv4_mapped", None)
    return (mapped if mapped is not None else addr).is_loopback


def uncapped_listener_warnings(listeners: Iterable[tuple[str, str]], cap: int | None, max_connections: int,
                               header_read_timeout_s: float, trusted_proxies: bool) -> list[str]:
    """One line per listener ``(name, host)`` that binds a non-loopback host while ``cap``
    (``server.max_connections_per_source``) is None; none when a cap is set. ``max_connections``:
    ``limits.max_connections`` (connections per listener); ``header_read_timeout_s``: seconds an idle
    connection is held; ``trusted_proxies``: ``identity.trusted_proxies`` is set (the line then says the cap
    counts the proxy, never a forwarded address). Pure: the caller logs them."""
    if cap is not None:
        return []
    proxies = (" identity.trusted_proxies is set: the cap would count each proxy's socket address, never a "
               "forwarded client address." if trusted_proxies else "")
    return [f"server.max_connections_per_source is off and the {name} listener binds {host or '*'} (not loopback): "
            f"one unauthenticated source can hold limits.max_connections ({max_connections}) idle connections "
            f"for limits.header_read_timeout_s ({header_read_timeout_s:g} s) each and keep every tenant out "
            f"(review R3-6). Set it (e.g. 64-256) when clients connect directly; behind an L4 load balancer or "
            f"proxy that does not pass client addresses every client is that one source: cap connections per "
            f"client there and set this above its connection count, or leave it off (docs/security.md, "
            f"S24-review-4).{proxies}"
            for name, host in listeners if not is_loopback_host(host)]


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
