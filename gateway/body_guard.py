"""Request-body framing bounds under both HTTP parsers, before the app (review R5-1, R5-5).

uvicorn hands a chunked body to the app one parser callback per chunk (httptools
``on_body``, h11 ``Data`` events), each running Python and growing a buffer: a
body sent as 1-byte chunks cost ~80x the CPU of the same bytes in large chunks
(1.6 s for 8 MB before a 401; h11 ~5.5 s per MB). A chunked body's trailer
section was bounded by nothing under httptools (50 MB accepted). This module
adds, in the protocol classes of :mod:`gateway.http_guard`, under both parsers:

- **chunk count**: a chunked body may have at most
  ``max_body_chunks + body bytes received so far // 1024`` chunks (the last,
  empty chunk included): ``limits.max_body_chunks`` chunks of any size, and
  one more per KiB received (1 KiB chunks are always accepted). The chunk that would pass the
  bound is refused when its chunk header is parsed, before its data costs
  anything: **400** (JSON error, code ``body_too_fragmented``) with
  ``Connection: close``, and the connection is closed. Parser work per body
  is thereby at most one callback per KiB (plus ``max_body_chunks``), as for
  an ordinary upload.
- **trailers**: refused outright (the gateway has no use for them): the first
  trailer field answers **400** (code ``trailers_not_allowed``) and closes.
  Under httptools a trailer field is reported once the next one begins or the
  section ends, so a section that never ends is also bounded by bytes: more
  than ``limits.max_header_bytes`` body-framing bytes in a row that yield no
  body byte and no chunk (trailer bytes, a chunk-size line, chunk extensions)
  answer **400** (code ``chunk_framing_too_large``) and close. h11 bounds the
  same bytes itself (``h11_max_incomplete_event_size`` = ``max_header_bytes``).

If the response to the request has already started, nothing is answered: the
connection is closed. The app, if it is reading the body, then sees the client
disconnect; the refusal's code is left in the request's ASGI scope under
:data:`REFUSED_SCOPE_KEY` so the framing guard (gateway/framing.py) reports it
(audited with that code) instead of ``client_disconnect``.

A request pipelined behind another whose answer is in progress (httptools queues it, its app not
started) is refused after that answer (review R15-2, session 16): it is taken out of uvicorn's queue
(never run, nothing of it forwarded), the refusal is audited by the guard (endpoint ``http_guard``,
its code), what the client sends next is dropped unread, and the 400 and the close follow the last
answer ahead of it (gateway/upgrade_guard.py ``guard_defer_queued``, as a refused pipelined head,
R7b-2). Before, the 400 went out at once and closed: the answer in progress was lost and the refusal
audited nowhere. h11 parses a pipelined request only once the answer before it is complete, so there
the refusal is the first case's.

Hooks (public names only): httptools parser callbacks ``on_chunk_header`` (here),
``on_body`` and ``on_header`` of uvicorn's protocol (in gateway/http_guard.py since session 15, with
:meth:`BodyGuard.guard_trailer`); for h11 the public
``h11.Connection.next_event``, ``their_state`` and ``trailing_data`` of the protocol's ``conn`` (wrapped
by :class:`GuardedH11Connection`, the connection's one wrapper) and h11's ``Data.chunk_start`` and
``EndOfMessage.headers``.
"""

from __future__ import annotations

import asyncio
import json
import logging
from typing import Any

import h11

__all__ = ["BodyGuard", "GuardedH11Connection", "BodyWire", "refusal_bytes", "REFUSED_SCOPE_KEY", "WIRE_SCOPE_KEY",
           "BODY_COMPLETE_KEY", "PLAIN_LENGTH_KEY", "DEFAULT_MAX_BODY_CHUNKS", "MIN_AVERAGE_CHUNK_BYTES",
           "FRAMING_BYTES_PER_CHUNK"]

DEFAULT_MAX_BODY_CHUNKS = 256
#: a chunked body may have one chunk per this many body bytes, beyond ``max_body_chunks``
MIN_AVERAGE_CHUNK_BYTES = 1024
#: ASGI scope key: the error code of a refusal the protocol answered while the app was reading the body
REFUSED_SCOPE_KEY = "prefixgate.body_refused"
#: ASGI scope key: the request's :class:`BodyWire` (wire bytes of its body, framing included)
WIRE_SCOPE_KEY = "prefixgate.body_wire"
#: ASGI scope key, True once the protocol holds the request's whole body (httptools ``on_message_complete``):
#: the app's first ``receive`` then returns it all without waiting (gateway/request.py ``read_body``, issue 14)
BODY_COMPLETE_KEY = "prefixgate.body_complete"
#: ASGI scope key: the request's one plain ``Content-Length`` (digits only, a single field), as the framing
#: guard read it (gateway/framing.py); ``read_body`` then reads no header again (issue 14)
PLAIN_LENGTH_KEY = "prefixgate.plain_content_length"
#: framing bytes allowed per chunk (size line, CRLFs, a short extension) beyond ``max_header_bytes`` per body
FRAMING_BYTES_PER_CHUNK = 32

_REASONS = {400: b"Bad Request", 408: b"Request Timeout", 431: b"Request Header Fields Too Large",
            503: b"Service Unavailable"}
# uvicorn logs "Invalid HTTP request received." when the parser stops on the guard's own refusal;
# the guard has answered already, so that line is dropped (this logger has no handler and does not propagate)
_QUIET = logging.getLogger("gateway.body_guard.quiet")
_QUIET.propagate = False
_QUIET.addHandler(logging.NullHandler())


def refusal_bytes(status: int, code: str, message: str) -> bytes:
    """A complete ``Connection: close`` HTTP/1.1 answer with the gateway's JSON error body.

    ``status``: one of 400, 408, 431, 503; ``code``: the error code. Raises ``KeyError`` for another status.
    """
    err_type = "server_error" if status >= 500 else "invalid_request_error"
    body = json.dumps({"error": {"message": message, "type": err_type,
                                 "code": code, "param": None}}).encode()
    return (b"HTTP/1.1 %d %s\r\ncontent-type: application/json\r\ncontent-length: %d\r\n"
            b"connection: close\r\n\r\n" % (status, _REASONS[status], len(body))) + body


class BodyWire:
    """Wire bytes of one request body handed to the parser (payload plus chunk framing:
    chunk-size lines with their extensions, CRLFs): the bytes after the head's blank line in
    the read that ended the head, then every read until the body ends (a pipelined request's
    bytes read together with the body's end are counted too). Counted by the protocol
    (gateway/http_guard.py); the framing guard (gateway/framing.py) reads it from the scope."""

    __slots__ = ("bytes",)

    def __init__(self) -> None:
        self.bytes = 0


class BodyRefused(Exception):
    """Raised from an httptools callback to stop the parser after the guard answered."""


class BodyGuard:
    """Mixin over a uvicorn HTTP protocol (with :class:`gateway.http_guard._HeadGuard`): body framing bounds.

    Class attribute ``guard_max_body_chunks`` (chunks, >= 1) is set by
    :func:`gateway.http_guard.guarded_protocol`. State is per request
    (reset by :meth:`guard_body_reset` when a head completes).
    """

    guard_max_body_chunks: int = DEFAULT_MAX_BODY_CHUNKS
    guard_chunks: int = 0
    guard_body_bytes: int = 0
    guard_quiet_bytes: int = 0
    guard_progress: int = 0
    guard_wire: BodyWire = BodyWire()

    def guard_body_reset(self) -> None:
        self.guard_chunks = 0
        self.guard_body_bytes = 0
        self.guard_quiet_bytes = 0
        self.guard_wire = BodyWire()

    def guard_framing_too_large(self) -> bool:
        """After body bytes were fed: True (answered 400 and closing) when the body's framing bytes
        (wire bytes minus payload) pass ``max_header_bytes + FRAMING_BYTES_PER_CHUNK x chunks`` (R5b-3)."""
        framing = self.guard_wire.bytes - self.guard_body_bytes
        allowed = self.guard_max_header_bytes + FRAMING_BYTES_PER_CHUNK * self.guard_chunks  # type: ignore[attr-defined]
        if framing <= allowed:
            return False
        self.guard_refuse_body("chunk_framing_too_large",
                               f"chunk framing larger than {FRAMING_BYTES_PER_CHUNK} bytes per chunk")
        return True

    def guard_chunk_too_many(self) -> bool:
        """Count one chunk; True (answered 400 and closing) when it passes the bound."""
        n = self.guard_chunks = self.guard_chunks + 1
        if n > self.guard_max_body_chunks + self.guard_body_bytes // MIN_AVERAGE_CHUNK_BYTES:
            self.guard_refuse_body("body_too_fragmented",
                                   f"chunked body in too many small chunks (at most {self.guard_max_body_chunks} "
                                   f"chunks plus one per {MIN_AVERAGE_CHUNK_BYTES} body bytes)")
            return True
        return False

    def guard_refuse_body(self, code: str, message: str) -> None:
        """Answer 400 ``code`` (unless a response has started) and close the connection; for a request still
        queued behind the response in progress (pipelined, httptools), after that response
        (:meth:`guard_defer_queued`, R15-2). Nothing once the connection closes or a refusal is deferred."""
        transport: asyncio.Transport = self.transport  # type: ignore[attr-defined]
        if transport is None or transport.is_closing() or self.guard_head_refused:  # type: ignore[attr-defined]
            return
        cycle: Any = self.cycle  # type: ignore[attr-defined]
        if cycle is not None and self.guard_defer_queued(cycle, code, message):
            self.logger = _QUIET  # uvicorn's own line for the parser stop that follows (the guard answers)
            return
        if cycle is not None:
            cycle.scope[REFUSED_SCOPE_KEY] = code
        if cycle is None or not cycle.response_started:
            transport.write(refusal_bytes(400, code, message))
        self.logger = _QUIET  # uvicorn's own line for the parser stop that follows (we answered)
        getattr(transport, "close_now", transport.close)()  # no lingering close for a malformed body

    def guard_defer_queued(self, cycle: Any, code: str, message: str) -> bool:
        """``cycle`` (uvicorn's, of the request whose body is refused) waits behind a response in progress:
        True when its refusal is deferred behind that response instead (gateway/upgrade_guard.py); here False."""
        return False

    def guard_h11_head_bytes(self, pending: bytes) -> bool:
        """h11: ``pending`` (unparsed bytes) starts the next head; True: h11 may parse it (mixins before
        this one may refuse it and return False)."""
        return True

    def guard_h11_request(self, event: h11.Request) -> bool:
        """h11: a request head was parsed (``event``); the body state starts over. True: served
        (mixins before this one in the protocol's bases may refuse it and return False)."""
        self.guard_body_reset()
        return True

    # -- httptools parser callbacks (uvicorn's HttpToolsProtocol is next in the MRO)
    def on_chunk_header(self) -> None:
        """httptools callback: a chunk-size line was parsed (before the chunk's data)."""
        self.guard_progress += 1
        if self.guard_chunk_too_many():
            raise BodyRefused()

    def guard_trailer(self) -> None:
        """httptools: a header field outside a head is a trailer field: refused (the protocol's ``on_header``,
        gateway/http_guard.py, calls this; its ``on_body`` counts ``guard_progress`` and ``guard_body_bytes``)."""
        self.guard_refuse_body("trailers_not_allowed", "trailer fields are not accepted")
        raise BodyRefused()

    def guard_body_fed(self, progress_before: int, fed: int, data: bytes = b"") -> None:
        """After handing ``fed`` body bytes to httptools (in ``data``): bound framing bytes that yielded nothing,
        and framing bytes in total (:meth:`guard_framing_too_large`). When the body ended in ``data`` and a
        next head began after it, unfinished (uvicorn's ``scope`` is a new message's while its ``cycle`` is
        still the last head's), the rest of that head is scanned as the rest of a head (S9-L3,
        gateway/upgrade_guard.py ``ScannedHeadFields.mid_head``)."""
        if self.guard_waiting:  # type: ignore[attr-defined]
            self.guard_quiet_bytes = 0
            if (cycle := self.cycle) is not None and self.scope is not cycle.scope:  # type: ignore[attr-defined]
                self.guard_fields.mid_head(data)  # type: ignore[attr-defined]
            return
        if self.guard_framing_too_large():
            return
        if self.guard_progress != progress_before:
            self.guard_quiet_bytes = 0
            return
        self.guard_quiet_bytes += fed
        if self.guard_quiet_bytes > self.guard_max_header_bytes:  # type: ignore[attr-defined]
            self.guard_refuse_body("chunk_framing_too_large",
                                   "chunk framing or trailer section larger than "
                                   f"{self.guard_max_header_bytes} bytes")  # type: ignore[attr-defined]


class GuardedH11Connection:
    """Wraps the ``h11.Connection`` of a uvicorn h11 protocol (its one wrapper): bounds chunks, refuses
    trailers, and hands each ``Request`` event to the protocol's :meth:`BodyGuard.guard_h11_request`
    first (the upgrade guard refuses heads there, gateway/upgrade_guard.py).

    ``conn``: the protocol's connection; ``protocol``: the :class:`BodyGuard`
    protocol. :meth:`next_event` answers ``h11.NEED_DATA`` once the request is
    refused (uvicorn then stops handling events; the connection is closing).
    Every other attribute is the wrapped connection's.
    """

    __slots__ = ("_conn", "_protocol", "_refused")

    def __init__(self, conn: h11.Connection, protocol: BodyGuard) -> None:
        self._conn = conn
        self._protocol = protocol
        self._refused = False

    def next_event(self) -> Any:
        """h11's next event, or ``h11.NEED_DATA`` when the body guard refused the request."""
        if self._refused:
            return h11.NEED_DATA
        conn, proto = self._conn, self._protocol
        if conn.their_state is h11.MUST_CLOSE:  # R8b-1: bytes after a `Connection: close` request are no request
            return h11.NEED_DATA
        # a whole head the guard fed (or bytes pipelined unscanned, behind the response just completed) is
        # checked once before h11 parses it (R7b-5: folds; gateway/upgrade_guard.py); a head still arriving
        # is not copied read after read
        if conn.their_state is h11.IDLE and (not proto.guard_waiting or proto.guard_fields.ended):
            pending = conn.trailing_data[0]
            if pending and not proto.guard_h11_head_bytes(pending):
                self._refused = True
                return h11.NEED_DATA
        event = conn.next_event()
        kind = type(event)
        if kind is h11.Data:
            proto = self._protocol
            if event.chunk_start and proto.guard_chunk_too_many():
                self._refused = True
                return h11.NEED_DATA
            proto.guard_body_bytes += len(event.data)
        elif kind is h11.Request:
            if not self._protocol.guard_h11_request(event):  # refused (gateway/upgrade_guard.py)
                self._refused = True
                return h11.NEED_DATA
        elif kind is h11.EndOfMessage and event.headers:
            self._protocol.guard_refuse_body("trailers_not_allowed", "trailer fields are not accepted")
            self._refused = True
            return h11.NEED_DATA
        return event

    def stop(self) -> None:
        """The request was refused: :meth:`next_event` answers ``h11.NEED_DATA`` from now on."""
        self._refused = True

    def __getattr__(self, name: str) -> Any:
        return getattr(self._conn, name)
