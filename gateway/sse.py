"""Incremental Server-Sent Events scanner for upstream OpenAI streams.

The gateway passes a replica's SSE stream through to the client byte for
byte, but it must (a) learn ``usage`` (prompt, completion and
``prompt_tokens_details.cached_tokens``) from the usage chunk, (b) drop that
chunk when it added ``stream_options.include_usage`` itself, and (c) notice a
broken stream (an event that is not JSON, an ``error`` object) so the client
gets an error event instead of a silent truncation. Event framing follows the
WHATWG HTML "server-sent events" section: events end at a blank line.
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any

__all__ = ["SseScanner", "SseProtocolError", "error_event", "DONE"]

DONE = b"data: [DONE]\n\n"


class SseProtocolError(Exception):
    """The upstream stream is not valid OpenAI SSE (bad JSON, error event, oversize event)."""


@dataclass(slots=True)
class SseScanner:
    """Feed upstream bytes, get back the bytes to forward.

    ``keep_usage_chunk``: forward the usage-only chunk (the client asked for
    it). ``max_event_bytes``: an event larger than this is a protocol error.
    After the stream, ``usage`` holds the last usage object seen (or None),
    ``done`` whether ``[DONE]`` arrived and ``events`` the count of data events.
    """

    keep_usage_chunk: bool = True
    max_event_bytes: int = 1 << 20
    usage: dict[str, Any] | None = None
    done: bool = False
    events: int = 0
    _buf: bytearray = field(default_factory=bytearray)

    def feed(self, chunk: bytes) -> bytes:
        """Consume ``chunk``; return the complete events to forward (possibly b"").

        Raises :class:`SseProtocolError` on an invalid event.
        """
        self._buf += chunk
        if b"\n\n" not in self._buf and b"\r\n\r\n" not in self._buf:
            if len(self._buf) > self.max_event_bytes:
                raise SseProtocolError("upstream event too large")
            return b""
        data = bytes(self._buf).replace(b"\r\n", b"\n")
        parts = data.split(b"\n\n")
        self._buf = bytearray(parts.pop())
        out: list[bytes] = []
        for ev in parts:
            if not ev.strip():
                continue
            if self._keep(ev):
                out.append(ev + b"\n\n")
        return b"".join(out)

    def finish(self) -> None:
        """Check the end of the stream; raises :class:`SseProtocolError` if incomplete."""
        if self._buf.strip():
            raise SseProtocolError("upstream stream ended inside an event")
        if not self.done:
            raise SseProtocolError("upstream stream ended without [DONE]")

    def _keep(self, ev: bytes) -> bool:
        payload = b"".join(
            line[5:].lstrip() for line in ev.split(b"\n") if line.startswith(b"data:")
        )
        if not payload:
            return True  # comments / retry / id lines only
        if payload == b"[DONE]":
            self.done = True
            return True
        self.events += 1
        try:
            obj = json.loads(payload)
        except ValueError:
            raise SseProtocolError("upstream sent an event that is not JSON") from None
        if not isinstance(obj, dict):
            raise SseProtocolError("upstream sent an event that is not a JSON object")
        if "error" in obj:
            raise SseProtocolError("upstream sent an error event")
        usage = obj.get("usage")
        if isinstance(usage, dict):
            self.usage = usage
            if not obj.get("choices") and not self.keep_usage_chunk:
                return False
        return True


def error_event(message: str, code: str, err_type: str = "server_error") -> bytes:
    """Return an SSE ``data:`` event carrying an OpenAI-style error object."""
    body = json.dumps({"error": {"message": message, "type": err_type, "code": code, "param": None}})
    return b"data: " + body.encode() + b"\n\n"
