"""The usual request's guard path (session 18, issue 14): the guard work of a request read whole, done once.

Session 17 measured (in process, warm) our guarded httptools protocol at ~28 µs per request over uvicorn's
own protocol with the same trivial app. Part of it is per parser callback: every header field, the body
and the message end went through a guard wrapper (gateway/http_guard.py ``on_header``, ``on_body``,
``on_message_complete``) that only matters while a head is incomplete, a body is chunked or split over
reads, or a next request is pipelined behind a body. A request that arrives whole is none of these.

**The usual request** (:func:`gateway.head_scan.usual_head` with ``whole``, in the same pass as its usual-head
checks; :func:`usual_whole`; decided on facts already checked, never on a guess): one read
that :func:`gateway.head_scan.usual_head` accepts (a whole head, ``POST``/``GET``, no ``#`` in the request
line, no ``Upgrade`` line, exactly one plain ``Content-Length`` > 0, no ``Transfer-Encoding``, exactly one
``Host``, at most ``max_header_fields`` fields, the read within ``max_header_bytes``) AND

- its request line ends ``HTTP/1.1`` (HTTP/1.0 and anything else: today's path);
- every line of the head ends CRLF (no bare CR or LF), no space or tab before a colon, no line starting
  with a space or tab (obs-fold): odd spellings take today's path, even those the parser refuses anyway;
- no ``expect`` and no ``connection`` anywhere in the head (any case: ``Expect: 100-continue``,
  ``Connection: close``/``upgrade``, ``Proxy-Connection``: today's path; a header VALUE holding one of
  these words also does, which costs only speed);
- the ``Content-Length`` value equals the bytes after the head in this read: the whole body, and nothing
  after it (a pipelined request, a body split over reads, a short body: today's path);
- and, checked by the protocol: a new head is awaited with nothing of it fed, no refusal deferred, the
  transport neither closing, lingering nor held, and no answer in progress (a request pipelined behind
  an answer takes today's path).

Such a read is parsed by a second httptools parser of the same connection (:meth:`UsualRequest.guard_usual_parser`,
made once, with uvicorn's leniency), whose callbacks are uvicorn's own ``on_message_begin``, ``on_url``,
``on_header``, ``on_body`` and ``on_message_complete`` (no wrapper: no trailer or chunk can occur under one
``Content-Length`` without ``Transfer-Encoding``) and :meth:`UsualRequest.guard_usual_headers_complete` (the
head/body state and the request scope's keys, then uvicorn's ``on_headers_complete``); ``self.parser`` is that
parser for the call, as uvicorn's ``on_headers_complete``/``on_body`` read it. After the read: the scope's
``BODY_COMPLETE_KEY``, the body counts. The main parser never saw the request and stays at a message
boundary, as it would after it; the usual parser too (keep-alive: ``Connection`` excluded). What the head
backstop (gateway/upgrade_guard.py ``httptools_backstop``) looks at is excluded by the facts above (no
upgrade, no ``#``, hosts checked whole, the head seen whole), as on today's fast path.

Every other read takes today's path unchanged; ``guard_usual_request = False`` (class attribute) turns the
usual path off (tests/gateway/test_s18_edge_usual.py compares the two). A parse error (httptools still refuses
what it refuses: a bad field character, a bad target) is uvicorn's 400 either way; the usual parser is then
dropped and made again for the connection's next usual request (there is none: the connection closes).

uvicorn names used: those gateway/http_guard.py already uses (``parser``, ``scope``, ``cycle``, ``client``,
``transport``, ``data_received``, ``on_header``, ``on_body``, ``on_headers_complete``,
``on_message_complete``, ``on_message_begin``, ``response_complete``, ``more_body``) and ``on_url`` (uvicorn's
parser callback, public; checked in tests/hostile/test_i10_header_limits.py).
"""

from __future__ import annotations

from types import SimpleNamespace
from typing import Any

import httptools
from uvicorn.protocols.http.httptools_impl import HttpToolsProtocol

from gateway.body_guard import BODY_COMPLETE_KEY, WIRE_SCOPE_KEY, BodyWire
from gateway.client_io import LOSS_KEY
from gateway.head_scan import usual_head
from gateway.log_aggregate import note_peer
from gateway.send_order import SCOPE_KEY as SENDS_KEY, SEND_ORDER

__all__ = ["UsualRequest", "usual_whole"]

def usual_whole(data: bytes, max_fields: int) -> int:
    """The offset past the head when ``data`` (one read) is the usual request whole (module doc), else -1:
    :func:`gateway.head_scan.usual_head` with ``whole`` (one pass over the head)."""
    cut = usual_head(data, max_fields, True)
    return cut if cut > 0 else -1


class UsualRequest:
    """Mixin of :class:`gateway.http_guard.GuardedHttpToolsProtocol`: the usual request's path (module doc)."""

    #: the usual path on (False: every read takes today's path; tests and bench/edge_cpu.py compare the two)
    guard_usual_request = True
    guard_usual: Any = None  # this connection's second parser, made on its first usual request

    def guard_usual_parser(self) -> Any:
        """The connection's usual-request parser (made once): uvicorn's callbacks without the guard's wrappers."""
        proto: Any = self
        hooks = SimpleNamespace(
            on_message_begin=proto.on_message_begin, on_url=proto.on_url,
            on_header=HttpToolsProtocol.on_header.__get__(proto),
            on_headers_complete=self.guard_usual_headers_complete,
            on_body=HttpToolsProtocol.on_body.__get__(proto),
            on_message_complete=HttpToolsProtocol.on_message_complete.__get__(proto),
            on_chunk_header=proto.on_chunk_header)  # never called (no chunked body): the guard's, in case
        parser = httptools.HttpRequestParser(hooks)
        try:
            parser.set_dangerous_leniencies(lenient_data_after_close=True)  # as uvicorn's own parser
        except AttributeError:  # pragma: no cover - httptools < 0.6.3
            pass
        self.guard_usual = parser
        return parser

    def guard_feed_usual(self, data: bytes, cut: int) -> None:
        """Parse the usual request ``data`` (head up to ``cut``, then its whole body) in one parser call."""
        proto: Any = self
        note_peer(proto.client)  # for the aggregated "Invalid HTTP request" line, as on every read
        main = proto.parser
        proto.parser = self.guard_usual or self.guard_usual_parser()
        proto.guard_head_wire = body = len(data) - cut
        try:
            HttpToolsProtocol.data_received(proto, data)
        finally:
            proto.parser = main
        proto.guard_head_wire = 0
        if (cycle := proto.cycle) is None or cycle.scope is not proto.scope or cycle.more_body:
            self.guard_usual = None  # the message did not complete (a parse error: uvicorn's 400): parser spent
            return
        proto.guard_head_tail = b""
        proto.guard_body_bytes = body
        proto.scope[BODY_COMPLETE_KEY] = True

    def guard_usual_headers_complete(self) -> None:
        """The usual parser's ``on_headers_complete``: what gateway/http_guard.py's does for a head read whole
        (its backstop finds nothing: module doc), with the body's wire bytes known, then uvicorn's."""
        proto: Any = self
        if proto.guard_timer is not None:
            proto.guard_cancel_timer()
        proto.guard_head_bytes = proto.guard_chunks = proto.guard_quiet_bytes = proto.guard_body_bytes = 0
        wire = proto.guard_wire = BodyWire()
        wire.bytes = proto.guard_head_wire
        scope = proto.scope
        scope[SENDS_KEY] = SEND_ORDER.sends  # before uvicorn starts its task (gateway/send_order.py)
        scope[LOSS_KEY] = proto.guard_loss
        scope[WIRE_SCOPE_KEY] = wire
        HttpToolsProtocol.on_headers_complete(proto)
