"""HTTP/1.1 message framing guard: an ASGI middleware in front of both listeners.

Two jobs, the same under either HTTP parser uvicorn offers (h11, httptools),
which differ in what they accept:

1. **Refuse ambiguous framing before the app** (RFC 9112 section 6.3, request
   smuggling): ``Transfer-Encoding`` together with ``Content-Length``,
   ``Content-Length`` values that differ or are not ``1*DIGIT``, and any
   ``Transfer-Encoding`` other than a single ``chunked``. (Repeated equal
   ``Content-Length`` values are unambiguous: h11 folds them into one,
   httptools refuses them with its own 400; both are allowed by RFC 9110
   section 8.6.) The answer is 400
   (JSON error, code ``invalid_framing``) with ``Connection: close``: what
   follows on the connection (a pipelined request) is never parsed. h11
   lets ``Transfer-Encoding`` override ``Content-Length``; a proxy in front
   that honours the length instead would see a different request boundary,
   so the combination is refused outright.

2. **Make early answers readable** (issue 10, finding 6). When the app
   answers before it has read the whole request body (413 over the size
   cap, 401, 405, ...), the guard first reads and discards the rest of a
   small body — at most ``max_drain_bytes`` body *wire* bytes in total
   (payload plus chunk framing: size lines, extensions, CRLFs, as counted
   by the protocol, gateway/body_guard.py ``BodyWire``; review R5b-3) and
   only until ``drain_timeout_s`` seconds after the request arrived — and
   only then sends the answer, keeping the connection. A body that cannot be
   drained so (declared larger than the cap, still arriving at the deadline,
   more bytes than the cap, or ``Expect: 100-continue`` not yet granted) is
   not parsed further; the answer carries ``Connection: close`` and the
   protocol then closes *lingering* (gateway/lingering.py: half-close, the
   rest discarded unparsed within ``limits.lingering_close_bytes`` /
   ``lingering_close_s``), so a client that uploads its whole body before
   reading (``httpx``, the OpenAI SDK's transport) still reads the answer
   instead of a connection reset (review R5b-2: a parsed drain of 8 MiB in
   1 KiB chunks cost ~12 ms of CPU per refusal).

3. **Bound the body bytes the app holds** (review R5-3): with a
   :class:`gateway.body_budget.BodyBudget`, every body part the app reads is
   taken from the budget under its owner (the tenant the pipeline named, else the source address)
   and given back when the body is complete or the request ends; a part that
   does not fit answers **503** ``body_budget_exhausted`` (``Retry-After``:
   ``ceil(drain_timeout_s)``, ``Connection: close``; raised from the app's
   ``receive``, so the app reports and audits it) and the rest of that body is
   not drained.

A body refused by the HTTP protocol while the app reads it (gateway/body_guard.py:
too fragmented, trailers) reaches the app as that refusal (its 400 and code)
rather than as a client disconnect.
"""

from __future__ import annotations

import asyncio
import math
import re
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gateway.body_budget import BodyBudget, owner_of
from gateway.body_guard import PLAIN_LENGTH_KEY, REFUSED_SCOPE_KEY, WIRE_SCOPE_KEY, BodyWire
from gateway.errors import GatewayError
from gateway.lingering import lingering_cap

__all__ = ["FramingGuard", "framing_problem", "drain_cap", "DEFAULT_MAX_DRAIN_BYTES"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

_DIGITS = re.compile(rb"[0-9]+")
DEFAULT_MAX_DRAIN_BYTES = 64 * 1024


def drain_cap(max_body_bytes: int) -> int:
    """max(4 x ``max_body_bytes``, 8 MiB): the default of ``limits.lingering_close_bytes`` (bytes a
    lingering close discards; until R5b-2 the most body bytes parsed to answer an early refusal)."""
    return lingering_cap(None, max_body_bytes)


def framing_problem(headers: list[tuple[bytes, bytes]]) -> str | None:
    """Return why a request's body framing is refused, or None when it is unambiguous.

    ``headers``: the ASGI ``scope["headers"]`` (lower-case names, raw values).
    Refused: ``Transfer-Encoding`` with ``Content-Length``; several
    ``Transfer-Encoding`` values or one other than ``chunked``; a
    ``Content-Length`` that is not ``1*DIGIT``; differing ``Content-Length``
    values (identical repeats count as one, RFC 9110 section 8.6).
    """
    return _problem([v for n, v in headers if n == b"content-length"],
                    [v for n, v in headers if n == b"transfer-encoding"])


def _problem(length_fields: list[bytes], encoding_fields: list[bytes]) -> str | None:
    """:func:`framing_problem` of the raw ``Content-Length`` and ``Transfer-Encoding`` field values."""
    lengths = [v.strip() for value in length_fields for v in value.split(b",")]
    encodings = [v.strip().lower() for value in encoding_fields for v in value.split(b",")]
    if encodings and lengths:
        return "Content-Length and Transfer-Encoding must not be sent together"
    if encodings and encodings != [b"chunked"]:
        return "only Transfer-Encoding: chunked is supported"
    if any(not _DIGITS.fullmatch(v) for v in lengths):
        return "invalid Content-Length header"
    if len({int(v) for v in lengths}) > 1:
        return "conflicting Content-Length headers"
    return None


class _Body:
    """What the guard knows about one request's body."""

    __slots__ = ("declared", "complete", "received", "receive_called", "in_receive", "expect_continue",
                 "held", "owner", "refused", "wire", "problem", "plain")

    def __init__(self, headers: list[tuple[bytes, bytes]], wire: BodyWire | None) -> None:
        """Reads the framing fields in one pass over ``headers``; :attr:`problem`: :func:`framing_problem`
        of them (the other fields are meaningful only when it is None)."""
        self.wire = wire  # the protocol's count of the body's wire bytes (None: not served by it)
        self.declared: int | None = None
        self.expect_continue = False
        lengths: list[bytes] = []
        encodings: list[bytes] = []
        for name, value in headers:
            if name == b"content-length":
                lengths.append(value)
            elif name == b"transfer-encoding":
                encodings.append(value)
            elif name == b"expect" and value.strip().lower() == b"100-continue":
                self.expect_continue = True
        if not encodings and len(lengths) == 1 and lengths[0].isdigit():  # bytes: ASCII digits only
            self.problem: str | None = None  # the usual request: one plain Content-Length
            self.declared = int(lengths[0])
            self.plain = True
        else:
            self.plain = False
            self.problem = _problem(lengths, encodings)
            if lengths and self.problem is None:
                self.declared = int(lengths[0].split(b",")[0].strip())
        self.complete = not encodings and not self.declared
        self.received = 0
        self.receive_called = False
        self.in_receive = False
        self.held = 0  # bytes taken from the body budget for the app's reads
        self.owner: str | None = None  # the budget share they are taken from (set at the first part)
        self.refused = False  # a refusal of the body itself: never drained

    def read_bytes(self) -> int:
        """Body bytes read so far: the wire count (framing included) when known, else the payload."""
        wire = self.wire
        return self.received if wire is None else max(self.received, wire.bytes)

    def saw(self, message: Message) -> None:
        if message["type"] == "http.request":
            self.received += len(message.get("body", b""))
            if not message.get("more_body", False):
                self.complete = True
        else:  # http.disconnect: nothing more will arrive
            self.complete = True


class FramingGuard:
    """ASGI middleware: refuse ambiguous framing, drain unread bodies before early answers.

    ``max_drain_bytes``: the most body wire bytes (read by the app plus drained,
    framing included) the guard reads before an answer (``limits.max_drain_bytes``);
    ``drain_timeout_s``: draining stops this many seconds after the request
    reached the guard (use ``limits.body_read_timeout_s``); ``budget``: the
    process's :class:`gateway.body_budget.BodyBudget` (None: bodies read are
    not bounded beyond ``max_body_bytes`` each). Non-HTTP scopes pass through untouched.
    """

    def __init__(self, app: ASGIApp, *, max_drain_bytes: int, drain_timeout_s: float,
                 budget: BodyBudget | None = None) -> None:
        if max_drain_bytes < 0 or drain_timeout_s <= 0:
            raise ValueError("max_drain_bytes must be >= 0 and drain_timeout_s > 0")
        self.app = app
        self.max_drain_bytes = max_drain_bytes
        self.drain_timeout_s = drain_timeout_s
        self.budget = budget
        self.retry_after = str(max(1, math.ceil(drain_timeout_s)))

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        body = _Body(scope.get("headers") or [], scope.get(WIRE_SCOPE_KEY))
        if body.problem is not None:
            err = GatewayError(400, "invalid_framing", body.problem, headers={"Connection": "close"})
            await err.response()(scope, receive, send)
            return
        if body.plain:
            scope[PLAIN_LENGTH_KEY] = body.declared
        deadline = asyncio.get_running_loop().time() + self.drain_timeout_s
        budget = self.budget
        client = scope.get("client")
        source = str(client[0]) if client else ""

        async def guarded_receive() -> Message:
            body.receive_called = True
            body.in_receive = True
            try:
                message = await receive()
            finally:
                body.in_receive = False
            body.saw(message)
            if message["type"] != "http.request":
                code = scope.get(REFUSED_SCOPE_KEY)
                if code is not None:  # the protocol refused the body (gateway/body_guard.py) and closed
                    body.refused = True
                    raise GatewayError(400, code, "request body refused", headers={"Connection": "close"})
            elif budget is not None:
                n = len(message.get("body", b""))
                if body.owner is None:
                    body.owner = owner_of(scope, source)
                whole = body.complete and not body.held  # all of it in this part: taken and given back at once
                if n and not (budget.fits(body.owner, n) if whole else budget.take(body.owner, n)):
                    body.refused = True
                    raise GatewayError(503, "body_budget_exhausted",
                                       "too many request bodies being received; retry later",
                                       headers={"Retry-After": self.retry_after, "Connection": "close"})
                if whole:
                    return message
                body.held += n
                if body.complete:  # the app has the whole body: its parts are no longer in flight here
                    budget.give(body.owner, body.held)
                    body.held = 0
            return message

        async def guarded_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not body.complete:
                if not await self._drain(body, receive, deadline):
                    message = dict(message)
                    message["headers"] = _with_close(message.get("headers") or [])
            await send(message)

        try:
            await self.app(scope, guarded_receive, guarded_send)
        finally:
            if body.held and budget is not None and body.owner is not None:
                budget.give(body.owner, body.held)

    async def _drain(self, body: _Body, receive: Receive, deadline: float) -> bool:
        """Read and discard the rest of the body; True when all of it was read."""
        if body.in_receive or body.refused:  # another task reads / the body itself was refused: close
            return False
        if body.expect_continue and not body.receive_called:
            return False  # the client waits for "100 Continue" and has sent nothing: do not invite it
        if body.declared is not None and body.declared > self.max_drain_bytes:
            return False
        remaining = deadline - asyncio.get_running_loop().time()
        if remaining <= 0 or body.read_bytes() > self.max_drain_bytes:
            return False
        try:
            async with asyncio.timeout(remaining):
                while not body.complete:
                    message = await receive()
                    if message["type"] != "http.request":
                        return False
                    body.saw(message)
                    if body.read_bytes() > self.max_drain_bytes:
                        return False
        except TimeoutError:
            return False
        return True


def _with_close(headers: Any) -> list[tuple[bytes, bytes]]:
    out = [(bytes(k), bytes(v)) for k, v in headers if bytes(k).lower() != b"connection"]
    out.append((b"connection", b"close"))
    return out
