"""The two inference routes with as little framework work per request as possible (issue 14).

``POST /v1/completions`` and ``POST /v1/chat/completions`` go straight from
the ASGI call to :meth:`gateway.pipeline.InferencePipeline.handle`: no
Starlette router (route matching over every route), exception middlewares or
endpoint wrappers per request. Every other request (any other path or
method, the lifespan) goes to the Starlette app unchanged, which answers 404
and 405 as before. The framing guard (gateway/framing.py) stays in front of
both, and the head bounds (gateway/http_guard.py) stay in the server.

The request's audit event is handed to the audit worker just before the
answer's last body part (the final ``http.response.body``: the whole body of
a plain answer, the empty closing part of a stream), so that an answer that
completed at the client is in the worker's pipe even if this process is
SIGKILLed right after (issue 16; docs/audit.md, "What a SIGKILL can lose").
Its metrics and concentration observation are written after the answer
(:data:`gateway.recording.AFTER_SEND`, issue 14); the tokens, leases and
reservation are still given back before the answer, as the pipeline does.
"""

from __future__ import annotations

import logging
from collections.abc import Awaitable, Callable, MutableMapping
from typing import Any

from starlette.requests import Request

from gateway.pipeline import InferencePipeline
from gateway.record import RequestRecord
from gateway.recording import AFTER_SEND, Recorder

__all__ = ["INFERENCE_PATHS", "InferenceRoutes"]

Scope = MutableMapping[str, Any]
Receive = Callable[[], Awaitable[MutableMapping[str, Any]]]
Send = Callable[[MutableMapping[str, Any]], Awaitable[None]]
ASGIApp = Callable[[Scope, Receive, Send], Awaitable[None]]

#: path -> pipeline endpoint, served for POST only
INFERENCE_PATHS: dict[str, str] = {"/v1/completions": "completions", "/v1/chat/completions": "chat"}

log = logging.getLogger("prefixgate")


class InferenceRoutes:
    """ASGI app: the inference routes to ``pipeline``, everything else to ``app``.

    ``app``: the Starlette app of every other route (and the lifespan);
    ``pipeline``: serves the inference calls; ``recorder``: writes the
    records deferred until the answer is sent. A request is served here when
    its ``type`` is ``http``, its method ``POST``, its ``root_path`` empty and
    its ``path`` one of :data:`INFERENCE_PATHS` exactly (as Starlette's
    router matches them, trailing-slash redirects off).
    """

    def __init__(self, app: ASGIApp, pipeline: InferencePipeline, recorder: Recorder) -> None:
        self.app = app
        self.pipeline = pipeline
        self.recorder = recorder

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http" and scope["method"] == "POST" and not scope.get("root_path"):
            endpoint = INFERENCE_PATHS.get(scope["path"])
            if endpoint is not None:
                await self._serve(scope, receive, send, endpoint)
                return
        await self.app(scope, receive, send)

    async def _serve(self, scope: Scope, receive: Receive, send: Send, endpoint: str) -> None:
        pending: list[RequestRecord] = []
        emitted = 0
        recorder = self.recorder

        async def send_after_audit(message: MutableMapping[str, Any]) -> None:
            # the last body part leaves only once the events of the records made so far are in the pipe
            nonlocal emitted
            if emitted < len(pending) and message["type"] == "http.response.body" and not message.get("more_body"):
                emitted = self._emit(pending, emitted)
                try:
                    recorder.hand_off()
                except Exception:  # a bug: the events stay queued (timer flush); the answer still goes out
                    log.exception("handing audit events to the worker failed")
            await send(message)

        token = AFTER_SEND.set(pending)
        try:
            response = await self.pipeline.handle(Request(scope, receive, send), endpoint)  # type: ignore[arg-type]
            await response(scope, receive, send_after_audit)
        finally:
            AFTER_SEND.reset(token)
            self._emit(pending, emitted)  # however the call ended: every event is written
            for rec in pending:
                try:
                    recorder.finish(rec)
                except Exception:  # a bug: the answer is out; never lose the other records
                    log.exception("recording request %s failed", rec.request_id)

    def _emit(self, pending: list[RequestRecord], start: int) -> int:
        """Emit the audit events of ``pending[start:]``; returns ``len(pending)``."""
        for rec in pending[start:]:
            try:
                self.recorder.emit(rec)
            except Exception:  # a bug: never lose the other records
                log.exception("auditing request %s failed", rec.request_id)
        return len(pending)
