"""Request-head bounds for both listeners, under both HTTP parsers (issue 10 follow-up).

uvicorn's httptools parser accepts a request head of any size (a 16 MB header
field was answered 200; unfinished 32 MiB heads stayed buffered), and neither
parser bounds the time a client may take to send a head: a connection that
stops partway through a head stays open forever (uvicorn's keep-alive timer
only runs between a response and the next request's first byte).

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

If a response is still in progress when a too-large pipelined head arrives,
nothing can be answered: the connection is closed.

- ``max_connections_per_source`` (``server.max_connections_per_source``, off by default): open
  connections per source IP (socket peer) on this listener; one more gets **503** ``too_many_connections``
  (``Connection: close``) before any byte is read, and is closed (a client that already sent may see a
  reset). Counted per listener class in ``guard_source_counts``; a Unix-socket peer is not counted (R3-6).
- ``max_header_fields`` (``limits.max_header_fields``): header fields per head; past it **431**
  ``too_many_header_fields`` before the parser reads them, and close (R6-3, gateway/head_fields.py); a
  pipelined head after the answer in progress (S9-L3; behind a body's end in one read, httptools: when
  the head completes, before the app).

The mixin :class:`gateway.head_guard.HeadGuard` holds these bounds (moved there in session 9, module size);
this module holds the two guarded protocol classes and :func:`guarded_protocol`.

Hooks: public names of uvicorn's protocol classes only (uvicorn 0.54; pyproject pins ``>=0.30,<0.60``;
checked by tests/hostile/test_i10_header_limits.py::test_uvicorn_hook_points_exist): ``connection_made``,
``connection_lost``, ``data_received``, ``on_response_complete``; httptools' ``on_headers_complete`` and
``on_message_complete``; h11's public ``Connection.their_state`` and ``trailing_data`` of the protocol's
``conn``. A completed head is seen as a new ``cycle`` (uvicorn's ``RequestResponseCycle``). Since session 9
(S9-L3) also uvicorn's httptools ``headers`` (the head's field list) and ``scope`` (a new one per message,
from ``on_message_begin``); tests/hostile/test_s9_lows.py fails if either changes meaning.

The usual request (session 15, issue 14): a read that holds a new head whole and the start of its body, with
nothing any head guard refuses (:func:`gateway.head_scan.usual_head`: one function, the same verdicts as the
scan's whole-head path), goes from ``GuardedHttpToolsProtocol.data_received`` straight to the parser; every
other read takes the general path (``UpgradeGuard.data_received`` -> ``HeadGuard.guard_feed``). The httptools
callbacks call uvicorn's hooks of the same names directly (no ``super()`` chain through the mixins, which
define none of them), and the head/body state changes and the backstop test are inline. No new hook:
tests/hostile/test_s15_edge_usual_head.py compares ``usual_head`` with the general path and refuses every
guarded head in one read under both parsers.
"""

from __future__ import annotations

import asyncio
from typing import Any

import h11
from uvicorn.protocols.http.h11_impl import H11Protocol
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.body_guard import (BODY_COMPLETE_KEY, DEFAULT_MAX_BODY_CHUNKS, WIRE_SCOPE_KEY, BodyGuard, BodyWire,
                                GuardedH11Connection)
from gateway.client_io import LOSS_KEY
from gateway.drop_guard import DropGuard  # R9-1: no read-and-drop at line rate behind an answer in progress
from gateway.head_fields import DEFAULT_MAX_HEADER_FIELDS
from gateway.head_guard import DEFAULT_HEADER_READ_TIMEOUT_S, DEFAULT_MAX_HEADER_BYTES, HeadGuard
from gateway.head_scan import usual_head
from gateway.lingering import DEFAULT_LINGERING_CLOSE_BYTES, DEFAULT_LINGERING_CLOSE_S
from gateway.log_aggregate import note_peer
from gateway.protocol_audit import RefusalAudit  # audit of the guard's refusals (session 7)
from gateway.send_order import SCOPE_KEY as SENDS_KEY, SEND_ORDER
from gateway.upgrade_guard import UpgradeGuard, httptools_backstop  # R7-1, R7-3 (hook: 3 lines, marked R7-1)

__all__ = ["guarded_protocol", "DEFAULT_MAX_HEADER_BYTES", "DEFAULT_HEADER_READ_TIMEOUT_S", "PARSERS"]

PARSERS = ("h11", "httptools")
#: ``#`` as an int: a plain byte search in uvicorn's ``url`` (R8-5's backstop)
_HASH = ord("#")


class GuardedHttpToolsProtocol(UpgradeGuard, RefusalAudit, BodyGuard, DropGuard, HeadGuard, HttpToolsProtocol):  # R7-1, R9-1
    """uvicorn's httptools protocol with the request-head bounds of :class:`gateway.head_guard.HeadGuard`
    and the body framing bounds of :class:`gateway.body_guard.BodyGuard`."""

    guard_head_wire = 0  # body bytes fed with the head, credited to its BodyWire when the head completes

    def data_received(self, data: bytes) -> None:
        """asyncio hook: the usual request (a new head whole in one read with the start of its body, nothing
        to refuse: :func:`gateway.head_scan.usual_head`) goes to the parser at once, as the general path
        (``UpgradeGuard.data_received`` -> ``HeadGuard.guard_feed``) would hand it; anything else takes that
        path (session 15, issue 14: one Python frame instead of eight before the parser)."""
        transport = self.transport
        fields = self.guard_fields
        if (self.guard_waiting and not fields.started and self.guard_deferred is None and not transport.lingering
                and not transport.held and len(data) <= self.guard_max_header_bytes
                and (cut := usual_head(data, self.guard_max_header_fields)) > 0 and not transport.is_closing()):
            note_peer(self.client)
            fields.started = fields.ended = fields.body = fields.hosts = True  # as ScannedHeadFields.feed leaves them
            fields.end = cut
            self.guard_head_bytes = len(data)
            self.guard_head_tail = b""  # as guard_feed leaves it after guard_parse_with_body
            progress = self.guard_progress
            self.guard_head_wire = len(data) - cut  # as guard_parse_with_body
            HttpToolsProtocol.data_received(self, data)
            self.guard_head_wire = 0
            if self.guard_waiting and (cycle := self.cycle) is not None and self.scope is cycle.scope:
                self.guard_quiet_bytes = 0  # the request ended in this read, nothing after it: guard_body_fed's case
            elif not transport.is_closing():
                self.guard_body_fed(progress, len(data) - cut, data)
            return
        super().data_received(data)

    def guard_parse(self, data: bytes) -> None:
        if self.guard_waiting:
            HttpToolsProtocol.data_received(self, data)
            return
        progress = self.guard_progress
        self.guard_wire.bytes += len(data)
        HttpToolsProtocol.data_received(self, data)
        self.guard_body_fed(progress, len(data), data)

    def guard_parse_with_body(self, data: bytes, body_bytes: int) -> bool:
        """A head and the start of its body in one ``feed_data`` (issue 14: one parser call per request
        instead of two); the body's wire bytes go to the request's count as its head completes."""
        progress = self.guard_progress
        self.guard_head_wire = body_bytes
        HttpToolsProtocol.data_received(self, data)
        self.guard_head_wire = 0
        if not self.transport.is_closing():
            self.guard_body_fed(progress, body_bytes, data)
        return True

    def guard_body_unfinished(self) -> bool:
        """True while a request body is being received (its head parsed, its end not yet), or after a
        head refused by gateway/upgrade_guard.py (its body may follow: close lingering; S8)."""
        return not self.guard_waiting or self.guard_head_refused

    def guard_framing_check(self) -> None:
        """While a body arrives: refuse it when its framing bytes pass the bound (R5b-3)."""
        if self.guard_body_unfinished():
            self.guard_framing_too_large()

    def on_response_complete(self) -> None:
        """uvicorn hook: the answer is complete; its last write leaves now (:func:`flush_answer`), then
        uvicorn's handling (a deferred refusal, the keep-alive timer)."""
        flush_answer(self.transport)
        super().on_response_complete()

    def on_headers_complete(self) -> None:
        """httptools parser callback: the head is complete; the head state ends, the body state starts
        (``guard_head_done``, ``guard_body_reset``, inline: session 15), the backstop of
        gateway/upgrade_guard.py refuses what the scan did not see (:func:`httptools_backstop`), then
        uvicorn's handling."""
        self.guard_waiting = False
        self.guard_head_bytes = 0
        if self.guard_timer is not None:
            self.guard_cancel_timer()
        self.guard_chunks = self.guard_body_bytes = self.guard_quiet_bytes = 0
        wire = self.guard_wire = BodyWire()
        if self.guard_head_wire:  # the body bytes parsed together with this head (guard_parse_with_body)
            wire.bytes, self.guard_head_wire = self.guard_head_wire, 0
        scope = self.scope
        scope[SENDS_KEY] = SEND_ORDER.sends  # before uvicorn starts its task (gateway/send_order.py)
        scope[LOSS_KEY] = self.guard_loss
        scope[WIRE_SCOPE_KEY] = wire
        fields = self.guard_fields
        if (self.parser.should_upgrade() or _HASH in self.url or fields.hosts is not True or not fields.started
                or fields.unseen):  # what the backstop looks at (else it finds nothing)
            httptools_backstop(self)  # raises BodyRefused for a refused head
        HttpToolsProtocol.on_headers_complete(self)

    def on_header(self, name: bytes, value: bytes) -> None:
        """httptools callback: a header field; outside a head it is a trailer field (refused: body_guard)."""
        if self.guard_waiting:
            HttpToolsProtocol.on_header(self, name, value)
            return
        self.guard_trailer()

    def on_body(self, body: bytes) -> None:
        """httptools callback: body bytes (counted: body_guard), then uvicorn's handling."""
        self.guard_progress += 1
        self.guard_body_bytes += len(body)
        HttpToolsProtocol.on_body(self, body)

    def on_message_complete(self) -> None:
        """httptools parser callback: the request is complete; the next head is awaited."""
        HttpToolsProtocol.on_message_complete(self)
        cycle = self.cycle
        if cycle is not None and cycle.scope is self.scope and not getattr(cycle, "more_body", True):  # no read timer
            self.scope[BODY_COMPLETE_KEY] = True  # type: ignore[literal-required]
        # guard_head_expected(), inline (session 15)
        self.guard_waiting = True
        self.guard_head_bytes = 0
        self.guard_fields.reset()
        if self.guard_timer is not None:
            self.guard_cancel_timer()


class GuardedH11Protocol(UpgradeGuard, RefusalAudit, BodyGuard, DropGuard, HeadGuard, H11Protocol):  # R7-1, R9-1
    """uvicorn's h11 protocol with the request-head bounds of :class:`gateway.head_guard.HeadGuard` and the body framing
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
        """uvicorn hook: the response is sent (its last write leaves now: :func:`flush_answer`); h11 may
        start the next cycle on buffered bytes."""
        flush_answer(self.transport)
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
            pending, (scanned, self.guard_pending_scan) = self.conn.trailing_data[0], (self.guard_pending_scan, b"")
            self.guard_head_expected(len(pending), bool(scanned) and scanned == pending)  # S9-L3
            if self.guard_head_bytes > self.guard_max_header_bytes:
                self.guard_refuse_too_large()
        elif not idle and self.guard_waiting:
            self.guard_head_done()


def flush_answer(transport: Any) -> None:
    """Write what the connection's transport holds back (gateway/coalesce.py) now that an answer is complete.

    Session 10 (issue 14): the coalescing transport holds a lone write until the end of the loop step.
    A streamed answer's last write (the chunk terminator ``0\r\n\r\n``, after its last part) then
    waited for one more loop round (an ``epoll_pwait`` and every callback queued meanwhile) before the
    client could see the answer end (strace, ``python -m bench.syscalls --stream``). Nothing follows a
    complete answer in its step, so it leaves at once; a plain answer's head and body already left as one
    write. ``transport`` None (connection lost) or without ``flush``: nothing."""
    flush = getattr(transport, "flush", None)
    if flush is not None:
        flush()


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
