"""Upstream calls to replicas (pipeline step 7): one connection pool
(:class:`gateway.upstream_pool.UpstreamPool`, HTTP/1.1 keep-alive on
``httptools``; why not aiohttp: docs/architecture.md, "Upstream client").

``open_upstream`` sends the request (at once on an idle connection, session 16) and its
awaited result waits for the *first body chunk*
(bounded by the caller's budget: ``first_byte_timeout_s`` for streams, the
total deadline for plain answers): until that chunk has been handed to
the client nothing is committed, so the caller may still retry on another
replica. Failures are classified into :class:`UpstreamFailure` kinds that
map to HTTP answers: ``connect`` (502, retryable), ``timeout`` (504,
retryable while the deadline allows), ``status`` 502/503/504 (502, retryable), ``status`` 4xx and
other 5xx (passed through, the request's failure, never counted against the replica nor retried; R7-2), ``protocol``
(502, retryable before the first byte).

Content coding (issue 10, finding 5): every upstream request asks for
``Accept-Encoding: identity`` (the pool's default header; the client's own
``Accept-Encoding`` is never forwarded). A replica -- or a proxy in front of
it -- that compresses anyway is decoded here, for
plain and streamed (SSE) answers alike: ``gzip``/``x-gzip`` and ``deflate``
(zlib-wrapped, or raw deflate as some servers send it) through the standard
library's ``zlib``, incrementally and with a bound on the decoded size
(``MAX_DECODED_BYTES``); each read of an answer decodes at most ``DECODE_PIECE_BYTES`` (session 12,
R11c-1), so a plain answer's ``limits.max_answer_bytes`` stops a coded answer as it stops an identity
one (502 ``answer_too_large``, not the replica's failure). A correctly compressed answer is a normal answer and
never counts against the replica; an unknown coding (``br``, ``zstd``, ...)
or corrupt compressed data is a ``protocol`` failure (502, retryable) and
does count, as any answer the gateway cannot read.
"""

from __future__ import annotations

import asyncio
import zlib
from dataclasses import dataclass
from collections.abc import Coroutine
from typing import Any

from gateway.json_fast import dumps
from gateway.replicas import counts_against_replica, retryable_status
from gateway.send_order import SEND_ORDER
from gateway.upstream_conn import UpstreamConnectionLost, UpstreamProtocolError, UpstreamResponse
from gateway.upstream_pool import NotWritten, UpstreamConnectError, UpstreamPool, Versioned

__all__ = ["UpstreamFailure", "UpstreamStream", "open_upstream", "NotWritten", "make_session", "INSTANCE_HEADER",
           "BodyDecoder", "ContentCodingError", "decode_body", "UPSTREAM_DEFAULT_HEADERS", "DECODE_PIECE_BYTES"]

INSTANCE_HEADER = "X-Instance-Id"
_INSTANCE_KEY = INSTANCE_HEADER.lower()
_ERROR_BODY_MAX = 65536
UPSTREAM_DEFAULT_HEADERS = {"Accept-Encoding": "identity"}
_JSON_TYPE = {"Content-Type": "application/json"}
MAX_DECODED_BYTES = 256 << 20
#: the most bytes one decoding step produces (:meth:`BodyDecoder.feed_some`; an answer's read hands out at
#: most this much, so ``limits.max_answer_bytes`` stops a coded answer within one piece: R11c-1)
DECODE_PIECE_BYTES = 256 << 10
#: the error body a plain 500 (or another 5xx that is not a gateway failure) is passed on with (R7-2)
_REQUEST_FAILED = b'{"error": {"message": "the replica failed to process this request"}}'


class ContentCodingError(Exception):
    """A response body whose ``Content-Encoding`` cannot be decoded (unknown coding, corrupt or
    truncated data, or more than the allowed decoded size)."""


class BodyDecoder:
    """Undo a response's ``Content-Encoding`` incrementally (RFC 9110 section 8.4).

    ``content_encoding``: the header value (None or ``identity``: bytes pass
    through). Supported: ``gzip``, ``x-gzip``, ``deflate`` (zlib-wrapped, or
    raw deflate). ``max_bytes``: the most decoded bytes accepted in total.
    Raises :class:`ContentCodingError` at construction for any other or
    stacked coding, and from :meth:`feed`/:meth:`finish` for corrupt,
    truncated or oversized data.
    """

    def __init__(self, content_encoding: str | None, max_bytes: int = MAX_DECODED_BYTES) -> None:
        self.max_bytes = max_bytes
        self.total = 0
        #: coded input is held back (decoding it would pass one piece): ``feed_some(b"")`` goes on
        self.backlog = False
        self._pending = b""
        if content_encoding is None:  # the common case (the gateway asks for identity): bytes pass through
            self.coding: str | None = None
            self._z: Any = None
            return
        codings = [c.strip().lower() for c in content_encoding.split(",")]
        codings = [c for c in codings if c and c != "identity"]
        if len(codings) > 1 or (codings and codings[0] not in ("gzip", "x-gzip", "deflate")):
            raise ContentCodingError(f"unsupported Content-Encoding {content_encoding!r}")
        self.coding = codings[0] if codings else None
        self._z = zlib.decompressobj(wbits=31) if self.coding in ("gzip", "x-gzip") else None

    def feed(self, data: bytes) -> bytes:
        """Decode the next piece of the body whole; returns what it decodes to (possibly b"")."""
        if self.coding is None:
            return data
        out = [self.feed_some(data)]
        while self.backlog:
            out.append(self.feed_some(b""))
        return b"".join(out)

    def feed_some(self, data: bytes) -> bytes:
        """Decode at most :data:`DECODE_PIECE_BYTES` of the input held back (:attr:`backlog`) and then
        ``data`` (session 12, R11c-1: a few coded KiB may inflate to many MiB); the rest is held back for
        the next call (``feed_some(b"")``). Never decodes more than ``max_bytes`` + 1 bytes in total."""
        if self.coding is None:
            return data
        z = self._z
        if z is None:  # deflate: choose zlib-wrapped or raw from the first two bytes
            self._pending += data
            if len(self._pending) < 2:
                return b""
            cmf, flg = self._pending[0], self._pending[1]
            wrapped = cmf & 0x0F == 8 and (cmf * 256 + flg) % 31 == 0
            z = self._z = zlib.decompressobj(wbits=15 if wrapped else -15)
            data, self._pending = self._pending, b""
        elif self.backlog:
            data = z.unconsumed_tail + data
        try:
            piece = z.decompress(data, min(DECODE_PIECE_BYTES, self.max_bytes - self.total + 1))
        except zlib.error:
            raise ContentCodingError("corrupt compressed body") from None
        self.backlog = bool(z.unconsumed_tail)
        self._count(piece)
        return piece

    def finish(self) -> bytes:
        """The end of the body: return the last decoded bytes; raises if the data was cut short."""
        if self.coding is None:
            return b""
        if self._z is None:
            if self._pending:
                raise ContentCodingError("truncated compressed body")
            return b""
        held = self.feed(b"") if self.backlog else b""  # counted by feed
        try:
            rest = self._z.flush()
        except zlib.error:
            raise ContentCodingError("corrupt compressed body") from None
        self._count(rest)
        if not self._z.eof:
            raise ContentCodingError("truncated compressed body")
        return held + rest if held else rest

    def _count(self, piece: bytes) -> None:
        self.total += len(piece)
        if self.total > self.max_bytes:
            raise ContentCodingError(f"decoded body larger than {self.max_bytes} bytes")


#: the identity decoder (no ``Content-Encoding``): stateless (``feed`` returns its bytes, ``finish`` b"",
#: nothing counted), so every identity answer shares this one (session 9: no decoder per answer)
IDENTITY = BodyDecoder(None)


def decode_body(data: bytes, content_encoding: str | None, max_bytes: int = MAX_DECODED_BYTES) -> bytes:
    """Decode a complete body ``data`` sent with ``content_encoding``; raises :class:`ContentCodingError`."""
    dec = BodyDecoder(content_encoding, max_bytes)
    return dec.feed(data) + dec.finish()


class UpstreamFailure(Exception):
    """A replica call that failed before the client saw a byte.

    ``kind``: ``connect``, ``timeout``, ``status``, ``protocol``;
    ``status``: the replica's HTTP status for ``status`` failures;
    ``body``: the replica's error body (``status`` 4xx only, passed through);
    ``retryable``: another replica may succeed (not for a client-caused
    4xx nor a plain 500; 429, 502, 503, 504 are retried elsewhere); ``replica_fault``: counts against the
    replica's circuit breaker — only 502, 503, 504 among statuses (as Envoy's outlier detection
    ``consecutive_gateway_failure``, with the locally originated errors: connect, timeout, reset;
    review R7-2: a 500 is the request's failure, :func:`gateway.replicas.counts_against_replica`); ``reached``: the request
    may have reached the replica (false only when no connection could be
    made: the token ledger then charges nothing for this attempt).
    """

    def __init__(self, kind: str, message: str, *, status: int | None = None, body: bytes = b"",
                 reached: bool = True) -> None:
        super().__init__(message)
        self.kind = kind
        self.reached = reached
        self.status = status
        self.body = body
        answered = kind == "status" and status is not None  # R7-2: gateway/replicas.py classifies statuses
        self.retryable = not answered or retryable_status(status)  # type: ignore[arg-type]
        self.replica_fault = not answered or counts_against_replica(status)  # type: ignore[arg-type]
        if answered and status >= 500 and not self.replica_fault:  # type: ignore[operator]
            self.body = _REQUEST_FAILED  # passed on as this request's failure, never the engine's text


@dataclass(slots=True)
class UpstreamStream:
    """An upstream response whose first body chunk has arrived.

    ``first_chunk``: the (decoded) bytes read so far; ``response``: the open
    :class:`gateway.upstream_conn.UpstreamResponse` (read the rest with
    :meth:`read_chunk` or :meth:`read_rest`, which undo any ``Content-Encoding``; close it when
    done); ``instance_id``: the replica's instance id header, if any.
    """

    response: UpstreamResponse
    first_chunk: bytes
    instance_id: str | None
    decoder: BodyDecoder = IDENTITY
    finished: bool = False

    async def read_chunk(self) -> bytes:
        """The next decoded bytes of the body, b"" at its end (a coded answer: at most
        :data:`DECODE_PIECE_BYTES` a call, the rest of a read held back for the next calls).

        Raises :class:`ContentCodingError` on corrupt or truncated compressed
        data, :class:`gateway.upstream_conn.UpstreamConnectionLost` or
        :class:`gateway.upstream_conn.UpstreamProtocolError` on a broken answer.
        """
        dec = self.decoder
        if dec.backlog:  # coded input held back by the last read: decoded first, one piece a read
            out = dec.feed_some(b"")
            if out:
                return out
        while not self.finished:
            raw = await self.response.read_chunk()
            if not raw:
                self.finished = True
                return dec.finish()
            out = dec.feed_some(raw)
            if out:
                return out
        return b""

    def whole_body(self) -> bytes | None:
        """The whole decoded body at once when no wait and no decoding is left (an identity answer
        already whole): ``first_chunk`` plus what is buffered; else None (use :meth:`read_rest`)."""
        resp = self.response
        if self.decoder.coding is not None or not resp.complete or self.finished:
            return None
        rest = resp.take_buffered()
        self.finished = True
        return self.first_chunk + rest if rest else self.first_chunk

    async def read_rest(self) -> bytes:
        """The rest of the decoded body (after ``first_chunk``)."""
        parts: list[bytes] = []
        while chunk := await self.read_chunk():
            parts.append(chunk)
        return b"".join(parts)

    def body_received(self) -> bool:
        """True when the whole raw body has arrived (:meth:`read_rest` then returns without waiting)."""
        return self.finished or self.response.complete

    def close(self) -> None:
        """Drop the answer; one not yet whole aborts its connection (cancels the replica's work)."""
        self.response.close()


def make_session(pool_size: int, connect_timeout_s: float, read_timeout_s: float) -> UpstreamPool:
    """Return the gateway's one upstream connection pool (call inside a running loop).

    ``pool_size``: max connections overall; ``connect_timeout_s`` in seconds.
    ``read_timeout_s`` is not used here: the first-byte wait and the per-chunk
    read wait are bounded by the pipeline (first_byte_timeout_s, read_timeout_s).
    No retries (but one on a kept-alive connection closed under the request),
    no redirects, no cookies, no decompression (BodyDecoder does it).
    """
    del read_timeout_s
    return UpstreamPool(pool_size, connect_timeout_s, default_headers=UPSTREAM_DEFAULT_HEADERS)


async def _read_error_body(resp: UpstreamResponse) -> bytes:
    """At most ``_ERROR_BODY_MAX`` bytes of an error answer's body."""
    parts: list[bytes] = []
    size = 0
    while size < _ERROR_BODY_MAX and (chunk := await resp.read_chunk()):
        parts.append(chunk)
        size += len(chunk)
    return b"".join(parts)[:_ERROR_BODY_MAX]


def open_upstream(
    session: UpstreamPool,
    url: str,
    body: dict[str, Any] | bytes,
    headers: dict[str, str],
    first_byte_timeout_s: float,
    guard: Versioned | None = None,
    generation: int = 0,
) -> Coroutine[Any, Any, UpstreamStream]:
    """POST ``body`` as JSON to ``url`` (bytes: already serialized, a request that waited in the flow
    queue, gateway/flow_bytes.py ``queued_form``); await the returned coroutine for the first body chunk.

    Session 16: the request is written *now*, before this returns, when the pool has an idle
    connection to the replica (:meth:`UpstreamPool.send_idle`: no coroutine, no await); else when
    the coroutine is awaited (a new connection, or one freed, first). So the caller's work that the
    request does not need can run after this call, while the replica works (the pipeline's attempt
    and record fields); the coroutine must be awaited (an answer never read is cut off at its deadline).
    A request not written at once is written when the coroutine has a connection, and only while
    ``guard.generation == generation`` then (session 19, S19-RC6: the caller's authorization, taken at that
    generation, holds at the moment of the write); else the awaited coroutine raises
    :class:`gateway.upstream_pool.NotWritten` (nothing sent, the connection back in the pool unused: the
    caller decides again and sends again). ``guard`` None: no such check.

    Awaited, it returns an :class:`UpstreamStream` for a 200 answer and raises
    :class:`UpstreamFailure` on connection errors, on no first byte within
    ``first_byte_timeout_s`` seconds, on a non-200 status (its body read,
    at most 64 KiB), on a broken or undecodable answer and on an empty body.
    Cancellation closes the connection. Raises :class:`NotWritten` as above. This call itself raises only ValueError (a header with CR/LF,
    a bad URL) and RuntimeError (no running loop).
    """
    # the budget: one timer per pool for every call's deadline, not an asyncio.timeout per call (session 8)
    deadline = session.time() + first_byte_timeout_s  # the pool's loop clock, no loop lookup (session 10)
    SEND_ORDER.sending()  # counted for gateway/send_order.py (the body is written at once, no task)
    data = body if body.__class__ is bytes else dumps(body)
    fields = {**headers, **_JSON_TYPE}
    # a warm pool's idle connection: written now, no coroutine of the pool's (session 16)
    written = session.send_idle("POST", url, data, fields, deadline=deadline)
    return _first_chunk(session, url, data, fields, deadline, written, guard, generation)


async def _first_chunk(session: UpstreamPool, url: str, data: bytes, fields: dict[str, str], deadline: float,
                       resp: UpstreamResponse | None, guard: Versioned | None, generation: int) -> UpstreamStream:
    """The rest of :func:`open_upstream`: the request written (``resp``) or sent now (only while ``guard``
    holds: :meth:`UpstreamPool.request`), its first body chunk."""
    try:
        if resp is None:
            resp = await session.request("POST", url, data, fields, deadline=deadline, guard=guard,
                                         generation=generation)
        else:
            try:
                await resp.wait_head()
            except UpstreamConnectionLost as exc:
                resp.close()
                if exc.received_any:
                    raise
                # the replica closed the kept-alive connection as it was reused: once more, on a new one
                resp = None
                resp = await session.request("POST", url, data, fields, deadline=deadline,
                                             fresh=True, guard=guard, generation=generation)
        encoding = resp.headers.get("content-encoding")
        if resp.status != 200:
            data = await _read_error_body(resp)
            resp.close()
            try:  # only to read the error message; anything undecodable passes on as no message
                data = decode_body(data, encoding, _ERROR_BODY_MAX)
            except ContentCodingError:
                data = b""
            raise UpstreamFailure("status", f"replica answered {resp.status}", status=resp.status, body=data)
        up = UpstreamStream(resp, b"", resp.headers.get(_INSTANCE_KEY),
                            IDENTITY if encoding is None else BodyDecoder(encoding))
        if encoding is None:  # identity (asked for): the raw chunk is the decoded one, one layer less
            # what arrived with the head is taken at once, no coroutine (session 15); else wait for it
            first = resp.take_buffered() or await resp.read_chunk()
            up.finished = not first
        else:
            first = await up.read_chunk()
        if not first:
            resp.close()
            raise UpstreamFailure("protocol", "replica closed the response without a body")
        resp.clear_deadline()  # the rest is bounded by the caller (read_timeout_s)
        up.first_chunk = first
    except TimeoutError:
        if resp is not None:
            resp.close()
        raise UpstreamFailure("timeout", "replica sent no first byte in time") from None
    except UpstreamConnectError as exc:
        raise UpstreamFailure("connect", f"cannot connect to replica: {exc}", reached=False) from None
    except (UpstreamConnectionLost, OSError) as exc:
        if resp is not None:
            resp.close()
        raise UpstreamFailure("connect", f"replica connection failed: {type(exc).__name__}") from None
    except (UpstreamProtocolError, ContentCodingError) as exc:
        if resp is not None:
            resp.close()
        raise UpstreamFailure("protocol", f"replica answer cannot be read: {exc}") from None
    except asyncio.CancelledError:
        if resp is not None:
            resp.close()
        raise
    return up
