"""Request-head bounds for both listeners, under both HTTP parsers (issue 10 follow-up).

uvicorn's httptools parser accepts a request head of any size (a 16 MB header field was answered 200;
unfinished 32 MiB heads stayed buffered), and neither parser bounds the time a client may take to send a
head: a connection that stops partway through a head stays open forever (uvicorn's keep-alive timer only
runs between a response and the next request's first byte).

This module makes the uvicorn protocol classes uvicorn uses for ``http="h11"``
and ``http="httptools"`` enforce, before any routing or authentication:

- ``max_header_bytes``: the most bytes of one request head (request line,
  header fields and the blank line ending them). Bytes are handed to the
  parser at most up to that bound while a head is incomplete; a head that
  would exceed it answers **431** Request Header Fields Too Large (JSON
  error, code ``request_header_too_large``) with ``Connection: close`` and
  the connection is closed. Nothing reaches the app. A parser never holds
  more than ``2 x max_header_bytes`` + one socket read of a head (the
  request pipelined behind a body that ends inside one read is counted from
  the next read on).
- ``header_read_timeout_s``: a request head must be complete this many
  seconds after the connection opened (first request), or after its first
  byte arrived (later requests on a keep-alive connection; an idle
  keep-alive connection is closed by uvicorn's ``timeout_keep_alive``).
  Otherwise the server answers **408** (code ``header_timeout``) with
  ``Connection: close`` if any byte of the head arrived, and closes the
  connection. A head trickled behind a response still in progress
  (pipelining) gets a new period once that response is complete; it never
  cuts the response.

If a response is still in progress when a too-large pipelined head arrives, nothing can be answered: the
connection is closed (behind a request closing the connection, reading stops instead: gateway/drop_guard.py).

- ``max_connections_per_source`` (``server.max_connections_per_source``, off by default): open
  connections per source IP (socket peer) on this listener; one more gets **503** ``too_many_connections``
  (``Connection: close``) before any byte is read, and is closed (a client that already sent may see a
  reset). Counted per listener class in ``guard_source_counts``; a Unix-socket peer is not counted (R3-6).
- ``max_header_fields`` (``limits.max_header_fields``): header fields per head; past it **431**
  ``too_many_header_fields`` before the parser reads them, and close (R6-3, gateway/head_fields.py).

Hooks: public names of uvicorn's protocol classes only (uvicorn 0.54; pyproject pins ``>=0.30,<0.60``;
checked by tests/hostile/test_i10_header_limits.py::test_uvicorn_hook_points_exist): ``connection_made``,
``connection_lost``, ``data_received``, ``on_response_complete``; httptools' ``on_headers_complete`` and
``on_message_complete``; h11's public ``Connection.their_state`` and ``trailing_data`` of the protocol's
``conn``. A completed head is seen as a new ``cycle`` (uvicorn's ``RequestResponseCycle``).
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.body_guard import (
    BODY_COMPLETE_KEY, DEFAULT_MAX_BODY_CHUNKS, WIRE_SCOPE_KEY, BodyGuard, BodyWire, GuardedH11Connection, refusal_bytes,
)
from gateway.client_io import LOSS_KEY, ConnectionLoss
from gateway.coalesce import CoalescingTransport
from gateway.drop_guard import DropGuard  # R9-1: no read-and-drop at line rate behind an answer in progress
from gateway.lingering import DEFAULT_LINGERING_CLOSE_BYTES, DEFAULT_LINGERING_CLOSE_S, LingeringTransport
from gateway.head_fields import DEFAULT_MAX_HEADER_FIELDS, refuse_too_many_fields, rest_after_head
from gateway.log_aggregate import note_peer
from gateway.protocol_audit import RefusalAudit, refused  # audit of the guard's refusals (session 7)
from gateway.send_order import SEND_ORDER
from gateway.source_cap import SourceCap
from gateway.upgrade_guard import ScannedHeadFields, UpgradeGuard  # R7-1, R7-3 (hook: 3 lines, marked R7-1)

__all__ = ["guarded_protocol", "DEFAULT_MAX_HEADER_BYTES", "DEFAULT_HEADER_READ_TIMEOUT_S", "PARSERS"]

DEFAULT_MAX_HEADER_BYTES = 16 * 1024
DEFAULT_HEADER_READ_TIMEOUT_S = 10.0
PARSERS = ("h11", "httptools")

_refusal = refusal_bytes


class _HeadGuard(SourceCap):
    """Mixin over a uvicorn HTTP protocol: bound each request head's size and read time.

    Class attributes (set by :func:`guarded_protocol`): ``guard_max_header_bytes``
    (bytes, >= 1), ``guard_header_read_timeout_s`` (seconds, > 0) and
    ``guard_max_connections_per_source`` (connections, >= 1, or None: no cap).
    """

    guard_max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES
    guard_header_read_timeout_s: float = DEFAULT_HEADER_READ_TIMEOUT_S
    guard_lingering_close_bytes: int = DEFAULT_LINGERING_CLOSE_BYTES
    guard_lingering_close_s: float = DEFAULT_LINGERING_CLOSE_S
    guard_max_header_fields: int = DEFAULT_MAX_HEADER_FIELDS  # R6-3 (gateway/head_fields.py)

    # state (names prefixed guard_ so they cannot collide with uvicorn's)
    guard_waiting: bool
    guard_head_bytes: int
    guard_timer: asyncio.TimerHandle | None
    guard_head_tail: bytes = b""  # the last 3 bytes of the head fed so far (its end may span two reads)

    def guard_init(self) -> None:
        self.guard_waiting = True
        self.guard_head_bytes = 0
        self.guard_timer = None
        self.guard_source = None
        self.guard_fields = ScannedHeadFields(self.guard_max_header_fields)  # R7-1: HeadFields + Upgrade/'#' scan
        self.guard_loss = ConnectionLoss()  # fired by connection_lost; in every request scope (gateway/client_io.py)
        self.guard_wire = BodyWire()  # this connection's own (the class default is shared)

    # -- head state
    def guard_head_done(self) -> None:  # the fields scan is reset once, when the next head is expected
        self.guard_waiting = False
        self.guard_head_bytes = 0
        if self.guard_timer is not None:
            self.guard_cancel_timer()

    def guard_head_expected(self, buffered: int = 0) -> None:
        self.guard_waiting = True
        self.guard_head_bytes = buffered
        self.guard_fields.reset()
        self.guard_cancel_timer()
        if buffered:
            self.guard_start_timer()

    # -- timer
    def guard_start_timer(self) -> None:
        if self.guard_timer is None:
            loop: asyncio.AbstractEventLoop = self.loop  # type: ignore[attr-defined]
            self.guard_timer = loop.call_later(self.guard_header_read_timeout_s, self.guard_timed_out)

    def guard_cancel_timer(self) -> None:
        if self.guard_timer is not None:
            self.guard_timer.cancel()
            self.guard_timer = None

    def guard_response_in_progress(self) -> bool:
        cycle = self.cycle  # type: ignore[attr-defined]
        return cycle is not None and not cycle.response_complete

    def guard_timed_out(self) -> None:
        self.guard_timer = None
        transport: asyncio.Transport = self.transport  # type: ignore[attr-defined]
        if transport is None or transport.is_closing() or not self.guard_waiting:
            return
        if self.guard_response_in_progress():
            self.guard_start_timer()  # never cut a response; a new period once it is done
            return
        if self.guard_head_bytes:
            transport.write(_refusal(408, "header_timeout", "request head not received in time"))
        transport.close()

    def guard_refuse_too_large(self) -> None:
        self.guard_cancel_timer()
        transport: asyncio.Transport = self.transport  # type: ignore[attr-defined]
        if transport.is_closing():
            return
        if not self.guard_response_in_progress():
            transport.write(_refusal(431, "request_header_too_large",
                                     f"request head larger than {self.guard_max_header_bytes} bytes"))
        transport.close()

    # -- feeding the parser
    def guard_feed(self, data: bytes) -> None:
        """Hand ``data`` to the parser, at most up to the head bound while a head is incomplete."""
        transport: asyncio.Transport = self.transport  # type: ignore[attr-defined]
        offset = 0
        while offset < len(data):
            if transport.is_closing() or transport.held:  # held: the rest is dropped (R9-1, gateway/lingering.py)
                return
            if not self.guard_waiting:  # in a body: the rest as it is (no copy when it is all of it)
                self.guard_parse(data[offset:] if offset else data)
                return
            allowance = self.guard_max_header_bytes - self.guard_head_bytes
            if allowance <= 0:
                self.guard_refuse_too_large()
                return
            end = min(len(data), offset + allowance)
            self.guard_head_bytes += end - offset
            piece = data if offset == 0 and end == len(data) else data[offset:end]
            if not self.guard_fields.feed(piece):  # R6-3: 431 past limits.max_header_fields, unparsed
                refused(self, 431, "too_many_header_fields")
                self.guard_cancel_timer()
                return refuse_too_many_fields(transport, self.guard_max_header_fields,
                                              not self.guard_response_in_progress())
            if self.guard_fields.refusal:  # R7-1/R7-3: never parsed (gateway/upgrade_guard.py)
                return self.guard_refuse_head(self.guard_fields.refusal)  # type: ignore[attr-defined]
            if 0 < (cut := self.guard_fields.end) < len(piece):
                if piece is data and self.guard_fields.body and self.guard_parse_with_body(data, len(data) - cut):
                    self.guard_head_tail = b""  # a head and its body's start: one parse (session 8)
                    return
                # the head alone; the rest goes round (R6b-1)
                self.guard_head_bytes -= len(piece) - cut
                end, piece = offset + cut, piece[:cut]
            tail, self.guard_head_tail = self.guard_head_tail, piece[-3:]
            self.guard_parse(piece)
            if not self.guard_waiting:  # the head ended in this piece: the rest of it is body wire (R5b-3)
                self.guard_head_tail = b""
                self.guard_wire.bytes += rest_after_head(tail, piece)  # type: ignore[attr-defined]
                self.guard_framing_check()
            elif self.guard_head_bytes and not transport.is_closing():
                # a head still incomplete: its read period runs from this read on (a head read whole in
                # one piece, the usual case, costs no timer: issue 14)
                self.guard_start_timer()
            offset = end

    def guard_parse(self, data: bytes) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    def guard_parse_with_body(self, data: bytes, body_bytes: int) -> bool:
        """Parse a whole head and the ``body_bytes`` after it, which it declares as body, in one parser
        call; False: not done here (h11: the head goes alone first). Either way such bytes go unscanned."""
        return False

    def guard_framing_check(self) -> None:  # pragma: no cover - overridden
        raise NotImplementedError

    # asyncio.Protocol hooks shared by both parsers (``super()`` is uvicorn's protocol class)
    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        self.guard_init()
        # one socket write per loop step (a plain answer's head and body leave together; gateway/coalesce.py)
        loop = asyncio.get_running_loop()
        transport = CoalescingTransport(transport, loop)  # type: ignore[assignment]
        # closing while a request body still arrives: half-close, discard, bounded (gateway/lingering.py, R5b-2)
        transport = LingeringTransport(transport, loop, self, max_bytes=self.guard_lingering_close_bytes,  # type: ignore[arg-type, assignment]
                                       timeout_s=self.guard_lingering_close_s)
        super().connection_made(transport)  # type: ignore[misc]
        self.guard_loss.abort = transport.abort  # a stalled stream's end (gateway/write_stall.py, N-3)
        if self.guard_admit_source(transport):
            self.guard_start_timer()

    def connection_lost(self, exc: Exception | None) -> None:
        self.guard_cancel_timer()
        lingering = self.transport  # type: ignore[attr-defined]
        if isinstance(lingering, LingeringTransport):
            lingering.connection_lost()
        self.guard_release_source()
        super().connection_lost(exc)  # type: ignore[misc]
        self.guard_loss.fire()  # after uvicorn marked the cycle disconnected: cancels work awaiting the client

    def data_received(self, data: bytes) -> None:
        transport = self.transport  # type: ignore[attr-defined]
        if transport.lingering:  # closing: what the client still sends is dropped unparsed
            transport.discard(data)
            return
        note_peer(self.client)  # type: ignore[attr-defined]  # for the aggregated "Invalid HTTP request" line
        self.guard_feed(data)


class GuardedHttpToolsProtocol(UpgradeGuard, RefusalAudit, BodyGuard, DropGuard, _HeadGuard, HttpToolsProtocol):  # R7-1, R9-1
    """uvicorn's httptools protocol with the request-head bounds of :class:`_HeadGuard`
    and the body framing bounds of :class:`gateway.body_guard.BodyGuard`."""

    guard_head_wire = 0  # body bytes fed with the head, credited to its BodyWire when the head completes

    def guard_parse(self, data: bytes) -> None:
        if self.guard_waiting:
            HttpToolsProtocol.data_received(self, data)
            return
        progress = self.guard_progress
        self.guard_wire.bytes += len(data)
        HttpToolsProtocol.data_received(self, data)
        self.guard_body_fed(progress, len(data))

    def guard_parse_with_body(self, data: bytes, body_bytes: int) -> bool:
        """A head and the start of its body in one ``feed_data`` (issue 14: one parser call per request
        instead of two); the body's wire bytes go to the request's count as its head completes."""
        progress = self.guard_progress
        self.guard_head_wire = body_bytes
        HttpToolsProtocol.data_received(self, data)
        self.guard_head_wire = 0
        if not self.transport.is_closing():
            self.guard_body_fed(progress, body_bytes)
        return True

    def guard_body_unfinished(self) -> bool:
        """True while a request body is being received (its head parsed, its end not yet), or after a
        head refused by gateway/upgrade_guard.py (its body may follow: close lingering; S8)."""
        return not self.guard_waiting or self.guard_head_refused

    def guard_framing_check(self) -> None:
        """While a body arrives: refuse it when its framing bytes pass the bound (R5b-3)."""
        if self.guard_body_unfinished():
            self.guard_framing_too_large()

    def on_headers_complete(self) -> None:
        """httptools parser callback: the head is complete (then uvicorn's handling)."""
        self.guard_head_done()
        self.guard_body_reset()
        if self.guard_head_wire:  # the body bytes parsed together with this head (guard_parse_with_body)
            self.guard_wire.bytes, self.guard_head_wire = self.guard_head_wire, 0
        SEND_ORDER.stamp(self.scope)  # before uvicorn starts its task (gateway/send_order.py)
        self.scope[LOSS_KEY] = self.guard_loss
        self.scope[WIRE_SCOPE_KEY] = self.guard_wire
        super().on_headers_complete()

    def on_message_complete(self) -> None:
        """httptools parser callback: the request is complete; the next head is awaited."""
        super().on_message_complete()
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope and not getattr(cycle, "more_body", True):  # no read timer
            self.scope[BODY_COMPLETE_KEY] = True  # type: ignore[literal-required]
        self.guard_head_expected()


class GuardedH11Protocol(UpgradeGuard, RefusalAudit, BodyGuard, DropGuard, _HeadGuard, H11Protocol):  # R7-1, R9-1
    """uvicorn's h11 protocol with the request-head bounds of :class:`_HeadGuard` and the body framing
    bounds of :class:`gateway.body_guard.BodyGuard` (through :class:`gateway.body_guard.GuardedH11Connection`).
    A head is awaited while h11's ``their_state`` is ``IDLE``; it is complete when uvicorn has made a new
    ``cycle`` for it. Bytes after a ``Connection: close`` request (``MUST_CLOSE``) are dropped (R8b-1)."""

    def connection_made(self, transport: asyncio.Transport) -> None:  # type: ignore[override]
        if not isinstance(self.conn, GuardedH11Connection):
            self.conn = GuardedH11Connection(self.conn, self)  # type: ignore[assignment]
        super().connection_made(transport)

    def guard_parse(self, data: bytes) -> None:
        if self.conn.their_state is h11.MUST_CLOSE:
            return self.transport.hold_reading()  # R8b-1: not buffered; R9-1: nor read on (gateway/lingering.py)
        before = self.cycle
        in_body = not self.guard_waiting
        if in_body:
            self.guard_wire.bytes += len(data)
        H11Protocol.data_received(self, data)
        self.guard_sync(before)
        if in_body:
            self.guard_framing_check()

    def guard_framing_check(self) -> None:
        """While a body arrives: refuse it when its framing bytes pass the bound (R5b-3)."""
        if self.guard_body_unfinished() and self.guard_framing_too_large():
            self.conn.stop()

    def guard_body_unfinished(self) -> bool:
        """True while a body is being received (h11 ``SEND_BODY``) or after a refused head (R8-7: close lingering)."""
        return self.conn.their_state is h11.SEND_BODY or self.guard_head_refused

    def on_response_complete(self) -> None:
        """uvicorn hook: the response is sent; h11 may start the next cycle on buffered bytes."""
        before = self.cycle
        super().on_response_complete()
        self.guard_sync(before)

    def guard_sync(self, cycle_before: Any) -> None:
        transport: asyncio.Transport = self.transport
        if transport is None or transport.is_closing():
            return
        idle = self.conn.their_state is h11.IDLE
        if self.cycle is not cycle_before:
            self.guard_head_done()
            if self.cycle is not None:
                SEND_ORDER.stamp(self.cycle.scope)  # its task runs later (gateway/send_order.py)
                self.cycle.scope[LOSS_KEY] = self.guard_loss
                self.cycle.scope[WIRE_SCOPE_KEY] = self.guard_wire
        if idle and not self.guard_waiting:
            self.guard_head_expected(len(self.conn.trailing_data[0]))
            if self.guard_head_bytes > self.guard_max_header_bytes:
                self.guard_refuse_too_large()
        elif not idle and self.guard_waiting:
            self.guard_head_done()


_BASES: dict[str, type] = {"h11": GuardedH11Protocol, "httptools": GuardedHttpToolsProtocol}


def guarded_protocol(parser: str, *, max_header_bytes: int = DEFAULT_MAX_HEADER_BYTES,
                     header_read_timeout_s: float = DEFAULT_HEADER_READ_TIMEOUT_S,
                     max_connections_per_source: int | None = None,
                     max_body_chunks: int = DEFAULT_MAX_BODY_CHUNKS,
                     lingering_close_bytes: int = DEFAULT_LINGERING_CLOSE_BYTES,
                     lingering_close_s: float = DEFAULT_LINGERING_CLOSE_S,
                     max_header_fields: int = DEFAULT_MAX_HEADER_FIELDS) -> type[asyncio.Protocol]:
    """Return a uvicorn HTTP protocol class (for ``uvicorn.Config(http=...)``) that bounds request heads.

    ``parser``: ``"h11"`` or ``"httptools"``; ``max_header_bytes``: bytes of
    one request head, >= 1; ``header_read_timeout_s``: seconds, > 0;
    ``max_connections_per_source``: open connections per source IP, >= 1, or
    None (no cap); each class returned counts its own connections (one class
    per listener); ``max_body_chunks``: chunks of a chunked body before it must
    average 1 KiB per chunk (gateway/body_guard.py), >= 1; ``lingering_close_bytes`` (bytes, >= 0;
    0: no lingering) and ``lingering_close_s`` (seconds, > 0): the bounds of the discard when a
    connection is closed while a request body still arrives (gateway/lingering.py); ``max_header_fields``
    (>= 1): see above. Raises :class:`ValueError` for another parser or out-of-range bounds.
    """
    if parser not in _BASES:
        raise ValueError(f"unknown HTTP parser {parser!r} (expected one of {PARSERS})")
    bounds = {"max_header_bytes": max_header_bytes >= 1, "header_read_timeout_s": header_read_timeout_s > 0,
              "max_body_chunks": max_body_chunks >= 1, "max_header_fields": max_header_fields >= 1,
              "lingering_close_bytes": lingering_close_bytes >= 0, "lingering_close_s": lingering_close_s > 0,
              "max_connections_per_source": max_connections_per_source is None or max_connections_per_source >= 1}
    if not all(bounds.values()):
        raise ValueError(f"out-of-range bound(s): {sorted(k for k, ok in bounds.items() if not ok)} (see the docstring)")
    base = _BASES[parser]
    return type(base.__name__, (base,), {"guard_max_header_bytes": max_header_bytes,
                                         "guard_header_read_timeout_s": header_read_timeout_s,
                                         "guard_max_connections_per_source": max_connections_per_source,
                                         "guard_source_counts": {},
                                         "guard_max_body_chunks": max_body_chunks,
                                         "guard_lingering_close_bytes": lingering_close_bytes,
                                         "guard_lingering_close_s": lingering_close_s,
                                         "guard_max_header_fields": max_header_fields,
                                         "__doc__": base.__doc__})
