"""A raw RFC 6587 octet-counting syslog receiver on loopback (TCP or TLS), for tests.

It parses strictly: ``MSG-LEN SP SYSLOG-MSG`` with MSG-LEN = NONZERO-DIGIT
*DIGIT, then exactly MSG-LEN bytes. A frame whose prefix does not equal the
bytes that follow makes the next prefix unreadable, which is recorded in
``errors`` (and the connection is closed), so a test can assert that every
length prefix was right.
"""
from __future__ import annotations

import asyncio
import contextlib
import ssl
from pathlib import Path

MAX_PREFIX_DIGITS = 10


class OctetReceiver:
    """Collects every octet-counted frame (``frames``, raw bytes) and framing
    errors (``errors``); optionally appends each frame as one line to ``out``
    (newlines inside a frame replaced by spaces, like rsyslog's ``%msg%``)."""

    def __init__(self, ssl_context: ssl.SSLContext | None = None, out: Path | None = None) -> None:
        self.ssl_context = ssl_context
        self.out = out
        self.frames: list[bytes] = []
        self.errors: list[str] = []
        self.connections = 0
        self.port = 0
        self._server: asyncio.base_events.Server | None = None
        self._tasks: set[asyncio.Task[None]] = set()

    async def start(self, port: int = 0) -> None:
        self._server = await asyncio.start_server(self._serve, "127.0.0.1", port or self.port,
                                                  ssl=self.ssl_context)
        self.port = self._server.sockets[0].getsockname()[1]

    async def stop(self) -> None:
        if self._server is not None:
            self._server.close()
            await self._server.wait_closed()
            self._server = None
        for t in list(self._tasks):
            t.cancel()
            with contextlib.suppress(asyncio.CancelledError):
                await t

    async def _serve(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        self.connections += 1
        try:
            while True:
                digits = b""
                while True:
                    c = await reader.read(1)
                    if not c:
                        if digits:
                            self.errors.append(f"EOF inside a length prefix {digits!r}")
                        return
                    if c == b" ":
                        break
                    if not c.isdigit() or (not digits and c == b"0") or len(digits) >= MAX_PREFIX_DIGITS:
                        self.errors.append(f"bad length prefix byte {c!r} after {digits!r}")
                        return
                    digits += c
                if not digits:
                    self.errors.append("empty length prefix")
                    return
                try:
                    frame = await reader.readexactly(int(digits))
                except asyncio.IncompleteReadError as exc:
                    self.errors.append(f"frame cut: {len(exc.partial)} of {int(digits)} bytes")
                    return
                self.frames.append(frame)
                if self.out is not None:
                    with open(self.out, "ab") as fh:
                        fh.write(frame.replace(b"\n", b" ") + b"\n")
        except (ConnectionError, ssl.SSLError):
            return
        finally:
            self._tasks.discard(task)
            writer.close()
            with contextlib.suppress(Exception):
                await writer.wait_closed()
