"""Refuse protocol upgrades and fragments in the request-target before any parser acts on them (R7-1, R7-3).

**R7-1 (request smuggling).** uvicorn's httptools protocol stops at a head carrying ``Connection:
Upgrade`` + ``Upgrade: <anything>`` (``HttpParserUpgrade``), never hands that request's body to the
app, and then parses the body bytes as a *new request on the same connection*: a tenant could hide a
second request (its own headers, ``X-Forwarded-For``, another path) inside a body that a proxy in
front forwards as a body, so the proxy's ACLs, access log and the gateway's audit source disagree.
The gateway serves no websocket or h2c, so any request head carrying an ``Upgrade`` header field is
refused, under both parsers and on both listeners:

- :class:`HeadScan` looks at each request head's bytes as the guard (gateway/http_guard.py) hands
  them to the parser (``bytes.find`` and one regex search per piece, state kept across reads so a
  field name split over two reads is found); the piece holding the ``Upgrade`` field name is never
  handed to the parser, so no parser ever completes such a head;
- the answer is **400** (JSON error, code ``upgrade_not_supported``) with ``Connection: close``
  (nothing when a response is still in progress on the connection), the connection is closed
  *lingering* (gateway/lingering.py: half-close, what the client still sends is discarded unparsed,
  bounded by ``limits.lingering_close_bytes`` / ``lingering_close_s``), so the body, and any request
  in it, is never parsed;
- the refusal is audited (``endpoint`` ``http_guard``, status 400, outcome ``rejected``, the error
  code, the socket peer as ``client_addr``; no identity: nothing was authenticated) by the guard
  itself through :func:`gateway.protocol_audit.refused` (the rate bound of the other guard refusals);
- backstop for a head the scan did not see (one pipelined in the same read behind a request body,
  which the guard hands to the parser with the body; under h11 also behind a bodiless request, which
  h11 parses from its own buffer once the previous response is complete): under httptools a head the
  parser reports as an upgrade (``parser.should_upgrade()``) is refused in
  ``on_headers_complete`` before uvicorn starts a task for it, and the parser is stopped; under h11 a
  ``Request`` event with an ``upgrade`` field is refused by :meth:`UpgradeGuard.guard_h11_request`,
  which the protocol's one h11 connection wrapper (gateway/body_guard.py ``GuardedH11Connection``)
  calls before uvicorn sees the event. When a response is still in progress, what the client sends after the
  refused head is dropped unparsed, that response completes, then the 400 is sent and the
  connection closes (both parsers; R7b-2: httptools closed at once, losing the answer in progress).

**R7-3.** A ``#`` in the request-target (a fragment: never sent on the wire, RFC 9112 section 3.2)
is refused the same way with code ``invalid_request_target``; both parsers accepted it and served
``/v1/chat/completions#x`` as the chat route. Since R8-5 the backstops refuse it too (httptools: the
parser's URL, uvicorn's public ``url``, in ``on_headers_complete``; h11: the ``Request`` event's target).

**R8-1 (request smuggling through CONNECT).** llhttp treats *any* ``CONNECT`` head as an upgrade
(``should_upgrade()``): uvicorn started the app for ``CONNECT /v1/chat/completions`` (405) and then
parsed its ``Content-Length`` body as the next request. The gateway never tunnels, so the scan
refuses the ``CONNECT`` method (the request line's method token, exactly ``CONNECT``: methods are
case-sensitive, and only that token makes llhttp or h11 switch) the same way, code
``method_not_supported`` (400, ``Connection: close``, lingering close, audited); the backstops
refuse a ``CONNECT`` head they see (httptools: method ``CONNECT`` in ``on_headers_complete``, also
authority-form, which uvicorn used to answer with its own 400; h11: a ``Request`` event with method
``CONNECT``).

Front proxies must not forward ``Upgrade`` / ``Connection: upgrade`` to the gateway
(docs/security.md, "What PrefixGate leaves to the deployment").
"""

from __future__ import annotations

import asyncio
import logging
import re
from typing import Any

import h11

from gateway.body_guard import BodyRefused, refusal_bytes
from gateway.head_fields import HeadFields, folded_head
from gateway.host_field import HOST_CODE, HOST_MESSAGE, fields_host_refused, head_host_refused  # R9-3
from gateway.protocol_audit import refused

__all__ = ["HeadScan", "ScannedHeadFields", "whole_head_is_plain", "UpgradeGuard", "UPGRADE_CODE", "TARGET_CODE",
           "CONNECT_CODE", "INVALID_CODE", "GUARD_ENDPOINT", "backstop_code", "h11_request_code"]

UPGRADE_CODE = "upgrade_not_supported"
TARGET_CODE = "invalid_request_target"
CONNECT_CODE = "method_not_supported"  # R8-1
#: a head the parser refuses behind a response in progress, and a folded head line under h11 (httptools
#: refuses folds itself: uvicorn's 400, audited ``invalid_request`` too)
INVALID_CODE = "invalid_request"
#: ``endpoint`` of the audit event of a head refused by the HTTP guard
GUARD_ENDPOINT = "http_guard"
_MESSAGES = {UPGRADE_CODE: "protocol upgrades (Upgrade header) are not supported",
             TARGET_CODE: "a request-target must not contain a fragment ('#')",
             INVALID_CODE: "invalid HTTP request (e.g. obsolete line folding in its head)",
             CONNECT_CODE: "the CONNECT method is not supported (the gateway does not tunnel)",
             HOST_CODE: HOST_MESSAGE}

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
    and the ``CONNECT`` method.

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
            if sp < 0:
                return None
            if self.method == b"CONNECT":
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
    starting with ``upgrade`` (any case) and not the ``CONNECT`` method, so :class:`HeadScan` finds
    nothing to refuse (when it is False, run the scan). ``body``: the head has exactly one ``Content-Length`` field, written
    ``content-length:`` (any case) at a line start, whose value is digits and not 0, and no
    ``Transfer-Encoding``: a body follows the head for both parsers (session 8). ``low``: ``head.lower()``
    when the caller has it (R9-3: the Host check reads it too)."""
    low = head.lower() if low is None else low
    if (head.find(b"#", 0, head.find(b"\n")) >= 0 or b"\nupgrade" in low or low.startswith(b"upgrade")
            or head.startswith(b"CONNECT")):  # R8-1: the scan refuses CONNECT
        return False, False
    i = low.find(b"\ncontent-length:")
    if i < 0 or b"transfer-encoding" in low or low.find(b"\ncontent-length:", i + 16) >= 0:
        return True, False
    value = low[i + 16:low.find(b"\n", i + 16)].strip()
    return True, value.isdigit() and value.strip(b"0") != b""


class ScannedHeadFields(HeadFields):
    """:class:`gateway.head_fields.HeadFields` that also runs a :class:`HeadScan` over the head's
    bytes; after :meth:`feed`, :attr:`refusal` is the code to refuse the head with, or None, and
    :attr:`body` is True when the head, complete in that one piece, declares a body
    (:func:`whole_head_is_plain`; False when not known). :attr:`hosts` (R9-3, gateway/host_field.py),
    for a head read whole: True when its ``Host`` fields are right, False when the head must be refused
    for them once a parser has accepted it (the parser's own refusals first); None: not checked here."""

    __slots__ = ("scan", "refusal", "body", "hosts")

    def __init__(self, max_fields: int) -> None:
        self.scan = HeadScan()
        self.refusal: str | None = None
        self.body = False
        self.hosts: bool | None = None
        super().__init__(max_fields)

    def reset(self) -> None:
        """A new head is awaited."""
        super().reset()
        self.scan.reset()
        self.refusal = None
        self.body = False
        self.hosts = None

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
            self.refusal = self.scan.feed(data if end < 0 else data[:end])
        return ok


class UpgradeGuard:
    """Mixin over the guarded uvicorn protocols of gateway/http_guard.py (first in their bases).

    Each head refused here is audited as 400 with its code (:func:`gateway.protocol_audit.refused`:
    the listener's :class:`gateway.protocol_audit.ProtocolRefusals`, when its app has one attached).
    """

    guard_head_refused: bool = False
    guard_deferred: str | None = None  # a refusal to answer once the response in progress is complete

    def guard_refuse_head(self, code: str, defer: bool = True) -> None:
        """Refuse the head being received: audit it, answer 400 ``code`` and close lingering. With a
        response still in progress (a pipelined head) and ``defer``, what the client sends is
        dropped and the answer goes out once that response is complete; without ``defer``, close."""
        self.guard_cancel_timer()  # type: ignore[attr-defined]
        transport: asyncio.Transport = self.transport  # type: ignore[attr-defined]
        if transport is None or transport.is_closing() or self.guard_deferred is not None:
            return
        refused(self, 400, code)
        self.guard_head_refused = True  # the close lingers: what follows is discarded unparsed
        if self.guard_response_in_progress():  # type: ignore[attr-defined]
            if defer:
                self.guard_deferred = code
                return transport.hold_reading()  # type: ignore[attr-defined]  # R9-1 (gateway/drop_guard.py)
        else:
            transport.write(refusal_bytes(400, code, _MESSAGES[code]))
        transport.close()

    def data_received(self, data: bytes) -> None:
        """Bytes after a deferred refusal are dropped unparsed and reading stops until the close (R9-1:
        not read at line rate while the answer in progress lasts); once closing, the linger counts them."""
        if self.guard_deferred is None or self.transport.lingering:  # type: ignore[attr-defined]
            super().data_received(data)  # type: ignore[misc]
        else:
            self.transport.hold_reading()  # type: ignore[attr-defined]

    def on_response_complete(self) -> None:
        """uvicorn hook: the response in progress is complete; a deferred refusal is answered now."""
        super().on_response_complete()  # type: ignore[misc]
        code = self.guard_deferred
        transport: asyncio.Transport = self.transport  # type: ignore[attr-defined]
        # a request pipelined before the refused head (httptools) now runs: answer after it too
        if code is not None and not transport.is_closing() and not self.guard_response_in_progress():  # type: ignore[attr-defined]
            transport.write(refusal_bytes(400, code, _MESSAGES[code]))
            transport.close()

    def send_400_response(self, msg: str) -> None:
        """uvicorn's 400 after a parser stop: nothing after a refused head (answered, or deferred
        behind the response in progress, R7b-2): neither sent nor audited. A next head the parser refuses
        while a response is in progress (pipelined) is refused as :data:`INVALID_CODE` after that
        response (session 8: uvicorn's 400 went out at once and the answer in progress was lost)."""
        if self.guard_head_refused:
            return
        # a next head (not the body of the request being answered: that one's 400 goes out at once, as before)
        if self.guard_waiting and self.guard_response_in_progress():  # type: ignore[attr-defined]
            self.guard_refuse_head(INVALID_CODE)
            return
        super().send_400_response(msg)  # type: ignore[misc]

    def guard_h11_request(self, event: h11.Request) -> bool:
        """h11: a request head was parsed (its ``Request`` event, before uvicorn sees it); False when it is
        refused here (an ``Upgrade`` field or a ``#`` in the target the scan did not see: a head h11 parsed
        from its own buffer)."""
        code = h11_request_code(event)  # Upgrade, CONNECT (R8-1), '#' (R8-5, as the first head's R7-3)
        if code is not None:
            self.guard_refuse_head(code)
            return False
        return super().guard_h11_request(event)  # type: ignore[misc, no-any-return]

    def guard_h11_head_bytes(self, pending: bytes) -> bool:
        """h11: ``pending`` (bytes h11 holds, not yet parsed) starts the next head; False when it is refused
        here: obsolete line folding (a head line starting with SP or HT, RFC 9112 section 5.2), which h11
        would join into the field before and httptools refuses (R7b-5: both parsers now answer 400)."""
        if folded_head(pending):
            self.guard_refuse_head(INVALID_CODE)
            return False
        return True

    def on_headers_complete(self) -> None:
        """httptools: a head the scan did not see (pipelined behind a body) that asks for an upgrade,
        uses ``CONNECT`` (R8-1) or has a ``#`` in its target (R8-5)."""
        parser = getattr(self, "parser", None)
        code = backstop_code(parser, self.url) if parser is not None else None  # type: ignore[attr-defined]
        hosts = self.guard_fields.hosts  # type: ignore[attr-defined]
        if code is None and hosts is not True and parser is not None:  # R9-3: Host fields (gateway/host_field.py)
            # a head read whole was counted by the scan; one not (several reads, behind a body): its fields, here
            if hosts is False or fields_host_refused(self.headers, parser.get_http_version()):  # type: ignore[attr-defined]
                code = HOST_CODE
        if code is not None:
            # R7b-2: the parser stops here (nothing after this head is parsed); with a response in
            # progress the refusal is deferred: that response completes, then the 400 and the close
            self.guard_refuse_head(code)
            self.logger = logging.getLogger("gateway.body_guard.quiet")  # silenced by gateway/body_guard.py
            raise BodyRefused()
        super().on_headers_complete()  # type: ignore[misc]


def backstop_code(parser: Any, url: bytes) -> str | None:
    """httptools backstop: the refusal code for a completed head the scan did not see, or None.
    ``parser``: the ``httptools.HttpRequestParser`` at ``on_headers_complete``; ``url``: the
    request-target as the parser reported it (uvicorn's ``url``). llhttp flags every ``CONNECT`` as an
    upgrade, so the method is read only for a flagged head (one C call per request otherwise)."""
    if parser.should_upgrade():
        return CONNECT_CODE if parser.get_method() == b"CONNECT" else UPGRADE_CODE
    return TARGET_CODE if _HASH in url else None


def h11_request_code(event: h11.Request) -> str | None:
    """h11 backstop: the refusal code for a ``Request`` event the scan did not see, or None."""
    if event.method == b"CONNECT":
        return CONNECT_CODE
    if any(name == b"upgrade" for name, _ in event.headers):
        return UPGRADE_CODE
    return TARGET_CODE if _HASH in event.target else None
