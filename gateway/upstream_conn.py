"""One keep-alive HTTP/1.1 connection to a replica and the response read on it (issue 14).

Why not a library: aiohttp's ``session.post`` + read costs 119-145 µs of
client CPU per request on loopback; the fastest maintained alternative
measured (pyreqwest) 95-106 µs; this module's parser is the one uvicorn
already trusts on the server side (``httptools``, llhttp): ~30-40 µs
(docs/architecture.md, "Upstream client"; bench/upstream_clients.py).

Framing is strict, because a replica (or whatever answers on its address)
is outside the gateway's trust boundary:

- a response with both ``Content-Length`` and ``Transfer-Encoding``, with
  two ``Content-Length`` headers, or with a ``Transfer-Encoding`` other than
  ``chunked`` is refused (:class:`UpstreamProtocolError`), as is any chunk
  framing llhttp rejects;
- the status line and headers are bounded (:data:`MAX_HEAD_BYTES` bytes,
  :data:`MAX_HEADERS` fields); ``101`` (upgrade) is refused, other ``1xx``
  interim answers are skipped;
- bytes after the end of the answer that arrive with it, or while the
  connection is idle in the pool, close the connection; so do unread bytes
  (or the replica's close) already waiting in the socket when the pool takes
  the connection for a new request (:meth:`UpstreamConnection.quiet`: one
  ``poll`` with timeout 0, session 7 R6b-2), which the loop would otherwise
  hand to the new request as its answer;
- an answer whose ``X-Request-Id`` differs from the one the request sent is
  refused (:class:`UpstreamProtocolError`; the connection closes): a
  replica's late stray answer to the previous request on the connection
  (review R6b-2). This needs a replica that echoes the header (vLLM with
  ``--enable-request-id-headers``); without the echo, HTTP/1.1 keep-alive
  cannot tell a stray answer that arrives after the request was sent from
  that request's own answer (replicas are trusted to speak HTTP/1.1
  correctly, docs/security.md);
- a body delimited by the connection's end (no ``Content-Length``, not
  chunked) is complete only when a plain-TCP connection closes cleanly: a
  reset fails it (S19-R1), and over TLS it always fails as incomplete
  (:class:`UpstreamConnectionLost`, after the parts that arrived): the
  event loops' SSL transports report an end without ``close_notify`` as a
  clean one, so completeness cannot be proven (RFC 9112 section 9.8, S19-R2);
- a connection goes back to the pool only when its answer arrived whole, the
  replica allowed keep-alive (no ``Connection: close``, not HTTP/1.0 without
  keep-alive, not delimited by close) and the request was fully written; an
  answer closed, cancelled or failed before its end aborts the connection.

The body is buffered per response up to :data:`HIGH_WATER` bytes before the
socket stops being read (flow control for slow SSE clients).
"""

from __future__ import annotations

import asyncio
import select
from collections.abc import Callable
from typing import Any

import httptools

from gateway.upstream_response import UpstreamResponse

__all__ = ["UpstreamConnection", "UpstreamResponse", "UpstreamProtocolError", "UpstreamConnectionLost",
           "MAX_HEAD_BYTES", "MAX_HEADERS", "HIGH_WATER", "LOW_WATER"]

#: most bytes of status line + headers of one answer
MAX_HEAD_BYTES = 64 << 10
#: most header fields of one answer
MAX_HEADERS = 100
#: buffered, unread body bytes of one answer above which the socket is not read
HIGH_WATER = 1 << 20
#: buffered body bytes below which reading resumes
LOW_WATER = 256 << 10


class UpstreamProtocolError(Exception):
    """The replica's answer breaks HTTP/1.1 framing or the gateway's bounds (the connection is closed)."""


class UpstreamConnectionLost(Exception):
    """The connection closed before the answer was complete.

    ``received_any``: whether any byte of the answer arrived (false on a
    kept-alive connection the replica closed before reading the request:
    the pool then retries once on a new connection).
    """

    def __init__(self, message: str, received_any: bool) -> None:
        super().__init__(message)
        self.received_any = received_any


class UpstreamConnection(asyncio.Protocol):
    """An asyncio protocol carrying one request at a time (no pipelining).

    ``on_idle(conn)``: called when an answer ended cleanly and the
    connection may be reused; ``on_closed(conn)``: called once when it
    closes (either way). ``reused``: it carried an answer before;
    ``idle_since``: loop time it became idle.
    """

    def __init__(self, on_idle: Callable[[UpstreamConnection], None],
                 on_closed: Callable[[UpstreamConnection], None],
                 loop: asyncio.AbstractEventLoop | None = None) -> None:
        self._on_idle, self._on_closed = on_idle, on_closed
        #: the event loop it runs on (given by the pool, else noted in ``connection_made``)
        self.loop = loop
        self.transport: asyncio.Transport | None = None
        self.closed = False
        self.reused = False
        self.idle_since = 0.0
        self.counted = False  # the pool counted it in its limit (set by the pool)
        self._resp: UpstreamResponse | None = None
        self._parser: Any = None
        self._paused = False
        self._expect_id: str | None = None
        self._poll: Any = None
        self._tls = False  # the transport is TLS (noted in connection_made)
        self._reset_message()

    def _reset_message(self) -> None:
        self._head_bytes = 0
        self._received = False
        self._headers_done = False
        self._message_done = False
        self._interim = False
        self._keep_alive = False
        self._until_close = False
        self._poisoned = False
        self._fields: list[tuple[bytes, bytes]] = []  # the head's fields as received, read at its end

    # ----------------------------------------------------------------- use
    def send(self, data: bytes, request_id: str | None = None) -> UpstreamResponse:
        """Write one whole request (head and body in ``data``); returns its :class:`UpstreamResponse`.
        ``request_id``: the ``X-Request-Id`` the request carries; an answer that echoes another one
        fails with :class:`UpstreamProtocolError` (R6b-2).

        Raises RuntimeError when the connection is closed or busy.
        """
        transport = self.transport
        if self.closed or transport is None or self._resp is not None:
            raise RuntimeError("upstream connection not idle")
        # session 18: written first (the replica starts on it), the answer's state set after: no byte of the
        # answer is handed to this protocol before the event loop's next turn (data_received is a loop callback)
        transport.write(data)
        self._reset_message()  # one state, one place (its inline copy saved no measurable time: s18 review)
        self._expect_id = request_id
        resp = self._resp = UpstreamResponse(self, self.loop)
        return resp

    def usable(self) -> bool:
        """Idle and open (a closed or half-closed socket is noticed by the loop as connection_lost)."""
        return not self.closed and self._resp is None and self.transport is not None \
            and not self.transport.is_closing()

    def quiet(self) -> bool:
        """True when no byte (nor the replica's close) waits unread in the socket: one ``poll`` with
        timeout 0 (a few µs; call it before reusing an idle connection). True when the socket cannot
        be polled (no file descriptor)."""
        poller = self._poll
        if poller is None:
            return True
        try:
            return not poller.poll(0)
        except (OSError, ValueError):
            return False

    def abort(self) -> None:
        """Close at once (no reuse); the current answer, if any, fails."""
        if self.transport is not None:
            self.transport.abort()
        self._closed_now(UpstreamConnectionLost("upstream connection aborted", self._received))

    def resume(self) -> None:
        """The reader drained the buffer: read the socket again if it was paused."""
        if self._paused and self.transport is not None and not self.closed:
            self._paused = False
            self.transport.resume_reading()

    # ----------------------------------------------------------------- asyncio.Protocol
    def connection_made(self, transport: asyncio.BaseTransport) -> None:  # noqa: D102
        self.transport = transport  # type: ignore[assignment]  # uvloop's TCPTransport is not a subclass
        # one parser for the connection's life (session 14: not one per request). A connection is reused only
        # after an answer ended cleanly (llhttp then waits for the next message); any parse error aborts it.
        self._parser = httptools.HttpResponseParser(self)
        self._tls = transport.get_extra_info("ssl_object") is not None
        if self.loop is None:
            self.loop = asyncio.get_running_loop()
        sock = transport.get_extra_info("socket")
        fd = sock.fileno() if sock is not None else -1
        if fd >= 0:
            self._poll = select.poll()
            self._poll.register(fd, select.POLLIN | select.POLLPRI)

    def data_received(self, data: bytes) -> None:  # noqa: D102
        resp = self._resp
        if resp is None:  # nothing asked: unsolicited bytes (or a late answer): never reuse
            self.abort()
            return
        self._received = True
        try:
            self._parser.feed_data(data)
        except httptools.HttpParserUpgrade:
            self._protocol_error("upgrade answers are not accepted")
            return
        except httptools.HttpParserError as exc:
            cause = exc.__cause__ or exc.__context__
            self._protocol_error(str(cause) if isinstance(cause, UpstreamProtocolError) else f"bad framing: {exc}")
            return
        if not self._headers_done:
            self._head_bytes += len(data)
            if self._head_bytes > MAX_HEAD_BYTES:
                self._protocol_error(f"answer head larger than {MAX_HEAD_BYTES} bytes")
                return
        if self._message_done:
            self._end_of_answer(resp)
        elif resp._buffered > HIGH_WATER and not self._paused and self.transport is not None:
            self._paused = True
            self.transport.pause_reading()

    def eof_received(self) -> bool | None:  # noqa: D102
        return None  # close the transport: connection_lost follows

    def connection_lost(self, exc: Exception | None) -> None:  # noqa: D102
        resp = self._resp
        if resp is not None and self._headers_done and self._until_close and not self._message_done:
            # a body delimited by the end of the connection (RFC 9112 sections 6.3 item 8, 8 and 9.8):
            # complete only on a clean close of a plain connection. A reset (exc) cuts it (S19-R1); over
            # TLS the end cannot be proven: asyncio's and uvloop's SSL transports report a FIN without
            # close_notify as a clean end (S19-R2), so it is recorded as incomplete
            if exc is None and not self._tls:
                resp._finish()
                self._resp = None
            elif exc is None:
                self._closed_now(UpstreamConnectionLost(
                    "answer delimited by the connection's end over TLS cannot be proven complete", True))
                return
            else:
                self._closed_now(UpstreamConnectionLost(
                    f"replica connection ended by {type(exc).__name__}: answer incomplete", self._received))
                return
        self._closed_now(UpstreamConnectionLost("replica closed the connection", self._received))

    # ----------------------------------------------------------------- httptools callbacks
    def on_message_begin(self) -> None:  # noqa: D102
        if self._message_done:  # a second answer to one request
            self._poisoned = True
            raise UpstreamProtocolError("data after the end of the answer")

    def on_header(self, name: bytes, value: bytes) -> None:  # noqa: D102
        # session 15: only kept here (one call per field from llhttp); counted, bounded and decoded at the
        # head's end (on_headers_complete). The head's bytes are bounded per read meanwhile (data_received).
        fields = self._fields
        fields.append((name, value))
        if len(fields) > MAX_HEADERS:
            raise UpstreamProtocolError(f"more than {MAX_HEADERS} header fields")

    def on_headers_complete(self) -> None:  # noqa: D102
        resp = self._resp
        assert resp is not None
        status = self._parser.get_status_code()
        if status == 101:
            raise UpstreamProtocolError("upgrade answers are not accepted")
        fields, self._fields = self._fields, []
        if 100 <= status < 200:  # interim answer: skip it (its fields too), the real one follows
            self._interim = True
            return
        resp.headers = _header_map(fields)
        te = resp.headers.get("transfer-encoding")
        if te is not None:
            if "content-length" in resp.headers:
                raise UpstreamProtocolError("both Content-Length and Transfer-Encoding")
            if te.strip().lower() != "chunked":
                raise UpstreamProtocolError(f"unsupported Transfer-Encoding {te!r}")
        self._until_close = te is None and "content-length" not in resp.headers and status not in (204, 304)
        self._keep_alive = self._parser.should_keep_alive() and not self._until_close
        echo = resp.headers.get("x-request-id")
        if echo is not None and self._expect_id is not None and echo != self._expect_id:
            self._poisoned = True
            raise UpstreamProtocolError("answer to another request (X-Request-Id differs)")
        self._headers_done = True
        resp.status = status
        resp._head_seen = True
        resp._wake()

    def on_body(self, body: bytes) -> None:  # noqa: D102
        resp = self._resp
        assert resp is not None
        resp._feed(body)

    def on_message_complete(self) -> None:  # noqa: D102
        if self._interim:
            self._interim = False
            self._head_bytes = 0
            return
        self._message_done = True

    # ----------------------------------------------------------------- internals
    def _end_of_answer(self, resp: UpstreamResponse) -> None:
        resp._finish()
        self._resp = None
        t = self.transport
        if self._keep_alive and not self._poisoned and t is not None and t.get_write_buffer_size() == 0:
            self.reused = True
            if self._paused:
                self.resume()
            self._on_idle(self)
        else:
            self.abort()

    def _protocol_error(self, message: str) -> None:
        if self._message_done and self._resp is not None:  # the answer itself was whole
            self._resp._finish()
            self._resp = None
        if self.transport is not None:
            self.transport.abort()
        self._closed_now(UpstreamProtocolError(message))

    def _closed_now(self, exc: BaseException) -> None:
        resp, self._resp = self._resp, None
        if resp is not None:
            resp._fail(exc)
        if not self.closed:
            self.closed = True
            self._poll = None  # the descriptor may be reused by another socket once closed
            self._on_closed(self)


def _header_map(fields: list[tuple[bytes, bytes]]) -> dict[str, str]:
    """The answer's header fields (as received: name, value) as lower-case name -> value, repeated
    names joined with ``", "`` (RFC 9110 section 5.3). Raises :class:`UpstreamProtocolError` when the
    fields pass :data:`MAX_HEAD_BYTES` (each counted as ``name: value`` and CRLF) or name
    ``Content-Length`` twice."""
    headers: dict[str, str] = {}
    size = 0
    for name, value in fields:
        size += len(name) + len(value) + 4
        key = name.decode("latin-1").lower()
        val = value.decode("latin-1")
        old = headers.get(key)
        if old is None:
            headers[key] = val
        elif key == "content-length":
            raise UpstreamProtocolError("repeated Content-Length")
        else:
            headers[key] = old + ", " + val
    if size > MAX_HEAD_BYTES:
        raise UpstreamProtocolError(f"answer head larger than {MAX_HEAD_BYTES} bytes")
    return headers
