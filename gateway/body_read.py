"""Reading an inference request's body within its size and time bounds (pipeline step 3, first half).

Split from gateway/request.py (session 23), which re-exports :func:`read_body`: reading bytes off the
connection is one job, decoding and validating them (``parse_inference_request``) another.
"""

from __future__ import annotations

import asyncio

from starlette.requests import ClientDisconnect, Request

from gateway.body_guard import BODY_COMPLETE_KEY, PLAIN_LENGTH_KEY
from gateway.content_coding import refuse_content_coding
from gateway.errors import GatewayError

__all__ = ["read_body", "CLOSE"]

CLOSE = {"Connection": "close"}


async def read_body(request: Request, max_bytes: int, timeout_s: float) -> bytes:
    """Read the whole request body, at most ``max_bytes`` bytes within ``timeout_s`` seconds.

    Raises :class:`GatewayError` 413 (``body_too_large``) when the
    ``Content-Length`` header or the bytes actually sent exceed the cap
    (before reading the rest), 400 for an invalid ``Content-Length``, 408
    (``body_timeout``) for a body not complete in time, and 400
    (``client_disconnect``) when the client goes away mid-body. The 413,
    408 and invalid-length answers carry ``Connection: close``: the
    connection is never reused after them. Before such an answer goes out,
    the framing guard (gateway/framing.py) reads and discards what is left
    of the body within its bounds, so a client still uploading can read it.
    Behind the framing guard, a single all-digits ``Content-Length`` is taken from its reading
    (``PLAIN_LENGTH_KEY`` in the scope) instead of the headers; when the protocol already holds the
    whole body (``BODY_COMPLETE_KEY``, httptools) it is read without a timer (issue 14).
    Raises 415 (``unsupported_content_encoding``) for a ``Content-Encoding`` other than ``identity``,
    before any body byte is read (gateway/content_coding.py, R9-4).
    """
    refuse_content_coding(request.scope["headers"])
    plain = request.scope.get(PLAIN_LENGTH_KEY)  # the framing guard's reading of one plain field (issue 14)
    lengths = request.headers.getlist("content-length") if plain is None else ()
    if plain is not None and plain > max_bytes:
        raise GatewayError(413, "body_too_large", f"request body exceeds {max_bytes} bytes", headers=dict(CLOSE))
    if lengths:
        if len(set(lengths)) > 1:
            raise GatewayError(400, "conflicting_content_length", "conflicting Content-Length headers",
                               headers=dict(CLOSE))
        try:
            declared = int(lengths[0])
        except ValueError:
            raise GatewayError(400, "invalid_content_length", "invalid Content-Length header",
                               headers=dict(CLOSE)) from None
        if declared < 0:
            raise GatewayError(400, "invalid_content_length", "invalid Content-Length header", headers=dict(CLOSE))
        if declared > max_bytes:
            raise GatewayError(413, "body_too_large", f"request body exceeds {max_bytes} bytes", headers=dict(CLOSE))
    receive = request.receive  # the ASGI messages themselves: no async generator per body (issue 14)
    first = None
    if request.scope.pop(BODY_COMPLETE_KEY, False):  # the protocol holds all of it: this receive cannot wait
        first = await receive()  # so no timer (issue 14); anything unexpected goes on below, timed
        if first["type"] == "http.request" and not first.get("more_body", False):
            whole = first.get("body", b"")
            if len(whole) > max_bytes:
                raise GatewayError(413, "body_too_large", f"request body exceeds {max_bytes} bytes", headers=dict(CLOSE))
            return whole
    chunks: list[bytes] = []
    size = 0
    try:
        async with asyncio.timeout(timeout_s):
            while True:
                message = await receive() if first is None else first
                first = None
                kind = message["type"]
                if kind == "http.request":
                    chunk = message.get("body", b"")
                    if chunk:
                        size += len(chunk)
                        if size > max_bytes:
                            raise GatewayError(413, "body_too_large", f"request body exceeds {max_bytes} bytes",
                                               headers=dict(CLOSE))
                        chunks.append(chunk)
                    if not message.get("more_body", False):
                        break
                elif kind == "http.disconnect":
                    raise ClientDisconnect()
    except TimeoutError:
        raise GatewayError(408, "body_timeout", f"request body not received within {timeout_s:g} s",
                           headers=dict(CLOSE)) from None
    except ClientDisconnect:
        raise GatewayError(400, "client_disconnect", "client disconnected while sending the body", outcome="cancelled") from None
    return b"".join(chunks)
