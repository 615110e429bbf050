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
import time
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from gateway.body_budget import BodyBudget, owner_of
from gateway.body_guard import PLAIN_LENGTH_KEY, REFUSED_SCOPE_KEY, WIRE_SCOPE_KEY, BodyWire
from gateway.errors import GatewayError
from gateway.lingering import lingering_cap

__all__ = ["FramingGuard", "FramedRequest", "framing_problem", "drain_cap", "DEFAULT_MAX_DRAIN_BYTES"]

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


class FramedRequest:
    """One HTTP request under the framing guard: what the guard knows about its body, its guarded
    ``receive`` and the check before its answer starts (one object per request, no closures).

    Made by :meth:`FramingGuard.open`. :attr:`problem`: :func:`framing_problem` of its head (the
    other fields are meaningful only when it is None). :meth:`receive` is the ``receive`` to hand
    the app; :meth:`start` the check an ``http.response.start`` message passes before it is sent;
    :meth:`release` gives back what the body budget still holds (call once the request ends).
    """

    __slots__ = ("declared", "complete", "received", "receive_called", "in_receive", "expect_continue",
                 "held", "owner", "refused", "wire", "problem", "plain", "guard", "scope", "_receive", "deadline")

    def __init__(self, guard: FramingGuard, scope: Scope, receive: Receive) -> None:
        """Reads the framing fields in one pass over the scope's ``headers``."""
        self.guard = guard
        self.scope = scope
        self._receive = receive
        self.wire: BodyWire | None = scope.get(WIRE_SCOPE_KEY)  # the protocol's count of the body's wire bytes
        self.declared: int | None = None
        self.expect_continue = False
        lengths: list[bytes] = []
        encodings: list[bytes] = []
        for name, value in scope.get("headers") or ():
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
        self.deadline = 0.0  # drain deadline (time.monotonic), set by FramingGuard.open

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

    async def receive(self) -> Message:
        """The app's ``receive``: body parts counted and taken from the body budget; a body the
        protocol refused, or one past the budget, raises :class:`GatewayError` (module doc)."""
        self.receive_called = True
        self.in_receive = True
        try:
            message = await self._receive()
        finally:
            self.in_receive = False
        self.saw(message)
        if message["type"] != "http.request":
            code = self.scope.get(REFUSED_SCOPE_KEY)
            if code is not None:  # the protocol refused the body (gateway/body_guard.py) and closed
                self.refused = True
                raise GatewayError(400, code, "request body refused", headers={"Connection": "close"})
            return message
        budget = self.guard.budget
        if budget is not None:
            n = len(message.get("body", b""))
            if self.owner is None:
                client = self.scope.get("client")
                self.owner = owner_of(self.scope, str(client[0]) if client else "")
            whole = self.complete and not self.held  # all of it in this part: taken and given back at once
            if n and not (budget.fits(self.owner, n) if whole else budget.take(self.owner, n)):
                self.refused = True
                raise GatewayError(503, "body_budget_exhausted", "too many request bodies being received; retry later",
                                   headers={"Retry-After": self.guard.retry_after, "Connection": "close"})
            if whole:
                return message
            self.held += n
            if self.complete:  # the app has the whole body: its parts are no longer in flight here
                budget.give(self.owner, self.held)
                self.held = 0
        return message

    async def start(self, message: Message) -> Message:
        """``message`` (an ``http.response.start``) as it may be sent: the rest of an unread body is
        drained first (:meth:`FramingGuard._drain`); one that cannot be gets ``Connection: close``."""
        if self.complete or await self.guard._drain(self, self._receive, self.deadline):
            return message
        message = dict(message)
        message["headers"] = _with_close(message.get("headers") or [])
        return message

    def release(self) -> None:
        """Give back what the body budget holds for this request (idempotent)."""
        if self.held and self.guard.budget is not None and self.owner is not None:
            self.guard.budget.give(self.owner, self.held)
            self.held = 0


class FramingGuard:
    """ASGI middleware: refuse ambiguous framing, drain unread bodies before early answers.

    ``max_drain_bytes``: the most body wire bytes (read by the app plus drained,
    framing included) the guard reads before an answer (``limits.max_drain_bytes``);
    ``drain_timeout_s``: draining stops this many seconds after the request
    reached the guard (use ``limits.body_read_timeout_s``); ``budget``: the
    process's :class:`gateway.body_budget.BodyBudget` (None: bodies read are
    not bounded beyond ``max_body_bytes`` each). Non-HTTP scopes pass through untouched.
    :meth:`open` and :meth:`refuse` serve an app that sends through its own single ``send``
    wrapper (gateway/inference_asgi.py) with the same rules.
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

    def open(self, scope: Scope, receive: Receive) -> FramedRequest:
        """The :class:`FramedRequest` of an ``http`` scope that reached the guard now. When its
        :attr:`FramedRequest.problem` is not None, answer it with :meth:`refuse` and nothing else."""
        framed = FramedRequest(self, scope, receive)
        if framed.problem is None:
            if framed.plain:
                scope[PLAIN_LENGTH_KEY] = framed.declared
            framed.deadline = time.monotonic() + self.drain_timeout_s  # no loop lookup per request (session 11)
        return framed

    @staticmethod
    async def refuse(framed: FramedRequest, send: Send) -> None:
        """Answer 400 ``invalid_framing`` (``Connection: close``) for a request whose framing is refused."""
        err = GatewayError(400, "invalid_framing", framed.problem or "invalid framing", headers={"Connection": "close"})
        await err.response()(framed.scope, framed._receive, send)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        framed = self.open(scope, receive)
        if framed.problem is not None:
            await self.refuse(framed, send)
            return

        async def guarded_send(message: Message) -> None:
            if message["type"] == "http.response.start" and not framed.complete:
                message = await framed.start(message)
            await send(message)

        try:
            await self.app(scope, framed.receive, guarded_send)
        finally:
            framed.release()

    async def _drain(self, body: FramedRequest, receive: Receive, deadline: float) -> bool:
        """Read and discard the rest of the body; True when all of it was read."""
        if body.in_receive or body.refused:  # another task reads / the body itself was refused: close
            return False
        if body.expect_continue and not body.receive_called:
            return False  # the client waits for "100 Continue" and has sent nothing: do not invite it
        if body.declared is not None and body.declared > self.max_drain_bytes:
            return False
        remaining = deadline - time.monotonic()
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
