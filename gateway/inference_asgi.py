"""The two inference routes with as little framework work per request as possible (issue 14).

``POST /v1/completions`` and ``POST /v1/chat/completions`` go straight from
the ASGI call to :meth:`gateway.pipeline.InferencePipeline.handle`: no
Starlette router (route matching over every route), exception middlewares or
endpoint wrappers per request. Every other request (any other path or
method, the lifespan) goes to the framing guard (gateway/framing.py) in front
of the Starlette app, which answers 404 and 405 as before. The inference
routes apply the same framing guard themselves (:meth:`FramingGuard.open`:
ambiguous framing refused first, the body counted against the body budget,
an unread body drained before an early answer), so that an answer passes one
``send`` wrapper here instead of one per layer (session 8). The head bounds
(gateway/http_guard.py) stay in the server.

A plain answer's end (tokens, lease, load ticket and breaker attempt given
back, reservation settled) and every request's metrics run after its answer
was handed to the server (:data:`gateway.recording.AFTER_SEND`, issue 14).
The request's audit event is handed to the audit worker just before the
answer's last body part (the final ``http.response.body``: the whole body of
a plain answer, the empty closing part of a stream): the work deferred until
then runs first (so a plain answer's end has written its record), so that an
answer that completed at the client is in the worker's pipe even if this
process is SIGKILLed right after (issue 16; docs/audit.md, "What a SIGKILL
can lose"). Nothing is awaited between the last send and the rest of the
work, so the next request on this event loop finds it done.

A plain answer (a Starlette ``Response`` whose class keeps ``Response.__call__``, e.g. the
pipeline's :class:`gateway.pipeline_answer.PlainAnswer`) is sent as its two ASGI messages
directly, as ``Response.__call__`` would send them, with the wrapper's two steps inline (session 9).
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import Request
from starlette.responses import Response

from gateway.client_io import EndingStreamingResponse
from gateway.exact_path import exact_path
from gateway.framing import FramedRequest, FramingGuard
from gateway.pipeline import InferencePipeline
from gateway.recording import AFTER_SEND, Recorder
from gateway.write_stall import StallBoundedSend, WriteStall, end_stalled

__all__ = ["INFERENCE_PATHS", "InferenceRoutes"]

Scope = MutableMapping[str, Any]
Message = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[Message]]
Send = Callable[[Message], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: path -> pipeline endpoint, served for POST only
INFERENCE_PATHS: dict[str, str] = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}
#: the same by the raw path as sent (R4-6: ``/v1/chat%2Fcompletions`` is not the chat route)
_RAW_PATHS: dict[bytes, str] = {p.encode("ascii"): e for p, e in INFERENCE_PATHS.items()}
_RESPONSE_CALL = Response.__call__

log = logging.getLogger("prefixgate")


class InferenceRoutes:
    """ASGI app: the inference routes to ``pipeline``, everything else to ``app``.

    ``app``: the :class:`gateway.framing.FramingGuard` in front of the Starlette app of every other
    route (and the lifespan); its rules (and budget) guard the inference routes too. ``pipeline``:
    serves the inference calls; ``recorder``: writes the records deferred until the answer is sent
    (the recorder itself defers them). A request is served here when its ``type`` is ``http``, its
    method ``POST``, its ``root_path`` empty and its ``raw_path`` (the path as sent, not
    percent-decoded; ``path`` when the server gives none) one of :data:`INFERENCE_PATHS` exactly
    (R4-6); every other request reaches ``app`` with ``path`` set to the raw path
    (:func:`gateway.exact_path.exact_path`), so Starlette's router matches it exactly too
    (trailing-slash redirects off). Raises :class:`TypeError` when ``app`` is not a FramingGuard.
    """

    def __init__(self, app: FramingGuard, pipeline: InferencePipeline, recorder: Recorder) -> None:
        if not isinstance(app, FramingGuard):
            raise TypeError("InferenceRoutes needs the FramingGuard of the other routes as its app")
        self.app = app
        self.pipeline = pipeline
        self.recorder = recorder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            if scope["method"] == "POST" and not scope.get("root_path"):
                raw = scope.get("raw_path")
                endpoint = INFERENCE_PATHS.get(scope["path"]) if raw is None else _RAW_PATHS.get(raw)
                if endpoint is not None:
                    framed = self.app.open(scope, receive)
                    if framed.problem is not None:
                        await self.app.refuse(framed, send)
                        return
                    try:
                        await self._serve(framed, send, endpoint)
                    finally:
                        framed.release()
                    return
            exact_path(scope)  # the other routes are matched on the raw path too (R4-6)
        await self.app(scope, receive, send)

    async def _serve(self, framed: FramedRequest, send: Send, endpoint: str) -> None:
        pending: list[Callable[[], None]] = []
        ran = 0
        recorder = self.recorder

        def before_last_part() -> None:
            # the last body part leaves only once the deferred ends ran and their events are in the pipe
            nonlocal ran
            ran = _run(pending, ran, len(pending))
            try:
                recorder.hand_off()
            except Exception:  # a bug: the events stay queued (timer flush); the answer still goes out
                log.exception("handing audit events to the worker failed")

        scope, receive = framed.scope, framed.receive
        token = AFTER_SEND.set(pending)
        try:
            response = await self.pipeline.handle(Request(scope, receive, send), endpoint)  # type: ignore[arg-type]
            if isinstance(response, EndingStreamingResponse):  # a client that stops or barely reads ends it (N-3, R6b-3)
                # the parts between the start and the last go to the server's send directly (session 24)
                bounded = StallBoundedSend.for_limits(_sender(framed, send, before_last_part), self.pipeline.cfg.limits,
                                                      send)
                try:
                    await response(scope, receive, bounded)
                except WriteStall:
                    await end_stalled(scope)
                finally:
                    bounded.close()
            elif type(response).__call__ is _RESPONSE_CALL and response.background is None:
                # send_one's two steps inline (no wrapper call per message; session 9)
                start: Message = {"type": "http.response.start", "status": response.status_code,
                                  "headers": response.raw_headers}
                if not framed.complete:
                    start = await framed.start(start)
                await send(start)
                before_last_part()
                await send({"type": "http.response.body", "body": response.body})
                after = getattr(response, "after_send", None)  # a large answer: its unsent bytes (R10b-5)
                if after is not None:
                    after(scope)
            else:
                await response(scope, receive, _sender(framed, send, before_last_part))
        finally:
            AFTER_SEND.reset(token)
            # however the call ended: every end and record runs, in order (work appended while
            # running, e.g. a record's metrics after its end, runs too)
            while ran < len(pending):
                ran = _run(pending, ran, len(pending))


def _sender(framed: FramedRequest, send: Send, before_last_part: Callable[[], None]) -> Send:
    """The ``send`` of an answer that sends its own messages (a stream, a response class of its own): the
    framing guard's check before the answer starts, then the last body part's order (made only for such
    an answer: a plain one sends its two messages inline, session 16)."""

    async def send_one(message: Message) -> None:
        if message["type"] == "http.response.start":
            if not framed.complete:
                message = await framed.start(message)
        elif not message.get("more_body"):
            before_last_part()
        await send(message)

    return send_one


def _run(pending: list[Callable[[], None]], start: int, stop: int) -> int:
    """Run ``pending[start:stop]`` in order, each guarded; returns ``stop``."""
    for work in pending[start:stop]:
        try:
            work()
        except Exception:  # a bug: the answer is out; never lose the other records
            log.exception("ending or recording a request after its answer failed")
    return stop
