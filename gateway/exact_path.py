"""Route on the path exactly as the client sent it (R4-6).

uvicorn percent-decodes ``scope["path"]`` (``/v1/chat%2Fcompletions`` becomes
``/v1/chat/completions``) and keeps the bytes as sent in ``scope["raw_path"]``.
A path-based rule in front of the gateway (a WAF, a per-route proxy limit)
sees the encoded form, so the gateway must not serve it as the decoded route:
:func:`exact_path` puts the raw form (Latin-1, no decoding) into
``scope["path"]`` before Starlette's router matches it, so any
percent-encoded path is "not exact" and answers 404 like ``/v1/chat/completions/``.
:class:`ExactPath` does it as an ASGI middleware (the admin listener);
:class:`gateway.inference_asgi.InferenceRoutes` matches the inference routes on
``raw_path`` itself and calls :func:`exact_path` only for the other routes.
"""

from __future__ import annotations

from gateway.framing import ASGIApp, Receive, Scope, Send

__all__ = ["ExactPath", "exact_path"]


def exact_path(scope: Scope) -> None:
    """Set ``scope["path"]`` to ``scope["raw_path"]`` as sent (bytes read as Latin-1) when the two
    differ, for an ``http`` scope without ``root_path``; no change otherwise (no ``raw_path``: a
    server that does not decode). Never raises."""
    raw = scope.get("raw_path")
    if raw is None or scope.get("root_path"):
        return
    path = raw.decode("latin-1") if isinstance(raw, (bytes, bytearray)) else str(raw)
    if path != scope.get("path"):
        scope["path"] = path


class ExactPath:
    """ASGI middleware: :func:`exact_path` on every ``http`` scope, then ``app``."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] == "http":
            exact_path(scope)
        await self.app(scope, receive, send)
