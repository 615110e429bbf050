"""Upstream calls to replicas (pipeline step 7): one pooled aiohttp session.

``open_upstream`` sends the request and waits for the *first body chunk*
(bounded by ``first_byte_timeout_s``): until that chunk has been handed to
the client nothing is committed, so the caller may still retry on another
replica. Failures are classified into :class:`UpstreamFailure` kinds that
map to HTTP answers: ``connect`` (502, retryable), ``timeout`` (504,
retryable), ``status`` 5xx (502, retryable), ``status`` 4xx (passed through,
the client's fault, never counted against the replica), ``protocol``
(502, retryable before the first byte).
"""

from __future__ import annotations

import asyncio
from dataclasses import dataclass
from typing import Any

import aiohttp

__all__ = ["UpstreamFailure", "UpstreamStream", "open_upstream", "make_session", "INSTANCE_HEADER"]

INSTANCE_HEADER = "X-Instance-Id"


class UpstreamFailure(Exception):
    """A replica call that failed before the client saw a byte.

    ``kind``: ``connect``, ``timeout``, ``status``, ``protocol``;
    ``status``: the replica's HTTP status for ``status`` failures;
    ``body``: the replica's error body (``status`` 4xx only, passed through);
    ``retryable``: another replica may succeed (not for a client-caused
    4xx; 429 is retried elsewhere); ``replica_fault``: counts against the
    replica's circuit breaker — false for every answer below 500, 429
    included (as Envoy's outlier detection counts only 5xx and locally
    originated errors: connect, timeout, reset).
    """

    def __init__(self, kind: str, message: str, *, status: int | None = None, body: bytes = b"") -> None:
        super().__init__(message)
        self.kind = kind
        self.status = status
        self.body = body
        client_fault = kind == "status" and status is not None and 400 <= status < 500 and status != 429
        self.retryable = not client_fault
        self.replica_fault = not (kind == "status" and status is not None and status < 500)


@dataclass(slots=True)
class UpstreamStream:
    """An upstream response whose first body chunk has arrived.

    ``first_chunk``: the bytes read so far; ``response``: the open aiohttp
    response (read the rest from ``response.content``; close it when done);
    ``instance_id``: the replica's instance id header, if any.
    """

    response: aiohttp.ClientResponse
    first_chunk: bytes
    instance_id: str | None

    def close(self) -> None:
        """Abort the upstream connection (cancels the replica's work)."""
        self.response.close()


def make_session(pool_size: int, connect_timeout_s: float, read_timeout_s: float) -> aiohttp.ClientSession:
    """Return the gateway's one pooled upstream session (call inside a running loop).

    ``pool_size``: max connections overall; timeouts in seconds. No
    automatic retries, no redirects followed, no cookies kept.
    """
    connector = aiohttp.TCPConnector(limit=pool_size, limit_per_host=0, enable_cleanup_closed=True)
    # No sock_read here: the first-byte wait and the per-chunk read wait are bounded
    # separately by the pipeline (first_byte_timeout_s, read_timeout_s).
    timeout = aiohttp.ClientTimeout(total=None, connect=connect_timeout_s, sock_read=None)
    return aiohttp.ClientSession(
        connector=connector, timeout=timeout, cookie_jar=aiohttp.DummyCookieJar(), auto_decompress=False
    )


async def open_upstream(
    session: aiohttp.ClientSession,
    url: str,
    body: dict[str, Any],
    headers: dict[str, str],
    first_byte_timeout_s: float,
) -> UpstreamStream:
    """POST ``body`` as JSON to ``url`` and wait for the first body chunk.

    Returns an :class:`UpstreamStream` for a 200 answer. Raises
    :class:`UpstreamFailure` on connection errors, on no first byte within
    ``first_byte_timeout_s`` seconds, on a non-200 status (its body read,
    at most 64 KiB) and on an empty body. Cancellation closes the connection.
    """
    resp: aiohttp.ClientResponse | None = None
    try:
        async with asyncio.timeout(first_byte_timeout_s):
            resp = await session.post(url, json=body, headers=headers, allow_redirects=False)
            if resp.status != 200:
                data = await resp.content.read(65536)
                resp.close()
                raise UpstreamFailure("status", f"replica answered {resp.status}", status=resp.status, body=data)
            first = await resp.content.readany()
            if not first:
                resp.close()
                raise UpstreamFailure("protocol", "replica closed the response without a body")
    except TimeoutError:
        if resp is not None:
            resp.close()
        raise UpstreamFailure("timeout", "replica sent no first byte in time") from None
    except aiohttp.ClientConnectorError as exc:
        raise UpstreamFailure("connect", f"cannot connect to replica: {exc.os_error.strerror or 'refused'}") from None
    except aiohttp.ClientError as exc:
        if resp is not None:
            resp.close()
        raise UpstreamFailure("connect", f"replica connection failed: {type(exc).__name__}") from None
    except asyncio.CancelledError:
        if resp is not None:
            resp.close()
        raise
    return UpstreamStream(response=resp, first_chunk=first, instance_id=resp.headers.get(INSTANCE_HEADER))
