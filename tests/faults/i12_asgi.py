"""Drive the gateway's public ASGI app in-process with a scripted client (issue 12 tests).

Some endings of a request cannot be produced on time through a real socket:
the client leaving *between* the replica's first byte and the start of the
answer, or the request's task being cancelled while it waits for a replica.
:class:`AsgiClient` calls the app with its own ``receive``/``send``:

* ``leave="after_upstream"``: the body is delivered; a ``receive`` made
  while the gateway waits for the replica blocks (the client is still
  there) until the gateway stops listening (the replica answered); every
  later ``receive`` says ``http.disconnect`` — the client left just then.
* ``leave="never"``: ``receive`` blocks after the body (for cancellation).
* ``fail_start=True``: ``send`` of ``http.response.start`` raises
  ``OSError`` (ASGI spec 2.4: the server reports a closed connection).
"""

from __future__ import annotations

import asyncio
import json
from typing import Any

from gateway.app import build_public_app


class AsgiClient:
    """One scripted client of ``build_public_app(components)``; ``auth`` is the Authorization value."""

    def __init__(self, components: Any, auth: str) -> None:
        self.app = build_public_app(components, manage_lifecycle=False)
        self.auth = auth
        self.sent: list[dict[str, Any]] = []

    async def call(self, body: dict[str, Any], *, leave: str = "after_upstream", spec: str = "2.3",
                   fail_start: bool = False, path: str = "/v1/completions") -> list[dict[str, Any]]:
        """Run one request to its end; returns the ASGI messages the app sent."""
        data = json.dumps(body).encode()
        scope = {
            "type": "http", "asgi": {"version": "3.0", "spec_version": spec}, "http_version": "1.1",
            "method": "POST", "scheme": "http", "path": path, "raw_path": path.encode(), "query_string": b"",
            "root_path": "", "client": ("127.0.0.1", 40000), "server": ("127.0.0.1", 8000),
            "headers": [(b"host", b"gateway"), (b"authorization", self.auth.encode()),
                        (b"content-type", b"application/json"), (b"content-length", str(len(data)).encode())],
        }
        body_sent = False
        gone = asyncio.Event()

        async def receive() -> dict[str, Any]:
            nonlocal body_sent
            if not body_sent:
                body_sent = True
                return {"type": "http.request", "body": data, "more_body": False}
            try:
                await gone.wait()  # still connected while nobody stops listening
            except asyncio.CancelledError:
                if leave == "after_upstream":
                    gone.set()  # the gateway stopped listening (the replica answered): the client leaves now
                raise
            return {"type": "http.disconnect"}

        sent: list[dict[str, Any]] = []

        async def send(message: dict[str, Any]) -> None:
            if fail_start and message["type"] == "http.response.start":
                raise OSError("connection closed by the client")
            sent.append(message)

        try:
            await self.app(scope, receive, send)
        except Exception:  # noqa: BLE001 - e.g. ClientDisconnect re-raised by Starlette (spec 2.4)
            pass
        self.sent = sent
        return sent
