"""The request-head bounds of gateway/http_guard.py: one mixin over uvicorn's HTTP protocols (size, read
time, field count, the hand-off to the parser). Moved out of gateway/http_guard.py in session 9 (module
size); the behaviour and its documentation are there.
"""

from __future__ import annotations

import asyncio

from gateway.body_guard import BodyWire, refusal_bytes
from gateway.client_io import ConnectionLoss
from gateway.coalesce import CoalescingTransport
from gateway.head_fields import DEFAULT_MAX_HEADER_FIELDS, rest_after_head
from gateway.lingering import DEFAULT_LINGERING_CLOSE_BYTES, DEFAULT_LINGERING_CLOSE_S, LingeringTransport
from gateway.log_aggregate import note_peer
from gateway.source_cap import SourceCap
from gateway.head_scan import FIELDS_CODE, ScannedHeadFields

__all__ = ["HeadGuard", "DEFAULT_MAX_HEADER_BYTES", "DEFAULT_HEADER_READ_TIMEOUT_S"]

DEFAULT_MAX_HEADER_BYTES = 16 * 1024
DEFAULT_HEADER_READ_TIMEOUT_S = 10.0

_refusal = refusal_bytes


class HeadGuard(SourceCap):
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

    def guard_head_expected(self, buffered: int = 0, keep_scan: bool = False) -> None:
        self.guard_waiting = True
        self.guard_head_bytes = buffered
        if not keep_scan:  # kept: the buffered bytes were scanned already (h11, S9-L3)
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
                # after the answer in progress, if any (S9-L3; before, a pipelined head's 431 closed at once)
                return self.guard_refuse_head(FIELDS_CODE)  # type: ignore[attr-defined]
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
        coalescing = CoalescingTransport(transport, loop)
        transport = coalescing  # type: ignore[assignment]
        # closing while a request body still arrives: half-close, discard, bounded (gateway/lingering.py, R5b-2)
        transport = LingeringTransport(transport, loop, self, max_bytes=self.guard_lingering_close_bytes,  # type: ignore[arg-type, assignment]
                                       timeout_s=self.guard_lingering_close_s)
        super().connection_made(transport)  # type: ignore[misc]
        self.guard_loss.abort = transport.abort  # a stalled stream's end (gateway/write_stall.py, N-3)
        self.guard_loss.unsent = transport.get_write_buffer_size  # unread answers per tenant (R10b-5)
        self.guard_loss.write_through = coalescing.write_through  # a live stream's middle parts (session 28)
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
