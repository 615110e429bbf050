"""A bound on the NUMBER of header fields of a request head, before any parser sees them (review R6-3).

``limits.max_header_bytes`` bounds a head's bytes, but not its field count: a 12.5 kB head of
1,500 tiny fields (``aN:b``) cost ~1.07 ms of gateway CPU before authentication (5x a plain head,
~85 ns per head byte): uvicorn's httptools protocol runs a Python ``on_header`` callback per field,
h11 a regex match per field, and Starlette builds the header list per request.

:class:`HeadFields` counts the line feeds of a request head as its bytes are handed to the parser
(``bytes.count`` in C, the head's end found with ``bytes.find``), so a head of more than
``limits.max_header_fields`` fields is refused with **431** (code ``too_many_header_fields``,
``Connection: close``) and the connection closed before the parser reads the field past the
bound. The request line and the blank line that ends the head are not fields; leading blank lines
(which parsers skip) are not counted; an obsolete folded continuation line counts as a field.
Bytes after the head's end are not counted as this head's: :attr:`HeadFields.end` tells the guard
where the head ended, the guard hands the parser the head alone and feeds the rest of the read
round again, so a request pipelined behind a bodiless one in the same read is counted as its own
head (review R6b-1: a ``GET`` in front of a 1,500-field head got it past the bound). A head
pipelined behind a request *body* in the same read, and any pipelined head under the h11 parser (h11
parses it from its own buffer when the previous response completes), were bounded by
``max_header_bytes`` only until session 9 (S9-L3): h11's buffered head is counted (and scanned) before
h11 parses it (gateway/upgrade_guard.py ``guard_h11_head_bytes``); under httptools the head behind a
body's end is parsed with that read and refused when it completes (uvicorn's field list counted in
``on_headers_complete``, ``unscanned_code``): 431 after the answer in progress, before the app.

Default 100 fields: Envoy's ``max_headers_count`` default and Apache httpd's ``LimitRequestFields``
default are 100 (Node's ``maxHeadersCount`` is 2,000 but drops the extra fields silently; nginx bounds
bytes only: ``large_client_header_buffers`` 4 x 8 KiB). Browsers and SDK clients send 10-30 fields,
proxies add a few more.
"""

from __future__ import annotations

import asyncio

from gateway.body_guard import refusal_bytes

__all__ = ["HeadFields", "DEFAULT_MAX_HEADER_FIELDS", "refuse_too_many_fields", "rest_after_head", "folded_head"]

DEFAULT_MAX_HEADER_FIELDS = 100


class HeadFields:
    """Counts the header fields of one request head fed in pieces; ``max_fields`` >= 1.

    :meth:`feed` takes each piece of head bytes in order and returns False once the head holds
    more than ``max_fields`` fields (complete field lines; then the caller refuses it); after the
    head's end it counts nothing until :meth:`reset` (the next head). After each call, :attr:`end`
    is the offset in that call's ``data`` just past the head's ending blank line when the head ended
    in it, else -1.
    """

    __slots__ = ("max_fields", "lines", "tail", "started", "ended", "end")

    def __init__(self, max_fields: int) -> None:
        if max_fields < 1:
            raise ValueError("max_fields must be >= 1")
        self.max_fields = max_fields
        self.reset()

    def reset(self) -> None:
        """A new head is awaited."""
        self.lines = 0  # line feeds of the head so far (request line's included)
        self.tail = b""  # the last two bytes of the head fed so far (a blank line may straddle pieces)
        self.started = False  # a byte other than CR/LF was seen
        self.ended = False
        self.end = -1

    def feed(self, data: bytes) -> bool:
        """Count the fields in ``data`` (the next head bytes; may run past the head's end).
        False: more than ``max_fields`` fields."""
        self.end = -1
        if self.ended:
            return True
        skipped = 0
        if not self.started:
            if data[:1] in (b"\r", b"\n"):
                stripped = data.lstrip(b"\r\n")
                skipped, data = len(data) - len(stripped), stripped
                if not data:
                    return True
            self.started = True
        tail = self.tail
        buf = tail + data if tail else data
        end = buf.find(b"\n\r\n")
        lf2 = buf.find(b"\n\n", 0, end if end >= 0 else len(buf))
        if lf2 >= 0 or end >= 0:
            self.ended = True
            self.lines += buf.count(b"\n", len(tail), (lf2 if lf2 >= 0 else end) + 1) + 1  # + the blank line
            self.end = skipped + (lf2 + 2 if lf2 >= 0 else end + 3) - len(tail)
            return self.lines - 2 <= self.max_fields
        self.lines += data.count(b"\n")
        self.tail = buf[-2:]
        return self.lines - 1 <= self.max_fields  # request line + complete field lines so far


def refuse_too_many_fields(transport: asyncio.Transport, max_fields: int, answer: bool) -> None:
    """Answer 431 ``too_many_header_fields`` (``Connection: close``) when ``answer`` (no response in
    progress on the connection), then close ``transport``."""
    if transport.is_closing():
        return
    if answer:
        transport.write(refusal_bytes(
            431, "too_many_header_fields", f"request head has more than {max_fields} header fields"))
    transport.close()


def rest_after_head(tail: bytes, piece: bytes) -> int:
    """Bytes of ``piece`` after the head's ending blank line (``tail``: up to 3 head bytes fed
    before ``piece``); 0 when it is not found."""
    i = (tail + piece[:3]).find(b"\r\n\r\n")
    if i >= 0:
        return len(piece) - (i + 4 - len(tail))
    i = piece.find(b"\r\n\r\n")
    return len(piece) - (i + 4) if i >= 0 else 0


def folded_head(data: bytes) -> bool:
    """True when the request head at the start of ``data`` (up to its blank line, or all of ``data`` while
    it has none) has a line starting with SP or HT: obsolete line folding (RFC 9112 section 5.2; leading
    blank lines, which parsers skip, are not looked at)."""
    data = data.lstrip(b"\r\n") if data[:1] in (b"\r", b"\n") else data
    end = data.find(b"\n\r\n")
    lf2 = data.find(b"\n\n", 0, end if end >= 0 else len(data))
    head = data[:lf2 if lf2 >= 0 else end] if (lf2 >= 0 or end >= 0) else data
    return b"\n " in head or b"\n\t" in head
