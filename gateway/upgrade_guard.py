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

**S9-L1 (methods).** Since session 9 the scan refuses every method token outside :data:`METHODS` (the
standard methods without ``CONNECT``) the same way, code ``method_not_supported``: methods are
case-sensitive (RFC 9110 section 9.1), so ``connect`` is not ``CONNECT``; httptools refused lower-case and
unknown tokens itself (uvicorn's text 400) while h11 routed them to the app (405/404, ``PRI * HTTP/2.0``
then a second 400 for the preface's ``SM`` line). Both parsers now answer one 400, close and audit alike.
A head whose start reached the parser unscanned (behind a body's end in one read) is checked when it
completes (:func:`unscanned_code`: method and field count; h11: its buffered bytes get the whole scan
before h11 parses them).

Front proxies must not forward ``Upgrade`` / ``Connection: upgrade`` to the gateway
(docs/security.md, "What PrefixGate leaves to the deployment").
"""

from __future__ import annotations

import asyncio
import logging
from typing import Any

import h11

from gateway.body_guard import BodyRefused, refusal_bytes
from gateway.head_fields import folded_head
from gateway.head_scan import (  # the scan (re-exported: tests and gateway/head_guard.py import it from here)
    CONNECT_CODE, FIELDS_CODE, METHODS, TARGET_CODE, UPGRADE_CODE, HeadScan, ScannedHeadFields, whole_head_is_plain)
from gateway.host_field import HOST_CODE, HOST_MESSAGE, fields_host_refused  # R9-3
from gateway.protocol_audit import refused

__all__ = ["HeadScan", "ScannedHeadFields", "whole_head_is_plain", "UpgradeGuard", "UPGRADE_CODE", "TARGET_CODE",
           "CONNECT_CODE", "INVALID_CODE", "FIELDS_CODE", "GUARD_ENDPOINT", "METHODS", "backstop_code",
           "h11_request_code", "unscanned_code", "httptools_backstop"]

#: a head the parser refuses behind a response in progress, and a folded head line under h11 (httptools
#: refuses folds itself: uvicorn's 400, audited ``invalid_request`` too)
INVALID_CODE = "invalid_request"
#: ``endpoint`` of the audit event of a head refused by the HTTP guard
GUARD_ENDPOINT = "http_guard"
_MESSAGES = {UPGRADE_CODE: "protocol upgrades (Upgrade header) are not supported",
             TARGET_CODE: "a request-target must not contain a fragment ('#')",
             INVALID_CODE: "invalid HTTP request (e.g. obsolete line folding in its head)",
             CONNECT_CODE: "method not supported (GET, HEAD, POST, PUT, DELETE, OPTIONS, TRACE, PATCH; "
                           "no CONNECT: the gateway does not tunnel)",
             HOST_CODE: HOST_MESSAGE}
#: the status of a refusal code (400 when not listed)
_STATUS = {FIELDS_CODE: 431}

#: ``#`` as an int (a plain byte search in ``url``)
_HASH = ord("#")


class UpgradeGuard:
    """Mixin over the guarded uvicorn protocols of gateway/http_guard.py (first in their bases).

    Each head refused here is audited as 400 with its code (:func:`gateway.protocol_audit.refused`:
    the listener's :class:`gateway.protocol_audit.ProtocolRefusals`, when its app has one attached).
    """

    guard_head_refused: bool = False
    guard_pending_scan: bytes = b""  # h11: unscanned pipelined bytes scanned by guard_h11_head_bytes (S9-L3)
    guard_deferred: str | None = None  # a refusal to answer once the response in progress is complete
    guard_deferred_answer: bytes = b""  # R15-2: a queued request's body refusal, written after ...
    guard_deferred_after: int = 0  # ... this many more responses complete (the one in progress, those queued)

    def guard_refuse_head(self, code: str, defer: bool = True) -> None:
        """Refuse the head being received: audit it, answer 400 ``code`` and close lingering. With a
        response still in progress (a pipelined head) and ``defer``, what the client sends is
        dropped and the answer goes out once that response is complete; without ``defer``, close."""
        self.guard_cancel_timer()  # type: ignore[attr-defined]
        transport: asyncio.Transport = self.transport  # type: ignore[attr-defined]
        if transport is None or transport.is_closing() or self.guard_deferred is not None:
            return
        cycle = self.cycle  # type: ignore[attr-defined]
        if self.guard_waiting and cycle is not None and not cycle.keep_alive:  # type: ignore[attr-defined]
            # bytes after a request that closes the connection are no request (RFC 9112 section 9.6): dropped,
            # and no more are read until the close (R9-1, gateway/drop_guard.py)
            return transport.hold_reading()  # type: ignore[attr-defined]
        refused(self, _STATUS.get(code, 400), code)
        self.guard_head_refused = True  # the close lingers: what follows is discarded unparsed
        if self.guard_response_in_progress():  # type: ignore[attr-defined]
            if defer:
                self.guard_deferred = code
                return transport.hold_reading()  # type: ignore[attr-defined]  # R9-1 (gateway/drop_guard.py)
        else:
            transport.write(self.guard_refusal(code))
        transport.close()

    def guard_defer_queued(self, cycle: Any, code: str, message: str) -> bool:
        """R15-2: the body of a request pipelined behind a response in progress is refused (400 ``code``,
        ``message``: a trailer field, too many chunks, framing bytes; gateway/body_guard.py) while its
        ``cycle`` (uvicorn's) still waits in uvicorn's httptools ``pipeline``: it is taken out of that queue
        (its app never runs, nothing of it is forwarded), the refusal is audited (:func:`refused`), what the
        client sends next is dropped unread (R9-1), and the 400 and the close follow the last response ahead
        of it (:meth:`on_response_complete`). Before, the 400 went out at once and the connection closed:
        the answer in progress was lost, and the refusal was audited nowhere. False (nothing done) when
        ``cycle`` is not queued (its app runs and reports the refusal itself: gateway/framing.py), and
        always under h11, which parses a pipelined request only once the response before it is complete."""
        queue = getattr(self, "pipeline", None)  # httptools: deque of (cycle, app), the newest first
        entry = next((e for e in queue if e[0] is cycle), None) if queue else None
        if entry is None:
            return False
        queue.remove(entry)
        refused(self, 400, code)
        self.guard_head_refused = True  # the close lingers; the parser stop that follows is not answered
        self.guard_deferred = code
        self.guard_deferred_answer = refusal_bytes(400, code, message)
        self.guard_deferred_after = 1 + len(queue)  # the response in progress and those queued before it
        self.guard_cancel_timer()  # type: ignore[attr-defined]
        self.transport.hold_reading()  # type: ignore[attr-defined]
        return True

    def guard_refusal(self, code: str) -> bytes:
        """The answer to a head refused with ``code``."""
        if code == FIELDS_CODE:
            return refusal_bytes(431, code, f"request head has more than {self.guard_max_header_fields} header fields")  # type: ignore[attr-defined]
        return refusal_bytes(400, code, _MESSAGES[code])

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
        if code is None or transport.is_closing():
            return
        answer = self.guard_deferred_answer
        if answer:  # a queued request's body refusal (R15-2): after every response ahead of it
            self.guard_deferred_after -= 1
            if self.guard_deferred_after > 0:
                return
        # a request pipelined before the refused head (httptools) now runs: answer after it too
        elif self.guard_response_in_progress():  # type: ignore[attr-defined]
            return
        transport.write(answer or self.guard_refusal(code))
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
        would join into the field before and httptools refuses (R7b-5: both parsers now answer 400). Bytes
        pipelined behind the request just answered went to h11 unscanned: they get the first head's scan and
        field count here (S9-L3), the state kept for the rest of the head (``guard_pending_scan``)."""
        if not self.guard_waiting:  # type: ignore[attr-defined]
            fields = self.guard_fields  # type: ignore[attr-defined]
            fields.reset()
            code = fields.refusal if fields.feed(pending) else FIELDS_CODE
            self.guard_pending_scan = pending  # gateway/http_guard.py guard_sync keeps the scan's state
            if code is not None:
                self.guard_refuse_head(code)
                return False
        if folded_head(pending):
            self.guard_refuse_head(INVALID_CODE)
            return False
        return True


def httptools_backstop(proto: Any) -> None:
    """httptools, at ``on_headers_complete`` of the guarded protocol ``proto`` (before uvicorn's): a head the scan
    did not see (pipelined behind a body) that asks for an upgrade, uses ``CONNECT`` (R8-1) or has a ``#`` in its
    target (R8-5); a head whose start went unscanned (method, field count: :func:`unscanned_code`); a head with
    a wrong ``Host`` (R9-3). Such a head is refused (:meth:`UpgradeGuard.guard_refuse_head`) and
    :class:`gateway.body_guard.BodyRefused` raised to stop the parser; nothing otherwise. (A method of
    :class:`UpgradeGuard` until session 15; called directly, not through ``super()``, to keep the usual request's
    head short.)"""
    parser = getattr(proto, "parser", None)
    if parser is None:
        return
    code = backstop_code(parser, proto.url)
    fields = proto.guard_fields
    if code is None and (not fields.started or fields.unseen):
        code = unscanned_code(parser, proto.headers, proto.guard_max_header_fields)
    hosts = fields.hosts
    if code is None and hosts is not True:  # R9-3: Host fields (gateway/host_field.py)
        # a head read whole was counted by the scan; one not (several reads, behind a body): its fields, here
        if hosts is False or fields_host_refused(proto.headers, parser.get_http_version()):
            code = HOST_CODE
    if code is not None:
        # R7b-2: the parser stops here (nothing after this head is parsed); with a response in
        # progress the refusal is deferred: that response completes, then the 400 and the close
        proto.guard_refuse_head(code)
        proto.logger = logging.getLogger("gateway.body_guard.quiet")  # silenced by gateway/body_guard.py
        raise BodyRefused()


def backstop_code(parser: Any, url: bytes) -> str | None:
    """httptools backstop: the refusal code for a completed head the scan did not see, or None.
    ``parser``: the ``httptools.HttpRequestParser`` at ``on_headers_complete``; ``url``: the
    request-target as the parser reported it (uvicorn's ``url``). llhttp flags every ``CONNECT`` as an
    upgrade, so the method is read only for a flagged head (one C call per request otherwise)."""
    if parser.should_upgrade():
        return CONNECT_CODE if parser.get_method() == b"CONNECT" else UPGRADE_CODE
    return TARGET_CODE if _HASH in url else None


def unscanned_code(parser: Any, headers: list[Any], max_fields: int) -> str | None:
    """httptools backstop for a completed head whose start the scan did not see (pipelined behind a body's end
    in one read): its method (:data:`METHODS`; llhttp refuses lower-case and unknown tokens itself) and its
    field count (``headers``: uvicorn's list of the head's fields, ``max_fields``: ``limits.max_header_fields``),
    as for a first head (S9-L1, S9-L3); the code or None."""
    if parser.get_method() not in METHODS:
        return CONNECT_CODE
    return FIELDS_CODE if len(headers) > max_fields else None


def h11_request_code(event: h11.Request) -> str | None:
    """h11 backstop: the refusal code for a ``Request`` event the scan did not see, or None."""
    if event.method not in METHODS:
        return CONNECT_CODE
    if any(name == b"upgrade" for name, _ in event.headers):
        return UPGRADE_CODE
    return TARGET_CODE if _HASH in event.target else None
