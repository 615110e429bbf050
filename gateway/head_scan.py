"""The byte scan of request heads behind gateway/upgrade_guard.py (R7-1, R7-3, R8-1, S9-L1): an ``Upgrade``
field, a ``#`` in the request-target, a method outside :data:`METHODS`; and the field count
(gateway/head_fields.py) in the same pass. Moved out of gateway/upgrade_guard.py in session 9 (module
size); what the rules are for and how a refusal is answered: that module's docstring.
"""

from __future__ import annotations

import re

from gateway.head_fields import HeadFields
from gateway.host_field import head_host_refused  # R9-3

__all__ = ["HeadScan", "ScannedHeadFields", "whole_head_is_plain", "usual_head", "UPGRADE_CODE", "TARGET_CODE",
           "CONNECT_CODE", "FIELDS_CODE", "METHODS"]

UPGRADE_CODE = "upgrade_not_supported"
TARGET_CODE = "invalid_request_target"
CONNECT_CODE = "method_not_supported"  # R8-1; since S9-L1 any method outside :data:`METHODS`
#: more header fields than ``limits.max_header_fields`` (R6-3; 431, gateway/head_fields.py)
FIELDS_CODE = "too_many_header_fields"
#: the methods a parser is let parse (S9-L1): RFC 9110 section 9.3 without CONNECT (the gateway never tunnels),
#: and PATCH (RFC 5789). Methods are case-sensitive: ``connect``, ``Get``, ``PRI`` (the HTTP/2 preface) and
#: extension methods are refused before a parser completes the head, so both parsers answer them alike
#: (httptools refused lower-case and unknown tokens itself, h11 routed them). The routes use GET/POST (public)
#: and GET/POST/PUT/DELETE (admin); the app answers 405 for a standard method a path does not serve.
METHODS = frozenset((b"GET", b"HEAD", b"POST", b"PUT", b"DELETE", b"OPTIONS", b"TRACE", b"PATCH"))
#: every start of a method of :data:`METHODS` (a method token split over reads)
_PREFIXES = frozenset(m[:i] for m in METHODS for i in range(len(m) + 1))
#: the methods of the usual head (the whole-head fast path: one C call; issue 14)
_USUAL = (b"POST ", b"GET ")
#: ``#`` as an int: ``int in bytes`` is a plain byte search (``b"#" in bytes`` goes through the buffer protocol, ~6x slower)
_HASH = ord("#")
#: an ``Upgrade`` field line (lower-cased): its name at a line start (the scan keeps a virtual ``\n`` before a head)
_FIELD = re.compile(rb"\nupgrade[ \t]*:")
#: what may follow the name of an ``Upgrade`` field
_COLON = re.compile(rb"[ \t]*:")
#: the start of a line (lower-cased) that may still become an ``Upgrade`` field line once more bytes arrive
_MAYBE = re.compile(rb"\n(?:u(?:p(?:g(?:r(?:a(?:d(?:e[ \t]*)?)?)?)?)?)?)?")


class HeadScan:
    """Scans one request head fed in pieces for an ``Upgrade`` field, a ``#`` in the request-target
    and a method outside :data:`METHODS` (``CONNECT`` among them).

    :meth:`feed` takes each piece of head bytes (the head's bytes only, in order) and returns the
    error code to refuse the head with (:data:`UPGRADE_CODE`, :data:`TARGET_CODE`,
    :data:`CONNECT_CODE`) or None. :meth:`reset` before the next head.
    """

    __slots__ = ("line", "phase", "started", "method")

    def __init__(self) -> None:
        self.reset()

    def reset(self) -> None:
        """A new head is awaited."""
        self.line: bytes | None = b"\n"  # the current line so far while it may still be an Upgrade field line
        self.phase = 0  # request line: 0 before the target, 1 in it, 2 after it
        self.started = False  # a byte of the request line was seen (parsers skip leading blank lines)
        self.method = b""  # the request line's method token so far (at most 8 bytes: enough to tell CONNECT)

    def feed(self, data: bytes) -> str | None:
        """The refusal code for the head so far with ``data`` appended, or None."""
        if self.phase < 2 and (code := self._request_line(data)):
            return code
        low = data.lower()  # ASCII only, in C; the searches below are plain finds
        line = self.line
        lf = low.find(b"\n")
        if line is not None:
            seg = line + (low if lf < 0 else low[:lf])
            if _FIELD.match(seg):
                return UPGRADE_CODE
            if lf < 0:
                self.line = seg if _MAYBE.fullmatch(seg) else None
                return None
        elif lf < 0:
            return None
        i = low.find(b"\nupgrade", lf)
        while i >= 0:
            if _COLON.match(low, i + 8):
                return UPGRADE_CODE
            i = low.find(b"\nupgrade", i + 8)
        last = low[low.rfind(b"\n"):]
        self.line = last if _MAYBE.fullmatch(last) else None
        return None

    def _request_line(self, data: bytes) -> str | None:
        """The request line's part of the scan: :data:`CONNECT_CODE` once the method token is complete
        and is ``CONNECT`` (R8-1), :data:`TARGET_CODE` for a ``#`` in the target (R7-3), else None."""
        i, n = 0, len(data)
        if not n:
            return None
        if self.phase == 0:
            if not self.started:
                if data[:1] in (b"\r", b"\n"):  # leading blank lines (rare): skipped like the parsers do
                    i = n - len(data.lstrip(b"\r\n"))
                    if i == n:
                        return None
                self.started = True
            sp = data.find(b" ", i)
            if data.find(b"\n", i, sp if sp >= 0 else n) >= 0:
                self.phase = 2  # the line ends before a target: the parser refuses it
                return None
            if len(self.method) < 8:
                self.method += data[i:min(sp if sp >= 0 else n, i + 8)]
            if sp < 0:  # the token goes on in a later read: refused once it is no method's start (llhttp
                return None if self.method in _PREFIXES else CONNECT_CODE  # refuses a wrong first byte at once)
            if self.method not in METHODS:  # R8-1 CONNECT; S9-L1 any other method
                return CONNECT_CODE
            self.phase, i = 1, sp + 1
        sp = data.find(b" ", i)  # the target ends at the next space (or line end)
        lf = data.find(b"\n", i, sp if sp >= 0 else n)
        end = lf if lf >= 0 else sp if sp >= 0 else n
        if data.find(b"#", i, end) >= 0:
            return TARGET_CODE
        if end < n:
            self.phase = 2
        return None


def whole_head_is_plain(head: bytes, low: bytes | None = None) -> tuple[bool, bool]:
    """For a complete head (``head``: its bytes from the request line's first byte, not a CR or LF,
    to its blank line): ``(plain, body)``. ``plain``: no ``#`` in its request line, no line
    starting with ``upgrade`` (any case) and the method ``POST`` or ``GET`` (any other goes through the scan), so :class:`HeadScan` finds
    nothing to refuse (when it is False, run the scan). ``body``: the head has exactly one ``Content-Length`` field, written
    ``content-length:`` (any case) at a line start, whose value is digits and not 0, and no
    ``Transfer-Encoding``: a body follows the head for both parsers (session 8). ``low``: ``head.lower()``
    when the caller has it (R9-3: the Host check reads it too)."""
    low = head.lower() if low is None else low
    if (head.find(b"#", 0, head.find(b"\n")) >= 0 or b"\nupgrade" in low or low.startswith(b"upgrade")
            or not head.startswith(_USUAL)):  # R8-1, S9-L1: another method goes through the scan
        return False, False
    i = low.find(b"\ncontent-length:")
    if i < 0 or b"transfer-encoding" in low or low.find(b"\ncontent-length:", i + 16) >= 0:
        return True, False
    value = low[i + 16:low.find(b"\n", i + 16)].strip()
    return True, value.isdigit() and value.strip(b"0") != b""


def usual_head(data: bytes, max_fields: int) -> int:
    """The usual request as one read, checked in one function (session 15, issue 14: the server head).

    ``data``: the bytes of one read that starts a new head (nothing of it fed before); ``max_fields``:
    ``limits.max_header_fields``. Returns the offset just past the head's blank line when ``data`` is a
    complete head followed by the start of its body and every guard of a head read whole lets it through:
    the head ends at its first ``\n\r\n`` with no bare ``\n\n`` before it, it has at most ``max_fields``
    fields (:class:`gateway.head_fields.HeadFields`), :func:`whole_head_is_plain` says ``(True, True)`` (method
    ``POST``/``GET``, no ``#`` in the request line, no ``upgrade`` line, one plain ``Content-Length`` > 0, no
    ``Transfer-Encoding``) and it has exactly one ``Host`` field (R9-3); and at least one body byte follows.
    Else -1: the caller takes the general path (:class:`ScannedHeadFields`), which then decides (refuses,
    waits for more bytes, or parses the head alone). Never an offset where that path would not parse head and
    body start in one call with a right ``Host``; -1 for a few reads it would (bare-LF line ends, leading blank
    lines, HTTP/1.0 without ``Host``: it then does so itself). tests/hostile/test_s15_edge_usual_head.py compares
    the two on hostile heads."""
    if not data.startswith(_USUAL):
        return -1
    end = data.find(b"\n\r\n")
    if end < 0 or data.find(b"\n\n", 0, end) >= 0 or data.count(b"\n", 0, end) > max_fields:
        return -1
    cut = end + 3
    if cut >= len(data):
        return -1
    low = data[:cut].lower()
    if low.find(b"#", 0, low.find(b"\n")) >= 0 or b"\nupgrade" in low or b"transfer-encoding" in low:
        return -1
    i = low.find(b"\ncontent-length:")
    if i < 0 or low.find(b"\ncontent-length:", i + 16) >= 0:
        return -1
    value = low[i + 16:low.find(b"\n", i + 16)].strip()
    if not value.isdigit() or value.strip(b"0") == b"":
        return -1
    i = low.find(b"\nhost:")
    return cut if i >= 0 and i == low.rfind(b"\nhost:") else -1


class ScannedHeadFields(HeadFields):
    """:class:`gateway.head_fields.HeadFields` that also runs a :class:`HeadScan` over the head's
    bytes; after :meth:`feed`, :attr:`refusal` is the code to refuse the head with, or None, and
    :attr:`body` is True when the head, complete in that one piece, declares a body
    (:func:`whole_head_is_plain`; False when not known). :attr:`hosts` (R9-3, gateway/host_field.py),
    for a head read whole: True when its ``Host`` fields are right, False when the head must be refused
    for them once a parser has accepted it (the parser's own refusals first); None: not checked here."""

    __slots__ = ("scan", "scanned", "refusal", "body", "unseen", "hosts")

    def __init__(self, max_fields: int) -> None:
        self.scan = HeadScan()
        self.scanned = False  # the scan's state moved since its last reset
        self.refusal: str | None = None
        self.body = False
        self.unseen = False  # the head's start reached the parser unscanned (:meth:`mid_head`)
        self.hosts: bool | None = None
        super().__init__(max_fields)

    def reset(self) -> None:
        """A new head is awaited (:meth:`HeadFields.reset` inline, and the scan's reset only when it was fed:
        session 15, the usual head never is)."""
        self.lines = 0
        self.tail = b""
        self.started = self.ended = self.body = self.unseen = False
        self.end = -1
        if self.scanned:
            self.scan.reset()
            self.scanned = False
        self.refusal = None
        self.hosts = None

    def mid_head(self, last: bytes) -> None:
        """The head's start went to the parser unscanned (pipelined behind a body's end in one read; ``last``:
        the last bytes handed to it): what follows is scanned as the rest of a head, never as a request line
        (S9-L3: the method rule would refuse a middle's first word); the parser's backstop checks the whole
        head when it completes (:func:`unscanned_code`)."""
        self.started = self.scan.started = self.unseen = self.scanned = True
        self.scan.phase = 2
        self.scan.line = b"\n" if last.endswith(b"\n") else None
        self.tail = last[-2:]

    def feed(self, data: bytes) -> bool:
        """:meth:`HeadFields.feed`, and the scan over the part of ``data`` that belongs to the head."""
        if self.ended:
            return True
        fresh = not self.started
        ok = super().feed(data)
        end = self.end
        if self.refusal is None:
            if fresh and end > 0 and data[0] not in b"\r\n":  # the usual head: whole in one read (issue 14)
                head = data[:end]
                low = head.lower()
                plain, self.body = whole_head_is_plain(head, low)
                i = low.find(b"\nhost:")  # R9-3: one Host field (find + rfind: ~0.1 us less than a count)
                self.hosts = (i >= 0 and i == low.rfind(b"\nhost:")) or not head_host_refused(head)
                if plain:
                    return ok
            self.scanned = True
            self.refusal = self.scan.feed(data if end < 0 else data[:end])
        return ok
