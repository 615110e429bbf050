"""Exactly one ``Host`` field per request head, under both parsers (review R9-3).

RFC 9112 section 3.2: a server MUST answer 400 to an HTTP/1.1 request without a ``Host`` field and
to any request with more than one. h11 did (uvicorn's plain-text 400); httptools (llhttp, the
default parser) served both (200), so a front proxy routing on ``Host`` and the gateway could see
different requests, and the two parsers disagreed. Now under httptools such a head is refused once
the parser has accepted it (``on_headers_complete``; the parser's own refusals, e.g. of a garbage
request line, come first), before uvicorn starts the app: **400** ``invalid_host`` (JSON,
``Connection: close``, lingering close, audited ``endpoint: http_guard`` like the other refused heads;
gateway/upgrade_guard.py). Under h11, h11 refuses it itself (uvicorn's plain-text 400, as before).

Cost: the usual head, read whole in one piece, is checked by the guard's scan with one ``find`` and
one ``rfind`` of ``\nhost:`` on the lower-cased head its fast path already makes
(``whole_head_is_plain``; ~0.2 us for a 750-byte head); the request line is read only when they
disagree; ``on_headers_complete`` reads the verdict (one
attribute). A head that arrives in several reads, or pipelined behind a body in the same read, is
checked from uvicorn's header list at ``on_headers_complete`` (a Python loop, only on those paths).
An HTTP/1.0 request may omit ``Host``; a request line without a version (HTTP/0.9 form) may not.
"""

from __future__ import annotations

from collections.abc import Iterable

__all__ = ["HOST_CODE", "HOST_MESSAGE", "head_host_refused", "fields_host_refused"]

HOST_CODE = "invalid_host"
HOST_MESSAGE = "a request must carry exactly one Host header field (RFC 9112 section 3.2)"


def head_host_refused(head: bytes) -> bool:
    """True when the complete request head ``head`` (request line to blank line) must be refused: two
    or more ``Host`` fields (any case), or none in a request whose line does not end in ``HTTP/1.0``."""
    hosts = head.lower().count(b"\nhost:")
    if hosts == 1:
        return False
    return hosts > 1 or not head[:head.find(b"\n")].rstrip(b"\r").endswith(b" HTTP/1.0")


def fields_host_refused(headers: Iterable[tuple[bytes, bytes]], http_version: str) -> bool:
    """:func:`head_host_refused` from a parsed head: ``headers`` (lower-case name, value) pairs as uvicorn
    lists them, ``http_version`` as httptools reports it (``"1.1"``)."""
    hosts = 0
    for name, _ in headers:
        if name == b"host":
            hosts += 1
    return hosts > 1 or (hosts == 0 and http_version != "1.0")
